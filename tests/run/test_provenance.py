"""Every record says what produced it (issue 71, item 3; ``nbsgd_jax/core/provenance.py``):
the package's version and git commit (with a dirty flag), the JAX, jaxlib, flax and optax
versions, the machine and the command, in a run's ``config.json`` and ``summary.json`` and
in the report; a resume by another commit is the same run (provenance is not config), and
outside a git checkout the commit is None, never an error."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import types

import jax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import report, train
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.run import records

from tests.helpers import ROOT, load_script

HAS_GIT = shutil.which("git") is not None
OTHER = {"version": "0.0.9", "commit": "0123456789abcdef" * 2 + "01234567", "dirty": True,
         "jax": "0.4.1", "jaxlib": "0.4.1", "flax": "0.8.0", "optax": "0.1.9",
         "python": "3.10.0", "platform": "Linux-x", "device": None, "command": "python x.py"}


def _fresh_commits(monkeypatch):
  """Forget the commits read so far (they are cached per process)."""
  monkeypatch.setattr(provenance_lib, "_COMMITS", {})


def _git(repo, *args):
  return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                         "-c", "commit.gpgsign=false", *args], check=True,
                        capture_output=True, text=True).stdout.strip()


def _tiny(**over):
  """A two-step least-squares run (about a second); ``over`` sets any key."""
  return config_lib.override(config_lib.default_config(), {
      "dataset": "least_squares", "problem.shards": 2, "problem.examples_per_worker": 8,
      "problem.dim": 4, "num_workers": 2, "batch_size": 8, "num_steps": 2, "eval_every": 2,
      "algorithm": "allreduce", "progress": False, **over})


def test_the_fields_and_their_types():
  jax.devices()  # JAX started: the device is known
  p = provenance_lib.provenance()
  assert list(p) == ["version", "commit", "dirty", "jax", "jaxlib", "flax", "optax", "python",
                     "platform", "device", "command"]
  assert p["version"] == importlib.metadata.version("nbsgd_jax")
  import flax
  import jaxlib
  import optax
  assert (p["jax"], p["jaxlib"], p["flax"], p["optax"]) == (
      jax.__version__, jaxlib.__version__, flax.__version__, optax.__version__)
  assert p["python"] == "{}.{}.{}".format(*sys.version_info[:3])
  assert isinstance(p["platform"], str) and p["platform"]
  assert p["device"] == {"kind": jax.devices()[0].device_kind,
                         "platform": jax.devices()[0].platform, "count": jax.device_count()}
  assert isinstance(p["command"], str) and p["command"].startswith("python")
  if HAS_GIT and os.path.exists(os.path.join(ROOT, ".git")):  # a checkout: its HEAD
    assert p["commit"] == _git(ROOT, "log", "-1", "--format=%H")
    assert isinstance(p["dirty"], bool)
  json.dumps(p)  # a record's field


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_the_commit_and_the_dirty_flag_of_a_checkout(tmp_path, monkeypatch):
  """In a checkout of its own: the commit made, dirty only when a tracked file changed
  (read at each call), the commit read once per process; a package inside another
  checkout (an installed copy in a virtual environment) has none."""
  _git(tmp_path, "init", "-q")
  (tmp_path / "a.py").write_text("x = 1\n")
  _git(tmp_path, "add", "a.py")
  _git(tmp_path, "commit", "-q", "-m", "one")
  head = _git(tmp_path, "rev-parse", "HEAD")
  _fresh_commits(monkeypatch)
  monkeypatch.setattr(provenance_lib, "ROOT", str(tmp_path))
  p = provenance_lib.provenance()
  assert (p["commit"], p["dirty"]) == (head, False)
  (tmp_path / "new.py").write_text("")  # untracked: not dirty
  assert provenance_lib.provenance()["dirty"] is False
  (tmp_path / "a.py").write_text("x = 2\n")
  assert provenance_lib.provenance()["dirty"] is True
  _git(tmp_path, "commit", "-q", "-am", "two")
  assert provenance_lib.provenance()["commit"] == head  # cached: HEAD read once
  assert provenance_lib.provenance()["dirty"] is False
  (tmp_path / "sub").mkdir()
  monkeypatch.setattr(provenance_lib, "ROOT", str(tmp_path / "sub"))
  assert provenance_lib.provenance()["commit"] is None


@pytest.mark.parametrize("how", ["not a checkout", "no git"])
def test_outside_a_checkout_the_commit_is_none(tmp_path, monkeypatch, how):
  _fresh_commits(monkeypatch)
  if how == "no git":
    monkeypatch.setattr(provenance_lib, "GIT", str(tmp_path / "no-such-git"))
  else:
    monkeypatch.setattr(provenance_lib, "ROOT", str(tmp_path))
  p = provenance_lib.provenance()
  assert (p["commit"], p["dirty"]) == (None, None)
  assert p["version"] and p["jax"] == jax.__version__  # the rest as always
  assert provenance_lib.short(p) == "-"


def test_the_command_line_is_relative_to_the_repository(monkeypatch):
  root = provenance_lib.ROOT
  argv = [os.path.join(root, "experiments", "x.py"), "--out", os.path.join(root, "docs", "x"),
          f"--data={os.path.dirname(root)}/shared/d", "a b"]
  monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
  assert provenance_lib.command_line(argv) == (
      "python experiments/x.py --out docs/x --data=../shared/d 'a b'")
  spec = types.SimpleNamespace(name="nbsgd_jax.report.__main__")
  monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=spec))
  assert provenance_lib.command_line(argv[:1] + ["runs/a"]) == "python -m nbsgd_jax.report runs/a"
  assert provenance_lib.provenance("python y.py")["command"] == "python y.py"


def test_a_runs_records_carry_it_and_a_resume_by_another_commit_is_the_same_run(tmp_path):
  """config.json and summary.json hold this process's provenance; a run whose config.json
  holds another commit's resumes (not refused as another run), keeps the provenance of the
  process that started it in config.json, and its summary.json holds the one that finished
  it; another learning rate is still another run."""
  wd = tmp_path / "run"
  cfg = _tiny(checkpoint_every=1, eval_every=1)

  def crash(step, state, setup):
    if step == 1:  # after step 1's checkpoint: the resume trains step 2
      raise RuntimeError("killed")

  with pytest.raises(RuntimeError, match="killed"):
    train.train(cfg, str(wd), hooks=(crash,))
  now = provenance_lib.provenance()
  stored = json.loads((wd / "config.json").read_text())
  mine = provenance_lib.of(stored)
  assert {k: mine[k] for k in ("version", "commit", "jax", "device")} == {
      k: now[k] for k in ("version", "commit", "jax", "device")}
  assert provenance_lib.config_of(stored) == json.loads(cfg.to_json_best_effort())
  stored["provenance"] = OTHER  # started by another commit and versions
  (wd / "config.json").write_text(json.dumps(stored))
  assert records.check_workdir(cfg, str(wd)) is None  # resumable
  with pytest.raises(config_lib.ConfigError, match="holds a run with learning_rate"):
    records.check_workdir(_tiny(checkpoint_every=1, eval_every=1, learning_rate=0.5), str(wd))
  summary = train.train(cfg, str(wd))
  assert summary["step"] == 2 and "finished_before" not in summary
  assert provenance_lib.of(json.loads((wd / "config.json").read_text())) == OTHER
  finished = provenance_lib.of(json.loads((wd / "summary.json").read_text()))
  assert (finished["commit"], finished["jax"]) == (now["commit"], now["jax"])
  loaded = report.load_run(str(wd))  # the report loads it as a config, provenance apart
  assert "provenance" not in loaded.config and not any(
      k.startswith("provenance") for k in loaded.flat_config)
  assert loaded.provenance == finished
  assert records.check_workdir(cfg, str(wd))["step"] == 2  # finished: this run, not another


def _run_dir(base, name, prov, lr=0.1):
  """A finished run directory as train() writes it, with provenance ``prov`` (None: a run
  recorded before provenance existed)."""
  d = base / name
  d.mkdir()
  cfg = json.loads(config_lib.override(config_lib.default_config(), {
      "algorithm": "allreduce", "learning_rate": lr}).to_json_best_effort())
  rec = {"step": 5, "sim_time": 1.0, "wall_time": 2.0, "train_loss": 0.5, "bytes_sent": 10.0}
  extra = {} if prov is None else {"provenance": prov}
  (d / "config.json").write_text(json.dumps({**cfg, **extra}))
  (d / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
  (d / "summary.json").write_text(json.dumps({**rec, **extra}))
  return str(d)


def _shared_and_cells(md):
  """``({setting: value} of the shared-settings table, {run: {column: cell}} of the table)``
  of report.md."""
  lines = md.splitlines()
  shared = {}
  for line in lines[lines.index("| setting | value |") + 2:]:
    if not line.startswith("|"):
      break
    key, value = [c.strip() for c in line.strip("|").split("|")]
    shared[key] = value
  head = next(i for i, l in enumerate(lines) if l.startswith("| run |"))
  cols = [c.strip() for c in lines[head].strip("|").split("|")]
  cells = {}
  for line in lines[head + 2:]:
    if not line.startswith("|"):
      break
    row = [c.strip() for c in line.strip("|").split("|")]
    cells[row[0]] = dict(zip(cols, row))
  return shared, cells


def test_the_report_shows_the_commit_and_jax(tmp_path, monkeypatch):
  """The same commit and JAX in every run: shared settings; a run recorded before
  provenance existed: a column, '-' for it."""
  monkeypatch.setattr(report, "plot_loss_accuracy", lambda *a, **k: None)  # not under test
  clean = {**OTHER, "dirty": False, "commit": "fedcba9876" + "0" * 30}
  a = _run_dir(tmp_path, "a", OTHER)
  b = _run_dir(tmp_path, "b", OTHER, lr=0.2)
  old = _run_dir(tmp_path, "old", None, lr=0.3)
  c = _run_dir(tmp_path, "c", {**clean, "jax": OTHER["jax"]}, lr=0.4)
  report.build_report([a, b], str(tmp_path / "o1"))
  shared, cells = _shared_and_cells((tmp_path / "o1" / "report.md").read_text())
  assert shared["commit"] == "0123456789+dirty" and shared["jax"] == "0.4.1"
  assert "commit" not in cells["a"] and "jax" not in cells["a"]
  result = report.build_report([a, old, c], str(tmp_path / "o2"))
  shared, cells = _shared_and_cells((tmp_path / "o2" / "report.md").read_text())
  assert "commit" not in shared and "jax" not in shared
  assert [cells[r]["commit"] for r in ("a", "old", "c")] == [
      "0123456789+dirty", "-", "fedcba9876"]
  assert [cells[r]["jax"] for r in ("a", "old", "c")] == ["0.4.1", "-", "0.4.1"]
  assert [r["provenance"] for r in result["rows"]] == [OTHER, None, clean]
  md = (tmp_path / "o2" / "report.md").read_text()
  assert "provenance" not in md and "0.8.0" not in md  # not config: no label, no setting


def test_a_studys_results_json_carries_it(tmp_path):
  """experiments/common.py's writer: ``results.json`` holds this process's provenance; one
  the results carried from an earlier write by another commit joins ``provenance_earlier``,
  one that differs only in its command does not."""
  common = load_script("common")
  path = str(tmp_path / "results.json")
  common.write_results_json(path, {"runs": [1, 2]})
  first = json.loads((tmp_path / "results.json").read_text())
  now = provenance_lib.provenance()
  assert first["runs"] == [1, 2] and "provenance_earlier" not in first
  assert {k: first["provenance"][k] for k in ("version", "commit", "jax", "optax")} == {
      k: now[k] for k in ("version", "commit", "jax", "optax")}
  again = json.loads(common.results_json({**first, "provenance": {
      **first["provenance"], "command": "python other.py"}}))
  assert "provenance_earlier" not in again
  merged = json.loads(common.results_json({**first, "provenance": OTHER}))
  assert merged["provenance_earlier"] == [OTHER] and merged["runs"] == [1, 2]
  assert json.loads(common.results_json(merged))["provenance_earlier"] == [OTHER]
