"""Chunked DCT and chunked top-k: DeMo's message (Peng, Quesnelle, Kingma 2024, arXiv
2411.19870; bloc97/DeMo ``demo.py``, ``TransformDCT`` and ``CompressDCT``, commit
0e48145d702b25f83055e11d9585a9c11bcfe154), and the chunking SparseLoCo shares.

* The chunk of an axis of length ``s`` is the largest divisor of ``s`` that is at most the
  target (``chunk_size``), or ``s`` itself when every divisor is smaller
  (:func:`chunk_size`, the reference's ``_get_smaller_split``).
* A 1-D array ``[s]`` is cut into ``[s / c, c]``; a 2-D array ``[r, s]`` into separable
  ``[r / c1, c1] x [s / c2, c2]`` blocks (``einops.rearrange("(y h) (x w) -> y h x w")``).
  The orthonormal DCT-II (:func:`dct_basis`) is applied along each chunk axis, giving
  coefficients ``[chunks, c]`` (1-D) or ``[r / c1, s / c2, c1 c2]`` (2-D, flattened per
  block): :func:`encode` / :func:`decode` (its transpose, the inverse).
* The reference raises on arrays of other ranks; here a 0-D array is read as ``[1]`` and an
  array of rank >= 3 as ``[prod(shape[:-1]), shape[-1]]`` (an extension, named as such).
* :func:`chunk_top_k`: per chunk the ``k`` coefficients of largest magnitude
  (``torch.topk(x.abs(), k)``, ``k`` clamped to ``[1, chunk]``), as ``(indices, values)``.
* SparseLoCo (tplr-ai/SparseLoCo ``src/tplr/sparseloco.py``, ``ChunkingTransform``) chunks
  the same way without the DCT (``transform=False``), keeps
  ``round(chunk_len top_k / chunk_size^2)`` entries per chunk (:func:`sparseloco_k`) and
  quantises them (:func:`quantize`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


def chunk_size(s: int, target: int) -> int:
  """The largest divisor of ``s`` that is <= ``target``; ``s`` when none is (the reference's
  ``_get_smaller_split(n, close_to)``).

  Raises:
    ValueError: ``s`` or ``target`` < 1.
  """
  if s < 1 or target < 1:
    raise ValueError(f"chunk_size(s={s}, target={target}): both must be >= 1")
  divisors = sorted({d for i in range(1, math.isqrt(s) + 1) if s % i == 0
                     for d in (i, s // i)})
  for ix, d in enumerate(divisors):
    if d == target:
      return d
    if d > target:
      return d if ix == 0 else divisors[ix - 1]
  return s


@functools.lru_cache(maxsize=None)
def dct_basis(c: int) -> np.ndarray:
  """``F [c, c]`` float32, the orthonormal DCT-II as a matrix acting on the right:
  ``(x @ F)[b] = sqrt((1 + [b > 0]) / c) sum_j x_j cos(pi (2 j + 1) b / (2 c))`` (the
  reference's ``_dct(torch.eye(c), norm="ortho")``); its inverse is ``F.T``."""
  j, b = np.arange(c)[:, None], np.arange(c)[None, :]
  scale = np.where(b == 0, np.sqrt(1.0 / c), np.sqrt(2.0 / c))
  return (scale * np.cos(np.pi * (2 * j + 1) * b / (2 * c))).astype(np.float32)


def chunk_shape(shape: tuple, target: int) -> tuple:
  """The 1-D or 2-D shape an array of ``shape`` is chunked as (module docstring)."""
  shape = tuple(shape)
  if len(shape) == 0:
    return (1,)
  if len(shape) >= 3:
    return (int(np.prod(shape[:-1])), shape[-1])
  return shape


def encode(x: jax.Array, target: int, transform: bool = True) -> jax.Array:
  """DCT coefficients per chunk of ``x`` (any shape, read as :func:`chunk_shape`):
  ``[s / c, c]`` for 1-D, ``[r / c1, s / c2, c1 c2]`` for 2-D; ``transform=False``: the
  chunks' own values in that layout (SparseLoCo's chunking, without the DCT)."""
  shape = chunk_shape(x.shape, target)
  x = x.reshape(shape)
  if len(shape) == 1:
    c = chunk_size(shape[0], target)
    return x.reshape(-1, c) @ dct_basis(c) if transform else x.reshape(-1, c)
  c1, c2 = chunk_size(shape[0], target), chunk_size(shape[1], target)
  blocks = x.reshape(shape[0] // c1, c1, shape[1] // c2, c2)
  if transform:
    coef = jnp.einsum("yhxw,hb,wd->yxbd", blocks, dct_basis(c1), dct_basis(c2))
  else:
    coef = blocks.transpose(0, 2, 1, 3)
  return coef.reshape(shape[0] // c1, shape[1] // c2, c1 * c2)


def decode(coef: jax.Array, shape: tuple, target: int, transform: bool = True) -> jax.Array:
  """The array of ``shape`` whose :func:`encode` is ``coef`` (the inverse DCT per chunk)."""
  flat = chunk_shape(shape, target)
  if len(flat) == 1:
    c = chunk_size(flat[0], target)
    return (coef @ dct_basis(c).T if transform else coef).reshape(shape)
  c1, c2 = chunk_size(flat[0], target), chunk_size(flat[1], target)
  coef = coef.reshape(flat[0] // c1, flat[1] // c2, c1, c2)
  if transform:
    x = jnp.einsum("yxbd,hb,wd->yhxw", coef, dct_basis(c1), dct_basis(c2))
  else:
    x = coef.transpose(0, 2, 1, 3)
  return x.reshape(shape)


def chunk_top_k(coef: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """``(indices, values)``, each ``coef.shape[:-1] + (k',)``: per chunk (the last axis) the
  ``k' = min(max(k, 1), chunk)`` entries of largest magnitude and their values (ties: the
  lower index, ``lax.top_k``'s rule; torch.topk's is unspecified)."""
  k = min(max(int(k), 1), coef.shape[-1])
  _, idx = jax.lax.top_k(jnp.abs(coef), k)
  return idx, jnp.take_along_axis(coef, idx, axis=-1)


def message_shape(shape: tuple, target: int, k: int) -> tuple[int, int]:
  """``(chunks, k')`` of an array of ``shape``: how many chunks its encoding has and the
  entries kept per chunk."""
  flat = chunk_shape(shape, target)
  sizes = [chunk_size(s, target) for s in flat]
  chunks = int(np.prod([s // c for s, c in zip(flat, sizes)]))
  return chunks, min(max(int(k), 1), int(np.prod(sizes)))


def sparseloco_k(chunk_len: int, top_k: int, chunk_size: int) -> int:
  """SparseLoCo's entries per chunk: ``max(1, round(chunk_len top_k / chunk_size^2))``
  (Python's round, half to even), at most ``chunk_len`` (``TopKCompressor``)."""
  return min(int(max(1, round(chunk_len * top_k / chunk_size ** 2))), chunk_len)


def quantize(values: jax.Array, bins: int, sigmas: float) -> tuple[jax.Array, jax.Array]:
  """SparseLoCo's quantiser of one tensor's kept values (``TopKCompressor._quantize``):
  ``(codes, decoded)``, both shaped ``values``. ``shift = mean(v)``, ``c = v - shift``,
  ``std = ||c||_2 / sqrt(numel - 1)`` (0 for one value), ``scale = sigmas std / bins`` (1
  when 0 or not finite), ``code = clip(round_half_even(c / scale + bins // 2), 0, bins - 1)``;
  a code decodes to the mean of ``c`` over its bin (0 for an empty bin) plus ``shift``."""
  v = values.astype(jnp.float32)
  num = v.size
  shift = jnp.mean(v)
  c = v - shift
  std = jnp.sqrt(jnp.sum(c * c)) / np.sqrt(num - 1) if num > 1 else jnp.float32(0.0)
  scale = sigmas * std / bins
  scale = jnp.where((scale == 0) | ~jnp.isfinite(scale), 1.0, scale)
  codes = jnp.clip(jnp.round(c / scale + bins // 2), 0, bins - 1).astype(jnp.int32)
  onehot = codes[..., None] == jnp.arange(bins)
  sums = jnp.sum(jnp.where(onehot, c[..., None], 0.0), axis=tuple(range(c.ndim)))
  counts = jnp.sum(onehot, axis=tuple(range(c.ndim)))
  lookup = jnp.where(counts > 0, sums / jnp.maximum(counts, 1), 0.0)
  return codes, lookup[codes] + shift


__all__ = ["quantize", "sparseloco_k", "chunk_shape", "chunk_size", "chunk_top_k", "dct_basis", "decode", "encode",
           "message_shape"]
