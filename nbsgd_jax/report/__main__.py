"""``python -m nbsgd_jax.report RUN_DIR ... [--out DIR]``: :func:`nbsgd_jax.report.main`."""

import sys

from nbsgd_jax.report import main

sys.exit(main())
