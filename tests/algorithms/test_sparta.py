"""SPARTA against a numpy transcription of its reference code: exo-explore/gym
``exogym/strategy/sparta.py`` at commit 9fa323c (``SPARTAStrategy``: the optimizer's step,
then ``SparseCommunicator.communicate``: per parameter, ``indices_mask =
RandomIndexSelector(p).get_indices(param)`` broadcast from rank 0, ``sparse_data =
param.data[indices_mask]``, ``all_reduce(SUM)``, ``/= num_nodes``,
``param.masked_scatter_(indices_mask, sparse_data)``), fed the framework's masks (a draw, as
a seed is, is an input)."""

import jax
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train
from nbsgd_jax.communications.masked import sparta_masks
from nbsgd_jax.models import problems

N, LR, P, SEED = 4, 0.05, 0.3, 7


def _cfg(**over):
  c = config_lib.default_config()
  c.update(dict(algorithm="sparta", num_workers=N, dataset="least_squares", num_steps=6,
                eval_every=6, learning_rate=LR, momentum=0.0, weight_decay=0.0,
                progress=False, batch_size=16, seed=SEED))
  c.problem.update(dict(examples_per_worker=16, dim=6, full_batch=True))
  c.sparta.density = P
  return config_lib.override(c, over)


def _reference(s, steps):
  """exogym's SPARTA on the same problem: each worker's SGD step, then per parameter the
  mean over the nodes of the masked entries written back (``masked_scatter_``)."""
  prob = s.dataset
  loss = problems.loss_fn(prob)
  data = (np.asarray(prob.features), np.asarray(prob.targets))
  x = {k: np.stack([np.asarray(v)] * N) for k, v in problems.init_params(prob).items()}
  out = []
  for t in range(steps):
    for i in range(N):  # self.optim.step(): plain SGD
      g = jax.grad(loss)({k: v[i] for k, v in x.items()}, (data[0][i], data[1][i]))
      for k in x:
        x[k][i] = x[k][i] - LR * np.asarray(g[k])
    leaves, treedef = jax.tree.flatten(x)
    key = jax.random.fold_in(jax.random.key(SEED), t)
    masks = [np.asarray(m) for m in sparta_masks(key, [v.shape[1:] for v in leaves], P)]
    for v, m in zip(leaves, masks):  # SparseCommunicator.communicate, param by param
      sparse_data = v[:, m].sum(axis=0) / N  # all_reduce(SUM), then /= num_nodes
      v[:, m] = sparse_data  # masked_scatter_ on every node
    x = jax.tree.unflatten(treedef, leaves)
    out.append((x["w"].copy(), masks))
  return out


def test_sparta_equals_the_reference_step_by_step_with_its_bytes():
  cfg = _cfg()
  s = train.setup(cfg)
  stepper = train.Stepper.of(s)
  want = _reference(s, cfg.num_steps)
  for (_, masks), (_, _, _, report) in zip(want, stepper.steps(cfg.num_steps)):
    k, d = sum(int(m.sum()) for m in masks), sum(m.size for m in masks)
    sent = 2 * (N - 1) / N * 4 * k + np.array([(N - 1) * d, 0, 0, 0])  # the mask from rank 0
    np.testing.assert_allclose(report["bytes/sparta"], sent, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(stepper.state.params["w"]), want[-1][0], rtol=1e-5,
                             atol=1e-7)


@pytest.mark.parametrize("mask", ["broadcast", "seeded"])
def test_every_step_equals_the_reference_and_the_seeded_mask_sends_none(mask):
  cfg = _cfg(**{"sparta.mask": mask})
  s = train.setup(cfg)
  want = _reference(s, cfg.num_steps)
  seen = []
  out = train.train(cfg, None, hooks=(lambda step, state, setup: seen.append(
      np.asarray(jax.device_get(state.params["w"]))),))
  for got, (w, _) in zip(seen[1:], want):
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)
  assert np.ptp(seen[-1], axis=0).max() > 0  # the workers' models differ where unmasked
  k = sum(int(m.sum()) for _, masks in want for m in masks)
  d = sum(m.size for m in want[0][1])
  mask_bytes = (N - 1) * d * cfg.num_steps / N if mask == "broadcast" else 0.0
  assert out["bytes_sent"] == pytest.approx(2 * (N - 1) / N * 4 * k + mask_bytes, rel=1e-6)


def test_a_bad_sparta_key_is_refused_by_name():
  with pytest.raises(config_lib.ConfigError, match=r"config\.sparta\.density=0\.0 is not allowed"):
    config_lib.validate(_cfg(**{"sparta.density": 0.0}))
  with pytest.raises(config_lib.ConfigError, match=r"config\.sparta\.mask='all' is not allowed"):
    config_lib.validate(_cfg(**{"sparta.mask": "all"}))
