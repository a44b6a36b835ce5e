"""All-Reduce SGD: every worker applies the same averaged gradient.

``g = (1/n) sum_i g_i`` (synchronous mini-batch SGD, e.g. Goyal et al. 2017), then the same
optax update on every worker, so replicas stay identical (consensus distance 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax

from nbsgd_jax import collectives
from nbsgd_jax.algorithms.base import AXIS, Algorithm, tree_bytes


def _centralized(name: str, reduce_mean, optimizer: optax.GradientTransformation,
                 num_workers: int) -> Algorithm:
  def update(grads, opt_state, params, step):
    del step
    sent = collectives.ring_all_reduce_bytes(tree_bytes(grads), num_workers)
    grads = reduce_mean(grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jnp.float32(sent)

  return Algorithm(name=name, decentralized=False, init=optimizer.init, update=update)


def allreduce(optimizer: optax.GradientTransformation, num_workers: int,
              axis_name: str = AXIS) -> Algorithm:
  """All-Reduce SGD with XLA's all-reduce (``lax.pmean``).

  Bytes per worker per step are counted as for a bandwidth-optimal ring,
  ``2 (n - 1) / n * S`` for a model of ``S`` bytes (Patarasuk & Yuan 2009).
  """
  return _centralized("allreduce", lambda g: lax.pmean(g, axis_name), optimizer, num_workers)


def allreduce_ring(optimizer: optax.GradientTransformation, num_workers: int,
                   axis_name: str = AXIS) -> Algorithm:
  """All-Reduce SGD with the explicit ring all-reduce of :mod:`nbsgd_jax.collectives`.

  Reduce-scatter then all-gather, ``2 (n - 1)`` ``ppermute`` rounds of ``S / n`` bytes.
  """
  def ring_mean(g):
    return jax.tree.map(lambda x: x / num_workers, collectives.ring_all_reduce(g, axis_name))

  return _centralized("allreduce_ring", ring_mean, optimizer, num_workers)
