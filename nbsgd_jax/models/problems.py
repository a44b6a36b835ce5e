"""Seeded synthetic Polyak-Lojasiewicz (PL) problems with a known optimum ``F*``.

These problems check the theory of local SGD with periodic averaging (LUPA-SGD):
H. Haddadpour, M. M. Kamani, M. Mahdavi, V. Cadambe, "Local SGD with Periodic Averaging:
Tighter Analysis and Adaptive Synchronization", NeurIPS 2019. Under PL, their Theorem 4.2
gives ``E[F(x_T)] - F* = O(1 / (p T))`` with ``p`` workers (linear speed-up), which needs
the exact ``F*`` that these problems provide.

Data: ``n`` workers each hold ``m`` examples ``(a_ij, b_ij)``, ``a_ij`` in ``R^d``. The
global objective is

    F(x) = (1 / (n m)) sum_{i, j} f(x; a_ij, b_ij) + (l2 / 2) ||x||^2,

* least squares (:func:`least_squares`): ``f = 0.5 (a^T x - b)^2``, real ``b``;
* logistic regression (:func:`logistic`): ``f = log(1 + exp(-b a^T x))``, ``b`` in {-1, +1}.

Why PL. A function is mu-PL if ``0.5 ||grad F(x)||^2 >= mu (F(x) - F*)`` for all ``x``
(H. Karimi, J. Nutini, M. Schmidt, "Linear Convergence of Gradient and Proximal-Gradient
Methods Under the Polyak-Lojasiewicz Condition", ECML-PKDD 2016). Every mu-strongly convex
function is mu-PL (their Appendix B).

* Least squares: ``F`` is a quadratic with Hessian ``H = A^T A / N + l2 I`` (``N = n m``).
  If ``H`` is positive definite (``l2 > 0``, or ``N >= d`` with full-rank ``A``, which holds
  almost surely for Gaussian features) ``F`` is ``lambda_min(H)``-strongly convex. Even a
  rank-deficient linear least-squares problem is PL with mu the smallest *positive*
  eigenvalue of ``H`` (Karimi et al. 2016, Sec. 2.3); :func:`pl_constants` returns that.
* Logistic: the loss has Hessian ``A^T diag(s (1 - s)) A / N + l2 I`` with
  ``0 <= s (1 - s) <= 1/4``, so ``F`` is ``l2``-strongly convex and
  ``(lambda_max(A^T A) / (4 N) + l2)``-smooth.

Heterogeneity (non-iid workers). With ``heterogeneity = h > 0`` worker ``i``'s features get
mean ``mu_i = h u_i`` with ``u_i`` a random unit vector, and its targets are generated from
the *centred* features ``a - mu_i`` (least squares: ``b = (a - mu_i)^T x_true + noise``;
logistic: ``P(b = +1) = sigmoid((a - mu_i)^T x_true)``). A pure mean shift with targets
``a^T x_true`` would leave every worker's local optimum at ``x_true`` (the model would still
be well specified on every worker); labelling the centred features gives worker ``i`` an
intercept ``-mu_i^T x_true`` that the linear model cannot fit, so the local optima differ
and the local gradients at ``x*`` differ by ``O(h^2)``. The distance between local optima
grows with ``h`` but saturates for large ``h`` (the shift also adds curvature along
``u_i``, which pins the local optimum in that direction). ``h = 0`` is the iid problem. This
is in the spirit of the Synthetic(alpha, beta) data of T. Li et al., "Federated
Optimization in Heterogeneous Networks" (FedProx), MLSys 2020.

Storage: ``features`` and ``targets`` are float32 (what the jax code trains on); ``x_star``
and ``f_star`` are float64 and are computed from the float32 data upcast to float64, so they
are the optimum of exactly the stored problem.

Errors: bad arguments raise ``ValueError("<arg>=<value> is not allowed: ...")`` naming the
argument and what is allowed. :func:`logistic` raises ``RuntimeError`` if the solver does not
reach ``||grad F(x*)|| <= 1e-10``.

Example::

  import jax
  from nbsgd_jax.models import problems

  prob = problems.least_squares(num_workers=4, examples_per_worker=256, dim=10, seed=0)
  loss = problems.loss_fn(prob)                 # (params, (features, targets)) -> scalar
  params = problems.init_params(prob)           # {"w": zeros [dim] float32}
  grads = jax.grad(loss)(params, (prob.features[0, :32], prob.targets[0, :32]))
  mu, L = problems.pl_constants(prob)
  gap = problems.objective(prob, params["w"]) - prob.f_star   # F(x) - F* >= 0
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
import scipy.special
import ml_collections

from nbsgd_jax.core import checks

PROBLEMS = ("least_squares", "logistic")

Params = dict[str, jax.Array]
Batch = tuple[jax.Array, jax.Array]  # (features [B, dim], targets [B])

# Logistic solver: required accuracy of x_star and the Newton polishing budget.
_GRAD_TOL = 1e-10
_MAX_POLISH_STEPS = 20


class SyntheticProblem(NamedTuple):
  """A synthetic finite-sum problem split across workers, with its exact optimum.

  Attributes:
    name: ``"least_squares"`` or ``"logistic"``.
    features: float32 ``[n_workers, m, dim]``; worker ``i`` holds ``features[i]``.
    targets: float32 ``[n_workers, m]``; real for least squares, labels in {-1, +1} for
      logistic.
    l2: l2 regularisation ``lambda >= 0`` (``> 0`` for logistic).
    x_star: float64 ``[dim]``, the minimiser of the global objective ``F`` (the minimum-norm
      one if least squares is rank deficient with ``l2 = 0``).
    f_star: ``F(x_star)``, a Python float (float64).
  """
  name: str
  features: np.ndarray
  targets: np.ndarray
  l2: float
  x_star: np.ndarray
  f_star: float


# ----------------------------------------------------------------------------- validation


def _err(arg: str, value: Any, allowed: str) -> ValueError:
  return ValueError(f"{arg}={value!r} is not allowed: it must be {allowed}")


def _check_int(arg: str, value: Any, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
    raise _err(arg, value, f"an int >= {low}")
  return int(value)


def _check_real(arg: str, value: Any, low: float, strict: bool = False) -> float:
  op = ">" if strict else ">="
  ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
        and math.isfinite(value) and (value > low if strict else value >= low))
  if not ok:
    raise _err(arg, value, f"a finite float {op} {low:g}")
  return float(value)


def _check_problem(problem: SyntheticProblem) -> None:
  if problem.name not in PROBLEMS:
    raise _err("problem.name", problem.name, f"one of {PROBLEMS}")


# ----------------------------------------------------------------------------- builders


def _random_unit_vectors(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
  """``count`` independent uniformly random unit vectors, float64 ``[count, dim]``."""
  v = rng.standard_normal((count, dim))
  norms = np.linalg.norm(v, axis=1, keepdims=True)
  return v / np.maximum(norms, np.finfo(np.float64).tiny)


def _random_rotation(rng: np.random.Generator, dim: int) -> np.ndarray:
  """A Haar-random orthogonal matrix ``[dim, dim]`` (QR of a Gaussian, signs fixed)."""
  q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
  return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def _stack(problem: SyntheticProblem) -> tuple[np.ndarray, np.ndarray]:
  """All data upcast to float64: features ``[N, dim]``, targets ``[N]``, ``N = n m``."""
  n, m, dim = problem.features.shape
  a = np.asarray(problem.features, np.float64).reshape(n * m, dim)
  b = np.asarray(problem.targets, np.float64).reshape(n * m)
  return a, b


def global_batch(problem: SyntheticProblem) -> tuple[np.ndarray, np.ndarray]:
  """All workers' data as one batch: float32 features ``[n m, dim]``, targets ``[n m]``.

  ``loss_fn(problem)(params, global_batch(problem))`` equals ``F`` at ``params["w"]`` (up to
  float32 rounding).
  """
  n, m, dim = problem.features.shape
  return problem.features.reshape(n * m, dim), problem.targets.reshape(n * m)


def least_squares(num_workers: int, examples_per_worker: int, dim: int, noise: float = 0.1,
                  l2: float = 0.0, heterogeneity: float = 0.0, condition: float = 10.0,
                  seed: int = 0) -> SyntheticProblem:
  """Distributed linear least squares ``F(x) = 0.5 mean((a^T x - b)^2) + (l2/2) ||x||^2``.

  Features: ``a = mu_i + Sigma^{1/2} z``, ``z ~ N(0, I_dim)``, where ``Sigma = Q diag(s) Q^T``
  has eigenvalues ``s`` log-uniformly (geometrically) spaced in ``[1 / condition, 1]`` and a
  random rotation ``Q``; ``mu_i = heterogeneity * u_i`` with ``u_i`` a random unit vector.
  Targets: ``b = (a - mu_i)^T x_true + noise * eps``, ``x_true, eps ~ N(0, I)`` (see the
  module docstring on heterogeneity).

  ``x_star`` solves ``(A^T A / N + l2 I) x = A^T b / N`` in float64 (``np.linalg.lstsq`` on
  ``A`` when ``l2 = 0``, giving the minimum-norm minimiser if ``N < dim``).

  Args:
    num_workers: ``n >= 1``.
    examples_per_worker: ``m >= 1``.
    dim: ``d >= 1``.
    noise: target noise standard deviation, >= 0.
    l2: regularisation, >= 0.
    heterogeneity: norm of each worker's feature-mean shift, >= 0 (0: iid workers).
    condition: ratio of largest to smallest eigenvalue of ``Sigma``, >= 1.
    seed: seed of ``np.random.default_rng``, int >= 0.

  Returns:
    A :class:`SyntheticProblem` with ``name = "least_squares"``.

  Raises:
    ValueError: an argument is out of range (the message names it).
  """
  n = _check_int("num_workers", num_workers, 1)
  m = _check_int("examples_per_worker", examples_per_worker, 1)
  dim = _check_int("dim", dim, 1)
  noise = _check_real("noise", noise, 0.0)
  l2 = _check_real("l2", l2, 0.0)
  heterogeneity = _check_real("heterogeneity", heterogeneity, 0.0)
  condition = _check_real("condition", condition, 1.0)
  seed = _check_int("seed", seed, 0)

  rng = np.random.default_rng(seed)
  eigs = np.geomspace(1.0, 1.0 / condition, dim)
  sqrt_cov = _random_rotation(rng, dim) * np.sqrt(eigs)          # Q diag(sqrt(s))
  x_true = rng.standard_normal(dim)
  shifts = heterogeneity * _random_unit_vectors(rng, n, dim)       # [n, dim]
  centred = rng.standard_normal((n, m, dim)) @ sqrt_cov.T           # [n, m, dim]
  eps = rng.standard_normal((n, m))
  features = (centred + shifts[:, None, :]).astype(np.float32)
  targets = (centred @ x_true + noise * eps).astype(np.float32)

  problem = SyntheticProblem("least_squares", features, targets, l2, np.zeros(dim), 0.0)
  a, b = _stack(problem)
  big_n = a.shape[0]
  if l2 == 0.0:
    x_star = np.linalg.lstsq(a, b, rcond=None)[0]
  else:
    x_star = np.linalg.solve(a.T @ a / big_n + l2 * np.eye(dim), a.T @ b / big_n)
  problem = problem._replace(x_star=x_star)
  return problem._replace(f_star=objective(problem, x_star))


def _logistic_value_grad_hess(a: np.ndarray, b: np.ndarray, l2: float):
  """Float64 value, gradient and Hessian of the regularised logistic objective."""
  big_n = a.shape[0]

  def value(x):
    return float(np.mean(np.logaddexp(0.0, -b * (a @ x))) + 0.5 * l2 * (x @ x))

  def grad(x):
    return -(a.T @ (b * scipy.special.expit(-b * (a @ x)))) / big_n + l2 * x

  def hess(x):
    s = scipy.special.expit(a @ x)
    return (a.T * (s * (1.0 - s))) @ a / big_n + l2 * np.eye(a.shape[1])

  return value, grad, hess


def logistic(num_workers: int, examples_per_worker: int, dim: int, l2: float = 1e-2,
             heterogeneity: float = 0.0, seed: int = 0) -> SyntheticProblem:
  """Distributed l2-regularised logistic regression, labels in {-1, +1}.

  ``F(x) = mean(log(1 + exp(-b a^T x))) + (l2/2) ||x||^2``.

  Features: ``a = mu_i + z / sqrt(dim)``, ``z ~ N(0, I_dim)`` (so ``||a - mu_i|| ~ 1``), with
  ``mu_i = heterogeneity * u_i``, ``u_i`` a random unit vector. Labels:
  ``b = +1`` with probability ``sigmoid((a - mu_i)^T x_true)``, else ``-1``, where
  ``x_true ~ N(0, 4 I)`` (margins ``~ N(0, 4)``: about 22% of the labels disagree with
  ``x_true``, so the data are noisy, not separable).

  ``x_star`` is computed in float64 by ``scipy.optimize.minimize(method="Newton-CG")`` with
  the exact gradient and Hessian, polished with exact Newton steps, and checked to satisfy
  ``||grad F(x_star)||_2 <= 1e-10``.

  Args:
    num_workers: ``n >= 1``.
    examples_per_worker: ``m >= 1``.
    dim: ``d >= 1``.
    l2: regularisation, > 0 (makes the minimiser exist and be unique).
    heterogeneity: norm of each worker's feature-mean shift, >= 0 (0: iid workers).
    seed: seed of ``np.random.default_rng``, int >= 0.

  Returns:
    A :class:`SyntheticProblem` with ``name = "logistic"``.

  Raises:
    ValueError: an argument is out of range (the message names it).
    RuntimeError: the solver did not reach ``||grad F(x_star)|| <= 1e-10``.
  """
  n = _check_int("num_workers", num_workers, 1)
  m = _check_int("examples_per_worker", examples_per_worker, 1)
  dim = _check_int("dim", dim, 1)
  l2 = _check_real("l2", l2, 0.0, strict=True)
  heterogeneity = _check_real("heterogeneity", heterogeneity, 0.0)
  seed = _check_int("seed", seed, 0)

  rng = np.random.default_rng(seed)
  x_true = 2.0 * rng.standard_normal(dim)
  shifts = heterogeneity * _random_unit_vectors(rng, n, dim)       # [n, dim]
  centred = rng.standard_normal((n, m, dim)) / np.sqrt(dim)         # [n, m, dim]
  prob_pos = scipy.special.expit(centred @ x_true)                  # [n, m]
  labels = np.where(rng.uniform(size=(n, m)) < prob_pos, 1.0, -1.0)
  features = (centred + shifts[:, None, :]).astype(np.float32)
  targets = labels.astype(np.float32)

  problem = SyntheticProblem("logistic", features, targets, l2, np.zeros(dim), 0.0)
  a, b = _stack(problem)
  value, grad, hess = _logistic_value_grad_hess(a, b, l2)
  result = scipy.optimize.minimize(value, np.zeros(dim), jac=grad, hess=hess,
                                   method="Newton-CG", options={"xtol": 1e-14, "maxiter": 500})
  x_star = np.asarray(result.x, np.float64)
  # Newton-CG stops on the step size; finish with exact Newton steps (F is strongly convex
  # and we are already close, so they converge quadratically).
  for _ in range(_MAX_POLISH_STEPS):
    g = grad(x_star)
    if np.linalg.norm(g) <= _GRAD_TOL:
      break
    x_star = x_star - np.linalg.solve(hess(x_star), g)
  grad_norm = float(np.linalg.norm(grad(x_star)))
  if not grad_norm <= _GRAD_TOL:
    raise RuntimeError(
        f"logistic: could not find x_star to ||grad F|| <= {_GRAD_TOL:g} "
        f"(reached {grad_norm:.3g}; scipy: {result.message!r})")
  problem = problem._replace(x_star=x_star)
  return problem._replace(f_star=objective(problem, x_star))


# ----------------------------------------------------------------------------- evaluation


def objective(problem: SyntheticProblem, x: Any) -> float:
  """The global objective ``F(x)`` in float64 numpy over all workers' data.

  Args:
    problem: a :class:`SyntheticProblem`.
    x: array-like ``[dim]`` (numpy or jax, any float dtype; upcast to float64).

  Returns:
    ``F(x)`` as a Python float.

  Raises:
    ValueError: ``x`` does not have shape ``[dim]`` or ``problem.name`` is unknown.
  """
  _check_problem(problem)
  dim = problem.features.shape[-1]
  x = np.asarray(x, np.float64)
  if x.shape != (dim,):
    raise _err("x.shape", x.shape, f"({dim},), the problem's dim")
  a, b = _stack(problem)
  z = a @ x
  if problem.name == "least_squares":
    data = 0.5 * np.mean((z - b) ** 2)
  else:
    data = np.mean(np.logaddexp(0.0, -b * z))
  return float(data + 0.5 * problem.l2 * (x @ x))


def loss_fn(problem: SyntheticProblem) -> Callable[[Params, Batch], jax.Array]:
  """The per-batch jax loss: mean of ``f`` over the batch plus ``(l2/2) ||w||^2``.

  Pure ``jnp`` (jit / vmap / grad friendly). Over all data (:func:`global_batch`) it equals
  :func:`objective`; on one worker's data it is that worker's local objective.

  Args:
    problem: a :class:`SyntheticProblem` (only ``name`` and ``l2`` are used).

  Returns:
    ``loss(params, batch) -> scalar`` with ``params = {"w": [dim]}`` and
    ``batch = (features [B, dim], targets [B])``.

  Raises:
    ValueError: ``problem.name`` is unknown.
  """
  _check_problem(problem)
  l2 = float(problem.l2)
  name = problem.name

  def loss(params: Params, batch: Batch) -> jax.Array:
    features, targets = batch
    w = params["w"]
    z = features @ w
    if name == "least_squares":
      data = 0.5 * jnp.mean(jnp.square(z - targets))
    else:
      data = jnp.mean(jnp.logaddexp(0.0, -targets * z))
    return data + 0.5 * l2 * jnp.sum(jnp.square(w))

  return loss


def init_params(problem: SyntheticProblem) -> Params:
  """``{"w": jnp.zeros(dim, float32)}``, the starting point ``x_0 = 0``."""
  return {"w": jnp.zeros((problem.features.shape[-1],), jnp.float32)}


def pl_constants(problem: SyntheticProblem) -> tuple[float, float]:
  """PL constant ``mu`` and smoothness ``L`` of the global objective, float64.

  * least squares: exact, from the eigenvalues of the Hessian ``H = A^T A / N + l2 I``:
    ``L = lambda_max(H)`` and ``mu`` the smallest positive eigenvalue (``lambda_min(H)``
    when ``H`` is positive definite; eigenvalues below ``dim * eps * lambda_max`` count as
    zero). Least squares is mu-PL with it even when rank deficient (Karimi et al. 2016).
  * logistic: ``mu = l2`` (a lower bound: ``F`` is ``l2``-strongly convex) and
    ``L = lambda_max(A^T A) / (4 N) + l2``.

  Args:
    problem: a :class:`SyntheticProblem`.

  Returns:
    ``(mu, L)`` Python floats, ``0 < mu <= L`` (``mu = L = 0`` only for all-zero features).

  Raises:
    ValueError: ``problem.name`` is unknown.
  """
  _check_problem(problem)
  a, _ = _stack(problem)
  gram_eigs = np.linalg.eigvalsh(a.T @ a / a.shape[0])   # ascending
  if problem.name == "logistic":
    return float(problem.l2), float(gram_eigs[-1] / 4.0 + problem.l2)
  eigs = gram_eigs + problem.l2
  top = float(eigs[-1])
  positive = eigs[eigs > len(eigs) * np.finfo(np.float64).eps * top]
  mu = float(positive[0]) if positive.size else 0.0
  return mu, top


def regroup(problem: SyntheticProblem, num_workers: int) -> SyntheticProblem:
  """The same global problem over ``num_workers`` workers: consecutive shards are merged.

  ``F``, ``x_star`` and ``f_star`` are unchanged; with ``n`` original shards of ``m``
  examples, worker ``j`` of the result holds shards ``j n/p, ..., (j + 1) n/p - 1``.

  Raises:
    ValueError: ``num_workers`` does not divide the original number of workers.
  """
  _check_problem(problem)
  n, m, d = problem.features.shape
  p = _check_int("num_workers", num_workers, 1)
  if n % p:
    raise _err("num_workers", num_workers, f"it must divide the problem's {n} workers")
  return problem._replace(features=problem.features.reshape(p, (n // p) * m, d),
                          targets=problem.targets.reshape(p, (n // p) * m))


# ----------------------------------------------------------------------------- config


def problem_defaults() -> ml_collections.ConfigDict:
  """``config.problem.*`` with their defaults: synthetic PL problems (dataset least_squares | logistic; Haddadpour et al. 2019)."""
  s = ml_collections.ConfigDict()
  s.examples_per_worker = 256    # examples of each of problem.shards shards
  s.shards = 0                   # shards the problem is drawn with (0: num_workers); a
                                 # multiple of num_workers: consecutive shards are merged, so
                                 # runs with different num_workers share one global problem
  s.dim = 10                     # features d
  s.noise = 0.1                  # least_squares: std of the target noise
  s.l2 = 0.01                    # l2 regularisation of the objective
  s.heterogeneity = 0.0          # h: shift of each shard's feature mean (0: iid)
  s.condition = 10.0             # least_squares: condition number of the feature covariance
  s.seed = 0                     # seed of the problem's data
  s.full_batch = False           # every step on the worker's whole shard (exact local
                                 # gradients; batch_size is not used)
  return s


def check_config(cfg, errs: list) -> None:
  """problem.*: the synthetic problem's size and data (:mod:`nbsgd_jax.models.problems`)."""
  for key, lo in (("examples_per_worker", 1), ("shards", 0), ("dim", 1), ("seed", 0)):
    checks.integer(cfg, errs, f"problem.{key}", lo)
  for key in ("noise", "l2", "heterogeneity"):
    checks.number(cfg, errs, f"problem.{key}", 0)
  checks.number(cfg, errs, "problem.condition", 1)
  checks.boolean(cfg, errs, "problem.full_batch")
  shards, n = cfg.problem.get("shards"), cfg.get("num_workers")
  if checks.is_int(shards) and shards > 0 and checks.is_int(n) and n >= 1 and shards % n:
    errs.append(f"config.problem.shards={shards} is not allowed with config.num_workers={n}: "
                "it must be a multiple of num_workers (0: num_workers)")
