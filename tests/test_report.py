"""The run-comparison report (``nbsgd_jax.report``) on two short real runs: the table's numbers
against the runs' ``metrics.jsonl``, the figures, runs in progress / without evaluations /
not runs, and the command line."""

import json
import os
import shutil
import subprocess
import sys

import chex
import numpy as np
import pytest

from nbsgd_jax import report, train

from tests.test_train import small_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ["loss_accuracy_vs_sim_time.png", "loss_accuracy_vs_wall_time.png",
           "loss_accuracy_vs_bytes_sent.png", "loss_accuracy_vs_step.png"]
NUM_STEPS, EVAL_EVERY, BATCH, WORKERS = 30, 10, 8, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two short real runs that differ only in ``algorithm``: {"allreduce": dir, "dpsgd": dir}."""
  base = tmp_path_factory.mktemp("runs")
  dirs = {}
  for algo in ("allreduce", "dpsgd"):
    cfg = small_cfg(algorithm=algo, num_steps=NUM_STEPS, eval_every=EVAL_EVERY,
                    batch_size=BATCH, num_workers=WORKERS, learning_rate=0.1)
    dirs[algo] = str(base / algo)
    train.train(cfg, dirs[algo])
  return dirs


def read_records(run_dir):
  out = []
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except ValueError:  # a torn line, as the report skips it
        continue
  return out


def expected_to_target(records, target):
  """Independent reference: (step, sim_time, wall_time, bytes_sent) of the first evaluation
  with train_loss <= target, or None."""
  for rec in records:
    if rec["train_loss"] is not None and rec["train_loss"] <= target:
      return rec["step"], rec["sim_time"], rec["wall_time"], rec["bytes_sent"]
  return None


def copy_run(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def by_run(result):
  return {row["run"]: row for row in result["rows"]}


# ------------------------------------------------------------------ the table


def test_table_matches_metrics(runs, tmp_path):
  result = report.build_report([runs["allreduce"], runs["dpsgd"]], str(tmp_path / "out"))
  rows = by_run(result)
  assert list(rows) == ["allreduce", "dpsgd"]
  recs = {a: read_records(d) for a, d in runs.items()}
  assert [r["step"] for r in recs["dpsgd"]] == [0, 10, 20, 30]
  target = max(recs[a][-1]["train_loss"] for a in recs)  # default: highest final train loss
  assert result["target_loss"] == target
  for algo, row in rows.items():
    last = recs[algo][-1]
    assert row["algorithm"] == algo and row["status"] == "finished" and row["finished"]
    assert row["settings"] == {"algorithm": algo}  # the only key that differs
    assert row["label"] == f"algorithm={algo}"
    assert row["step"] == NUM_STEPS and row["num_steps"] == NUM_STEPS
    chex.assert_trees_all_close(
        (row["final_test_accuracy"], row["final_train_loss"], row["sim_time"],
         row["wall_time"], row["bytes_sent"], row["mb_sent"]),
        (last["test_accuracy"], last["train_loss"], last["sim_time"], last["wall_time"],
         last["bytes_sent"], last["bytes_sent"] / 1e6), rtol=1e-12)
    np.testing.assert_allclose(row["samples_per_second"],
                               NUM_STEPS * BATCH * WORKERS / last["wall_time"], rtol=1e-12)
    exp = expected_to_target(recs[algo], target)
    assert exp is not None  # the default target is reached by every run
    assert (row["target_step"], row["target_sim_time"], row["target_wall_time"],
            row["target_bytes_sent"]) == exp
  # The two algorithms send different amounts (all-reduce 2(n-1)/n S, ring gossip 2 S).
  assert rows["allreduce"]["bytes_sent"] != rows["dpsgd"]["bytes_sent"]

  md = (tmp_path / "out" / "report.md").read_text()
  assert f"{target:.4g}" in md and "highest final training loss" in md
  for algo, row in rows.items():
    line = next(l for l in md.splitlines() if l.startswith(f"| {algo} |"))
    assert f"| {NUM_STEPS} / {NUM_STEPS} |" in line and "in progress" not in line
    assert f"{row['final_test_accuracy']:.4f}" in line
    assert f"{row['mb_sent']:.4g}" in line and "not reached" not in line


def test_explicit_target_midway(runs, tmp_path):
  """A target between the first and the last loss: reached at an intermediate evaluation."""
  recs = read_records(runs["allreduce"])
  losses = [r["train_loss"] for r in recs]
  assert losses[0] > losses[1] > losses[2]
  target = (losses[1] + losses[2]) / 2
  rows = by_run(report.build_report(list(runs.values()), str(tmp_path / "o"), target))
  for algo, d in runs.items():
    exp = expected_to_target(read_records(d), target)
    row = rows[algo]
    assert row["target_loss"] == target
    if exp is None:
      assert row["target_step"] is None and row["target_sim_time"] is None
    else:
      assert (row["target_step"], row["target_sim_time"], row["target_wall_time"],
              row["target_bytes_sent"]) == exp
  assert rows["allreduce"]["target_step"] == 20  # the second evaluation after step 0
  assert "(`--target_loss`)" in (tmp_path / "o" / "report.md").read_text()


def test_target_not_reached(runs, tmp_path):
  result = report.build_report(list(runs.values()), str(tmp_path / "o"), target_loss=1e-6)
  for row in result["rows"]:
    assert row["target_step"] is None and row["target_sim_time"] is None
    assert row["target_wall_time"] is None and row["target_bytes_sent"] is None
  md = (tmp_path / "o" / "report.md").read_text()
  for algo in runs:
    line = next(l for l in md.splitlines() if l.startswith(f"| {algo} |"))
    assert line.count("not reached") == 3  # sim s, wall s and MB to target


# ------------------------------------------------------------------ figures


def test_figures_are_valid_pngs(runs, tmp_path):
  import matplotlib.image
  out = tmp_path / "out"
  result = report.build_report(list(runs.values()), str(out))
  assert sorted(os.path.basename(p) for p in result["figures"]) == sorted(
      FIGURES + ["consensus_distance.png"])
  md = (out / "report.md").read_text()
  for name in FIGURES + ["consensus_distance.png"]:
    path = out / name
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0.01  # not blank
    assert f"]({name})" in md  # embedded with a relative link
  assert not [p for p in os.listdir(out) if ".tmp" in p]  # no temporary file left


def test_no_consensus_plot_without_decentralized_runs(runs, tmp_path):
  out = tmp_path / "out"
  (out).mkdir()
  (out / "consensus_distance.png").write_bytes(PNG_MAGIC)  # stale, from an earlier report
  result = report.build_report([runs["allreduce"]], str(out))
  assert not (out / "consensus_distance.png").exists()
  assert len(result["figures"]) == 4
  md = (out / "report.md").read_text()
  assert "no run has consensus distance data: no consensus plot" in md
  assert "consensus_distance.png)" not in md
  # A single run: nothing differs, the label is the directory name.
  assert result["rows"][0]["label"] == "allreduce" and result["rows"][0]["settings"] == {}


# ------------------------------------------------------------------ robustness


def test_in_progress_no_eval_and_not_a_run(runs, tmp_path, capsys):
  recs = read_records(runs["dpsgd"])
  live = copy_run(runs["dpsgd"], tmp_path / "live")
  os.remove(os.path.join(live, "summary.json"))
  lines = open(os.path.join(live, "metrics.jsonl")).read().splitlines()
  with open(os.path.join(live, "metrics.jsonl"), "w") as f:  # a crash mid-write of step 30
    f.write("\n".join(lines[:-1]) + "\n" + lines[-1][:25])
  fresh = tmp_path / "fresh"  # started, nothing evaluated yet
  fresh.mkdir()
  shutil.copy(os.path.join(runs["dpsgd"], "config.json"), fresh)
  (fresh / "metrics.jsonl").write_text("")
  fresh2 = tmp_path / "fresh2"  # not even metrics.jsonl
  fresh2.mkdir()
  shutil.copy(os.path.join(runs["allreduce"], "config.json"), fresh2)
  junk = tmp_path / "junk"
  junk.mkdir()
  (junk / "notes.txt").write_text("hello")

  out = tmp_path / "out"
  dirs = [runs["allreduce"], live, str(fresh), str(fresh2), str(junk)]
  result = report.build_report(dirs, str(out))
  err = capsys.readouterr().err
  assert f"skipped {junk}: not a run directory (no config.json)" in err.splitlines()
  assert result["skipped"] == [(str(junk), "not a run directory (no config.json)")]
  rows = by_run(result)
  assert list(rows) == ["allreduce", "live", "fresh", "fresh2"]

  row = rows["live"]
  assert row["status"] == "in progress" and not row["finished"]
  assert row["step"] == 20 and row["skipped_lines"] == 1
  assert row["final_train_loss"] == recs[2]["train_loss"]
  assert row["sim_time"] == recs[2]["sim_time"]
  np.testing.assert_allclose(row["samples_per_second"],
                             20 * BATCH * WORKERS / recs[2]["wall_time"], rtol=1e-12)
  # Target: the highest final loss among the runs with evaluations (not the empty ones).
  target = max(read_records(runs["allreduce"])[-1]["train_loss"], recs[2]["train_loss"])
  assert result["target_loss"] == target
  exp = expected_to_target(recs[:3], target)
  assert (row["target_step"], row["target_sim_time"]) == (exp[0], exp[1])
  for name in ("fresh", "fresh2"):
    assert rows[name]["status"] == "no evaluation yet" and rows[name]["step"] is None
    assert rows[name]["final_test_accuracy"] is None and rows[name]["target_step"] is None
  # Mixed algorithms: labels by the differing key; equal configs get the directory name.
  assert rows["allreduce"]["label"] == "algorithm=allreduce (allreduce)"
  assert rows["live"]["label"] == "algorithm=dpsgd (live)"
  assert len({r["label"] for r in result["rows"]}) == 4

  md = (out / "report.md").read_text()
  live_line = next(l for l in md.splitlines() if l.startswith("| live |"))
  assert f"| 20 / {NUM_STEPS} (in progress) |" in live_line
  assert f"- fresh ({fresh}): no evaluation yet" in md
  assert f"- fresh2 ({fresh2}): no evaluation yet" in md
  fresh_line = next(l for l in md.splitlines() if l.startswith("| fresh |"))
  assert "no evaluation yet" in fresh_line
  assert f"skipped {junk}: not a run directory (no config.json)" in md
  assert "skipped 1 unparsable line" in md
  for name in FIGURES + ["consensus_distance.png"]:
    assert (out / name).read_bytes()[:8] == PNG_MAGIC


def test_load_run_skips_bad_lines(runs, tmp_path):
  d = copy_run(runs["allreduce"], tmp_path / "r")
  good = read_records(d)
  with open(os.path.join(d, "metrics.jsonl"), "a") as f:
    f.write("[1, 2]\n\n{\"no_step\": 1}\n{\"step\": 40, \"train_lo")
  run = report.load_run(d)
  assert run.records == good and run.skipped_lines == 3 and run.finished
  assert run.flat_config["nonblocking.enabled"] is False
  with pytest.raises(report.NotARunError, match="no config.json"):
    report.load_run(str(tmp_path))
  with pytest.raises(report.NotARunError, match="no such directory"):
    report.load_run(str(tmp_path / "missing"))


def test_nested_differences_and_noise_keys(runs, tmp_path):
  a = copy_run(runs["dpsgd"], tmp_path / "blocking")
  b = copy_run(runs["dpsgd"], tmp_path / "nonblocking")
  cfg = json.load(open(os.path.join(b, "config.json")))
  cfg["nonblocking"]["enabled"] = True
  cfg["progress"] = True  # noise: never a difference
  json.dump(cfg, open(os.path.join(b, "config.json"), "w"))
  rows = by_run(report.build_report([a, b], str(tmp_path / "o")))
  assert rows["nonblocking"]["label"] == "nonblocking.enabled=True"
  assert rows["blocking"]["settings"] == {"nonblocking.enabled": False}


def test_no_run_at_all_raises(tmp_path):
  with pytest.raises(ValueError, match="no run directory"):
    report.build_report([str(tmp_path)], str(tmp_path / "o"))
  assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ command line


def run_cli(*args):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, "-m", "nbsgd_jax.report", *map(str, args)],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_cli(runs, tmp_path):
  out = tmp_path / "out"
  r = run_cli(runs["allreduce"], runs["dpsgd"], tmp_path, "--out", out, "--target_loss", "1.0")
  assert r.returncode == 0, r.stderr
  assert f"skipped {tmp_path}: not a run directory (no config.json)" in r.stderr
  md = (out / "report.md").read_text()
  assert "Target training loss: 1 (`--target_loss`)" in md
  assert (out / "loss_accuracy_vs_step.png").read_bytes()[:8] == PNG_MAGIC

  for bad in ([tmp_path, "--out", tmp_path / "o2"],          # no run directory
              [runs["dpsgd"], "--out", out, "--target_loss", "abc"],
              [runs["dpsgd"], "--out", out, "--target_loss", "nan"],
              [runs["dpsgd"]]):                               # --out missing
    r = run_cli(*bad)
    assert r.returncode == 2, (bad, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1, r.stderr
  assert not (tmp_path / "o2").exists()
