"""Consensus distance measurement and consensus control (Kong et al. 2021)."""

import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax import topology, train
from nbsgd_jax.communications import collectives
from nbsgd_jax.transforms import consensus
from nbsgd_jax.core import metrics
from nbsgd_jax import config as config_lib
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.host import consensus as targets
from nbsgd_jax.communications import Gossip
from nbsgd_jax.transforms.consensus import ControlRounds

from tests.helpers import run_steps_with_targets, small_cfg, step_contexts

N = 8


def _tree(seed, n=N):
  rng = np.random.default_rng(seed)
  return {"a": jnp.asarray(rng.standard_normal((n, 5, 3)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal((n, 7)), jnp.float32)}


def _inputs(target, step=0, n=N):
  return step_contexts(n, step, target=jnp.full((n,), target, jnp.float32))


def _static_mixer(w):
  """The gossip over a static W as ``consensus.control``'s mixer: ``(mixed, bytes)``."""
  comm = Gossip([w])

  def mix(params, ctx):
    mixed, report = comm.mix(params, ctx)
    return mixed, report["bytes_sent"]

  return mix


def test_exact_measure_matches_numpy_and_metrics():
  p = _tree(0)
  xi2 = jax.vmap(lambda x: consensus.measure_sq(x, consensus.Control()), axis_name=AXIS)(p)
  ref = consensus.measure_sq_reference(p)
  np.testing.assert_allclose(np.asarray(xi2), ref, rtol=1e-5)
  np.testing.assert_allclose(float(metrics.consensus_distance(p)) ** 2, ref, rtol=1e-5)
  layers = metrics.consensus_distance_per_layer(p)
  assert set(layers) == {"a", "b"}
  np.testing.assert_allclose(sum(float(v) ** 2 for v in layers.values()), ref, rtol=1e-5)


def test_sketch_measure_is_unbiased():
  p = _tree(1)
  c = consensus.Control(measure="sketch", sketch_size=16)
  f = jax.jit(jax.vmap(lambda x, k: consensus.measure_sq(x, c, k), axis_name=AXIS,
                       in_axes=(0, None)))
  est = np.array([float(f(p, jax.random.key(i))[0]) for i in range(400)])
  ref = consensus.measure_sq_reference(p)
  # mean of 400 estimates within 4 standard errors of the exact value
  assert abs(est.mean() - ref) <= 4 * est.std() / math.sqrt(len(est)), (est.mean(), ref)
  assert est.std() > 0


@pytest.mark.parametrize("target", [0.5, 1.0, 3.0])
def test_control_gossips_until_target_like_numpy(target):
  w = np.asarray(topology.make("ring", N).mixing_matrix)
  mix = _static_mixer(w)
  p = _tree(2)
  c = consensus.Control(max_gossip_steps=20)
  out, sent, aux = jax.vmap(lambda x, i: consensus.control(x, mix, i, N, c), axis_name=AXIS)(
      p, _inputs(target))
  k = int(aux["gossip_steps"][0])
  # numpy: apply W until Xi <= target
  x = {name: np.asarray(v, np.float64) for name, v in p.items()}
  ref_k = 0
  while consensus.measure_sq_reference(x) > target ** 2 and ref_k < 20:
    x = {name: np.tensordot(w, v, axes=1) for name, v in x.items()}
    ref_k += 1
  assert k == ref_k
  for name in p:
    np.testing.assert_allclose(np.asarray(out[name]), x[name], rtol=1e-4, atol=1e-5)
  assert float(aux["consensus_distance"][0]) <= target + 1e-6
  model = 4 * (15 + 7)
  per_gossip = collectives.gossip_bytes(model, w)
  expected = k * per_gossip + (k + 1) * consensus.measure_bytes(model, N, c)
  np.testing.assert_allclose(np.asarray(sent), expected, rtol=1e-6)


def test_control_off_at_infinite_target_and_capped_at_k():
  w = np.asarray(topology.make("ring", N).mixing_matrix)
  mix = _static_mixer(w)
  p = _tree(3)
  f = jax.vmap(lambda x, i: consensus.control(x, mix, i, N, consensus.Control(2)),
               axis_name=AXIS)
  out, sent, aux = f(p, _inputs(np.inf))
  chex.assert_trees_all_equal(out, p)
  assert float(sent[0]) == 0 and int(aux["measurements"][0]) == 0
  _, _, aux = f(p, _inputs(1e-6))  # unreachable: K = 2 extra steps, 3 measurements
  assert int(aux["gossip_steps"][0]) == 2 and int(aux["measurements"][0]) == 3


def _control_cfg(**kw):
  base = dict(algorithm="dpsgd", num_workers=N, topology="ring", learning_rate=0.3,
              momentum=0.0, num_steps=12, eval_every=6, partition="dirichlet",
              dirichlet_alpha=0.1, batch_size=8)
  base.update(kw)
  return small_cfg(**base)


def _steps(workdir):
  return [json.loads(l) for l in (workdir / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """An uncontrolled D-PSGD run logging Xi every step: (workdir, summary)."""
  wd = tmp_path_factory.mktemp("ref")
  return wd, train.train(_control_cfg(**{"consensus.log_every_step": True}), str(wd))


@pytest.mark.slow
def test_training_with_control_keeps_xi_below_target(tmp_path, reference_run):
  ref_dir, ref = reference_run
  free = _steps(ref_dir)
  target = 0.5 * max(r["consensus_distance"] for r in free)
  assert any(r["consensus_distance"] > target for r in free)  # control has work to do
  out = train.train(_control_cfg(**{"consensus.control": True, "consensus.target": target,
                                    "consensus.max_gossip_steps": 50}), str(tmp_path / "c"))
  ctl = _steps(tmp_path / "c")
  assert [r["step"] for r in ctl] == list(range(1, 13))
  assert all(r["measured_consensus_distance"] <= target * (1 + 1e-5) for r in ctl), ctl
  assert sum(r["gossip_steps"] for r in ctl) == out["extra_gossip_steps"] > 0
  assert out["bytes_sent"] > ref["bytes_sent"]
  assert out["sim_time"] > ref["sim_time"]
  # the evaluation's exact Xi (host) agrees with the in-step measurement at step 12
  assert out["consensus_distance"] == pytest.approx(ctl[-1]["measured_consensus_distance"],
                                                    rel=1e-3)


def test_control_until_step_and_ratio_target(tmp_path, reference_run):
  ref_dir, _ = reference_run
  free = {r["step"]: r["consensus_distance"] for r in _steps(ref_dir)}
  train.train(_control_cfg(**{"consensus.control": True, "consensus.target_ratio": 0.5,
                              "consensus.reference_workdir": str(ref_dir),
                              "consensus.until_step": 8, "consensus.max_gossip_steps": 50,
                              "consensus.log_every_step": True}),
              str(tmp_path / "c"))
  ctl = _steps(tmp_path / "c")
  for r in ctl:
    if r["step"] <= 8:
      assert r["target"] == pytest.approx(0.5 * free[r["step"]], rel=1e-6)
      assert r["measured_consensus_distance"] <= r["target"] * (1 + 1e-5)
      assert r["consensus_distance"] == pytest.approx(r["measured_consensus_distance"],
                                                      rel=1e-5)
    else:  # control off: no measurement, no extra gossip; the exact diagnostic still logged
      assert r["target"] is None and r["gossip_steps"] == 0 and r["measurements"] == 0
      assert r["measured_consensus_distance"] is None and r["consensus_distance"] > 0


@pytest.mark.slow
def test_simulate_and_mesh_agree_with_control():
  kw = {"consensus.control": True, "consensus.target": 1e-3, "consensus.max_gossip_steps": 3,
        "algorithm": "matcha", "topology": "torus", "num_workers": N}
  cfg = lambda b: small_cfg(backend=b, **kw)
  sim_out = run_steps_with_targets(cfg("simulate"), 4)
  mesh_out = run_steps_with_targets(cfg("mesh"), 4)
  chex.assert_trees_all_close(sim_out.params, jax.device_get(mesh_out.params),
                              rtol=1e-4, atol=1e-5)


def test_simulator_extra_charges_measurements_and_gossip():
  """The host's clock charges consensus control's rounds from the step's report (Kong et al.
  2021): first a measurement, then per extra gossip round one gossip and a measurement."""
  cfg = small_cfg(algorithm="dpsgd", num_workers=4, topology="ring",
                  **{"consensus.control": True, "consensus.target": 1.0})
  s = train.setup(cfg)
  host = train.make_host(s)
  clock = host.part("clock")
  assert any(isinstance(c, ControlRounds) for c in clock.communications)
  n, model = cfg.num_workers, 1000.0
  per_gossip = np.full(n, 2 * model)  # one 1000-byte model to each of two neighbours
  inputs = host.inputs(0)
  # the step itself: its gossip round (the recipe's communication), nothing controlled
  clock.observe(0, inputs, {"bytes/gossip": per_gossip, "rounds/gossip": np.ones(n, np.int32)},
                None)
  t0 = clock.sim_time
  # consensus control after it: 2 extra gossip rounds and 3 measurements of 500 bytes each
  report = {"gossip_steps": np.full(n, 2, np.int32), "measurements": np.full(n, 3, np.int32),
            "bytes/consensus.gossip": 2 * per_gossip, "bytes/consensus.measure": np.full(n, 1500.0)}
  inputs.compute = np.zeros(n)
  clock.observe(0, inputs, report, None)
  lat, bw = cfg.cluster.latency, cfg.cluster.bandwidth
  meas = lat * 4 * 3 + 500.0 / bw  # vector + scalar ring all-reduce: 2 * 2(n - 1) messages
  gossip = lat * 2 + 2 * 1000.0 / bw  # two neighbours
  assert clock.sim_time - t0 == pytest.approx(3 * meas + 2 * gossip, rel=1e-9)


@pytest.mark.parametrize("override,needle", [
    ({"consensus.control": True}, "give exactly one target"),
    ({"consensus.control": True, "consensus.target": 1.0, "consensus.target_ratio": 0.5},
     "give exactly one target"),
    ({"consensus.control": True, "consensus.target_ratio": 0.5},
     "needs config.consensus.reference_workdir"),
    ({"consensus.control": True, "consensus.target": 1.0, "algorithm": "allreduce"},
     "consensus control runs on 'dpsgd', 'matcha', 'choco_sgd'"),
    ({"consensus.max_gossip_steps": 0}, "config.consensus.max_gossip_steps=0 is not allowed"),
    ({"consensus.measure": "guess"}, "config.consensus.measure='guess' is not allowed"),
    ({"consensus.target": -1.0}, "config.consensus.target=-1.0 is not allowed"),
])
def test_bad_consensus_config(override, needle):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(small_cfg(**override))
  assert any(needle in line for line in e.value.errors), e.value.errors


def test_reference_workdir_without_xi(tmp_path):
  with pytest.raises(ValueError, match="holds no steps.jsonl or metrics.jsonl"):
    targets.TargetSchedule(target_ratio=0.5, reference_workdir=str(tmp_path))


@pytest.mark.slow
def test_control_on_nonblocking_matcha(tmp_path):
  """Consensus control on top of Non-blocking MATCHA (stragglers drop mini-batches)."""
  cfg = _control_cfg(algorithm="matcha", topology="erdos_renyi", num_steps=6, eval_every=6,
                     **{"consensus.control": True, "consensus.target": 0.05,
                        "consensus.max_gossip_steps": 50, "nonblocking.enabled": True,
                        "nonblocking.num_minibatches": 4, "cluster.scenario": "lognormal"})
  out = train.train(cfg, str(tmp_path))
  ctl = _steps(tmp_path)
  assert all(r["measured_consensus_distance"] <= 0.05 * (1 + 1e-5) for r in ctl), ctl
  assert out["extra_gossip_steps"] > 0


def test_config_override_names_unknown_keys():
  c = config_lib.override(config_lib.default_config(), {"num_workers": 3, "consensus.target": 0.1})
  assert c.num_workers == 3 and c.consensus.target == 0.1
  for bad in ("consensus.targt", "nosection.key", "num_worker"):
    with pytest.raises(config_lib.ConfigError, match=f"config.{bad} is not a configuration key"):
      config_lib.override(config_lib.default_config(), {bad: 1})


# ----------------------------------------------------------------- critical consensus distance


def _grad_stats_reference(g):
  """Dense numpy: (||g_bar||^2 - spread / n, spread) with spread = 1/(n-1) sum ||g_i - g_bar||^2."""
  x = np.concatenate([np.asarray(v, np.float64).reshape(N, -1) for v in jax.tree.leaves(g)], 1)
  mean = x.mean(axis=0)
  spread = np.sum((x - mean) ** 2) / (N - 1)
  return np.sum(mean ** 2) - spread / N, spread


def test_gradient_stats_unbiased_against_dense_numpy():
  g = _tree(5)
  g = jax.tree.map(lambda v: v + 0.7, g)  # a common mean so that ||g_bar|| > 0
  c = consensus.Control(sketch_size=16)
  f = jax.jit(jax.vmap(lambda x, k: consensus.gradient_stats(x, c, k, N), axis_name=AXIS,
                       in_axes=(0, None)))
  est = np.array([[float(v[0]) for v in f(g, jax.random.key(i))] for i in range(400)])
  ref_gs, ref_noise = _grad_stats_reference(g)
  # the noise estimate is unbiased; grad_sq is unbiased before its clamp at 0 (rarely active)
  for j, ref in ((0, ref_gs), (1, ref_noise)):
    assert abs(est[:, j].mean() - ref) <= 4 * est[:, j].std() / math.sqrt(len(est)), (j, ref)
  # a sketch of all coordinates in a 1-coordinate model is exact
  one = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((N, 1)), jnp.float32)}
  gs, noise = jax.vmap(lambda x: consensus.gradient_stats(x, consensus.Control(sketch_size=1),
                                                          jax.random.key(0), N),
                       axis_name=AXIS)(one)
  ref_gs, ref_noise = _grad_stats_reference(one)
  np.testing.assert_allclose(float(noise[0]), ref_noise, rtol=1e-5)
  np.testing.assert_allclose(float(gs[0]), max(ref_gs, 0.0), rtol=1e-5, atol=1e-7)


def test_smoothness_estimate_is_the_top_hessian_eigenvalue():
  rng = np.random.default_rng(3)
  q, _ = np.linalg.qr(rng.standard_normal((12, 12)))
  eig = np.linspace(0.1, 4.0, 12)
  a = jnp.asarray(q @ np.diag(eig) @ q.T, jnp.float32)
  params = {"x": jnp.ones((3, 4), jnp.float32)}
  loss = lambda p: 0.5 * p["x"].reshape(-1) @ a @ p["x"].reshape(-1)
  est = float(consensus.smoothness_estimate(loss, params, iters=200))
  assert est == pytest.approx(4.0, rel=1e-3)
  with pytest.raises(ValueError, match="smoothness_iters"):
    consensus.smoothness_estimate(loss, params, iters=0)


def test_critical_target_schedule():
  crit = targets.CriticalTarget(num_workers=4, scale=2.0, smoothness=0.0, until_step=10)
  assert crit.at(0, 0.1) == targets.NO_CONSTRAINT  # no statistics, no L yet
  crit.observe(grad_sq=8.0, noise=3.0)
  assert crit.at(1, 0.1) == targets.NO_CONSTRAINT
  crit.set_smoothness(2.0)
  gamma2 = 8.0 / (2 * 2.0 ** 2) + 0.1 * 3.0 / (2.0 * 4)  # closed form
  assert crit.at(1, 0.1) == pytest.approx(2.0 * math.sqrt(gamma2))
  assert math.isinf(crit.at(10, 0.1))
  for bad in (0.0, float("nan"), float("inf"), -1.0):  # dead units, a broken model
    crit.set_smoothness(bad)
    assert crit.smoothness == 2.0  # the last good estimate stays
  fixed = targets.CriticalTarget(num_workers=4, smoothness=5.0)
  fixed.set_smoothness(1.0)  # a given L is kept
  fixed.observe(1.0, 0.0)
  assert fixed.at(0, 0.1) == pytest.approx(math.sqrt(1.0 / 50.0))
  for kw, needle in (({"scale": 0.0}, "critical_scale"), ({"smoothness": -1.0}, "smoothness"),
                     ({"ema": 1.0}, "critical_ema")):
    with pytest.raises(ValueError, match=needle):
      targets.CriticalTarget(num_workers=4, **kw)


def _kong_prop_3_1_gamma_sq(grad_norm_sq, sigma_sq, eta, L, n):
  """Kong, Lin, Koloskova, Jaggi, Stich, ICML 2021, Proposition 3.1 (critical consensus
  distance), as quoted: Gamma_t^2 := (1 / (L n)) eta sigma^2 + (1 / (8 L^2)) ||grad f(x_bar)||^2."""
  return (1.0 / (L * n)) * eta * sigma_sq + (1.0 / (8.0 * L ** 2)) * grad_norm_sq


def test_critical_distance_paper_form_is_kong_prop_3_1():
  rng = np.random.default_rng(7)
  for _ in range(20):
    g2, s2, eta, L = rng.exponential(size=4) + 1e-3
    n = int(rng.integers(1, 65))
    ref = _kong_prop_3_1_gamma_sq(g2, s2, eta, L, n)
    got = targets.critical_distance_sq(g2, s2, eta, L, n, form="paper")
    assert got == pytest.approx(ref, rel=1e-12)
    # the default keeps the derived constants: 1/2 instead of 1/8 on the gradient term
    assert targets.critical_distance_sq(g2, s2, eta, L, n) == pytest.approx(
        ref + (0.5 - 0.125) * g2 / L ** 2, rel=1e-12)
  crit = targets.CriticalTarget(num_workers=16, scale=1.5, smoothness=2.5, form="paper")
  crit.observe(grad_sq=0.4, noise=3.0)
  assert crit.at(0, 0.05) == pytest.approx(
      1.5 * math.sqrt(_kong_prop_3_1_gamma_sq(0.4, 3.0, 0.05, 2.5, 16)), rel=1e-12)
  with pytest.raises(ValueError, match="form='kong' is not allowed"):
    targets.CriticalTarget(num_workers=4, form="kong")
  with pytest.raises(ValueError, match="form='kong' is not allowed"):
    targets.critical_distance_sq(1.0, 1.0, 0.1, 1.0, 4, form="kong")


def test_critical_target_moving_average():
  """The statistics behind Gamma_t: an exponential moving average, against a numpy loop."""
  rng = np.random.default_rng(0)
  obs = rng.exponential(size=(20, 2))
  crit = targets.CriticalTarget(num_workers=8, smoothness=3.0, ema=0.8)
  ref = obs[0].copy()
  for t, (g, v) in enumerate(obs):
    crit.observe(g, v)
    if t:
      ref = 0.8 * ref + 0.2 * obs[t]
    np.testing.assert_allclose(crit.stats, ref, rtol=1e-12)
  gamma2 = ref[0] / (2 * 9.0) + 0.05 * ref[1] / (3.0 * 8)
  assert crit.at(20, 0.05) == pytest.approx(math.sqrt(gamma2))
  # resumed from its state dict, it continues the same average
  again = targets.CriticalTarget(num_workers=8, smoothness=3.0, ema=0.8)
  again.load_state_dict(crit.state_dict())
  crit.observe(1.0, 2.0)
  again.observe(1.0, 2.0)
  assert again.stats == crit.stats


@pytest.mark.slow
def test_training_with_critical_target(tmp_path):
  """Target from the estimator: recomputed by the test from the logged statistics, honoured
  at every step where control had gossip steps left, charged in bytes."""
  kw = {"consensus.control": True, "consensus.critical": True,
        "consensus.critical_scale": 1.0, "consensus.max_gossip_steps": 50,
        "consensus.smoothness_every": 5, "consensus.smoothness_iters": 10,
        "consensus.log_every_step": True}
  cfg = _control_cfg(**kw)
  out = train.train(cfg, str(tmp_path / "c"))
  ctl = _steps(tmp_path / "c")
  assert ctl[0]["target"] is None and ctl[0]["measurements"] == 1  # first step: measure only
  sched = train.make_schedule(cfg)
  n = cfg.num_workers
  bound = 0
  beta = cfg.consensus.critical_ema
  avg = None  # the moving average of the logged statistics, recomputed here
  for prev, r in zip(ctl, ctl[1:]):
    new = np.array([prev["grad_sq"], prev["grad_noise"]])
    avg = new if avg is None else beta * avg + (1 - beta) * new
    eta = float(sched(r["step"] - 1)) / (1 - cfg.momentum)
    lsm = r["smoothness"]
    gamma2 = (avg[0] / (8 * lsm ** 2) + eta * avg[1] / (lsm * n))  # Kong et al. Prop. 3.1
    assert r["target"] == pytest.approx(math.sqrt(gamma2), rel=1e-5)
    assert r["measured_consensus_distance"] <= r["target"] * (1 + 1e-5)
    bound += r["gossip_steps"] > 0
  assert bound > 0  # the target did bind
  assert len({r["smoothness"] for r in ctl}) > 1  # L re-estimated every 5 steps
  free = train.train(_control_cfg(), None)
  c = cfg.consensus
  ctrl = consensus.Control(c.max_gossip_steps, c.measure, c.sketch_size)
  per_step_measure = consensus.measure_bytes(
      4 * out["model_params"], n, ctrl) + consensus.gradient_stats_bytes(n, ctrl)
  gossip = (out["bytes_sent"] - free["bytes_sent"]
            - per_step_measure * cfg.num_steps - consensus.measure_bytes(
                4 * out["model_params"], n, ctrl) * out["extra_gossip_steps"])
  # the remainder is exactly the extra gossip: extra steps x 2 neighbours x model bytes
  assert gossip == pytest.approx(out["extra_gossip_steps"] * 2 * 4 * out["model_params"],
                                 rel=1e-6)


@pytest.mark.slow
def test_critical_target_estimates_smoothness_only_while_controlled(tmp_path):
  """With control until step 6, L is estimated at steps 0 and 3 and never after (the
  estimate is host compute that nothing uses once control is off)."""
  cfg = _control_cfg(**{"consensus.control": True, "consensus.critical": True,
                        "consensus.until_step": 6, "consensus.smoothness_every": 3,
                        "consensus.smoothness_iters": 5, "num_steps": 12})
  train.train(cfg, str(tmp_path / "c"))
  ls = [r["smoothness"] for r in _steps(tmp_path / "c")]
  assert len(ls) == 12 and ls[0] != ls[3]  # re-estimated at step 3 (0-based)
  assert len(set(ls[3:])) == 1  # and not at 6 or 9
