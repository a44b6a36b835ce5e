"""Quantizers: QSGD (Alistarh et al. 2017), the scaled sign (Karimireddy et al. 2019) and
bfloat16 messages; each with the bytes of its encoding (:mod:`nbsgd_jax.codecs`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nbsgd_jax.codecs.base import Array, Codec

MAX_LEVELS = 2 ** 23  # QSGD's s: a level |x| / ||x|| * s is computed in float32


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


def qsgd_codec(levels: int = 16, bucket_size: int = 512) -> Codec:
  """QSGD with ``levels`` s per sign and a float32 norm per ``bucket_size`` entries.

  Raises:
    ValueError: ``levels`` or ``bucket_size`` not an int >= 1 (named).
  """
  if not (isinstance(levels, int) and levels >= 1):
    raise ValueError(f"compression.levels={levels!r} is not allowed: it must be an int >= 1")
  if not (isinstance(bucket_size, int) and bucket_size >= 1):
    raise ValueError(f"compression.bucket_size={bucket_size!r} is not allowed: it must be an "
                     "int >= 1")

  def compress(x, key):
    return (qsgd(x, key, levels=levels, bucket_size=bucket_size),
            jnp.float32(qsgd_bytes(x.shape[0], levels, bucket_size)))
  return Codec("qsgd", compress)


def sign_codec() -> Codec:
  """The scaled sign: one bit per entry and one float32, ``ceil(d / 8) + 4`` bytes."""
  return Codec("sign", lambda x, key=None: (scaled_sign(x),
                                             jnp.float32(math.ceil(x.shape[0] / 8) + 4)))


def bf16_codec() -> Codec:
  """bfloat16 messages, ``2 d`` bytes."""
  return Codec("bf16", lambda x, key=None: (
      x.astype(jnp.bfloat16).astype(x.dtype),
      jnp.float32(x.size * jnp.dtype(jnp.bfloat16).itemsize)))


def identity_codec() -> Codec:
  """No compression: ``d value_bytes`` bytes (CHOCO-SGD without compression is D-PSGD)."""
  return Codec("none", lambda x, key=None: (x, jnp.float32(x.size * x.dtype.itemsize)))
