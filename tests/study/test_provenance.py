"""A study's provenance: results.json holds this process's and the commits of the runs it used;
training into a cache whose runs another commit made is refused (one line) unless
``--allow_mixed``, and then the results say mixed; reading a complete cache never needs it."""

import json
import os

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.run import sweep as sweep_lib
from nbsgd_jax.study import __main__ as cli
from nbsgd_jax.study import driver, output, schema

OTHER = "0123456789" * 4  # another commit
RAW = {"base": {"dataset": "least_squares", "num_workers": 2, "eval_every": 5, "batch_size": 4,
                "problem": {"examples_per_worker": 8, "dim": 3}},
       "methods": {"allreduce": {"overrides": {"algorithm": "allreduce"},
                                 "grid": {"learning_rate": [0.1]}}},
       "tune": {"seeds": 7, "metric": "gap", "extend": False}, "seeds": [0],
       "budget": {"num_steps": 10}}


def _edit(out, change) -> str:
  """Apply ``change(record)`` to one cached run of the study ``out`` (the first by key)."""
  key = sorted(os.listdir(os.path.join(out, "runs")))[0]
  path = os.path.join(out, "runs", key, "run.json")
  with open(path) as f:
    record = json.load(f)
  change(record)
  with open(path, "w") as f:
    json.dump(record, f)
  return key


def _trained(monkeypatch) -> list:
  trained = []
  real = sweep_lib.train_runs
  monkeypatch.setattr(sweep_lib, "train_runs",
                      lambda cfgs, *a, **k: trained.extend(c.seed for c in cfgs) or real(cfgs))
  return trained


def test_runs_of_another_commit_block_training_unless_allow_mixed(tmp_path, monkeypatch):
  out, mine = str(tmp_path), provenance_lib.git_commit()
  res = driver.run(schema.check(RAW), out, progress=False)
  assert res["provenance"]["commit"] == mine and res["run_commits"] == {mine: 2}
  assert not res["mixed"] and "Provenance: written by commit" in output.markdown(res)
  _edit(out, lambda r: r["provenance"].update(commit=OTHER))
  again = driver.run(schema.check(RAW), out, progress=False)  # complete: read, no flag needed
  assert again["run_commits"] == {mine: 1, OTHER: 1} and again["mixed"]
  trained = _trained(monkeypatch)
  more = schema.check({**RAW, "seeds": [0, 1]})  # seed 1 must train
  with pytest.raises(config_lib.ConfigError) as e:
    driver.run(more, out, progress=False)
  [line] = e.value.errors
  assert line.startswith(f"--allow_mixed=False is not allowed: the run cache "
                         f"{os.path.join(out, 'runs')} holds runs made by commit ")
  assert f"{OTHER[:10]} (1 run)" in line and "pass --allow_mixed" in line and trained == []
  res = driver.run(more, out, progress=False, allow_mixed=True)
  assert trained == [1] and res["mixed"] and res["run_commits"][OTHER] == 1
  assert "**Mixed**" in output.markdown(res)


def test_a_run_without_provenance_counts_as_commit_none(tmp_path, monkeypatch):
  out = str(tmp_path)
  driver.run(schema.check(RAW), out, progress=False)
  _edit(out, lambda r: r.pop("provenance"))
  res = driver.run(schema.check(RAW), out, progress=False)
  assert res["run_commits"][None] == 1 and "none recorded (1 run)" in output.markdown(res)
  with pytest.raises(config_lib.ConfigError) as e:  # None is another commit than this one
    driver.run(schema.check({**RAW, "seeds": [0, 1]}), out, progress=False)
  assert "None (1 run)" in e.value.errors[0]
  # outside a checkout this process is commit None too: a cache of such runs trains on
  monkeypatch.setattr(provenance_lib, "git_commit", lambda root=None: None)
  for key in os.listdir(os.path.join(out, "runs")):
    path = os.path.join(out, "runs", key, "run.json")
    with open(path) as f:
      record = json.load(f)
    with open(path, "w") as f:
      json.dump({**record, "provenance": {"commit": None}}, f)
  res = driver.run(schema.check({**RAW, "seeds": [0, 1]}), out, progress=False)
  assert res["run_commits"] == {None: 3} and not res["mixed"]


def test_the_command_line_refuses_then_allows_mixed(tmp_path, capsys):
  study = tmp_path / "study.py"
  study.write_text(f"def get_study():\n  return {RAW!r}\n")
  out = str(tmp_path / "out")
  assert cli.main([str(study), "--out", out, "--no_progress"]) == 0
  _edit(out, lambda r: r["provenance"].update(commit=OTHER))
  study.write_text(f"def get_study():\n  return {({**RAW, 'seeds': [0, 1]})!r}\n")
  capsys.readouterr()
  assert cli.main([str(study), "--out", out, "--no_progress"]) == 2
  [err] = capsys.readouterr().err.splitlines()
  assert err.startswith("error: --allow_mixed=False is not allowed: the run cache ")
  assert cli.main([str(study), "--out", out, "--no_progress", "--allow_mixed"]) == 0
  res = json.loads((tmp_path / "out" / "results.json").read_text())
  assert res["mixed"] is True and res["provenance"]["commit"] == provenance_lib.git_commit()
