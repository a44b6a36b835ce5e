"""Measures of a decentralized run.

Consensus distance (Kong, Lin, Koloskova, Jaggi & Stich, "Consensus Control for
Decentralized Deep Learning", ICML 2021, Eq. (1) / Sec. 3):

    Xi^2 = (1/n) sum_i ||x_i - x_bar||^2,   x_bar = (1/n) sum_i x_i,

where ``x_i`` is worker i's whole model (all leaves concatenated).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def consensus_distance_sq(params) -> jax.Array:
  """``Xi^2`` of a pytree whose every leaf has a leading worker axis ``[n, ...]``.

  Returns:
    float32 scalar, in squared parameter units.

  Raises:
    ValueError: empty pytree, or leaves with different leading sizes.
  """
  leaves = jax.tree.leaves(params)
  if not leaves:
    raise ValueError("params is an empty pytree: consensus distance needs at least one leaf")
  n = leaves[0].shape[0] if leaves[0].ndim else None
  if n is None or any(l.ndim == 0 or l.shape[0] != n for l in leaves):
    raise ValueError("every leaf of params needs the same leading worker axis [n, ...]; got "
                     f"shapes {[tuple(l.shape) for l in leaves]}")
  total = jnp.zeros((), jnp.float32)
  for leaf in leaves:
    # Deviations from worker 0 first: the same Xi, exactly 0 for identical replicas, and no
    # cancellation between a large mean and small differences.
    x = leaf.astype(jnp.float32).reshape(n, -1)
    d = x - x[:1]
    total = total + jnp.sum(jnp.square(d - jnp.mean(d, axis=0, keepdims=True)))
  return total / n


def consensus_distance(params) -> jax.Array:
  """Consensus distance ``Xi = sqrt((1/n) sum_i ||x_i - x_bar||^2)`` (Kong et al. 2021).

  Args:
    params: pytree with a leading worker axis ``[n, ...]`` on every leaf.

  Returns:
    float32 scalar, in parameter units; 0 for identical replicas.
  """
  return jnp.sqrt(consensus_distance_sq(params))


def average_model(params):
  """The averaged model ``x_bar``: mean over the leading worker axis of every leaf."""
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), params)


def consensus_distance_per_layer(params) -> dict:
  """Consensus distance of each leaf separately: ``{path: Xi_leaf}`` (float32 scalars), path
  as ``"/"``-joined keys (e.g. ``"params/Dense_0/kernel"``); sum of squares over leaves gives
  ``Xi^2``.
  """
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    out[name] = consensus_distance({"x": leaf})
  return out
