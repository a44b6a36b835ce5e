"""The suite's three tiers, as a pytest plugin (tests/conftest.py loads it).

``--tier fast`` (the default, the README's command) runs the tests not marked; ``--tier slow``
those marked ``@pytest.mark.slow``; ``--tier long`` those marked ``@pytest.mark.long``, the
longest checks (more parametrised cases of a slow test, longer end-to-end runs, the docs'
commands run as written); ``.ci/run`` runs the three, one after the other (docs/tests.md);
``--tier all`` everything. A passing test in the fast tier whose
body took over ``--time-limit`` seconds (default ``$NBSGD_JAX_TEST_LIMIT``, else 10; 0: no
limit) is reported failed, so the fast tier stays fast. A test marked
``@pytest.mark.optimized`` runs with XLA's optimisation passes on (it and its subprocesses),
where the conftest turns them off for the rest.
"""
import os

import pytest

TIERS = ("fast", "slow", "long", "all")


def pytest_addoption(parser):
  parser.addoption("--tier", choices=TIERS, default="fast",
                   help="fast (default): the tests not marked slow or long; slow: those "
                        "marked slow; long: those marked long; all: every test")
  parser.addoption("--time-limit", type=float,
                   default=float(os.environ.get("NBSGD_JAX_TEST_LIMIT", "10")),
                   help="seconds a fast-tier test may take (0: no limit)")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: the slow tier (runs under --tier slow or --tier all): accuracy runs, "
                 "the full composition matrix, subprocesses, wall clock, docs' commands")
  config.addinivalue_line(
      "markers", "long: the long tier (--tier long or all, not CI): more cases of slow "
                 "tests, longer end-to-end runs")
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


def _tier(item) -> str:
  """The tier of a test: ``long`` over ``slow`` over ``fast``."""
  for name in ("long", "slow"):
    if item.get_closest_marker(name) is not None:
      return name
  return "fast"


def pytest_collection_modifyitems(config, items):
  tier = config.getoption("--tier")
  if tier == "all":
    return
  keep, drop = [], []
  for it in items:
    (keep if _tier(it) == tier else drop).append(it)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Fails a passing fast-tier test whose body took over ``--time-limit`` seconds."""
  outcome = yield
  report = outcome.get_result()
  limit = item.config.getoption("--time-limit")
  if (call.when == "call" and report.passed and limit > 0 and _tier(item) == "fast"
      and call.duration > limit):
    report.outcome = "failed"
    report.longrepr = (f"{item.nodeid} took {call.duration:.1f} s, over the fast tier's "
                       f"{limit:g} s (--time-limit, $NBSGD_JAX_TEST_LIMIT): make it faster or "
                       "mark it @pytest.mark.slow")
