"""The sparse message of a sparsifier: its types, the checks of its inputs and output, its bytes.

Source: Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed
Deep Learning" (2019), public code hclhkbu/GaussianK-SGD.

A compressor (:mod:`nbsgd_jax.codecs.sparse`: Top-k, Random-k; Gaussian-k in
:mod:`nbsgd_jax.codecs.gaussian`) maps a flat float vector ``x`` of shape [d] to a sparse
message ``(values, indices)`` with ``values`` of x's dtype and ``indices`` int32, both of a
static length. Indices equal to ``d`` are padding (value 0) and are dropped by ``densify``
(scatter-add with ``mode="drop"``); duplicate indices accumulate. Here: the types
(``Message``, ``Compressor``), the checks of ``x`` and ``density`` and the ``k`` they give
(:func:`num_selected`), a message's bytes (:func:`message_bytes`) and the check of a
compressor's output (:func:`check_message`, :func:`indices_in_range`). Every name is
importable from :mod:`nbsgd_jax.codecs.sparse` too.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Message = tuple[Array, Array]
Compressor = Callable[[Array, Optional[Array]], Message]


def _check_density(density: float) -> float:
  try:
    ok = 0.0 < float(density) <= 1.0
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"density={density!r} is not allowed: it must be in (0, 1]")
  return float(density)


def _check_x(x: Array) -> Array:
  x = jnp.asarray(x)
  if x.ndim != 1:
    raise ValueError(
        f"x must be a flat vector (ndim 1); got x with shape {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x must have a floating dtype; got x.dtype={x.dtype}")
  if x.shape[0] == 0:
    raise ValueError("x must be non-empty; got x with shape (0,)")
  return x


def num_selected(d: int, density: float) -> int:
  """Number of entries kept: k = ceil(density * d), at least 1 (and at most d).

  Raises:
    ValueError: if density is not in (0, 1] or d < 1.
  """
  density = _check_density(density)
  if int(d) < 1:
    raise ValueError(f"d={d!r} is not allowed: it must be >= 1")
  # Round away float noise first so that e.g. 0.07 * 100 gives 7, not 8.
  k = math.ceil(round(density * int(d), 6))
  return int(min(max(k, 1), int(d)))


def _identity(x: Array) -> Message:
  return x, jnp.arange(x.shape[0], dtype=jnp.int32)


def message_bytes(num_values: int, value_bytes: int = 4,
                  index_bytes: int = 4) -> float:
  """Bytes of a sparse message of num_values (value, index) pairs."""
  return float(num_values) * float(value_bytes + index_bytes)


def check_message(out, d: int, trusted: bool = False) -> tuple[Array, Array]:
  """A compressor's output ``(values [cap], indices [cap])`` for ``x [d]``, checked once at
  trace time: two 1-D arrays of one length, integer indices, and, when the indices are known
  then (concrete, not traced), each in ``[0, d]``. Traced indices of a compressor that is not
  ``trusted`` (:func:`indices_in_range`: the built-in ones are) are checked at run time too,
  by a host callback (``jax.debug.callback``) each time it runs: an index outside ``[0, d]``
  raises there, and the run stops with that line (through XLA: ``jax.errors.
  JaxRuntimeError``, which the command line prints as one ``error:`` line).

  Raises:
    ValueError: not a pair of 1-D arrays of one length, or an index out of range.
    TypeError: indices that are not integers.
  """
  if not (isinstance(out, (tuple, list)) and len(out) == 2):
    got = (f"one array of shape {tuple(out.shape)}" if hasattr(out, "shape") else
           f"{type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else
           type(out).__name__)
    raise ValueError(f"the compressor must return (values [cap], indices [cap]); it "
                     f"returned {got}")
  values, indices = jnp.asarray(out[0]), jnp.asarray(out[1])
  if values.ndim != 1 or indices.shape != values.shape:
    raise ValueError(f"the compressor must return (values [cap], indices [cap]); got shapes "
                     f"{values.shape} and {indices.shape}")
  if not jnp.issubdtype(indices.dtype, jnp.integer):
    raise TypeError(f"the compressor returned indices of dtype {indices.dtype}: expected "
                    "an integer dtype")
  if not isinstance(indices, jax.core.Tracer):
    _check_range(np.asarray(indices), d)
  elif not trusted:
    jax.debug.callback(functools.partial(_check_range, d=d), indices)
  return values, indices


def _check_range(indices: np.ndarray, d: int) -> None:
  bad = np.asarray(indices)[(np.asarray(indices) < 0) | (np.asarray(indices) > d)]
  if bad.size:
    raise ValueError(f"the compressor returned index {int(bad.flat[0])} for a vector of {d} "
                     f"entries: indices are in [0, {d}) ({d}: padding, no entry)")


def indices_in_range(fn) -> bool:
  """Whether the compressor ``fn`` (or the function of a ``functools.partial``) is one whose
  indices are in ``[0, d]`` by construction (Top-k, Random-k, Gaussian-k, their
  :func:`make_compressor` forms): :func:`check_message` skips its run-time check."""
  fn = getattr(fn, "func", fn)
  return bool(getattr(fn, "indices_in_range", False))
