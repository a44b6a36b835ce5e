"""Communication graphs and their mixing matrices.

A :class:`Topology` is an undirected graph on ``n`` workers plus a symmetric, doubly
stochastic mixing matrix ``W`` (numpy ``[n, n]``) used by gossip averaging
(D-PSGD, Lian et al., NeurIPS 2017, Eq. (2): ``x_i <- sum_j W_ij x_j``).

Weights:

* ``"metropolis_hastings"`` (default): ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges,
  ``W_ii = 1 - sum_{j != i} W_ij`` (Xiao & Boyd 2004, Eq. (13)).
* ``"uniform"``: ``W_ij = 1 / (max_degree + 1)`` on edges, rest on the diagonal.

The spectral quantities follow Boyd et al. (2004): SLEM ``rho = ||W - J||_2`` with
``J = 11^T / n``, spectral gap ``1 - rho``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

WEIGHTS = ("metropolis_hastings", "uniform")


@dataclasses.dataclass(frozen=True)
class Topology:
  """An undirected communication graph with its mixing matrix.

  Attributes:
    name: a short name, e.g. ``"ring"``.
    n: number of workers.
    edges: tuple of ``(i, j)`` pairs with ``0 <= i < j < n``, sorted, no duplicates.
    mixing_matrix: numpy float64 ``[n, n]``, symmetric and doubly stochastic.
  """

  name: str
  n: int
  edges: tuple[tuple[int, int], ...]
  mixing_matrix: np.ndarray

  @property
  def degrees(self) -> np.ndarray:
    """Degree of every worker, int ``[n]``."""
    deg = np.zeros(self.n, dtype=np.int64)
    for i, j in self.edges:
      deg[i] += 1
      deg[j] += 1
    return deg

  @property
  def mean_degree(self) -> float:
    """Mean number of neighbours per worker (messages a worker sends per gossip)."""
    return 2.0 * len(self.edges) / self.n


def _check_n(n, name="n") -> int:
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise ValueError(f"{name}={n!r} is not allowed: it must be an integer >= 1")
  return int(n)


def _normalise_edges(n: int, edges: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
  out = set()
  for e in edges:
    if len(e) != 2:
      raise ValueError(f"edge {tuple(e)!r} is not allowed: an edge is a pair (i, j)")
    i, j = int(e[0]), int(e[1])
    if not (0 <= i < n and 0 <= j < n):
      raise ValueError(f"edge {(i, j)!r} is out of range: endpoints must lie in [0, {n - 1}]")
    if i == j:
      raise ValueError(f"edge {(i, j)!r} is a self loop: self weights live on the diagonal of W")
    out.add((min(i, j), max(i, j)))
  return tuple(sorted(out))


def mixing_matrix(n: int, edges: Sequence[tuple[int, int]],
                  weights: str = "metropolis_hastings") -> np.ndarray:
  """Symmetric doubly stochastic mixing matrix of a graph.

  Args:
    n: number of workers.
    edges: undirected edges ``(i, j)``.
    weights: ``"metropolis_hastings"`` or ``"uniform"`` (see module docstring).

  Returns:
    numpy float64 ``[n, n]``.

  Raises:
    ValueError: unknown ``weights`` or bad edges.
  """
  n = _check_n(n)
  edges = _normalise_edges(n, edges)
  deg = np.zeros(n, dtype=np.int64)
  for i, j in edges:
    deg[i] += 1
    deg[j] += 1
  w = np.zeros((n, n))
  if weights == "metropolis_hastings":
    for i, j in edges:
      w[i, j] = w[j, i] = 1.0 / (1.0 + max(deg[i], deg[j]))
  elif weights == "uniform":
    c = 1.0 / (deg.max(initial=0) + 1.0)
    for i, j in edges:
      w[i, j] = w[j, i] = c
  else:
    raise ValueError(f"weights={weights!r} is not allowed: use one of {WEIGHTS}")
  w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
  return w


def from_edges(n: int, edges: Sequence[tuple[int, int]], weights: str = "metropolis_hastings",
               name: str = "custom") -> Topology:
  """A :class:`Topology` from an explicit edge list (duplicates and order ignored).

  Raises:
    ValueError: ``n < 1``, an edge out of range, a self loop, or unknown ``weights``.
  """
  n = _check_n(n)
  e = _normalise_edges(n, edges)
  return Topology(name=name, n=n, edges=e, mixing_matrix=mixing_matrix(n, e, weights))


def ring(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Ring ``0 - 1 - ... - (n-1) - 0``. ``n = 1``: no edge; ``n = 2``: one edge.

  With Metropolis-Hastings weights and ``n >= 3`` every worker keeps 1/3 and takes 1/3 from
  each neighbour.
  """
  n = _check_n(n)
  return from_edges(n, [(i, (i + 1) % n) for i in range(n) if n > 1], weights, name="ring")


def complete(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Fully connected graph; its mixing matrix is ``J = 11^T / n`` (exact averaging)."""
  n = _check_n(n)
  return from_edges(n, [(i, j) for i in range(n) for j in range(i + 1, n)], weights,
                    name="complete")


TOPOLOGIES = {"ring": ring, "complete": complete}


def make(name: str, n: int, weights: str = "metropolis_hastings") -> Topology:
  """Build a topology by name (``config.topology``).

  Raises:
    ValueError: unknown name (the message lists the allowed ones).
  """
  if name not in TOPOLOGIES:
    raise ValueError(f"topology={name!r} is not allowed: use one of {sorted(TOPOLOGIES)}")
  return TOPOLOGIES[name](n, weights=weights)


def slem(w: np.ndarray) -> float:
  """Second largest eigenvalue modulus ``||W - J||_2`` of a mixing matrix ``[n, n]``."""
  w = np.asarray(w, dtype=np.float64)
  n = w.shape[0]
  return float(np.linalg.norm(w - np.full((n, n), 1.0 / n), ord=2))


def spectral_gap(w: np.ndarray) -> float:
  """``1 - slem(W)``: 0 for a disconnected graph, 1 for exact averaging."""
  return 1.0 - slem(w)
