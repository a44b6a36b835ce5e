"""Checkpoint and resume: a run stopped at any moment and started again ends with exactly the
metrics of an uninterrupted run (wall time aside)."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax import train

from tests.helpers import ROOT
from tests.helpers import (Crash, experiment_config, full_and_crashed, read_records,
                           slow_except, small_cfg, without_wall)

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


CASES = {
    # error-feedback residuals and their PRNG keys in the optimizer state
    "sparse_allreduce": {"algorithm": "allreduce", "compression.name": "random_k",
                         "compression.density": 0.1},
    # the adaptive period planner (host state) and the sync/local programs
    "ada_lupa": {"algorithm": "local_sgd", "local_sgd.schedule": "ada_lupa",
                 "local_sgd.local_steps": 2},
    # simulated clocks with random straggler delays, non-blocking counts, consensus control
    # with the critical target (estimator state)
    "nonblocking_control": {
        "algorithm": "dpsgd", "nonblocking.enabled": True, "nonblocking.num_minibatches": 2,
        "cluster.scenario": "lognormal", "cluster.delay": "bernoulli_exponential",
        "consensus.control": True, "consensus.critical": True,
        "consensus.smoothness_every": 7, "consensus.smoothness_iters": 3},
    # the event clock (host) and the in-flight gradients (device) of asynchronous training
    "ad_psgd_events": {"algorithm": "ad_psgd", "cluster.scenario": "lognormal",
                       "cluster.delay": "bernoulli_exponential", "cluster.delay_prob": 0.2,
                       "cluster.delay_mean": 0.01},
    # the server's replica, its delayed Nesterov buffer and each worker's pull (host)
    "async_diloco_events": {"algorithm": "async_diloco", "cluster.scenario": "lognormal",
                            "diloco.local_steps": 2, "async_diloco.buffer": 2,
                            "async_diloco.staleness_weight": "polynomial"},
}


def _cfg(case, **kw):
  return small_cfg(num_steps=24, eval_every=4, checkpoint_every=8, **CASES[case], **kw)


@pytest.mark.parametrize("case", slow_except(  # the others: test_faults, test_sweeps
    sorted(CASES), fast=(), slow=("ad_psgd_events",)))
def test_crash_and_resume_equals_uninterrupted(tmp_path, case):
  full = train.train(_cfg(case), str(tmp_path / "full"))

  def crash(step, state, setup):
    del state, setup
    if step == 13:  # after the checkpoint of step 8 and the evaluation of step 12
      with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "train_lo')  # a torn line, as a kill mid-write leaves
      raise Crash()

  with pytest.raises(Crash):
    train.train(_cfg(case), str(tmp_path / "run"), hooks=(crash,))
  assert checkpoint_lib.Checkpointer(str(tmp_path / "run")).latest_step() == 8
  seen = []
  resumed = train.train(_cfg(case), str(tmp_path / "run"),
                        hooks=(lambda step, state, setup: seen.append(step),))
  assert seen[0] == 8  # it did resume, from the checkpoint
  a = read_records(tmp_path / "full" / "metrics.jsonl")
  b = read_records(tmp_path / "run" / "metrics.jsonl")
  assert [r["step"] for r in b] == list(range(0, 25, 4))  # no duplicate, no torn line
  assert without_wall(b) == without_wall(a)
  if os.path.exists(tmp_path / "full" / "steps.jsonl"):
    assert (read_records(tmp_path / "run" / "steps.jsonl")
            == read_records(tmp_path / "full" / "steps.jsonl"))
  drop = ("history", "wall_time", "samples_per_second", "run_seconds")
  assert ({k: v for k, v in resumed.items() if k not in drop}
          == {k: v for k, v in full.items() if k not in drop})


def test_a_one_run_checkpoint_of_the_earlier_form_resumes(tmp_path):
  """train() and a sweep's group are one driver now, whose checkpoints hold every run's host
  state (``{"runs": [...], "wall", "members"}``); a checkpoint that train() wrote before
  (``{"host", "wall", "records"}``) still resumes, to the same records as a run never
  stopped."""
  cfg = _cfg("sparse_allreduce")
  full = full_and_crashed(cfg, tmp_path)
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path / "run"))
  state, host = ckpt.restore(8, train.init_state(train.setup(cfg)))
  (run,) = host["runs"]
  ckpt.close()
  shutil.rmtree(tmp_path / "run" / checkpoint_lib.CHECKPOINT_DIR)
  old = checkpoint_lib.Checkpointer(str(tmp_path / "run"))
  old.save(8, state, {"host": run["host"], "wall": host["wall"], "records": run["records"]})
  old.close()
  resumed = train.train(cfg, str(tmp_path / "run"))
  assert (without_wall(read_records(tmp_path / "run" / "metrics.jsonl"))
          == without_wall(read_records(tmp_path / "full" / "metrics.jsonl")))
  assert resumed["test_loss"] == full["test_loss"]


# The command line (nbsgd_jax.main) with a training hook: at step argv[3] it waits for the
# file argv[2] (a committed checkpoint), writes the marker argv[1] and blocks until killed.
_BLOCKING_CLI = textwrap.dedent("""
    import os, sys, time
    from absl import app
    from nbsgd_jax import main, train
    marker, ready, at = sys.argv.pop(1), sys.argv.pop(1), int(sys.argv.pop(1))
    run = train.train

    def block(step, state, setup):
      if step == at:
        while not os.path.exists(ready):
          time.sleep(0.01)
        open(marker, "w").close()
        while True:
          time.sleep(60)

    train.train = lambda cfg, workdir, **kw: run(cfg, workdir, hooks=(block,), **kw)
    app.run(main.main, flags_parser=main._parse_flags)
""")


def _wait_for(path, proc, timeout=600):
  """Waits for ``path`` to exist while ``proc`` runs; fails with its stderr if it exits."""
  import time
  end = time.monotonic() + timeout
  while not path.exists():
    if proc.poll() is not None:
      pytest.fail(f"exited {proc.returncode} before {path.name}: "
                  f"{proc.stderr.read()[-2000:]}")
    if time.monotonic() > end:
      proc.kill()
      pytest.fail(f"no {path.name} after {timeout} s")
    time.sleep(0.05)


@pytest.mark.optimized  # 40 steps in three processes: XLA's optimisations pay here
@pytest.mark.parametrize("algorithm", ["dpsgd"])  # the event clock's resume: ad_psgd_events
def test_sigkill_and_resume_from_the_command_line(tmp_path, algorithm):
  """A real SIGKILL of the CLI mid-run, then the same command again (AD-PSGD: with the event
  clock's events and the in-flight gradients): a user who kills a run gets, from the same
  command, the records of a run never killed. Event-based: the killed process is the CLI with
  a training hook (_BLOCKING_CLI) that, at step 25, waits for step 20's committed checkpoint,
  writes a marker and blocks; the test kills it after the marker, so the kill always lands
  mid-run (steps 21-25 done and recorded past the checkpoint), however fast the machine."""
  overrides = ["--config.model=mlp", "--config.num_workers=4", "--config.batch_size=8",
               "--config.num_steps=40", "--config.eval_every=5", "--config.checkpoint_every=10",
               "--config.eval_train_examples=64", "--config.progress=False",
               f"--config.algorithm={algorithm}", "--config.cluster.scenario=lognormal",
               # device steps (the main job counts gradients per worker: tests/run/test_budget.py)
               "--config.budget_unit=steps"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}

  def cmd(wd):
    return [sys.executable, "-m", "nbsgd_jax.main", "--config=experiments/configs/mnist.py",
            f"--workdir={wd}", *overrides]

  # the uninterrupted reference, in-process (same config as the CLI builds)
  ref = read_records(_cli_reference(tmp_path / "full", overrides) / "metrics.jsonl")
  wd = tmp_path / "run"
  ckpt, marker = wd / "checkpoints" / "20" / "commit_success.txt", tmp_path / "blocked"
  blocking = [sys.executable, "-c", _BLOCKING_CLI, str(marker), str(ckpt), "25", *cmd(wd)[3:]]
  proc = subprocess.Popen(blocking, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
  _wait_for(marker, proc)
  assert ckpt.exists() and len(read_records(wd / "metrics.jsonl")) == 6  # steps 0, 5, .., 25
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  before = read_records(wd / "metrics.jsonl")
  done = subprocess.run(cmd(wd), cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  got = read_records(wd / "metrics.jsonl")
  assert [r["step"] for r in got] == list(range(0, 41, 5))
  assert without_wall(got) == without_wall(ref)
  # the records up to the checkpoint are the first process's (wall times included): resumed
  assert got[:5] == [r for r in before if r["step"] <= 20]


def _cli_reference(wd, overrides):
  from ml_collections import config_flags  # noqa: F401  (the CLI's config file)
  cfg = experiment_config("mnist", "mnist_cfg")
  kv = {}
  for o in overrides:
    k, v = o[len("--config."):].split("=", 1)
    kv[k] = {"True": True, "False": False}.get(v, int(v) if v.isdigit() else v)
  config_lib.override(cfg, kv)
  train.train(cfg, str(wd))
  return wd


def test_resume_refuses_another_config(tmp_path):
  cfg = small_cfg(num_steps=8, eval_every=4, checkpoint_every=4)

  def crash(step, state, setup):
    if step == 6:
      raise Crash()

  with pytest.raises(Crash):
    train.train(cfg, str(tmp_path), hooks=(crash,))
  with pytest.raises(config_lib.ConfigError, match="config.learning_rate=0.5 is not allowed"):
    train.train(small_cfg(num_steps=8, eval_every=4, checkpoint_every=4, learning_rate=0.5),
                str(tmp_path))


def test_truncate_records_drops_later_and_torn_lines(tmp_path):
  p = tmp_path / "m.jsonl"
  p.write_text('{"step": 0}\n{"step": 5}\n{"step": 10}\n{"step": 15, "x"')
  assert checkpoint_lib.truncate_records(str(p), 5) == [{"step": 0}, {"step": 5}]
  assert p.read_text() == '{"step": 0}\n{"step": 5}\n'
  p.write_text('{"step": 0}\n{"step": 5}')  # complete JSON but no newline: torn
  assert checkpoint_lib.truncate_records(str(p), 10) == [{"step": 0}]


def test_divergence_stops_with_step_and_workers_and_keeps_last_good_checkpoint(tmp_path):
  """A NaN injected into worker 2's model after step 9: the next evaluation (step 10) names
  the step and the worker; the checkpoint of step 8 stays the newest."""
  import jax.numpy as jnp

  def poison(step, state, setup):
    del setup
    if step == 9:
      layer = state.params["params"]["Dense_0"]
      layer["kernel"] = layer["kernel"].at[2, 0, 0].set(jnp.nan)  # the host's dict: mutable

  cfg = small_cfg(algorithm="local_sgd", num_steps=16, eval_every=2, checkpoint_every=4,
                  **{"local_sgd.local_steps": 4})
  with pytest.raises(train.TrainingDiverged) as e:
    train.train(cfg, str(tmp_path), hooks=(poison,))
  assert (e.value.step, e.value.workers) in ((10, [2]),), str(e.value)
  assert "non-finite" in str(e.value) and "step 10" in str(e.value)
  assert checkpoint_lib.Checkpointer(str(tmp_path)).latest_step() == 8
  # a huge learning rate: the loss itself becomes non-finite, on every worker
  with pytest.raises(train.TrainingDiverged, match="non-finite loss at step"):
    train.train(small_cfg(algorithm="allreduce", learning_rate=1e30, num_steps=20,
                          eval_every=20), None)


def test_divergence_of_the_averaged_model_writes_no_bad_record(tmp_path):
  """Finite workers whose averaged model's loss overflows (lr 1e8, 2 workers, parallel order:
  train_loss is NaN at step 4 while every step loss and model is still finite): the evaluation stops the
  run instead of writing a NaN record."""
  import math
  cfg = small_cfg(algorithm="dpsgd", learning_rate=1e8, num_steps=12, eval_every=1,
                  num_workers=2, **{"dpsgd.order": "parallel"})
  with pytest.raises(train.TrainingDiverged) as e:
    train.train(cfg, str(tmp_path))
  assert (e.value.step, e.value.what, e.value.workers) == (4, "train_loss", [])
  recs = read_records(tmp_path / "metrics.jsonl")
  assert recs and recs[-1]["step"] < e.value.step
  for r in recs:
    for k in ("train_loss", "test_loss", "train_batch_loss"):
      assert r[k] is None or math.isfinite(r[k]), (k, r)
  err = train.TrainingDiverged(7, [], "test_loss")
  assert "non-finite test_loss at step 7 of the averaged model" in str(err)


def test_refused_config_leaves_the_workdir_alone_and_new_runs_drop_stale_files(tmp_path):
  """A config refused late (a target ratio without its reference run) touches no file; a new
  run in a used workdir removes the old run's summary.json and steps.jsonl first."""
  wd = tmp_path / "run"
  train.train(small_cfg(num_steps=4, eval_every=2, **{"consensus.log_every_step": True}),
              str(wd))
  before = {p: (wd / p).read_bytes() for p in ("config.json", "metrics.jsonl",
                                                "summary.json", "steps.jsonl")}
  bad = small_cfg(num_steps=4, eval_every=2, **{
      "consensus.control": True, "consensus.target_ratio": 0.5,
      "consensus.reference_workdir": str(tmp_path / "missing")})
  with pytest.raises(config_lib.ConfigError, match="reference_workdir"):
    train.train(bad, str(wd))
  assert {p: (wd / p).read_bytes() for p in before} == before
  # another run is refused (nothing touched) unless config.overwrite
  other = small_cfg(learning_rate=1e30, num_steps=4, eval_every=4)
  with pytest.raises(config_lib.ConfigError, match="holds a run with learning_rate=0.05; use "
                     "another workdir, or config.overwrite=True"):
    train.train(other, str(wd))
  assert {p: (wd / p).read_bytes() for p in before} == before
  # with it: a new run without per-step logging, stopped by divergence before its summary
  other.overwrite = True
  with pytest.raises(train.TrainingDiverged):
    train.train(other, str(wd))
  assert not (wd / "summary.json").exists() and not (wd / "steps.jsonl").exists()


def test_a_finished_run_is_not_trained_again(tmp_path):
  """The last step is checkpointed; the same run again returns its summary, trains nothing
  and leaves the records as they were."""
  cfg = small_cfg(num_steps=8, eval_every=4, checkpoint_every=4)
  first = train.train(cfg, str(tmp_path))
  assert checkpoint_lib.Checkpointer(str(tmp_path)).latest_step() == 8
  records = (tmp_path / "metrics.jsonl").read_bytes()
  seen = []
  again = train.train(cfg, str(tmp_path), hooks=(lambda step, state, s: seen.append(step),))
  assert seen == []
  assert (tmp_path / "metrics.jsonl").read_bytes() == records
  assert again["test_accuracy"] == first["test_accuracy"] and again["finished_before"]
  assert "finished_before" not in first
  assert [r["step"] for r in again["history"]] == [0, 4, 8]
  (tmp_path / "summary.json").unlink()  # killed after the last checkpoint, before the summary
  resumed = train.train(cfg, str(tmp_path), hooks=(lambda step, state, s: seen.append(step),))
  assert seen == [8] and resumed["test_accuracy"] == first["test_accuracy"]
  cfg.overwrite = True  # trained again from step 0, the old checkpoints gone
  seen.clear()
  again = train.train(cfg, str(tmp_path), hooks=(lambda step, state, s: seen.append(step),))
  assert seen == list(range(9)) and again["test_accuracy"] == first["test_accuracy"]


def test_ctrl_c_stops_with_one_line_and_whole_records(tmp_path):
  """SIGINT (Ctrl-C) mid-run: exit 130, one ``error:`` line and no traceback; the records
  written so far parse (a user's Ctrl-C leaves readable records and says how to resume).
  Event-based: SIGINT is sent once two whole records are written (a run of 100000 steps is
  still running then by construction), never on a deadline."""
  import time
  wd = tmp_path / "run"
  proc = subprocess.Popen(
      [sys.executable, "-m", "nbsgd_jax.main", "--config=experiments/configs/quickstart.py",
       f"--workdir={wd}", "--config.num_steps=100000", "--config.eval_every=5",
       "--config.progress=False"], cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  metrics, hang = wd / "metrics.jsonl", time.monotonic() + 600  # a guard against a hang only
  while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # two whole lines
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    if time.monotonic() > hang:
      proc.kill()
      pytest.fail("no two records in 600 s")
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err[-2000:]
  assert "Traceback" not in err
  assert [l for l in err.splitlines() if l.startswith("error:")] == [
      f"error: interrupted; {wd} holds the records so far; the same command resumes from the "
      "last checkpoint"]  # the quick start checkpoints every 5th evaluation
  assert len(read_records(wd / "metrics.jsonl")) >= 2

