"""Codecs: a compressor with the bytes of its encoding, usable by every reducer and by CHOCO.

A :class:`Codec` maps a flat float vector ``x [d]`` (and a PRNG key) to the vector the
receivers decode, ``C(x) [d]``, and the bytes of the encoded message (float32 scalar). The
device never builds the bit-packed message: a simulation only needs ``C(x)`` and its size,
and the size is a function of the encoding documented per codec. Sparse codecs also carry
their ``(values, indices)`` form, which the sparse all-gather sends as it is.

* ``top_k`` / ``gaussian_k`` / ``random_k`` (:mod:`nbsgd_jax.compression`, Shi et al. 2019):
  ``k`` (value, int32 index) pairs, ``k (value_bytes + 4)`` bytes.
* ``qsgd`` (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD", NeurIPS 2017, Sec. 3.1):
  ``Q_s(v_i) = ||v||_2 sgn(v_i) xi_i(v, s)`` per bucket ``v`` of ``bucket_size`` entries, with
  ``l = floor(s |v_i| / ||v||)`` and ``xi_i = (l + 1) / s`` with probability
  ``s |v_i| / ||v|| - l``, else ``l / s``: unbiased, ``E ||Q_s(v) - v||^2 <=
  min(b / s^2, sqrt(b) / s) ||v||^2`` (their Lemma 3.1, ``b`` the bucket size). Encoding: a
  float32 norm per bucket, then per entry one sign bit and ``ceil(log2(s + 1))`` bits of level
  (fixed width; the paper's Elias code is shorter for small ``s`` and is not modelled), i.e.
  ``4 ceil(d / b) + ceil(d (1 + ceil(log2(s + 1))) / 8)`` bytes.
* ``sign`` (scaled sign, Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD",
  ICML 2019, Algorithm 1): ``C(p) = (||p||_1 / d) sgn(p)`` with ``sgn(0) = +1``; one bit per
  entry plus one float32, ``ceil(d / 8) + 4`` bytes.
* ``bf16``: bfloat16 messages: ``C(x) = float32(bfloat16(x))`` (round to nearest even, 8 bits
  of mantissa; Kalamkar et al., "A study of BFLOAT16 for deep learning training", 2019),
  ``2 d`` bytes, counted from the dtype's itemsize. With error feedback the rounding error is
  carried to the next step; CHOCO-SGD with ``bf16`` and gamma = 1 is D-PSGD with bfloat16
  messages.
* ``none``: the identity, ``d value_bytes`` bytes (CHOCO-SGD without compression is D-PSGD).

PowerSGD (Vogels et al. 2019) is not a codec: its message is a rank-r factorisation built in
two all-reduce rounds (:func:`nbsgd_jax.transforms.powersgd`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from nbsgd_jax import compression

Array = jax.Array
SPARSE = tuple(compression.COMPRESSORS)  # top_k, gaussian_k, random_k
QUANTIZERS = ("qsgd", "sign", "bf16")
NAMES = SPARSE + QUANTIZERS


class Codec(NamedTuple):
  """A compressor and the bytes of its encoding.

  Attributes:
    name: the config name (``compression.name``).
    compress: ``(x [d], key) -> (C(x) [d], num_bytes)``: what the receivers decode (dtype of
      ``x``) and the float32 bytes of the encoded message.
    sparse: the ``(x [d], key) -> (values [cap], indices [cap])`` form of a sparse codec (the
      sparse all-gather sends it), else None.
  """

  name: str
  compress: Callable[[Array, Optional[Array]], tuple[Array, Array]]
  sparse: Optional[Callable] = None


def level_bits(levels: int) -> int:
  """Bits of a QSGD level in ``{0, ..., s}``: ``ceil(log2(s + 1))``."""
  return max(1, math.ceil(math.log2(int(levels) + 1)))


def qsgd_bytes(d: int, levels: int, bucket_size: int) -> int:
  """Bytes of a QSGD message of ``d`` entries (module docstring): a float32 norm per bucket and
  ``1 + level_bits(levels)`` bits per entry, rounded up to whole bytes."""
  buckets = math.ceil(d / bucket_size)
  return 4 * buckets + math.ceil(d * (1 + level_bits(levels)) / 8)


def qsgd(x: Array, key: Array, *, levels: int, bucket_size: int) -> Array:
  """``Q_s(x)`` of QSGD (Alistarh et al. 2017, Sec. 3.1) per bucket of ``bucket_size``.

  Args:
    x: ``[d]`` float vector.
    key: PRNG key of the stochastic rounding.
    levels: ``s >= 1``.
    bucket_size: ``b >= 1`` (the last bucket is zero-padded).

  Returns:
    ``[d]``, the dtype of ``x``: each entry is ``||v||_2 sgn(v_i) l / s`` with an integer
    ``l`` in ``[0, s]``; a zero bucket stays zero.

  Raises:
    ValueError: ``levels`` or ``bucket_size`` < 1.
  """
  if int(levels) < 1 or int(bucket_size) < 1:
    raise ValueError(f"levels={levels!r} and bucket_size={bucket_size!r} must be >= 1")
  d = x.shape[0]
  b = min(int(bucket_size), d)
  nb = -(-d // b)
  v = jnp.pad(x.astype(jnp.float32), (0, nb * b - d)).reshape(nb, b)
  norm = jnp.linalg.norm(v, axis=1, keepdims=True)
  safe = jnp.where(norm > 0, norm, 1.0)
  r = jnp.abs(v) / safe * levels  # in [0, s]
  low = jnp.floor(r)
  up = jax.random.uniform(key, v.shape) < (r - low)
  level = jnp.minimum(low + up, levels)
  q = jnp.where(norm > 0, norm * jnp.sign(v) * level / levels, 0.0)
  return q.reshape(-1)[:d].astype(x.dtype)


def scaled_sign(x: Array) -> Array:
  """``(||x||_1 / d) sgn(x)`` with ``sgn(0) = +1`` (Karimireddy et al. 2019, Algorithm 1)."""
  scale = jnp.mean(jnp.abs(x))
  return jnp.where(x >= 0, scale, -scale).astype(x.dtype)


def sparse_codec(name: str, fn: Callable) -> Codec:
  """The :class:`Codec` of a sparse compressor ``fn: (x [d], key) -> (values [cap], indices
  [cap])`` (padding index ``d``): ``C(x) = dense(values, indices)``, ``valid (value_bytes + 4)``
  bytes for the ``valid`` indices in ``[0, d)``."""

  def compress(x, key=None):
    values, indices = fn(x, key)
    d = x.shape[0]
    valid = jnp.sum((indices >= 0) & (indices < d)).astype(jnp.float32)
    return (compression.densify(values, indices, d).astype(x.dtype),
            valid * (jnp.dtype(values.dtype).itemsize + 4))
  return Codec(name, compress, fn)


def make_codec(name: str, *, density: float = 0.01, levels: int = 16, bucket_size: int = 512,
               **sparse_options) -> Codec:
  """The :class:`Codec` of ``compression.name``.

  Args:
    name: ``"none"``, a sparse compressor (:data:`nbsgd_jax.compression.COMPRESSORS`),
      ``"qsgd"``, ``"sign"`` or ``"bf16"``.
    density: k / d of the sparse codecs.
    levels, bucket_size: QSGD's ``s`` and bucket size.
    **sparse_options: options of the sparse compressor (Gaussian-k's ``rounds``,
      ``correction``).

  Raises:
    ValueError: an unknown name or a bad option (named).
  """
  if name in SPARSE:
    return sparse_codec(name, compression.make_compressor(name, density, **sparse_options))
  if name == "qsgd":
    if not (isinstance(levels, int) and levels >= 1):
      raise ValueError(f"compression.levels={levels!r} is not allowed: it must be an int >= 1")
    if not (isinstance(bucket_size, int) and bucket_size >= 1):
      raise ValueError(f"compression.bucket_size={bucket_size!r} is not allowed: it must be an "
                       "int >= 1")

    def compress(x, key):
      return (qsgd(x, key, levels=levels, bucket_size=bucket_size),
              jnp.float32(qsgd_bytes(x.shape[0], levels, bucket_size)))
    return Codec(name, compress)
  if name == "sign":
    return Codec(name, lambda x, key=None: (scaled_sign(x),
                                             jnp.float32(math.ceil(x.shape[0] / 8) + 4)))
  if name == "bf16":
    return Codec(name, lambda x, key=None: (
        x.astype(jnp.bfloat16).astype(x.dtype),
        jnp.float32(x.size * jnp.dtype(jnp.bfloat16).itemsize)))
  if name == "none":
    return Codec(name, lambda x, key=None: (x, jnp.float32(x.size * x.dtype.itemsize)))
  raise ValueError(f"compression.name={name!r} is not allowed: use one of "
                   f"{['none', *NAMES]}")


def compress_tree(codec: Codec, tree: Any, key: Array, flatten: bool = True
                  ) -> tuple[Any, Array]:
  """``C`` applied to a pytree: to the whole raveled tree (``flatten``) or to each leaf with
  its own key. Returns ``(decoded tree, float32 bytes)``."""
  if flatten:
    flat, unravel = ravel_pytree(tree)
    if flat.size == 0:
      return tree, jnp.float32(0.0)
    out, nbytes = codec.compress(flat, key)
    return unravel(out), jnp.asarray(nbytes, jnp.float32)
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, max(len(leaves), 1))
  outs, total = [], jnp.float32(0.0)
  for leaf, k in zip(leaves, keys):
    if leaf.size == 0:
      outs.append(leaf)
      continue
    out, nbytes = codec.compress(leaf.reshape(-1), k)
    outs.append(out.reshape(leaf.shape))
    total = total + nbytes
  return jax.tree.unflatten(treedef, outs), total
