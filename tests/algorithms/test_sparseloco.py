"""SparseLoCo against a numpy transcription of its reference code, tplr-ai/SparseLoCo
``src/tplr/sparseloco.py`` and ``src/tplr/strategies.py`` at commit
276fa59977f84a601fb81f3a7e9379b204b4e91c (``tests/references/sparseloco.py``), fed the same
inner gradients: after every outer step the outer model, each worker's error-feedback
accumulator and the bytes.

2-bit codes may flip at a bin edge between two float orders of the same sum; the test checks
that every value the reference quantises lies at least 1e-5 bin widths from an edge (float32 rounding moves it by < 1e-6), so a flip
cannot happen and the comparison is exact up to float32 rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import tx
from nbsgd_jax.transforms.decoupled import DecoupledMomentumState
from tests.helpers import start_and_gradients, state_of, vmapped_steps
from tests.references import sparseloco as ref

N, H, ROUNDS, LR = 3, 2, 4, 0.1
SHAPES = {"b": (12,), "w": (24, 10)}
KW = dict(top_k=16, chunk_size=8, quantization_bins=4, quantization_range=6.0)


def _framework(params, grads, outer_lr, error_decay, bins):
  opt = optax.chain(optax.sgd(LR), tx.sparseloco(
      H, axis_name="w", outer_lr=outer_lr, error_decay=error_decay,
      **{**KW, "quantization_bins": bins}))
  return [(p, state_of(st, DecoupledMomentumState).delta, np.asarray(tx.bytes_sent(st)))
          for t, p, st in vmapped_steps(opt, params, grads) if (t + 1) % H == 0]


def _edge_distance(e, bins):
  """The smallest distance, in bin widths, of a value the reference quantises to a bin edge."""
  chunks = ref.encode_chunks(e, KW["chunk_size"])
  k = ref.topk_per_chunk(chunks.shape[1], KW["top_k"], KW["chunk_size"])
  _, val = ref.topk_select(chunks, k)
  _, shift, _, scale = ref.quantize(val, bins, KW["quantization_range"])
  pos = (val - shift) / scale + bins // 2
  return float(np.min(np.abs(pos - np.floor(pos) - 0.5)))


@pytest.mark.parametrize("outer_lr,error_decay,bins", [(1.0, 0.95, 4), (0.7, 0.5, 4),
                                                       (0.7, 0.9, 0)])
def test_sparseloco_equals_the_reference_at_every_outer_step(outer_lr, error_decay, bins):
  names = sorted(SHAPES)
  x0, grads = start_and_gradients(SHAPES, N, H * ROUNDS, seed=1)
  got = _framework(jax.tree.map(jnp.asarray, x0), grads, outer_lr, error_decay, bins)
  anchor = [x0[k][0] for k in names]
  ef = [[np.zeros(SHAPES[k], np.float32) for k in names] for _ in range(N)]
  kw = dict(KW, quantization_bins=bins, use_quantization=bool(bins))
  msg = ref.message_bytes([SHAPES[k] for k in names], **{k: v for k, v in kw.items()
                                                          if k != "quantization_range"})
  for r, (gp, ge, sent) in enumerate(got):
    models = [[a.copy() for a in anchor] for _ in range(N)]
    for t in range(r * H, (r + 1) * H):  # the inner SGD steps
      models = [[m - np.float32(LR) * grads[t][k][i] for m, k in zip(models[i], names)]
                for i in range(N)]
    if bins:
      for i in range(N):
        for j, a in enumerate(anchor):
          e = error_decay * ef[i][j] + outer_lr * (a - models[i][j])
          assert _edge_distance(e.astype(np.float32), bins) > 1e-5
    anchor, ef = ref.sparseloco_outer_step(anchor, models, ef, lr=outer_lr,
                                           error_decay=error_decay, **kw)
    for j, k in enumerate(names):
      for i in range(N):
        np.testing.assert_allclose(np.asarray(gp[k][i]), anchor[j], rtol=1e-5, atol=1e-6,
                                   err_msg=f"outer model {k}, round {r}")
        np.testing.assert_allclose(np.asarray(ge[k][i]), ef[i][j], rtol=1e-4, atol=1e-5,
                                   err_msg=f"error feedback {k}, worker {i}, round {r}")
    np.testing.assert_allclose(sent, (r + 1) * (N - 1) * msg, rtol=1e-6)


def test_quantisation_is_the_references():
  from nbsgd_jax.codecs import dct
  v = np.random.default_rng(2).normal(size=(30, 4)).astype(np.float32)
  codes, decoded = dct.quantize(jnp.asarray(v), 4, 6.0)
  want_codes, shift, lookup, _ = ref.quantize(v, 4, 6)
  np.testing.assert_array_equal(np.asarray(codes), want_codes)
  np.testing.assert_allclose(np.asarray(decoded), ref.dequantize(want_codes, shift, lookup),
                             rtol=1e-6, atol=1e-7)


def test_a_bad_sparseloco_key_is_refused_by_name():
  c = config_lib.override(config_lib.default_config(), {"algorithm": "sparseloco"})
  for key, value in (("error_decay", 1.5), ("quantization_bins", 1), ("top_k", 0)):
    with pytest.raises(config_lib.ConfigError, match=rf"config\.sparseloco\.{key}={value}"):
      config_lib.validate(config_lib.override(c, {f"sparseloco.{key}": value}))
