"""Helpers shared by the reproduction scripts: atomic result files and matplotlib output."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbsgd_jax import files  # noqa: E402  (the repository's package, installed or not)


def pyplot():
  """``matplotlib.pyplot`` on the non-interactive Agg backend."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save_figure(fig, path: str, dpi: int = 120) -> None:
  """Write ``fig`` to ``path`` through a temporary file (a crash never leaves half a PNG)."""
  files.atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
  import matplotlib.pyplot as plt
  plt.close(fig)


write_atomic = files.atomic_write


def write_results(out: str, results: dict, markdown: str) -> None:
  """``out/results.json`` and ``out/results.md``, each written atomically; prints the table."""
  write_atomic(os.path.join(out, "results.json"), json.dumps(results))
  write_atomic(os.path.join(out, "results.md"), markdown)
  print(markdown)
