"""Test set-up, read before jax is imported, and the suite's two tiers.

Set-up: 8 simulated host devices for the mesh backend; JAX's persistent compilation cache in
one directory per pytest-xdist worker (``.cache/tests/gw0``, ... under the repository;
``$NBSGD_JAX_TEST_CACHE`` moves it, ``none`` turns it off), kept between runs and between the
tiers, storing every program however short its compilation; XLA's optimisation passes off
(``JAX_DISABLE_MOST_OPTIMIZATIONS=1``: a program compiles in about half the time and computes
the same values to float rounding) except in a test marked ``@pytest.mark.optimized``, one
that runs enough steps for the passes to pay for themselves (training to an accuracy); set
the variable to 0 to test every program optimised. Subprocesses the tests start inherit all
three through the environment.

Tiers: a test marked ``@pytest.mark.slow`` (training to an accuracy, the full composition
matrix, workloads, command lines and subprocesses, wall clock, several processes, the docs'
commands) runs only under ``--tier slow`` (those alone) or ``--tier all``; the default,
``--tier fast``, runs the rest. A test outside the slow tier that takes over
``$NBSGD_JAX_TEST_LIMIT`` seconds (10; 0 turns the guard off) fails, so the fast tier stays
fast: make it faster or mark it slow.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
_CACHE = os.environ.get("NBSGD_JAX_TEST_CACHE", os.path.join(ROOT, ".cache", "tests"))
os.environ["NBSGD_JAX_COMPILATION_CACHE"] = ("none" if _CACHE == "none" else os.path.join(
    _CACHE, os.environ.get("PYTEST_XDIST_WORKER", "main")))
if _CACHE != "none":
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["NBSGD_JAX_COMPILATION_CACHE"])

import pytest  # noqa: E402

TIERS = ("fast", "slow", "all")
LIMIT_S = float(os.environ.get("NBSGD_JAX_TEST_LIMIT", "10"))


def pytest_addoption(parser):
  parser.addoption("--tier", choices=TIERS, default="fast",
                   help="fast (default): the tests not marked slow; slow: those marked slow; "
                        "all: both")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: the slow tier (runs under --tier slow or --tier all): accuracy runs, "
                 "the full composition matrix, subprocesses, wall clock, docs' commands")
  config.addinivalue_line(
      "markers", "optimized: compiled with XLA's optimisation passes (a long run: they pay)")


@pytest.fixture(autouse=True)
def _xla_optimisations(request, monkeypatch):
  """XLA's optimisation passes on for a test marked ``optimized`` (and its subprocesses)."""
  if request.node.get_closest_marker("optimized") is None:
    yield
    return
  import jax  # pylint: disable=import-outside-toplevel
  before = jax.config.jax_disable_most_optimizations
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  jax.config.update("jax_disable_most_optimizations", before)


def _is_slow(item) -> bool:
  return item.get_closest_marker("slow") is not None


def pytest_collection_modifyitems(config, items):
  tier = config.getoption("--tier")
  if tier == "all":
    return
  keep, drop = [], []
  for it in items:
    (keep if _is_slow(it) == (tier == "slow") else drop).append(it)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Fails a passing fast-tier test whose body took over ``LIMIT_S`` seconds."""
  outcome = yield
  report = outcome.get_result()
  if (call.when == "call" and report.passed and LIMIT_S > 0 and not _is_slow(item)
      and call.duration > LIMIT_S):
    report.outcome = "failed"
    report.longrepr = (f"{item.nodeid} took {call.duration:.1f} s, over the fast tier's "
                       f"{LIMIT_S:g} s (NBSGD_JAX_TEST_LIMIT): make it faster or mark it "
                       "@pytest.mark.slow")
