"""Sweeps (``config.sweep``): a grid of hyperparameters and seeds run as one program per
structure; each run equals the same config trained alone."""

import copy
import json
import shlex

import numpy as np
import pytest
from jax import monitoring

from nbsgd_jax import config as config_lib
from nbsgd_jax.run import grid as sweeps
from nbsgd_jax.run import loop as loop_lib
from nbsgd_jax.run import step as step_lib
from nbsgd_jax.run.loop import train
from nbsgd_jax.run.sweep import sweep

from tests.helpers import run_python

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

_EVENTS: list = []
monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: _EVENTS.append(kw.get("fun_name"))
    if name == "/jax/core/compile/backend_compile_duration" else None)


def _cfg(**over):
  base = {"dataset": "mnist10k", "model": "mlp", "mlp_hidden": (32,), "num_workers": 4,
          "batch_size": 8, "num_steps": 8, "eval_every": 4, "eval_train_examples": 200,
          "progress": False, "lr_schedule": "constant", "momentum": 0.9,
          "compilation_cache": "none", "sweep_runs": "stacked"}
  return config_lib.override(config_lib.default_config(), {**base, **over})


def _alone(cfg, overrides):
  c = config_lib.override(copy.deepcopy(cfg), {**overrides, "sweep": ""})
  step_lib.PROGRAMS.clear()  # compiled on its own
  return train(c)


def _curve(summary):
  return np.array([[h[k] for k in ("train_loss", "test_loss", "consensus_distance",
                                   "bytes_sent", "sim_time")]
                   for h in summary["history"]], np.float64)


def _assert_same(a, b, rtol=1e-6):
  np.testing.assert_allclose(_curve(a), _curve(b), rtol=rtol, atol=1e-9)


# ------------------------------------------------------------------ the grid


def test_the_grid_is_the_product_of_its_axes_in_the_keys_types():
  runs = sweeps.expand(_cfg(sweep="learning_rate=0.05,0.1; seed=0:3; nesterov=True,False"))
  assert len(runs) == 12
  assert runs[0].name == "learning_rate=0.05,seed=0,nesterov=True"
  assert runs[0].overrides == {"learning_rate": 0.05, "seed": 0, "nesterov": True}
  assert [r.cfg.seed for r in runs[:6:2]] == [0, 1, 2]
  assert all(r.cfg.sweep == "" for r in runs)
  assert isinstance(runs[0].cfg.seed, int) and isinstance(runs[0].cfg.learning_rate, float)
  assert runs[-1].cfg.learning_rate == 0.1 and runs[-1].cfg.nesterov is False


def test_groups_follow_the_structure():
  runs = sweeps.expand(_cfg(sweep="momentum=0.0,0.9,0.5;learning_rate=0.1,0.2"))
  groups = sweeps.groups(runs)
  assert groups == [[0, 1], [2, 3, 4, 5]]  # momentum 0 has no momentum buffer
  assert sweeps.groups(runs, alone=lambda i: i == 3) == [[0, 1], [2, 4, 5], [3]]


@pytest.mark.parametrize("grid,needle", [
    ("learnin_rate=0.1,0.2", "config.learnin_rate is not a configuration key (did you mean "
                             "config.learning_rate?)"),
    ("learning_rate=", "config.learning_rate has no values"),
    ("seed=0,one", "config.seed='one' is not allowed: it must be an integer"),
    ("learning_rate=fast", "config.learning_rate='fast' is not allowed: it must be a number"),
    ("lr_milestones=0.5", "config.lr_milestones holds a tuple"),
    ("seed=0;seed=1", "config.seed is swept twice"),
    ("seed", "'seed' is not an axis"),
    ("sweep=a", "config.sweep cannot be swept"),
    ("cluster=1", "config.cluster holds a ConfigDict"),
    ("learning_rate=0.1,-1", "config.sweep run learning_rate=-1.0: config.learning_rate=-1.0"),
    ("seed=3:1", "config.sweep: seed=3:1 is an empty range: a:b needs a < b"),
    ("seed=2:2", "config.sweep: seed=2:2 is an empty range: a:b needs a < b"),
    ("seed=0,2:2,5", "config.sweep: seed=2:2 is an empty range"),
    ("learning_rate=0.1,0.1", "config.sweep: learning_rate=0.1,0.1 repeats 0.1: each value of "
                              "an axis is allowed once"),
    ("learning_rate=0.1,1e-1", "learning_rate=0.1,1e-1 repeats 0.1"),
    ("seed=0:3,2", "config.sweep: seed=0:3,2 repeats 2"),
    ("nesterov=True,true", "nesterov=True,true repeats True"),
    (" ; ", "config.sweep=' ; ' has no axis: a grid of zero runs is not allowed"),
    ("", "config.sweep='' has no axis"),
])
def test_bad_grids_are_refused_naming_the_key_and_nothing_is_written(tmp_path, grid, needle):
  with pytest.raises(config_lib.ConfigError) as e:
    sweep(_cfg(sweep=grid), str(tmp_path / "out"))
  assert any(needle in line for line in e.value.errors), e.value.errors
  assert all("\n" not in line for line in e.value.errors)
  assert not (tmp_path / "out").exists()


def test_every_bad_axis_is_named_and_a_good_grid_still_expands():
  with pytest.raises(config_lib.ConfigError) as e:
    sweeps.parse("seed=3:1;learning_rate=0.1,0.1;momentum=0.5,0.9", _cfg())
  assert len(e.value.errors) == 2
  assert sweeps.parse("seed=0:2,5;learning_rate=0.1,0.2", _cfg()) == [
      ("seed", [0, 1, 5]), ("learning_rate", [0.1, 0.2])]


def test_the_command_line_refuses_a_bad_grid_with_one_line_and_writes_nothing(tmp_path):
  out = tmp_path / "out"
  r = run_python(["-m", "nbsgd_jax.main", "--config=experiments/configs/quickstart.py",
                  f"--workdir={out}", "--config.sweep=seed=3:1"])
  assert r.returncode == 2, r.stderr
  assert r.stderr.splitlines() == [
      "error: config.sweep: seed=3:1 is an empty range: a:b needs a < b"]
  assert r.stdout == "" and not out.exists()


def test_train_refuses_a_sweep():
  with pytest.raises(config_lib.ConfigError, match="nbsgd_jax.train.sweep"):
    train(_cfg(sweep="seed=0,1"))


# ------------------------------------------------------------------ one program, equal runs


def test_a_three_by_three_grid_compiles_its_step_once_and_each_run_equals_it_alone(tmp_path):
  cfg = _cfg(sweep="learning_rate=0.02,0.05,0.1;seed=0:3", algorithm="dpsgd")
  step_lib.PROGRAMS.clear()
  start = len(_EVENTS)
  out = sweep(cfg, str(tmp_path))
  steps = [n for n in _EVENTS[start:] if n == "jit(program)"]
  assert len(steps) == 1, _EVENTS[start:]
  assert len(out) == 9 and len({o["train_loss"] for o in out}) == 9
  for o in (out[1], out[8]):  # two runs against themselves alone
    _assert_same(o, _alone(cfg, o["overrides"]))
  index = json.loads((tmp_path / "sweep.json").read_text())
  assert [r["group"] for r in index["runs"]] == [0] * 9
  for o in out:  # each run's files as a single run writes them
    d = tmp_path / o["run"]
    assert json.loads((d / "config.json").read_text())["learning_rate"] == \
        o["overrides"]["learning_rate"]
    assert len((d / "metrics.jsonl").read_text().splitlines()) == 3
    assert json.loads((d / "summary.json").read_text())["train_loss"] == o["train_loss"]


@pytest.mark.parametrize("algorithm,over", [
    pytest.param("allreduce", {"nonblocking.enabled": True, "cluster.scenario": "lognormal",
                               "cluster.delay": "bernoulli_exponential",
                               "cluster.delay_prob": 0.5, "cluster.delay_mean": 0.05},
                 marks=pytest.mark.long),
    pytest.param("local_sgd", {"local_sgd.local_steps": 2, "steps_per_dispatch": 4}, marks=pytest.mark.long),
    pytest.param("diloco", {"diloco.local_steps": 2, "optimizer": "adamw",
                            "learning_rate": 0.003}, marks=pytest.mark.long),
    pytest.param("choco_sgd", {"compression.name": "top_k", "compression.density": 0.2},
                 marks=pytest.mark.long),
    pytest.param("dpsgd", {"cluster.failures": "1:2:3", "consensus.control": True,
                           "consensus.target": 1e-3}, marks=pytest.mark.long),
])
def test_every_kind_of_host_part_per_run_equals_it_alone(algorithm, over):
  """Non-blocking counts and stragglers, periods, compression, failures, consensus targets:
  each run of a 2-run sweep (two seeds and rates) equals the same config alone. AdamW
  (DiLoCo's inner optimizer) to 1e-5: its square root and division reassociate under the
  runs axis' batching; SGD to 1e-6."""
  cfg = _cfg(algorithm=algorithm, sweep="learning_rate=0.01,0.03;seed=1,2", **over)
  rtol = 1e-5 if cfg.optimizer == "adamw" else 1e-6
  out = sweep(cfg)
  assert len({o["train_loss"] for o in out}) == 4
  _assert_same(out[3], _alone(cfg, out[3]["overrides"]), rtol)


def test_in_turn_each_run_equals_it_alone_and_compiles_once():
  """``sweep_runs="in_turn"`` (the default on a CPU): one run after another, the step
  compiled once."""
  cfg = _cfg(sweep="learning_rate=0.02,0.05;seed=0,1", sweep_runs="in_turn")
  step_lib.PROGRAMS.clear()
  start = len(_EVENTS)
  out = sweep(cfg)
  assert len([n for n in _EVENTS[start:] if n == "jit(program)"]) == 1
  _assert_same(out[3], _alone(cfg, out[3]["overrides"]), rtol=0)


def test_each_run_s_hooks_see_its_own_state_as_when_trained_alone():
  """``train_runs(hooks=...)``: in a stacked group each run's hooks get that run's slice of
  the state, at the steps ``train(hooks=...)`` calls them, with the same parameters."""
  import jax
  from nbsgd_jax.run.sweep import train_runs
  cfgs = [config_lib.override(_cfg(), {"learning_rate": lr, "seed": seed})
          for lr, seed in ((0.02, 0), (0.05, 1))]

  def probe(seen):
    return lambda step, state, s: seen.append(
        (step, s.cfg.learning_rate, float(sum(jax.tree.leaves(jax.tree.map(
            lambda x: np.abs(np.asarray(x, np.float64)).sum(), state.params))))))

  together = [[], []]
  train_runs(cfgs, hooks=[(probe(together[0]),), (probe(together[1]),)])
  for cfg, seen in zip(cfgs, together):
    alone = []
    train(cfg, hooks=(probe(alone),))
    assert [x[:2] for x in seen] == [x[:2] for x in alone]
    assert [x[0] for x in alone] == list(range(cfg.num_steps + 1))
    np.testing.assert_allclose([x[2] for x in seen], [x[2] for x in alone], rtol=1e-6)


@pytest.mark.long  # 15 s; runs in turn: test_in_turn_each_run_equals_it_alone_... (slow)
def test_on_a_mesh_the_runs_go_in_turn_and_compile_once():
  cfg = _cfg(backend="mesh", sweep="learning_rate=0.02,0.05")
  step_lib.PROGRAMS.clear()
  start = len(_EVENTS)
  out = sweep(cfg)
  assert len([n for n in _EVENTS[start:] if n == "jit(program)"]) == 1
  _assert_same(out[1], _alone(cfg, out[1]["overrides"]))


def test_a_diverged_run_is_marked_and_frozen_the_others_go_on(tmp_path):
  cfg = _cfg(sweep="learning_rate=0.05,1e9")
  out = sweep(cfg, str(tmp_path))
  good, bad = out
  assert bad["stopped"] == "diverged" and "training diverged" in bad["error"]
  assert bad["steps"] < cfg.num_steps
  assert good["stopped"] is None and good["steps"] == cfg.num_steps
  _assert_same(good, _alone(cfg, good["overrides"]))
  saved = json.loads((tmp_path / bad["run"] / "summary.json").read_text())
  assert saved["stopped"] == "diverged"


def test_an_interrupted_sweep_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
  cfg = _cfg(sweep="learning_rate=0.02,0.05;seed=0,1", checkpoint_every=4, num_steps=12)
  whole = sweep(cfg, str(tmp_path / "whole"))
  real, calls = loop_lib.Stepper.dispatch, []

  def crash(self, first, last, edit=None):
    calls.append(first)
    if first >= 6:
      raise KeyboardInterrupt  # after the checkpoint of step 4
    return real(self, first, last, edit)

  monkeypatch.setattr(loop_lib.Stepper, "dispatch", crash)
  with pytest.raises(KeyboardInterrupt):
    sweep(cfg, str(tmp_path / "cut"))
  monkeypatch.setattr(loop_lib.Stepper, "dispatch", real)
  again = sweep(cfg, str(tmp_path / "cut"))
  for a, b in zip(whole, again):
    _assert_same(a, b, rtol=0)
  steps = [json.loads(l)["step"] for l in
           (tmp_path / "cut" / again[0]["run"] / "metrics.jsonl").read_text().splitlines()]
  assert steps == [0, 4, 8, 12]  # records after the checkpoint dropped, none twice
  third = sweep(cfg, str(tmp_path / "cut"))  # finished: read back
  assert all(o["finished_before"] for o in third)


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
def test_the_command_line_runs_a_sweep_and_the_report_reads_its_runs(tmp_path):
  """The sweep prints its report's command; that command gives mean +- std over the 2 seeds
  of the cell, the report of run directories still reads them one by one."""
  from nbsgd_jax import report
  out = tmp_path / "sweep"
  cmd = ["-m", "nbsgd_jax.main", "--config=experiments/configs/mnist.py",
         f"--workdir={out}", "--config.progress=False", "--config.num_steps=4",
         "--config.eval_every=2", "--config.eval_train_examples=100", "--config.model=mlp",
         "--config.compilation_cache=none",
         "--config.sweep=learning_rate=0.05;seed=0:2"]
  r = run_python(cmd, timeout=600)
  assert r.returncode == 0, r.stderr
  assert "learning_rate=0.05,seed=1" in r.stdout
  assert r.stdout.splitlines()[-1].endswith(f": python -m nbsgd_jax.report {out}")
  runs = sorted(p.name for p in out.iterdir() if p.name.startswith("learning_rate"))
  assert runs == ["learning_rate=0.05,seed=0", "learning_rate=0.05,seed=1"]
  rep = run_python(["-m", "nbsgd_jax.report", *(out / d for d in runs), "--out",
                    tmp_path / "rep"])
  assert rep.returncode == 0, rep.stderr
  assert (tmp_path / "rep" / "report.md").exists()
  printed = shlex.split(r.stdout.splitlines()[-1].split(": ", 1)[1])
  assert printed[:3] == ["python", "-m", "nbsgd_jax.report"]
  assert report.main(printed[3:]) == 0
  md = (out / "report" / "report.md").read_text()
  acc = [json.loads((out / run / "summary.json").read_text())["test_accuracy"] for run in runs]
  assert f"| learning_rate=0.05 | 2 of 2 | {np.mean(acc):.4f} +- {np.std(acc, ddof=1):.4f} |" \
      in md, md
  assert (out / "report" / "loss_accuracy_vs_sim_time.png").exists()


@pytest.mark.long  # a resumed sweep: test_an_interrupted_sweep_resumes_to_the_uninterrupted_...
def test_stopped_runs_leave_the_program_and_a_resume_keeps_it(tmp_path, monkeypatch):
  """Runs of 4, 8 and 16 steps: once a quarter of them stopped, the stopped ones are taken
  out (one more compilation each time); every run still equals itself alone, and a sweep
  cut after that resumes to the same figures."""
  cfg = _cfg(sweep="num_steps=4,8,16;seed=0,1", checkpoint_every=4)
  step_lib.PROGRAMS.clear()
  start = len(_EVENTS)
  whole = sweep(cfg, str(tmp_path / "whole"))
  assert len([n for n in _EVENTS[start:] if n == "jit(program)"]) == 3  # 6, 4, then 2 runs
  assert [o["steps"] for o in whole] == [4, 4, 8, 8, 16, 16]
  _assert_same(whole[5], _alone(cfg, whole[5]["overrides"]))  # through both compactions
  real = loop_lib.Stepper.dispatch

  def crash(self, first, last, edit=None):
    if first >= 12:
      raise KeyboardInterrupt  # after the checkpoint of step 8, taken with 2 runs left
    return real(self, first, last, edit)

  monkeypatch.setattr(loop_lib.Stepper, "dispatch", crash)
  with pytest.raises(KeyboardInterrupt):
    sweep(cfg, str(tmp_path / "cut"))
  monkeypatch.setattr(loop_lib.Stepper, "dispatch", real)
  for a, b in zip(whole, sweep(cfg, str(tmp_path / "cut"))):
    _assert_same(a, b, rtol=0)


def test_a_stacked_group_builds_its_initial_states_in_one_program():
  """A stacked group's initial states come from one program (init under vmap over the runs'
  seeds) and equal each run's own initial state; with the stacking of its data and
  hyperparameters and the check that its runs share their shards, building the group's
  stepper compiles at most four programs, and a second group of the structure none."""
  import jax
  from nbsgd_jax import train as train_api
  from tests.helpers import backend_compiles
  cfgs = [_cfg(seed=s, learning_rate=lr, compilation_cache="none")
          for s, lr in ((0, 0.1), (1, 0.05), (2, 0.1))]
  setups = [train_api.setup(c) for c in cfgs]
  hosts = [train_api.make_host(s) for s in setups]
  step_lib.PROGRAMS.clear()
  stepper, names = backend_compiles(lambda: loop_lib.Stepper(setups, hosts))
  assert len(names) <= 4, names
  for r, s in enumerate(setups):
    own = train_api.init_state(s)
    for got, want in zip(jax.tree.leaves(stepper.state_of(r)), jax.tree.leaves(own)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  kernel = lambda r: np.asarray(max(jax.tree.leaves(stepper.state_of(r).params),
                                     key=lambda x: x.size))
  assert not np.array_equal(kernel(0), kernel(1))  # each run's own seed
  again = [train_api.setup(c) for c in cfgs]
  _, names = backend_compiles(lambda: loop_lib.Stepper(again, [train_api.make_host(s)
                                                               for s in again]))
  assert names == [], names
