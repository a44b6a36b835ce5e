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
from typing import Sequence

import ml_collections
import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.topology.matchings import (MatchaPlan, _check_alpha, _check_budget, _check_matchings,
                                 _check_n, _check_probs, matching_decomposition,
                                 matching_laplacians)

_SOLVERS = ("CLARABEL", "SCS")


# --------------------------------------------------------------------------------------
# Steps 2-3: convex programs (cvxpy).


def _cvxpy():
  try:
    import cvxpy as cp  # pylint: disable=import-outside-toplevel
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("nbsgd_jax.topology.matcha needs cvxpy (pip install cvxpy) to solve the "
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


# ----------------------------------------------------------------------------- config


def matcha_defaults() -> ml_collections.ConfigDict:
  """``config.matcha.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.budget = 0.5                 # communication budget C_b in (0, 1]: expected fraction of
                                 # matchings active per step (1 = D-PSGD with W = I - alpha L)
  s.seed = 0                     # seed of the shared Bernoulli activations
  return s


def check_config(cfg, errs: list) -> None:
  """matcha.*: the communication budget and the activations' seed."""
  checks.number(cfg, errs, "matcha.budget", 0, lo_open=True, hi=1)
  checks.integer(cfg, errs, "matcha.seed", 0)


def check_static_graph(cfg, errs: list) -> None:
  """MATCHA's base graph is static (``config.algorithm='matcha'``)."""
  if cfg.get("topology") == "one_peer_exponential":
    errs.append("config.topology='one_peer_exponential' is not allowed with "
                "config.algorithm='matcha': MATCHA samples matchings of a static base graph")
