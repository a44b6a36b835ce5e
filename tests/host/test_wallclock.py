"""Non-blocking SGD on the wall clock (cluster.clock="wall", backend="multihost"): two
processes with emulated stragglers train with counts that really vary, and a simulate-backend
run fed the recorded counts gives the same losses (the numerics are the same program)."""

import copy
import json
import math

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train
from nbsgd_jax.host import cluster as cl
from nbsgd_jax.host.parts import HostInputs
from nbsgd_jax.run import step as step_lib
from nbsgd_jax.run import wallclock

from tests.helpers import (backend_compiles, launch_processes, make_stepper, small_cfg,
                           write_config_file)

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


# worker 1 is 3x slower; 4 mini-batches of 4 examples at 2 ms each: 8 ms / 24 ms per batch
OVERRIDES = {"algorithm": "allreduce", "num_workers": 2, "num_steps": 10, "eval_every": 5,
             "batch_size": 16, "learning_rate": 0.1, "nonblocking.enabled": True,
             "nonblocking.num_minibatches": 4, "nonblocking.deadline": "adaptive",
             "nonblocking.adaptive_k": 0.0, "cluster.slowdown": (1.0, 3.0),
             "cluster.time_per_example": 2e-3}


def _launch(tmp_path, workdir):
  cfg_file = write_config_file(
      tmp_path / "wall_config.py",
      f"helpers.small_cfg(**{OVERRIDES!r}, **{{'cluster.clock': 'wall'}})")
  return launch_processes(cfg_file, workdir, devices_per_process=1, launcher_timeout=300,
                          timeout=330)


def _replay(counts):
  """Losses of a simulate-backend run whose step t uses ``counts[t]``."""
  stepper = make_stepper(small_cfg(**OVERRIDES))

  def measured(inputs):  # the counts the processes measured on the wall clock
    c = counts[inputs.step]
    inputs.count, inputs.total = np.asarray(c, np.int32), np.int32(sum(c))

  return [float(np.mean(loss)) for _, _, loss, _ in stepper.steps(len(counts), measured)]


def test_two_processes_train_on_the_wall_clock_and_replay_exactly(tmp_path):
  workdir = tmp_path / "wall"
  proc = _launch(tmp_path, workdir)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  steps = [json.loads(line) for line in (workdir / "steps.jsonl").read_text().splitlines()]
  metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in steps] == list(range(1, 11))
  counts = [r["counts"] for r in steps]
  assert counts[0] == [4, 4]  # the first step waits for everybody and measures them
  assert len({c for r in counts for c in r}) > 1  # the counts really vary
  assert any(r[1] < r[0] for r in counts[1:])  # the slow process finishes fewer
  assert all(math.isfinite(r["deadline"]) for r in steps[1:])
  assert all(r["wall_step_s"] > 0 for r in steps)
  assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["sim_time"] > 0 and summary["wall_time"] > 0
  np.testing.assert_allclose(_replay(counts), [r["train_batch_loss"] for r in steps],
                             rtol=1e-5, atol=1e-6)


def test_wall_clock_needs_multihost():
  cfg = small_cfg(**{"cluster.clock": "wall"})
  with pytest.raises(config_lib.ConfigError, match=r"cluster\.clock='wall' is not allowed "
                     r"with config\.backend='simulate'"):
    config_lib.validate(cfg)


def test_a_deadline_no_process_can_meet_is_refused():
  c = cl.make_cluster(2, 4, time_per_example=1e-3, batch_size=16)
  with pytest.raises(ValueError, match=r"nonblocking\.deadline=0\.001 is not allowed: no "
                     r"worker can finish"):
    wallclock.WallWorkload(c, True, 0.001, emulate=True)
  part = wallclock.WallWorkload(c, True, 0.001, emulate=False)  # measured, not modelled
  inputs = HostInputs(3)
  part.inputs(3, inputs, None)
  with pytest.raises(ValueError, match=r"nonblocking\.deadline=0\.001 is not allowed: no "
                     r"process finished a mini-batch by it"):
    part.measured(3, inputs, np.array([[0, 0.002, 0.0], [0, 0.003, 0.0]]), 0.01)
  with pytest.raises(ValueError, match=r"nonblocking\.adaptive_k=-0\.5"):
    wallclock.WallWorkload(c, True, "adaptive", adaptive_k=-0.5)


def test_measured_counts_set_the_next_deadline():
  c = cl.make_cluster(2, 4, time_per_example=1e-3, batch_size=16)
  part = wallclock.WallWorkload(c, True, "fastest", window=2)
  inputs = HostInputs(0)
  part.inputs(0, inputs, None)
  assert inputs.deadline == math.inf
  # worker 0 finished 4 mini-batches at 0.02 s, worker 1 two by 0.03 s (pace 0.06 s for 4)
  part.measured(0, inputs, np.array([[4, 0.02, 0.02], [2, 0.031, 0.03]]), 0.04)
  np.testing.assert_array_equal(inputs.count, [4, 2])
  assert inputs.total == 6 and inputs.wall_step_s == 0.04
  nxt = HostInputs(1)
  part.inputs(1, nxt, None)
  assert nxt.deadline == pytest.approx(0.02)


def test_every_period_end_of_streaming_diloco_has_its_program_on_the_wall_clock():
  """Streaming DiLoCo's period ends are FragmentSync values (fragment, launch, land), one
  compiled update each on the wall clock too (one process, 8 workers)."""
  cfg = small_cfg(algorithm="streaming_diloco", num_workers=8, num_steps=8, eval_every=8,
                  backend="multihost", **{"cluster.clock": "wall", "diloco.local_steps": 4,
                                          "streaming_diloco.fragments": 2,
                                          "streaming_diloco.delay": 1})
  out = train.train(cfg)
  assert out["rounds"] == 4 and out["periods"] == [2, 2, 2, 2]
  assert math.isfinite(out["train_loss"]) and out["bytes_sent"] > 0


def test_a_second_wall_clock_run_with_another_rate_or_seed_compiles_nothing():
  """The wall clock's programs live in the process's program cache with the hyperparameters
  as inputs: a run with another rate and seed compiles nothing, and its seed does draw other
  batches (its losses differ from the first run's)."""
  cfg = small_cfg(num_workers=8, num_steps=4, eval_every=2, backend="multihost",
                  compilation_cache="none", **{"cluster.clock": "wall",
                                               "cluster.emulate": False})
  step_lib.PROGRAMS.clear()
  first = train.train(cfg)
  other = config_lib.override(copy.deepcopy(cfg), {"learning_rate": 0.05, "seed": 3})
  second, names = backend_compiles(lambda: train.train(other))
  assert names == [], names
  assert second["train_loss"] != first["train_loss"]
  step_lib.PROGRAMS.clear()
  cold, names = backend_compiles(lambda: train.train(other))
  assert names  # compiled again once the cache is cleared: the check above can fail
  assert cold["train_loss"] == pytest.approx(second["train_loss"], rel=1e-6)


def test_the_wall_clock_sleeps_each_step_s_modelled_links(tmp_path):
  """``cluster.levels`` on the wall clock (one process, 8 workers, an all-reduce): each step
  also sleeps the ring's time on the modelled network, 14 messages at the outer link's 4 ms
  (nodes of 4 behind it) = 56 ms, and the simulated clock charges the same rounds: every
  measured step is at least that long, and the step object computes exactly that."""
  cfg = small_cfg(algorithm="allreduce", num_workers=8, num_steps=3, eval_every=3,
                  backend="multihost",
                  **{"cluster.clock": "wall", "cluster.levels": ("4:1e-4:1e12",),
                     "cluster.latency": 4e-3, "cluster.bandwidth": 1e12,
                     "consensus.log_every_step": True})
  train.train(cfg, str(tmp_path))
  rows = [json.loads(l) for l in (tmp_path / "steps.jsonl").read_text().splitlines()]
  walls = [r["wall_step_s"] for r in rows if "wall_step_s" in r]
  assert len(walls) == 3 and min(walls) >= 14 * 4e-3
  stepper = make_stepper(cfg)
  step = stepper.program
  inputs = HostInputs(0, count=np.full(8, 4, np.int32))
  report = {"bytes/allreduce": np.zeros(8), "rounds/allreduce": np.ones(8)}
  assert step.link_seconds(0, inputs, report) == pytest.approx(14 * 4e-3, rel=1e-9)
