"""NoLoCo against a numpy transcription of its reference code, jkolehm/noloco
``src/noloco/sparse_optimizer_c.py`` at commit 37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08
(``tests/references/noloco.py``), fed the same inner gradients and the framework's
permutations (a draw, as a seed is, is an input; the reference's rule turns each into its
groups): after every outer step each worker's slow weights, model, outer momentum and bytes.
And the equivalence the method is built on: one group of all workers is DiLoCo with
heavy-ball outer momentum."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train, tx
from nbsgd_jax.communications.groups import RandomGroups, group_positions
from nbsgd_jax.transforms.wrappers import NoLoCoState
from tests.helpers import start_and_gradients, state_of, vmapped_steps
from tests.references import noloco as ref

N, H, ROUNDS, LR, SEED = 6, 2, 4, 0.1, 3
SHAPES = {"b": (5,), "w": (4, 3)}


def _framework(params, grads, g, alpha, beta):
  opt = optax.chain(optax.sgd(LR), tx.noloco(H, axis_name="w", group_size=g,
                                              outer_lr=alpha, outer_momentum=beta, seed=SEED))
  return [(p, state_of(st, NoLoCoState).slow, state_of(st, NoLoCoState).momentum,
           np.asarray(tx.bytes_sent(st)))
          for t, p, st in vmapped_steps(opt, params, grads) if (t + 1) % H == 0]


@pytest.mark.parametrize("g,alpha,beta", [(2, 0.7, 0.5), (3, 0.9, 0.9), (1, 0.7, 0.5)])
def test_noloco_equals_the_reference_at_every_outer_step(g, alpha, beta):
  names = sorted(SHAPES)
  x0, grads = start_and_gradients(SHAPES, N, H * ROUNDS, seed=0)
  got = _framework(jax.tree.map(jnp.asarray, x0), grads, g, alpha, beta)
  comm = RandomGroups(N, g, SEED)
  slow = [[x0[k][0].copy() for k in names] for _ in range(N)]
  mom = [[np.zeros(SHAPES[k], np.float32) for k in names] for _ in range(N)]
  total = np.zeros(N)
  for r, (gp, gs, gm, sent) in enumerate(got):
    fast = [list(s) for s in slow]
    for t in range(r * H, (r + 1) * H):  # the inner SGD steps
      fast = [[f - np.float32(LR) * grads[t][k][i] for f, k in zip(fast[i], names)]
              for i in range(N)]
    step = (r + 1) * H - 1
    perm = np.argsort(np.asarray(group_positions(SEED, step, N)))  # our draw
    groups = ref.groups_from_permutation(perm, g)  # the reference's rule
    assert all(len({int(comm.groups(step)[i]) for i in grp}) == 1 for grp in groups)
    slow, fast, mom = ref.noloco_outer_step(slow, fast, mom, groups, outer_lr=alpha,
                                            outer_momentum=beta)
    total += ref.bytes_sent([SHAPES[k] for k in names], groups, itemsize=4)
    for j, k in enumerate(names):
      for i in range(N):
        for have, want, what in ((gp, fast, "model"), (gs, slow, "slow"), (gm, mom, "momentum")):
          np.testing.assert_allclose(np.asarray(have[k][i]), want[i][j], rtol=1e-5, atol=1e-6,
                                     err_msg=f"{what} {k}, worker {i}, round {r}")
    np.testing.assert_allclose(sent, total, rtol=1e-6)
  if g > 1:
    assert 0 < np.ptp(np.asarray(got[-1][0]["w"]), axis=0).max()  # several models


def _run(algorithm, **over):
  c = config_lib.default_config()
  c.update(dict(algorithm=algorithm, num_workers=4, dataset="least_squares", num_steps=8,
                eval_every=8, learning_rate=0.05, momentum=0.0, weight_decay=0.0,
                progress=False, batch_size=16, seed=SEED))
  c.problem.update(dict(examples_per_worker=16, dim=6, full_batch=True, heterogeneity=1.0))
  c = config_lib.override(c, over)
  seen = []
  train.train(c, None, hooks=(lambda step, state, s: seen.append(
      np.asarray(jax.device_get(state.params["w"]))),))
  return seen[1:]


def test_one_group_of_all_workers_is_diloco_with_heavy_ball_momentum():
  noloco = _run("noloco", **{"noloco.group_size": 4, "noloco.local_steps": 2,
                             "noloco.outer_lr": 0.7, "noloco.outer_momentum": 0.5})
  diloco = _run("diloco", **{"diloco.local_steps": 2, "diloco.outer_lr": 0.7,
                             "diloco.outer_momentum": 0.5, "diloco.outer_nesterov": False})
  for a, b in zip(noloco, diloco):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  smaller = _run("noloco", **{"noloco.group_size": 2, "noloco.local_steps": 2,
                              "noloco.outer_lr": 0.7, "noloco.outer_momentum": 0.5})
  assert np.abs(smaller[-1] - diloco[-1]).max() > 1e-3  # groups of 2 are not DiLoCo


def test_a_bad_noloco_key_and_a_group_size_not_dividing_the_workers_are_refused():
  c = config_lib.override(config_lib.default_config(), {"algorithm": "noloco", "num_workers": 6,
                                                         "noloco.group_size": 4})
  with pytest.raises(config_lib.ConfigError, match=r"config\.noloco\.group_size=4 is "
                                                   r"not allowed with config\.num_workers=6"):
    config_lib.validate(c)
  with pytest.raises(config_lib.ConfigError, match=r"config\.noloco\.outer_momentum=1\.0"):
    config_lib.validate(config_lib.override(c, {"noloco.group_size": 2,
                                                "noloco.outer_momentum": 1.0}))
