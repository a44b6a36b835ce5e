"""The tuning runs' own config overrides (``tune.overrides``: the pick made on a validation split
held out of training, the reported runs without it) and up to k extensions beyond an edge pick
(``tune.extend = k``), as ``experiments/tune_seeds.py`` tunes; a study without them composes
the configs, and so the cache keys, of before."""

import json
import math
import os

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.study import driver, output, runs, schema

from tests.helpers import TINY_STUDY as TINY
from tests.helpers import compose_study_run_before_stages

HELD_OUT = {"validation_examples": 4}  # of TINY's 16 training examples


class _Scores:
  """A run store whose runs are a synthetic score: final ``train_loss`` = ``(log10(lr) -
  log10(best))^2``; it keeps each job's config and label."""

  def __init__(self, best: float):
    self.best, self.jobs = best, []

  def get(self, jobs):
    self.jobs.extend((cfg, label) for cfg, label, _ in jobs)
    return [{"key": label, "diverged": None, "seconds": 0.0, "history": [
        {"train_loss": (math.log10(cfg.learning_rate) - math.log10(self.best)) ** 2}]}
            for cfg, label, _ in jobs]


def _study(grid, extend, **tune):
  return schema.check({"methods": {"sgd": {"grid": {"learning_rate": grid}}},
                       "tune": {"seeds": 9, "extend": extend, **tune}, "seeds": [0, 1],
                       "budget": {"num_steps": 10}})


def test_the_tuning_runs_get_the_tuning_overrides_and_the_reported_runs_do_not():
  study = _study([0.25, 0.5], False, overrides=HELD_OUT)
  store = _Scores(best=0.25)
  entry, reported = driver.tune_and_report(study, schema.base_config(study), store, "sgd",
                                           "train")
  assert entry["pick"] == {"learning_rate": 0.25} and study.tune_overrides == HELD_OUT
  held = {(c.seed, c.learning_rate): c.validation_examples for c, _ in store.jobs}
  assert held == {(9, 0.25): 4, (9, 0.5): 4, (0, 0.25): 0, (1, 0.25): 0}
  assert set(reported["default"]) == {0, 1}


def test_trained_tuning_runs_hold_out_a_split_and_reported_runs_do_not(tmp_path):
  raw = {**TINY, "methods": {"dpsgd": TINY["methods"]["dpsgd"]}, "seeds": [0],
         "tune": {**TINY["tune"], "overrides": HELD_OUT}}
  res = driver.run(schema.check(raw), str(tmp_path), progress=False)
  cfgs = [json.loads((tmp_path / "runs" / k / "run.json").read_text())["config"]
          for k in os.listdir(tmp_path / "runs")]
  assert sorted((c["seed"], c["validation_examples"]) for c in cfgs) == [(0, 0), (7, 4), (7, 4)]
  assert res["tune_overrides"] == HELD_OUT
  assert res["methods"]["dpsgd"]["runs"]["default"][0]["status"] == "finished"
  assert "tuning runs alone also set validation_examples=4" in output.markdown(res)


@pytest.mark.parametrize("grid,best,extend,tried,pick,edge", [
    # the score keeps improving past the edge: two steps, the pick still at the edge
    ([0.0625, 0.125], 1.0, 2, [0.25, 0.5], 0.5, True),
    ([0.0625, 0.125], 1.0, True, [0.25], 0.25, True),  # True: one step, as before
    ([0.0625, 0.125], 1.0, 0, [], 0.125, True),  # 0: none, as False
    # the first step improves, the second is worse: the pick is inside, no third step
    ([0.125, 0.25], 0.5, 3, [0.5, 1.0], 0.5, False),
    ([0.25, 0.5], 0.5, 2, [1.0], 0.5, False),  # the first step is worse: one only
])
def test_extend_k_extends_while_the_pick_stays_at_an_edge(grid, best, extend, tried, pick, edge):
  study = _study(grid, extend)
  store = _Scores(best)
  got = driver.tune(study, schema.base_config(study), store, "sgd", "train", "default")
  assert [c.learning_rate for c, _ in store.jobs] == grid + tried
  assert got["extended"] == [{"learning_rate": lr} for lr in tried]
  assert got["pick"] == {"learning_rate": pick} and got["edge"] == edge
  assert [t["point"]["learning_rate"] for t in got["grid"]] == grid + tried


def _errors(**tune):
  with pytest.raises(config_lib.ConfigError) as e:
    study = schema.check({**TINY, "tune": {**TINY["tune"], **tune}})
    schema.validate(study, schema.base_config(study))
  return e.value.errors


EXTEND = ("is not allowed: it must be True (one step beyond an edge pick), False (none) or an "
          "integer k >= 0 (up to k steps while the pick stays at an edge)")


@pytest.mark.parametrize("tune,lines", [
    ({"overrides": 5}, ["study.tune.overrides=5 is not allowed: it must be a dict of config "
                        "overrides"]),
    ({"overrides": {"seed": 3}}, ["study.tune.overrides.seed=3 is not allowed: the tuning "
                                  "runs' seeds are study.tune.seeds"]),
    ({"overrides": {"learning_rate": 0.1}}, [
        "study.tune.overrides.learning_rate=0.1 is not allowed: it is an axis of the grid of "
        "dpsgd, allreduce (the grid point sets it)"]),
    ({"overrides": {"validation_examples": -1}}, [
        f"method {m}, variant default, tuning runs: config.validation_examples=-1 is not "
        "allowed: it must be an integer >= 0" for m in ("dpsgd", "allreduce")]),
    ({"overrides": {"validaton_examples": 4}}, [
        f"method {m}, variant default, tuning runs: config.validaton_examples is not a "
        "configuration key (did you mean config.validation_examples?)"
        for m in ("dpsgd", "allreduce")]),
    ({"extend": -1}, [f"study.tune.extend=-1 {EXTEND}"]),
    ({"extend": 1.5}, [f"study.tune.extend=1.5 {EXTEND}"]),
    ({"extend": "2"}, [f"study.tune.extend='2' {EXTEND}"]),
])
def test_each_bad_tuning_field_is_one_line(tune, lines):
  assert _errors(**tune) == lines


def test_a_config_refused_with_and_without_the_tuning_overrides_is_named_once():
  raw = {**TINY, "methods": {"dpsgd": {**TINY["methods"]["dpsgd"],
                                       "overrides": {"algorithm": "dpsgd", "momentum": 2.0}}},
         "tune": {**TINY["tune"], "overrides": HELD_OUT}}
  with pytest.raises(config_lib.ConfigError) as e:
    study = schema.check(raw)
    schema.validate(study, schema.base_config(study))
  assert len(e.value.errors) == 1
  assert e.value.errors[0].startswith("method dpsgd, variant default: config.momentum=2.0")


@pytest.mark.parametrize("quick", [False, True])
def test_a_study_without_the_new_fields_composes_the_configs_and_keys_of_before(quick):
  raw = {**TINY, "variants": {"a": {}, "b": {"momentum": 0.5}},
         "quick": {"overrides": {"eval_every": 2}, "budget": {"num_steps": 4}}}
  study = schema.check(raw, quick=quick)
  with_k = schema.check({**raw, "tune": {**raw["tune"], "extend": 3}}, quick=quick)
  held = schema.check({**raw, "tune": {**raw["tune"], "overrides": HELD_OUT}}, quick=quick)
  assert study.tune_overrides == {} and study.extend == 0 and with_k.extend == 3
  base = schema.base_config(study)
  for variant in ("a", "b"):
    for seed in (7, 0):
      args = ("dpsgd", variant, {"learning_rate": 0.05}, seed)
      old = compose_study_run_before_stages(study, base, *args)
      for s, tuning in ((study, False), (study, True), (with_k, True), (held, False)):
        new = schema.compose(s, base, *args, tuning=tuning)
        assert new.to_json_best_effort(sort_keys=True) == old.to_json_best_effort(
            sort_keys=True)
        assert runs.run_key(new) == runs.run_key(old)
      tuned = schema.compose(held, base, *args, tuning=True)
      assert tuned.validation_examples == 4 and runs.run_key(tuned) != runs.run_key(old)
      tuned.validation_examples = 0
      assert runs.run_key(tuned) == runs.run_key(old)  # nothing else differs
