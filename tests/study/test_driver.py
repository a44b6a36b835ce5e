"""A study trained end to end: the run cache (a second command trains nothing), ``--only``
and ``--redo``, the outputs; and the 40-line study of ``docs/guide.md`` in ``--quick`` mode."""

import json
import os

import pytest

from tests.helpers import ROOT, TINY_STUDY, registered

from nbsgd_jax.run import sweep as sweep_lib
from nbsgd_jax.study import __main__ as cli
from nbsgd_jax.study import driver, output, schema

TINY = TINY_STUDY


def _counting(monkeypatch):
  trained = []
  real = sweep_lib.train_runs

  def train_runs(cfgs, *a, **k):
    trained.extend((c.algorithm, c.learning_rate, c.seed) for c in cfgs)
    return real(cfgs, *a, **k)
  monkeypatch.setattr(sweep_lib, "train_runs", train_runs)
  return trained


def test_a_second_run_trains_nothing_and_redo_retrains_one_method(tmp_path, monkeypatch):
  trained = _counting(monkeypatch)
  study = schema.check(TINY)
  first = driver.run(study, str(tmp_path), progress=False)
  # dpsgd: 2 tuning runs + 2 seeds; allreduce: 1 + 2
  assert sorted(trained) == sorted([("dpsgd", lr, 7) for lr in (0.05, 0.1)] + [
      ("dpsgd", first["methods"]["dpsgd"]["pick"]["learning_rate"], s) for s in (0, 1)] + [
      ("allreduce", 0.1, s) for s in (7, 0, 1)])
  assert len(os.listdir(tmp_path / "runs")) == 7
  trained.clear()
  again = driver.run(study, str(tmp_path), progress=False)
  assert trained == [] and again["variants"] == first["variants"]
  driver.run(study, str(tmp_path), redo=("allreduce",), progress=False)
  assert sorted(trained) == [("allreduce", 0.1, s) for s in (0, 1, 7)]
  cells = first["variants"]["default"]["cells"]["dpsgd"]
  assert cells["sim_time to gap <= 1e-9"]["not_reached"] == [0, 1]
  assert cells["final gap"]["n"] == 2 and cells["final gap"]["std"] is not None
  paths = output.write(first, str(tmp_path))
  table = open(paths[1]).read()
  assert "| dpsgd |" in table and "not reached (2 of 2 seeds)" in table
  assert os.path.exists(tmp_path / "curves_default.png")


def test_only_trains_the_methods_it_names_and_names_the_others_unfinished(tmp_path, monkeypatch):
  trained = _counting(monkeypatch)
  study = schema.check({**TINY, "seeds": [0]})
  res = driver.run(study, str(tmp_path), only=["allreduce"], progress=False)
  assert {t[0] for t in trained} == {"allreduce"}
  assert res["methods"]["dpsgd"]["pick"] is None
  assert res["methods"]["dpsgd"]["runs"]["default"][0]["status"] == "unfinished"
  cell = res["variants"]["default"]["cells"]["allreduce"]["final gap"]
  assert cell["std"] is None and cell["n"] == 1  # one seed: no standard deviation
  assert "| dpsgd | none (not run) |" in output.markdown(res)  # not "all diverged"


@pytest.mark.slow
def test_the_guide_s_study_in_one_file_runs_quick(tmp_path, monkeypatch):
  path = os.path.join(ROOT, "experiments", "studies", "easgd_vs_dpsgd.py")
  assert len(open(path).read().splitlines()) <= 40
  monkeypatch.chdir(ROOT)  # examples.easgd is found from the repository's root, as in the guide
  with registered("examples.easgd"):  # EASGD registered for this test only
    assert cli.main([path, "--out", str(tmp_path), "--quick", "--no_progress"]) == 0
  res = json.loads((tmp_path / "results.json").read_text())
  assert set(res["methods"]) == {"easgd", "dpsgd", "local_sgd"} and res["seeds"] == [0, 1]
  for name, m in res["methods"].items():
    assert m["pick"]["learning_rate"] > 0
    assert all(r["status"] == "finished" for r in m["runs"]["default"].values()), name
  cells = res["variants"]["default"]["cells"]
  assert all(cells[m]["gap at equal sim_time"]["n"] == 2 for m in cells)
  assert "| easgd |" in (tmp_path / "results.md").read_text()


def test_each_variant_is_tuned_on_its_own_and_reported_at_its_own_pick(tmp_path, monkeypatch):
  """``tune.variant = "each"``: with heavy momentum (0.95: a step 20 times the rate) the large
  rate overshoots and the small one wins; without momentum, in 10 steps, the large one wins."""
  trained = _counting(monkeypatch)
  raw = {**TINY, "methods": {"allreduce": {"overrides": {"algorithm": "allreduce"},
                                           "grid": {"learning_rate": [0.05, 0.8]}}},
         "variants": {"easy": {"momentum": 0.0}, "steep": {"momentum": 0.95}},
         "tune": {**TINY["tune"], "variant": "each"}, "seeds": [0]}
  res = driver.run(schema.check(raw), str(tmp_path), progress=False)
  entry = res["methods"]["allreduce"]["variants"]
  assert entry["easy"]["pick"] == {"learning_rate": 0.8}
  assert entry["steep"]["pick"] == {"learning_rate": 0.05}
  assert sorted(t[1:] for t in trained) == sorted([(0.05, 7), (0.8, 7)] * 2
                                                  + [(0.8, 0), (0.05, 0)])
  md = output.markdown(res)
  assert "each variant on its own" in md and "- allreduce steep:" in md


def test_a_run_cached_before_a_key_existed_is_found_and_a_changed_value_is_not(tmp_path,
                                                                             monkeypatch):
  """The cache key hashes the whole config, so a key added to the defaults changes every key;
  a cached run whose stored config lacks that key (at its default) is still this run (the
  resume rule, records.config_diff), while one whose stored value differs is trained again."""
  trained = _counting(monkeypatch)
  study = schema.check({**TINY, "seeds": [0]})
  first = driver.run(study, str(tmp_path), progress=False)
  for i, name in enumerate(sorted(os.listdir(tmp_path / "runs"))):
    path = tmp_path / "runs" / name / "run.json"
    rec = json.loads(path.read_text())
    del rec["config"]["stop_sim_time"]  # as if written before the key existed
    if i == 0:
      rec["config"]["eval_every"] = 7  # as if the default had been another value
      changed = (rec["config"]["algorithm"], rec["config"]["learning_rate"],
                 rec["config"]["seed"])
    path.write_text(json.dumps(rec))
    os.rename(tmp_path / "runs" / name, tmp_path / "runs" / f"old{i}")
  trained.clear()
  again = driver.run(study, str(tmp_path), progress=False)
  assert trained == [changed]
  assert again["variants"] == first["variants"]
