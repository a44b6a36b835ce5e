"""DeMo against a numpy transcription of its reference code, bloc97/DeMo ``demo.py`` at
commit 0e48145d702b25f83055e11d9585a9c11bcfe154 (``tests/references/demo.py``), fed the same
gradients: the parameters, each worker's decoupled momentum and the bytes after every step,
with weight decay and a learning rate that changes every step (it enters twice)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import tx
from nbsgd_jax.codecs import dct
from nbsgd_jax.transforms.decoupled import DecoupledMomentumState
from tests.helpers import state_of, vmapped_steps
from tests.references import demo as ref

N, STEPS, WD, DECAY, TOPK, CHUNK = 3, 5, 0.1, 0.9, 3, 8
SHAPES = {"b": (12,), "w": (24, 10), "v": (7,)}  # chunks 6, 8 x 10 and the whole 7
LR = [0.05, 0.04, 0.03, 0.02, 0.01]


def _framework(params, grads):
  """DeMo through ``tx.demo`` in a user's vmapped step: ``grads[t]`` the gradients of step t."""
  sched = lambda count: jnp.asarray(LR)[count]
  opt = optax.chain(tx.demo(sched, axis_name="w", error_decay=DECAY,
                            top_k=TOPK, chunk_size=CHUNK),
                    optax.add_decayed_weights(WD), optax.sgd(sched))
  return [(p, state_of(st, DecoupledMomentumState).delta, np.asarray(tx.bytes_sent(st)))
          for _, p, st in vmapped_steps(opt, params, grads)]


def test_demo_equals_the_reference_step_by_step():
  rng = np.random.default_rng(0)
  names = sorted(SHAPES)
  params = {k: np.broadcast_to(rng.normal(size=SHAPES[k]), (N,) + SHAPES[k]).astype(np.float32)
            for k in names}
  grads = [{k: rng.normal(size=(N,) + SHAPES[k]).astype(np.float32) for k in names}
           for _ in range(STEPS)]
  got = _framework(jax.tree.map(jnp.asarray, params), grads)
  p = [[params[k][i] for k in names] for i in range(N)]
  d = [[np.zeros(SHAPES[k], np.float32) for k in names] for _ in range(N)]
  msg = ref.message_bytes([SHAPES[k] for k in names if len(SHAPES[k]) <= 2], TOPK, CHUNK)
  for t, (gp, gd, sent) in enumerate(got):
    g = [[grads[t][k][i] for k in names] for i in range(N)]
    p, d = ref.demo_step(p, g, d, lr=LR[t], weight_decay=WD, compression_decay=DECAY,
                         compression_topk=TOPK, compression_chunk=CHUNK)
    for j, k in enumerate(names):
      np.testing.assert_allclose(np.asarray(gp[k]), np.stack([p[i][j] for i in range(N)]),
                                 rtol=1e-5, atol=1e-6, err_msg=f"params {k}, step {t}")
      np.testing.assert_allclose(np.asarray(gd[k]), np.stack([d[i][j] for i in range(N)]),
                                 rtol=1e-4, atol=1e-6, err_msg=f"momentum {k}, step {t}")
    np.testing.assert_allclose(sent, (t + 1) * (N - 1) * msg, rtol=1e-6)
  assert np.ptp(np.asarray(got[-1][0]["w"]), axis=0).max() == 0  # one model: the same sign


@pytest.mark.parametrize("s,target,want", [(100, 64, 50), (96, 64, 48), (10, 64, 10),
                                           (67, 64, 1), (50304, 64, 64), (784, 64, 56)])
def test_the_chunk_rule_is_the_references(s, target, want):
  assert dct.chunk_size(s, target) == ref.chunk_size(s, target) == want


def test_the_dct_is_the_references_and_decode_inverts_encode():
  for c in (1, 6, 8, 10):
    np.testing.assert_allclose(dct.dct_basis(c), ref.dct_basis(c), atol=1e-6)
  x = np.random.default_rng(1).normal(size=(24, 10)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(dct.decode(dct.encode(jnp.asarray(x), 8), x.shape, 8)),
                             x, atol=1e-5)


def test_a_bad_demo_key_and_sgd_momentum_are_refused_by_name():
  c = config_lib.default_config()
  c.update(dict(algorithm="demo", momentum=0.0))
  with pytest.raises(config_lib.ConfigError, match=r"config\.demo\.error_decay=1\.0"):
    config_lib.validate(config_lib.override(c, {"demo.error_decay": 1.0}))
  with pytest.raises(config_lib.ConfigError, match=r"config\.momentum=0\.9 is not allowed with "
                                                   r"algorithm='demo'"):
    config_lib.validate(config_lib.override(c, {"momentum": 0.9}))
  with pytest.raises(ValueError, match=r"tx\.demo\(top_k=0\)"):
    tx.demo(0.1, axis_name="w", top_k=0)
