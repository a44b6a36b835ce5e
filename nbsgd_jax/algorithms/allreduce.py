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
from nbsgd_jax.algorithms.base import AXIS, Algorithm, masked_update, tree_bytes


def _centralized(name: str, reduce_sum, optimizer: optax.GradientTransformation,
                 num_workers: int, nonblocking: bool, axis_name: str) -> Algorithm:
  def update(grads, opt_state, params, inputs):
    sent = collectives.ring_all_reduce_bytes(tree_bytes(grads), num_workers)
    if not nonblocking:
      grads = jax.tree.map(lambda g: g / num_workers, reduce_sum(grads))
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, jnp.float32(sent)
    # He & Dube 2022, all-reduce form: g = sum_i sum_{j<m_i} g_ij / sum_i m_i.
    if getattr(inputs, "alive", None) is not None:  # a failed worker sends nothing
      sent = sent * inputs.alive[lax.axis_index(axis_name)].astype(jnp.float32)
    count = inputs.count.astype(jnp.float32)
    total = lax.psum(count, axis_name)
    summed = reduce_sum(jax.tree.map(lambda g: g * count.astype(g.dtype), grads))
    grads = jax.tree.map(lambda g: g / jnp.maximum(total, 1.0).astype(g.dtype), summed)
    updates, opt_state = masked_update(optimizer, grads, opt_state, params, total > 0)
    return optax.apply_updates(params, updates), opt_state, jnp.float32(sent)

  return Algorithm(name=name, decentralized=False, init=optimizer.init, update=update)


def allreduce(optimizer: optax.GradientTransformation, num_workers: int,
              axis_name: str = AXIS, nonblocking: bool = False) -> Algorithm:
  """All-Reduce SGD with XLA's all-reduce (``lax.pmean``).

  Bytes per worker per step are counted as for a bandwidth-optimal ring,
  ``2 (n - 1) / n * S`` for a model of ``S`` bytes (Patarasuk & Yuan 2009). With
  ``nonblocking`` the gradient is weighted by finished mini-batch counts (He & Dube 2022):
  ``g = sum_i sum_{j<m_i} g_ij / sum_i m_i``; no step when no worker finished any.
  """
  return _centralized("allreduce", lambda g: lax.psum(g, axis_name), optimizer, num_workers,
                      nonblocking, axis_name)


def allreduce_ring(optimizer: optax.GradientTransformation, num_workers: int,
                   axis_name: str = AXIS, nonblocking: bool = False) -> Algorithm:
  """All-Reduce SGD with the explicit ring all-reduce of :mod:`nbsgd_jax.collectives`.

  Reduce-scatter then all-gather, ``2 (n - 1)`` ``ppermute`` rounds of ``S / n`` bytes.
  """
  return _centralized("allreduce_ring", lambda g: collectives.ring_all_reduce(g, axis_name),
                      optimizer, num_workers, nonblocking, axis_name)


def sparse_allreduce(compressor, optimizer: optax.GradientTransformation, num_workers: int,
                     error_feedback: bool = True, flatten: bool = True, seed: int = 0,
                     axis_name: str = AXIS) -> Algorithm:
  """All-Reduce SGD with sparsified gradients (TopK-SGD / GaussianK-SGD, Shi et al. 2019).

  ``optax.chain(error_feedback(compressor, axis_name), optimizer)``: each worker adds its
  residual to its raw gradient, selects a fixed-capacity ``(values, indices)`` message, keeps
  the unsent part as the new residual and all-gathers the messages; the update is the average
  of the densified messages (:func:`nbsgd_jax.collectives.sparse_all_gather`), then weight
  decay and momentum (``optimizer``) act on it.

  Bytes per worker per step: ``(n - 1) * sent * 8`` (float32 values + int32 indices of the
  ``sent`` valid entries of its message, forwarded to the ``n - 1`` others).
  """
  from nbsgd_jax import error_feedback as ef_lib
  chain = optax.chain(
      ef_lib.error_feedback(compressor, axis_name=axis_name, flatten=flatten, seed=seed,
                            use_residual=error_feedback),
      optimizer)

  def update(grads, opt_state, params, inputs):
    del inputs
    updates, opt_state = chain.update(grads, opt_state, params)
    sent = opt_state[0].sent_count.astype(jnp.float32)
    return (optax.apply_updates(params, updates), opt_state,
            jnp.float32(num_workers - 1) * sent * 8.0)

  return Algorithm(name="allreduce", decentralized=False, init=chain.init, update=update)
