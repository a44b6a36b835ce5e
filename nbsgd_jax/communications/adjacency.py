"""Who waits for whom in one round of a communication (host side, numpy).

A communication's :class:`~nbsgd_jax.communications.base.Pattern` names, for every worker
``i``, the neighbourhood ``N(i)`` whose messages it waits for (``i`` always in it). Three
forms, chosen for the cost of a step's host work at n workers: :class:`Neighbours` (index
lists ``[n, d]``, O(n d)), :class:`Group` (an all-reduce among some workers, O(n)) and a bool
``[n, n]`` matrix (O(n^2)); None is everyone. The simulated clock
(:func:`nbsgd_jax.host.cluster.advance_clocks`) and Non-blocking SGD's neighbourhood deadlines
read them.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence, Union

import numpy as np

from nbsgd_jax.core import checks


class Neighbours(NamedTuple):
  """Whom each worker waits for, as index lists: O(n d) memory and work for a graph of degree
  d (a dense ``[n, n]`` adjacency costs O(n^2) per round).

  Attributes:
    index: int ``[n, d]``, row ``i``: the workers ``i`` waits for; ``i`` itself is always in
      its neighbourhood (whether listed or not); repeats are allowed (pad a short row with
      ``i``).
  """

  index: np.ndarray

  @classmethod
  def of_lists(cls, rows: Sequence[Sequence[int]]) -> "Neighbours":
    """From one list per worker (of any lengths; padded with the worker itself)."""
    n = len(rows)
    d = max([len(r) for r in rows] + [0]) + 1
    index = np.repeat(np.arange(n)[:, None], d, axis=1)
    for i, r in enumerate(rows):
      index[i, 1:1 + len(r)] = r
    return cls(index)

  def dense(self) -> np.ndarray:
    """bool ``[n, n]``, the same neighbourhoods as an adjacency matrix (diagonal True)."""
    n = self.index.shape[0]
    a = np.eye(n, dtype=bool)
    a[np.repeat(np.arange(n), self.index.shape[1]), self.index.reshape(-1)] = True
    return a


class Group(NamedTuple):
  """Everyone waits for everyone in ``members`` (bool ``[n]``; an all-reduce among the live
  workers); a worker outside waits only for itself. O(n)."""

  members: np.ndarray

  def dense(self) -> np.ndarray:
    """bool ``[n, n]``, the same neighbourhoods as an adjacency matrix (diagonal True)."""
    m = np.asarray(self.members, bool)
    a = m[:, None] & m[None, :]
    np.fill_diagonal(a, True)
    return a


Adjacency = Union[None, np.ndarray, Neighbours, Group]
"""Who waits for whom in a round (``N(i)``, always holding ``i``): None (everyone), a bool
``[n, n]`` matrix (row i), :class:`Neighbours` (index lists) or :class:`Group`."""


def check_adjacency(field: str, adj, n: int):
  """``adj`` validated: a :class:`Neighbours` with int64 indices in ``[0, n)``, a
  :class:`Group` with a bool ``[n]``, or a bool ``[n, n]`` matrix with a True diagonal."""
  if isinstance(adj, Neighbours):
    idx = np.asarray(adj.index)
    if idx.ndim != 2 or idx.shape[0] != n or not np.issubdtype(idx.dtype, np.integer):
      raise checks.not_allowed(field, idx.shape, f"Neighbours.index must be an integer [n, d] array with n={n}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
      raise checks.not_allowed(field, "Neighbours", f"every index must be in [0, {n})")
    return Neighbours(idx.astype(np.int64))
  if isinstance(adj, Group):
    m = np.asarray(adj.members)
    if m.shape != (n,):
      raise checks.not_allowed(field, m.shape, f"Group.members must be a boolean [n] array with n={n}")
    return Group(m.astype(bool))
  a = np.asarray(adj)
  if a.shape != (n, n):
    raise checks.not_allowed(field, a.shape, f"it must be a boolean [n, n] matrix with n={n}")
  return a.astype(bool) | np.eye(n, dtype=bool)


def neighbourhood_max(values: np.ndarray, adjacency: Adjacency) -> np.ndarray:
  """float64 ``[n]``: ``max_{j in N(i)} values_j`` for every worker ``i`` (``N(i)`` from a
  validated adjacency, :data:`Adjacency`); O(n) for None and :class:`Group`, O(n d) for
  :class:`Neighbours`, O(n^2) for a dense matrix."""
  v = np.asarray(values, np.float64)
  if adjacency is None:
    return np.full(v.shape, v.max())
  if isinstance(adjacency, Group):
    m = adjacency.members
    top = v[m].max() if m.any() else -np.inf
    return np.where(m, np.maximum(top, v), v)
  if isinstance(adjacency, Neighbours):
    return np.maximum(v[adjacency.index].max(axis=1, initial=-np.inf), v)
  return np.where(adjacency, v[None, :], -np.inf).max(axis=1)


def live_adjacency(adjacency: Adjacency, alive: np.ndarray) -> Adjacency:
  """``adjacency`` under failures: a failed worker waits only for itself and nobody waits for
  it (bool ``alive`` ``[n]``). None becomes a :class:`Group` of the live workers; the other
  forms keep theirs (a dense matrix stays dense)."""
  alive = np.asarray(alive, bool)
  n = alive.shape[0]
  if adjacency is None:
    return Group(alive.copy())
  if isinstance(adjacency, Group):
    return Group(np.asarray(adjacency.members, bool) & alive)
  if isinstance(adjacency, Neighbours):
    idx = np.asarray(adjacency.index)
    own = np.arange(n)[:, None]
    return Neighbours(np.where(alive[idx] & alive[:, None], idx, own))
  a = np.asarray(adjacency, bool) & alive[:, None] & alive[None, :]
  np.fill_diagonal(a, True)
  return a
