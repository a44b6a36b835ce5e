"""The report shows the simulated fleet (``nbsgd_jax.report``, ``docs/guide.md``, "Compare
them"): the time by cause (a column per cause and ``time_by_cause.png``), the counterfactual
``sim_time_ideal``, the failures, episodes and restarts counted, the network's levels, the
trace and the failure and episode settings, and a note under a consensus curve whose
evaluations all fall just after a synchronisation. Read back from ``report.md``: on synthetic
run directories (values chosen here), and on small real fleet runs whose counts are held to
closed forms and to numpy transcriptions of the draws. The guide's table of metric fields
is compared with the fields those runs write."""

import json
import math
import os
import re

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import report, train
from nbsgd_jax.report import fleet as fleet_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guide.md")
LEVELS = ["2:1e-5:1e9"]


def fake_run(base, name, over, records, summary=None):
  """A run directory as train() writes it: ``config.json`` (the default config with
  ``over``), ``metrics.jsonl`` (``records``) and, when given, ``summary.json``."""
  d = base / name
  d.mkdir()
  cfg = config_lib.override(config_lib.default_config(), over)
  (d / "config.json").write_text(cfg.to_json_best_effort())
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  if summary is not None:
    (d / "summary.json").write_text(json.dumps({**records[-1], **summary}))
  return str(d)


def table_cells(md):
  """``{run: {column title: cell}}`` of report.md's table."""
  lines = md.splitlines()
  head = next(i for i, l in enumerate(lines) if l.startswith("| run |"))
  cols = [c.strip() for c in lines[head].strip("|").split("|")]
  out = {}
  for line in lines[head + 2:]:
    if not line.startswith("|"):
      break
    cells = [c.strip() for c in line.strip("|").split("|")]
    out[cells[0]] = dict(zip(cols, cells))
  return out


def shared_table(md):
  """``{setting: value}`` of report.md's shared-settings table."""
  lines = md.splitlines()
  start = lines.index("| setting | value |") + 2
  out = {}
  for line in lines[start:]:
    if not line.startswith("|"):
      break
    key, value = [c.strip() for c in line.strip("|").split("|")]
    out[key] = value
  return out


# ------------------------------------------------------------------ synthetic run directories


@pytest.fixture
def no_loss_plots(monkeypatch):
  """The loss / accuracy figures (not under test here, seconds to draw) are not drawn."""
  monkeypatch.setattr(report, "plot_loss_accuracy", lambda *a, **k: None)

FLEET = {"algorithm": "allreduce", "cluster.levels": tuple(LEVELS),
         "cluster.trace": "traces/slow.csv", "cluster.failures": "1:3:4",
         "cluster.failure_mtbf": 0.001}


def _record(step, sim, split, **extra):
  keys = ("time_compute", "time_comm", "time_wait", "time_down")
  return {"step": step, "sim_time": sim, "wall_time": 1.0 + step, "train_loss": 1.0 / (1 + step),
          "bytes_sent": 1e5 * step, **dict(zip(keys, split)), **extra}


def test_fleet_columns_settings_labels_and_the_time_figure(tmp_path, no_loss_plots):
  """Three fleet runs on the same levels, trace and failures; only the first has episodes
  (3 begun), the second none; the third restarts. The report's table shows each count where
  the run simulated that process ("0" when none began, "-" without it), the ideal time and
  sim / ideal, the time by cause; the shared settings hold the network, the trace and the
  failures; the labels name the episodes; the bar figure is written and linked."""
  a = fake_run(tmp_path, "eps", {**FLEET, "cluster.episode_rate": 0.03}, [
      _record(0, 0.0, (0, 0, 0, 0)),
      _record(10, 2.5, (0.5, 0.2, 0.2, 0.1), sim_time_ideal=2.0, goodput=0.4, failures=0,
              episodes=3)])
  b = fake_run(tmp_path, "calm", FLEET, [
      _record(10, 2.0, (0.6, 0.3, 0.1, 0.0), sim_time_ideal=2.0, goodput=0.6, failures=2)])
  c = fake_run(tmp_path, "restart", {**FLEET, "cluster.failure_policy": "restart"}, [
      _record(10, 3.0, (0.4, 0.2, 0.1, 0.3), sim_time_ideal=2.0, goodput=0.4, failures=1,
              restarts=1.0, restart_lost=0.9)])
  out = tmp_path / "out"
  result = report.build_report([a, b, c], str(out))
  md = (out / "report.md").read_text()
  cells = table_cells(md)
  assert (cells["eps"]["failures"], cells["eps"]["episodes"], cells["eps"]["restarts"]) == (
      "0", "3", "-")
  assert (cells["calm"]["failures"], cells["calm"]["episodes"], cells["calm"]["restarts"]) == (
      "2", "-", "-")
  assert (cells["restart"]["failures"], cells["restart"]["restarts"]) == ("1", "1")
  assert cells["eps"]["ideal sim time (s)"] == "2" and cells["eps"]["sim / ideal"] == "1.25"
  assert cells["restart"]["sim / ideal"] == "1.5" and cells["calm"]["sim / ideal"] == "1"
  assert [cells["eps"][t] for t in ("computing", "communicating", "waiting", "down")] == [
      "0.500", "0.200", "0.200", "0.100"]
  shared = shared_table(md)
  assert shared["cluster.levels"] == json.dumps(LEVELS, separators=(",", ":"))
  assert shared["cluster.trace"] == "traces/slow.csv"
  assert shared["cluster.failures"] == "1:3:4" and shared["cluster.failure_mtbf"] == "0.001"
  assert "cluster.episode_rate" not in shared  # it differs: in the labels
  labels = {row["run"]: row["label"] for row in result["rows"]}
  assert "episodes (0.03/h, median 1260 s, x1.5)" in labels["eps"]
  assert "no episodes" in labels["calm"] and "restarts" in labels["restart"]
  assert "failures, episodes, restarts: the failures (schedule and rate)" in md
  assert "ideal sim time: the same steps and communication rounds" in md
  # the figure: seconds per cause are the fractions times sim_time (2.5 s)
  row = next(r for r in result["rows"] if r["run"] == "eps")
  assert fleet_report.cause_seconds(row) == pytest.approx(
      {"time_compute": 1.25, "time_comm": 0.5, "time_wait": 0.5, "time_down": 0.25})
  assert (out / "time_by_cause.png").read_bytes()[:8] == PNG_MAGIC
  assert "](time_by_cause.png)" in md
  assert str(out / "time_by_cause.png") in result["figures"]


def test_no_fleet_no_fault_columns_and_no_stale_time_figure(tmp_path, no_loss_plots):
  """Runs without failures, episodes or the time split: no count column, no fleet setting,
  and a time figure left by an earlier report is removed."""
  plain = fake_run(tmp_path, "plain", {"algorithm": "allreduce"},
                   [{"step": 5, "sim_time": 1.0, "train_loss": 0.3}])
  out = tmp_path / "out"
  out.mkdir()
  (out / "time_by_cause.png").write_bytes(PNG_MAGIC)
  report.build_report([plain], str(out))
  md = (out / "report.md").read_text()
  head = next(l for l in md.splitlines() if l.startswith("| run |"))
  for title in ("failures", "episodes", "restarts", "ideal sim time (s)", "computing"):
    assert f"| {title} |" not in head
  assert "cluster." not in "".join(shared_table(md))
  assert not (out / "time_by_cause.png").exists()


def _consensus_run(base, name, steps, summary, **over):
  records = [{"step": s, "sim_time": 0.1 * s, "train_loss": 1.0 / (1 + s),
              "consensus_distance": 0.0 if s == 0 else 1e-8 * s} for s in steps]
  return fake_run(base, name, {"algorithm": "diloco", "diloco.local_steps": 5, **over},
                  records, summary)


def test_a_note_under_a_consensus_curve_evaluated_at_synchronisations(tmp_path, monkeypatch,
                                                                     no_loss_plots):
  """DiLoCo with H = 5 evaluated at steps 5 and 10 (just after its averages): a note and a
  legend entry say so, from its summary's periods (finished) or from its recipe's planner
  (in progress); evaluated at steps 5 and 8 (one between averages), or a run that is not
  periodic: none."""
  at = _consensus_run(tmp_path, "at", (0, 5, 10), {"periods": [5, 5]})
  live = _consensus_run(tmp_path, "live", (0, 5, 10), None)
  off = _consensus_run(tmp_path, "off", (0, 5, 8), {"periods": [5, 5]})
  gossip = fake_run(tmp_path, "gossip", {"algorithm": "dpsgd"}, [
      {"step": s, "sim_time": 0.1 * s, "train_loss": 0.5, "consensus_distance": 0.1}
      for s in (5, 10)], {})
  drawn = {}
  monkeypatch.setattr(report, "plot_consensus",
                      lambda runs, labels, path, colors: drawn.update(zip(
                          [r.name for r in runs], labels)))
  result = report.build_report([at, live, off, gossip], str(tmp_path / "o"))
  labels = {row["run"]: row["label"] for row in result["rows"]}
  md = (tmp_path / "o" / "report.md").read_text()
  for name in ("at", "live"):
    assert drawn[name] == f"{labels[name]} (evaluated just after syncs)"
    assert (f"*{labels[name]}: its 2 evaluations after step 0 (steps 5, 10) all fall just "
            "after a synchronisation (its periods: every 5 steps)") in md
  for name in ("off", "gossip"):
    assert drawn[name] == labels[name]
    assert f"*{labels[name]}: its" not in md


# ------------------------------------------------------------------ real fleet runs

S0 = 0.008  # nominal s a step: 1 ms an example x 8 examples
LSQ = {"dataset": "least_squares", "problem.shards": 4, "problem.examples_per_worker": 8,
       "problem.dim": 4, "problem.full_batch": True, "num_workers": 4, "batch_size": 8,
       "learning_rate": 0.05, "num_steps": 40, "eval_every": 10, "progress": False,
       "cluster.levels": tuple(LEVELS)}
RATE = {"cluster.failure_mtbf": 0.0005, "cluster.failure_repair": 0.02,
        "cluster.episode_rate": 40000.0, "cluster.episode_median": 0.02}
RUNS = {
    "sched": {"algorithm": "allreduce", "cluster.failures": "1:3:4,2:20:2"},
    "rate": {"algorithm": "allreduce", **RATE},
    "restart": {"algorithm": "allreduce", "cluster.failures": "1:3:4",
                "cluster.failure_policy": "restart", "cluster.restart_every": 5,
                "cluster.restart_seconds": 0.01},
    "event": {"algorithm": "ad_psgd", "topology": "ring", "cluster.failures": "1:3:4"},
}


@pytest.fixture(scope="module")
def fleet_runs(tmp_path_factory):
  """Small least-squares runs on a two-level network with a trace (worker 3 at 16 ms a step
  from step 20): failures by schedule, at a rate with episodes, restarting, and on the event
  clock. ``{name: run directory}``."""
  base = tmp_path_factory.mktemp("fleet")
  trace = base / "slow.csv"
  trace.write_text("step,worker,seconds\n20,3,0.016\n")
  dirs = {}
  for name, over in RUNS.items():
    dirs[name] = str(base / name)
    cfg = config_lib.override(config_lib.default_config(),
                              {**LSQ, "cluster.trace": str(trace), **over})
    train.train(cfg, dirs[name])
  return dirs


def records(d):
  with open(os.path.join(d, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def failures_begun(seed, worker, mtbf_h, repair_s, steps, shape=1.0):
  """numpy transcription of the failure process (docs/clock.md, "Failures at a rate"): the
  failures of ``worker`` whose first step is below ``steps``."""
  rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3, worker)))
  scale, drawn, count = 3600.0 * mtbf_h / math.gamma(1 + 1 / shape), 0, 0
  while True:
    start = math.floor(drawn + scale * rng.weibull(shape) / S0)
    length = max(1, math.ceil(rng.exponential(repair_s) / S0))
    if start >= steps:
      return count
    count, drawn = count + 1, start + length


def episodes_begun(seed, worker, rate_h, median_s, sigma, factor, steps):
  """numpy transcription of the fail-slow episodes (docs/clock.md, "Compute over time"):
  the episodes of ``worker`` whose first slow step is below ``steps``."""
  rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, worker)))
  drawn, count = 0.0, 0
  while True:
    gap = rng.exponential(3600.0 / rate_h)
    length = median_s * math.exp(sigma * rng.standard_normal())
    first = math.floor((drawn + gap) / S0)
    if first >= steps:
      return count
    count, drawn = count + 1, (first + max(1, math.ceil(length / (factor * S0)))) * S0


def test_the_fault_counts_runs_record(fleet_runs):
  """``failures`` and ``episodes`` in the records: the schedule's closed form on the lockstep
  clock (worker 1 from step 3; worker 2 from step 20, begun once step 20 is taken, after the
  evaluation at 20 steps); the rate's and the episodes' numpy
  transcriptions; a restart per failure's step; on the event clock a failure counts once its
  start, 3 x 8 ms, is before the clock's time."""
  recs = records(fleet_runs["sched"])
  assert [r["step"] for r in recs] == [0, 10, 20, 30, 40]
  assert [r["failures"] for r in recs] == [0, 1, 1, 2, 2] and "episodes" not in recs[-1]
  c = config_lib.default_config().cluster
  for r in records(fleet_runs["rate"]):
    assert r["failures"] == sum(failures_begun(c.seed, i, RATE["cluster.failure_mtbf"],
                                               RATE["cluster.failure_repair"], r["step"])
                                for i in range(4))
    assert r["episodes"] == sum(episodes_begun(
        c.seed, i, RATE["cluster.episode_rate"], RATE["cluster.episode_median"],
        c.episode_sigma, c.episode_factor, r["step"]) for i in range(4))
  last = records(fleet_runs["rate"])[-1]
  assert last["failures"] > 0 and last["episodes"] > 0  # the test sees both processes draw
  assert [(r["failures"], r.get("restarts")) for r in records(fleet_runs["restart"])] == [
      (0, 0.0), (1, 1.0), (1, 1.0), (1, 1.0), (1, 1.0)]
  event = records(fleet_runs["event"])
  assert [r["failures"] for r in event] == [int(r["sim_time"] > 3 * S0) for r in event]
  assert event[-1]["failures"] == 1


@pytest.mark.slow  # its figures take seconds; the fast tier keeps the synthetic report's
def test_the_command_shows_the_fleet(fleet_runs, tmp_path):
  """``python -m nbsgd_jax.report`` (its main, in process) on the fleet runs: report.md holds
  each run's time by cause, ideal time, sim / ideal and fault counts as its records give
  them, and the network, trace and failure settings."""
  out = tmp_path / "out"
  assert report.main([*fleet_runs.values(), "--out", str(out)]) == 0
  md = (out / "report.md").read_text()
  cells = table_cells(md)
  for name, d in fleet_runs.items():
    last, row = records(d)[-1], cells[name]
    for key, title in (("time_compute", "computing"), ("time_comm", "communicating"),
                       ("time_wait", "waiting"), ("time_down", "down"),
                       ("goodput", "goodput")):
      assert row[title] == f"{last[key]:.3f}", (name, key)
    for key in ("failures", "episodes", "restarts"):
      assert row[key] == (f"{last[key]:.0f}" if key in last else "-"), (name, key)
    if "sim_time_ideal" in last:
      assert row["ideal sim time (s)"] == f"{last['sim_time_ideal']:.4g}"
      assert row["sim / ideal"] == f"{last['sim_time'] / last['sim_time_ideal']:.3g}"
    else:  # the event clock has no counterfactual
      assert row["ideal sim time (s)"] == "-" == row["sim / ideal"]
  shared = shared_table(md)
  assert shared["cluster.levels"] == json.dumps(LEVELS, separators=(",", ":"))
  assert shared["cluster.trace"].endswith("slow.csv")
  assert "MTBF 0.0005 h" in cells["rate"]["algorithm"]  # failures differ: named per run
  runs = [report.load_run(d) for d in fleet_runs.values()]
  labels = dict(zip(fleet_runs, report._labels(runs, report.differing_keys(runs))))
  assert "episodes (40000/h, median 0.02 s, x1.5)" in labels["rate"]
  assert "no episodes" in labels["sched"]
  assert (out / "time_by_cause.png").read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------ the guide's field table

# Documented fields the fleet runs above do not write, with what writes them.
OTHER_FIELDS = {
    "test_loss": "a labelled dataset (MNIST, CIFAR)", "test_accuracy": "a labelled dataset",
    "worker_test_accuracy": "eval_worker_accuracy on a labelled dataset",
    "consensus_distance_layers": "consensus.per_layer", "extra_gossip_steps": "consensus.control",
    "pushes": "async_diloco", "global_updates": "halos",
}


def guide_fields():
  """The field names of docs/guide.md's table of metric fields, and the names the
  ``summary.json`` row of its outputs table gives."""
  lines = open(GUIDE).read().splitlines()
  start = lines.index("Fields of `metrics.jsonl`:")
  fields = set()
  for line in lines[start + 4:]:
    if not line.startswith("|"):
      break
    fields |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
  summary = next(l for l in lines if l.startswith("| `summary.json` |"))
  return fields, set(re.findall(r"`([a-z_]+)`", summary))


def test_the_guide_lists_every_field_the_records_carry(fleet_runs):
  """Every field of the runs' metrics.jsonl is in the guide's table, every field of the
  table is written by them or named in OTHER_FIELDS (with what writes it), and every key of
  their summary.json is a metric field or a fact the outputs table names."""
  fields, facts = guide_fields()
  written = set()
  for d in fleet_runs.values():
    for r in records(d):
      written |= set(r)
  assert written - fields == set(), "fields missing from docs/guide.md's table"
  assert fields - written - set(OTHER_FIELDS) == set(), "documented fields no run writes"
  assert written & set(OTHER_FIELDS) == set(), "written by the runs: drop from OTHER_FIELDS"
  for d in fleet_runs.values():
    with open(os.path.join(d, "summary.json")) as f:
      assert set(json.load(f)) - fields - facts == set(), d
