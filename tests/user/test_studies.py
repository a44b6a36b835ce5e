"""The study scripts' statistics: one convention, the sample standard deviation (ddof = 1)."""

import argparse
import json
import os

import numpy as np
import pytest

from tests.helpers import ROOT, experiment_config, load_script



_script = load_script


def test_nonblocking_study_uses_the_sample_standard_deviation():
  nb = _script("reproduce_nonblocking")
  s = nb._stats([1.0, None, 2.0, 3.0])
  assert (s["mean"], s["std"], s["reached"]) == (2.0, 1.0, 3)  # ddof = 0 would give 0.816
  assert nb._stats([1.5, None])["std"] is None  # no spread from one seed
  assert nb._fmt(nb._stats([1.5, None])) == "1.50x (1/2)"


def test_a_blocking_run_that_did_not_train_has_no_target():
  nb = _script("reproduce_nonblocking")
  dead = [{"train_loss": 2.306}, {"train_loss": 2.283}, {"train_loss": 2.301}]
  assert nb.untrained(dead, 2.283)  # a CNN that died at step 20: no speed-up to that
  assert not nb.untrained([{"train_loss": 2.306}, {"train_loss": 0.06}], 0.06)
  assert nb.untrained([{"train_loss": 2.306}, {"train_loss": float("nan")}], float("nan"))


@pytest.mark.parametrize("study", ["nonblocking", os.path.join("nonblocking", "quick")])
def test_committed_nonblocking_study_is_its_records_and_homogeneous_is_1(study):
  """results.md is rendered from results.json; where non-blocking SGD is the blocking
  algorithm (the homogeneous cell) every seed's speed-up is within 0.03 of 1; no row
  reports the tuning seed."""
  nb = _script("reproduce_nonblocking")
  res = nb.restat(json.loads(_committed(study, "results.json")))
  assert _committed(study, "results.md") == nb.markdown(res)
  homogeneous = 0
  for sc in res["scenarios"].values():
    for r in sc["cells"]:
      assert len(r["seeds"]) == 3 and r["tune_seed"] not in r["seeds"], r["cell"]
      if r["cell"] == "homogeneous":
        homogeneous += 1
        assert all(abs(v - 1) <= 0.03 for v in r["speedup"]["per_seed"]), r["algorithm"]
  assert homogeneous == 3


def test_committed_nonblocking_tables_are_ddof_1():
  with open(os.path.join(ROOT, "docs", "nonblocking", "results.json")) as f:
    cells = json.load(f)["cells"]
  checked = 0
  for r in cells:
    got = [v for v in r["speedup"]["per_seed"] if v is not None]
    if len(got) > 1:
      assert r["speedup"]["std"] == pytest.approx(np.std(got, ddof=1))
      checked += 1
  assert checked >= 10


@pytest.mark.parametrize("study", ["sparsification", "local_sgd"])
def test_committed_multi_seed_tables_are_rendered_from_their_records(study):
  """docs/STUDY/seeds/results.md is what experiments/tune_seeds.py writes from the committed
  results.json; every table row names its seeds and has at least 3."""
  ts = _script("tune_seeds")
  out = os.path.join(ROOT, "docs", study, "seeds")
  with open(os.path.join(out, "results.json")) as f:
    results = json.load(f)
  a = argparse.Namespace(**{**results["args"], "out": out})
  rows = ts.table(results["records"], list(ts.study_runs(study)), a.lrs, a.seeds, a.tune_seed)
  with open(os.path.join(out, "results.md")) as f:
    assert f.read() == ts.markdown(rows, a)
  assert len(rows) == len(ts.study_runs(study))
  for r in rows:
    assert len(r["seeds"]) >= 3, r["run"]
    assert a.tune_seed not in r["seeds"], r["run"]   # the tuning seed is never reported
    # the pick: the lowest validation loss among the tuning seed's rates (diverged: +inf)
    tuned = {float(k): (np.inf if v is None else v) for k, v in r["tuning"].items()}
    assert r["lr"] == min(tuned, key=tuned.get), r["run"]
    assert all(results["records"][ts.key(r["run"], lr, a.tune_seed)]["validation"]
               for lr in tuned)
    got = [x for x in r["test_accuracy"] if x is not None]
    if len(got) > 1:
      assert r["std"] == pytest.approx(np.std(got, ddof=1))


def test_the_main_jobs_figures_are_the_committed_run():
  """README, the guide and results.md quote docs/main_job/summary.json (the main job's files)."""
  with open(os.path.join(ROOT, "docs", "main_job", "summary.json")) as f:
    s = json.load(f)
  assert (s["algorithm"], s["num_workers"], s["step"]) == ("dpsgd", 8, 600)
  acc = f"{100 * s['test_accuracy']:.2f}% test accuracy"
  for doc in ("README.md", os.path.join("docs", "guide.md"), os.path.join("docs", "results.md")):
    with open(os.path.join(ROOT, doc)) as f:
      text = " ".join(f.read().split()).replace("**", "")
    assert acc in text, doc
  with open(os.path.join(ROOT, "docs", "results.md")) as f:
    results = " ".join(f.read().split())
  assert f"train loss {s['train_loss']:.4f}" in results
  # the time quoted is the record's: train()'s seconds (run_seconds), set-up and compilation in
  seconds = f"{s['run_seconds']:.0f} s of `train()`"
  with open(os.path.join(ROOT, "README.md")) as f:
    assert seconds in " ".join(f.read().split())
  assert f"**{s['run_seconds']:.0f} s** of `train()`" in results
  assert f"{s['wall_time']:.1f} s are training steps" in results


def _committed(*parts):
  with open(os.path.join(ROOT, "docs", *parts)) as f:
    return f.read()


def test_the_asynchronous_grid_is_its_records_and_nonblocking_md_quotes_them():
  """docs/nonblocking/asynchronous: results.md is rendered from results.json; every row
  reports 3 seeds, its rates chosen on a fourth; docs/nonblocking.md's table quotes each
  variant's speed-up as the study formats it."""
  nb = _script("reproduce_nonblocking")
  res = nb.restat(json.loads(_committed("nonblocking", "asynchronous", "results.json")))
  assert _committed("nonblocking", "asynchronous", "results.md") == nb.markdown(res)
  page = " ".join(_committed("nonblocking.md").split())
  variants = set()
  for r in res["cells"]:
    assert len(r["seeds"]) == 3 and r["tune_seed"] not in r["seeds"], r["variant"]
    variants.add(r["variant"])
    assert nb._fmt(r["speedup"]) in page, (r["cell"], r["algorithm"], r["variant"])
  assert {"AD-PSGD", "SwarmSGD (H = 2)", "Overlap-SGP", "non-blocking"} <= variants


def test_time_to_a_target_interpolates_between_evaluations():
  common = _script("common")
  h = [{"sim_time": 0.0, "loss": 4.0}, {"sim_time": 10.0, "loss": 2.0},
       {"sim_time": 20.0, "loss": 1.0}]
  assert common.time_to(h, 1.5, "loss") == pytest.approx(15.0)  # half-way from 2 to 1
  assert common.time_to(h, 5.0, "loss") == 0.0
  assert common.time_to(h, 0.5, "loss") is None


def test_async_diloco_lm_reads_the_loss_at_a_push_count_and_is_its_records():
  lm = _script("async_diloco_lm")
  h = [{"pushes": 0, "test_loss": 4.0}, {"pushes": 40, "test_loss": 3.0},
       {"pushes": 40, "test_loss": 2.9}, {"pushes": 120, "test_loss": 2.0}]
  assert lm.at_pushes(h, 80) == pytest.approx(2.45)  # between 40 (2.9) and 120 (2.0)
  assert lm.at_pushes(h, 200) is None
  res = json.loads(_committed("asynchronous", "lm", "results.json"))
  assert _committed("asynchronous", "lm", "results.md") == lm.markdown(res)
  assert len(res["settings"]["seeds"]) >= 3
  assert res["settings"]["tune_seed"] not in res["settings"]["seeds"]


def test_asynchronous_cnn_spreads_are_ddof_1():
  cnn = _script("asynchronous_cnn")
  s = cnn.spread([1.0, None, 2.0, 3.0])
  assert (s["mean"], s["std"], s["reached"], s["runs"]) == (2.0, 1.0, 3, 4)
  assert cnn.spread([1.0])["std"] is None


def test_committed_diloco_protocol_is_its_records():
  """docs/diloco/paper: results.md is rendered from results.json; every pick is the lowest
  final training loss of its method's grid on the tuning seed, which no row reports."""
  dp = _script("diloco_paper")
  out = os.path.join(ROOT, "docs", "diloco", "paper")
  with open(os.path.join(out, "results.json")) as f:
    res = json.load(f)
  with open(os.path.join(out, "results.md")) as f:
    assert f.read() == dp.markdown(res)
  tune = res["settings"]["tune_seed"]
  assert tune not in res["settings"]["seeds"]
  for name, pick in res["picks"].items():
    grid = res["tuning"][name]
    losses = {k: r["history"][-1]["train_loss"] for k, r in grid.items()}
    assert pick["key"] == min(losses, key=losses.get), name
  for label, m in res["methods"].items():
    assert sorted(m["seeds"]) == sorted(str(x) for x in res["settings"]["seeds"]), label
    assert m["rates"] == res["picks"][m["method"]]["rates"], label
    for r in m["seeds"].values():
      assert r["history"][-1]["step"] == res["settings"]["steps"]


def test_cnn_comparison_refuses_to_report_its_tuning_seed():
  ca = _script("compare_algorithms")
  a = argparse.Namespace(seeds=[0, 1, 2], tune_seed=1, runs=["dpsgd"])
  with pytest.raises(ValueError, match="--tune_seed 1 is among --seeds"):
    ca.compare(a)



def test_committed_cnn_comparison_is_its_records():
  """docs/compare_cnn and its lr002 rows: results.md is rendered from results.json; each
  row reports >= 3 seeds, none the tuning seed, and CHOCO's gamma is the lowest final
  training loss of its grid on the tuning seed (diverged: never)."""
  ca = _script("compare_algorithms")
  for parts in (("compare_cnn",), ("compare_cnn", "lr002")):
    res = json.loads(_committed(*parts, "results.json"))
    a = argparse.Namespace(**res["args"])
    assert _committed(*parts, "results.md") == ca.markdown(res, a)
    assert len(a.seeds) >= 3 and a.tune_seed not in a.seeds
    for name, r in res["mnist"].items():
      assert sorted(r["seeds"]) == sorted(str(s) for s in a.seeds), name
      if "gamma_grid" in r:
        grid = {float(g): (v if np.isfinite(v) else np.inf) for g, v in r["gamma_grid"].items()}
        assert r["gamma"] == min(grid, key=grid.get), name


# ------------------------------------------------------------------ headline runs


def _config_file(name, overrides):
  """``experiments/configs/NAME.py``'s config with ``overrides``, as ``config.json`` holds it."""
  from nbsgd_jax import config as config_lib
  cfg = config_lib.override(experiment_config(name), overrides)
  return config_lib.flatten_dict(json.loads(cfg.to_json_best_effort()))


def _guide_runs():
  """The guide's quick-start runs: ``{workdir name: {key: value}}`` of the commands of its
  "First run" and "Two more runs" (``--workdir=runs/NAME --config.KEY=VALUE ...``)."""
  import ast
  import re
  text = _committed("guide.md").replace("\\\n", " ")
  text = text[text.index("## First run"):text.index("## Compare them")]
  runs = {}
  for line in text.splitlines():
    m = re.match(r"python -m nbsgd_jax\.main --config=experiments/configs/quickstart\.py "
                 r"--workdir=runs/(\w+)(.*)", line.strip())
    if m and m.group(1) not in runs:
      over = {}
      for key, value in re.findall(r"--config\.([\w.]+)=(\S+)", m.group(2)):
        try:
          over[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
          over[key] = value
      runs[m.group(1)] = over
  return runs


def test_the_headline_runs_were_recorded_with_todays_configs():
  """The committed runs whose figures the README and the guide quote were made by today's
  config files and defaults, every key of their config.json: a change of a default forces a
  re-record (issue 53: the main job's record had been made under another default). Keys of
  the sections the run's algorithm leaves off (``config.inactive_keys``: e.g. another
  algorithm's) do not change the run and are not compared; nor do keys added after the run
  was recorded whose value today is their default (the run ran as the default does:
  ``records.config_diff``'s rule for resuming)."""
  from nbsgd_jax import config as config_lib
  from nbsgd_jax.config import renamed as renamed_lib
  from nbsgd_jax.core import provenance as provenance_lib
  runs = {("main_job",): ("mnist", {})}
  guide = _guide_runs()
  assert set(guide) == {"dpsgd", "allreduce", "dpsgd_nonblocking"}, guide
  runs.update({("guide", "runs", name): ("quickstart", over) for name, over in guide.items()})
  for parts, (name, over) in runs.items():
    with open(os.path.join(ROOT, "docs", *parts, "config.json")) as f:
      have = config_lib.flatten_dict(renamed_lib.upgrade(  # before a rename; not provenance
          provenance_lib.config_of(json.load(f))))
    want = _config_file(name, over)
    off = config_lib.inactive_keys(config_lib.override(config_lib.default_config(), want))
    defaults = config_lib.flatten_dict(json.loads(
        config_lib.default_config().to_json_best_effort()))
    newer = {k for k in set(want) - set(have) if want[k] == defaults.get(k)}
    diff = {k: (have.get(k), want.get(k)) for k in (set(have) | set(want)) - off - newer
            if have.get(k) != want.get(k)}
    assert not diff, (parts, "recorded / today's", diff)


def test_the_guides_figures_are_its_committed_runs(tmp_path):
  """The guide's report table and the README's times to the target are the report of the
  committed quick-start runs (docs/guide/runs), as `python -m nbsgd_jax.report` makes it."""
  from nbsgd_jax import report
  names = ["dpsgd", "allreduce", "dpsgd_nonblocking"]
  rows = report.build_report([os.path.join(ROOT, "docs", "guide", "runs", n) for n in names],
                             str(tmp_path))["rows"]
  guide = " ".join(_committed("guide.md").split())
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = " ".join(f.read().split())
  quoted = readme[readme.index("Three 10-second runs"):][:600]
  for name, r in zip(names, rows):
    assert r["run"] == name and r["status"] == "finished", r
    row = (f"| {name} | {r['final_test_accuracy']:.4f} | {r['final_train_loss']:.4f} | "
           f"{r['sim_time']:.4g} | {r['mb_sent']:.1f} | {r['target_sim_time']:.4g} |")
    assert row in guide, row
    assert f"{r['target_sim_time']:.1f} s" in quoted, (name, r["target_sim_time"], quoted)
  assert f"target training loss {rows[0]['target_loss']:.4f}" in guide
