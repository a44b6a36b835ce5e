"""Nothing lost on a damaged disk or a second process: each fault is made for real (files cut
short, folders removed, records deleted or torn, two processes on one workdir) and the run
either goes on with one ``warning:`` line and the records of an uninterrupted run, or stops
with one ``error:`` line and nothing cut (docs/guide.md, "What survives what")."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax import train
from nbsgd_jax.run import records as records_lib

from tests.helpers import ROOT, Crash  # the hook's exception that stops a run mid-way
from tests.helpers import read_records, run_python, small_cfg, without_wall, write_config_file

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

CKPT = checkpoint_lib.CHECKPOINT_DIR


RUN = {"num_steps": 24, "eval_every": 4, "checkpoint_every": 8, "algorithm": "dpsgd"}


def _cfg(**kw):
  return small_cfg(**{**RUN, **kw})


def _lines(path):
  with open(path) as f:
    return f.read().splitlines(keepends=True)


def _without_wall(path):
  return without_wall(read_records(path))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """``(uninterrupted workdir, crashed workdir)``: the crashed run stopped at step 17, after
  its checkpoints of steps 8 and 16 and its evaluation of step 16."""
  root = tmp_path_factory.mktemp("faults")
  train.train(_cfg(), str(root / "full"))

  def crash(step, state, setup):
    del state, setup
    if step == 17:
      raise Crash()

  with pytest.raises(Crash):
    train.train(_cfg(), str(root / "crashed"), hooks=(crash,))
  assert sorted(os.listdir(root / "crashed" / CKPT)) == ["16", "8"]
  return root / "full", root / "crashed"


def _copy(runs, tmp_path):
  wd = tmp_path / "run"
  shutil.copytree(runs[1], wd)
  return wd


def _resume(wd):
  seen = []
  train.train(_cfg(), str(wd), hooks=(lambda step, state, setup: seen.append(step),))
  return seen[0]


def _cut_files(folder):
  """Every file under ``folder`` cut to half its length (a disk that lost their ends)."""
  for here, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(here, name)
      size = os.path.getsize(path)
      with open(path, "r+b") as f:
        f.truncate(size // 2)


DAMAGE = {
    "files_cut_short": lambda ckpt: _cut_files(ckpt),
    "state_removed": lambda ckpt: shutil.rmtree(ckpt / "state"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(runs, tmp_path, capsys,
                                                                  damage):
  wd = _copy(runs, tmp_path)
  DAMAGE[damage](wd / CKPT / "16")
  assert _resume(wd) == 8
  err = capsys.readouterr().err
  warnings = [l for l in err.splitlines() if l.startswith("warning: the checkpoint of step 16")]
  assert len(warnings) == 1 and str(wd / CKPT / "16") in warnings[0], err
  assert "Traceback" not in err
  assert (wd / checkpoint_lib.DAMAGED_DIR / "16").is_dir()  # moved aside, not deleted
  assert _without_wall(wd / "metrics.jsonl") == _without_wall(runs[0] / "metrics.jsonl")


def test_no_readable_checkpoint_is_one_error_line_and_nothing_is_cut(runs, tmp_path):
  """From the command line: ``error:``, exit status 2, no traceback, the records untouched."""
  wd = _copy(runs, tmp_path)
  for step in ("8", "16"):
    shutil.rmtree(wd / CKPT / step / "state")
  before = (wd / "metrics.jsonl").read_bytes()
  config_file = tmp_path / "same_config.py"  # the run's own config, for the command line
  write_config_file(config_file, f"helpers.small_cfg(**{RUN!r})")
  out = run_python(["-m", "nbsgd_jax.main", f"--config={config_file}", f"--workdir={wd}"],
                   env={"JAX_PLATFORMS": "cpu"})
  assert out.returncode == 2, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "no checkpoint in" in errors[0], out.stderr[-3000:]
  assert "Traceback" not in out.stderr
  assert (wd / "metrics.jsonl").read_bytes() == before


def _cut_mid_line(path):
  """``path`` cut in the middle of its third line (records of steps 0 and 4 kept)."""
  lines = _lines(path)
  with open(path, "w") as f:
    f.write(lines[0] + lines[1] + lines[2][:len(lines[2]) // 2])


RECORD_DAMAGE = {
    "cut_mid_line": _cut_mid_line,
    "deleted": os.remove,
    "torn_last_line": lambda path: open(path, "a").write('{"step": 20, "train_lo'),
    "line_changed": lambda path: path.write_text(path.read_text().replace('"step": 4,',
                                                                          '"step": 5,')),
}


@pytest.mark.parametrize("damage", sorted(RECORD_DAMAGE))
def test_records_heal_from_the_checkpoint(runs, tmp_path, capsys, damage):
  """Byte for byte: the records up to the checkpoint are the crashed run's own lines (wall
  times included); the rest equal an uninterrupted run's (wall times aside)."""
  wd = _copy(runs, tmp_path)
  path = wd / "metrics.jsonl"
  kept = [l for l in _lines(path) if json.loads(l)["step"] <= 16]
  RECORD_DAMAGE[damage](path)
  assert _resume(wd) == 16
  err = capsys.readouterr().err
  assert any(l.startswith(f"warning: {path}") and "restored from the checkpoint" in l
             for l in err.splitlines()), err
  got = _lines(path)
  assert got[:len(kept)] == kept
  assert _without_wall(path) == _without_wall(runs[0] / "metrics.jsonl")


def test_an_undamaged_resume_warns_nothing(runs, tmp_path, capsys):
  wd = _copy(runs, tmp_path)
  assert _resume(wd) == 16
  assert "warning:" not in capsys.readouterr().err


HOLDER = textwrap.dedent("""
    import sys, time
    from nbsgd_jax.core import files
    handle = files.lock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_second_process_gets_one_error_line_naming_the_holder(tmp_path):
  wd = tmp_path / "run"
  wd.mkdir()
  holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(wd / records_lib.LOCK_FILE)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(config_lib.ConfigError, match=f"is in use by process {holder.pid}"):
      train.train(_cfg(num_steps=4), str(wd))
    assert os.listdir(wd) == [records_lib.LOCK_FILE]  # nothing written
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  train.train(_cfg(num_steps=4), str(wd))  # the OS released the dead holder's lock
  assert (wd / "summary.json").exists()


def test_the_lock_is_per_open_file_and_released_on_close(tmp_path):
  path = str(tmp_path / "lock")
  first = files_lib.lock(path)
  with pytest.raises(files_lib.Locked) as e:
    files_lib.lock(path)
  assert e.value.holder == os.getpid()
  first.close()
  files_lib.lock(path).close()


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.long  # 24 s, two whole runs; the lock itself: test_a_second_process_gets_one_...
def test_two_runs_started_together_leave_one_run_s_records(tmp_path):
  """Two command-line runs of one config in one workdir at once: one trains, the other
  stops with the lock's ``error:`` line (or, started after the first ended, finds the run
  finished); the records are one whole run's."""
  wd = tmp_path / "run"
  flags = ["--config.model=mlp", "--config.num_workers=4",
           "--config.batch_size=8", "--config.num_steps=300", "--config.eval_every=20",
           "--config.checkpoint_every=100", "--config.eval_train_examples=64",
           "--config.progress=False", "--config.algorithm=dpsgd"]
  cmd = [sys.executable, "-m", "nbsgd_jax.main", "--config=experiments/configs/mnist.py",
         f"--workdir={wd}", *flags]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outs = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
  for _, err in outs:
    assert "Traceback" not in err, err[-3000:]
  locked = [err for code, err in outs if code == 2 and "is in use by process" in err]
  finished = [err for code, err in outs if code == 0 and "nothing to train" in err]
  assert len(locked) + len(finished) == 1, outs
  assert sorted(code for code, _ in outs) == ([0, 2] if locked else [0, 0])
  steps = [json.loads(l)["step"] for l in _lines(wd / "metrics.jsonl")]
  assert steps == list(range(0, 301, 20))
