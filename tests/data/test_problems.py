"""Tests for nbsgd_jax.models.problems: seeded synthetic PL problems with a known optimum."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.special

from nbsgd_jax.models import problems

N_WORKERS, M, DIM = 4, 32, 6


def _stacked64(prob: problems.SyntheticProblem) -> tuple[np.ndarray, np.ndarray]:
  n, m, d = prob.features.shape
  return (prob.features.reshape(n * m, d).astype(np.float64),
          prob.targets.reshape(n * m).astype(np.float64))


def _ls_grad(prob, x):
  a, b = _stacked64(prob)
  return a.T @ (a @ x - b) / a.shape[0] + prob.l2 * x


def _logistic_grad(prob, x):
  a, b = _stacked64(prob)
  return -a.T @ (b * scipy.special.expit(-b * (a @ x))) / a.shape[0] + prob.l2 * x


def _jax_grad_all(prob, x):
  loss = problems.loss_fn(prob)
  batch = problems.global_batch(prob)
  g = jax.jit(jax.grad(loss))({"w": jnp.asarray(x, jnp.float32)}, batch)["w"]
  return np.asarray(g, np.float64)


@pytest.fixture(scope="module")
def ls() -> problems.SyntheticProblem:
  return problems.least_squares(N_WORKERS, M, DIM, noise=0.1, l2=0.0, heterogeneity=0.5,
                                condition=10.0, seed=0)


@pytest.fixture(scope="module")
def ls_l2() -> problems.SyntheticProblem:
  return problems.least_squares(N_WORKERS, M, DIM, noise=0.3, l2=0.05, seed=1)


@pytest.fixture(scope="module")
def logi() -> problems.SyntheticProblem:
  return problems.logistic(N_WORKERS, M, DIM, l2=1e-2, heterogeneity=0.3, seed=0)


BUILDERS = {
    "least_squares": lambda seed: problems.least_squares(3, 16, 5, heterogeneity=1.0, seed=seed),
    "logistic": lambda seed: problems.logistic(3, 16, 5, heterogeneity=1.0, seed=seed),
}


# ----------------------------------------------------------------------------- seeding


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_same_seed_identical_different_seed_differs(name):
  p1, p2, p3 = BUILDERS[name](7), BUILDERS[name](7), BUILDERS[name](8)
  for field in ("features", "targets", "x_star"):
    np.testing.assert_array_equal(getattr(p1, field), getattr(p2, field))
    assert not np.array_equal(getattr(p1, field), getattr(p3, field)), field
  assert p1.f_star == p2.f_star
  assert p1.f_star != p3.f_star


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_shapes_and_dtypes(name):
  prob = BUILDERS[name](0)
  assert prob.name == name
  chex.assert_shape(prob.features, (3, 16, 5))
  chex.assert_shape(prob.targets, (3, 16))
  chex.assert_shape(prob.x_star, (5,))
  assert prob.features.dtype == np.float32
  assert prob.targets.dtype == np.float32
  assert prob.x_star.dtype == np.float64
  assert isinstance(prob.f_star, float) and isinstance(prob.l2, float)
  params = problems.init_params(prob)
  chex.assert_shape(params["w"], (5,))
  chex.assert_type(params["w"], jnp.float32)
  np.testing.assert_array_equal(params["w"], 0.0)
  if name == "logistic":
    assert set(np.unique(prob.targets)) == {-1.0, 1.0}


def test_dim_one_and_single_worker():
  prob = problems.least_squares(1, 3, 1, condition=1.0)
  chex.assert_shape(prob.features, (1, 3, 1))
  np.testing.assert_allclose(_ls_grad(prob, prob.x_star), 0.0, atol=1e-12)


# ----------------------------------------------------------------------------- least squares


@pytest.mark.parametrize("fixture", ["ls", "ls_l2"])
def test_least_squares_optimum(fixture, request):
  prob = request.getfixturevalue(fixture)
  a, b = _stacked64(prob)
  big_n = a.shape[0]
  # Independent reference: lstsq on the augmented system [A / sqrt(N); sqrt(l2) I].
  a_aug = np.vstack([a / np.sqrt(big_n), np.sqrt(prob.l2) * np.eye(DIM)])
  b_aug = np.concatenate([b / np.sqrt(big_n), np.zeros(DIM)])
  ref = np.linalg.lstsq(a_aug, b_aug, rcond=None)[0]
  np.testing.assert_allclose(prob.x_star, ref, rtol=1e-6, atol=1e-9)
  # Exact float64 gradient ~ 0, and the float32 jax gradient ~ 0.
  np.testing.assert_allclose(_ls_grad(prob, prob.x_star), 0.0, atol=1e-10)
  np.testing.assert_allclose(_jax_grad_all(prob, prob.x_star), 0.0, atol=2e-5)
  assert problems.objective(prob, prob.x_star) == prob.f_star
  rng = np.random.default_rng(0)
  for scale in (1e-3, 1e-1, 1.0):
    for _ in range(5):
      assert problems.objective(prob, prob.x_star + scale * rng.standard_normal(DIM)) > prob.f_star


def test_least_squares_scipy_reference(ls_l2):
  ref = scipy.optimize.minimize(lambda x: problems.objective(ls_l2, x), np.zeros(DIM),
                                jac=lambda x: _ls_grad(ls_l2, x), method="BFGS",
                                options={"gtol": 1e-12})
  np.testing.assert_allclose(ref.x, ls_l2.x_star, rtol=1e-6, atol=1e-8)
  np.testing.assert_allclose(ref.fun, ls_l2.f_star, rtol=1e-10)


# ----------------------------------------------------------------------------- objective vs jax


@pytest.mark.parametrize("fixture", ["ls", "ls_l2", "logi"])
def test_objective_matches_jax_loss(fixture, request):
  prob = request.getfixturevalue(fixture)
  loss = jax.jit(problems.loss_fn(prob))
  batch = problems.global_batch(prob)
  rng = np.random.default_rng(1)
  for _ in range(5):
    x = rng.standard_normal(DIM).astype(np.float32)
    want = problems.objective(prob, x)
    got = float(loss({"w": jnp.asarray(x)}, batch))
    np.testing.assert_allclose(got, want, rtol=2e-5)
    # Also the mean of the per-worker losses (equal m per worker) via vmap.
    per_worker = jax.vmap(loss, in_axes=(None, 0))(
        {"w": jnp.asarray(x)}, (prob.features, prob.targets))
    np.testing.assert_allclose(float(jnp.mean(per_worker)), want, rtol=2e-5)
  # jax gradient agrees with the exact numpy gradient formula.
  grad_np = _ls_grad if prob.name == "least_squares" else _logistic_grad
  x = rng.standard_normal(DIM)
  np.testing.assert_allclose(_jax_grad_all(prob, x), grad_np(prob, x), rtol=1e-4, atol=1e-5)


def test_objective_rejects_bad_shape(ls):
  with pytest.raises(ValueError, match="x.shape"):
    problems.objective(ls, np.zeros(DIM + 1))


# ----------------------------------------------------------------------------- logistic


def test_logistic_optimum(logi):
  g = _logistic_grad(logi, logi.x_star)
  assert np.linalg.norm(g) <= 1e-10
  np.testing.assert_allclose(_jax_grad_all(logi, logi.x_star), 0.0, atol=2e-5)
  assert problems.objective(logi, logi.x_star) == logi.f_star
  rng = np.random.default_rng(2)
  for scale in (1e-3, 1e-1, 1.0, 10.0):
    for _ in range(5):
      x = logi.x_star + scale * rng.standard_normal(DIM)
      assert problems.objective(logi, x) > logi.f_star
  # Labels are noisy but informative: x_star classifies better than chance.
  a, b = _stacked64(logi)
  assert np.mean(np.sign(a @ logi.x_star) == b) > 0.6


# ----------------------------------------------------------------------------- PL constants


@pytest.mark.parametrize("fixture", ["ls", "ls_l2"])
def test_pl_inequality_least_squares(fixture, request):
  prob = request.getfixturevalue(fixture)
  mu, lip = problems.pl_constants(prob)
  assert lip >= mu > 0
  a, _ = _stacked64(prob)
  eigs = np.linalg.eigvalsh(a.T @ a / a.shape[0] + prob.l2 * np.eye(DIM))
  np.testing.assert_allclose([mu, lip], [eigs[0], eigs[-1]], rtol=1e-10)
  rng = np.random.default_rng(3)
  for scale in (1e-2, 1.0, 10.0):
    for _ in range(10):
      x = prob.x_star + scale * rng.standard_normal(DIM)
      g = _ls_grad(prob, x)
      gap = problems.objective(prob, x) - prob.f_star
      assert 0.5 * g @ g >= mu * gap * (1 - 1e-9)
      # L-smoothness: F(x) - F* <= (L/2) ||x - x*||^2.
      assert gap <= 0.5 * lip * np.sum((x - prob.x_star) ** 2) * (1 + 1e-9)


def test_pl_rank_deficient_least_squares():
  prob = problems.least_squares(1, 3, 6, l2=0.0, seed=0)   # N = 3 < dim = 6
  mu, lip = problems.pl_constants(prob)
  assert lip >= mu > 0
  np.testing.assert_allclose(_ls_grad(prob, prob.x_star), 0.0, atol=1e-10)
  rng = np.random.default_rng(4)
  for _ in range(10):
    x = rng.standard_normal(6)
    g = _ls_grad(prob, x)
    assert 0.5 * g @ g >= mu * (problems.objective(prob, x) - prob.f_star) * (1 - 1e-9)


def test_pl_constants_logistic(logi):
  mu, lip = problems.pl_constants(logi)
  assert mu == logi.l2
  assert lip >= mu > 0
  rng = np.random.default_rng(5)
  for _ in range(10):
    x = logi.x_star + rng.standard_normal(DIM)
    g = _logistic_grad(logi, x)
    gap = problems.objective(logi, x) - logi.f_star
    assert 0.5 * g @ g >= mu * gap
    assert gap <= 0.5 * lip * np.sum((x - logi.x_star) ** 2)


# ----------------------------------------------------------------------------- heterogeneity


def _mean_local_optimum_distance(prob) -> float:
  local = [np.linalg.lstsq(prob.features[i].astype(np.float64),
                           prob.targets[i].astype(np.float64), rcond=None)[0]
           for i in range(prob.features.shape[0])]
  n = len(local)
  return float(np.mean([np.linalg.norm(local[i] - local[j])
                        for i in range(n) for j in range(i + 1, n)]))


def test_heterogeneity_separates_local_optima():
  dists = [_mean_local_optimum_distance(
      problems.least_squares(N_WORKERS, 64, DIM, heterogeneity=h, seed=0))
           for h in (0.0, 0.3, 1.0, 3.0)]
  assert all(d1 < d2 for d1, d2 in zip(dists, dists[1:])), dists
  assert dists[-1] > 10 * dists[0], dists


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("builder, kwargs, arg", [
    ("least_squares", {"num_workers": 0}, "num_workers"),
    ("least_squares", {"num_workers": 2.0}, "num_workers"),
    ("least_squares", {"num_workers": True}, "num_workers"),
    ("least_squares", {"examples_per_worker": 0}, "examples_per_worker"),
    ("least_squares", {"dim": 0}, "dim"),
    ("least_squares", {"noise": -0.1}, "noise"),
    ("least_squares", {"noise": float("nan")}, "noise"),
    ("least_squares", {"l2": -1e-3}, "l2"),
    ("least_squares", {"heterogeneity": -1.0}, "heterogeneity"),
    ("least_squares", {"heterogeneity": float("inf")}, "heterogeneity"),
    ("least_squares", {"condition": 0.5}, "condition"),
    ("least_squares", {"seed": -1}, "seed"),
    ("logistic", {"num_workers": -2}, "num_workers"),
    ("logistic", {"examples_per_worker": 1.5}, "examples_per_worker"),
    ("logistic", {"dim": 0}, "dim"),
    ("logistic", {"l2": 0.0}, "l2"),
    ("logistic", {"l2": -1.0}, "l2"),
    ("logistic", {"heterogeneity": -0.5}, "heterogeneity"),
])
def test_bad_inputs_raise(builder, kwargs, arg):
  args = {"num_workers": 2, "examples_per_worker": 4, "dim": 3, **kwargs}
  with pytest.raises(ValueError, match=rf"^{arg}=.* is not allowed"):
    getattr(problems, builder)(**args)


def test_unknown_problem_name_raises(ls):
  bad = ls._replace(name="hinge")
  for fn in (problems.loss_fn, problems.pl_constants, lambda p: problems.objective(p, p.x_star)):
    with pytest.raises(ValueError, match="problem.name"):
      fn(bad)
