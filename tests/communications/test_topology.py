"""Topologies and mixing matrices against dense numpy and closed forms."""

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import topology

NS = (1, 2, 3, 8, 16)
TOL = 1e-12


def _builders():
  """``(label, n -> Topology or None)`` for every static graph; None where n is invalid."""
  out = []
  for w in topology.WEIGHTS:
    out += [
        (f"ring-{w}", lambda n, w=w: topology.ring(n, w)),
        (f"torus-{w}", lambda n, w=w: topology.make("torus", n, w)),
        (f"torus_1xn-{w}", lambda n, w=w: topology.torus(1, n, w)),
        (f"torus_2xn-{w}", lambda n, w=w: topology.torus(2, n // 2, w) if n % 2 == 0 else None),
        (f"exponential-{w}", lambda n, w=w: topology.exponential(n, w)),
        (f"complete-{w}", lambda n, w=w: topology.complete(n, w)),
        (f"star-{w}", lambda n, w=w: topology.star(n, w)),
        (f"erdos_renyi-{w}", lambda n, w=w: topology.erdos_renyi(n, 0.5, seed=n, weights=w)),
        (f"disconnected-{w}",
         lambda n, w=w: topology.from_edges(n, [(0, 1), (2, 3), (3, 4)], w) if n >= 5 else None),
    ]
  return out


STATIC = [(label, n, f) for label, f in _builders() for n in NS if f(n) is not None]


def _check_edges(topo):
  assert all(0 <= i < j < topo.n for i, j in topo.edges)
  assert len(set(topo.edges)) == len(topo.edges)
  assert list(topo.edges) == sorted(topo.edges)


def _check_doubly_stochastic(w, n):
  assert w.shape == (n, n) and w.dtype == np.float64
  np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=TOL)
  np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=TOL)


def _dense_slem(w):
  """Second largest |eigenvalue| of a symmetric doubly stochastic W (eigvalsh)."""
  lam = np.linalg.eigvalsh(w)
  if len(lam) == 1:
    return 0.0
  # drop one eigenvalue 1 (eigenvector 1), keep the rest
  k = int(np.argmin(np.abs(lam - 1.0)))
  return float(np.abs(np.delete(lam, k)).max())


@pytest.mark.parametrize("label,n,build", STATIC, ids=[f"{s[0]}-n{s[1]}" for s in STATIC])
def test_static_mixing_matrix(label, n, build):
  topo = build(n)
  w = topo.mixing_matrix
  assert topo.n == n and not topo.is_time_varying and topo.period == 1
  _check_edges(topo)
  np.testing.assert_array_equal(w, w.T)
  _check_doubly_stochastic(w, n)
  if "best_constant" not in label:
    assert (w >= 0).all()
  # off-diagonal support is exactly the edge set
  support = {(i, j) for i in range(n) for j in range(i + 1, n) if w[i, j] != 0}
  assert support == set(topo.edges)
  assert topology.slem(w) == pytest.approx(_dense_slem(w), abs=1e-10)
  assert topo.mixing_matrix_at(0) is w and topo.mixing_matrix_at(12345) is w
  connected = topology.is_connected(n, topo.edges)
  assert connected == ("disconnected" not in label)
  if connected:
    assert topology.spectral_gap(w) > 1e-9
  else:
    assert topology.spectral_gap(w) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n", NS + (5, 12))
def test_one_peer_exponential(n):
  topo = topology.one_peer_exponential(n)
  tau = int(np.ceil(np.log2(n))) if n > 1 else 0
  assert topo.period == max(tau, 1) == len(topo.phases)
  assert topo.is_time_varying == (n > 2)
  _check_edges(topo)
  assert topo.edges == topology.exponential(n).edges  # union over phases
  idx = np.arange(n)
  prod = np.eye(n)
  for t in range(2 * topo.period + 1):
    w = topo.mixing_matrix_at(t)
    assert w is topo.phases[t % topo.period]
    _check_doubly_stochastic(w, n)
    if n > 1:
      s = 2 ** (t % tau)
      want = 0.5 * np.eye(n)
      want[idx, (idx - s) % n] += 0.5  # worker i receives from i - s, i.e. i sends to i + s
      np.testing.assert_array_equal(w, want)
    if t < topo.period:
      prod = w @ prod
  np.testing.assert_allclose(topo.mixing_matrix, np.mean(topo.phases, axis=0), atol=TOL)
  _check_doubly_stochastic(topo.mixing_matrix, n)
  if n == 1:
    np.testing.assert_array_equal(topo.mixing_matrix, [[1.0]])
  if n == 2:
    np.testing.assert_allclose(topo.mixing_matrix_at(7), np.full((2, 2), 0.5))
  if n & (n - 1) == 0:  # power of 2: exact averaging after one period (Ying et al. 2021)
    np.testing.assert_allclose(prod, np.full((n, n), 1.0 / n), atol=1e-12)
  else:
    assert 0 < topology.slem(prod) < 1
  if n == 8:
    assert not np.allclose(topo.phases[0], topo.phases[0].T)  # not symmetric


@pytest.mark.parametrize("n", [3, 5, 8, 16])
def test_ring_metropolis_hastings_closed_form(n):
  w = topology.ring(n).mixing_matrix
  eig = (1 + 2 * np.cos(2 * np.pi * np.arange(n) / n)) / 3
  np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(w)), np.sort(eig), atol=1e-12)
  assert topology.slem(w) == pytest.approx(np.abs(eig[1:]).max(), abs=1e-12)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("weights", topology.WEIGHTS)
def test_complete_is_exact_averaging(n, weights):
  w = topology.complete(n, weights).mixing_matrix
  np.testing.assert_allclose(w, np.full((n, n), 1.0 / n), atol=1e-12)
  assert topology.slem(w) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n", [3, 8, 16])
def test_star_closed_form(n):
  topo = topology.star(n)
  assert topo.edges == tuple((0, i) for i in range(1, n))
  assert topo.degrees.tolist() == [n - 1] + [1] * (n - 1)
  for weights in ("metropolis_hastings", "uniform"):
    w = topology.mixing_matrix(n, topo.edges, weights)
    np.testing.assert_allclose(w, np.eye(n) - topology.laplacian(n, topo.edges) / n, atol=1e-15)
    assert topology.slem(w) == pytest.approx(1 - 1 / n, abs=1e-12)
  bc = topology.star(n, "best_constant").mixing_matrix
  assert topology.slem(bc) == pytest.approx((n - 1) / (n + 1), abs=1e-12)


def test_two_workers_all_weights_average_exactly():
  for weights in topology.WEIGHTS:
    for name in sorted(set(topology.TOPOLOGIES) - set(topology.FIXED_SIZE)):
      topo = topology.make(name, 2, weights, p=1.0)
      assert topo.edges == ((0, 1),)
      np.testing.assert_allclose(topo.mixing_matrix, np.full((2, 2), 0.5), atol=1e-15)


def test_single_worker():
  for weights in topology.WEIGHTS:
    for name in sorted(set(topology.TOPOLOGIES) - set(topology.FIXED_SIZE)):
      topo = topology.make(name, 1, weights, p=0.5)
      assert topo.edges == () and topo.mean_degree == 0.0
      np.testing.assert_array_equal(topo.mixing_matrix, [[1.0]])
      assert topology.slem(topo.mixing_matrix) == 0.0


def test_best_constant_definition():
  topo = topology.erdos_renyi(12, 0.4, seed=3)
  lap = topology.laplacian(12, topo.edges)
  lam = np.linalg.eigvalsh(lap)
  w = topology.mixing_matrix(12, topo.edges, "best_constant")
  np.testing.assert_allclose(w, np.eye(12) - 2 / (lam[1] + lam[-1]) * lap, atol=1e-14)
  # may be negative on the diagonal (star: 1 - 2 (n - 1) / (n + 1) < 0 for n > 3)
  assert topology.star(8, "best_constant").mixing_matrix[0, 0] < 0
  # no edges: identity
  np.testing.assert_array_equal(topology.mixing_matrix(3, [], "best_constant"), np.eye(3))


def test_best_constant_disconnected_uses_smallest_nonzero_eigenvalue():
  edges = [(0, 1), (2, 3), (3, 4)]
  lap = topology.laplacian(5, edges)
  lam = np.linalg.eigvalsh(lap)  # 0, 0, then nonzero
  w = topology.mixing_matrix(5, edges, "best_constant")
  np.testing.assert_allclose(w, np.eye(5) - 2 / (lam[2] + lam[-1]) * lap, atol=1e-14)
  eig = np.linalg.eigvalsh(w)
  assert np.sum(np.isclose(eig, 1.0)) == 2 and np.abs(eig).min() < 1  # no eigenvalue -1


@pytest.mark.parametrize("build", [
    lambda w: topology.ring(16, w), lambda w: topology.ring(7, w),
    lambda w: topology.torus(4, 4, w), lambda w: topology.torus(3, 5, w),
    lambda w: topology.torus(2, 4, w), lambda w: topology.exponential(16, w),
    lambda w: topology.star(8, w),
    lambda w: topology.erdos_renyi(16, 0.3, seed=0, weights=w),
    lambda w: topology.erdos_renyi(16, 0.5, seed=1, weights=w),
    lambda w: topology.erdos_renyi(8, 0.5, seed=2, weights=w),
], ids=["ring16", "ring7", "torus4x4", "torus3x5", "torus2x4", "exp16", "star8", "er16_03",
        "er16_05", "er8_05"])
def test_best_constant_slem_is_smallest(build):
  bc = topology.slem(build("best_constant").mixing_matrix)
  # Theorem (Xiao & Boyd 2004, Sec. 4.1): optimal among W = I - a L; uniform weights are such
  # a W, and so are MH weights on regular graphs. For the (irregular) star and ER graphs here
  # MH is checked empirically.
  assert bc <= topology.slem(build("uniform").mixing_matrix) + 1e-12
  assert bc <= topology.slem(build("metropolis_hastings").mixing_matrix) + 1e-12


def test_laplacian_and_metropolis_hastings_alias():
  topo = topology.erdos_renyi(9, 0.4, seed=5)
  lap = topology.laplacian(9, topo.edges)
  np.testing.assert_array_equal(lap, lap.T)
  np.testing.assert_allclose(lap.sum(axis=1), 0.0)
  np.testing.assert_array_equal(np.diag(lap), topo.degrees)
  assert np.linalg.eigvalsh(lap).min() > -1e-12
  np.testing.assert_array_equal(topology.metropolis_hastings(9, topo.edges), topo.mixing_matrix)


@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 2), (2, 1), (1, 5), (2, 2), (2, 3), (3, 3),
                                       (4, 4), (3, 5)])
def test_torus_edges(rows, cols):
  topo = topology.torus(rows, cols)
  n = rows * cols
  _check_edges(topo)
  expected_deg = (min(cols - 1, 2) if cols > 1 else 0) + (min(rows - 1, 2) if rows > 1 else 0)
  assert topo.degrees.tolist() == [expected_deg] * n
  if rows == 1:
    assert topo.edges == topology.ring(cols).edges
  if rows >= 3 and cols >= 3:
    assert len(topo.edges) == 2 * n


def test_torus_4x4_and_shapes():
  topo = topology.torus(4, 4)
  assert topo.degrees.tolist() == [4] * 16 and topo.mean_degree == 4.0
  nbrs = {j for i, j in topo.edges if i == 5} | {i for i, j in topo.edges if j == 5}
  assert nbrs == {1, 4, 6, 9}
  assert topology.torus_shape(16) == (4, 4)
  assert topology.torus_shape(8) == (2, 4)
  assert topology.torus_shape(12) == (3, 4)
  assert topology.torus_shape(7) == (1, 7)
  assert topology.make("torus", 8).edges == topology.torus(2, 4).edges
  assert topology.make("torus", 8, rows=4).edges == topology.torus(4, 2).edges
  assert topology.make("torus", 8, cols=8).edges == topology.ring(8).edges
  assert topology.make("torus", 7).edges == topology.ring(7).edges


def test_exponential_neighbours():
  topo = topology.exponential(8)
  nbrs = {j for i, j in topo.edges if i == 0} | {i for i, j in topo.edges if j == 0}
  assert nbrs == {1, 2, 4, 6, 7}
  assert topo.degrees.tolist() == [5] * 8
  assert topology.exponential(16).degrees.tolist() == [7] * 16
  assert topology.exponential(3).edges == topology.complete(3).edges
  assert topology.exponential(5).degrees.tolist() == [4] * 5  # +-1, +-2, +-4 = -+1 mod 5


def test_erdos_renyi_connected_and_reproducible():
  a = topology.erdos_renyi(16, 0.3, seed=0)
  b = topology.make("erdos_renyi", 16, p=0.3, seed=0)
  c = topology.erdos_renyi(16, 0.3, seed=1)
  assert a.edges == b.edges and a.edges != c.edges
  np.testing.assert_array_equal(a.mixing_matrix, b.mixing_matrix)
  for seed in range(5):
    topo = topology.erdos_renyi(10, 0.2, seed=seed)
    assert topology.is_connected(10, topo.edges)
    assert topology.spectral_gap(topo.mixing_matrix) > 1e-9
  assert topology.erdos_renyi(6, 1.0).edges == topology.complete(6).edges


def test_static_time_api():
  topo = topology.ring(5)
  assert topo.period == 1 and topo.phases == () and not topo.is_time_varying
  assert topo.mixing_matrix_at(np.int64(3)) is topo.mixing_matrix


def test_from_edges_degenerate():
  topo = topology.from_edges(4, [(1, 0), (0, 1), (1, 0), (2, 3), (np.int64(3), 2.0)])
  assert topo.edges == ((0, 1), (2, 3))
  assert topology.from_edges(4, []).edges == ()
  np.testing.assert_array_equal(topology.from_edges(4, []).mixing_matrix, np.eye(4))
  assert topology.spectral_gap(topology.from_edges(4, []).mixing_matrix) == pytest.approx(0.0)


@pytest.mark.parametrize("call,match", [
    (lambda: topology.ring(0), "n=0"),
    (lambda: topology.star(-1), "n=-1"),
    (lambda: topology.exponential(2.0), "n=2.0"),
    (lambda: topology.one_peer_exponential(True), "n=True"),
    (lambda: topology.torus(0, 4), "rows=0"),
    (lambda: topology.torus(4, 0), "cols=0"),
    (lambda: topology.ring(4, "max_degree"), "weights='max_degree'"),
    (lambda: topology.make("ring", 4, "max_degree"), "weights='max_degree'"),
    (lambda: topology.make("one_peer_exponential", 4, "max_degree"), "weights='max_degree'"),
    (lambda: topology.make("moebius", 4), "topology='moebius'.*one_peer_exponential"),
    (lambda: topology.make("torus", 16, rows=3), "topology_rows=3"),
    (lambda: topology.make("torus", 16, cols=5), "topology_cols=5"),
    (lambda: topology.make("torus", 16, rows=2, cols=4), "topology_rows=2.*n=16"),
    (lambda: topology.make("torus", 16, rows=0, cols=4), "topology_rows=0"),
    (lambda: topology.make("erdos_renyi", 8), "topology_p=None"),
    (lambda: topology.make("erdos_renyi", 8, p=0.0), "topology_p=0.0"),
    (lambda: topology.make("erdos_renyi", 8, p=1.5), "topology_p=1.5"),
    (lambda: topology.make("erdos_renyi", 8, p=True), "topology_p=True"),
    (lambda: topology.make("erdos_renyi", 8, p=0.5, seed=-1), "topology_seed=-1"),
    (lambda: topology.make("erdos_renyi", 16, p=0.01), "topology_p=0.01.*n=16"),
    (lambda: topology.erdos_renyi(16, 0.01, seed=0), "p=0.01 is not allowed for n=16"),
    (lambda: topology.erdos_renyi(8, -0.1), "p=-0.1"),
    (lambda: topology.erdos_renyi(8, 0.5, seed=1.5), "seed=1.5"),
    (lambda: topology.from_edges(3, [(1, 1)]), "self loop"),
    (lambda: topology.from_edges(3, [(0, 3)]), "out of range"),
    (lambda: topology.from_edges(3, [(-1, 2)]), "out of range"),
    (lambda: topology.from_edges(3, [(0, 1, 2)]), "pair"),
    (lambda: topology.from_edges(3, [5]), "pair"),
    (lambda: topology.from_edges(3, [(0, 1.5)]), "integers"),
    (lambda: topology.laplacian(3, [(0, 4)]), "out of range"),
    (lambda: topology.ring(4).mixing_matrix_at(-1), "t=-1"),
    (lambda: topology.one_peer_exponential(8).mixing_matrix_at(2.0), "t=2.0"),
    (lambda: topology.Topology("x", 2, (), np.eye(2), period=2), "period=2"),
])
def test_bad_inputs(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_matcha_graph0_is_matchas_base_graph():
  # JYWa/MATCHA util.py select_graph(0), as its list of matchings
  matchings = [[(1, 5), (6, 7), (0, 4), (2, 3)], [(1, 7), (3, 6)], [(1, 0), (3, 7), (5, 6)],
               [(1, 2), (7, 0)], [(3, 1)]]
  want = {tuple(sorted(e)) for m in matchings for e in m}
  t = topology.make("matcha_graph0", 8)
  assert {tuple(sorted(e)) for e in t.edges} == want and len(want) == 12
  assert topology.is_connected(8, t.edges)
  with pytest.raises(ValueError, match="num_workers=16"):
    topology.make("matcha_graph0", 16)
  errs = []
  cfg = config_lib.default_config()
  cfg.topology, cfg.num_workers = "matcha_graph0", 16
  topology.check_config(cfg, errs)
  assert errs and "matcha_graph0" in errs[0]
