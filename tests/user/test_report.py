"""The run-comparison report (``nbsgd_jax.report``) on two short real runs: the table's numbers
against the runs' ``metrics.jsonl``, the figures, runs in progress / without evaluations /
not runs, and the command line."""

import json
import os
import shutil

import chex
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import report, train
from nbsgd_jax.run import naming

from tests.helpers import run_python, small_cfg

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ["loss_accuracy_vs_sim_time.png", "loss_accuracy_vs_wall_time.png",
           "loss_accuracy_vs_bytes_sent.png", "loss_accuracy_vs_step.png",
           "time_by_cause.png"]  # every lockstep run has its time by cause
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


@pytest.fixture(scope="module")
def ad_psgd_run(tmp_path_factory):
  """A short real ``ad_psgd`` run as ``runs``' (event clock), with keys it does not read
  changed: ``diloco.local_steps`` and ``nonblocking.num_minibatches``."""
  d = str(tmp_path_factory.mktemp("async") / "ad_psgd")
  train.train(small_cfg(algorithm="ad_psgd", num_steps=NUM_STEPS, eval_every=EVAL_EVERY,
                        batch_size=BATCH, num_workers=WORKERS, learning_rate=0.1,
                        **{"diloco.local_steps": 7, "nonblocking.num_minibatches": 2}), d)
  return d


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


@pytest.mark.slow
def test_table_matches_metrics(runs, tmp_path):
  """The table a user reads holds each run's last evaluation, the first evaluation that
  reaches the target (expected_to_target, a loop of its own), and numbers checked against
  closed forms rather than against the report's formulas: the MLP 784-32-10 has 25,450
  float32 parameters (S = 101,800 bytes), so after 30 steps all-reduce has sent
  30 x 2 (n - 1) / n x S = 4,581,000 bytes per worker and D-PSGD on a ring 30 x 2 x S =
  6,108,000; the throughput times the wall time is the 30 x 8 x 4 = 960 examples trained on."""
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
    assert row["label"] == algo == row["algorithm_as_run"]  # the algorithm as run
    assert row["step"] == NUM_STEPS and row["num_steps"] == NUM_STEPS
    chex.assert_trees_all_close(
        (row["final_test_accuracy"], row["final_train_loss"], row["sim_time"],
         row["wall_time"], row["bytes_sent"], row["mb_sent"]),
        (last["test_accuracy"], last["train_loss"], last["sim_time"], last["wall_time"],
         last["bytes_sent"], last["bytes_sent"] / 1e6), rtol=1e-12)
    np.testing.assert_allclose(row["samples_per_second"] * row["wall_time"], 960, rtol=1e-9)
    exp = expected_to_target(recs[algo], target)
    assert exp is not None  # the default target is reached by every run
    assert (row["target_step"], row["target_sim_time"], row["target_wall_time"],
            row["target_bytes_sent"]) == exp
  s_bytes = 4 * (784 * 32 + 32 + 32 * 10 + 10)  # the MLP's float32 parameters, by hand
  assert s_bytes == 101_800
  assert rows["allreduce"]["bytes_sent"] == NUM_STEPS * 2 * (WORKERS - 1) / WORKERS * s_bytes
  assert rows["dpsgd"]["bytes_sent"] == NUM_STEPS * 2 * s_bytes
  mb = (rows["allreduce"]["mb_sent"], rows["dpsgd"]["mb_sent"])
  assert mb == pytest.approx((4.581, 6.108))

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


# ------------------------------------------------------------------ what the runs did


@pytest.mark.parametrize("over,name", [
    ({}, "dpsgd"),
    ({"nonblocking.enabled": True}, "dpsgd + non-blocking (M = 4)"),
    ({"nonblocking.num_minibatches": 2}, "dpsgd"),  # M of a run that is not non-blocking
    ({"algorithm": "ad_psgd"}, "ad_psgd (event clock)"),
    ({"algorithm": "async_diloco"}, "async_diloco (event clock)"),
    ({"algorithm": "allreduce", "compression.name": "top_k"},
     "allreduce + top_k (density 0.01, error feedback)"),
    ({"algorithm": "allreduce", "compression.name": "top_k", "compression.density": 0.05,
      "compression.error_feedback": False, "compression.flatten": False},
     "allreduce + top_k (density 0.05, no error feedback, per layer)"),
    ({"algorithm": "choco_sgd", "compression.name": "top_k"},  # its codec keeps no residual
     "choco_sgd + top_k (density 0.01)"),
    ({"consensus.control": True}, "dpsgd + consensus control"),
    ({"algorithm": "diloco", "nonblocking.enabled": True, "nonblocking.num_minibatches": 2,
      "compression.name": "powersgd", "cluster.failures": "1:5:3"},
     "diloco + non-blocking (M = 2) + powersgd (rank 2, error feedback) + failures (1:5:3)"),
])
def test_the_algorithm_as_run_composes_its_parts(over, name):
  cfg = config_lib.override(config_lib.default_config(), over)
  assert naming.algorithm_as_run(cfg) == name
  assert naming.algorithm_as_run(json.loads(cfg.to_json_best_effort())) == name  # config.json


def test_the_name_states_its_keys_and_ignored_keys_are_named_as_unused():
  cfg = config_lib.override(config_lib.default_config(), {"nonblocking.enabled": True})
  assert naming.named_keys(cfg) == {  # the words' keys, and the switches of those off
      "algorithm", "nonblocking.enabled", "nonblocking.num_minibatches", "compression.name",
      "consensus.control", "cluster.failures", "cluster.failure_mtbf", "cluster.failure_policy"}
  choco = config_lib.override(config_lib.default_config(), {
      "algorithm": "choco_sgd", "compression.name": "top_k", "compression.error_feedback": False})
  assert naming.algorithm_as_run(choco) == "choco_sgd + top_k (density 0.01)"
  assert config_lib.inactive_warnings(choco) == [
      "config.compression.error_feedback=False has no effect: config.algorithm='choco_sgd'"]


def config_dir(tmp_path, name, **over):
  """A run directory holding only its ``config.json`` (no evaluation yet)."""
  d = tmp_path / name
  d.mkdir()
  cfg = config_lib.override(config_lib.default_config(), over)
  (d / "config.json").write_text(cfg.to_json_best_effort())
  return str(d)


def test_settings_differ_only_among_the_runs_that_read_them(tmp_path):
  ad = config_dir(tmp_path, "ad", algorithm="ad_psgd", **{
      "diloco.local_steps": 7, "nonblocking.num_minibatches": 2, "compression.density": 0.1})
  dp = config_dir(tmp_path, "dp", algorithm="dpsgd")
  assert report.differing_keys([report.load_run(d) for d in (ad, dp)]) == ["algorithm"]
  lo = config_dir(tmp_path, "lo", algorithm="diloco", **{"diloco.local_steps": 7})
  hi = config_dir(tmp_path, "hi", algorithm="diloco")
  rows = by_run(report.build_report([ad, dp, lo, hi], str(tmp_path / "o")))
  assert rows["lo"]["settings"] == {"algorithm": "diloco", "diloco.local_steps": 7}
  assert rows["hi"]["settings"] == {"algorithm": "diloco", "diloco.local_steps": 50}
  assert rows["ad"]["settings"] == {"algorithm": "ad_psgd"}  # 7 there, but not read
  assert rows["ad"]["label"] == "ad_psgd (event clock)"
  assert rows["lo"]["label"] == "diloco, diloco.local_steps=7"
  # compression.density counts only among the runs whose codec reads it
  top = [config_dir(tmp_path, f"top{d}", algorithm="allreduce", **{
      "compression.name": "top_k", "compression.density": d}) for d in (0.01, 0.05)]
  plain = config_dir(tmp_path, "plain", algorithm="allreduce", **{"compression.density": 0.5})
  rows = by_run(report.build_report(top + [plain], str(tmp_path / "o2")))
  assert rows["top0.05"]["settings"] == {"compression.name": "top_k", "compression.density": 0.05}
  assert rows["plain"]["settings"] == {"compression.name": "none"}
  assert rows["top0.05"]["label"] == "allreduce + top_k (density 0.05, error feedback)"
  md = (tmp_path / "o2" / "report.md").read_text()
  assert "| top0.05 | allreduce + top_k (density 0.05, error feedback) | - |" in md


@pytest.mark.slow
def test_the_event_clock_s_facts_are_columns_and_a_note(runs, ad_psgd_run, tmp_path):
  """The asynchronous run's events and staleness (its last record's) are columns, "-" for
  the lockstep run; a note says what its steps applied; the keys it does not read are not
  differences; summary.json carries the algorithm as run."""
  with open(os.path.join(ad_psgd_run, "summary.json")) as f:
    summary = json.load(f)
  assert (summary["algorithm"], summary["algorithm_as_run"]) == ("ad_psgd",
                                                                 "ad_psgd (event clock)")
  last = read_records(ad_psgd_run)[-1]
  events, mean, top = last["events"], last["staleness_tau"], last["staleness_tau_max"]
  own = last["staleness_own_steps"]
  assert events > NUM_STEPS and mean > own > 0  # 4 workers on a ring: up to 2 events a step
  rows = by_run(report.build_report([ad_psgd_run, runs["dpsgd"]], str(tmp_path / "o")))
  ad = rows["ad_psgd"]
  assert (ad["events"], ad["staleness_tau"], ad["staleness_tau_max"],
          ad["staleness_own_steps"]) == (events, mean, top, own)
  assert ad["pushes"] is None and rows["dpsgd"]["events"] is None
  assert ad["settings"] == {"algorithm": "ad_psgd"}  # not diloco.*, not num_minibatches
  md = (tmp_path / "o" / "report.md").read_text()
  cells = lambda start: [c.strip() for c in next(
      l for l in md.splitlines() if l.startswith(start)).strip("|").split("|")]
  head = cells("| run |")
  assert head[-4:] == ["events", "staleness tau mean", "staleness tau max",
                       "own-model staleness mean"] and "pushes" not in head
  assert cells("| ad_psgd |")[-4:] == [f"{events}", f"{mean:.3g}", f"{top}", f"{own:.3g}"]
  assert cells("| dpsgd |")[-4:] == ["-", "-", "-", "-"]
  assert cells("| ad_psgd |")[1] == "ad_psgd (event clock)"
  per = events / NUM_STEPS
  assert (f"- ad_psgd: its {NUM_STEPS} steps applied {events} events ({per:.3g} a step: "
          f"{per / WORKERS:.2g} of a gradient step per worker a step)") in md
  assert "local_steps" not in md and "num_minibatches" not in md


# ------------------------------------------------------------------ figures


@pytest.mark.slow  # the fast tier keeps the report's other checks
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


@pytest.mark.slow  # the fast tier keeps the report's other checks
def test_no_consensus_plot_without_decentralized_runs(runs, tmp_path):
  out = tmp_path / "out"
  (out).mkdir()
  (out / "consensus_distance.png").write_bytes(PNG_MAGIC)  # stale, from an earlier report
  result = report.build_report([runs["allreduce"]], str(out))
  assert not (out / "consensus_distance.png").exists()
  assert len(result["figures"]) == len(FIGURES)
  md = (out / "report.md").read_text()
  assert "no run has consensus distance data: no consensus plot" in md
  assert "consensus_distance.png)" not in md
  # A single run: nothing differs, the label is the directory name.
  assert result["rows"][0]["label"] == "allreduce" and result["rows"][0]["settings"] == {}


# ------------------------------------------------------------------ robustness


@pytest.mark.slow  # the fast tier keeps the report's other checks
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
  # Mixed algorithms: labels by the algorithm as run; equal configs get the directory name.
  assert rows["allreduce"]["label"] == "allreduce (allreduce)"
  assert rows["live"]["label"] == "dpsgd (live)"
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


@pytest.mark.slow  # the fast tier keeps the report's other checks
def test_nested_differences_and_noise_keys(runs, tmp_path):
  a = copy_run(runs["dpsgd"], tmp_path / "blocking")
  b = copy_run(runs["dpsgd"], tmp_path / "nonblocking")
  cfg = json.load(open(os.path.join(b, "config.json")))
  cfg["nonblocking"]["enabled"] = True
  cfg["progress"] = True  # noise: never a difference
  cfg["learning_rate"] = 0.2  # a difference the algorithm as run does not state
  json.dump(cfg, open(os.path.join(b, "config.json"), "w"))
  rows = by_run(report.build_report([a, b], str(tmp_path / "o")))
  assert rows["nonblocking"]["label"] == "dpsgd + non-blocking (M = 4), learning_rate=0.2"
  assert rows["blocking"]["label"] == "dpsgd, learning_rate=0.1"  # "dpsgd": not non-blocking
  assert rows["blocking"]["settings"] == {"nonblocking.enabled": False, "learning_rate": 0.1}
  line = next(l for l in (tmp_path / "o" / "report.md").read_text().splitlines()
              if l.startswith("| nonblocking |"))  # the algorithm column states M
  assert "| dpsgd + non-blocking (M = 4) | learning_rate=0.2 |" in line


def test_no_run_at_all_raises(tmp_path):
  with pytest.raises(ValueError, match="no run directory"):
    report.build_report([str(tmp_path)], str(tmp_path / "o"))
  assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ command line


def run_cli(*args):
  return run_python(["-m", "nbsgd_jax.report", *args], timeout=120)


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
def test_cli(runs, tmp_path, capsys):
  out = tmp_path / "out"
  r = run_cli(runs["allreduce"], runs["dpsgd"], tmp_path, "--out", out, "--target_loss", "1.0")
  assert r.returncode == 0, r.stderr
  assert f"skipped {tmp_path}: not a run directory (no config.json)" in r.stderr
  md = (out / "report.md").read_text()
  assert "Target training loss: 1 (`--target_loss`)" in md
  assert (out / "loss_accuracy_vs_step.png").read_bytes()[:8] == PNG_MAGIC

  # bad arguments in process (the command's own process is the run above): status 2 and one
  # error line; an exception that escaped main would fail the test
  for bad in ([tmp_path, "--out", tmp_path / "o2"],          # no run directory
              [runs["dpsgd"], "--out", out, "--target_loss", "abc"],
              [runs["dpsgd"], "--out", out, "--target_loss", "nan"],
              [runs["dpsgd"]]):                               # --out missing
    capsys.readouterr()
    try:
      status = report.main([str(a) for a in bad])
    except SystemExit as e:
      status = e.code
    err = capsys.readouterr().err
    assert status == 2, (bad, err)
    errors = [l for l in err.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1, err
  assert not (tmp_path / "o2").exists()


def test_goodput_and_the_time_split_are_columns_with_their_definition(runs, tmp_path):
  """Each lockstep run's ``goodput`` and its time by cause (``time_compute``, ``time_comm``,
  ``time_wait``, ``time_down``) are columns of report.md, read back from the table as the
  records give them, and a note defines goodput."""
  rows = by_run(report.build_report([runs["allreduce"], runs["dpsgd"]], str(tmp_path / "o")))
  md = (tmp_path / "o" / "report.md").read_text()
  head = next(l for l in md.splitlines() if l.startswith("| run |"))
  cols = [c.strip() for c in head.strip("|").split("|")]
  for algo in rows:
    last = read_records(runs[algo])[-1]
    line = next(l for l in md.splitlines() if l.startswith(f"| {algo} |"))
    cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
    for key, title in (("goodput", "goodput"), ("time_compute", "computing"),
                       ("time_comm", "communicating"), ("time_wait", "waiting"),
                       ("time_down", "down")):
      assert cells[title] == f"{last[key]:.3f}", (algo, key)
    assert 0 < last["goodput"] <= last["time_compute"] + 1e-12
  assert "goodput: the seconds the workers computed gradients that entered the model" in md
