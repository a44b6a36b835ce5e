"""Test set-up, read before jax is imported.

Set-up: 8 simulated host devices for the mesh backend; JAX's persistent compilation cache in
one directory that the pytest-xdist workers share (``.cache/tests/shared`` under the
repository; ``$NBSGD_JAX_TEST_CACHE`` moves it, ``none`` turns it off), kept between runs and
between the tiers, storing every program however short its compilation; its keys leave out
XLA's own caches' directory (``JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none``), so a program
one worker compiled is the other's too (jax writes an entry whole or, read half-written by
the other worker, warns and compiles it again); XLA's optimisation passes off
(``JAX_DISABLE_MOST_OPTIMIZATIONS=1``: a program compiles in about half the time and computes
the same values to float rounding) except in a test marked ``@pytest.mark.optimized``, one
that runs enough steps for the passes to pay for themselves (training to an accuracy); set
the variable to 0 to test every program optimised. Subprocesses the tests start inherit all
three through the environment.

Tiers: tests/tiers.py (``--tier fast|slow|long|all``, the fast tier's time limit, the
``slow``, ``long`` and ``optimized`` markers); ``pytester`` for the tiers' own test.

Folders mirror the package where a module has tests of its own (``transforms/``, ``codecs/``,
``communications/``, ``host/``, ``run/``, ``data/``, ``models/``); ``algorithms/`` holds each
algorithm against its independent reference and the composition matrix, ``user/`` what a
user runs and reads (the command line, docs, notebook, examples, reports).
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
_CACHE = os.environ.get("NBSGD_JAX_TEST_CACHE", os.path.join(ROOT, ".cache", "tests"))
os.environ["NBSGD_JAX_COMPILATION_CACHE"] = ("none" if _CACHE == "none" else os.path.join(
    _CACHE, os.environ.get("NBSGD_JAX_TEST_CACHE_WORKER", "shared")))
if _CACHE != "none":
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "none")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["NBSGD_JAX_COMPILATION_CACHE"])

pytest_plugins = ("tests.tiers", "pytester")
