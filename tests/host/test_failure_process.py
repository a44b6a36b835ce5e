"""Failures at a rate (``nbsgd_jax/host/failures.py``, ``FailureProcess``): the counts and
down times of a long seeded run match their distributions, the draw does not depend on the
order steps are asked for, a failed worker sends nothing through train()'s clock, and the
event clock refuses a rate by name."""

import math

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.host.failures import FailureProcess
from tests.helpers import cell_cfg, run_cell

N, T = 1000, 20000  # workers, steps of 1 s


def _floor_mean(sf) -> float:
  """E[floor(X)] = sum_{k >= 1} P(X >= k) for a survival function ``sf``."""
  return float(sum(sf(k) for k in range(1, 20 * T)))


@pytest.mark.parametrize("shape", [1.0, 2.0])
def test_failure_counts_and_down_times_match_their_distributions(shape):
  """Over 20,000 steps of 1,000 workers (mean up time 0.05 h = 180 s, repair 20 s): the mean
  number of failures per worker within 2 % of T / E[cycle] (E[cycle] = E[floor(up)] +
  E[ceil(repair)], from the Weibull and exponential survival functions), and the mean down
  steps within 2 % of E[ceil(repair)] = 1 / (1 - exp(-1 / 20))."""
  proc = FailureProcess(N, 1.0, 0.05, 20.0, shape, seed=2)
  down = proc.failures(T)
  scale = 180.0 / math.gamma(1 + 1 / shape)
  up = _floor_mean(lambda k: math.exp(-(k / scale) ** shape))
  repair = 1.0 / (1.0 - math.exp(-1.0 / 20.0))
  assert len(down) / N == pytest.approx(T / (up + repair), rel=0.02)
  assert np.mean([f.duration for f in down]) == pytest.approx(repair, rel=0.02)


def test_the_draw_does_not_depend_on_the_order_steps_are_asked_for():
  a = FailureProcess(5, [1.0, 0.5, 2.0, 1.0, 1.0], 0.01, 5.0, seed=4)
  b = FailureProcess(5, [1.0, 0.5, 2.0, 1.0, 1.0], 0.01, 5.0, seed=4)
  forward = [a.alive(t) for t in range(400)]
  backward = [b.alive(t) for t in reversed(range(400))][::-1]
  np.testing.assert_array_equal(forward, backward)
  assert 0 < np.mean(forward) < 1


def test_a_failed_worker_sends_nothing_on_the_clock_and_the_run_is_named():
  """D-PSGD with failures at a rate, through the composition test's checks (device bytes =
  clock bytes at every step; a failed worker charged nothing)."""
  cfg = cell_cfg("dpsgd", False, False, False, False, **{
      "cluster.failure_mtbf": 5e-6, "cluster.failure_repair": 0.01, "num_steps": 8})
  state, host = run_cell(cfg, steps=8)
  assert host.record()["bytes_sent"] > 0
  from nbsgd_jax.run import naming
  assert "failures (MTBF 5e-06 h)" in naming.algorithm_as_run(cfg)


def test_the_event_clock_takes_failures_at_a_rate_under_both_policies():
  c = config_lib.override(config_lib.default_config(), {"algorithm": "ad_psgd",
                                                        "cluster.failure_mtbf": 3.0})
  config_lib.validate(c)  # elastic: the event clock's outages (host/outages.py)
  config_lib.validate(config_lib.override(c, {"cluster.failure_policy": "restart"}))
