"""The suite's tiers (tests/tiers.py): which tests each tier runs, the fast tier's time limit
and the ``optimized`` marker, on a throw-away test file run by ``pytester``."""

import jax  # imported here (and the trainer): pytester's runs must not import them afresh
import pytest

from nbsgd_jax.run import step  # noqa: F401  pylint: disable=unused-import

FILE = """
import os, time
import jax
import pytest

def test_quick():
  'Passes at once.'

def test_sleepy():
  time.sleep(0.3)

@pytest.mark.slow
def test_sleepy_but_slow():
  time.sleep(0.3)

@pytest.mark.slow
@pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.long)])
def test_slow_cases(x):
  'Passes at once, in the slow tier (case 2 in the long tier).'

@pytest.mark.long
def test_sleepy_and_long():
  time.sleep(0.3)

@pytest.mark.optimized
def test_optimized_sees_xla_passes_on():
  assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "0"
  assert not jax.config.read("jax_disable_most_optimizations")
"""


@pytest.fixture
def suite(pytester, monkeypatch):
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
  pytester.makepyfile(test_demo=FILE)
  return pytester


def _outcomes(result):
  return {r.nodeid.split("::")[-1]: r.outcome for r in result.getreports(
      "pytest_runtest_logreport") if r.when == "call"}


def test_the_fast_tier_leaves_out_slow_tests_and_fails_one_over_its_limit(suite):
  got = _outcomes(suite.inline_run("-p", "tests.tiers", "--time-limit=0.2"))
  assert got == {"test_quick": "passed", "test_sleepy": "failed",
                 "test_optimized_sees_xla_passes_on": "passed"}, got


@pytest.mark.slow  # a pytester run of its own (the fast tier keeps the fast tier's)
def test_the_slow_tier_runs_only_slow_tests_without_a_limit(suite):
  got = _outcomes(suite.inline_run("-p", "tests.tiers", "--tier", "slow", "--time-limit=0.2"))
  assert got == {"test_sleepy_but_slow": "passed", "test_slow_cases[1]": "passed"}, got


@pytest.mark.slow  # a pytester run of its own (the fast tier keeps the fast tier's)
def test_the_long_tier_runs_only_long_tests_without_a_limit(suite):
  got = _outcomes(suite.inline_run("-p", "tests.tiers", "--tier", "long", "--time-limit=0.2"))
  assert got == {"test_slow_cases[2]": "passed", "test_sleepy_and_long": "passed"}, got


@pytest.mark.slow  # a pytester run of its own (the fast tier keeps the fast tier's)
def test_all_runs_both_and_no_limit_passes_the_sleepy_test(suite):
  got = _outcomes(suite.inline_run("-p", "tests.tiers", "--tier", "all", "--time-limit=0"))
  assert len(got) == 7 and set(got.values()) == {"passed"}, got


@pytest.mark.slow  # a pytester run of its own (the fast tier keeps the fast tier's)
def test_an_optimized_test_leaves_the_passes_off_for_the_next(suite):
  before = jax.config.read("jax_disable_most_optimizations")
  suite.inline_run("-p", "tests.tiers", "-k", "optimized")
  assert jax.config.read("jax_disable_most_optimizations") == before
