"""backend="multihost": 2 processes x 2 host devices on loopback (gloo) give the losses of the
single-process mesh run of the same config, resume from their checkpoints, and the launcher
stops every process when one fails."""

import os
import shutil
import sys
import textwrap

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import launch
from nbsgd_jax.core import multihost
from nbsgd_jax import train

from tests.helpers import launch_processes, read_records, small_cfg, write_config_file

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


# 8 workers on 2 x 2 devices: 2 workers per device (vmap inside shard_map), ring gossip
# crossing device and process boundaries; random straggler delays and non-blocking counts
OVERRIDES = {"algorithm": "dpsgd", "num_workers": 8, "topology": "ring", "num_steps": 12,
             "eval_every": 4, "nonblocking.enabled": True, "nonblocking.num_minibatches": 2,
             "cluster.scenario": "lognormal", "cluster.delay": "bernoulli_exponential",
             "cluster.delay_prob": 0.3, "cluster.delay_mean": 0.01,
             # consensus control: per-step host reads of the device's decisions, steps.jsonl
             "consensus.control": True, "consensus.target": 0.02,
             "consensus.max_gossip_steps": 2}


def _records(workdir, name="metrics.jsonl"):
  return read_records(os.path.join(workdir, name))


def _launch(tmp_path, workdir, extra=()):
  cfg_file = write_config_file(tmp_path / "mh_config.py",
                               f"helpers.small_cfg(**{OVERRIDES!r}, checkpoint_every=4)")
  return launch_processes(cfg_file, workdir, *extra, devices_per_process=2,
                          launcher_timeout=400, timeout=450)


def _same(a, b, keys=("train_loss", "test_loss", "test_accuracy", "consensus_distance",
                      "bytes_sent", "sim_time", "train_batch_loss")):
  assert [r["step"] for r in a] == [r["step"] for r in b]
  for ra, rb in zip(a, b):
    for k in keys:
      if ra.get(k) is None:
        assert rb.get(k) is None, k
        continue
      np.testing.assert_allclose(ra[k], rb[k], rtol=2e-5, atol=1e-6, err_msg=f"{k} step "
                                 f"{ra['step']}")


def test_two_processes_match_single_process_mesh_and_resume(tmp_path):
  workdir = tmp_path / "mh"
  r = _launch(tmp_path, workdir)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "[p0] | backend | multihost |" in r.stdout  # process 0 reports
  assert "[p1] | metric |" not in r.stdout  # and only process 0
  multi = _records(workdir)

  # the single-process mesh run of the same config (4 of this process's 8 host devices)
  ref_dir = tmp_path / "ref"
  ref = train.train(small_cfg(**OVERRIDES, backend="mesh", workers_per_device=2),
                    str(ref_dir))["history"]
  _same(ref, multi)
  _same(_records(ref_dir, "steps.jsonl"), _records(workdir, "steps.jsonl"),
        ("train_batch_loss", "consensus_distance", "measured_consensus_distance",
         "gossip_steps", "target"))
  assert any(r["gossip_steps"] > 0 for r in _records(workdir, "steps.jsonl"))

  # resume: killed after the checkpoint of step 8 (the one of the last step, 12, removed);
  # started again, both processes restore it and the run ends with the same records
  shutil.rmtree(workdir / "checkpoints" / "12")
  os.remove(workdir / "summary.json")
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 13, "torn')  # a torn line, as from a kill during a write
  r = _launch(tmp_path, workdir)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "[p0] resuming from the checkpoint of step 8" in r.stdout
  _same(multi, _records(workdir))
  assert (workdir / "summary.json").exists()


def test_launcher_stops_everyone_when_one_process_fails(tmp_path):
  """A user whose process 1 fails gets its status back and no process left behind, without
  waiting for the others. Event-based: process 0 writes its pid and then never ends on its
  own; process 1 fails once that pid is written (a barrier). A launcher that waited for
  process 0 would return 124 at its timeout, not 7; process 0 must be gone afterwards."""
  pid_file = tmp_path / "p0.pid"
  prog = [sys.executable, "-c", textwrap.dedent(f"""
      import os, sys, time
      pid_file = {str(pid_file)!r}
      if os.environ['JAX_PROCESS_ID'] == '1':
        while not os.path.exists(pid_file):
          time.sleep(0.01)
        sys.exit(7)
      with open(pid_file + '.tmp', 'w') as f:
        f.write(str(os.getpid()))
      os.replace(pid_file + '.tmp', pid_file)
      time.sleep(3600)
      """)]
  status = launch.launch(2, 1, [], program=prog, timeout=300)
  assert status == 7
  with pytest.raises(ProcessLookupError):  # stopped and reaped by the launcher
    os.kill(int(pid_file.read_text()), 0)


def test_launcher_environment_and_arguments():
  env = launch.process_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"},
                           1, 3, 4, "127.0.0.1:1234")
  assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=4"
  assert (env["JAX_COORDINATOR_ADDRESS"], env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == (
      "127.0.0.1:1234", "3", "1")
  assert launch.main_args(["--workdir=x"]) == ["--workdir=x", "--config.backend=multihost"]
  assert launch.main_args(["--config.backend=multihost"]) == ["--config.backend=multihost"]
  with pytest.raises(ValueError, match="--config.backend=mesh is not allowed"):
    launch.main_args(["--config.backend=mesh"])
  with pytest.raises(ValueError, match="num_processes=0"):
    launch.launch(0, 1, ["--workdir=x"])
  with pytest.raises(SystemExit) as e:
    launch.main(["--num_processes=2"])  # no main arguments after --
  assert e.value.code == 2


def test_coordinates_from_arguments_and_environment(monkeypatch):
  for k in (multihost.ENV_ADDRESS, multihost.ENV_NUM_PROCESSES, multihost.ENV_PROCESS_ID):
    monkeypatch.delenv(k, raising=False)
  assert multihost.coordinates() == (None, None, None)
  assert not multihost.initialize()  # JAX already runs in this process: a single process
  monkeypatch.setenv(multihost.ENV_ADDRESS, "10.0.0.1:1234")
  monkeypatch.setenv(multihost.ENV_NUM_PROCESSES, "4")
  monkeypatch.setenv(multihost.ENV_PROCESS_ID, "3")
  assert multihost.coordinates() == ("10.0.0.1:1234", 4, 3)
  assert multihost.coordinates("h:1", 2, 0) == ("h:1", 2, 0)  # arguments win
  with pytest.raises(ValueError, match="process_id=4 is not allowed"):
    multihost.coordinates(process_id=4)
  with pytest.raises(ValueError, match="coordinator_address='nohost' is not allowed"):
    multihost.coordinates("nohost")
  monkeypatch.setenv(multihost.ENV_NUM_PROCESSES, "two")
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not allowed"):
    multihost.coordinates()


def test_multihost_single_process_equals_mesh_and_checks_divisibility():
  # without jax.distributed the multihost backend is the mesh over this process's 8 devices
  # (1 worker each), each device's data gathered by its own callback
  a = train.train(small_cfg(algorithm="allreduce_ring", num_workers=8, backend="multihost"))
  b = train.train(small_cfg(algorithm="allreduce_ring", num_workers=8, backend="mesh"))
  _same(b["history"], a["history"])
  with pytest.raises(config_lib.ConfigError, match=r"config.num_workers=12 is not allowed "
                     r"with config.backend='multihost'.*multiple of 8"):
    config_lib.validate(small_cfg(num_workers=12, backend="multihost"))
  with pytest.raises(config_lib.ConfigError, match=r"config.workers_per_device=1 is not "
                     r"allowed with config.backend='multihost'"):
    config_lib.validate(small_cfg(num_workers=16, backend="multihost", workers_per_device=1))


def test_no_coordinates_leave_it_to_jax_cluster_detection(monkeypatch):
  """Under a scheduler (Slurm here) with no coordinates, jax.distributed.initialize is called
  with none, so that JAX's cluster detection supplies them; where it finds no cluster, the
  run is a single process."""
  import jax
  for k in (multihost.ENV_ADDRESS, multihost.ENV_NUM_PROCESSES, multihost.ENV_PROCESS_ID):
    monkeypatch.delenv(k, raising=False)
  calls = []

  def fake(address=None, num_processes=None, process_id=None, *a, **kw):
    calls.append((address, num_processes, process_id))
    if "SLURM_JOB_ID" not in os.environ:
      raise ValueError("coordinator_address should be defined.")

  monkeypatch.setattr(jax.distributed, "initialize", fake)
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  assert not multihost.initialize()
  monkeypatch.setenv("SLURM_JOB_ID", "42")
  assert multihost.initialize()
  assert calls == [(None, None, None), (None, None, None)]
  # given coordinates: a failure is not swallowed
  calls.clear()
  monkeypatch.delenv("SLURM_JOB_ID")
  with pytest.raises(ValueError, match="coordinator_address should be defined"):
    multihost.initialize("10.0.0.1:1234", 2, 0)
  assert calls == [("10.0.0.1:1234", 2, 0)]
