"""Gradient sparsifiers: Top-k, Gaussian-k and Random-k.

Source: Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed
Deep Learning" (2019), public code hclhkbu/GaussianK-SGD (``GaussianCompressor``).

Every compressor maps a flat float vector ``x`` of shape [d] to a sparse message
``(values, indices)`` with ``values`` of x's dtype and ``indices`` int32, both of a
static length.  Indices equal to ``d`` are padding (value 0) and are dropped by
``densify`` (scatter-add with ``mode="drop"``); duplicate indices accumulate.

Here: Top-k, Random-k, the registry ``COMPRESSORS`` with :func:`make_compressor`, and the
codecs of them (:func:`sparse_codec`). Gaussian-k lives in :mod:`nbsgd_jax.codecs.gaussian`
and the message's types and checks in :mod:`nbsgd_jax.codecs.message`; their names are
importable from here.

Signature: ``compressor(x, key=None, *, density, ...)``, so
``functools.partial(top_k, density=0.01)`` is a compressor ``(x, key) -> (values, indices)``
(:func:`nbsgd_jax.transforms.error_feedback`). All functions are pure and jit-able in ``x``
and ``key``; ``density`` and the other options are keyword-only Python numbers (static under
``jax.jit``).
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax

from nbsgd_jax.codecs.base import Codec
from nbsgd_jax.codecs.gaussian import (CORRECTIONS, DEFAULT_ROUNDS, default_rounds,  # noqa: F401
                                       gaussian_k, gaussian_k_with_count, gaussian_threshold)
from nbsgd_jax.codecs.message import (Array, Compressor, Message, _check_density,  # noqa: F401
                                      _check_x, _identity, check_message, indices_in_range,
                                      message_bytes, num_selected)
from nbsgd_jax.communications.collectives import densify
# the private helpers, importable from here as before
from nbsgd_jax.codecs.gaussian import (_block_counts, _check_rounds,  # noqa: F401
                                       _default_block_size, _initial_threshold,
                                       _threshold_and_block_counts)
from nbsgd_jax.codecs.message import _check_range  # noqa: F401


def top_k(x: Array, key: Optional[Array] = None, *, density: float) -> Message:
  """Exact Top-k by magnitude: ``lax.top_k(|x|, k)``, k = num_selected(d, density).

  Args:
    x: [d] float vector.
    density: fraction in (0, 1].
    key: unused (uniform compressor signature).
  Returns:
    values [k] (signed entries of x, by decreasing |x|) and indices int32 [k].
  Raises:
    ValueError: x not a non-empty floating 1-D array; density not in (0, 1].
  """
  del key
  x = _check_x(x)
  density = _check_density(density)
  d = x.shape[0]
  if density == 1.0:
    return _identity(x)
  k = num_selected(d, density)
  _, idx = lax.top_k(jnp.abs(x), k)
  idx = idx.astype(jnp.int32)
  return x[idx], idx


def random_k(x: Array, key: Optional[Array] = None, *, density: float) -> Message:
  """Random-k: k distinct indices, uniform over all k-subsets of [0, d).

  Instead of ``jax.random.choice(replace=False)`` (a full permutation of d, slow
  for large d) we draw k indices with replacement, sort them, and redraw the
  duplicate slots until none remain (``lax.while_loop``; about k^2 / (2d)
  duplicates in the first round, so few rounds).  This is sequential rejection
  sampling, hence exactly uniform without replacement; cost O(k log k) per round.

  Args:
    x: [d] float vector.
    density: fraction in (0, 1].
    key: PRNG key (required).
  Returns:
    values [k] = x[indices] and indices int32 [k] (distinct; sorted up to the
    slots refilled in the last round).
  Raises:
    ValueError: bad x or density, or key is None.
  """
  x = _check_x(x)
  density = _check_density(density)
  if key is None:
    raise ValueError("key is required for random_k (got key=None)")
  d = x.shape[0]
  if density == 1.0:
    return _identity(x)
  k = num_selected(d, density)

  def draw(kk: Array) -> Array:
    return jax.random.randint(kk, (k,), 0, d, dtype=jnp.int32)

  key, sub = jax.random.split(key)
  idx0 = jnp.sort(draw(sub))

  def dups(idx: Array) -> Array:  # idx sorted
    return jnp.concatenate([jnp.zeros((1,), bool), idx[1:] == idx[:-1]])

  def cond(state):
    return jnp.any(dups(state[0]))

  def body(state):
    idx, kk = state
    kk, sub = jax.random.split(kk)
    idx = jnp.sort(jnp.where(dups(idx), draw(sub), idx))
    return idx, kk

  idx, _ = lax.while_loop(cond, body, (idx0, key))
  return x[idx], idx


COMPRESSORS: dict[str, Callable[..., Message]] = {
    "top_k": top_k,
    "gaussian_k": gaussian_k,
    "random_k": random_k,
}
for _fn in COMPRESSORS.values():  # indices in [0, d] by construction (check_message)
  _fn.indices_in_range = True


def make_compressor(name: str, density: float, **options) -> Compressor:
  """Return ``fn(x, key) -> (values, indices)`` for a compressor in COMPRESSORS.

  Args:
    name: a key of COMPRESSORS.
    density: k / d in (0, 1].
    **options: keyword options of that compressor (e.g. ``rounds``, ``correction`` of
      ``gaussian_k``).
  Raises:
    ValueError: unknown name, density not in (0, 1], or an option the compressor lacks.
  """
  if name not in COMPRESSORS:
    raise ValueError(
        f"name={name!r} is not a known compressor; choose one of "
        f"{sorted(COMPRESSORS)}")
  density = _check_density(density)
  fn = COMPRESSORS[name]
  allowed = set(inspect.signature(fn).parameters) - {"x", "density", "key"}
  bad = sorted(set(options) - allowed)
  if bad:
    raise ValueError(f"options {bad} are not allowed for compressor {name!r}: it takes "
                     f"{sorted(allowed) or 'none'}")

  def compress(x: Array, key: Optional[Array] = None) -> Message:
    return fn(x, key, density=density, **options)

  compress.__name__ = f"{name}_{density:g}"
  compress.indices_in_range = True
  return compress


def sparse_codec(name: str, fn: Callable) -> Codec:
  """The :class:`Codec` of a sparse compressor ``fn: (x [d], key) -> (values [cap], indices
  [cap])`` (padding index ``d``; output checked by :func:`check_message`): ``C(x) =
  dense(values, indices)``, ``valid (value_bytes + 4)`` bytes for the ``valid`` indices in
  ``[0, d)``."""

  def compress(x, key=None):
    d = x.shape[0]
    values, indices = check_message(fn(x, key), d, indices_in_range(fn))
    valid = jnp.sum((indices >= 0) & (indices < d)).astype(jnp.float32)
    return (densify(values, indices, d).astype(x.dtype),
            valid * (jnp.dtype(values.dtype).itemsize + 4))
  return Codec(name, compress, fn)


def top_k_codec(density: float = 0.01) -> Codec:
  """Top-k of ``density`` d entries (:func:`top_k`), a :class:`~nbsgd_jax.codecs.Codec`."""
  return sparse_codec("top_k", make_compressor("top_k", density))


def random_k_codec(density: float = 0.01) -> Codec:
  """Random-k of ``density`` d entries (:func:`random_k`)."""
  return sparse_codec("random_k", make_compressor("random_k", density))


def gaussian_k_codec(density: float = 0.01, gaussian_rounds: int = 0,
                     gaussian_correction: str = "bracket") -> Codec:
  """Gaussian-k (:func:`gaussian_k`) with ``gaussian_rounds`` corrections (0: the
  correction's default, :data:`DEFAULT_ROUNDS`) of kind ``gaussian_correction``."""
  return sparse_codec("gaussian_k", make_compressor(
      "gaussian_k", density, rounds=gaussian_rounds or None, correction=gaussian_correction))
