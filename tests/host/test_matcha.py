"""Tests for nbsgd_jax.topology.matcha: matchings, activation probabilities, alpha and rho."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nbsgd_jax.topology import matchings as matchings_lib
from nbsgd_jax import topology
from nbsgd_jax.topology import matcha

import cvxpy  # noqa: F401,E402  (a required dependency: fail, never skip)


# --------------------------------------------------------------------------------------
# Helpers (numpy only).


def _gnp_edges(n: int, p: float, rng: np.random.Generator) -> list[tuple[int, int]]:
  upper = rng.random((n, n)) < p
  return [(i, j) for i in range(n) for j in range(i + 1, n) if upper[i, j]]


def _laplacian(n: int, edges) -> np.ndarray:
  lap = np.zeros((n, n))
  for i, j in edges:
    lap[i, i] += 1
    lap[j, j] += 1
    lap[i, j] -= 1
    lap[j, i] -= 1
  return lap


def _connected_gnp(n: int, p: float, seed: int) -> list[tuple[int, int]]:
  rng = np.random.default_rng(seed)
  while True:
    edges = _gnp_edges(n, p, rng)
    if np.sort(np.linalg.eigvalsh(_laplacian(n, edges)))[1] > 1e-9:
      return edges


def _star_edges(n: int) -> list[tuple[int, int]]:
  return [(0, i) for i in range(1, n)]


def _lambda2(n: int, matchings, probs) -> float:
  lap = np.tensordot(probs, matchings_lib.matching_laplacians(n, matchings), axes=1)
  return float(np.sort(np.linalg.eigvalsh(lap))[1])


def _check_decomposition(n: int, edges) -> list:
  ms = matchings_lib.matching_decomposition(n, edges)
  want = sorted({(min(i, j), max(i, j)) for i, j in edges})
  got = [e for m in ms for e in m]
  assert sorted(got) == want, "every edge exactly once"
  assert len(got) == len(set(got))
  for m in ms:
    assert m, "no empty matching"
    ends = [v for e in m for v in e]
    assert len(ends) == len(set(ends)), f"{m} is not a matching"
    assert all(i < j for i, j in m)
  deg = np.zeros(n, dtype=int)
  for i, j in want:
    deg[i] += 1
    deg[j] += 1
  assert len(ms) <= (deg.max() + 1 if want else 0), "Vizing / Misra-Gries bound"
  assert len(ms) >= (deg.max() if want else 0)
  return ms


# --------------------------------------------------------------------------------------
# Step 1: matching decomposition.


@pytest.mark.parametrize("n", range(1, 13))
def test_decomposition_ring(n):
  _check_decomposition(n, topology.ring(n).edges)


@pytest.mark.parametrize("n", range(2, 10))
def test_decomposition_complete(n):
  ms = _check_decomposition(n, topology.complete(n).edges)
  # K_n needs n - 1 colours for even n and n for odd n.
  assert len(ms) in (n - 1, n)


@pytest.mark.parametrize("n", [2, 3, 5, 9, 17])
def test_decomposition_star(n):
  ms = _check_decomposition(n, _star_edges(n))
  assert len(ms) == n - 1 and all(len(m) == 1 for m in ms)


def test_decomposition_random_graphs():
  rng = np.random.default_rng(1234)
  for _ in range(300):
    n = int(rng.integers(1, 25))
    _check_decomposition(n, _gnp_edges(n, float(rng.uniform(0.05, 1.0)), rng))


def test_decomposition_all_graphs_up_to_5_nodes():
  for n in range(1, 6):
    pairs = list(itertools.combinations(range(n), 2))
    for mask in range(1 << len(pairs)):
      _check_decomposition(n, [e for k, e in enumerate(pairs) if mask >> k & 1])


def test_decomposition_is_deterministic_and_ignores_order():
  edges = _gnp_edges(15, 0.4, np.random.default_rng(7))
  a = matchings_lib.matching_decomposition(15, edges)
  b = matchings_lib.matching_decomposition(15, [(j, i) for i, j in reversed(edges)] + edges[:3])
  assert a == b == matchings_lib.matching_decomposition(15, edges)


def test_decomposition_empty():
  assert matchings_lib.matching_decomposition(1, []) == []
  assert matchings_lib.matching_decomposition(5, []) == []


@pytest.mark.parametrize("edge, word", [((0, 0), r"\(0, 0\)"), ((0, 5), r"\(0, 5\)"),
                                        ((-1, 2), r"\(-1, 2\)"), ((0, 1, 2), r"\(0, 1, 2\)")])
def test_decomposition_bad_edges(edge, word):
  with pytest.raises(ValueError, match=word):
    matchings_lib.matching_decomposition(5, [(1, 2), edge])


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_bad_n(n):
  with pytest.raises(ValueError, match="n="):
    matchings_lib.matching_decomposition(n, [])


def test_laplacians_and_permutation():
  n = 11
  edges = _connected_gnp(n, 0.4, 3)
  ms = matchings_lib.matching_decomposition(n, edges)
  lap = matchings_lib.matching_laplacians(n, ms)
  assert lap.shape == (len(ms), n, n)
  np.testing.assert_allclose(lap.sum(0), _laplacian(n, edges))
  for lj, m in zip(lap, ms):
    np.testing.assert_allclose(lj @ lj, 2 * lj)  # L_j^2 = 2 L_j for a matching
    perm = matchings_lib.matching_permutation(n, m)
    assert sorted(perm) == list(range(n))
    assert all(perm[perm[i]] == i for i in range(n))
    assert {(min(i, p), max(i, p)) for i, p in enumerate(perm) if p != i} == set(m)
  assert matchings_lib.matching_laplacians(4, []).shape == (0, 4, 4)
  with pytest.raises(ValueError, match="matchings"):
    matchings_lib.matching_permutation(4, [(0, 1), (1, 2)])
  with pytest.raises(ValueError, match="matchings"):
    matchings_lib.matching_laplacians(4, [[(0, 1)], [(1, 0)]])


# --------------------------------------------------------------------------------------
# Step 2: activation probabilities.


def test_activation_probabilities():
  n = 12
  ms = matchings_lib.matching_decomposition(n, _connected_gnp(n, 0.35, 5))
  m = len(ms)
  np.testing.assert_array_equal(matcha.activation_probabilities(n, ms, 1.0), np.ones(m))
  lam = []
  for budget in (0.1, 0.25, 0.5, 0.75, 1.0):
    p = matcha.activation_probabilities(n, ms, budget)
    assert p.shape == (m,)
    assert np.all(p >= 0) and np.all(p <= 1)
    assert p.sum() <= m * budget + 1e-6
    lam.append(_lambda2(n, ms, p))
    # At least as good as spending the budget uniformly.
    assert lam[-1] >= _lambda2(n, ms, np.full(m, budget)) - 1e-6
  assert all(b > a + 1e-4 for a, b in zip(lam, lam[1:])), lam


@pytest.mark.parametrize("budget", [0.0, -0.1, 1.5, float("nan"), True, "x", None])
def test_bad_budget(budget):
  ms = matchings_lib.matching_decomposition(4, topology.ring(4).edges)
  with pytest.raises(ValueError, match="budget"):
    matcha.activation_probabilities(4, ms, budget)
  with pytest.raises(ValueError, match="budget"):
    matcha.plan(4, topology.ring(4).edges, budget)


# --------------------------------------------------------------------------------------
# Step 3: alpha and rho.


def _mc_rho(n, ms, probs, alpha, draws=20000, seed=0) -> float:
  lap = matchings_lib.matching_laplacians(n, ms)
  b = np.random.default_rng(seed).random((draws, len(ms))) < probs
  w = np.eye(n) - alpha * np.tensordot(b.astype(np.float64), lap, axes=1)  # [draws, n, n]
  ewtw = np.einsum("dki,dkj->ij", w, w) / draws
  return float(np.linalg.norm(ewtw - np.full((n, n), 1.0 / n), ord=2))


@pytest.mark.parametrize("budget", [0.2, 0.5])
def test_expected_rho_matches_monte_carlo(budget):
  n = 10
  pl = matcha.plan(n, _connected_gnp(n, 0.4, 11), budget)
  assert 0.0 < pl.rho < 1.0
  assert abs(pl.rho - _mc_rho(n, pl.matchings, pl.probs, pl.alpha)) < 1e-2
  # Also at a non-optimal alpha.
  rho = matcha.expected_rho(n, pl.matchings, pl.probs, 0.7 * pl.alpha)
  assert abs(rho - _mc_rho(n, pl.matchings, pl.probs, 0.7 * pl.alpha, seed=1)) < 1e-2


@pytest.mark.parametrize("edges_fn", [lambda: topology.ring(8).edges,
                                      lambda: _connected_gnp(9, 0.4, 2),
                                      lambda: _star_edges(6)])
def test_budget_one_is_best_constant_weight(edges_fn):
  edges = edges_fn()
  n = 1 + max(max(e) for e in edges)
  pl = matcha.plan(n, edges, 1.0)
  np.testing.assert_array_equal(pl.probs, np.ones(len(pl.matchings)))
  lap = _laplacian(n, edges)
  w = np.eye(n) - pl.alpha * lap
  # All p = 1: E[W^T W] = W^2, so rho = slem(W)^2.
  assert pl.rho == pytest.approx(topology.slem(w) ** 2, abs=1e-9)
  grid = np.linspace(0.0, 1.0, 20001)
  slems = [topology.slem(np.eye(n) - a * lap) ** 2 for a in grid]
  assert pl.rho <= min(slems) + 1e-9
  assert pl.alpha == pytest.approx(grid[int(np.argmin(slems))], abs=1e-4)
  ev = np.linalg.eigvalsh(lap)
  assert pl.alpha == pytest.approx(2.0 / (ev[1] + ev[-1]), abs=1e-6)


@pytest.mark.parametrize("budget", [0.15, 0.4, 0.8])
def test_alpha_minimises_expected_rho(budget):
  n = 12
  edges = _connected_gnp(n, 0.3, 4)
  pl = matcha.plan(n, edges, budget)
  grid = np.linspace(0.0, 1.5, 3001)
  rhos = np.array([matcha.expected_rho(n, pl.matchings, pl.probs, a) for a in grid])
  assert pl.rho <= rhos.min() + 1e-9
  assert pl.alpha == pytest.approx(grid[int(np.argmin(rhos))], abs=2e-3)
  raw = matcha.mixing_alpha(n, pl.matchings, pl.probs, polish=False)  # the SDP's own answer
  assert raw == pytest.approx(pl.alpha, abs=1e-3)
  assert matcha.expected_rho(n, pl.matchings, pl.probs, raw) == pytest.approx(pl.rho, abs=1e-6)


def test_degenerate_graphs():
  pl = matcha.plan(1, [], 0.5)
  assert pl.matchings == [] and pl.probs.shape == (0,) and pl.alpha == 0.0 and pl.rho == 0.0
  pl = matcha.plan(4, [], 0.5)
  assert pl.alpha == 0.0 and pl.rho == pytest.approx(1.0)
  np.testing.assert_allclose(matcha.sample_mixing_matrix(pl, np.zeros(0, bool)), np.eye(4))
  # Disconnected: two triangles. rho cannot drop below 1.
  edges = [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)]
  pl = matcha.plan(6, edges, 0.5)
  assert pl.rho >= 1.0 - 1e-6


def test_bad_probs_and_alpha():
  ms = matchings_lib.matching_decomposition(5, topology.ring(5).edges)
  m = len(ms)
  for probs in (np.ones(m + 1), np.full(m, 1.2), np.full(m, -0.1), np.full(m, np.nan)):
    with pytest.raises(ValueError, match="probs"):
      matcha.mixing_alpha(5, ms, probs)
    with pytest.raises(ValueError, match="probs"):
      matcha.expected_rho(5, ms, probs, 0.3)
  for alpha in (-0.1, float("inf"), "a", True):
    with pytest.raises(ValueError, match="alpha"):
      matcha.expected_rho(5, ms, np.ones(m), alpha)


# --------------------------------------------------------------------------------------
# Plan helpers.


def test_sample_mixing_matrix_and_bytes():
  n = 10
  edges = _connected_gnp(n, 0.4, 8)
  pl = matcha.plan(n, edges, 0.3)
  m = len(pl.matchings)
  rng = np.random.default_rng(0)
  for _ in range(20):
    active = rng.random(m) < pl.probs
    w = matcha.sample_mixing_matrix(pl, active)
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(1), np.ones(n))
  np.testing.assert_allclose(matcha.sample_mixing_matrix(pl, np.ones(m, bool)),
                             np.eye(n) - pl.alpha * _laplacian(n, edges), atol=1e-12)
  with pytest.raises(ValueError, match="active"):
    matcha.sample_mixing_matrix(pl, np.ones(m + 1, bool))

  want = sum(p * 2 * len(mj) / n for p, mj in zip(pl.probs, pl.matchings)) * 4e6
  assert matcha.expected_bytes_per_step(pl, 4e6) == pytest.approx(want)
  # Budget 1: every worker sends one model per neighbour (mean degree).
  full = matcha.plan(n, edges, 1.0)
  assert matcha.expected_bytes_per_step(full, 1.0) == pytest.approx(2 * len(edges) / n)
  for bad in (-1.0, float("nan"), "x"):
    with pytest.raises(ValueError, match="model_bytes"):
      matcha.expected_bytes_per_step(pl, bad)


def test_scs_fallback_agrees(monkeypatch):
  n = 10
  edges = _connected_gnp(n, 0.4, 8)
  ref = matcha.plan(n, edges, 0.3)
  monkeypatch.setattr(matcha, "_SOLVERS", ("SCS",))
  scs = matcha.plan(n, edges, 0.3)
  assert scs.probs.sum() <= len(scs.matchings) * 0.3 + 1e-6
  assert _lambda2(n, scs.matchings, scs.probs) == pytest.approx(
      _lambda2(n, ref.matchings, ref.probs), abs=1e-4)
  assert scs.rho == pytest.approx(ref.rho, abs=1e-4)
