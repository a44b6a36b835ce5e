"""Inputs once accepted in silence (issue 70, item 4), now refused with one line naming the key,
the value and what is allowed, before anything is written: hierarchical levels that do not
tile the workers, a sweep axis with no effect on any run, a run whose evaluated model cannot
change within its budget (HALoS, asynchronous DiLoCo, DiLoCo with a delayed outer step) and
``halos.regions`` that disagrees with ``cluster.levels``.

The earliest step at which an event-clock DiLoCo's evaluated model can change
(:func:`nbsgd_jax.recipes.asynchronous.first_change`) is checked against the event clock
itself: no run of the clock changes it earlier, and a two-worker case attains it."""

import copy
import types

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.host import cluster_config, events, regional_servers
from nbsgd_jax.recipes.asynchronous import first_change
from nbsgd_jax.run import grid
from nbsgd_jax.run.sweep import sweep

from tests.helpers import experiment_config, run_python, slow_except

QUICKSTART = "experiments/configs/quickstart.py"  # 8 workers, 200 steps, an evaluation every 20
LEVEL = "0:1e9"  # a level's latency and bandwidth (what the cases vary is its size)

# the six inputs of the report, as overrides of the quickstart config, and the start of the
# one line each must give
CASES = {
    "uneven levels": ({"cluster.levels": (f"3:{LEVEL}",)},
                      f"config.cluster.levels=('3:{LEVEL}',) is not allowed with "
                      "config.num_workers=8: level 0 ('3:0:1e9') makes groups of 3 workers, "
                      "which does not divide 8"),
    "a level bigger than the cluster": ({"cluster.levels": (f"16:{LEVEL}",)},
                                        f"config.cluster.levels=('16:{LEVEL}',) is not allowed "
                                        "with config.num_workers=8: level 0 ('16:0:1e9') makes "
                                        "groups of 16 workers, which exceeds 8"),
    "two levels not dividing the workers": (
        {"cluster.levels": (f"2:{LEVEL}", f"3:{LEVEL}")},
        f"config.cluster.levels=('2:{LEVEL}', '3:{LEVEL}') is not allowed with "
        "config.num_workers=8: level 1 ('3:0:1e9') makes groups of 6 workers, which does not "
        "divide 8"),
    "a sweep axis with no effect": ({"sweep": "diloco.outer_lr=0.1,0.2"},
                                    "config.sweep: config.diloco.outer_lr=0.1,0.2 is not "
                                    "allowed: it has no effect on any run "
                                    "(config.algorithm='dpsgd')"),
    "halos for 20 steps": ({"algorithm": "halos", "num_steps": 20},
                           "config.halos.accumulation=32 is not allowed with "
                           "config.num_steps=20: the run would end before its evaluated model "
                           "first changes, at step 145 at the earliest"),
    "halos regions against the levels": ({"algorithm": "halos",
                                          "cluster.levels": (f"4:{LEVEL}",)},
                                         "config.halos.regions=4 is not allowed with "
                                         f"config.cluster.levels=('4:{LEVEL}',) and "
                                         "config.num_workers=8: the regions are the network's 2 "
                                         "top-level groups"),
}


def _quickstart(**overrides):
  return config_lib.override(experiment_config("quickstart"), overrides)


def _errors(cfg):
  """The lines a config (or its sweep) is refused with; [] when accepted."""
  try:
    grid.expand(cfg) if cfg.sweep else config_lib.validate(cfg)
  except config_lib.ConfigError as e:
    return e.errors
  return []


@pytest.mark.parametrize("case", list(CASES))
def test_each_input_is_refused_with_one_line(case):
  overrides, line = CASES[case]
  errors = _errors(_quickstart(**overrides))
  assert len(errors) == 1 and errors[0].startswith(line), errors
  assert "\n" not in errors[0] and "is not allowed" in errors[0]


@pytest.mark.parametrize("case", slow_except(list(CASES), fast=("halos for 20 steps",)))
def test_the_command_line_exits_2_with_one_line_and_writes_nothing(case, tmp_path):
  overrides, line = CASES[case]
  out = tmp_path / "run"
  r = run_python(["-m", "nbsgd_jax.main", f"--config={QUICKSTART}", f"--workdir={out}",
                  "--config.progress=False", *(f"--config.{k}={v}" for k, v in overrides.items())])
  assert r.returncode == 2, r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and errors[0].startswith(f"error: {line}"), r.stderr
  assert "Traceback" not in r.stderr and r.stdout == "" and not out.exists()


@pytest.mark.parametrize("levels", [(f"2:{LEVEL}", f"4:{LEVEL}"), (f"8:{LEVEL}",),
                                    (f"2:{LEVEL}", f"2:{LEVEL}", f"2:{LEVEL}")])
def test_levels_that_tile_the_workers_pass(levels):
  """Groups of 2 in groups of 8, one group of all 8, three nested pairs: each level's group
  size divides the workers."""
  assert _errors(_quickstart(**{"cluster.levels": levels})) == []


def test_regions_that_match_the_top_level_groups_pass():
  """Levels of 2 and 2: groups of 4, so 2 top-level groups; a single level of 8: 1 region."""
  for levels, regions in (((f"2:{LEVEL}", f"2:{LEVEL}"), 2), ((f"8:{LEVEL}",), 1)):
    cfg = _quickstart(**{"algorithm": "halos", "num_steps": 1000, "cluster.levels": levels,
                         "halos.regions": regions})
    assert _errors(cfg) == [], levels


def test_a_sweep_axis_that_matters_in_some_runs_passes_and_nothing_is_written(tmp_path):
  """``diloco.outer_lr`` beside ``algorithm=dpsgd,diloco`` matters in the DiLoCo runs; alone
  with ``dpsgd`` it is refused before the sweep's directory exists."""
  mixed = _quickstart(sweep="algorithm=dpsgd,diloco;diloco.outer_lr=0.1,0.2")
  assert len(grid.expand(mixed)) == 4
  with pytest.raises(config_lib.ConfigError) as e:
    sweep(_quickstart(sweep="seed=0,1;nonblocking.window=5,10"), str(tmp_path / "out"))
  assert e.value.errors == [
      "config.sweep: config.nonblocking.window=5,10 is not allowed: it has no effect on any run "
      "(config.nonblocking.enabled=False), so its 2 values would train identical runs; sweep a "
      "key the runs read"]
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("over,key,step", [
    # the quickstart's 8 workers in HALoS's 4 regions of 2: an LPS sends after K = 32 pushes,
    # so one of its 2 workers pushed 16 times, 16 rounds of a pull and H = 8 steps: 144
    # events, then the update lands with one more push
    ({"algorithm": "halos"}, "halos.accumulation", 16 * 9 + 1),
    # one region of 8 workers, H = 1, K = 32: the 32 pushes take a step each, then one more
    ({"algorithm": "halos", "halos.regions": 1, "halos.local_steps": 1}, "halos.accumulation",
     32 + 1),
    # asynchronous DiLoCo: a pull, then H = 50 steps, the last one pushing to the server
    ({"algorithm": "async_diloco"}, "diloco.local_steps", 51),
    # with dynamic local updates a slower worker runs min(5, H) steps at the least
    ({"algorithm": "async_diloco", "async_diloco.dynamic_local_updates": True},
     "async_diloco.min_local_steps", 6),
])
def test_a_run_shorter_than_its_evaluated_model_s_first_change_is_refused(over, key, step):
  assert first_change(_quickstart(**over))[:2] == (step, key)
  errors = _errors(_quickstart(**over, num_steps=step - 1))
  assert len(errors) == 1 and errors[0].startswith(
      f"config.{key}=") and f"with config.num_steps={step - 1}: the run would end before its " \
      f"evaluated model first changes, at step {step} at the earliest" in errors[0], errors
  assert _errors(_quickstart(**over, num_steps=step, eval_every=step)) == []


def test_diloco_with_a_delayed_outer_step_needs_two_periods():
  """``diloco.overlap='delayed'``: the first mean lands a period late, so the outer model (the
  evaluated one) first steps at 2 H = 100."""
  over = {"algorithm": "diloco", "diloco.overlap": "delayed"}
  assert _errors(_quickstart(**over, num_steps=99)) == [
      "config.diloco.local_steps=50 is not allowed with config.diloco.overlap='delayed' and "
      "config.num_steps=99: the run would end before its evaluated (outer) model first "
      "changes, at step 100 (the first mean lands a period late); use at most 49, or "
      "num_steps >= 100"]
  assert _errors(_quickstart(**over, num_steps=100)) == []
  assert _errors(_quickstart(**{**over, "diloco.overlap": "eager"}, num_steps=60)) == []


def test_a_longer_run_is_warned_of_the_evaluations_before_the_bound():
  """The quickstart's 200 steps with HALoS pass (the bound is 145), but its evaluations at
  steps 20 to 140 read the initial model, and when it first changes after 145 the event clock
  decides: one warning line says so."""
  lines = config_lib.odd_warnings(_quickstart(algorithm="halos"))
  assert len(lines) == 1 and lines[0].startswith(
      "config.algorithm='halos': its evaluated model cannot change before step 145 ")
  assert lines[0].endswith("the evaluations at steps 20 to 140 read the initial model")
  assert config_lib.odd_warnings(_quickstart(algorithm="halos", eval_every=200)) == []


def _clock_first_change(over, slowdown):
  """The device step (from 1) in which the event clock first steps the evaluated model: the
  GPS's first receive (HALoS) or the first push (asynchronous DiLoCo)."""
  cfg = config_lib.override(config_lib.default_config(), {
      "num_workers": len(slowdown), "cluster.slowdown": slowdown, **over})
  cluster, n = cluster_config.from_config(cfg), len(slowdown)
  if cfg.algorithm == "halos":
    h = cfg.halos
    clock = regional_servers.RegionalServerTimes(cluster, 4e3, np.full(n, h.local_steps),
                                                 h.regions, h.accumulation)
    changed = lambda ev: (ev.slot_kind[0] == regional_servers.GPS_RECV).any()  # noqa: E731
  else:
    clock = events.ServerEventTimes(cluster, 4e3, np.full(n, cfg.diloco.local_steps))
    changed = lambda ev: ev.push.any()  # noqa: E731
  for step in range(1, 10 ** 5):
    inputs = types.SimpleNamespace()
    clock.inputs(step, inputs, None)
    if changed(inputs.events):
      return first_change(cfg)[0], step
  raise AssertionError("the evaluated model never changed")


@pytest.mark.parametrize("over,slowdown", [
    ({"algorithm": "halos"}, (1.0,) * 8),
    ({"algorithm": "halos"}, (1.0, 1.3, 1.1, 2.0, 1.0, 3.0, 1.2, 1.7)),
    ({"algorithm": "halos", "halos.regions": 8}, (1.0,) * 8),
    ({"algorithm": "halos", "halos.regions": 1, "halos.local_steps": 1,
      "halos.accumulation": 8}, (1.0, 1.1, 1.2, 1.3)),
    ({"algorithm": "halos", "halos.regions": 2, "halos.local_steps": 3,
      "halos.accumulation": 2}, (1.0, 1.5)),
    ({"algorithm": "async_diloco", "diloco.local_steps": 7}, (1.0, 2.0, 1.5, 1.1)),
])
def test_the_event_clock_never_changes_the_evaluated_model_before_the_bound(over, slowdown):
  bound, actual = _clock_first_change(over, slowdown)
  assert actual >= bound, (bound, actual)


@pytest.mark.parametrize("over,slowdown", [
    # two regions of one worker, K = 1: worker 0 sends at its push (step 2, after the two
    # pulls of step 1), the slower worker 1's push (step 3) lands the update: 3 = max(1, 2) + 1
    ({"algorithm": "halos", "halos.regions": 2, "halos.local_steps": 1,
      "halos.accumulation": 1}, (1.0, 2.0)),
    # one worker: its pull, then 4 steps, the last one pushing: step 5
    ({"algorithm": "async_diloco", "diloco.local_steps": 4}, (1.0,)),
])
def test_the_bound_is_attained(over, slowdown):
  bound, actual = _clock_first_change(over, slowdown)
  assert actual == bound == first_change(config_lib.override(
      config_lib.default_config(), {"num_workers": len(slowdown), **over}))[0]
