"""Runs as data (``docs/design.md``, "Runs as data"): the compiled step takes the run's
hyperparameters as an input, so a run that differs from an earlier one only in them compiles
nothing and equals the same run compiled on its own."""

import copy
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.run import hparams as hparams_lib
from nbsgd_jax.recipes import optim
from nbsgd_jax import transforms as T
from nbsgd_jax.run import step as step_lib
from nbsgd_jax.run.loop import train

from tests.helpers import ROOT, backend_compiles

_compiles = backend_compiles


def _cfg(**over):
  c = config_lib.default_config()
  base = {"dataset": "least_squares", "model": "mlp", "num_workers": 4, "batch_size": 4,
          "num_steps": 12, "eval_every": 4, "progress": False, "learning_rate": 0.05,
          "lr_schedule": "constant", "momentum": 0.9, "compilation_cache": "none"}
  return config_lib.override(c, {**base, **over})


def _with(cfg, over):
  """A copy of ``cfg`` with ``over`` (``config.override`` changes its argument)."""
  return config_lib.override(copy.deepcopy(cfg), over)


def _losses(summary):
  return np.array([[h.get("train_loss"), h.get("consensus_distance")]
                   for h in summary["history"]], np.float64)


# ------------------------------------------------------------------ schedules against optax


def _optax_schedule(cfg):
  """The schedule as optax's own functions write it (the reference)."""
  lr, warm = cfg.learning_rate, cfg.warmup_steps
  decay = max(cfg.num_steps - warm, 1)
  if cfg.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, decay, alpha=cfg.lr_min / lr)
  elif cfg.lr_schedule == "step":
    bounds: dict = {}
    for f in cfg.lr_milestones:
      b = max(int(round(f * cfg.num_steps)) - warm, 1)
      bounds[b] = bounds.get(b, 1.0) * cfg.lr_decay
    main = optax.piecewise_constant_schedule(lr, bounds)
  elif cfg.lr_schedule == "inverse_time":
    main = lambda t: lr * cfg.lr_time_scale / (t + cfg.lr_time_scale)
  else:
    main = optax.constant_schedule(lr)
  if warm:
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), main], [warm])
  return main


@pytest.mark.parametrize("kind", ["constant", "cosine", "step", "inverse_time"])
@pytest.mark.parametrize("warm", [0, 7])
def test_traced_schedule_equals_optax(kind, warm):
  cfg = config_lib.override(config_lib.default_config(), {
      "learning_rate": 0.3, "lr_schedule": kind, "warmup_steps": warm, "num_steps": 60,
      "lr_min": 0.01, "lr_milestones": (0.5, 0.75), "lr_decay": 0.2, "lr_time_scale": 9.0})
  ref = _optax_schedule(cfg)
  hp = {k: jnp.asarray(v) for k, v in optim.hparams(cfg).items()}
  traced = jax.jit(lambda h, t: optim.make_schedule(cfg, h)(t))
  got = np.array([float(traced(hp, t)) for t in range(60)])
  want = np.array([float(ref(t)) for t in range(60)])
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)


def test_one_compiled_schedule_serves_every_rate():
  cfg = config_lib.override(config_lib.default_config(), {"lr_schedule": "cosine",
                                                          "num_steps": 50})
  traced = jax.jit(lambda h, t: optim.make_schedule(cfg, h)(t))
  for lr in (0.1, 0.4):
    c = _with(cfg, {"learning_rate": lr})
    hp = {k: jnp.asarray(v) for k, v in optim.hparams(c).items()}
    assert float(traced(hp, 10)) == pytest.approx(float(_optax_schedule(c)(10)), rel=2e-6)
  assert traced._cache_size() == 1


# ------------------------------------------------------------------ injected transforms


def test_injected_reads_the_context_and_equals_the_constant_transform():
  params = {"w": jnp.arange(3.0)}
  grads = {"w": jnp.array([1.0, -2.0, 0.5])}
  t = T.injected(lambda v: optax.sgd(v["lr"], momentum=v["m"]), {"lr": 0.1, "m": 0.9})
  state = t.init(params)
  ctx = T.StepContext(0, 1, 1, None, hparams={"lr": jnp.float32(0.3), "m": jnp.float32(0.5)})
  u, _, _ = jax.jit(t.update)(grads, state, params, ctx)
  want, _ = optax.sgd(0.3, momentum=0.5).update(grads, optax.sgd(0.3, 0.5).init(params))
  np.testing.assert_allclose(u["w"], want["w"], rtol=1e-7)
  u0, _, _ = t.update(grads, state, params, ctx._replace(hparams=None))  # the defaults
  np.testing.assert_allclose(u0["w"], -0.1 * np.array([1.0, -2.0, 0.5]), rtol=1e-7)
  with pytest.raises(KeyError, match=r"lack \['m'\]"):
    t.update(grads, state, params, ctx._replace(hparams={"lr": 0.3}))


# ------------------------------------------------------------------ structure


def test_structure_key_ignores_hyperparameters_and_host_keys():
  key = hparams_lib.structure_key
  a = _cfg()
  for over in ({"learning_rate": 0.3}, {"seed": 4}, {"momentum": 0.5}, {"num_steps": 40},
               {"eval_every": 3}, {"cluster.seed": 9}, {"cluster.spread": 2.0},
               {"weight_decay": 0.0}, {"progress": True}):
    assert key(_with(a, over)) == key(a), over
  for over in ({"momentum": 0.0}, {"weight_decay": 1e-4}, {"algorithm": "allreduce"},
               {"topology": "torus"}, {"batch_size": 2}, {"nesterov": True},
               {"nonblocking.enabled": True}):
    assert key(_with(a, over)) != key(a), over
  d = _cfg(algorithm="diloco", **{"diloco.local_steps": 4})
  assert key(_with(d, {"diloco.outer_lr": 0.3})) == key(d)
  assert key(_with(d, {"diloco.outer_momentum": 0.0})) != key(d)


def test_hparams_hold_every_declared_key():
  c = _cfg(algorithm="choco_sgd", **{"compression.name": "top_k"})
  hp = hparams_lib.values(c)
  assert {"learning_rate", "momentum", "seed", "choco.gamma", "diloco.outer_lr"} <= set(hp)
  assert hp["seed"].dtype == np.int32 and hp["choco.gamma"].dtype == np.float32
  keys = hparams_lib.keys(c)
  assert "choco.gamma" in keys and "learning_rate" in keys


# ------------------------------------------------------------------ no recompilation


CHANGES = [
    ("dpsgd", {}, {"learning_rate": 0.02, "seed": 3}),
    ("dpsgd", {"lr_schedule": "cosine", "warmup_steps": 2}, {"learning_rate": 0.1,
                                                             "warmup_steps": 3,
                                                             "num_steps": 16}),
    ("allreduce", {"weight_decay": 1e-3, "grad_clip": 1.0}, {"weight_decay": 1e-2,
                                                             "grad_clip": 0.1,
                                                             "momentum": 0.5}),
    ("allreduce", {"optimizer": "adamw", "learning_rate": 0.01},
     {"adam_b2": 0.9, "momentum": 0.8}),
    ("diloco", {"diloco.local_steps": 4}, {"diloco.outer_lr": 0.3,
                                           "diloco.outer_momentum": 0.5}),
    ("choco_sgd", {"compression.name": "top_k", "compression.density": 0.5},
     {"choco.gamma": 0.2, "seed": 2}),
    ("dpsgd", {"consensus.control": True, "consensus.target": 1e-3},
     {"seed": 5, "learning_rate": 0.01}),
]


@pytest.mark.parametrize("algorithm,base,change", [  # three slow, four long
    pytest.param(*c, marks=pytest.mark.slow if i in (0, 4, 6) else pytest.mark.long)
    for i, c in enumerate(CHANGES)], ids=[f"{a}-{'-'.join(c)}" for a, _, c in CHANGES])
def test_changed_hyperparameters_compile_nothing_and_equal_a_fresh_run(algorithm, base,
                                                                        change):
  """Run A, then B (A with other hyperparameters) in the same process: B makes no backend
  compilation and its every evaluation equals B compiled on its own (the cache cleared)."""
  a = _cfg(algorithm=algorithm, **base)
  b = _with(a, change)
  step_lib.PROGRAMS.clear()
  train(a)
  warm_b, names = _compiles(lambda: train(b))
  assert names == [], names
  step_lib.PROGRAMS.clear()
  cold_b, names = _compiles(lambda: train(b))
  assert names  # compiled again: the check above can fail
  np.testing.assert_allclose(_losses(warm_b), _losses(cold_b), rtol=1e-6, atol=1e-12)


@pytest.mark.long  # the property on small runs: test_changed_hyperparameters_compile_nothing_...
def test_another_rate_and_seed_on_mnist_compile_nothing():
  """The main job's kind of run (a CNN on mnist10k, D-PSGD): a second ``train()`` with
  another learning rate and seed makes no backend compilation; the same config run after
  the cache is cleared gives the same figures."""
  cfg = config_lib.override(config_lib.default_config(), {
      "dataset": "mnist10k", "model": "cnn", "cnn_channels": (4, 8), "num_workers": 4,
      "batch_size": 8, "num_steps": 6, "eval_every": 3, "progress": False,
      "eval_train_examples": 64, "compilation_cache": "none"})
  step_lib.PROGRAMS.clear()
  train(cfg)
  other = _with(cfg, {"learning_rate": 0.02, "seed": 1})
  warm, names = _compiles(lambda: train(other))
  assert names == []
  step_lib.PROGRAMS.clear()
  cold = train(other)
  for k in ("train_loss", "test_loss", "test_accuracy", "consensus_distance"):
    assert warm[k] == pytest.approx(cold[k], rel=1e-6), k


def test_a_new_structure_compiles():
  step_lib.PROGRAMS.clear()
  train(_cfg())
  _, names = _compiles(lambda: train(_cfg(momentum=0.0)))
  assert names


def test_the_cache_keeps_a_bounded_number_of_structures():
  cache = step_lib.ProgramCache(max_structures=2)
  made = []
  for key in ("a", "b", "a", "c", "a", "b"):
    cache.get(key, "train", lambda key=key: made.append(key) or key)
  assert made == ["a", "b", "c", "b"]  # "b" dropped when "c" came (least recently used)
  assert cache.get("", "train", lambda: "fresh") == "fresh"


# ------------------------------------------------------------------ persistent cache


@pytest.mark.slow
def test_a_second_process_reads_the_persistent_compilation_cache(tmp_path):
  """``config.compilation_cache``: the first process writes the run's programs, the second
  reads them back (JAX's cache-hit events) instead of compiling them."""
  script = textwrap.dedent(f"""
      import json, sys
      from jax import monitoring
      hits, compiles = [], []
      monitoring.register_event_listener(
          lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits"
          else None)
      monitoring.register_event_duration_secs_listener(
          lambda name, secs, **kw: compiles.append(name)
          if name == "/jax/core/compile/backend_compile_duration" else None)
      from nbsgd_jax import config as config_lib
      from nbsgd_jax.run.loop import train
      cfg = config_lib.override(config_lib.default_config(), {{
          "dataset": "least_squares", "num_workers": 4, "batch_size": 4, "num_steps": 4,
          "eval_every": 4, "progress": False, "compilation_cache": {str(tmp_path / 'xla')!r}}})
      out = train(cfg)
      print(json.dumps({{"hits": len(hits), "compiles": len(compiles),
                        "loss": out["train_loss"]}}))
  """)
  env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                    capture_output=True, text=True).stdout.splitlines()[-1])
          for _ in range(2)]
  # the first may hit what it wrote itself; the second reads every program back (a hit is
  # still a compile event)
  assert runs[1]["hits"] == runs[1]["compiles"] > runs[0]["hits"], runs
  assert runs[0]["loss"] == runs[1]["loss"]
  assert any((tmp_path / "xla").iterdir())


def test_compilation_cache_config_is_checked():
  with pytest.raises(config_lib.ConfigError, match="compilation_cache"):
    config_lib.validate(_cfg(compilation_cache=3))


@pytest.mark.parametrize("over", [
    {"algorithm": "dpsgd", "steps_per_dispatch": 3},
    {"algorithm": "local_sgd", "local_sgd.schedule": "ada_lupa", "local_sgd.local_steps": 2,
     "steps_per_dispatch": 4},  # needs F at each synchronisation: read inside the dispatch
], ids=["blocks", "reports-at-once"])
def test_steps_read_at_the_end_equal_steps_read_each_dispatch(over):
  """``Stepper.steps(read_each_dispatch=False)`` (the benchmarks' timing) returns every step
  and leaves the state and the host as reading after each dispatch does."""
  from nbsgd_jax import train as train_api
  cfg = _cfg(**over)
  each, end = (train_api.Stepper.of(train_api.setup(cfg)) for _ in range(2))
  a = each.steps(7)
  b = end.steps(7, read_each_dispatch=False)
  assert [x[0] for x in a] == [x[0] for x in b] == list(range(7))
  for (_, _, la, ra), (_, _, lb, rb) in zip(a, b):
    np.testing.assert_array_equal(la, lb)
    assert ra.keys() == rb.keys()
  jax.tree.map(np.testing.assert_array_equal, each.state.params, end.state.params)
  assert each.hosts[0].state_dict() == end.hosts[0].state_dict()


# ------------------------------------------------------------------ the open context


def _with_ages(s, scale: float):
  """``s`` with a recipe host part that writes ``per_worker["age"] = step + i`` (worker i)
  and ``shared["scale"]``, and a transform that reports what it read: nothing else of the
  step is edited."""
  from nbsgd_jax import host as host_lib
  n = s.cfg.num_workers

  class Ages(host_lib.HostPart):
    name = "ages"

    def inputs(self, step, inputs, probe):
      inputs.per_worker["age"] = np.arange(n, dtype=np.int32) + step
      inputs.shared["scale"] = np.float32(scale)

  inner = s.recipe.transform

  def update(updates, state, params, ctx):
    updates, state, report = inner.update(updates, state, params, ctx)
    seen = ctx.per_worker["age"].astype(jnp.float32) * ctx.shared["scale"]
    return updates, state, {**report, "age_seen": seen}

  recipe = s.recipe._replace(transform=inner._replace(update=update), host_parts=(Ages,))
  return s._replace(recipe=recipe)


@pytest.mark.parametrize("over", [{}, {"steps_per_dispatch": 3},
                                  pytest.param({"backend": "mesh"}, marks=pytest.mark.slow)],
                         ids=["one-step", "blocks", "mesh"])
def test_a_host_part_s_open_context_reaches_each_worker_without_editing_the_step(over):
  """``HostInputs.per_worker`` / ``shared`` (a recipe's own host part) arrive as
  ``StepContext.per_worker`` / ``shared``: worker i reads its own row at every step, in one-step
  and multi-step dispatches and on a mesh."""
  from nbsgd_jax import train as train_api
  s = _with_ages(train_api.setup(_cfg(algorithm="dpsgd", **over)), 0.5)
  stepper = train_api.Stepper.of(s, cache=step_lib.ProgramCache())
  for step, _, _, report in stepper.steps(5):
    np.testing.assert_array_equal(report["age_seen"], 0.5 * (np.arange(4) + step))


def test_stacked_runs_read_their_own_open_context():
  """Two runs stacked in one program (a sweep's runs axis), each host writing its own shared
  value: each run's workers read theirs."""
  from nbsgd_jax import train as train_api
  from nbsgd_jax.run.records import Records
  import contextlib
  setups = [_with_ages(train_api.setup(_cfg(algorithm="dpsgd", seed=seed)), scale)
            for seed, scale in ((0, 0.5), (1, 2.0))]
  stepper = train_api.Stepper(setups, [train_api.make_host(x) for x in setups],
                              cache=step_lib.ProgramCache())
  runs = stepper.attach([Records(x.cfg, None, None, False, contextlib.ExitStack())
                         for x in setups])
  for _ in range(3):
    done = runs[0].done
    stepper.dispatch(done, done + 1)
    for run in runs:
      run.done += 1
    stepper.flush()
    for scale, steps in zip((0.5, 2.0), stepper.last_read):
      (step, _, _, report), = steps
      np.testing.assert_array_equal(report["age_seen"], scale * (np.arange(4) + step))


def test_a_per_worker_entry_of_the_wrong_length_is_refused_by_name():
  from nbsgd_jax import host as host_lib
  from nbsgd_jax import train as train_api
  s = train_api.setup(_cfg(algorithm="dpsgd"))
  inputs = host_lib.HostInputs(0, count=np.ones(4, np.int32))
  inputs.per_worker["age"] = np.zeros(3)
  with pytest.raises(ValueError, match=r"per_worker\['age'\] has shape \(3,\)"):
    step_lib.host_context(s, inputs)


def test_event_masks_are_typed_and_one_of_the_wrong_length_is_refused_by_name():
  from nbsgd_jax import host as host_lib
  from nbsgd_jax import train as train_api
  from nbsgd_jax.transforms.asynchronous import Events
  s = train_api.setup(_cfg(algorithm="dpsgd"))
  inputs = host_lib.HostInputs(0, count=np.ones(4, np.int32))
  with pytest.raises(TypeError):  # a mask that is not a field of Events
    Events(fire=np.zeros(4, bool), touched=np.zeros(4, bool))
  inputs.events = Events(fire=np.zeros(4, bool), peer=np.arange(3))
  with pytest.raises(ValueError, match=r"events.peer has shape \(3,\)"):
    step_lib.host_context(s, inputs)
  inputs.events = Events(fire=np.ones(4, bool), peer=np.arange(4))
  ctx = step_lib.host_context(s, inputs)
  assert isinstance(ctx.events, Events) and ctx.events.apply is None
  np.testing.assert_array_equal(ctx.events.peer, np.arange(4))


# ------------------------------------------------------------------ start-up


@pytest.mark.slow
def test_a_fresh_quick_start_compiles_few_programs_before_its_first_step():
  """A fresh process's ``train()`` of the guide's quick start compiles at most 15 programs
  up to its first step (the initial state is one program: the model's init, the broadcast
  and the transforms' init; data and hyperparameters go to the device without a program);
  issue 53 counted 55."""
  script = textwrap.dedent("""
      import importlib.util, json
      from jax import monitoring
      compiles, at = [], {}
      monitoring.register_event_duration_secs_listener(
          lambda name, secs, **kw: compiles.append(kw.get("fun_name"))
          if name == "/jax/core/compile/backend_compile_duration" else None)
      from nbsgd_jax import config as config_lib
      from nbsgd_jax.run.loop import train
      spec = importlib.util.spec_from_file_location("q", "experiments/configs/quickstart.py")
      q = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(q)
      cfg = config_lib.override(q.get_config(), {"num_steps": 4, "eval_every": 4,
                                                 "progress": False})
      hook = lambda step, state, s: at.setdefault(step, list(compiles))
      train(cfg, hooks=(hook,))
      print(json.dumps({str(k): v for k, v in at.items()}))
  """)
  env = {**os.environ, "NBSGD_JAX_COMPILATION_CACHE": "none"}
  out = subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=ROOT,
                       capture_output=True, text=True).stdout.splitlines()[-1]
  at = json.loads(out)
  assert len(at["0"]) <= 3, at["0"]   # before the first dispatch: the initial state
  assert len(at["1"]) <= 15, at["1"]  # and the first step's programs
