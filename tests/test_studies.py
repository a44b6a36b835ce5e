"""The study scripts' statistics: one convention, the sample standard deviation (ddof = 1)."""

import argparse
import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments",
                                                                   f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_nonblocking_study_uses_the_sample_standard_deviation():
  nb = _script("reproduce_nonblocking")
  s = nb._stats([1.0, None, 2.0, 3.0])
  assert (s["mean"], s["std"], s["reached"]) == (2.0, 1.0, 3)  # ddof = 0 would give 0.816
  assert nb._stats([1.5, None])["std"] is None  # no spread from one seed
  assert nb._fmt(nb._stats([1.5, None])) == "1.50x (1/2)"


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
  rows = ts.table(results["records"], list(ts.study_runs(study)), a.lrs, a.seeds)
  with open(os.path.join(out, "results.md")) as f:
    assert f.read() == ts.markdown(rows, a)
  assert len(rows) == len(ts.study_runs(study))
  for r in rows:
    assert len(r["seeds"]) >= 3, r["run"]
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
    assert f"train loss {s['train_loss']:.4f}" in " ".join(f.read().split())
