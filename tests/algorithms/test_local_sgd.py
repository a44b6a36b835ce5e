"""Local SGD (LUPA-SGD), its period schedules and DiLoCo against independent references."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import topology, train
from nbsgd_jax.host import periods as local_sgd
from nbsgd_jax import transforms as T
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.communications import AllReduce, Gossip

from tests.helpers import run_steps, small_cfg, step_contexts

N = 4


def _local_sgd(opt, n, opt_state_sync="keep", reducer=None):
  """Local SGD with a model average (or ``reducer``) at every period end."""
  reducer = reducer if reducer is not None else T.mean_of(AllReduce(n), "alive")
  return T.periodic(opt, T.average_models(reducer, opt_state_sync, local_init=opt.init))


def _allreduce(opt, n):
  return T.chain(T.mean_of(AllReduce(n)), opt)


def _diloco(inner, n, outer):
  return T.periodic(inner, T.outer_step(T.mean_of(AllReduce(n), "alive"), outer))


def _step(transform, period_end):
  """One worker's step: ``(g, state, params, ctx) -> (params, state, bytes_sent)``."""

  def fn(g, state, params, ctx):
    updates, state, report = transform.update(g, state, params,
                                              ctx._replace(period_end=period_end))
    return (optax.apply_updates(params, updates), state,
            report.get("bytes_sent", jnp.float32(0.0)))

  return fn


def _run(transform, params, grads_seq, syncs):
  """Drive ``transform`` under vmap with given per-step grads [n, d] and sync flags."""
  opt_state = jax.vmap(transform.init)(params)
  sent = []
  for t, (g, sync) in enumerate(zip(grads_seq, syncs)):
    params, opt_state, b = jax.vmap(_step(transform, sync), axis_name=AXIS)(
        g, opt_state, params, step_contexts(N, t))
    sent.append(np.broadcast_to(np.asarray(b), (N,)))
  return params, opt_state, np.stack(sent)


def _grads(steps, d=6, seed=0):
  rng = np.random.default_rng(seed)
  return [{"w": jnp.asarray(rng.standard_normal((N, d)), jnp.float32)} for _ in range(steps)]


# ------------------------------------------------------------------ planner


def _syncs(planner, steps, losses=None):
  out = []
  if planner.needs_loss:
    planner.observe(losses(0))
  for t in range(steps):
    if planner.sync_now(t):
      out.append(t)
      if planner.needs_loss:
        planner.observe(losses(t + 1))
  return out


def test_fixed_schedule_syncs_every_tau():
  assert _syncs(local_sgd.SyncPlanner("fixed", 4), 14) == [3, 7, 11]
  assert _syncs(local_sgd.SyncPlanner("fixed", 1), 5) == [0, 1, 2, 3, 4]


def test_linear_and_post_local_schedules():
  p = local_sgd.SyncPlanner("linear", 2, alpha=0.5)
  s = _syncs(p, 40)
  # the released ramp starts after its step-0 sync: tau_i = ceil(2 (1 + 0.5 (i + 1))) = 3, 4, ..
  assert p.periods[:6] == [3, 4, 5, 6, 7, 8]
  assert s[:4] == [2, 6, 11, 17]
  p = local_sgd.SyncPlanner("post_local", 5, switch_step=3)
  assert _syncs(p, 14) == [0, 1, 2, 7, 12]


def test_ada_lupa_follows_the_loss_rule():
  f = lambda t: 8.0 / (1 + t)  # F(x_t)
  p = local_sgd.SyncPlanner("ada_lupa", 2)
  s = _syncs(p, 60, f)
  # reference: period i starts at s_i with tau_i = ceil((F(0) / F(s_i))^(1/3)) * 2
  start, ref = 0, []
  while start < 60:
    tau = math.ceil((f(0) / f(start)) ** (1 / 3) - 1e-9) * 2
    ref.append(tau)
    start += tau
  assert p.periods == ref[:len(p.periods)]
  assert s == list(np.cumsum(p.periods) - 1)[:len(s)]
  assert p.periods[-1] > p.periods[0]  # the period grew as the loss fell


class _StepTimer:
  """tf.train.SecondOrStepTimer (tensorflow/python/training/basic_session_run_hooks.py) with
  every_secs=None: should_trigger_for_step / update_last_triggered_step."""

  def __init__(self, every_steps):
    self._every_steps = every_steps
    self._last_triggered_step = None

  def should_trigger_for_step(self, step):
    if self._last_triggered_step is None:
      return True
    if self._last_triggered_step == step:
      return False
    if self._every_steps is not None and step >= self._last_triggered_step + self._every_steps:
      return True
    return False

  def update_last_triggered_step(self, step):
    self._last_triggered_step = step


def _released_linear_syncs(train_steps, num_comm, sync_step, towers=1):
  """mmkamani7/LUPA-SGD with --adaptive: main.py's local_updates and utils.SyncHook, run by
  an Estimator until the global step reaches train_steps (StopAtStepHook), each session run
  advancing the global step once per tower (every tower's apply_gradients increments it).
  Returns the global steps before which SyncHook.before_run averaged the models."""
  alpha = 2 / (num_comm + 1) * (train_steps / (num_comm * sync_step))
  local_updates = [sync_step * (1 + alpha * i) for i in range(num_comm + 1)]
  timer, count, synced = _StepTimer(sync_step), 0, []
  global_step = 0
  while global_step < train_steps:
    if timer.should_trigger_for_step(global_step):  # SyncHook.before_run
      synced.append(global_step)
      timer.update_last_triggered_step(global_step)
      count += 1
      timer._every_steps = local_updates[count]
    global_step += towers
  return synced


@pytest.mark.parametrize("train_steps,num_comm,sync_step,towers", [
    (5469, 10, 91, 1),   # the README's run (its 4 GPUs aside)
    (1000, 9, 10, 1),    # local_updates[9] = 10 (1 + 9 alpha) = 210 up to float rounding
    (200, 5, 4, 1),
    (80000, 50, 16, 1),
    (4000, 8, 20, 4),    # 4 towers: --train-steps 4000 --sync-step 20 = 1000 steps, tau 5
    (2400, 6, 12, 4),
])
def test_linear_num_comm_matches_the_released_code(train_steps, num_comm, sync_step, towers):
  released = _released_linear_syncs(train_steps, num_comm, sync_step, towers)
  assert released[0] == 0  # the sync of the initial models: our common initialisation
  # its sync before global step s is ours after step s / towers - 1
  expected = [s // towers - 1 for s in released[1:]]
  num_steps, tau = train_steps // towers, sync_step // towers
  p = local_sgd.SyncPlanner("linear", tau, alpha=123.0, num_comm=num_comm, num_steps=num_steps)
  assert p.alpha == pytest.approx(2 / (num_comm + 1) * num_steps / (num_comm * tau))
  # the released code never syncs after its last step (that would be before a step not run)
  ours = [t for t in _syncs(p, num_steps) if t < num_steps - 1]
  assert ours == expected
  assert len(expected) < num_comm  # the ramp outlasts training (local_updates never runs out)


def test_linear_config_num_comm():
  cfg = config_lib.default_config()
  config_lib.override(cfg, {"algorithm": "local_sgd", "num_steps": 500,
                            "local_sgd.schedule": "linear", "local_sgd.local_steps": 5,
                            "local_sgd.num_comm": 4})
  config_lib.validate(cfg)
  p = local_sgd.make_planner(cfg)
  assert p.alpha == 2 / 5 * (500 / (4 * 5)) and p.num_comm == 4
  cfg.local_sgd.num_comm = 0
  assert local_sgd.make_planner(cfg).alpha == cfg.local_sgd.alpha
  with pytest.raises(ValueError, match="local_sgd.num_comm=-1 is not allowed"):
    local_sgd.SyncPlanner("linear", 2, num_comm=-1, num_steps=10)
  with pytest.raises(ValueError, match="num_steps=0 is not allowed"):
    local_sgd.SyncPlanner("linear", 2, num_comm=3)
  cfg.local_sgd.num_comm = -2
  with pytest.raises(config_lib.ConfigError, match="local_sgd.num_comm=-2"):
    config_lib.validate(cfg)


def test_ada_lupa_max_tau_and_offset():
  p = local_sgd.SyncPlanner("ada_lupa", 2, max_tau=4, loss_offset=1.0)
  _syncs(p, 100, lambda t: 1.0 + 1000.0 / (1 + t))
  assert max(p.periods) == 4 and p.periods[0] == 2


def test_ada_lupa_needs_observations():
  p = local_sgd.SyncPlanner("ada_lupa", 2)
  with pytest.raises(RuntimeError, match="observe"):
    p.sync_now(0)


@pytest.mark.parametrize("kwargs,needle", [
    ({"schedule": "cyclic"}, "local_sgd.schedule='cyclic' is not allowed"),
    ({"tau": 0}, "local_sgd.local_steps=0 is not allowed"),
    ({"tau": 2.5}, "local_sgd.local_steps=2.5 is not allowed"),
    ({"alpha": -1.0}, "local_sgd.alpha=-1.0 is not allowed"),
    ({"switch_step": -2}, "local_sgd.switch_step=-2 is not allowed"),
])
def test_planner_bad_input(kwargs, needle):
  with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
    local_sgd.SyncPlanner(**kwargs)


@pytest.mark.parametrize("override,needle", [
    ({"algorithm": "local_sgd", "local_sgd.local_steps": 0}, "config.local_sgd.local_steps=0 is not allowed"),
    ({"algorithm": "local_sgd", "local_sgd.schedule": "cyclic"},
     "config.local_sgd.schedule='cyclic' is not allowed"),
    ({"algorithm": "local_sgd", "local_sgd.opt_state": "sum"},
     "config.local_sgd.opt_state='sum' is not allowed"),
    ({"algorithm": "diloco", "diloco.local_steps": 0},
     "config.diloco.local_steps=0 is not allowed"),
    ({"algorithm": "diloco", "diloco.outer_lr": 0.0}, "config.diloco.outer_lr=0.0 is not allowed"),
])
def test_bad_config(override, needle):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(small_cfg(**override))
  assert any(needle in line for line in e.value.errors), e.value.errors


@pytest.mark.slow
def test_diloco_with_nonblocking_trains():
  """DiLoCo with Non-blocking SGD (once refused as "not combined yet") now trains."""
  s = train.train(small_cfg(algorithm="diloco", num_steps=4, eval_every=4,
                            **{"nonblocking.enabled": True, "diloco.local_steps": 2}))
  assert np.isfinite(s["train_loss"]), s["train_loss"]


# ------------------------------------------------------------------ local SGD


def test_local_steps_are_local_and_sync_averages():
  opt = optax.sgd(0.1)
  alg = _local_sgd(opt, N)
  params = {"w": jnp.zeros((N, 6))}
  gs = _grads(3)
  out, _, sent = _run(alg, params, gs, [False, False, True])
  ref = -0.1 * sum(np.asarray(g["w"]) for g in gs)  # [n, d], local trajectories
  np.testing.assert_allclose(np.asarray(out["w"]), np.broadcast_to(ref.mean(0), ref.shape),
                             rtol=1e-6, atol=1e-6)
  nbytes = 6 * 4
  np.testing.assert_allclose(sent[:, 0], [0, 0, 2 * (N - 1) / N * nbytes])
  out2, _, _ = _run(alg, params, gs[:2], [False, False])
  np.testing.assert_allclose(np.asarray(out2["w"]), -0.1 * (np.asarray(gs[0]["w"]) +
                                                            np.asarray(gs[1]["w"])), rtol=1e-6)


@pytest.mark.parametrize("opt_state_sync", ["keep", "average", "reset"])
def test_opt_state_options(opt_state_sync):
  opt = optax.sgd(0.1, momentum=0.9)
  alg = _local_sgd(opt, N, opt_state_sync=opt_state_sync)
  gs = _grads(2)
  _, st, _ = _run(alg, {"w": jnp.zeros((N, 6))}, gs, [False, True])
  trace = np.asarray(st.local[0].trace["w"])
  local = 0.9 * np.asarray(gs[0]["w"]) + np.asarray(gs[1]["w"])  # heavy-ball buffers
  expected = {"keep": local, "average": np.broadcast_to(local.mean(0), local.shape),
              "reset": np.zeros_like(local)}[opt_state_sync]
  np.testing.assert_allclose(trace, expected, rtol=1e-6, atol=1e-7)


def test_gossip_averaging_is_one_mixing_step():
  topo = topology.make("ring", N)
  w = np.asarray(topo.mixing_matrix)
  alg = _local_sgd(optax.sgd(0.1), N, reducer=T.gossip_of(Gossip([w])))
  gs = _grads(2, seed=3)
  out, _, _ = _run(alg, {"w": jnp.zeros((N, 6))}, gs, [False, True])
  local = -0.1 * (np.asarray(gs[0]["w"]) + np.asarray(gs[1]["w"]))
  np.testing.assert_allclose(np.asarray(out["w"]), w @ local, rtol=1e-5, atol=1e-6)


def test_local_sgd_bad_options():
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(small_cfg(algorithm="local_sgd", **{"local_sgd.averaging": "all"}))
  assert any("config.local_sgd.averaging='all' is not allowed" in line
             for line in e.value.errors), e.value.errors
  with pytest.raises(ValueError, match="needs at least one mixing matrix"):
    Gossip([])  # gossip averaging without a mixer
  with pytest.raises(ValueError, match="local_sgd.opt_state='bogus' is not allowed"):
    T.average_models(T.mean_of(AllReduce(N), "alive"), "bogus")


# ------------------------------------------------------------------ DiLoCo


def test_diloco_pseudo_gradient_closed_form_and_sign():
  """On f_i(x) = 0.5 ||x - c_i||^2, H local SGD steps (lr eta) from x_outer give
  mean_i x_i = c + (1 - eta)^H (x_outer - c), c = mean c_i, so the pseudo-gradient is
  Delta = (1 - (1 - eta)^H) (x_outer - c): the sign of grad F(x_outer) = x_outer - c."""
  eta, H, outer_lr = 0.1, 5, 0.7
  rng = np.random.default_rng(1)
  c = rng.standard_normal((N, 6)).astype(np.float32)
  x0 = rng.standard_normal(6).astype(np.float32)
  alg = _diloco(optax.sgd(eta), N, outer=optax.sgd(outer_lr))
  params = {"w": jnp.broadcast_to(jnp.asarray(x0), (N, 6))}
  state = jax.vmap(alg.init)(params)
  for t in range(H):
    g = {"w": params["w"] - c}
    fn = _step(alg, period_end=t == H - 1)
    params, state, _ = jax.vmap(fn, axis_name=AXIS)(g, state, params, step_contexts(N, t))
  delta = (1 - (1 - eta) ** H) * (x0 - c.mean(0))
  np.testing.assert_allclose(np.asarray(params["w"]),
                             np.broadcast_to(x0 - outer_lr * delta, (N, 6)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(state.sync.anchor["w"][0]), x0 - outer_lr * delta,
                             rtol=1e-5)
  # the outer step moved x_outer against grad F(x_outer) everywhere
  assert np.all(np.sign(x0 - np.asarray(params["w"][0])) == np.sign(x0 - c.mean(0)))


@pytest.mark.slow
def test_local_sgd_tau_1_equals_allreduce():
  """tau = 1 with the optimizer state averaged is synchronous SGD (momentum, weight decay)."""
  common = dict(momentum=0.9, weight_decay=1e-3, learning_rate=0.05, num_workers=N)
  _, ref, _ = run_steps(small_cfg(algorithm="allreduce", **common), 6)
  _, out, _ = run_steps(small_cfg(algorithm="local_sgd", **common,
                                **{"local_sgd.local_steps": 1, "local_sgd.opt_state": "average"}), 6)
  chex.assert_trees_all_close(out.params, ref.params, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_diloco_outer_lr_1_equals_local_sgd_tau_h():
  common = dict(momentum=0.9, learning_rate=0.05, num_workers=N)
  _, ref, _ = run_steps(small_cfg(algorithm="local_sgd", **common, **{"local_sgd.local_steps": 3}), 9)
  _, out, _ = run_steps(small_cfg(algorithm="diloco", **common,
                                **{"diloco.local_steps": 3, "diloco.outer_lr": 1.0,
                                   "diloco.outer_momentum": 0.0}), 9)
  chex.assert_trees_all_close(out.params, ref.params, rtol=1e-5, atol=1e-6)
  # the inner (local) optimizer states agree too
  chex.assert_trees_all_close(out.opt_state.local, ref.opt_state.local, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_train_counts_rounds_bytes_and_time_only_at_syncs():
  cfg = small_cfg(algorithm="local_sgd", num_steps=12, eval_every=4,
                  **{"local_sgd.local_steps": 4})
  s = train.train(cfg)
  ref = train.train(small_cfg(algorithm="allreduce", num_steps=12, eval_every=4))
  assert s["rounds"] == 3 and ref["rounds"] == 12
  assert s["bytes_sent"] == pytest.approx(ref["bytes_sent"] / 4)
  assert s["periods"] == [4, 4, 4]
  assert s["sim_time"] < ref["sim_time"]
  # at an evaluation right after a sync the models agree; in between they do not
  assert [h["rounds"] for h in s["history"]] == [0, 1, 2, 3]
  assert all(h["consensus_distance"] < 1e-6 for h in s["history"])
  mid = train.train(small_cfg(algorithm="local_sgd", num_steps=6, eval_every=6,
                              **{"local_sgd.local_steps": 4}))
  assert mid["consensus_distance"] > 1e-6


@pytest.mark.slow  # test_tau_1_local_sgd_equals_allreduce_and_ada_lupa_grows is fast
def test_train_ada_lupa_grows_the_period():
  cfg = small_cfg(algorithm="local_sgd", num_steps=60, eval_every=60, learning_rate=0.1,
                  **{"local_sgd.local_steps": 2, "local_sgd.schedule": "ada_lupa"})
  s = train.train(cfg)
  assert s["periods"][0] == 2 and max(s["periods"]) > 2
  assert sum(s["periods"][:-1]) < 60 <= sum(s["periods"])


# ------------------------------------------------------------------ synthetic PL problems


def _ls(**kw):
  from nbsgd_jax.models import problems
  return problems.least_squares(16, 64, 8, noise=1.0, seed=0, **kw)


def test_regroup_keeps_the_global_problem():
  from nbsgd_jax.models import problems
  base = _ls()
  x = np.random.default_rng(0).standard_normal(8)
  for p in (1, 4, 16):
    prob = problems.regroup(base, p)
    chex.assert_shape(prob.features, (p, 16 * 64 // p, 8))
    assert problems.objective(prob, x) == pytest.approx(problems.objective(base, x), rel=1e-12)
    assert prob.f_star == base.f_star
  with pytest.raises(ValueError, match="num_workers=3 is not allowed"):
    problems.regroup(base, 3)


def _ls_cfg(**kw):
  """The synthetic least-squares task of :func:`_ls` (16 shards of 64 examples, d = 8,
  noise 1) as a config of the training loop, plain SGD."""
  c = config_lib.default_config()
  over = {"dataset": "least_squares", "problem.shards": 16, "problem.examples_per_worker": 64,
          "problem.dim": 8, "problem.noise": 1.0, "problem.l2": 0.0, "problem.seed": 0,
          "momentum": 0.0, "progress": False, "learning_rate": 0.05, **kw}
  return config_lib.override(c, over)


def test_tau_1_local_sgd_equals_allreduce_and_ada_lupa_grows():
  kw = {"problem.heterogeneity": 1.0, "num_workers": 4, "batch_size": 2, "num_steps": 40,
        "eval_every": 20}
  ref = train.train(_ls_cfg(algorithm="allreduce", **kw))
  out = train.train(_ls_cfg(algorithm="local_sgd", **{"local_sgd.local_steps": 1}, **kw))
  assert [h["step"] for h in out["history"]] == [0, 20, 40]
  np.testing.assert_allclose([h["gap"] for h in out["history"]],
                             [h["gap"] for h in ref["history"]], rtol=1e-5)
  assert out["rounds"] == ref["rounds"] == 40
  # the gap is F(x_bar) - F* of the stored problem (an independent float64 evaluation)
  assert ref["f_star"] == _ls(heterogeneity=1.0).f_star
  ada = train.train(_ls_cfg(algorithm="local_sgd", **{
      **kw, "num_steps": 200, "eval_every": 200, "local_sgd.schedule": "ada_lupa",
      "local_sgd.local_steps": 2}))
  assert ada["periods"][0] == 2 and max(ada["periods"]) > 2
  assert ada["rounds"] == len(ada["periods"]) - (sum(ada["periods"]) > 200)
  with pytest.raises(config_lib.ConfigError, match="batch_size=999 is not allowed"):
    train.train(_ls_cfg(algorithm="allreduce", **{**kw, "batch_size": 999}))


@pytest.mark.slow
def test_linear_speed_up_on_least_squares():
  """Haddadpour et al. 2019 (PL): with tau = T^(2/3) / p^(1/3), F - F* at p = 16 is at most
  1/8 of that at p = 1 for the same number T of local steps (3 seeds each)."""
  from nbsgd_jax.models import problems
  base = problems.least_squares(16, 256, 10, noise=1.0, seed=0)
  mu, lip = problems.pl_constants(base)
  a = 8.0 * lip / mu  # eta_t = 2 / (mu (t + a)) = (2 / (mu a)) a / (t + a)
  T = 1000
  gap = {}
  for p in (1, 16):
    tau = round(T ** (2 / 3) / p ** (1 / 3))
    gap[p] = np.mean([train.train(_ls_cfg(
        algorithm="local_sgd", num_workers=p, batch_size=1, num_steps=T, eval_every=T,
        seed=s, lr_schedule="inverse_time", learning_rate=2.0 / (mu * a), lr_time_scale=a,
        **{"problem.examples_per_worker": 256, "problem.dim": 10, "local_sgd.local_steps": tau}))["gap"]
        for s in range(3)])
  assert gap[16] <= gap[1] / 8, gap
