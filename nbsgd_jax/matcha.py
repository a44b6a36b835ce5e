"""MATCHA set-up on the host: matchings, activation probabilities, mixing weight.

MATCHA (Wang, Sahu, Yang, Joshi, Kar, "MATCHA: Speeding Up Decentralized SGD via Matching
Decomposition Sampling", 2019; public code JYWa/MATCHA, ``graph_manager.py``) runs
decentralized SGD on a random sub-graph of a base graph at every step:

1. **Matching decomposition.** The base graph's edges are split into ``M`` disjoint
   matchings ``G_1, ..., G_M`` (an edge colouring). Each matching is one round of pairwise
   exchanges, i.e. one ``ppermute`` with an involution permutation
   (:func:`matching_permutation`). We use the Misra-Gries edge colouring (Misra & Gries,
   "A constructive proof of Vizing's theorem", IPL 1992), so ``M <= max_degree + 1``.
2. **Activation probabilities.** Matching ``j`` is activated independently with probability
   ``p_j``: ``B_j ~ Bernoulli(p_j)``, ``L(t) = sum_j B_j L_j``. The ``p_j`` maximise the
   algebraic connectivity of the expected graph under a communication budget ``C_b``:
   ``max_p lambda_2(sum_j p_j L_j)`` s.t. ``sum_j p_j <= M * C_b``, ``0 <= p_j <= 1``.
3. **Mixing weight.** ``W(t) = I - alpha L(t)`` and ``alpha`` minimises the bound
   ``rho = ||E[W^T W] - J||_2`` through the paper's SDP
   ``min_{a, b, s} s`` s.t. ``(1 - s) I - 2 a E[L] - J + b (E[L]^2 + 2 sum_j p_j (1 - p_j) L_j)
   <= 0``, ``a, b, s >= 0``, ``a^2 <= b``; ``alpha = a``.

All workers must draw the same ``B_j`` (a shared seed) so that ``W(t)`` is symmetric and
doubly stochastic at every step. ``rho < 1`` iff the expected graph is connected and
``alpha`` is chosen as above; the convergence bounds of the paper depend on ``rho``.

Notation: ``n`` workers, ``J = 11^T / n``, ``L_j`` the Laplacian of matching ``j``
(``L_j^2 = 2 L_j`` because every connected component of a matching is a single edge).

Deviations from the public code (documented, numerically equivalent where stated):

* Decomposition: the public code first peels off perfect matchings with
  ``networkx.max_weight_matching`` on a randomly reshuffled graph, then colours the rest
  greedily (which may need up to ``2 max_degree - 1`` matchings). We use Misra-Gries:
  deterministic, no networkx, and ``M <= max_degree + 1`` always.
* Solvers: the public code calls CVXOPT. We call cvxpy with Clarabel (interior point, PSD and
  second-order cones; SCS as a fallback), both open source and shipped as PyPI wheels.
* Both SDPs are written on the subspace ``1^perp`` (an orthonormal basis ``U`` ``[n, n-1]``
  of it): every matrix involved has ``1`` as an eigenvector (eigenvalue 0 for ``L_j``, 1 for
  ``I``, ``J``), so ``lambda_2(L) >= t  <=>  U^T L U >= t I`` and the alpha LMI restricted to
  ``1`` reads ``-s <= 0``, which ``s >= 0`` already states. The projected problems have the
  same optimum but are strictly feasible, which interior-point solvers need. The public
  code's ``lambda_sum_smallest(L, 2)`` equals ``lambda_2(L)`` because ``lambda_1(L) = 0``.

Everything here is host-side numpy (and cvxpy for steps 2-3), run once before training.
``cvxpy`` is imported lazily, so importing this module does not need it.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple, Sequence

import numpy as np

from nbsgd_jax import checks

Edge = tuple[int, int]
Matching = list[Edge]

_SOLVERS = ("CLARABEL", "SCS")


# --------------------------------------------------------------------------------------
# Validation helpers.


def _check_n(n) -> int:
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise ValueError(f"n={n!r} is not allowed: it must be an integer >= 1")
  return int(n)


def _check_edge(n: int, e) -> Edge:
  try:
    pair = tuple(e)
  except TypeError:
    raise ValueError(f"edge {e!r} is not allowed: an edge is a pair (i, j)") from None
  if len(pair) != 2:
    raise ValueError(f"edge {pair!r} is not allowed: an edge is a pair (i, j)")
  for v in pair:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
      raise ValueError(f"edge {pair!r} is not allowed: endpoints must be integers")
  i, j = int(pair[0]), int(pair[1])
  if not (0 <= i < n and 0 <= j < n):
    raise ValueError(f"edge {(i, j)!r} is out of range: endpoints must lie in [0, {n - 1}]")
  if i == j:
    raise ValueError(f"edge {(i, j)!r} is a self loop: self weights live on the diagonal of W")
  return (min(i, j), max(i, j))


def _normalise_edges(n: int, edges: Sequence[Sequence[int]]) -> list[Edge]:
  """Validated, deduplicated, sorted ``(i, j)`` pairs with ``i < j`` (as topology does)."""
  return sorted({_check_edge(n, e) for e in edges})


def _check_matchings(n: int, matchings: Sequence[Sequence[Sequence[int]]]) -> list[Matching]:
  """Validate a list of matchings: each a set of vertex-disjoint valid edges."""
  out = []
  seen_edges: set[Edge] = set()
  for k, m in enumerate(matchings):
    used: set[int] = set()
    cur = []
    for e in m:
      i, j = _check_edge(n, e)
      if i in used or j in used:
        raise ValueError(f"matchings[{k}]={list(m)!r} is not allowed: edge {(i, j)!r} shares a "
                         "worker with another edge of the same matching")
      if (i, j) in seen_edges:
        raise ValueError(f"matchings[{k}]={list(m)!r} is not allowed: edge {(i, j)!r} already "
                         "belongs to an earlier matching")
      used.update((i, j))
      seen_edges.add((i, j))
      cur.append((i, j))
    out.append(sorted(cur))
  return out


def _check_probs(probs, m: int) -> np.ndarray:
  p = np.asarray(probs, dtype=np.float64)
  if p.shape != (m,):
    raise ValueError(f"probs shape={p.shape} is not allowed: expected ({m},), one per matching")
  if not np.all(np.isfinite(p)) or np.any(p < 0.0) or np.any(p > 1.0):
    raise ValueError(f"probs={p.tolist()!r} is not allowed: every entry must lie in [0, 1]")
  return p


def _check_float(name: str, value, allowed: str, ok) -> float:
  """``float(value)`` if finite and ``ok(value)``, else ValueError naming ``name``."""
  msg = f"{name}={value!r} is not allowed: it must be a {allowed}"
  if isinstance(value, bool):
    raise ValueError(msg)
  try:
    v = float(value)
  except (TypeError, ValueError):
    raise ValueError(msg) from None
  if not math.isfinite(v) or not ok(v):
    raise ValueError(msg)
  return v


def _check_alpha(alpha) -> float:
  return _check_float("alpha", alpha, "finite float >= 0", lambda a: a >= 0.0)


def _check_budget(budget) -> float:
  return _check_float("budget", budget, "float in (0, 1]", lambda x: 0.0 < x <= 1.0)


# --------------------------------------------------------------------------------------
# Step 1: matching decomposition (Misra-Gries edge colouring).


class _Colouring:
  """Partial proper edge colouring: ``colour[u][v]`` and ``at[u][c] = v`` (both ways)."""

  def __init__(self, n: int, num_colours: int):
    self.colour: list[dict[int, int]] = [dict() for _ in range(n)]
    self.at: list[dict[int, int]] = [dict() for _ in range(n)]
    self.num_colours = num_colours

  def get(self, u: int, v: int) -> int | None:
    return self.colour[u].get(v)

  def set(self, u: int, v: int, c: int) -> None:
    old = self.colour[u].get(v)
    if old is not None:
      del self.at[u][old]
      del self.at[v][old]
    assert c not in self.at[u] and c not in self.at[v], "internal error: colouring not proper"
    self.colour[u][v] = self.colour[v][u] = c
    self.at[u][c] = v
    self.at[v][c] = u

  def is_free(self, u: int, c: int) -> bool:
    return c not in self.at[u]

  def free(self, u: int) -> int:
    """Smallest colour free on ``u`` (exists because ``deg(u) <= num_colours - 1``)."""
    for c in range(self.num_colours):
      if c not in self.at[u]:
        return c
    raise AssertionError("internal error: no free colour")  # unreachable by Vizing's bound


def _misra_gries(n: int, edges: list[Edge], adj: list[list[int]], max_deg: int) -> _Colouring:
  """Colour ``edges`` with ``max_deg + 1`` colours (Misra & Gries 1992)."""
  col = _Colouring(n, max_deg + 1)
  for u, v in edges:
    # Maximal fan F of u starting at v: F[0] = v with (u, v) uncoloured; for i >= 1 the edge
    # (u, F[i]) is coloured and its colour is free on F[i - 1]; vertices are distinct.
    fan = [v]
    in_fan = {v}
    extended = True
    while extended:
      extended = False
      last = fan[-1]
      for x in adj[u]:
        if x in in_fan:
          continue
        cx = col.get(u, x)
        if cx is not None and col.is_free(last, cx):
          fan.append(x)
          in_fan.add(x)
          extended = True
          break
    c = col.free(u)
    d = c if col.is_free(fan[-1], c) else col.free(fan[-1])
    if d != c:
      # Invert the cd-path from u: it starts with u's d-edge (c is free on u), alternates
      # d, c, d, ... and is simple. Swapping c <-> d on it frees d on u.
      path = []
      x, want, other = u, d, c
      while want in col.at[x]:
        y = col.at[x][want]
        path.append((x, y, want))
        x, want, other = y, other, want
      for a, b, _ in path:  # uncolour first so that the re-colouring never clashes
        old = col.colour[a].pop(b)
        del col.colour[b][a]
        del col.at[a][old]
        del col.at[b][old]
      for a, b, cc in path:
        col.set(a, b, c if cc == d else d)
    # Find w in F such that F[:w+1] is still a fan and d is free on w (exists: Misra-Gries).
    w_idx = None
    for i, f in enumerate(fan):
      if i > 0:
        ci = col.get(u, f)
        if ci is None or not col.is_free(fan[i - 1], ci):
          break
      if col.is_free(f, d):
        w_idx = i
        break
    if w_idx is None:
      raise AssertionError("internal error: Misra-Gries found no fan vertex")  # unreachable
    # Rotate the fan prefix: (u, F[i]) takes the colour of (u, F[i + 1]); (u, w) gets d.
    for i in range(w_idx):
      nxt = col.get(u, fan[i + 1])
      old = col.colour[u].pop(fan[i + 1])
      del col.colour[fan[i + 1]][u]
      del col.at[u][old]
      del col.at[fan[i + 1]][old]
      col.set(u, fan[i], nxt)
    col.set(u, fan[w_idx], d)
  return col


def matching_decomposition(n: int, edges: Sequence[Sequence[int]]) -> list[list[tuple[int, int]]]:
  """Split a graph's edges into disjoint matchings (step 1 of MATCHA).

  Misra-Gries edge colouring (Misra & Gries, IPL 1992, a constructive proof of Vizing's
  theorem): every edge gets one of ``max_degree + 1`` colours, no two edges of one colour
  share a worker; the non-empty colour classes are the matchings. Deterministic: edges are
  processed in sorted order and the smallest free colours are taken.

  Args:
    n: number of workers, ``>= 1``.
    edges: undirected edges ``(i, j)``, ``0 <= i, j < n``, ``i != j`` (order and duplicates
      ignored, as in :func:`nbsgd_jax.topology.from_edges`).

  Returns:
    ``M <= max_degree + 1`` matchings, each a sorted list of ``(i, j)`` with ``i < j``; they
    are pairwise disjoint and together hold every edge exactly once. ``[]`` when there is no
    edge (in particular for ``n = 1``).

  Raises:
    ValueError: ``n`` not an integer ``>= 1``, or an edge that is not a pair, is out of
      range, or is a self loop (the message names the edge).
  """
  n = _check_n(n)
  es = _normalise_edges(n, edges)
  if not es:
    return []
  adj: list[list[int]] = [[] for _ in range(n)]
  for i, j in es:
    adj[i].append(j)
    adj[j].append(i)
  for a in adj:
    a.sort()
  max_deg = max(len(a) for a in adj)
  col = _misra_gries(n, es, adj, max_deg)
  classes: list[list[Edge]] = [[] for _ in range(max_deg + 1)]
  for i, j in es:
    classes[col.colour[i][j]].append((i, j))
  return [sorted(m) for m in classes if m]


def matching_permutation(n: int, matching: Sequence[Sequence[int]]) -> list[int]:
  """The involution of one matching, for ``lax.ppermute``.

  Args:
    n: number of workers.
    matching: vertex-disjoint edges ``(i, j)``.

  Returns:
    ``perm`` of length ``n`` with ``perm[i]`` the partner of worker ``i`` in the matching, or
    ``i`` itself when ``i`` is unmatched; ``perm[perm[i]] == i``. The ``ppermute`` pairs are
    ``[(i, perm[i]) for i in range(n) if perm[i] != i]``.

  Raises:
    ValueError: bad ``n``, a bad edge, or two edges sharing a worker.
  """
  n = _check_n(n)
  (m,) = _check_matchings(n, [matching])
  perm = list(range(n))
  for i, j in m:
    perm[i], perm[j] = j, i
  return perm


def matching_laplacians(n: int, matchings: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
  """Laplacians of the matchings, float64 ``[M, n, n]``.

  ``L_j = sum_{(i, k) in G_j} (e_i - e_k)(e_i - e_k)^T``; for a matching ``L_j^2 = 2 L_j``.
  ``M = 0`` gives shape ``[0, n, n]``.

  Raises:
    ValueError: bad ``n``, bad edge, an edge in two matchings, or a non-matching.
  """
  n = _check_n(n)
  ms = _check_matchings(n, matchings)
  out = np.zeros((len(ms), n, n), dtype=np.float64)
  for k, m in enumerate(ms):
    for i, j in m:
      out[k, i, i] += 1.0
      out[k, j, j] += 1.0
      out[k, i, j] -= 1.0
      out[k, j, i] -= 1.0
  return out


# --------------------------------------------------------------------------------------
# Steps 2-3: convex programs (cvxpy).


def _cvxpy():
  try:
    import cvxpy as cp  # pylint: disable=import-outside-toplevel
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("nbsgd_jax.matcha needs cvxpy (pip install cvxpy) to solve the "
                      "activation-probability and mixing-weight programs") from e
  return cp


def _solve(problem, cp) -> None:
  """Solve with Clarabel, falling back to SCS; raise if neither reaches an optimum.

  ``optimal_inaccurate`` is accepted without cvxpy's warning: Clarabel reports it on the
  degenerate alpha SDP with every ``p_j = 1`` (several eigenvalues active at the optimum)
  while its answer still matches the closed form to ~1e-9; :func:`mixing_alpha` polishes
  ``a`` on the exact objective and :func:`activation_probabilities` clips and re-scales to
  the constraints, so a reduced-accuracy optimum cannot leak out.
  """
  errors = []
  for solver in _SOLVERS:
    if solver not in cp.installed_solvers():
      continue
    try:
      kwargs = {"eps": 1e-9, "max_iters": 200_000} if solver == "SCS" else {}
      with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        problem.solve(solver=solver, **kwargs)
    except cp.error.SolverError as e:
      errors.append(f"{solver}: {e}")
      continue
    if problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
      return
    errors.append(f"{solver}: status {problem.status}")
  raise RuntimeError(f"MATCHA convex program failed: {errors or 'no solver installed'}")


def _perp_basis(n: int) -> np.ndarray:
  """Orthonormal basis ``U`` ``[n, n-1]`` of ``1^perp`` (deterministic)."""
  q, _ = np.linalg.qr(np.concatenate([np.ones((n, 1)), np.eye(n)[:, : n - 1]], axis=1))
  return q[:, 1:]


def _sym(x: np.ndarray) -> np.ndarray:
  return 0.5 * (x + x.T)


def activation_probabilities(n: int, matchings: Sequence[Sequence[Sequence[int]]],
                             budget: float) -> np.ndarray:
  """Activation probability of every matching (step 2 of MATCHA).

  Solves ``max_p lambda_2(sum_j p_j L_j)`` s.t. ``sum_j p_j <= M * budget``,
  ``0 <= p_j <= 1`` (concave objective: ``lambda_2`` of an affine matrix), written as the SDP
  ``max t`` s.t. ``U^T (sum_j p_j L_j) U - t I >= 0`` with ``U`` an orthonormal basis of
  ``1^perp``. This equals ``sum_j p_j L_j - t (I - J) >= 0`` (the ``1`` direction is 0 on both
  sides) and the public code's ``lambda_sum_smallest(L, 2)`` (``lambda_1 = 0``).

  ``budget`` is ``C_b``, the expected fraction of the base graph's matchings used per step:
  the expected number of communication rounds per step is ``sum_j p_j <= M * C_b``.
  The maximiser need not be unique (e.g. a disconnected base graph, where ``lambda_2 = 0``
  for every ``p``); the solver's answer is returned, clipped to ``[0, 1]``.

  Args:
    n: number of workers.
    matchings: ``M`` matchings (see :func:`matching_decomposition`).
    budget: communication budget ``C_b`` in ``(0, 1]``; ``1`` returns all ones (no solve).

  Returns:
    float64 ``[M]`` in ``[0, 1]`` with ``sum <= M * budget`` (the solver's answer clipped to
    ``[0, 1]`` and, if its sum overshoots by the solver tolerance, scaled down); shape ``[0]``
    for ``M = 0``.

  Raises:
    ValueError: ``budget`` outside ``(0, 1]``, or bad ``n`` / ``matchings``.
    RuntimeError: the solver failed.
  """
  n = _check_n(n)
  ms = _check_matchings(n, matchings)
  c_b = _check_budget(budget)
  m = len(ms)
  if m == 0:
    return np.zeros((0,), dtype=np.float64)
  if c_b == 1.0:
    return np.ones((m,), dtype=np.float64)
  cp = _cvxpy()
  u = _perp_basis(n)
  lap = matching_laplacians(n, ms)
  proj = [_sym(u.T @ l @ u) for l in lap]  # [M] x [n-1, n-1]
  p = cp.Variable(m)
  t = cp.Variable()
  lp = sum(p[j] * proj[j] for j in range(m))
  cons = [lp - t * np.eye(n - 1) >> 0, cp.sum(p) <= m * c_b, p >= 0, p <= 1]
  prob = cp.Problem(cp.Maximize(t), cons)
  _solve(prob, cp)
  out = np.clip(np.asarray(p.value, dtype=np.float64).reshape(m), 0.0, 1.0)
  total = out.sum()
  if total > m * c_b:  # solver tolerance: make the budget hold exactly
    out *= m * c_b / total
  return out


def _moments(lap: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``E[L]`` and ``E[L^2] = E[L]^2 + 2 sum_j p_j (1 - p_j) L_j`` (uses ``L_j^2 = 2 L_j``)."""
  n = lap.shape[1]
  mean = np.tensordot(p, lap, axes=1) if len(p) else np.zeros((n, n))
  var = np.tensordot(p * (1.0 - p), lap, axes=1) if len(p) else np.zeros((n, n))
  return mean, mean @ mean + 2.0 * var


def mixing_alpha(n: int, matchings: Sequence[Sequence[Sequence[int]]],
                 probs: Sequence[float] | np.ndarray, polish: bool = True) -> float:
  """Mixing weight ``alpha`` of ``W(t) = I - alpha L(t)`` (step 3 of MATCHA).

  The paper's SDP (as in the public code's ``getAlpha``)::

      min_{a, b, s} s  s.t.  (1 - s) I - 2 a E[L] - J + b (E[L]^2 + 2 sum_j p_j (1 - p_j) L_j) <= 0,
                             a >= 0, b >= 0, s >= 0, a^2 <= b,

  returning ``alpha = a``. Why it is right: ``E[W^T W] - J = I - J - 2 a E[L] + a^2 E[L^2]`` is
  PSD (it is ``E[W^T W]`` on ``1^perp`` and 0 on ``1``), so ``||E[W^T W] - J||_2 <= s`` iff the
  LMI holds with ``b = a^2``; ``E[L^2]`` is PSD, so relaxing to ``b >= a^2`` only tightens the
  LMI and ``b = a^2`` at the optimum; the optimal ``s`` is ``expected_rho(.., alpha)``. We
  impose the LMI on ``1^perp`` (``U^T (.) U``), where it is strictly feasible; on ``1`` it
  reads ``-s <= 0``.

  With every ``p_j = 1`` the answer is the best constant weight
  ``2 / (lambda_2(L) + lambda_n(L))`` of the base Laplacian (Xiao & Boyd 2004).

  Polishing (our addition, same optimum): ``rho(a) = lambda_max(U^T (I - 2 a E[L] + a^2 E[L^2]) U)``
  is convex in ``a`` (a supremum over unit ``x`` of quadratics with ``x^T E[L^2] x >= 0``), so
  the SDP's ``a`` is refined by a bounded scalar minimisation of the exact ``rho(a)`` on
  ``[0.9 a, 1.1 a]``; the refined value is kept only if its ``rho`` is not larger. This
  removes the interior-point tolerance (``a`` is otherwise only accurate to about
  ``sqrt(tol)`` where ``rho(a)`` is smooth at its minimum).

  Args:
    n: number of workers.
    matchings: ``M`` matchings.
    probs: activation probabilities ``[M]`` in ``[0, 1]``.
    polish: refine the SDP's ``a`` as above (default ``True``); ``False`` returns the SDP's
      ``a`` as is (the public code's behaviour).

  Returns:
    ``alpha >= 0`` (float). ``0.0`` when ``n = 1`` or ``E[L] = 0`` (nothing to mix).

  Raises:
    ValueError: bad ``n``, ``matchings`` or ``probs``.
    RuntimeError: the solver failed.
  """
  n = _check_n(n)
  ms = _check_matchings(n, matchings)
  p = _check_probs(probs, len(ms))
  lap = matching_laplacians(n, ms)
  mean, second = _moments(lap, p)
  if n == 1 or not np.any(mean):
    return 0.0
  cp = _cvxpy()
  u = _perp_basis(n)
  mean_p = _sym(u.T @ mean @ u)
  second_p = _sym(u.T @ second @ u)
  eye = np.eye(n - 1)
  a, b, s = cp.Variable(), cp.Variable(), cp.Variable()
  lmi = (1 - s) * eye - 2 * a * mean_p + b * second_p
  cons = [-lmi >> 0, a >= 0, b >= 0, s >= 0, cp.square(a) <= b]
  prob = cp.Problem(cp.Minimize(s), cons)
  _solve(prob, cp)
  alpha = max(float(a.value), 0.0)
  if not polish or alpha == 0.0:
    return alpha

  def rho(x: float) -> float:
    return float(np.linalg.eigvalsh(eye - 2.0 * x * mean_p + x * x * second_p)[-1])

  from scipy import optimize  # pylint: disable=import-outside-toplevel  (a cvxpy dependency)
  res = optimize.minimize_scalar(rho, bounds=(0.9 * alpha, 1.1 * alpha), method="bounded",
                                 options={"xatol": 1e-12})
  if res.success and rho(float(res.x)) <= rho(alpha):
    alpha = float(res.x)
  return alpha


def expected_rho(n: int, matchings: Sequence[Sequence[Sequence[int]]],
                 probs: Sequence[float] | np.ndarray, alpha: float) -> float:
  """``rho = ||E[W^T W] - J||_2`` for ``W = I - alpha sum_j B_j L_j``, ``B_j ~ Bernoulli(p_j)``.

  Closed form: ``E[W^T W] = I - 2 alpha E[L] + alpha^2 E[L^2]`` with ``E[L] = sum_j p_j L_j`` and
  ``E[L^2] = E[L]^2 + sum_j p_j (1 - p_j) L_j^2 = E[L]^2 + 2 sum_j p_j (1 - p_j) L_j``
  (independent ``B_j``; ``L_j^2 = 2 L_j``). The paper's convergence rate depends on it:
  ``rho < 1`` iff the expected graph is connected and ``alpha`` is small enough.

  Args:
    n: number of workers.
    matchings: ``M`` matchings.
    probs: ``[M]`` in ``[0, 1]``.
    alpha: mixing weight ``>= 0``.

  Returns:
    ``rho >= 0`` (float); 0 for ``n = 1``, 1 for ``n > 1`` without any edge.

  Raises:
    ValueError: bad ``n``, ``matchings``, ``probs`` or ``alpha``.
  """
  n = _check_n(n)
  ms = _check_matchings(n, matchings)
  p = _check_probs(probs, len(ms))
  a = _check_alpha(alpha)
  lap = matching_laplacians(n, ms)
  mean, second = _moments(lap, p)
  ewtw = np.eye(n) - 2.0 * a * mean + a * a * second
  return float(np.linalg.norm(_sym(ewtw) - np.full((n, n), 1.0 / n), ord=2))


# --------------------------------------------------------------------------------------
# The plan.


class MatchaPlan(NamedTuple):
  """Everything the trainer needs, computed once on the host by :func:`plan`.

  Attributes:
    n: number of workers.
    matchings: ``M`` matchings, each a sorted list of ``(i, j)``, ``i < j``.
    probs: activation probabilities, float64 ``[M]`` in ``[0, 1]``.
    alpha: mixing weight of ``W(t) = I - alpha L(t)``.
    rho: ``||E[W^T W] - J||_2`` (spectral norm; dimensionless).
    laplacians: float64 ``[M, n, n]``.
  """

  n: int
  matchings: list[list[tuple[int, int]]]
  probs: np.ndarray
  alpha: float
  rho: float
  laplacians: np.ndarray


def plan(n: int, edges: Sequence[Sequence[int]], budget: float) -> MatchaPlan:
  """Run MATCHA's set-up: decomposition, probabilities, ``alpha``, ``rho``.

  Args:
    n: number of workers.
    edges: base graph edges (e.g. ``topology.ring(n).edges``).
    budget: communication budget ``C_b`` in ``(0, 1]`` (``1`` = vanilla decentralized SGD on
      the base graph with the best constant weight).

  Raises:
    ValueError: bad ``n``, ``edges`` or ``budget``.
    RuntimeError: a solver failed.
  """
  n = _check_n(n)
  c_b = _check_budget(budget)
  ms = matching_decomposition(n, edges)
  p = activation_probabilities(n, ms, c_b)
  a = mixing_alpha(n, ms, p)
  r = expected_rho(n, ms, p, a)
  return MatchaPlan(n=n, matchings=ms, probs=p, alpha=a, rho=r,
                    laplacians=matching_laplacians(n, ms))


# pylint: disable-next=redefined-outer-name
def sample_mixing_matrix(plan: MatchaPlan, active: np.ndarray) -> np.ndarray:
  """Host reference ``W = I - alpha sum_j active_j L_j``, float64 ``[n, n]``.

  Args:
    plan: a :class:`MatchaPlan`.
    active: bool ``[M]``, which matchings are active this step.

  Raises:
    ValueError: ``active`` has the wrong shape.
  """
  act = np.asarray(active)
  m = len(plan.matchings)
  if act.shape != (m,):
    raise ValueError(f"active shape={act.shape} is not allowed: expected ({m},), one per matching")
  act = act.astype(bool).astype(np.float64)
  lap = np.tensordot(act, plan.laplacians, axes=1) if m else np.zeros((plan.n, plan.n))
  return np.eye(plan.n) - plan.alpha * lap


# pylint: disable-next=redefined-outer-name
def expected_bytes_per_step(plan: MatchaPlan, model_bytes: float) -> float:
  """Expected bytes sent per worker per step, averaged over workers.

  An active matching ``j`` makes each of its ``2 |G_j|`` matched workers send one model, so
  the mean over workers is ``sum_j p_j * (2 |G_j| / n) * model_bytes`` (bytes). With
  ``model_bytes = 1`` this is the expected number of messages per worker per step.

  Raises:
    ValueError: ``model_bytes`` negative or not finite.
  """
  try:
    size = float(model_bytes)
  except (TypeError, ValueError):
    raise ValueError(
        f"model_bytes={model_bytes!r} is not allowed: it must be a float >= 0") from None
  if isinstance(model_bytes, bool) or not math.isfinite(size) or size < 0.0:
    raise ValueError(f"model_bytes={model_bytes!r} is not allowed: it must be a float >= 0")
  sizes = np.array([len(m) for m in plan.matchings], dtype=np.float64)
  return float(np.sum(np.asarray(plan.probs) * 2.0 * sizes / plan.n) * size)


def sample_activations(plan: MatchaPlan, seed: int, step: int) -> np.ndarray:
  """MATCHA's activations ``B_j ~ Bernoulli(p_j)`` of one step, bool ``[M]``.

  Drawn on the host from ``np.random.default_rng([seed, step])``, so every worker (and a
  resumed run) sees the same draw; the trainer passes them to the jitted step as an input.
  """
  m = len(plan.matchings)
  return np.random.default_rng([int(seed), int(step)]).random(m) < np.asarray(plan.probs)


# ----------------------------------------------------------------------------- config


def check_config(cfg, errs: list) -> None:
  """matcha.*; MATCHA's base graph must be static."""
  checks.number(cfg, errs, "matcha.budget", 0, lo_open=True, hi=1)
  checks.integer(cfg, errs, "matcha.seed", 0)
  if cfg.get("algorithm") == "matcha" and cfg.get("topology") == "one_peer_exponential":
    errs.append("config.topology='one_peer_exponential' is not allowed with "
                "config.algorithm='matcha': MATCHA samples matchings of a static base graph")
