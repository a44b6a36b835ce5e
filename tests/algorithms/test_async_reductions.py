"""Asynchronous methods at synchronous timing against their lockstep parents (issue 54, item 5):
an equivalence, not a re-implementation. Equal speeds, no delays, and the same seeds.

SwarmSGD (Nadiradze et al., NeurIPS 2021, Algorithm 1: H local steps, then the pair averages)
on two workers: both workers' H-th events fall at one time, so each pairs with the other and
the later of the two averages again; with an inner step that does not read the parameters
(SGD with momentum, no weight decay) that is local SGD's average of the two models after
their H local steps (Stich, ICLR 2019; the package's ``local_sgd`` with ``tau = H``). It
holds for one period only: the event clock's worker reads its model right after its own event
(``nbsgd_jax/host/events.py``), so worker 0 reads the first of the two averages, before its
partner's simultaneous event averages again, and its next period starts from a gradient one
average stale (0.2 % apart after two periods without momentum). Local SGD reads the final
average.

AD-PSGD has no such form: its events average before the gradient, one at a time, so two
simultaneous events of a pair give ``(x_0 + x_1) / 2 - lr g_0 / 2`` to one worker and that
minus ``lr g_1`` to the other, never a symmetric lockstep step
(:func:`test_ad_psgd_at_synchronous_timing_is_not_symmetric` holds it to that closed form).
"""

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.models import problems
from nbsgd_jax import train

from tests.helpers import least_squares_cfg, make_stepper

N, M, DIM, H = 2, 16, 4, 3
LR, MOM = 0.05, 0.9


def _cfg(algorithm, momentum=MOM, **kw):
  """The asynchronous family's set-up (tests/helpers.py) with equal speeds, the default time
  per example and messages of 0.1 ms, run without an end."""
  return least_squares_cfg(n=N, m=M, dim=DIM, lr=LR, momentum=momentum, weight_decay=0.0,
                           slowdown=(), latency=1e-4, bandwidth=1e6,
                           time_per_example=config_lib.default_config().cluster.time_per_example,
                           **{"algorithm": algorithm, "num_steps": 10 ** 5,
                              "eval_every": 10 ** 5, **kw})


def _events_until(stepper, own_steps):
  """Step batch by batch until every worker applied ``own_steps`` events."""
  clock = stepper.runs[0].host.part("clock")
  while clock.clock.steps.min() < own_steps:
    stepper.steps(1)
  np.testing.assert_array_equal(clock.clock.steps, own_steps)  # in lockstep
  return np.asarray(stepper.state.params["w"], np.float64)


def test_swarm_sgd_on_two_workers_at_synchronous_timing_is_local_sgd(periods=1):
  swarm = make_stepper(_cfg("swarm_sgd", **{"swarm_sgd.local_steps": H}))
  got = _events_until(swarm, H * periods)
  local = make_stepper(_cfg("local_sgd", **{"local_sgd.local_steps": H}))
  local.steps(H * periods)
  want = np.asarray(local.state.params["w"], np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
  np.testing.assert_allclose(got[0], got[1], rtol=1e-6)  # averaged at the period's end


def test_ad_psgd_at_synchronous_timing_is_not_symmetric():
  """Plain SGD (no momentum), one event per worker at t = M * time_per_example: worker 0
  averages with 1 and steps, then worker 1 averages with 0 and steps, each with its gradient
  at x_0 (closed form in the module docstring)."""
  s = train.setup(_cfg("ad_psgd", momentum=0.0))
  stepper = train.Stepper.of(s)
  x0 = np.asarray(stepper.state.params["w"][0], np.float64)
  got = _events_until(stepper, 1)
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  g = [a[i].T @ (a[i] @ x0 - b[i]) / M for i in range(N)]
  first = x0 - LR * g[0] / 2
  np.testing.assert_allclose(got, np.stack([first, first - LR * g[1]]), rtol=1e-5,
                             atol=1e-7)
