"""The suite's two tiers, as a pytest plugin (tests/conftest.py loads it).

A test marked ``@pytest.mark.slow`` runs only under ``--tier slow`` (those alone) or ``--tier
all``; the default, ``--tier fast``, runs the rest. A passing test outside the slow tier whose
body took over ``--time-limit`` seconds (default ``$NBSGD_JAX_TEST_LIMIT``, else 10; 0: no
limit) is reported failed, so the fast tier stays fast. A test marked
``@pytest.mark.optimized`` runs with XLA's optimisation passes on (it and its subprocesses),
where the conftest turns them off for the rest.
"""
import os

import pytest

TIERS = ("fast", "slow", "all")


def pytest_addoption(parser):
  parser.addoption("--tier", choices=TIERS, default="fast",
                   help="fast (default): the tests not marked slow; slow: those marked slow; "
                        "all: both")
  parser.addoption("--time-limit", type=float,
                   default=float(os.environ.get("NBSGD_JAX_TEST_LIMIT", "10")),
                   help="seconds a fast-tier test may take (0: no limit)")


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
  before = jax.config.read("jax_disable_most_optimizations")
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
  _forget_programs()
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  jax.config.update("jax_disable_most_optimizations", before)
  _forget_programs()  # no later test reuses a program compiled with the passes on


def _forget_programs():
  """Drops the programs compiled in this process (jax's and the trainer's in-memory caches),
  so that a comparison in a later test never mixes programs compiled with and without XLA's
  passes (they agree only to float rounding)."""
  import jax  # pylint: disable=import-outside-toplevel
  from nbsgd_jax.run import step  # pylint: disable=import-outside-toplevel
  jax.clear_caches()
  step.PROGRAMS.clear()


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
  """Fails a passing fast-tier test whose body took over ``--time-limit`` seconds."""
  outcome = yield
  report = outcome.get_result()
  limit = item.config.getoption("--time-limit")
  if (call.when == "call" and report.passed and limit > 0 and not _is_slow(item)
      and call.duration > limit):
    report.outcome = "failed"
    report.longrepr = (f"{item.nodeid} took {call.duration:.1f} s, over the fast tier's "
                       f"{limit:g} s (--time-limit, $NBSGD_JAX_TEST_LIMIT): make it faster or "
                       "mark it @pytest.mark.slow")
