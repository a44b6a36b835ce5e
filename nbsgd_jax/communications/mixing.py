"""Gossip planned on the host: a mixing matrix ``W`` as ``ppermute`` rounds, and its bytes.

The host half of :func:`nbsgd_jax.communications.collectives.gossip` (numpy only, no named
axis): :func:`gossip_shifts` (the ring shifts ``W`` needs), :func:`gossip_rounds` (``W``
decomposed into full-permutation rounds: ring shifts for circulant graphs, matchings of the
graph of ``W`` otherwise), :class:`GossipPlan` / :func:`gossip_plan` (those rounds as host
constants of O(n) per round) and :func:`gossip_bytes` (a worker's bytes per gossip). Every
name is importable from :mod:`nbsgd_jax.communications.collectives` too.

Sources:

* Gossip averaging: X. Lian et al., "Can decentralized algorithms outperform centralized
  algorithms? A case study for decentralized parallel stochastic gradient descent",
  NeurIPS 2017 (D-PSGD), Eq. (2): ``x_i <- sum_j W_ij x_j``.
* Matchings: the Misra-Gries edge colouring of :mod:`nbsgd_jax.topology.matchings` (Misra &
  Gries, "A constructive proof of Vizing's theorem", IPL 1992), at most max degree + 1 rounds.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Union

import jax
import numpy as np

from nbsgd_jax.topology.matchings import matching_decomposition, matching_permutation

MatrixLike = Union[np.ndarray, Any]  # a numpy [n, n] array or an object with ``.mixing_matrix``


def _as_matrix(topology_or_matrix: MatrixLike) -> np.ndarray:
  """The numpy float64 ``[n, n]`` mixing matrix of a Topology or an array; validated."""
  w = getattr(topology_or_matrix, "mixing_matrix", topology_or_matrix)
  if isinstance(w, jax.core.Tracer):
    raise ValueError("the mixing matrix must be a host constant (numpy), not a traced value")
  w = np.asarray(w, dtype=np.float64)
  if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
    raise ValueError(f"mixing matrix has shape {w.shape}: it must be a square [n, n] matrix, "
                     "n >= 1")
  if not np.all(np.isfinite(w)):
    raise ValueError("mixing matrix has non-finite entries")
  return w


def _shift_weights(w: np.ndarray, s: int) -> np.ndarray:
  """``[n]``: weight worker i gives to worker (i - s) mod n, i.e. ``W[i, (i - s) mod n]``."""
  n = w.shape[0]
  idx = np.arange(n)
  return w[idx, (idx - s) % n]


def _off_diagonal(w: np.ndarray) -> np.ndarray:
  """bool ``[n, n]``: ``W_ij != 0`` for ``j != i``."""
  off = w != 0.0
  np.fill_diagonal(off, False)
  return off


def gossip_shifts(mixing_matrix: MatrixLike) -> list[int]:
  """Ring shifts ``s`` in ``1..n-1`` that :func:`gossip` executes (one ``ppermute`` each).

  Shift ``s`` means worker ``i`` receives from ``(i - s) mod n``; a shift is kept when some
  worker gives that sender a nonzero weight. Example: ``ring(8)`` gives ``[1, 7]``,
  ``complete(n)`` gives ``[1, ..., n - 1]``, ``n = 1`` gives ``[]``.

  Args:
    mixing_matrix: numpy ``[n, n]`` (or a ``Topology``).

  Raises:
    ValueError: not a finite square matrix.
  """
  w = _as_matrix(mixing_matrix)
  rows, cols = np.nonzero(_off_diagonal(w))
  return sorted(int(s) for s in np.unique((rows - cols) % w.shape[0]))


class GossipPlan(NamedTuple):
  """W as the ``ppermute`` rounds of :func:`gossip`: host constants of O(n) per round (a worker
  reads its entries at its axis index; no ``[n, n]`` array reaches the device).

  Attributes:
    self_weights: float64 ``[n]``, ``W_ii``.
    perms: R tuples, ``perms[r][j]``: the worker j sends to in round r (a full permutation).
    weights: float64 ``[R, n]``, the weight worker i gives to what it receives in round r.
    sources: int32 ``[R, n]``, the worker i receives from in round r.
  """

  self_weights: np.ndarray
  perms: tuple
  weights: np.ndarray
  sources: np.ndarray

  @property
  def n(self) -> int:
    return len(self.self_weights)


def gossip_rounds(mixing_matrix: MatrixLike) -> list[tuple[list[int], np.ndarray]]:
  """The ``ppermute`` rounds :func:`gossip` executes for ``W``: ``[(perm, weights), ...]``.

  ``perm[i]`` is the worker that worker ``i`` sends to (a full permutation) and
  ``weights[i]`` the weight worker ``i`` gives to what it receives. Two decompositions are
  built and the one with fewer rounds is used:

  * ring shifts (:func:`gossip_shifts`): ideal for circulant graphs (ring: 2 rounds);
  * matchings of the graph of ``W``'s nonzero off-diagonal entries (Misra-Gries edge
    colouring, at most max degree + 1 rounds; each matching is an involution, unmatched
    workers send to themselves with weight 0). Only for a symmetric support, and only tried
    when the shifts are more than the max degree (no edge colouring has fewer colours).

  Each nonzero off-diagonal ``W_ij`` is in exactly one round (``weights[i] = W_ij`` where i
  receives from j), so ``#{r : weights_r[i] != 0}`` is worker i's degree.

  Args:
    mixing_matrix: numpy ``[n, n]`` (or a ``Topology``).

  Raises:
    ValueError: not a finite square matrix.
  """
  w = _as_matrix(mixing_matrix)
  n = w.shape[0]
  shifts = [([(j + s) % n for j in range(n)], _shift_weights(w, s)) for s in gossip_shifts(w)]
  off = _off_diagonal(w)
  if not np.array_equal(off, off.T) or len(shifts) <= int(off.sum(axis=1).max(initial=0)):
    return shifts
  rows, cols = np.nonzero(np.triu(off, 1))
  matchings = matching_decomposition(n, list(zip(rows.tolist(), cols.tolist())))
  if len(matchings) >= len(shifts):
    return shifts
  rounds = []
  for m in matchings:
    perm = matching_permutation(n, m)
    idx = np.arange(n)
    weights = np.where(np.asarray(perm) != idx, w[idx, perm], 0.0)
    rounds.append((list(perm), weights))
  return rounds


def gossip_plan(mixing_matrix: MatrixLike) -> GossipPlan:
  """The :class:`GossipPlan` of ``W`` (:func:`gossip_rounds`), built once on the host.

  Raises:
    ValueError: not a finite square matrix.
  """
  w = _as_matrix(mixing_matrix)
  n = w.shape[0]
  rounds = gossip_rounds(w)
  perms = tuple(tuple(int(d) for d in perm) for perm, _ in rounds)
  sources = np.zeros((len(rounds), n), np.int32)
  for r, perm in enumerate(perms):
    sources[r, np.asarray(perm)] = np.arange(n)  # worker perm[j] receives from j
  weights = np.stack([np.asarray(ws, np.float64) for _, ws in rounds]) if rounds else \
      np.zeros((0, n))
  return GossipPlan(np.diag(w).copy(), perms, weights, sources)


def gossip_bytes(num_bytes: float, topology_or_matrix: MatrixLike) -> float:
  """Mean bytes a worker sends per gossip round: ``mean_degree * num_bytes``.

  The degree of worker ``i`` counts neighbours ``j != i`` with ``W[i, j] != 0`` (one model
  message each), as in a point-to-point implementation (D-PSGD, Lian et al. 2017). Note:
  the ppermute execution of :func:`gossip` moves ``len(gossip_shifts(W)) * num_bytes`` per
  worker, which is the same for regular circulant graphs (ring, complete) and can be more
  for irregular ones.

  Args:
    num_bytes: size of one model message in bytes.
    topology_or_matrix: a ``Topology`` or a numpy ``[n, n]`` mixing matrix.

  Returns:
    bytes per worker per gossip round (float).

  Raises:
    ValueError: bad matrix or ``num_bytes < 0``.
  """
  if num_bytes < 0:
    raise ValueError(f"num_bytes={num_bytes!r} is not allowed: it must be >= 0")
  w = _as_matrix(topology_or_matrix)
  return float(_off_diagonal(w).sum()) / w.shape[0] * float(num_bytes)
