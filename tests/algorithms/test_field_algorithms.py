"""CHOCO-SGD, gradient tracking, D^2, Gossip-PGA and the QSGD / sign codecs against dense numpy
transcriptions of the papers' pseudo-code (vmap and mesh, n in {2, 5, 8})."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from nbsgd_jax import codecs, topology, train
from nbsgd_jax.codecs import sparse as compression
from nbsgd_jax import transforms as T
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.communications import AllReduce, CompressedGossip, Gossip
from nbsgd_jax.transforms import StepContext
from nbsgd_jax.transforms import decentralized as D
from tests.helpers import slow_except

from tests.helpers import experiment_config, run_steps, small_cfg

LR, STEPS, DIM = 0.1, 6, 12


def _problem(n, seed=0, m=6):
  """Worker i's quadratic f_i(x) = 0.5 ||A_i x - b_i||^2 / m (heterogeneous b_i)."""
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(n, m, DIM)).astype(np.float32)
  b = (rng.normal(size=(n, m)) + 3 * rng.normal(size=(n, 1))).astype(np.float32)
  x0 = rng.normal(size=(n, DIM)).astype(np.float32)
  return a, b, x0


def _grad_np(a, b, x):
  """[n, d] local gradients at the rows of x (float64)."""
  a, b, x = (np.asarray(v, np.float64) for v in (a, b, x))
  r = np.einsum("nmd,nd->nm", a, x) - b
  return np.einsum("nmd,nm->nd", a, r) / a.shape[1]


def _mapped(runner, f, n):
  """``f`` (one worker's program) over a leading worker axis of n, jitted once."""
  if runner == "vmap":
    return jax.jit(jax.vmap(f, axis_name=AXIS))
  mesh = jax.make_mesh((n,), (AXIS,), devices=jax.devices()[:n])

  def per_device(xb):
    out = f(jax.tree.map(lambda leaf: leaf[0], xb))
    return jax.tree.map(lambda leaf: leaf[None], out)

  fn = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
  return lambda tree: fn(jax.device_put(tree, NamedSharding(mesh, P(AXIS))))


def _drive(transform, a, b, x0, runner, steps=STEPS, period_end=lambda t: True):
  """``steps`` steps of ``transform`` on the quadratics; returns the models [steps+1, n, d],
  the states and the reports."""
  n = x0.shape[0]

  def step(carry, flag):
    x, state, a_i, b_i, t = carry
    g = jax.grad(lambda w: 0.5 * jnp.mean((a_i @ w - b_i) ** 2))(x)
    ctx = StepContext(t, jnp.int32(1), jnp.int32(n), jnp.zeros((1,), bool), period_end=flag)
    u, state, report = transform.update(g, state, x, ctx)
    return optax.apply_updates(x, u), state, report.get("bytes_sent", jnp.float32(0))

  state = jax.vmap(transform.init)(jnp.asarray(x0))
  xs, x, states, sent = [x0], jnp.asarray(x0), [], []
  programs = {flag: _mapped(runner, lambda c, flag=flag: step(c, flag), n)
              for flag in (False, True)}
  for t in range(steps):
    tt = jnp.full((n,), t, jnp.int32)
    x, state, bytes_ = programs[bool(period_end(t))](
        (x, state, jnp.asarray(a), jnp.asarray(b), tt))
    xs.append(np.asarray(x))
    states.append(state)
    sent.append(np.asarray(bytes_))
  return np.stack(xs), states, sent


def _ring(n):
  return topology.make("ring", n).mixing_matrix


def _top_rows(v, k):
  """Top-k by magnitude of each row (dense numpy)."""
  out = np.zeros_like(v)
  for i, row in enumerate(v):
    idx = np.argsort(-np.abs(row), kind="stable")[:k]
    out[i, idx] = row[idx]
  return out


# ----------------------------------------------------------------------------- CHOCO-SGD


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n", slow_except([2, 5, 8], fast=(5,)))
def test_choco_sgd_matches_algorithm_2(n, runner):
  """Koloskova et al. 2019, Algorithm 2, transcribed: x_hat starts at 0; q_i = Q(x_half -
  x_hat_i); x_hat_j += q_j; x_i = x_half + gamma sum_j w_ij (x_hat_j - x_hat_i)."""
  a, b, x0 = _problem(n)
  w, gamma, density = _ring(n), 0.4, 0.25
  k = compression.num_selected(DIM, density)
  codec = codecs.make_codec("top_k", density=density)
  t = D.choco_sgd(optax.sgd(LR), CompressedGossip([w]), codec, gamma)
  xs, states, sent = _drive(t, a, b, x0, runner)
  x, xh = x0.astype(np.float64), np.zeros((n, DIM))
  for step in range(STEPS):
    half = x - LR * _grad_np(a, b, x)
    xh = xh + _top_rows(half - xh, k)
    lap = sum(w[:, j:j + 1] * (xh[j] - xh) for j in range(n))
    x = half + gamma * lap
    np.testing.assert_allclose(xs[step + 1], x, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(states[step][1]), xh, rtol=2e-5, atol=2e-5)
  degree = (w != 0).sum(1) - 1
  np.testing.assert_allclose(sent[-1], degree * k * 8.0)  # k (float32, int32) to each neighbour


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
def test_choco_sgd_released_order_matches_epfml_code(runner):
  """epfml/ChocoSGD dl_code/pcode/optim/parallel_choco.py, transcribed: the local step; the
  consensus step on the copies of the last step (x_hat starts at 0); then q_i = Q(x_i^{t+1} -
  x_hat_i^t) and x_hat_i += q_i. 10 steps; the paper's order gives other iterates."""
  n, steps = 5, 10
  a, b, x0 = _problem(n, seed=3)
  w, gamma, density = _ring(n), 0.4, 0.25
  k = compression.num_selected(DIM, density)
  make = lambda order: D.choco_sgd(optax.sgd(LR), CompressedGossip([w]),
                                   codecs.make_codec("top_k", density=density), gamma,
                                   order=order)
  xs, states, sent = _drive(make("released"), a, b, x0, runner, steps=steps)
  x, xh = x0.astype(np.float64), np.zeros((n, DIM))
  for step in range(steps):
    half = x - LR * _grad_np(a, b, x)
    x = half + gamma * (w @ xh - xh)
    xh = xh + _top_rows(x - xh, k)
    np.testing.assert_allclose(xs[step + 1], x, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(sent[-1], ((w != 0).sum(1) - 1) * k * 8.0)
  paper = _drive(make("paper"), a, b, x0, runner, steps=steps)[0]
  assert np.abs(paper[-1] - xs[-1]).max() > 1e-3


def test_choco_sgd_without_compression_and_gamma_1_is_dpsgd():
  n = 5
  a, b, x0 = _problem(n, seed=1)
  w = _ring(n)
  choco = D.choco_sgd(optax.sgd(LR), CompressedGossip([w]), codecs.make_codec("none"), 1.0)
  dpsgd = T.gossip_step(optax.sgd(LR), Gossip([w]), "atc")
  xs_c, _, sent_c = _drive(choco, a, b, x0, "vmap")
  xs_d, _, sent_d = _drive(dpsgd, a, b, x0, "vmap")
  np.testing.assert_allclose(xs_c, xs_d, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(sent_c, sent_d)


def test_choco_sgd_time_varying_sends_to_the_union_of_neighbours():
  topo = topology.make("one_peer_exponential", 8)
  phases = [topo.mixing_matrix_at(t) for t in range(topo.period)]
  g = CompressedGossip(phases)
  union = np.any([(p != 0) & ~np.eye(8, dtype=bool) for p in phases], axis=0)
  for t in range(topo.period):
    np.testing.assert_array_equal(g.pattern(t, None).messages, union.sum(1))


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
def test_choco_sgd_on_a_time_varying_topology_matches_algorithm_2(runner):
  """Algorithm 2 with W_t (one-peer exponential graph, n = 8, period 3): the same recursion
  as above with w_ij replaced by W_t's; every step's x_hat updates are sent to the union of
  the phases' neighbours (3 here), so every public copy stays exact."""
  n = 8
  a, b, x0 = _problem(n, seed=4)
  topo = topology.make("one_peer_exponential", n)
  phases = [topo.mixing_matrix_at(t) for t in range(topo.period)]
  gamma, density = 0.5, 0.25
  k = compression.num_selected(DIM, density)
  t = D.choco_sgd(optax.sgd(LR), CompressedGossip(phases), codecs.make_codec("top_k",
                                                                           density=density),
                  gamma)
  xs, _, sent = _drive(t, a, b, x0, runner, steps=7)
  x, xh = x0.astype(np.float64), np.zeros((n, DIM))
  for step in range(7):
    w = phases[step % len(phases)]
    half = x - LR * _grad_np(a, b, x)
    xh = xh + _top_rows(half - xh, k)
    x = half + gamma * (w @ xh - xh)  # sum_j w_ij (x_hat_j - x_hat_i), rows of W sum to 1
    np.testing.assert_allclose(xs[step + 1], x, rtol=2e-5, atol=2e-5, err_msg=f"step {step}")
  np.testing.assert_allclose(sent[-1], 3 * k * 8.0)  # log2(8) peers over a period


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
def test_choco_sgd_trains_on_a_time_varying_topology():
  """Through train(): CHOCO with top_k on the one-peer exponential graph learns (test accuracy
  well above chance) and sends k (value, index) pairs to each of log2(n) peers a step."""
  cfg = small_cfg(algorithm="choco_sgd", num_workers=8, num_steps=40, eval_every=40,
                  learning_rate=0.1, topology="one_peer_exponential",
                  **{"compression.name": "top_k", "compression.density": 0.05,
                     "choco.gamma": 0.2})
  out = train.train(cfg)
  k = compression.num_selected(out["model_params"], 0.05)
  assert out["bytes_sent"] == pytest.approx(40 * 3 * k * 8.0, rel=1e-6)
  assert out["test_accuracy"] > 0.6 and out["history"][0]["test_accuracy"] < 0.2


@pytest.mark.parametrize("gamma", [0.0, 1.5, -0.1])
def test_choco_sgd_gamma_out_of_range(gamma):
  with pytest.raises(ValueError, match=r"choco.gamma=.* is not allowed: it must be in \(0, 1\]"):
    D.choco_sgd(optax.sgd(LR), CompressedGossip([_ring(4)]), codecs.make_codec("none"), gamma)


# ----------------------------------------------------------------------------- tracking, D^2


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n", slow_except([2, 5, 8], fast=(5,)))
def test_gradient_tracking_is_diging(n, runner):
  """Nedic et al. 2017, Eq. (3): x^{k+1} = W x^k - eta y^k, y^{k+1} = W y^k + g^{k+1} - g^k,
  y^0 = g^0; and sum_i y_i = sum_i g_i at every step."""
  a, b, x0 = _problem(n, seed=2)
  w = _ring(n)
  t = T.chain(D.gradient_tracking(Gossip([w], key="tracking")),
              T.gossip_step(optax.sgd(LR), Gossip([w]), "parallel"))
  xs, states, sent = _drive(t, a, b, x0, runner)
  x = x0.astype(np.float64)
  g = _grad_np(a, b, x)
  y = g.copy()
  for step in range(STEPS):
    x = w @ x - LR * y
    np.testing.assert_allclose(xs[step + 1], x, rtol=2e-5, atol=2e-5)
    y_dev = np.asarray(states[step][0].y)
    np.testing.assert_allclose(y_dev, y, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(y_dev.sum(0), _grad_np(a, b, xs[step]).sum(0), rtol=1e-4,
                               atol=1e-4)
    g_new = _grad_np(a, b, x)
    y, g = w @ y + g_new - g, g_new
  degree = (w != 0).sum(1) - 1
  np.testing.assert_allclose(sent[-1], 2 * degree * DIM * 4.0)  # y and x, to each neighbour


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n", slow_except([2, 5, 8], fast=(5,)))
@pytest.mark.parametrize("lazy", [False, True])
def test_d2_two_step_recursion(n, runner, lazy):
  """Tang et al. 2018, Algorithm 1: x^1 = W (x^0 - eta g^0),
  x^{t+1} = W (2 x^t - x^{t-1} - eta g^t + eta g^{t-1}); lazy: W -> (I + W) / 2."""
  a, b, x0 = _problem(n, seed=3)
  w = _ring(n)
  if lazy:
    w = (w + np.eye(n)) / 2
  xs, _, _ = _drive(D.d2(optax.sgd(LR), Gossip([w])), a, b, x0, runner)
  prev, x = None, x0.astype(np.float64)
  g_prev = None
  for step in range(STEPS):
    g = _grad_np(a, b, x)
    new = w @ (x - LR * g) if prev is None else w @ (2 * x - prev - LR * g + LR * g_prev)
    prev, x, g_prev = x, new, g
    np.testing.assert_allclose(xs[step + 1], x, rtol=3e-5, atol=3e-5)


def test_d2_refuses_a_w_with_lambda_min_below_minus_a_third():
  with pytest.raises(ValueError, match=r"config.d2.mixing='w' is not allowed with this W: "
                                       r"lambda_min\(W\) = -0.3333"):
    D.check_d2_mixing([_ring(8)], "w")
  D.check_d2_mixing([_ring(8)], "lazy")
  D.check_d2_mixing([_ring(5)], "w")  # odd ring: lambda_min = 1/3 + 2/3 cos(4 pi / 5)
  with pytest.raises(ValueError, match="time-varying"):
    D.check_d2_mixing([_ring(8), _ring(8)], "lazy")


# ----------------------------------------------------------------------------- Gossip-PGA


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n", slow_except([2, 5, 8], fast=(5,)))
def test_gossip_pga_averages_every_h_steps(n, runner):
  """Chen et al. 2021, Algorithm 1: x^{k+1} = mean(x^k - eta g^k) if (k + 1) mod H = 0,
  else W (x^k - eta g^k)."""
  a, b, x0 = _problem(n, seed=4)
  w, h = _ring(n), 3
  t = D.gossip_pga(optax.sgd(LR), Gossip([w]), AllReduce(n), "atc")
  xs, _, _ = _drive(t, a, b, x0, runner, period_end=lambda k: (k + 1) % h == 0)
  x = x0.astype(np.float64)
  for k in range(STEPS):
    half = x - LR * _grad_np(a, b, x)
    x = np.broadcast_to(half.mean(0), half.shape) if (k + 1) % h == 0 else w @ half
    np.testing.assert_allclose(xs[k + 1], x, rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------- codecs


def test_qsgd_is_unbiased_on_its_grid_and_within_the_variance_bound():
  """Alistarh et al. 2017, Lemma 3.1: E Q_s(v) = v, E ||Q_s(v) - v||^2 <= min(b / s^2,
  sqrt(b) / s) ||v||^2 per bucket, entries in ||v|| sgn(v_i) {0, 1/s, ..., 1}."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_t(3, size=40).astype(np.float32))
  s, bucket, draws = 4, 16, 4000
  keys = jax.random.split(jax.random.PRNGKey(1), draws)
  q = np.asarray(jax.vmap(lambda k: codecs.qsgd(x, k, levels=s, bucket_size=bucket))(keys),
                 np.float64)
  xv = np.asarray(x, np.float64)
  se = q.std(0) / math.sqrt(draws)
  assert np.all(np.abs(q.mean(0) - xv) <= 4 * se + 1e-6)
  for lo in range(0, 40, bucket):  # per bucket: grid and variance bound
    v = xv[lo:lo + bucket]
    norm = np.linalg.norm(v)
    levels = q[:, lo:lo + bucket] / norm * s * np.sign(v)
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)
    assert levels.min() >= -1e-4 and levels.max() <= s + 1e-4
    var = np.mean(np.sum((q[:, lo:lo + bucket] - v) ** 2, axis=1))
    b = len(v)
    assert var <= min(b / s ** 2, math.sqrt(b) / s) * norm ** 2
  assert codecs.qsgd_bytes(40, s, bucket) == 4 * 3 + math.ceil(40 * (1 + 3) / 8)


def test_qsgd_bad_options():
  with pytest.raises(ValueError, match="compression.levels=0 is not allowed"):
    codecs.make_codec("qsgd", levels=0)
  with pytest.raises(ValueError, match="compression.bucket_size=0 is not allowed"):
    codecs.make_codec("qsgd", bucket_size=0)
  with pytest.raises(ValueError, match="no codec reads 'level'"):  # a typo is not ignored
    codecs.make_codec("qsgd", level=4)


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n", slow_except([2, 5, 8], fast=(5,)))
def test_ef_sign_sgd_matches_algorithm_1(n, runner):
  """Karimireddy et al. 2019, Algorithm 1 per worker (gradient before the learning rate):
  p = g + e, delta = (||p||_1 / d) sgn(p), e <- p - delta; the mean of the deltas; bytes
  (n - 1) (ceil(d / 8) + 4)."""
  rng = np.random.default_rng(n)
  gs = rng.normal(size=(STEPS, n, DIM)).astype(np.float32)
  t = T.error_feedback(codecs.make_codec("sign"), axis_name=AXIS)
  state = jax.vmap(t.init)(jnp.zeros((n, DIM)))
  e = np.zeros((n, DIM))
  ctx = StepContext(jnp.zeros((n,), jnp.int32), jnp.ones((n,), jnp.int32),
                    jnp.full((n,), n, jnp.int32), jnp.zeros((n, 1), bool))
  program = _mapped(runner, lambda c: t.update(c[0], c[1], None, c[2]), n)
  for step in range(STEPS):
    (u, state, rep) = program((jnp.asarray(gs[step]), state, ctx))
    p = gs[step] + e
    delta = np.abs(p).mean(1, keepdims=True) * np.where(p >= 0, 1.0, -1.0)
    e = p - delta
    np.testing.assert_allclose(np.asarray(u), np.broadcast_to(delta.mean(0), (n, DIM)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state.residual), e, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rep["bytes_sent"]), (n - 1) * (math.ceil(DIM / 8) + 4))


# ----------------------------------------------------------------------------- exact convergence


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
def test_tracking_and_d2_reach_the_optimum_where_dpsgd_keeps_a_bias():
  """``experiments/configs/heterogeneous_lsq.py`` (in process; the command line's path is
  test_cli's): constant step, exact local gradients on heterogeneous least squares:
  F - F* < 1e-8 F* for gradient tracking and D^2 (Exact Diffusion), D-PSGD stalls above 1e-4."""
  gaps = {}
  for alg in ("dpsgd", "gradient_tracking", "d2"):
    cfg = experiment_config("heterogeneous_lsq")
    cfg.algorithm, cfg.progress = alg, False
    summary = train.train(cfg)
    gaps[alg] = summary["gap"] / summary["f_star"]
  assert gaps["gradient_tracking"] < 1e-8 and gaps["d2"] < 1e-8, gaps
  assert gaps["dpsgd"] > 1e-4, gaps


# ----------------------------------------------------------------------------- PowerSGD


def _gram_schmidt(p, eps=1e-8):
  """epfml/powersgd's ``orthogonalize``, column by column (numpy)."""
  p = p.copy()
  for i in range(p.shape[1]):
    p[:, i] /= np.sqrt(np.sum(p[:, i] ** 2)) + eps
    if i + 1 < p.shape[1]:
      p[:, i + 1:] -= np.sum(p[:, i:i + 1] * p[:, i + 1:], axis=0) * p[:, i:i + 1]
  return p


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n", slow_except([2, 5, 8], fast=(5,)))
def test_powersgd_matches_the_reference_reducer(n, runner):
  """epfml/powersgd RankKReducer (reuse_query) with error feedback, transcribed: per matrix
  M = g + e viewed as [out, -1]; P = sum_w M_w Q; P_hat = GS(P); Q = mean_w M_w^T P_hat;
  out = P_hat Q^T; e = M - out; vectors averaged uncompressed; bytes 2 (n-1)/n x 4 x
  (|P| + |Q| + |vectors|)."""
  from nbsgd_jax.transforms.powersgd import powersgd
  shapes = {"b": (4,), "k": (3, 3, 2, 5), "w": (6, 4)}
  rank = 2
  rng = np.random.default_rng(n)
  gs = [{k: rng.normal(size=(n,) + s).astype(np.float32) for k, s in shapes.items()}
        for _ in range(STEPS)]
  t = powersgd(rank, AllReduce(n))
  state = jax.vmap(t.init)({k: jnp.zeros((n,) + s) for k, s in shapes.items()})
  qs = {k: np.asarray(state.q[k], np.float64)[0] for k in ("k", "w")}  # the first Q
  mat = lambda x: x.reshape(-1, x.shape[-1]).T
  e = {k: np.zeros((n,) + s) for k, s in shapes.items()}
  ctx = StepContext(jnp.zeros((n,), jnp.int32), jnp.ones((n,), jnp.int32),
                    jnp.full((n,), n, jnp.int32), jnp.zeros((n, 1), bool))
  program = _mapped(runner, lambda c: t.update(c[0], c[1], None, c[2]), n)
  for step in range(STEPS):
    u, state, rep = program(({k: jnp.asarray(v) for k, v in gs[step].items()}, state, ctx))
    expected, count = {}, 0
    for k, s in shapes.items():
      m = gs[step][k].astype(np.float64) + e[k]
      if len(s) < 2:
        expected[k] = m.mean(0)
        e[k] = np.zeros_like(m)
        count += m[0].size
        continue
      ms = [mat(m[w]) for w in range(n)]
      p_hat = _gram_schmidt(sum(mw @ qs[k] for mw in ms))
      qs[k] = np.mean([mw.T @ p_hat for mw in ms], axis=0)
      approx = (p_hat @ qs[k].T).T.reshape(s)
      expected[k] = approx
      e[k] = m - approx
      count += p_hat.size + qs[k].size
    for k in shapes:
      np.testing.assert_allclose(np.asarray(u[k]), np.broadcast_to(expected[k], (n,) + shapes[k]),
                                 rtol=2e-4, atol=2e-5)
      np.testing.assert_allclose(np.asarray(state.residual[k]), e[k], rtol=2e-4, atol=2e-5)
    for k in ("k", "w"):
      np.testing.assert_allclose(np.asarray(state.q[k])[0], qs[k], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(rep["bytes_sent"]), 2 * (n - 1) / n * 4 * count,
                               rtol=1e-6)


def test_powersgd_bad_rank_and_choco_refuses_it():
  from nbsgd_jax import config as config_lib
  from nbsgd_jax.transforms.powersgd import powersgd
  with pytest.raises(ValueError, match="compression.rank=0 is not allowed"):
    powersgd(0, AllReduce(2))
  cfg = config_lib.override(config_lib.default_config(),
                            {"algorithm": "choco_sgd", "compression.name": "powersgd"})
  with pytest.raises(config_lib.ConfigError, match="config.compression.name='powersgd' is not "
                                                   "allowed with config.algorithm='choco_sgd'"):
    config_lib.validate(cfg)


# ----------------------------------------------------------------------------- streaming DiLoCo


@pytest.mark.parametrize("runner", ["vmap", "mesh"])
@pytest.mark.parametrize("n,fragments,delay,alpha", [(2, 2, 0, 0.0), (5, 3, 1, 0.25),
                                                     (8, 1, 0, 0.0), (2, 2, 2, 0.0)])
def test_streaming_diloco_syncs_one_fragment_in_turn(n, fragments, delay, alpha, runner):
  """Douillard et al. 2025, transcribed in the loop of pytorch/torchft's StreamingDiLoCo
  (``_step_post_hook``): inner SGD on every worker; a counter of local steps; at
  ``H / P - tau`` the current fragment's pseudo-gradient anchor_p - mean_w x_w[p] is
  reduced; at ``H / P`` that fragment takes an outer Nesterov step and every worker merges
  lerp(global, local, alpha); the counter restarts and the next fragment (in turn) follows."""
  from nbsgd_jax.host.periods import FragmentPlanner
  h, mu, outer_lr, steps = 6, 0.9, 0.7, 14
  rng = np.random.default_rng(n)
  a = rng.normal(size=(n, 5, 9)).astype(np.float32)
  b = rng.normal(size=(n, 5)).astype(np.float32)
  sizes = (2, 3, 4)  # three parameter arrays
  x0 = {f"p{k}": np.broadcast_to(rng.normal(size=s), (n, s)).astype(np.float32)
        for k, s in enumerate(sizes)}  # one initial model, as in training
  outer = optax.sgd(outer_lr, momentum=mu, nesterov=True)
  t = T.periodic(optax.sgd(LR), T.streaming_outer_step(T.mean_of(AllReduce(n), "alive"), outer,
                                                       fragments, delay, alpha))
  planner = FragmentPlanner(h, fragments, delay)
  flags = [planner.sync_now(k) for k in range(steps)]

  def step(carry, flag):
    x, state, a_i, b_i = carry
    g = jax.grad(lambda p: 0.5 * jnp.mean((a_i @ jnp.concatenate([p[k] for k in sorted(p)])
                                            - b_i) ** 2))(x)
    ctx = StepContext(jnp.int32(0), jnp.int32(1), jnp.int32(n), jnp.zeros((1,), bool),
                      period_end=flag)
    u, state, report = t.update(g, state, x, ctx)
    return optax.apply_updates(x, u), state, report.get("bytes_sent", jnp.float32(0))

  programs = {f: _mapped(runner, lambda c, f=f: step(c, f), n) for f in set(flags)}
  x, state = {k: jnp.asarray(v) for k, v in x0.items()}, jax.vmap(t.init)(x0)
  # numpy reference
  groups = [list(g) for g in np.array_split(np.arange(3), fragments)]
  xr = np.concatenate([x0[f"p{k}"] for k in range(3)], axis=1).astype(np.float64)
  bounds = np.cumsum((0,) + sizes)
  cols = lambda g: np.concatenate([np.arange(bounds[k], bounds[k + 1]) for k in g])
  anchors = [xr[0, cols(g)].copy() for g in groups]
  moms = [np.zeros_like(v) for v in anchors]
  every, local_step, synced, launched, pseudo = h // fragments, 0, 0, [], None
  for k, flag in enumerate(flags):
    x, state, sent = programs[flag]((x, state, jnp.asarray(a), jnp.asarray(b)))
    r = np.einsum("nmd,nd->nm", a, xr) - b
    xr = xr - LR * np.einsum("nmd,nm->nd", a, r) / a.shape[1]
    local_step += 1
    p = synced % fragments
    c = cols(groups[p])
    if local_step == every - delay:  # prepare_sync
      pseudo = anchors[p] - xr[:, c].mean(0)
      launched.append(k)
    assert (np.asarray(sent) > 0).all() == (launched[-1:] == [k]), k  # bytes at the launch
    if local_step == every:  # perform_sync
      moms[p] = pseudo + mu * moms[p]
      anchors[p] = anchors[p] - outer_lr * (pseudo + mu * moms[p])
      xr[:, c] = anchors[p] + alpha * (xr[:, c] - anchors[p])
      local_step, synced = 0, synced + 1
    got = np.concatenate([np.asarray(x[f"p{j}"]) for j in range(3)], axis=1)
    np.testing.assert_allclose(got, xr, rtol=2e-5, atol=2e-5, err_msg=f"step {k}")
  assert synced == steps // every and len(launched) >= synced


@pytest.mark.slow
@pytest.mark.parametrize("latency,hidden", [(1e-3, 6e-3), (1.0, 8e-3)])
def test_streaming_diloco_overlap_hides_the_allreduce_on_the_clock(latency, hidden):
  """Same bytes and rounds with and without overlap; each of the 4 all-reduces (4 workers:
  2 (n - 1) = 6 messages, infinite bandwidth: comm = 6 latency) runs behind tau = 1 inner
  step of 8 examples x 1 ms, so the clock saves min(comm, 8 ms) a round: 6 ms (latency 1 ms)
  or 8 ms (latency 1 s)."""
  out = {}
  for delay in (0, 1):
    cfg = small_cfg(algorithm="streaming_diloco", num_steps=8, eval_every=8,
                    **{"diloco.local_steps": 4, "streaming_diloco.fragments": 2,
                       "streaming_diloco.delay": delay, "cluster.latency": latency,
                       "cluster.bandwidth": 1e30})
    out[delay] = train.train(cfg)
  assert out[0]["bytes_sent"] == out[1]["bytes_sent"] > 0
  assert out[0]["rounds"] == out[1]["rounds"] == 4
  assert out[0]["sim_time"] - out[1]["sim_time"] == pytest.approx(4 * hidden, rel=1e-9)


@pytest.mark.slow
def test_streaming_diloco_with_one_fragment_is_diloco():
  kw = {"diloco.local_steps": 2}
  _, s1, l1 = run_steps(small_cfg(algorithm="diloco", **kw), 6)
  _, s2, l2 = run_steps(small_cfg(algorithm="streaming_diloco", **{"streaming_diloco.fragments": 1},
                                  **kw), 6)
  np.testing.assert_array_equal(l1, l2)
  for u, v in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_streaming_diloco_bad_fragments():
  from nbsgd_jax import config as config_lib
  from nbsgd_jax.transforms.wrappers import fragment_leaves
  cfg = config_lib.override(config_lib.default_config(), {
      "algorithm": "streaming_diloco", "diloco.local_steps": 10, "streaming_diloco.fragments": 3})
  with pytest.raises(config_lib.ConfigError, match="config.streaming_diloco.fragments=3 is not "
                                                   "allowed with config.diloco.local_steps=10"):
    config_lib.validate(cfg)
  with pytest.raises(ValueError, match="streaming_diloco.fragments=5 is not allowed: the model "
                                       "has 4 parameter arrays"):
    fragment_leaves(4, 5)
