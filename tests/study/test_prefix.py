"""A study's prefix (``study.prefix``, :mod:`nbsgd_jax.study.stages`): one prefix per seed,
trained once, every other run of the seed starting where it ended; its bad fields refused;
a study without one composing exactly the configs (and cache keys) it did before."""

import copy
import json
import os
import shutil

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax.run import loop as loop_lib
from nbsgd_jax.run import sweep as sweep_lib
from nbsgd_jax.study import driver, output, runs, schema, stages

from tests.helpers import compose_study_run_before_stages

# least squares, 2 workers; the prefix: 10 steps of all-reduce, then D-PSGD from it
STUDY = {"base": {"dataset": "least_squares", "num_workers": 2, "eval_every": 5,
                  "batch_size": 4, "problem": {"examples_per_worker": 8, "dim": 3}},
         "methods": {"dpsgd": {"overrides": {"algorithm": "dpsgd"},
                               "grid": {"learning_rate": [0.05]}}},
         "tune": {"seeds": 7, "metric": "gap", "extend": False}, "seeds": [0, 1],
         "budget": {"num_steps": 10},
         "prefix": {"overrides": {"algorithm": "allreduce", "learning_rate": 0.1},
                    "budget": {"num_steps": 10}}}


def _counting(monkeypatch) -> list:
  """Every run trained, in order: ``("prefix" or "run", seed)``."""
  trained = []
  real_train, real_runs = loop_lib.train, sweep_lib.train_runs

  def train(cfg, *a, **k):
    trained.append(("prefix", cfg.seed))
    return real_train(cfg, *a, **k)

  def train_runs(cfgs, *a, **k):
    trained.extend(("run", c.seed) for c in cfgs)
    return real_runs(cfgs, *a, **k)
  monkeypatch.setattr(loop_lib, "train", train)
  monkeypatch.setattr(sweep_lib, "train_runs", train_runs)
  return trained


def test_one_prefix_per_seed_trains_first_and_once(tmp_path, monkeypatch):
  trained = _counting(monkeypatch)
  study = schema.check(STUDY)
  first = driver.run(study, str(tmp_path), progress=False)
  assert sorted(trained[:1]) == [("prefix", 7)] and ("run", 7) == trained[1]
  assert sorted(trained) == sorted([("prefix", s) for s in (7, 0, 1)]
                                   + [("run", s) for s in (7, 0, 1)])
  assert trained.index(("prefix", 0)) < trained.index(("run", 0))
  assert set(first["prefix"]) == {7, 0, 1}
  for seed, p in first["prefix"].items():
    rec = json.loads((tmp_path / "prefix" / p["key"] / "run.json").read_text())
    assert rec["prefix"] is True and rec["config"]["algorithm"] == "allreduce"
    assert p["status"] == "finished" and p["final"] == rec["history"][-1]["gap"]
    assert stages.has_checkpoint(str(tmp_path / "prefix" / p["key"]))
  for name in os.listdir(tmp_path / "runs"):  # keyed on the prefix's key, not on OUT's path
    cfg = json.loads((tmp_path / "runs" / name / "run.json").read_text())["config"]
    assert cfg["init_from"] == f"prefix/{first['prefix'][cfg['seed']]['key']}"
  trained.clear()
  again = driver.run(study, str(tmp_path), progress=False)
  assert trained == [] and again["variants"] == first["variants"]
  md = output.markdown(first)
  assert "Prefix (Douillard et al. 2023, Sec. 3)" in md and "algorithm=allreduce" in md
  assert "(3 seeds)" in md.split("Prefix")[1].splitlines()[0]


def test_a_study_copied_elsewhere_without_checkpoints_reads_its_runs(tmp_path, monkeypatch):
  """The keys do not name OUT: a copy finds every run; with the checkpoints gone (a committed
  study), reading trains nothing, and a new run trains its seed's prefix again first."""
  trained = _counting(monkeypatch)
  first = driver.run(schema.check({**STUDY, "seeds": [0]}), str(tmp_path / "a"),
                     progress=False)
  shutil.copytree(tmp_path / "a", tmp_path / "b")
  for key in os.listdir(tmp_path / "b" / "prefix"):
    shutil.rmtree(tmp_path / "b" / "prefix" / key / checkpoint_lib.CHECKPOINT_DIR)
  trained.clear()
  again = driver.run(schema.check({**STUDY, "seeds": [0]}), str(tmp_path / "b"),
                     progress=False)
  assert trained == [] and again["variants"] == first["variants"]
  driver.run(schema.check(STUDY), str(tmp_path / "b"), progress=False)  # seed 1: new
  assert trained == [("prefix", 1), ("run", 1)]


def test_a_run_begins_where_its_prefix_ended(tmp_path):
  """Independently of the study's records: the prefix's checkpoint is at its last step, and a
  run given ``init_from`` by hand (nbsgd_jax.train) evaluates at step 0 what the prefix
  evaluated at its end, while the same run without it starts elsewhere."""
  study = schema.check({**STUDY, "seeds": [0]})
  res = driver.run(study, str(tmp_path), progress=False)
  key = res["prefix"][0]["key"]
  prefix = json.loads((tmp_path / "prefix" / key / "run.json").read_text())
  step, _, _ = checkpoint_lib.read_models(str(tmp_path / "prefix" / key), print)
  assert step == 10 == prefix["history"][-1]["step"]
  cfg = schema.compose(study, schema.base_config(study), "dpsgd", "default",
                       {"learning_rate": 0.05}, 0)
  from nbsgd_jax import train  # the public face, as a user would
  by_hand = train.train(config_lib.override(copy.deepcopy(cfg), {
      "init_from": str(tmp_path / "prefix" / key)}))
  fresh = train.train(config_lib.override(copy.deepcopy(cfg), {"init_from": ""}))
  end = prefix["history"][-1]
  for metric in ("gap", "train_loss"):
    assert by_hand["history"][0][metric] == pytest.approx(end[metric], rel=1e-5, abs=1e-9)
    assert fresh["history"][0][metric] != pytest.approx(end[metric], rel=1e-3)
  run = json.loads((tmp_path / "runs" / runs.run_key(cfg) / "run.json").read_text())
  assert run["history"][-1]["gap"] == pytest.approx(by_hand["history"][-1]["gap"], rel=1e-5)


def _errors(prefix, **fields):
  with pytest.raises(config_lib.ConfigError) as e:
    study = schema.check({**STUDY, "prefix": prefix, **fields})
    schema.validate(study, schema.base_config(study))
  return e.value.errors


@pytest.mark.parametrize("prefix,lines", [
    (5, ["study.prefix=5 is not allowed: study.prefix is a dict with the fields overrides, "
         "budget"]),
    ({"overrides": {}, "budget": {"num_steps": 5}, "seed": 3},
     ["study.prefix.seed=3 is not allowed: study.prefix has the fields overrides, budget"]),
    ({"overrides": {}}, ["study.prefix.budget=None is not allowed: it is required "
                         "({'num_steps': N})"]),
    ({"budget": {"num_steps": 5}}, ["study.prefix.overrides=None is not allowed: it is required "
                                    "(config overrides, {} for none)"]),
    ({"overrides": 3, "budget": {"num_steps": 0}},
     ["study.prefix.overrides=3 is not allowed: it must be a dict of config overrides",
      "study.prefix.budget={'num_steps': 0} is not allowed: it must be one of {'num_steps': "
      "N}, {'grads_per_worker': N} with N a positive integer"]),
    ({"overrides": {"learnin_rate": 0.1}, "budget": {"num_steps": 5}},
     ["study.prefix: config.learnin_rate is not a configuration key (did you mean "
      "config.learning_rate?)"]),
])
def test_each_bad_prefix_field_is_one_line(prefix, lines):
  assert _errors(prefix) == lines


def test_quick_replaces_the_prefix_s_fields_and_needs_a_prefix():
  quick = {"overrides": {"eval_every": 2}, "prefix": {"budget": {"num_steps": 4}}}
  study = schema.check({**STUDY, "quick": quick}, quick=True)
  cfg = stages.config(study, schema.base_config(study), 0)
  assert (cfg.num_steps, cfg.eval_every, cfg.checkpoint_every, cfg.algorithm) == (
      4, 2, 4, "allreduce")  # --quick's overrides reach the prefix too
  assert schema.check({**STUDY, "quick": quick}).prefix["budget"] == ("num_steps", 10)
  raw = {k: v for k, v in STUDY.items() if k != "prefix"}
  with pytest.raises(config_lib.ConfigError) as e:
    schema.check({**raw, "quick": quick})
  assert e.value.errors == ["study.quick.prefix={'budget': {'num_steps': 4}} is not allowed: "
                            "the study has no prefix (quick.prefix replaces fields of "
                            "study.prefix)"]


@pytest.mark.parametrize("quick", [False, True])
def test_a_study_without_prefix_composes_the_configs_and_keys_of_before(quick):
  raw = {k: v for k, v in STUDY.items() if k != "prefix"}
  raw = {**raw, "variants": {"a": {}, "b": {"momentum": 0.5}},
         "quick": {"overrides": {"eval_every": 2}, "budget": {"num_steps": 4}}}
  study = schema.check(raw, quick=quick)
  assert study.prefix is None
  base = schema.base_config(study)
  for variant in ("a", "b"):
    for seed in (7, 0, 1):
      args = (study, base, "dpsgd", variant, {"learning_rate": 0.05}, seed)
      new, old = schema.compose(*args), compose_study_run_before_stages(*args)
      assert new.to_json_best_effort(sort_keys=True) == old.to_json_best_effort(sort_keys=True)
      assert runs.run_key(new) == runs.run_key(old) and new.init_from == ""


def test_a_prefix_cached_before_a_key_existed_keeps_its_runs(tmp_path, monkeypatch):
  """A config key added to the defaults changes the prefix's key, hence every run's
  ``init_from``: the prefix whose stored config lacks the key (at its default) is found by
  the resume rule, its runs keep their ``init_from`` and are found too; nothing trains."""
  trained = _counting(monkeypatch)
  study = schema.check({**STUDY, "seeds": [0]})
  first = driver.run(study, str(tmp_path), progress=False)
  renamed = {}
  for i, key in enumerate(sorted(os.listdir(tmp_path / "prefix"))):
    path = tmp_path / "prefix" / key / "run.json"
    rec = json.loads(path.read_text())
    del rec["config"]["stop_sim_time"]  # as if written before the key existed
    path.write_text(json.dumps(rec))
    os.rename(tmp_path / "prefix" / key, tmp_path / "prefix" / f"old{i}")
    renamed[f"prefix/{key}"] = f"prefix/old{i}"
  for i, name in enumerate(sorted(os.listdir(tmp_path / "runs"))):
    path = tmp_path / "runs" / name / "run.json"
    rec = json.loads(path.read_text())
    del rec["config"]["stop_sim_time"]
    rec["config"]["init_from"] = renamed[rec["config"]["init_from"]]
    path.write_text(json.dumps(rec))
    os.rename(tmp_path / "runs" / name, tmp_path / "runs" / f"old{i}")
  trained.clear()
  again = driver.run(study, str(tmp_path), progress=False)
  assert trained == [] and again["variants"] == first["variants"]
  assert {p["key"] for p in again["prefix"].values()} == {"old0", "old1"}
