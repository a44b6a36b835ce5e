"""The :class:`Topology` type and the maths of a graph's mixing matrix.

A :class:`Topology` is an undirected graph on ``n`` workers plus a doubly stochastic mixing
matrix ``W`` (numpy ``[n, n]``) used by gossip averaging (D-PSGD, Lian et al., NeurIPS 2017,
Eq. (2): ``x_i <- sum_j W_ij x_j``; row ``i`` is the receiver). Static topologies have one
symmetric ``W``; time-varying ones (:func:`nbsgd_jax.topology.graphs.one_peer_exponential`)
have ``period`` phase matrices ``W_t`` (:meth:`Topology.mixing_matrix_at`), each doubly
stochastic but not necessarily symmetric.

Here: the edge checks, :func:`is_connected`, :func:`laplacian`, :func:`mixing_matrix`,
:func:`metropolis_hastings`, :func:`from_edges` (a :class:`Topology` from an edge list),
:func:`slem` and :func:`spectral_gap`. The named graphs are in
:mod:`nbsgd_jax.topology.graphs`; :func:`nbsgd_jax.topology.make` builds them by name.

Weights (``WEIGHTS``), for static graphs:

* ``"metropolis_hastings"`` (default): ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges,
  ``W_ii = 1 - sum_{j != i} W_ij`` (Xiao & Boyd 2004, Eq. (13)).
* ``"uniform"``: ``W_ij = 1 / (max_degree + 1)`` on edges, rest on the diagonal.
* ``"best_constant"``: ``W = I - alpha L`` with ``alpha = 2 / (lambda_2(L) + lambda_n(L))``,
  ``L`` the graph Laplacian, ``lambda_2`` its second smallest and ``lambda_n`` its largest
  eigenvalue (Xiao & Boyd 2004, "Fast linear iterations for distributed averaging",
  Sec. 4.1): the SLEM-optimal ``W`` among those with one constant weight on every edge.
  Its diagonal may be negative (allowed: ``W`` stays symmetric with rows summing to 1).

The spectral quantities follow Boyd et al. (2004): SLEM ``rho = ||W - J||_2`` with
``J = 11^T / n``, spectral gap ``1 - rho``.

Degenerate inputs (defined results):

* ``n = 1``: no edges, ``W = [[1]]`` for every graph and weights (SLEM 0).
* ``n = 2``: every connected graph is the single edge ``(0, 1)``; MH, uniform and best
  constant weights all give ``W = J``.
* duplicate edges and ``(j, i)`` for ``(i, j)`` are merged (:func:`from_edges`).
* disconnected edge lists are allowed (:func:`from_edges`): ``W`` is block diagonal up to
  permutation, SLEM 1 and spectral gap 0. ``"best_constant"`` then uses the smallest
  *nonzero* Laplacian eigenvalue in place of ``lambda_2 = 0`` (the same optimality, within
  every component); a graph without edges gets ``W = I``.

Errors (``ValueError``): ``n < 1`` or not an integer, an edge that is not a pair of
integers, out of range or a self loop, unknown ``weights``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Sequence

import numpy as np

WEIGHTS = MIXING_WEIGHTS = ("metropolis_hastings", "uniform", "best_constant")


@dataclasses.dataclass(frozen=True)
class Topology:
  """A communication graph with its mixing matrix (static or periodic in time).

  Attributes:
    name: a short name, e.g. ``"ring"``.
    n: number of workers.
    edges: tuple of ``(i, j)`` pairs with ``0 <= i < j < n``, sorted, no duplicates. For a
      time-varying topology: the union over all phases.
    mixing_matrix: numpy float64 ``[n, n]``, doubly stochastic. Symmetric for static
      topologies. For a time-varying topology: the MEAN ``(1/period) sum_t W_t`` of the
      phase matrices (doubly stochastic, in general not symmetric); a step-by-step
      simulation must use :meth:`mixing_matrix_at` instead.
    period: number of phases; 1 for a static topology.
    phases: ``()`` for a static topology, else ``period`` numpy float64 ``[n, n]`` doubly
      stochastic matrices; step ``t`` uses ``phases[t % period]``.
  """

  name: str
  n: int
  edges: tuple[tuple[int, int], ...]
  mixing_matrix: np.ndarray
  period: int = 1
  phases: tuple[np.ndarray, ...] = ()

  def __post_init__(self):
    if isinstance(self.period, bool) or not isinstance(self.period, numbers.Integral) or (
        self.period < 1):
      raise ValueError(f"period={self.period!r} is not allowed: it must be an integer >= 1")
    if self.phases and len(self.phases) != self.period:
      raise ValueError(f"period={self.period!r} is not allowed: it must equal the number of "
                       f"phases ({len(self.phases)})")
    if not self.phases and self.period != 1:
      raise ValueError(f"period={self.period!r} is not allowed: a topology without phases is "
                       "static (period 1)")
    for k, w in enumerate(self.phases):
      if np.shape(w) != (self.n, self.n):
        raise ValueError(f"phases[{k}] has shape {np.shape(w)}: expected ({self.n}, {self.n})")

  @property
  def degrees(self) -> np.ndarray:
    """Degree of every worker, int ``[n]`` (union graph for a time-varying topology)."""
    deg = np.zeros(self.n, dtype=np.int64)
    for i, j in self.edges:
      deg[i] += 1
      deg[j] += 1
    return deg

  @property
  def mean_degree(self) -> float:
    """Mean number of neighbours per worker (messages a worker sends per gossip).

    For a time-varying topology this is the degree of the union graph, not the number of
    messages per step (1 for :func:`one_peer_exponential`).
    """
    return 2.0 * len(self.edges) / self.n

  @property
  def is_time_varying(self) -> bool:
    """True when the mixing matrix changes with the step (``period > 1``)."""
    return self.period > 1

  def mixing_matrix_at(self, t: int) -> np.ndarray:
    """Mixing matrix of step ``t``, numpy float64 ``[n, n]``.

    Static topologies return :attr:`mixing_matrix` for every ``t``; time-varying ones
    return ``phases[t % period]``.

    Raises:
      ValueError: ``t`` is not an integer >= 0.
    """
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
      raise ValueError(f"t={t!r} is not allowed: it must be an integer step >= 0")
    if not self.phases:
      return self.mixing_matrix
    return self.phases[int(t) % self.period]


def _check_n(n, name="n") -> int:
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise ValueError(f"{name}={n!r} is not allowed: it must be an integer >= 1")
  return int(n)


def _as_index(v, e) -> int:
  if (isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real)
      or not math.isfinite(v) or v != int(v)):
    raise ValueError(f"edge {tuple(e)!r} is not allowed: endpoints must be integers")
  return int(v)


def _normalise_edges(n: int, edges: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
  out = set()
  for e in edges:
    try:
      ok = len(e) == 2
    except TypeError:
      ok = False
    if not ok:
      raise ValueError(f"edge {e!r} is not allowed: an edge is a pair (i, j)")
    i, j = _as_index(e[0], e), _as_index(e[1], e)
    if not (0 <= i < n and 0 <= j < n):
      raise ValueError(f"edge {(i, j)!r} is out of range: endpoints must lie in [0, {n - 1}]")
    if i == j:
      raise ValueError(f"edge {(i, j)!r} is a self loop: self weights live on the diagonal of W")
    out.add((min(i, j), max(i, j)))
  return tuple(sorted(out))


def _num_components(n: int, edges: Sequence[tuple[int, int]]) -> int:
  """Number of connected components (union-find)."""
  parent = list(range(n))

  def root(i):
    while parent[i] != i:
      parent[i] = parent[parent[i]]
      i = parent[i]
    return i

  comps = n
  for i, j in edges:
    ri, rj = root(i), root(j)
    if ri != rj:
      parent[ri] = rj
      comps -= 1
  return comps


def is_connected(n: int, edges: Sequence[tuple[int, int]]) -> bool:
  """Whether the undirected graph on ``n`` nodes is connected (``n = 1``: True).

  Raises:
    ValueError: bad ``n`` or edges (as :func:`from_edges`).
  """
  n = _check_n(n)
  return _num_components(n, _normalise_edges(n, edges)) == 1


def laplacian(n: int, edges: Sequence[tuple[int, int]]) -> np.ndarray:
  """Graph Laplacian ``L = D - A``, numpy float64 ``[n, n]`` (rows sum to 0, PSD).

  Raises:
    ValueError: bad ``n`` or edges (as :func:`from_edges`).
  """
  n = _check_n(n)
  lap = np.zeros((n, n))
  for i, j in _normalise_edges(n, edges):
    lap[i, j] = lap[j, i] = -1.0
    lap[i, i] += 1.0
    lap[j, j] += 1.0
  return lap


def _best_constant_alpha(n: int, edges: tuple[tuple[int, int], ...]) -> float:
  """``2 / (lambda_2 + lambda_n)`` of the Laplacian (Xiao & Boyd 2004, Sec. 4.1).

  ``lambda_2`` is taken as the smallest nonzero eigenvalue, which is the second smallest
  for a connected graph. Requires at least one edge.
  """
  lam = np.linalg.eigvalsh(laplacian(n, edges))  # ascending
  comps = _num_components(n, edges)  # multiplicity of eigenvalue 0
  return 2.0 / (lam[comps] + lam[-1])


def mixing_matrix(n: int, edges: Sequence[tuple[int, int]],
                  weights: str = "metropolis_hastings") -> np.ndarray:
  """Symmetric doubly stochastic mixing matrix of a graph.

  Args:
    n: number of workers.
    edges: undirected edges ``(i, j)``.
    weights: one of ``WEIGHTS`` (see module docstring).

  Returns:
    numpy float64 ``[n, n]``; entries are >= 0 except possibly the diagonal of
    ``"best_constant"``.

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
  elif weights == "best_constant":
    if edges:
      c = _best_constant_alpha(n, edges)
      for i, j in edges:
        w[i, j] = w[j, i] = c
  else:
    raise ValueError(f"weights={weights!r} is not allowed: use one of {WEIGHTS}")
  w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
  return w


def metropolis_hastings(n: int, edges: Sequence[tuple[int, int]]) -> np.ndarray:
  """``mixing_matrix(n, edges, "metropolis_hastings")``, numpy float64 ``[n, n]``.

  ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges, ``W_ii = 1 - sum_{j != i} W_ij``
  (Xiao & Boyd 2004, Eq. (13)).

  Raises:
    ValueError: bad ``n`` or edges.
  """
  return mixing_matrix(n, edges, "metropolis_hastings")


def from_edges(n: int, edges: Sequence[tuple[int, int]], weights: str = "metropolis_hastings",
               name: str = "custom") -> Topology:
  """A :class:`Topology` from an explicit edge list (duplicates and order ignored).

  A disconnected edge list is allowed (spectral gap 0, see the module docstring).

  Raises:
    ValueError: ``n < 1``, an edge out of range, a self loop, or unknown ``weights``.
  """
  n = _check_n(n)
  e = _normalise_edges(n, edges)
  return Topology(name=name, n=n, edges=e, mixing_matrix=mixing_matrix(n, e, weights))


def slem(w: np.ndarray) -> float:
  """Second largest eigenvalue modulus ``||W - J||_2`` of a mixing matrix ``[n, n]``.

  For a non-symmetric doubly stochastic ``W`` (a one-peer phase) this is the largest singular
  value of ``W - J``, the per-step contraction of the disagreement ``x - mean(x)``.
  """
  w = np.asarray(w, dtype=np.float64)
  n = w.shape[0]
  return float(np.linalg.norm(w - np.full((n, n), 1.0 / n), ord=2))


def spectral_gap(w: np.ndarray) -> float:
  """``1 - slem(W)``: 0 for a disconnected graph, 1 for exact averaging."""
  return 1.0 - slem(w)
