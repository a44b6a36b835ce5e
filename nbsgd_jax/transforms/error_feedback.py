"""Sparsified SGD with error feedback (memory), as an optax gradient transformation.

Sources:

* S. Shi, X. Chu, K. C. Cheung and S. See, "Understanding Top-k Sparsification in
  Distributed Deep Learning", arXiv 1911.08772 (2019); code hclhkbu/GaussianK-SGD.
* S. U. Stich, J.-B. Cordonnier and M. Jaggi, "Sparsified SGD with Memory", NeurIPS 2018.
* S. P. Karimireddy, Q. Rebjock, S. U. Stich and M. Jaggi, "Error Feedback Fixes SignSGD
  and other Gradient Compression Schemes", ICML 2019.

One step of worker ``i``::

    p = g + e                     # gradient plus the residual (memory)
    s = C(p)                      # sparse message (values [cap], indices [cap])
    e <- p - dense(s)             # what was not sent stays in the local memory
    u = sum_j dense(s_j) / n      # all-gather of (values, indices), scatter-add, average

Applied to raw gradients, before weight decay and momentum::

    chain(error_feedback(partial(top_k, density=0.01), axis_name="workers"),
          optax.add_decayed_weights(wd), optax.sgd(lr, momentum))

Everything is pure and works under ``jit``, ``jax.vmap(..., axis_name="workers")`` and
``jax.shard_map``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from nbsgd_jax import codecs
from nbsgd_jax.communications import collectives
from nbsgd_jax.core.axis import varying_like as _varying_like
from nbsgd_jax.communications.sparse import MessageAllGather, SparseAllGather
from nbsgd_jax.transforms.base import WorkerTransform, merge_reports

__all__ = [
    "Compressor",
    "ErrorFeedbackState",
    "densify",
    "error_feedback",
]

PyTree = Any
# (x [d], key) -> (values [cap], indices [cap]); padding index d.
Compressor = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


class ErrorFeedbackState(NamedTuple):
  """State of :func:`error_feedback`.

  Attributes:
    residual: the local error memory ``e``, same tree, shapes and dtypes as the params
      (zeros when ``use_residual=False``).
    key: PRNG key, split at every update (the subkey goes to the compressor).
    sent_count: int32 scalar, number of valid entries (index in ``[0, d)``) this worker
      sent in the last update (summed over leaves when ``flatten=False``); for bytes
      accounting: ``sent_count * (value_bytes + index_bytes)``.
  """

  residual: PyTree
  key: jax.Array
  sent_count: jax.Array


densify = collectives.densify  # the one scatter-add of a sparse message


def _compress(compressor: Compressor, x: jax.Array, key: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  """Runs the compressor on ``x [d]`` and validates its output
  (:func:`nbsgd_jax.codecs.sparse.check_message`, trace time)."""
  values, indices = codecs.sparse.check_message(compressor(x, key), x.shape[0],
                                                codecs.sparse.indices_in_range(compressor))
  return values.astype(x.dtype), indices.astype(jnp.int32)


def error_feedback(compressor: Compressor,
                   axis_name: Optional[Any] = None,
                   flatten: bool = True,
                   seed: int = 0,
                   use_residual: bool = True,
                   communication: Optional[SparseAllGather] = None,
                   weight_by: str = "count") -> WorkerTransform:
  """Sparsification with error feedback (Stich et al. 2018; Shi et al. 2019), a worker
  transform: ``update(g, state, params=None, ctx=None) -> (u, state, report)``.

  ``p = g + e``; ``(values, indices) = C(p, key)``; ``e <- p - dense(values, indices)``; the
  returned update is

  * with ``axis_name``: the average of all workers' densified messages (a
    :class:`~nbsgd_jax.communications.SparseAllGather`: duplicate indices accumulate, padding
    index ``d`` dropped). ``report["bytes_sent"]`` is
    ``(n - 1) * sent * (value_bytes + index_bytes)``. When the communication is weighted
    (Non-blocking SGD, failures) the gradient is scaled first, ``p = n w_i g + e`` with the
    weights ``w_i`` of :meth:`~nbsgd_jax.communications.Communication.weight`, so the mean of
    the messages estimates ``sum_i w_i g_i`` and the residual stays in the units of what is
    sent (the error-feedback invariant: everything not sent is sent later); a failed worker
    sends nothing and keeps ``p``;
  * without ``axis_name`` (single worker): ``dense(values, indices)``, 0 bytes.

  Compose it like an optax transform, before weight decay and momentum::

      chain(error_feedback(functools.partial(top_k, density=0.01), axis_name="workers"),
            optax.add_decayed_weights(wd), optax.sgd(lr, momentum))

  Args:
    compressor: ``(x [d], key) -> (values [cap], indices [cap])``, e.g.
      ``functools.partial(codecs.sparse.top_k, density=0.01)``, or a
      :class:`~nbsgd_jax.codecs.Codec` (QSGD, scaled sign: the decoded messages are averaged
      by a :class:`~nbsgd_jax.communications.MessageAllGather`, ``sent_count`` then holds the
      bytes of the message; EF-signSGD is this with ``codecs.make_codec("sign")``, Karimireddy
      et al. 2019, Algorithm 1, applied to the gradient before the learning rate). ``cap`` is static; padding
      entries carry index ``d`` (dropped). Indices outside ``[0, d)`` are dropped.
    axis_name: the named worker axis (bound by ``vmap`` / ``shard_map``), or ``None``.
    flatten: ``True``: ravel the whole tree (``jax.flatten_util.ravel_pytree``, leaves
      promoted to a common dtype) and compress once, ``d`` = number of parameters;
      ``False``: compress each leaf separately (``d`` = leaf size, one key per leaf, one
      message per leaf).
    seed: seed of the transform's PRNG key (split every update). Under ``axis_name`` the
      compressor's subkey is additionally folded with ``lax.axis_index`` so workers draw
      independent randomness (random-k) from a shared seed.
    use_residual: ``False`` disables the memory (plain sparsification): ``p = g`` and the
      residual stays zero.
    communication: the :class:`~nbsgd_jax.communications.SparseAllGather` to use (a recipe
      passes one that knows n and the weighting); default: a plain one on ``axis_name``.
    weight_by: the weights of the mean when the communication is weighted: ``"count"``
      (gradients: finished mini-batches) or ``"alive"`` (model differences: live workers).

  Returns:
    a :class:`~nbsgd_jax.transforms.WorkerTransform` with state :class:`ErrorFeedbackState`.
    The update has the structure, shapes and dtypes of the gradients; ``params`` is not used.

  Raises:
    ValueError / TypeError (at trace time): the compressor returns arrays that are not 1-D
      of equal length, or non-integer indices.
    NameError: ``axis_name`` is given but not bound (raised by JAX).
  """
  codec = compressor if isinstance(compressor, codecs.Codec) else None
  if codec is not None and codec.sparse is not None:
    compressor, codec = codec.sparse, None  # sent as (values, indices)
  comm = communication
  if comm is None and axis_name is not None:
    comm = SparseAllGather(None, axis_name) if codec is None else MessageAllGather(None, axis_name)

  def init_fn(params: PyTree) -> ErrorFeedbackState:
    return ErrorFeedbackState(
        residual=jax.tree_util.tree_map(jnp.zeros_like, params),
        key=jax.random.PRNGKey(seed),
        sent_count=_varying_like(jnp.zeros((), jnp.int32), params))

  def _one(x: jax.Array, key: jax.Array, ctx, send) -> tuple:
    """Flat ``x [d]`` -> (update [d], new residual [d], sent count, report)."""
    d = x.shape[0]
    values, indices = _compress(compressor, x, key)
    local = densify(values, indices, d)
    residual = jnp.where(send, x - local, x) if use_residual else jnp.zeros_like(x)
    sent = jnp.where(send, jnp.sum((indices >= 0) & (indices < d)), 0).astype(jnp.int32)
    if comm is None:
      return local.astype(x.dtype), residual, sent, {}
    update, report = comm.mean(values, indices, d, ctx, send)
    return update.astype(x.dtype), residual, sent, report

  def _dense(p, state, key, sub, ctx, send):
    """A codec without a sparse form (QSGD, sign): decode, keep the residual, average."""
    decoded, nbytes = codecs.compress_tree(codec, p, sub, flatten)
    residual = jax.tree.map(
        lambda x, c, e: (jnp.where(send, x - c, x) if use_residual else jnp.zeros_like(e)
                         ).astype(e.dtype), p, decoded, state.residual)
    sent = jnp.where(send, nbytes, 0.0).astype(jnp.int32)  # bytes, not entries
    if comm is None:
      return decoded, ErrorFeedbackState(residual, key, sent), {}
    out, report = comm.mean_decoded(decoded, nbytes, ctx, send)
    return out, ErrorFeedbackState(residual, key, sent), report

  def update_fn(updates: PyTree, state: ErrorFeedbackState, params: PyTree = None, ctx=None):
    del params
    key, sub = jax.random.split(state.key)
    axis = comm.axis_name if comm is not None else None
    if axis is not None:
      sub = jax.random.fold_in(sub, lax.axis_index(axis))
    send, weight = True, None
    if comm is not None:  # a failed worker sends nothing and keeps p
      send, weight = comm.live(ctx), (comm.weight(ctx, weight_by) if ctx is not None else None)
    if weight is not None:  # p = n w_i g + e (docstring)
      n = collectives.axis_size(comm.axis_name)
      updates = jax.tree_util.tree_map(lambda g: g * (n * weight).astype(g.dtype), updates)
    if use_residual:
      p = jax.tree_util.tree_map(lambda g, e: g + e.astype(g.dtype), updates, state.residual)
    else:
      p = updates
    if codec is not None:
      return _dense(p, state, key, sub, ctx, send)
    if flatten:
      flat, unravel = ravel_pytree(p)
      if flat.size == 0:
        return updates, ErrorFeedbackState(state.residual, key, jnp.zeros((), jnp.int32)), {}
      upd, res, sent, report = _one(flat, sub, ctx, send)
      new_updates, new_residual = unravel(upd), unravel(res)
    else:
      leaves, treedef = jax.tree_util.tree_flatten(p)
      keys = jax.random.split(sub, max(len(leaves), 1))
      upd_leaves, res_leaves, reports = [], [], []
      sent = jnp.zeros((), jnp.int32)
      for leaf, k in zip(leaves, keys):
        leaf = jnp.asarray(leaf)
        if leaf.size == 0:
          upd_leaves.append(leaf)
          res_leaves.append(jnp.zeros_like(leaf))
          continue
        u, r, c, rep = _one(leaf.reshape(-1), k, ctx, send)
        upd_leaves.append(u.reshape(leaf.shape))
        res_leaves.append(r.reshape(leaf.shape))
        reports.append(rep)
        sent = sent + c
      new_updates = jax.tree_util.tree_unflatten(treedef, upd_leaves)
      new_residual = jax.tree_util.tree_unflatten(treedef, res_leaves)
      report = merge_reports(*reports)
    new_residual = jax.tree_util.tree_map(lambda r, e: r.astype(e.dtype), new_residual,
                                          state.residual)
    return new_updates, ErrorFeedbackState(new_residual, key, sent), report

  return WorkerTransform(init_fn, update_fn, (comm,) if comm is not None and comm.n else ())
