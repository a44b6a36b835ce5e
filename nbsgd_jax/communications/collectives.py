"""Named-axis communication: ring all-reduce and gossip (neighbour exchange).

Every function here is the program of ONE worker. It must be called inside a context
that binds the named axis ``axis_name`` (default ``"workers"``):

* simulate backend: ``jax.vmap(f, axis_name="workers")`` over a leading worker axis;
* mesh backend: ``jax.shard_map(f, mesh=..., ...)`` over a 1-D mesh whose axis is
  ``"workers"``, one worker per device;
* mesh backend with k workers per device: ``shard_map`` over the mesh axis ``"devices"``
  around ``vmap(f, axis_name="workers")``; the worker axis is then the pair
  ``("devices", "workers")`` (worker ``d k + l`` is local slot l of device d). ``psum``,
  ``pmean`` and ``axis_index`` take the pair as it is; :func:`permute`, :func:`all_gather` and
  :func:`axis_size` here handle it (``lax.ppermute`` and ``lax.all_gather`` do not accept a
  vmap axis together with a mesh axis).

All give the same numbers. Every communication round is a FULL permutation
(``lax.ppermute`` under ``vmap`` rejects partial ones).

The host half of a gossip (``W`` as ``ppermute`` rounds, :class:`GossipPlan`, a gossip's
bytes) lives in :mod:`nbsgd_jax.communications.mixing`; its names are importable from here.

Sources:

* Ring all-reduce: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for
  clusters of workstations", J. Parallel Distrib. Comput. 69(2), 2009. Reduce-scatter then
  all-gather, ``2 (n - 1)`` rounds on ``n`` chunks; each worker sends
  ``2 (n - 1) / n * S`` bytes for a message of ``S`` bytes.
* Gossip averaging: X. Lian et al., "Can decentralized algorithms outperform centralized
  algorithms? A case study for decentralized parallel stochastic gradient descent",
  NeurIPS 2017 (D-PSGD), Eq. (2): ``x_i <- sum_j W_ij x_j``.
"""

from __future__ import annotations

from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from nbsgd_jax.communications.mixing import (GossipPlan, MatrixLike, _as_matrix,  # noqa: F401
                                             _off_diagonal, _shift_weights, gossip_bytes,
                                             gossip_plan, gossip_rounds, gossip_shifts)

PyTree = Any

DEFAULT_AXIS = "workers"
AxisName = Union[str, tuple]


def axis_size(axis_name: AxisName) -> int:
  """Number of workers on ``axis_name`` (a name, or a ``(device, local)`` pair)."""
  if isinstance(axis_name, tuple):
    return int(np.prod([lax.axis_size(a) for a in axis_name]))
  return lax.axis_size(axis_name)


_MAX_LOCAL_SHIFTS = 16  # more local shifts for one device shift: all-gather the slots instead


def permute(x: PyTree, axis_name: AxisName, perm: list) -> PyTree:
  """``lax.ppermute`` of ``x`` by ``perm`` (pairs ``(source, destination)`` of a full
  permutation of the workers), also over a ``(device, local)`` axis pair.

  On a pair, worker ``w = d k + l`` receives from ``s = d' k + l'``: the destinations are grouped
  by (device shift ``(d - d') mod D``, local shift ``(l - l') mod k``); per device shift one
  ``ppermute`` over the device axis (every local slot to the same slot that many devices on),
  then per local shift one ``ppermute`` over the local axis (a rotation of the k slots, a
  gather under ``vmap``), and each worker keeps the value of its own group. A ring shift has at
  most two groups, so a round costs O(k) model copies per device. A device shift with more than
  ``_MAX_LOCAL_SHIFTS`` local shifts (an irregular permutation) all-gathers the k slots instead
  (k model copies per worker, k^2 per device).
  """
  if not isinstance(axis_name, tuple):
    return lax.ppermute(x, axis_name, perm)
  dev_axis, loc_axis = axis_name
  d_size, k = lax.axis_size(dev_axis), lax.axis_size(loc_axis)
  n = d_size * k
  src_of = np.empty(n, np.int64)
  for src, dst in perm:
    src_of[dst] = src
  dst = np.arange(n)
  dev_shift = (dst // k - src_of // k) % d_size
  loc_shift = (dst % k - src_of % k) % k
  groups: dict = {}
  for dl, r in sorted(set(zip(dev_shift.tolist(), loc_shift.tolist()))):
    groups.setdefault(dl, []).append(r)
  w = lax.axis_index(axis_name)

  def one(leaf):
    out = None
    for dl, shifts in groups.items():
      y = leaf if dl == 0 else lax.ppermute(
          leaf, dev_axis, [(j, (j + dl) % d_size) for j in range(d_size)])
      if len(shifts) > _MAX_LOCAL_SHIFTS:
        slots = lax.all_gather(y, loc_axis)  # [k, ...]: the slots of device d - dl
        val = slots[jnp.asarray(src_of % k, jnp.int32)[w]]
        take = jnp.asarray(dev_shift == dl)[w]
        out = val if out is None else jnp.where(take, val, out)
        continue
      for r in shifts:
        z = y if r == 0 else lax.ppermute(y, loc_axis, [(l, (l + r) % k) for l in range(k)])
        take = jnp.asarray((dev_shift == dl) & (loc_shift == r))[w]
        out = z if out is None else jnp.where(take, z, out)  # every worker is in one group
    return out

  return jax.tree_util.tree_map(one, x)


def shared(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """A value every worker holds the same (e.g. the step), as one value: ``lax.pmax`` over the
  worker axis (bool as int32).

  Why: under ``vmap`` an input is batched even when it is the same on every worker, and
  ``lax.cond`` / ``lax.switch`` on a batched index runs every branch and selects, with each
  branch's host constants broadcast to ``[n, ...]`` (an ``[n]`` weight vector becomes
  ``[n, n]``). The ``pmax`` result is unbatched, so the branch is a real one: O(n) work and
  memory for the branch taken (time-varying gossip: one phase of W_t instead of all P). On a
  device mesh it costs one all-reduce of ``x`` (a scalar or a few flags).
  """
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return lax.pmax(x.astype(jnp.int32), axis_name).astype(jnp.bool_)
  return lax.pmax(x, axis_name)


def all_gather(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """``lax.all_gather`` (``[n, ...]`` in worker order), also over a ``(device, local)``
  axis pair."""
  if not isinstance(axis_name, tuple):
    return lax.all_gather(x, axis_name)
  dev_axis, loc_axis = axis_name
  g = lax.all_gather(lax.all_gather(x, loc_axis), dev_axis)  # [devices, k, ...]
  return g.reshape((-1,) + x.shape)


# ---------------------------------------------------------------------------------------
# Ring all-reduce
# ---------------------------------------------------------------------------------------


def _ring_all_reduce_flat(flat: jax.Array, axis_name: str, n: int) -> jax.Array:
  """Ring all-reduce of a 1-D array ``[L]`` over ``n >= 2`` workers; returns ``[L]``."""
  length = flat.shape[0]
  m = -(-length // n)  # chunk length, ceil(L / n)
  pad = n * m - length
  if pad:
    flat = jnp.concatenate([flat, jnp.zeros((pad,), flat.dtype)])
  chunks = flat.reshape(n, m)
  i = lax.axis_index(axis_name)
  right = [(j, (j + 1) % n) for j in range(n)]

  def label(s: int) -> jax.Array:
    """``(s - i) mod n`` for a static ``s`` (kept non-negative for ``lax.rem``)."""
    return lax.rem(s - i + 2 * n, n)

  # Chunk labelling: at reduce-scatter round s (0-based) worker i sends the partial sum of
  # chunk (s - i) mod n to worker i + 1, which adds its own copy of that chunk and
  # forwards it at round s + 1. Each round reads ONE chunk with a dynamic_slice (fused
  # into the add; measured faster than rotating the whole array by i with a dynamic roll
  # and then using static slices: see benchmarks/ring_allreduce.py).
  acc = lax.dynamic_index_in_dim(chunks, label(0), 0, keepdims=False)
  for s in range(1, n):
    own = lax.dynamic_index_in_dim(chunks, label(s), 0, keepdims=False)
    acc = permute(acc, axis_name, right) + own
  # Now worker i holds the full sum of chunk (n - 1 - i) mod n.

  # All-gather: n - 1 rounds; at round s (1-based) worker i receives from i - 1 the full
  # chunk (n - 1 - i + s) mod n and writes it in place (dynamic_update_slice) over the
  # input chunks (every row gets overwritten; measured a little faster than a zeros buffer).
  out = lax.dynamic_update_index_in_dim(chunks, acc, label(n - 1), 0)
  piece = acc
  for s in range(1, n):
    piece = permute(piece, axis_name, right)
    out = lax.dynamic_update_index_in_dim(out, piece, label(n - 1 + s), 0)
  return out.reshape(n * m)[:length]


def ring_all_reduce(x: PyTree, axis_name: str = DEFAULT_AXIS) -> PyTree:
  """Sum over workers with the bandwidth-optimal ring algorithm (Patarasuk & Yuan 2009).

  Numerically the same as ``lax.psum(x, axis_name)`` (up to floating-point summation
  order). The message is flattened, zero-padded to a multiple of ``n`` and viewed as ``n``
  chunks; ``n - 1`` reduce-scatter rounds and ``n - 1`` all-gather rounds follow, each a
  single ``lax.ppermute`` of one chunk to the right neighbour ``i -> i + 1 (mod n)``.

  Args:
    x: one worker's array of any shape (any length, need not divide by ``n``), or a pytree
      of arrays. A pytree is flattened once with ``jax.flatten_util.ravel_pytree`` (leaves
      are promoted to a common dtype for the reduction and cast back), reduced in one ring
      and unflattened.
    axis_name: the named worker axis (bound by ``vmap`` or ``shard_map``).

  Returns:
    The sum over the ``n`` workers, same structure, shapes and dtypes as ``x``. With
    ``n = 1`` (or an empty message) ``x`` is returned unchanged.

  Raises:
    NameError: ``axis_name`` is not bound (raised by JAX).
  """
  n = axis_size(axis_name)
  if n == 1:
    return x
  if isinstance(x, (jax.Array, np.ndarray)) or np.isscalar(x):
    arr = jnp.asarray(x)
    if arr.size == 0:
      return arr
    return _ring_all_reduce_flat(arr.reshape(-1), axis_name, n).reshape(arr.shape)
  flat, unravel = ravel_pytree(x)
  if flat.size == 0:
    return x
  return unravel(_ring_all_reduce_flat(flat, axis_name, n))


def ring_all_reduce_bytes(num_bytes: float, n: int) -> float:
  """Bytes each worker sends in one ring all-reduce of a ``num_bytes`` message.

  ``2 (n - 1) / n * num_bytes`` (Patarasuk & Yuan 2009): ``n - 1`` reduce-scatter rounds
  plus ``n - 1`` all-gather rounds, each sending one chunk of ``num_bytes / n`` bytes.
  Padding to a multiple of ``n`` is ignored. ``n = 1`` gives 0.

  Args:
    num_bytes: size of the message in bytes (e.g. the model's parameter bytes).
    n: number of workers, ``>= 1``.

  Returns:
    bytes sent per worker (float).

  Raises:
    ValueError: ``n < 1`` or ``num_bytes < 0``.
  """
  if isinstance(n, bool) or int(n) != n or n < 1:
    raise ValueError(f"n={n!r} is not allowed: it must be an integer >= 1")
  if num_bytes < 0:
    raise ValueError(f"num_bytes={num_bytes!r} is not allowed: it must be >= 0")
  return 2.0 * (n - 1) / n * float(num_bytes)


# ---------------------------------------------------------------------------------------
# Gossip (its plan, W as ppermute rounds: nbsgd_jax.communications.mixing)
# ---------------------------------------------------------------------------------------


def _check_axis(w: np.ndarray, axis_name: str) -> int:
  n = axis_size(axis_name)
  if w.shape != (n, n):
    raise ValueError(f"mixing matrix has shape {w.shape} but axis {axis_name!r} has {n} "
                     f"workers: expected shape ({n}, {n})")
  return n


def _weighted(weight: jax.Array, leaf: jax.Array) -> jax.Array:
  return weight.astype(leaf.dtype) * leaf


def _check_leaves(x: PyTree) -> None:
  for leaf in jax.tree_util.tree_leaves(x):
    if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
      raise TypeError(f"gossip needs floating-point leaves, got dtype {jnp.result_type(leaf)}")


def gossip(x: PyTree, mixing_matrix: Union[MatrixLike, GossipPlan],
           axis_name: str = DEFAULT_AXIS, alive: jax.Array | None = None,
           difference: bool = False) -> PyTree:
  """One gossip (mixing) step ``x_i <- sum_j W[i, j] x_j`` by neighbour exchange.

  D-PSGD's averaging step (Lian et al., NeurIPS 2017, Eq. (2)). ``W`` is decomposed into
  full-permutation ``lax.ppermute`` rounds (:func:`gossip_rounds`): ring shifts for
  circulant graphs (a ring costs 2 ppermutes), matchings otherwise (at most max degree + 1);
  in each round worker ``i`` adds the received model times its weight (read from a host
  constant ``[n]`` at ``lax.axis_index``). The whole model is never all-gathered, and no
  ``[n, n]`` array enters the program: under ``vmap`` a round costs O(n) model copies.
  ``W`` need not be symmetric or stochastic.

  Args:
    x: one worker's model, a pytree of floating-point arrays.
    mixing_matrix: numpy ``[n, n]`` host constant (or a ``Topology``, whose
      ``.mixing_matrix`` is used), ``n`` = size of ``axis_name``; or its
      :class:`GossipPlan` (:func:`gossip_plan`, built once instead of at every trace).
    axis_name: the named worker axis (bound by ``vmap`` or ``shard_map``).
    alive: optional bool ``[n]`` (the same on every worker), the workers that are up
      (simulated failures): weights are renormalised over live neighbours,
      ``W'_ij = W_ij`` for live i != j, ``W'_ii = 1 - sum_{j live, j != i} W_ij`` (the weight of
      a failed neighbour goes to the worker itself); a failed worker keeps its model.
    difference: return ``x_i - sum_j W_ij x_j = sum_{j != i} W_ij (x_i - x_j)`` (for a
      stochastic W) computed from the differences, whose rounding error vanishes at
      consensus (:func:`nbsgd_jax.transforms.decentralized.d2` needs it in float32).

  Returns:
    The mixed model, same structure, shapes and dtypes as ``x`` (weights are cast to each
    leaf's dtype); with ``difference``, the Laplacian term above.

  Raises:
    ValueError: the matrix is not square, not finite, or its size differs from the axis size.
    TypeError: a leaf is not floating point.
  """
  if isinstance(mixing_matrix, GossipPlan):
    plan = mixing_matrix
    n = axis_size(axis_name)
    if plan.n != n:
      raise ValueError(f"gossip plan has n={plan.n} workers but axis {axis_name!r} has {n}")
  else:
    w = _as_matrix(mixing_matrix)
    n = _check_axis(w, axis_name)
    plan = gossip_plan(w)
  _check_leaves(x)
  i = lax.axis_index(axis_name)
  self_w = jnp.asarray(plan.self_weights)[i]
  rounds = []
  for perm, weights, sources in zip(plan.perms, plan.weights, plan.sources):
    ws = jnp.asarray(weights)[i]
    if alive is not None:
      up = alive[i] & alive[jnp.asarray(sources)[i]]
      kept = jnp.where(up, ws, jnp.zeros_like(ws))
      self_w = self_w + (ws - kept)
      ws = kept
    rounds.append((perm, ws))
  if difference:
    out = jax.tree_util.tree_map(jnp.zeros_like, x)
  else:
    out = jax.tree_util.tree_map(lambda leaf: _weighted(self_w, leaf), x)
  for perm, ws in rounds:
    recv = permute(x, axis_name, [(j, perm[j]) for j in range(n)])
    if difference:
      out = jax.tree_util.tree_map(lambda o, r, v, ws=ws: o + _weighted(ws, v - r), out, recv, x)
    else:
      out = jax.tree_util.tree_map(lambda o, r, ws=ws: o + _weighted(ws, r), out, recv)
  return out


def gossip_dense(x: PyTree, mixing_matrix: MatrixLike, axis_name: str = DEFAULT_AXIS) -> PyTree:
  """Reference gossip ``x_i <- sum_j W[i, j] x_j`` via ``lax.all_gather`` + einsum.

  Every worker gathers all ``n`` models (``n`` times the memory and traffic of
  :func:`gossip`): for tests and small ``n`` only.

  Args / Returns / Raises: as :func:`gossip`.
  """
  w = _as_matrix(mixing_matrix)
  _check_axis(w, axis_name)
  _check_leaves(x)
  i = lax.axis_index(axis_name)
  row = jnp.asarray(w)[i]  # [n]

  def mix(leaf: jax.Array) -> jax.Array:
    allx = all_gather(leaf, axis_name)  # [n, ...]
    return jnp.einsum("j,j...->...", row.astype(leaf.dtype), allx)

  return jax.tree_util.tree_map(mix, x)


# ---------------------------------------------------------------------------------------
# Sparse all-gather (sparsified SGD)
# ---------------------------------------------------------------------------------------


def scatter_last(idx: jax.Array, values: jax.Array, like: jax.Array) -> jax.Array:
  """Zeros shaped ``like`` with ``values`` written at ``idx`` along the last axis (``idx`` and
  ``values`` ``like.shape[:-1] + (k,)``, the indices of each row distinct)."""
  put = jax.vmap(lambda z, i, v: z.at[i].set(v))
  rows = put(jnp.zeros((int(np.prod(like.shape[:-1])), like.shape[-1]),
                       values.dtype),
             idx.reshape(-1, idx.shape[-1]), values.reshape(-1, values.shape[-1]))
  return rows.reshape(like.shape)


def densify(values: jax.Array, indices: jax.Array, d: int) -> jax.Array:
  """Scatter a sparse message back to a dense vector.

  Args:
    values: [m] values.
    indices: [m] int indices; entries outside [0, d) (e.g. padding d, or negative ones,
      which ``.at[]`` would otherwise wrap around) are dropped; duplicates accumulate.
    d: length of the dense vector.
  Returns:
    [d] vector of values.dtype.
  """
  indices = jnp.asarray(indices).astype(jnp.int32)
  indices = jnp.where(indices < 0, d, indices)
  return jnp.zeros((d,), values.dtype).at[indices].add(values, mode="drop")


def sparse_all_gather(values: jax.Array, indices: jax.Array, d: int,
                      axis_name: str = DEFAULT_AXIS) -> jax.Array:
  """Sum of every worker's sparse message, densified: all-gather then scatter-add.

  The communication step of Top-k / Gaussian-k sparsified SGD (S. Shi et al.,
  "Understanding Top-k Sparsification in Distributed Deep Learning", 2019; code
  hclhkbu/GaussianK-SGD): each worker all-gathers the ``(values, indices)`` pairs of all
  ``n`` workers (``lax.all_gather``) and scatter-adds them into ``zeros(d)``. Duplicate
  indices (within a message or across workers) accumulate; the padding index ``d`` (and
  any index ``>= d``) is dropped (``mode="drop"``). The SUM is returned; divide by ``n``
  for the average.

  Bytes: each worker receives ``(n - 1) * cap * (value_bytes + index_bytes)`` (e.g.
  ``(n - 1) * cap * 8`` for float32 values and int32 indices), the same it would send in
  a ring all-gather.

  Args:
    values: ``[cap]`` this worker's message values (floating point).
    indices: ``[cap]`` integer positions in ``[0, d]`` (``d`` = padding); cast to int32.
    d: the dense length, a static Python int ``>= 0``.
    axis_name: the named worker axis (bound by ``vmap`` or ``shard_map``).

  Returns:
    ``[d]`` dense sum over workers, dtype of ``values``.

  Raises:
    ValueError: ``values`` / ``indices`` not 1-D of equal length, or ``d < 0``.
    NameError: ``axis_name`` is not bound (raised by JAX).
  """
  values = jnp.asarray(values)
  indices = jnp.asarray(indices)
  if values.ndim != 1 or indices.shape != values.shape:
    raise ValueError(f"values {values.shape} and indices {indices.shape} must be 1-D arrays "
                     "of the same length [cap]")
  if isinstance(d, bool) or int(d) != d or d < 0:
    raise ValueError(f"d={d!r} is not allowed: it must be an integer >= 0")
  if values.shape[0] >= d:  # a message as long as the vector: the same sum, O(d) memory
    return lax.psum(densify(values, indices.astype(jnp.int32), int(d)), axis_name)
  all_values = all_gather(values, axis_name).reshape(-1)  # [n * cap]
  all_indices = all_gather(indices.astype(jnp.int32), axis_name).reshape(-1)
  return densify(all_values, all_indices, int(d))
