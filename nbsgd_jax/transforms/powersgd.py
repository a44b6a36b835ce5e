"""PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): rank-r compression by one power
iteration with a warm-started Q, error feedback, and two all-reduces (P, then Q).

Per step, on every worker, with ``M = g + e`` for each parameter that is a matrix (leaves with
ndim >= 2, viewed as ``[shape[-1], prod(shape[:-1])]``: torch's ``weight.view(out, -1)`` for
flax's ``[..., in, out]`` kernels)::

    P = M Q                      Q: [cols, r], the last step's Q (random normal at first)
    P <- sum_i P_i               all-reduce 1
    P_hat = orthogonalize(P)     Gram-Schmidt over the r columns (eps 1e-8)
    Q = M^T P_hat
    Q <- (1/n) sum_i Q_i          all-reduce 2
    update = P_hat Q^T,  e <- M - P_hat Q^T

Vectors (biases) are all-reduced uncompressed, with no memory, as in the paper. Reference:
epfml/powersgd ``paper-code/gradient_reducers.py``, ``RankKReducer`` with ``reuse_query``;
``orthogonalize`` is its Gram-Schmidt. Bytes per worker: ``2 (n - 1) / n`` times the
float32 bytes of all P, all Q and the vectors (ring all-reduces), in two rounds.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import jax.numpy as jnp

from nbsgd_jax import codecs
from nbsgd_jax.transforms.base import WorkerTransform


class PowerSGDState(NamedTuple):
  """State of :func:`powersgd`: the error memory ``e`` (the params' tree), the warm-started
  ``Q`` of each matrix leaf (``[cols, r]``, None for vectors)."""

  residual: Any
  q: Any


def as_matrix(x: jax.Array) -> jax.Array:
  """``[..., out]`` -> ``[out, prod(...)]`` (torch's ``weight.view(out, -1)``)."""
  return x.reshape(-1, x.shape[-1]).T


def from_matrix(m: jax.Array, shape) -> jax.Array:
  """Inverse of :func:`as_matrix`."""
  return m.T.reshape(shape)


def orthogonalize(p: jax.Array, eps: float = 1e-8) -> jax.Array:
  """Gram-Schmidt over the columns of ``p [rows, r]``: each column is normalised
  (``/ (||col|| + eps)``) and removed from the later ones (epfml/powersgd)."""
  cols = []
  for i in range(p.shape[1]):
    col = p[:, i]
    for c in cols:
      col = col - jnp.sum(c * col) * c
    cols.append(col / (jnp.sqrt(jnp.sum(col ** 2)) + eps))
  return jnp.stack(cols, axis=1)


def _rank(x, rank: int) -> int:
  m = as_matrix(x)
  return min(m.shape[0], m.shape[1], rank)


def rank_error(rank: int, shapes) -> str | None:
  """Why rank ``r`` saves nothing for a model with parameter ``shapes``, or None: PowerSGD
  saves bytes only while it sends fewer entries than the dense message, i.e. the sum over
  matrices (a leaf of ``ndim >= 2``, as :func:`as_matrix`) of ``min(r, rows, cols) (rows +
  cols)`` plus the vectors stays below the number of parameters (at full rank it sends
  more)."""
  sides = [min(s[-1], int(np.prod(s[:-1]))) for s in shapes if len(s) >= 2]
  dense = sum(int(np.prod(s)) for s in shapes)
  sent = sum(min(rank, s[-1], int(np.prod(s[:-1]))) * (s[-1] + int(np.prod(s[:-1])))
             if len(s) >= 2 else int(np.prod(s)) for s in shapes)
  if not sides or sent < dense:
    return None
  return (f"it sends {sent:,} entries per step, the dense message {dense:,} (the "
          f"model's matrices have smaller sides {min(sides)} to {max(sides)})")


def check_model(cfg, shapes: list, errs: list) -> list[str]:
  """compression.rank against the model's parameter ``shapes`` (one worker's). A rank that
  sends as much as the dense message or more (:func:`rank_error`) is legal, a warning: at
  full rank PowerSGD is exact all-reduce, the standard sanity check of the method (Vogels
  et al. 2019, Sec. 3), but it saves no bytes. Returns the warning lines; ``errs``: none."""
  del errs
  why = rank_error(cfg.compression.rank, shapes)
  if not why:
    return []
  return [f"config.compression.rank={cfg.compression.rank} saves no bytes: {why}; full rank "
          "is all-reduce (a sanity check), a rank well below the smaller sides compresses"]


def powersgd(rank: int, allreduce, seed: int = 0, use_residual: bool = True,
             weight_by: str = "count") -> WorkerTransform:
  """PowerSGD's compressed mean (module docstring), a reducer.

  Args:
    rank: ``r >= 1`` (capped at each matrix's smaller side).
    allreduce: the :class:`~nbsgd_jax.communications.AllReduce` (its key names the bytes;
      its weights: ``M = n w_i g + e`` under Non-blocking SGD or failures, so the mean of the
      messages estimates ``sum_i w_i g_i``; a failed worker sends nothing and keeps ``M``).
    seed: seed of the first Q (the same on every worker, as the reference's shared seed).
    use_residual: error feedback (``False``: ``e`` stays 0).
    weight_by: ``"count"`` (gradients) or ``"alive"`` (model differences).

  Raises:
    ValueError: ``rank`` < 1.
  """
  if not (isinstance(rank, int) and rank >= 1):
    raise ValueError(f"compression.rank={rank!r} is not allowed: it must be an int >= 1")

  def init(params):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), max(len(leaves), 1))
    qs = [jax.random.normal(k, (as_matrix(x).shape[1], _rank(x, rank)), x.dtype)
          if x.ndim >= 2 else None for x, k in zip(leaves, keys)]
    return PowerSGDState(jax.tree.map(jnp.zeros_like, params), jax.tree.unflatten(treedef, qs))

  def update(grads, state, params, ctx):
    del params
    n = allreduce.n
    w, send = allreduce.weight(ctx, weight_by), allreduce.live(ctx)
    if w is not None:
      grads = jax.tree.map(lambda g: g * (n * w).astype(g.dtype), grads)
    m_tree = (jax.tree.map(lambda g, e: g + e, grads, state.residual) if use_residual
              else grads)
    leaves, treedef = jax.tree.flatten(m_tree)
    qs = treedef.flatten_up_to(state.q)
    zero = lambda x: jnp.where(send, x, jnp.zeros_like(x))
    mats = {i: as_matrix(x) for i, x in enumerate(leaves) if x.ndim >= 2}
    vecs = {i: zero(x) for i, x in enumerate(leaves) if x.ndim < 2}
    ps = allreduce.reduce_sum({i: zero(m @ qs[i]) for i, m in mats.items()})  # round 1
    p_hat = {i: orthogonalize(p) for i, p in ps.items()}
    q_new = {i: zero(m.T @ p_hat[i]) for i, m in mats.items()}
    q_sum, v_sum = allreduce.reduce_sum((q_new, vecs))  # round 2 (vectors ride along)
    out, res, new_qs = [], [], []
    for i, x in enumerate(leaves):
      if i in mats:
        q = q_sum[i] / n
        approx = from_matrix(p_hat[i] @ q.T, x.shape)
        out.append(approx)
        res.append(jnp.where(send, x - approx, x) if use_residual else jnp.zeros_like(x))
        new_qs.append(q)
      else:
        out.append(v_sum[i] / n)
        res.append(jnp.zeros_like(x))
        new_qs.append(None)
    sent = allreduce.charge(jnp.where(send, allreduce.num_bytes((ps, q_sum, v_sum)), 0.0), ctx)
    report = allreduce.report(sent, rounds=2)
    return (jax.tree.unflatten(treedef, out),
            PowerSGDState(jax.tree.unflatten(treedef, res), jax.tree.unflatten(treedef, new_qs)),
            report)

  return WorkerTransform(init, update, (allreduce,))


def reducer(rank: int = 2) -> Callable:
  """``config.compression.name='powersgd'`` (:func:`nbsgd_jax.codecs.register`, a reducer):
  ``make(allreduce, seed, use_residual, weight_by) -> WorkerTransform`` of rank ``rank``."""
  return lambda allreduce, seed=0, use_residual=True, weight_by="count": powersgd(
      rank, allreduce, seed=seed, use_residual=use_residual, weight_by=weight_by)


codecs.register("powersgd", reducer, ("rank",), reducer=True, check_model=check_model)
