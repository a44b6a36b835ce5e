"""A sweep's report (``nbsgd_jax.report.sweep``, ``python -m nbsgd_jax.report SWEEP_DIR``) on
records written by hand in the format a sweep writes: the statistics against numpy on the
raw arrays, the runs left out, the bands, the refusals and the command line. A real sweep
through the report: ``tests/run/test_sweeps.py``, the command-line test."""

import json
import os

import numpy as np
import pytest

from nbsgd_jax import report
from nbsgd_jax.report import sweep as sweep_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KEYS = ("train_loss", "test_loss", "test_accuracy")
STEPS = (0, 5, 10, 15)


def _write_run(d, table, stopped=None, summary=True, torn=False):
  """A run directory as ``train`` writes it: ``table`` ``{key: [E]}`` per evaluation of
  :data:`STEPS` (as many as it has), plus ``sim_time`` and ``bytes_sent``."""
  os.makedirs(d)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"algorithm": "dpsgd", "seed": 0}, f)
  n = len(table["train_loss"])
  records = [{"step": STEPS[e], "wall_time": 0.1 * e, **{k: table[k][e] for k in table}}
             for e in range(n)]
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
    if torn:
      f.write('{"step": 20, "train_lo')
  if summary:
    with open(os.path.join(d, "summary.json"), "w") as f:
      json.dump({**records[-1], "steps": STEPS[n - 1], "stopped": stopped}, f)


def _table(rng, n=len(STEPS)):
  return {"train_loss": rng.uniform(0.1, 2.0, n), "test_loss": rng.uniform(0.1, 2.0, n),
          "test_accuracy": rng.uniform(0.1, 0.9, n),
          "sim_time": np.cumsum(rng.uniform(0.5, 1.5, n)) - 0.5,
          "bytes_sent": np.arange(n) * 1e6 * rng.uniform(1, 2)}


def _lists(table):
  return {k: [float(x) for x in v] for k, v in table.items()}


@pytest.fixture
def fake(tmp_path):
  """``learning_rate=0.1,0.2;seed=0:3``: 0.1's three seeds finished (seed 2 stopped early by
  its sim-time budget, 3 evaluations); 0.2's seed 0 finished, seed 1 diverged, seed 2 in
  progress (no summary.json, a torn last line). Returns (dir, {run: table})."""
  rng = np.random.default_rng(0)
  runs, tables = [], {}
  for lr in (0.1, 0.2):
    for seed in range(3):
      name = f"learning_rate={lr},seed={seed}"
      runs.append({"name": name, "overrides": {"learning_rate": lr, "seed": seed},
                   "group": 0})
      short = (lr, seed) == (0.1, 2)
      tables[name] = _table(rng, 3 if short else 4)
      _write_run(str(tmp_path / name), _lists(tables[name]),
                 stopped={(0.1, 2): "sim_time", (0.2, 1): "diverged"}.get((lr, seed)),
                 summary=(lr, seed) != (0.2, 2), torn=(lr, seed) == (0.2, 2))
  with open(tmp_path / "sweep.json", "w") as f:
    json.dump({"sweep": "learning_rate=0.1,0.2;seed=0:3", "runs": runs, "groups": 1}, f)
  return tmp_path, tables


def test_the_statistics_are_numpy_s_mean_and_sample_std_over_finished_seeds(fake):
  d, tables = fake
  good, half = sweep_report.cells(str(d))
  assert good.name == "learning_rate=0.1" and half.name == "learning_rate=0.2"
  seeds = [tables[f"learning_rate=0.1,seed={s}"] for s in range(3)]
  for fig, values in [
      ("final_test_accuracy", [t["test_accuracy"][-1] for t in seeds]),
      ("best_test_accuracy", [t["test_accuracy"].max() for t in seeds]),
      ("final_test_loss", [t["test_loss"][-1] for t in seeds]),
      ("min_test_loss", [t["test_loss"].min() for t in seeds]),
      ("final_train_loss", [t["train_loss"][-1] for t in seeds]),
      ("min_train_loss", [t["train_loss"].min() for t in seeds]),
      ("sim_time", [t["sim_time"][-1] for t in seeds]),
      ("mb_sent", [t["bytes_sent"][-1] / 1e6 for t in seeds])]:
    s = good.stats[fig]
    assert s.n == 3
    np.testing.assert_allclose([s.mean, s.std], [np.mean(values), np.std(values, ddof=1)],
                               rtol=1e-12, err_msg=fig)
  # 0.2: one finished seed, its values alone, no std (not a 0)
  only = tables["learning_rate=0.2,seed=0"]
  s = half.stats["best_test_accuracy"]
  assert (s.mean, s.std, s.n) == (pytest.approx(only["test_accuracy"].max()), None, 1)
  assert half.used == ("learning_rate=0.2,seed=0",)
  assert [name for name, _ in half.left_out] == ["learning_rate=0.2,seed=1",
                                                 "learning_rate=0.2,seed=2"]
  assert "diverged" in half.left_out[0][1] and "no summary.json" in half.left_out[1][1]


def test_the_curves_match_the_seeds_on_their_common_steps(fake):
  d, tables = fake
  good, half = sweep_report.cells(str(d))
  seeds = [tables[f"learning_rate=0.1,seed={s}"] for s in range(3)]
  c = good.curves["train_loss"]
  np.testing.assert_array_equal(c.step, STEPS[:3])  # seed 2 stopped after 3 evaluations
  y = np.stack([t["train_loss"][:3] for t in seeds])
  t = np.stack([t["sim_time"][:3] for t in seeds])
  np.testing.assert_allclose(c.mean, y.mean(0), rtol=1e-12)
  np.testing.assert_allclose(c.std, y.std(0, ddof=1), rtol=1e-12)
  np.testing.assert_allclose(c.sim_time, t.mean(0), rtol=1e-12)
  assert half.curves["test_accuracy"].std is None
  assert len(half.curves["test_accuracy"].step) == 4


def test_one_band_per_cell_with_seeds_one_line_per_cell(fake):
  d, _ = fake
  grid = sweep_report.cells(str(d))
  for xkey in ("sim_time", "step"):
    fig = sweep_report.band_figure(grid, xkey, xkey)
    for ax in fig.axes:
      assert len(ax.lines) == 2  # a mean per cell
      assert len(ax.collections) == 1  # a band for the cell of 3 seeds, none for 1 seed


def test_the_report_table_names_the_seeds_and_the_runs_left_out(fake, tmp_path):
  d, tables = fake
  out = tmp_path / "rep"
  result = sweep_report.build(str(d), str(out))
  md = (out / "report.md").read_text()
  rows = {l.split(" | ")[0][2:]: l for l in md.splitlines() if l.startswith("| learning")}
  finals = [tables[f"learning_rate=0.1,seed={s}"]["test_accuracy"][-1] for s in range(3)]
  assert f"| 3 of 3 | {np.mean(finals):.4f} +- {np.std(finals, ddof=1):.4f} |" in \
      rows["learning_rate=0.1"]
  only = tables["learning_rate=0.2,seed=0"]["test_accuracy"][-1]
  assert f"| 1 of 3 (2 left out; no std) | {only:.4f} |" in rows["learning_rate=0.2"]
  assert "+-" not in rows["learning_rate=0.2"]
  assert "- learning_rate=0.2,seed=1: diverged" in md
  assert "- learning_rate=0.2,seed=2: no summary.json (in progress or crashed)" in md
  assert [os.path.basename(p) for p in result["figures"]] == [
      "loss_accuracy_vs_sim_time.png", "loss_accuracy_vs_step.png"]
  for p in result["figures"]:
    assert open(p, "rb").read(8) == PNG_MAGIC
    assert f"]({os.path.basename(p)})" in md


def test_a_grid_of_seeds_alone_is_one_cell(fake):
  d, _ = fake
  runs = [{"name": f"learning_rate=0.1,seed={s}", "overrides": {"seed": s}} for s in range(3)]
  with open(d / "sweep.json", "w") as f:
    json.dump({"sweep": "seed=0:3", "runs": runs, "groups": 1}, f)
  (cell,) = sweep_report.cells(str(d))
  assert cell.name == sweep_report.ALL_RUNS and cell.stats["sim_time"].n == 3


@pytest.mark.parametrize("index,needle", [
    ("{not json", "sweep.json is unreadable"),
    ('{"sweep": "seed=0:2", "runs": []}', "lists no runs"),
    ('{"sweep": null, "runs": [{"name": "run0", "overrides": {}}]}',
     "lists runs trained by train_runs, not a grid"),
])
def test_a_bad_sweep_json_is_refused_with_one_line_and_nothing_written(tmp_path, capsys,
                                                                       index, needle):
  (tmp_path / "sweep.json").write_text(index)
  assert report.main([str(tmp_path)]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
  assert not (tmp_path / "report").exists()
  with pytest.raises(ValueError, match=needle):
    sweep_report.build(str(tmp_path))


def test_the_report_command_dispatches_one_sweep_directory(fake, tmp_path, capsys):
  d, _ = fake
  assert report.main([str(d)]) == 0
  assert (d / "report" / "report.md").read_text().startswith("# Sweep report")
  assert capsys.readouterr().out.startswith(f"wrote {d / 'report' / 'report.md'} (2 cell(s), "
                                            "2 run(s) left out, 2 figure(s))")
  assert report.main([f"{d}/", "--out", str(tmp_path / "o")]) == 0
  assert (tmp_path / "o" / "report.md").exists()
  assert sweep_report.sweep_dir_of([str(d), "--out", str(d / "x")]) == str(d)
  assert sweep_report.sweep_dir_of([str(d), str(d)]) is None  # several: run directories
  assert sweep_report.sweep_dir_of([str(d / "learning_rate=0.1,seed=0"), "--out", "o"]) is None


def _stamp(run_dir, commit, jax="0.4.30", record="summary.json"):
  """Put a provenance (``commit``: 40 hex digits) into the run's ``record``, as ``train``
  writes it (:mod:`nbsgd_jax.core.provenance`)."""
  path = os.path.join(run_dir, record)
  with open(path) as f:
    stored = json.load(f)
  stored["provenance"] = {"commit": commit, "dirty": False, "jax": jax}
  with open(path, "w") as f:
    json.dump(stored, f)


def test_the_report_says_which_code_made_the_runs(fake, tmp_path):
  d, _ = fake
  a, b = "a" * 40, "b" * 40
  names = [f"learning_rate={lr},seed={s}" for lr in (0.1, 0.2) for s in range(3)]

  def line():
    md = open(sweep_report.build(str(d), str(tmp_path / "rep"))["report"]).read()
    paragraphs = md.split("\n\n")
    assert paragraphs[1].startswith("Sweep `") and paragraphs[3].startswith("| cell |")
    return paragraphs[2]  # the line after the header paragraph

  # one commit: summary.json's (the process that finished the run) over config.json's (the
  # one that started it); config.json's for the run in progress (no summary.json)
  for name in names:
    _stamp(str(d / name), b if name == names[0] else a, record="config.json")
    if os.path.exists(d / name / "summary.json"):
      _stamp(str(d / name), a)
  assert line() == "Provenance: the runs were made by commit aaaaaaaaaa (jax 0.4.30) (6 runs)"
  # two commits and two jax versions: mixed, each with its count, most runs first
  _stamp(str(d / names[1]), b)
  _stamp(str(d / names[2]), a, jax="0.5.0")
  assert line() == ("Provenance: mixed: the runs were made by different code: commit "
                    "aaaaaaaaaa (jax 0.4.30) (4 runs); commit bbbbbbbbbb (jax 0.4.30) (1 run); "
                    "commit aaaaaaaaaa (jax 0.5.0) (1 run)")
  # a run recorded before provenance existed; a run with no directory is not counted
  _write_run(str(d / "old"), {"train_loss": [1.0]})
  runs = [{"name": n, "overrides": {"learning_rate": 0.1, "seed": s}}
          for s, n in enumerate([names[0], "old", "not started"])]
  (d / "sweep.json").write_text(json.dumps({"sweep": "seed=0:3", "runs": runs}))
  assert line() == ("Provenance: the runs were made by commit aaaaaaaaaa (jax 0.4.30) (1 run); "
                    "no provenance (recorded before it existed) (1 run)")
