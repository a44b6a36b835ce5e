"""DiLoCo with overlapped outer steps against a numpy transcription of its references
(``tests/references/overlapped_diloco.py``): the one-step delayed outer step of
PrimeIntellect-ai/pccl ``python/examples/nanogpt_diloco/async_diloco.py`` at commit
7815195c4fe29f9dd4448f67afe8f48e93393428, and eager updates (Kale, Douillard et al., arXiv
2502.12996, Algorithm 3; no public code), fed the same inner gradients: after every outer step
each worker's model and anchor. And the point of it: on a slow network the all-reduce hides
behind the next H inner steps on the simulated clock."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train, tx
from nbsgd_jax.transforms.wrappers import OverlapState
from tests.helpers import start_and_gradients, state_of, vmapped_steps
from tests.references import overlapped_diloco as ref

N, H, ROUNDS, LR = 3, 2, 5, 0.1
SHAPES = {"b": (5,), "w": (4, 3)}
NAMES = sorted(SHAPES)


def _framework(x0, grads, overlap, outer_lr, momentum, nesterov):
  opt = optax.chain(optax.sgd(LR), tx.diloco(
      optax.sgd(outer_lr, momentum=momentum or None, nesterov=nesterov), H, axis_name="w",
      overlap=overlap))
  return [(p, state_of(st, OverlapState).anchor) for t, p, st in vmapped_steps(
      opt, jax.tree.map(jnp.asarray, x0), grads) if (t + 1) % H == 0]


@pytest.mark.parametrize("overlap,outer_lr,momentum,nesterov", [
    ("delayed", 0.7, 0.0, False), ("delayed", 0.7, 0.9, True), ("eager", 0.7, 0.0, False),
    ("eager", 0.5, 0.9, True)])
def test_overlapped_outer_steps_equal_the_reference(overlap, outer_lr, momentum, nesterov):
  x0, grads = start_and_gradients(SHAPES, N, H * ROUNDS, seed=0)
  got = _framework(x0, grads, overlap, outer_lr, momentum, nesterov)
  local, anchor, buf, inflight = ref.init_state([x0[k][0] for k in NAMES], N, momentum)
  own = None
  opt = dict(lr=outer_lr, momentum=momentum, nesterov=nesterov)
  for r, (params, anchors) in enumerate(got):
    for t in range(r * H, (r + 1) * H):  # the inner SGD steps
      local = [[x - np.float32(LR) * grads[t][k][i] for x, k in zip(local[i], NAMES)]
               for i in range(N)]
    if overlap == "delayed":
      local, anchor, buf, inflight, _ = ref.delayed_outer_step(local, anchor, buf, inflight,
                                                               **opt)
    else:
      local, anchor, buf, inflight, own, _ = ref.eager_outer_step(local, anchor, buf,
                                                                  inflight, own, **opt)
    for i in range(N):
      for j, k in enumerate(NAMES):
        np.testing.assert_allclose(np.asarray(params[k][i]), local[i][j], rtol=1e-5,
                                   atol=1e-6, err_msg=f"{overlap}: worker {i} {k}, round {r}")
        np.testing.assert_allclose(np.asarray(anchors[k][i]), anchor[i][j], rtol=1e-5,
                                   atol=1e-6)
  spread = np.ptp(np.asarray(got[-1][1]["w"]), axis=0).max()
  assert (spread > 0) == (overlap == "eager")  # eager's anchors are each worker's own


def _cfg(overlap, **over):
  c = config_lib.default_config()
  c.update(dict(algorithm="diloco", num_workers=4, dataset="least_squares", num_steps=8,
                eval_every=8, learning_rate=0.05, progress=False, batch_size=16))
  c.problem.update(dict(examples_per_worker=16, dim=2000, full_batch=True))
  return config_lib.override(c, {"diloco.local_steps": 4, "diloco.overlap": overlap,
                                 "cluster.bandwidth": 1e6, "cluster.latency": 0.0, **over})


@pytest.mark.slow  # a clock check (the reference test is fast)
def test_the_overlap_hides_the_all_reduce_behind_the_next_local_steps():
  """Same bytes; the blocking run pays both all-reduces, the overlapped one none (eager's clock is the same): each runs
  behind the next H = 4 inner steps (4 x 0.016 s against 0.012 s), and the run's last one is
  still in flight when it ends (its mean would land at the next outer step)."""
  runs = {o: train.train(_cfg(o)) for o in ("none", "delayed")}
  assert runs["none"]["bytes_sent"] == runs["delayed"]["bytes_sent"] > 0
  step, comm = 16 * 0.001, 2 * 3 / 4 * 4 * 2000 / 1e6  # a step; a ring all-reduce, s
  assert runs["none"]["sim_time"] == pytest.approx(8 * step + 2 * comm, rel=1e-6)
  assert runs["delayed"]["sim_time"] == pytest.approx(8 * step, rel=1e-6)


def test_an_unknown_overlap_and_streaming_with_an_overlap_are_refused():
  with pytest.raises(config_lib.ConfigError, match=r"config\.diloco\.overlap='late'"):
    config_lib.validate(_cfg("late"))
  with pytest.raises(config_lib.ConfigError, match=r"not allowed with "
                                                   r"algorithm='streaming_diloco'"):
    config_lib.validate(_cfg("eager", algorithm="streaming_diloco"))
