"""Only the work that fires (``run/gathered.py``): on the event clock a step computes the
gradients of the workers whose computation starts, gathered into a bucket, and the runs are
those of the plain step, which computes every worker's and drops the rest."""

import jax
import numpy as np
import pytest

from nbsgd_jax.run import gathered

from tests.helpers import least_squares_cfg, make_stepper, slow_except, small_cfg

STEPS = 16  # device steps per run
SLOW = (1.0, 1.3, 1.9, 2.6, 1.1, 3.7, 1.6, 2.2)
CASES = {
    "ad_psgd": {},
    "ad_psgd_least_squares": {},
    "ad_psgd_released": {"algorithm": "ad_psgd", "ad_psgd.order": "released"},
    "swarm_sgd": {"swarm_sgd.local_steps": 2},
    "swarm_one_sided": {"algorithm": "swarm_sgd", "swarm_sgd.averaging": "one_sided"},
    "async_diloco": {"diloco.local_steps": 3},
    "halos": {"halos.regions": 2, "halos.local_steps": 2, "halos.accumulation": 2},
}


def _cfg(case, **kw):
  if case == "ad_psgd_least_squares":  # the fast tier's case: a linear model compiles in a blink
    return least_squares_cfg(n=8, m=4, dim=6, lr=0.05, momentum=0.0, weight_decay=0.0,
                             slowdown=SLOW, time_per_example=1e-3, latency=1e-4,
                             bandwidth=1e9, num_steps=30, eval_every=30, **kw)
  over = {"algorithm": case, **CASES[case]}
  return small_cfg(num_workers=8, num_steps=30, **{
      "cluster.slowdown": SLOW, "cluster.time_per_example": 1e-3, "cluster.latency": 1e-4,
      **over, **kw})


def _run(cfg, steps):
  stepper = make_stepper(cfg)
  out = stepper.steps(steps)
  return stepper, out


@pytest.mark.parametrize("case", slow_except(list(CASES), fast=("ad_psgd_least_squares",)))
def test_gathered_steps_equal_the_plain_steps(case):
  """16 steps with and without ``gather_gradients``: every worker's parameters and the
  optimizer state agree to 1e-6 (the same gradients of the computing workers, the rest
  dropped either way), and the gathered run computed at most twice its computing workers'
  gradients each step (the bucket: the smallest of 1, 2, 4, 8 that holds them), which
  its host records as ``grads_computed``."""
  plain, _ = _run(_cfg(case, gather_gradients=False), STEPS)
  mine, steps = _run(_cfg(case), STEPS)
  for a, b in zip(jax.tree.leaves(plain.state), jax.tree.leaves(mine.state)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6)
  buckets = []
  for _, inputs, _, report in steps:
    count = int(np.sum(inputs.events.compute))
    bucket = 1 if count == 0 else min(8, 1 << (count - 1).bit_length())  # by hand
    buckets.append(bucket)
    assert int(np.sum(report["grads_computed"])) == bucket, (count, report["grads_computed"])
    assert np.all(report["grads_computed"][np.asarray(inputs.events.compute)] >= 1)
  assert 0 < sum(buckets) < STEPS * 8
  record = mine.runs[0].host.record()
  assert record["grads_computed"] == pytest.approx(sum(buckets) / 8)
  assert plain.runs[0].host.record()["grads_computed"] == pytest.approx(float(STEPS))


def test_bucket_sizes_and_dispatch_bucket():
  assert gathered.bucket_sizes(8) == (1, 2, 4, 8)
  assert gathered.bucket_sizes(6) == (1, 2, 4, 6)
  assert gathered.bucket_sizes(1) == (1,)
  assert [gathered.bucket_of(c, 8) for c in range(9)] == [1, 1, 2, 4, 4, 8, 8, 8, 8]
  compute = np.zeros((2, 8, 3), bool)  # [R, n, k]: runs' steps of 0, 3 and 1 workers
  compute[1, :3, 1] = compute[0, 5, 2] = True
  assert gathered.dispatch_bucket(compute, 8) == 4
  with pytest.raises(ValueError, match="9 computing workers"):
    gathered.bucket_of(9, 8)


@pytest.mark.slow  # a second structure (k = 4) compiled
def test_a_block_of_steps_takes_its_largest_bucket():
  """Four steps in one dispatch (``steps_per_dispatch = 4``) give the parameters of one step
  a dispatch; each of the four computes the block's bucket (its largest count's)."""
  one, _ = _run(_cfg("ad_psgd", steps_per_dispatch=1), 12)
  four, steps = _run(_cfg("ad_psgd", steps_per_dispatch=4), 12)
  for a, b in zip(jax.tree.leaves(one.state), jax.tree.leaves(four.state)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6)
  counts = [int(np.sum(inputs.events.compute)) for _, inputs, _, _ in steps]
  want = [gathered.bucket_of(max(counts[b:b + 4]), 8) for b in range(0, 12, 4) for _ in range(4)]
  assert [int(np.sum(r["grads_computed"])) for *_, r in steps] == want
