"""The worker axis every worker program communicates over, and two helpers on it."""

from __future__ import annotations

from typing import Any

import jax
from jax import lax

AXIS = "workers"
"""The named axis every worker program communicates over."""


def tree_bytes(tree: Any) -> int:
  """Bytes of one copy of a pytree (one worker's model or gradient), from leaf dtypes."""
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def varying_like(x: jax.Array, tree: Any) -> jax.Array:
  """``x`` marked as varying over the manual mesh axes the leaves of ``tree`` vary over.

  Inside ``jax.shard_map`` a per-worker value a transform returns (a count, a byte total)
  varies over the worker axis; a loop carry or a state that starts as a constant must be
  given the same type (e.g. ``error_feedback``'s ``sent_count``, consensus control's bytes).
  Outside ``shard_map`` (plain, ``jit``, ``vmap``) ``x`` is returned unchanged.
  """
  axes: set = set()
  for leaf in jax.tree_util.tree_leaves(tree):
    axes |= _vma(leaf)
  axes -= _vma(x)  # already varying over these
  if not axes:
    return x
  return lax.pcast(x, tuple(sorted(axes)), to="varying")


def _vma(x: Any) -> set:
  """The manual mesh axes ``x`` varies over (empty outside ``shard_map``)."""
  aval = jax.typeof(x)
  vma = getattr(aval, "vma", None)  # older JAX
  if vma is None:
    vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
  return set(vma or ())
