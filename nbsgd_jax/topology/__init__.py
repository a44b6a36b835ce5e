"""Communication graphs and their mixing matrices.

A :class:`Topology` is an undirected graph on ``n`` workers plus a doubly stochastic mixing
matrix ``W`` (numpy ``[n, n]``) used by gossip averaging (D-PSGD, Lian et al., NeurIPS 2017,
Eq. (2): ``x_i <- sum_j W_ij x_j``; row ``i`` is the receiver). Static topologies have one
symmetric ``W``; time-varying ones (:func:`one_peer_exponential`) have ``period`` phase
matrices ``W_t`` (:meth:`Topology.mixing_matrix_at`), each doubly stochastic but not
necessarily symmetric.

Graphs: :func:`ring`, :func:`torus`, :func:`exponential`, :func:`complete`, :func:`star`,
:func:`erdos_renyi`, :func:`one_peer_exponential`, :func:`from_edges`; :func:`make` builds
any of them by name (``config.topology``).

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
integers, out of range or a self loop, unknown ``weights`` or topology name, ``torus`` shape
not matching ``n``, ``erdos_renyi`` ``p`` outside ``(0, 1]`` or no connected sample found.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Optional, Sequence

import numpy as np

from nbsgd_jax.core import checks

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


def ring(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Ring ``0 - 1 - ... - (n-1) - 0``. ``n = 1``: no edge; ``n = 2``: one edge.

  With Metropolis-Hastings weights and ``n >= 3`` every worker keeps 1/3 and takes 1/3 from
  each neighbour.
  """
  n = _check_n(n)
  return from_edges(n, [(i, (i + 1) % n) for i in range(n) if n > 1], weights, name="ring")


def torus(rows: int, cols: int, weights: str = "metropolis_hastings") -> Topology:
  """2-D wrap-around grid, ``n = rows * cols``; worker ``r * cols + c`` sits at ``(r, c)``.

  Worker ``(r, c)`` is linked to ``(r, c +- 1 mod cols)`` and ``(r +- 1 mod rows, c)``: degree
  4 when ``rows, cols >= 3``. A side of length 2 gives one link along it (not two), a side
  of length 1 none, so ``torus(1, n)`` is ``ring(n)`` and ``torus(2, 2)`` a 4-cycle.

  Raises:
    ValueError: ``rows`` or ``cols`` not an integer >= 1, unknown ``weights``.
  """
  rows, cols = _check_n(rows, "rows"), _check_n(cols, "cols")
  edges = []
  for r in range(rows):
    for c in range(cols):
      i = r * cols + c
      if cols > 1:
        edges.append((i, r * cols + (c + 1) % cols))
      if rows > 1:
        edges.append((i, ((r + 1) % rows) * cols + c))
  return from_edges(rows * cols, edges, weights, name="torus")


def torus_shape(n: int) -> tuple[int, int]:
  """Most square factorisation ``rows * cols = n`` with ``rows <= cols``.

  E.g. 16 -> (4, 4), 8 -> (2, 4), 12 -> (3, 4); a prime ``n`` gives ``(1, n)``, i.e. a ring.

  Raises:
    ValueError: ``n`` not an integer >= 1.
  """
  n = _check_n(n)
  rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
  return rows, n // rows


def exponential(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Static exponential graph: ``i`` linked to ``i +- 2^k mod n`` for every ``2^k < n``.

  The directed graph of Ying et al. (2021), "Exponential Graph is Provably Efficient for
  Decentralized Deep Training", Sec. 2 (also Assran et al. 2019, SGP), symmetrised so that
  ``W`` is symmetric; duplicate links (e.g. ``+2^k = -2^k`` when ``2^(k+1) = n``) are merged.
  Degree ``2 * ceil(log2 n) - 1`` for ``n`` a power of 2, e.g. ``exponential(8)``: worker 0
  is linked to ``{1, 2, 4, 6, 7}``. ``n = 1``: no edge; ``n = 2``: one edge.

  Raises:
    ValueError: ``n`` not an integer >= 1, unknown ``weights``.
  """
  n = _check_n(n)
  edges = []
  s = 1
  while s < n:
    edges.extend((i, (i + s) % n) for i in range(n))
    s *= 2
  return from_edges(n, edges, weights, name="exponential")


def complete(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Fully connected graph; its mixing matrix is ``J = 11^T / n`` (exact averaging)."""
  n = _check_n(n)
  return from_edges(n, [(i, j) for i in range(n) for j in range(i + 1, n)], weights,
                    name="complete")


def star(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Star: worker 0 is linked to every other worker (``n - 1`` edges).

  The Laplacian has eigenvalues ``0, 1 (n - 2 times), n``. MH and uniform weights both give
  ``W = I - L / n`` with SLEM ``1 - 1/n`` (``n >= 3``); best constant
  ``W = I - 2 L / (n + 1)`` with SLEM ``(n - 1) / (n + 1)``. ``n = 1``: no edge; ``n = 2``:
  one edge, ``W = J``.

  Raises:
    ValueError: ``n`` not an integer >= 1, unknown ``weights``.
  """
  n = _check_n(n)
  return from_edges(n, [(0, i) for i in range(1, n)], weights, name="star")


def _check_p(p, field: str) -> float:
  if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not (0.0 < p <= 1.0):
    raise ValueError(f"{field}={p!r} is not allowed: erdos_renyi needs an edge probability "
                     "in (0, 1]")
  return float(p)


def _check_seed(seed, field: str) -> int:
  if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"{field}={seed!r} is not allowed: it must be an integer >= 0")
  return int(seed)


def _erdos_renyi(n: int, p: float, seed: int, weights: str, max_tries: int,
                 p_field: str, seed_field: str) -> Topology:
  n = _check_n(n)
  p = _check_p(p, p_field)
  seed = _check_seed(seed, seed_field)
  max_tries = _check_n(max_tries, "max_tries")
  if weights not in WEIGHTS:
    raise ValueError(f"weights={weights!r} is not allowed: use one of {WEIGHTS}")
  pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    keep = rng.random(len(pairs)) < p
    edges = [e for e, k in zip(pairs, keep) if k]
    if _num_components(n, edges) == 1:
      return from_edges(n, edges, weights, name="erdos_renyi")
  raise ValueError(
      f"{p_field}={p!r} is not allowed for n={n}: no connected G(n, p) in {max_tries} draws "
      f"(seed {seed}); connectivity needs roughly p > ln(n) / n = {np.log(n) / n:.3g}")


def erdos_renyi(n: int, p: float, seed: int = 0, weights: str = "metropolis_hastings",
                max_tries: int = 1000) -> Topology:
  """Connected Erdos-Renyi graph ``G(n, p)``: every pair is linked with probability ``p``.

  Samples are drawn from ``numpy.random.default_rng(seed)`` until one is connected (at most
  ``max_tries``), so the result is a function of ``(n, p, seed)``: every worker building it
  with the same seed gets the same graph. This is ``G(n, p)`` conditioned on connectivity.
  ``n = 1``: no edge; ``p = 1``: the complete graph.

  Raises:
    ValueError: ``p`` not in ``(0, 1]``, ``seed`` not an integer >= 0, no connected sample in
      ``max_tries`` draws (the message names ``p`` and ``n``), unknown ``weights``.
  """
  return _erdos_renyi(n, p, seed, weights, max_tries, p_field="p", seed_field="seed")


def one_peer_exponential(n: int) -> Topology:
  """Time-varying one-peer exponential graph (Ying et al. 2021, Sec. 3).

  With ``tau = ceil(log2 n)`` and ``s_t = 2^(t mod tau)``, at step ``t`` worker ``i`` sends
  to ``(i + s_t) mod n`` and averages with what it receives: ``W_t = (I + P_t) / 2`` with
  ``P_t[i, (i - s_t) mod n] = 1`` (row ``i`` receives from ``i - s_t``). Every ``W_t`` is
  doubly stochastic, not symmetric in general; one message per worker per step. For ``n`` a
  power of 2 the product over one period is exactly ``J`` (exact averaging in ``tau`` steps).

  The returned :class:`Topology` has ``period = max(tau, 1)``, ``phases = (W_0, ...)``,
  ``mixing_matrix`` the MEAN of the phases (doubly stochastic, not symmetric in general),
  ``edges`` the union over phases (the static :func:`exponential` graph's edges).
  ``n = 1``: one phase ``[[1]]``; ``n = 2``: one phase ``J`` (the peer is always the other
  worker), so ``is_time_varying`` is False for ``n <= 2``. Weights are fixed by
  construction (no ``weights`` argument).

  Raises:
    ValueError: ``n`` not an integer >= 1.
  """
  n = _check_n(n)
  tau = (n - 1).bit_length()  # ceil(log2 n) for n >= 1
  if tau == 0:
    w = np.ones((1, 1))
    return Topology(name="one_peer_exponential", n=1, edges=(), mixing_matrix=w, period=1,
                    phases=(w.copy(),))
  idx = np.arange(n)
  phases, edges = [], []
  for k in range(tau):
    s = 2 ** k
    w = 0.5 * np.eye(n)
    w[idx, (idx - s) % n] += 0.5
    phases.append(w)
    edges.extend((i, (i + s) % n) for i in range(n))
  e = _normalise_edges(n, edges)
  mean = np.mean(phases, axis=0)
  return Topology(name="one_peer_exponential", n=n, edges=e, mixing_matrix=mean,
                  period=tau, phases=tuple(phases))


# JYWa/MATCHA util.py select_graph(0): "8-node erdos-renyi graph as shown in Fig. 1(a) in the
# main paper" (Wang et al. 2019), listed there as its matchings.
MATCHA_GRAPH_0 = ((1, 5), (6, 7), (0, 4), (2, 3), (1, 7), (3, 6), (1, 0), (3, 7), (5, 6),
                  (1, 2), (7, 0), (3, 1))


def matcha_graph0(n: int, weights: str = "metropolis_hastings") -> Topology:
  """MATCHA's base graph 0 (:data:`MATCHA_GRAPH_0`, 8 nodes, 12 edges; Wang et al.,
  "MATCHA", 2019, Fig. 1(a); JYWa/MATCHA ``select_graph(0)``).

  Raises:
    ValueError: ``n != 8`` (named ``num_workers``).
  """
  if n != 8:
    raise ValueError(f"num_workers={n!r} is not allowed with topology='matcha_graph0': "
                     "MATCHA's graph 0 has 8 nodes")
  return from_edges(8, MATCHA_GRAPH_0, weights, name="matcha_graph0")


# name -> builder. Signatures differ (torus takes rows, cols; erdos_renyi p and seed;
# one_peer_exponential no weights): use :func:`make` for one uniform call.
TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "ring": ring,
    "torus": torus,
    "exponential": exponential,
    "one_peer_exponential": one_peer_exponential,
    "complete": complete,
    "star": star,
    "erdos_renyi": erdos_renyi,
    "matcha_graph0": matcha_graph0,
}
FIXED_SIZE = {"matcha_graph0": 8}  # graphs with one number of workers


def _torus_dims(n: int, rows: Optional[int], cols: Optional[int]) -> tuple[int, int]:
  if rows is None and cols is None:
    return torus_shape(n)
  if rows is not None:
    rows = _check_n(rows, "topology_rows")
  if cols is not None:
    cols = _check_n(cols, "topology_cols")
  if cols is None:
    if n % rows:
      raise ValueError(f"topology_rows={rows!r} is not allowed: it must divide n={n}")
    return rows, n // rows
  if rows is None:
    if n % cols:
      raise ValueError(f"topology_cols={cols!r} is not allowed: it must divide n={n}")
    return n // cols, cols
  if rows * cols != n:
    raise ValueError(f"topology_rows={rows!r} is not allowed with topology_cols={cols!r}: "
                     f"rows * cols = {rows * cols} must equal n={n}")
  return rows, cols


def make(name: str, n: int, weights: str = "metropolis_hastings", p: Optional[float] = None,
         seed: int = 0, rows: Optional[int] = None, cols: Optional[int] = None) -> Topology:
  """Build a topology by name (``config.topology``) on ``n`` workers.

  Args:
    name: a key of ``TOPOLOGIES``.
    n: number of workers.
    weights: one of ``WEIGHTS``; checked for every name, but ``one_peer_exponential`` has
      fixed weights and ignores it.
    p: edge probability for ``"erdos_renyi"`` (required there, in ``(0, 1]``).
    seed: sampling seed for ``"erdos_renyi"``.
    rows, cols: shape for ``"torus"``, ``rows * cols == n``; one of them may be given and
      the other is ``n / it``; both None: the most square factorisation
      (:func:`torus_shape`; a prime ``n`` gives ``1 x n``, which is a ring).
    Arguments that do not apply to ``name`` are ignored.

  Raises:
    ValueError: unknown name (the message lists the allowed ones), unknown weights, bad
      ``n``, torus shape (names ``topology_rows``/``topology_cols``), erdos_renyi ``p`` or
      seed (names ``topology_p``/``topology_seed``).
  """
  if name not in TOPOLOGIES:
    raise ValueError(f"topology={name!r} is not allowed: use one of {sorted(TOPOLOGIES)}")
  n = _check_n(n)
  if weights not in WEIGHTS:
    raise ValueError(f"weights={weights!r} is not allowed: use one of {WEIGHTS}")
  if name == "torus":
    r, c = _torus_dims(n, rows, cols)
    return torus(r, c, weights=weights)
  if name == "erdos_renyi":
    return _erdos_renyi(n, p, seed, weights, 1000, p_field="topology_p",
                        seed_field="topology_seed")
  if name == "one_peer_exponential":
    return one_peer_exponential(n)
  return TOPOLOGIES[name](n, weights=weights)


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


# ----------------------------------------------------------------------------- config


def check_config(cfg, errs: list) -> None:
  """Config check of topology, mixing_weights, topology_* (torus: rows x cols = num_workers)."""
  checks.choice(cfg, errs, "topology", tuple(TOPOLOGIES))
  checks.choice(cfg, errs, "mixing_weights", MIXING_WEIGHTS)
  checks.number(cfg, errs, "topology_p", 0, lo_open=True, hi=1)
  checks.integer(cfg, errs, "topology_seed", 0)
  rows_ok = checks.integer(cfg, errs, "topology_rows", 0)
  cols_ok = checks.integer(cfg, errs, "topology_cols", 0)
  n, r, c = cfg.get("num_workers"), cfg.get("topology_rows"), cfg.get("topology_cols")
  if cfg.get("topology") == "matcha_graph0" and n != 8:
    errs.append(f"config.topology='matcha_graph0' is not allowed with config.num_workers={n}: "
                "MATCHA's graph 0 has 8 nodes")
  if cfg.get("topology") != "torus" or not (rows_ok and cols_ok and checks.is_int(n)) or not (r or c):
    return
  if r and c and r * c != n:
    errs.append(f"config.topology_rows={r} x config.topology_cols={c} is not allowed with "
                f"config.num_workers={n}: rows x cols must equal num_workers")
  elif n % (r or c):
    errs.append(f"config.topology_{'rows' if r else 'cols'}={r or c} is not allowed: it must "
                f"divide config.num_workers={n}")
