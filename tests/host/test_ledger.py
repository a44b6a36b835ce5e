"""Where a lockstep run's time went (``nbsgd_jax/host/ledger.py``) against closed forms:
all-reduce on 4 workers, each step computing ``c`` seconds and communicating ``m`` (a ring:
2 (n - 1) messages of ``latency`` each, no bytes to speak of)."""

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train

N, STEPS, B, TPE, LAT = 4, 10, 16, 1e-3, 2e-3
C, M = B * TPE, 2 * (N - 1) * LAT  # a step's compute and all-reduce, s


def _cfg(**over):
  c = config_lib.default_config()
  c.update(dict(num_workers=N, dataset="least_squares", num_steps=STEPS, eval_every=STEPS,
                progress=False, batch_size=B, algorithm="allreduce"))
  c.problem.update(dict(examples_per_worker=16, dim=4, full_batch=True))
  return config_lib.override(c, {"cluster.latency": LAT, "cluster.bandwidth": 1e15,
                                 "cluster.time_per_example": TPE, **over})


def _run(**over):
  return train.train(_cfg(**over), None)


def test_a_homogeneous_run_computes_and_communicates_and_is_its_own_ideal():
  out = _run()
  assert out["sim_time"] == pytest.approx(STEPS * (C + M), rel=1e-6)
  assert out["sim_time_ideal"] == pytest.approx(out["sim_time"], rel=1e-9)
  assert out["time_compute"] == pytest.approx(C / (C + M), rel=1e-6)
  assert out["time_comm"] == pytest.approx(M / (C + M), rel=1e-6)
  assert out["time_wait"] == pytest.approx(0.0, abs=1e-9) and out["time_down"] == 0.0


def test_one_slow_worker_makes_the_others_wait_and_the_ideal_is_without_it():
  """The last worker 4x slower: a step lasts 4c + m; the others compute c and wait 3c."""
  out = _run(**{"cluster.scenario": "one_slow", "cluster.slow_factor": 4.0})
  step = 4 * C + M
  assert out["sim_time"] == pytest.approx(STEPS * step, rel=1e-6)
  assert out["sim_time_ideal"] == pytest.approx(STEPS * (C + M), rel=1e-6)
  assert out["time_compute"] == pytest.approx((3 * C + 4 * C) / N / step, rel=1e-6)
  assert out["time_wait"] == pytest.approx(3 * 3 * C / N / step, rel=1e-6)


def test_a_failed_worker_is_down_for_the_job_s_time_it_missed():
  """Worker 0 down for steps 2-4 (its clock stands still; the others' steps last c + m):
  down = 3 (c + m) of worker 0, a quarter of that in the mean; its catch-up is waiting."""
  out = _run(**{"cluster.failures": "0:2:3"})
  total = STEPS * (C + M)
  assert out["sim_time"] == pytest.approx(total, rel=1e-6)
  assert out["time_down"] == pytest.approx(3 * (C + M) / N / total, rel=1e-6)
  assert out["time_compute"] == pytest.approx((N * STEPS - 3) * C / N / total, rel=1e-6)


@pytest.mark.parametrize("fetch", [False, True])
def test_a_joiner_fetches_the_model_on_its_link_when_asked(fetch):
  """Worker 1 down for steps 2-4 (``cluster.rejoin_fetch``): at step 5 it first receives
  one model (4 float32, 16 bytes) from worker 0, ``latency + 16 / bandwidth`` s after worker
  0's clock, and every worker waits for it at the all-reduce: the run is that much longer
  and the mean bytes per worker 16 / n more; without the knob nothing is charged."""
  base, out = _run(**{"cluster.failures": "1:2:3"}), _run(**{
      "cluster.failures": "1:2:3", "cluster.rejoin_fetch": fetch})
  f = (LAT + 16 / 1e15) if fetch else 0.0
  assert out["sim_time"] - base["sim_time"] == pytest.approx(f, rel=1e-6, abs=1e-12)
  assert out["bytes_sent"] - base["bytes_sent"] == pytest.approx(16 / N if fetch else 0.0)
  assert base["sim_time"] == pytest.approx(STEPS * (C + M), rel=1e-6)


def test_a_failure_under_the_restart_policy_costs_the_steps_since_the_checkpoint():
  """Checkpoints every 4 steps (after steps 3, 7); worker 1 fails at step 6: the job computes
  steps 4-6 again and pays 1 s to restart, nobody drops out (the bytes of a run without
  failures), and the lost time is down time for every worker."""
  plain = _run()
  out = _run(**{"cluster.failures": "1:6:2", "cluster.failure_policy": "restart",
                "cluster.restart_every": 4, "cluster.restart_seconds": 1.0})
  lost = 3 * (C + M) + 1.0
  assert (out["restarts"], out["restart_lost"]) == (1.0, pytest.approx(lost, rel=1e-9))
  assert out["sim_time"] == pytest.approx(STEPS * (C + M) + lost, rel=1e-6)
  assert out["bytes_sent"] == plain["bytes_sent"] and out["train_loss"] == plain["train_loss"]
  assert out["time_down"] == pytest.approx(lost / out["sim_time"], rel=1e-6)
  assert out["algorithm_as_run"] == "allreduce + failures (1:6:2, restarts)"


def test_a_second_failure_before_the_checkpoint_loses_every_step_since_it_and_one_restart():
  """Checkpoints every 4 steps (after steps 3 and 7), failures at steps 2, 3 and 6, steps of
  T = c + m = 28 ms, R = 10 ms a restart. Step 2 loses steps 0-2 and R: 3 T + R. The job
  restarts from the checkpoint of step -1 (the start) and is in its state again when the
  restart ends; step 3's failure, before the next checkpoint, loses every step since it,
  0-3 (three of them computed twice by then), and one restart: 4 T + R. Step 6 loses 4-6
  and R: 3 T + R. In all 10 T + 3 R = 0.31 s lost, a run of 20 T + 3 R = 0.59 s (charged
  7 T + 4 R = 0.236 s, 0.516 s, when step 3 lost the one step since the restart and two
  restarts)."""
  t, r = C + M, 0.01
  out = _run(**{"cluster.failures": "1:2:1,2:3:1,1:6:1", "cluster.failure_policy": "restart",
                "cluster.restart_every": 4, "cluster.restart_seconds": r})
  assert out["restarts"] == 3.0
  assert out["restart_lost"] == pytest.approx((3 * t + r) + (4 * t + r) + (3 * t + r),
                                              rel=1e-9)
  assert out["restart_lost"] == pytest.approx(0.31, rel=1e-9)
  assert out["sim_time"] == pytest.approx(STEPS * t + 10 * t + 3 * r, rel=1e-6)


def test_a_quorum_with_a_grace_window_waits_that_long_after_the_kth_worker():
  """Non-blocking SGD with one mini-batch (a worker's batch counts whole or not at all) and
  the deadline 'kth:3:0.01': the step's compute ends 10 ms after the 3rd of 4 workers; the
  last worker, 4x slower, misses it (torchft's quorum of 3 with a grace window)."""
  over = {"cluster.scenario": "one_slow", "cluster.slow_factor": 4.0,
          "nonblocking.enabled": True, "nonblocking.num_minibatches": 1,
          "nonblocking.deadline": "kth:3:0.01"}
  out = _run(**over)
  assert out["sim_time"] == pytest.approx(STEPS * (C + 0.01 + M), rel=1e-6)
  assert out["minibatch_fraction"] == pytest.approx(3 / 4)
  wide = _run(**{**over, "nonblocking.deadline": "kth:3:0.1"})  # a grace past the slowest
  assert wide["minibatch_fraction"] == 1.0
  assert wide["sim_time"] == pytest.approx(STEPS * (4 * C + M), rel=1e-6)


@pytest.mark.parametrize("rebuild", [False, True])
def test_after_a_failure_a_rebuilt_all_reduce_runs_over_the_live_workers(rebuild):
  """Worker 0 down for steps 2-4; a 16-byte model (4 float32) at 1,000 bytes/s. Every worker
  up: a ring over 4, 2 (4 - 1) = 6 messages and 2 (4 - 1) / 4 16 = 24 bytes, 28 + 24 = 52 ms
  a step. Over the 3 live workers (``cluster.rebuild_collectives``, torchft's process group
  reconfigured at the quorum): 2 (3 - 1) = 4 messages and 2 (3 - 1) / 3 16 = 64 / 3 bytes,
  16 + 8 + 21.33 = 45.33 ms a step, 0.500 s in all (0.520 s over all 4); bytes per worker, the
  mean over the 4: 7 x 24 + 3 x 3 / 4 x 64 / 3 = 216 (222)."""
  bw = 1e3
  out = _run(**{"cluster.failures": "0:2:3", "cluster.bandwidth": bw,
                "cluster.rebuild_collectives": rebuild})
  full = C + 6 * LAT + 24 / bw
  live = (C + 4 * LAT + 64 / 3 / bw) if rebuild else full
  assert out["sim_time"] == pytest.approx(7 * full + 3 * live, rel=1e-6)
  assert out["sim_time"] == pytest.approx(0.5 if rebuild else 0.52, rel=1e-6)
  assert out["bytes_sent"] == pytest.approx(216 if rebuild else 222, rel=1e-6)


def test_below_the_quorum_the_job_waits_for_a_repair_when_asked():
  """Non-blocking SGD with one mini-batch and the quorum 'kth:3'; workers 0 and 1 fail at
  step 2, for 3 steps and 1 step (c = 16 ms a step, the repairs' unit: 48 and 16 ms). Going
  on (the default), step 2 runs with workers 2 and 3: 10 steps of c + m = 28 ms, 0.280 s,
  36 of 40 batches. Waiting (``cluster.quorum_policy='wait'``, torchft's lighthouse forms no
  quorum below min_replicas), step 2 starts c = 16 ms late, when worker 1 is back; worker 0's
  repair has 32 ms left, so it is back at step 4 (not 5): 0.296 s, 38 of 40 batches. The
  wait is time down for the two repaired or failed workers (worker 0 down for steps 2-3:
  16 + 28 + 28 = 72 ms; worker 1 16 ms) and time waiting for workers 2 and 3 (16 ms each)."""
  over = {"nonblocking.enabled": True, "nonblocking.num_minibatches": 1,
          "nonblocking.deadline": "kth:3", "cluster.failures": "0:2:3,1:2:1"}
  go_on = _run(**over)
  assert go_on["sim_time"] == pytest.approx(STEPS * (C + M), rel=1e-6)
  assert go_on["minibatch_fraction"] == pytest.approx(36 / 40)
  out = _run(**over, **{"cluster.quorum_policy": "wait"})
  total = STEPS * (C + M) + C
  assert out["sim_time"] == pytest.approx(total, rel=1e-6)
  assert out["minibatch_fraction"] == pytest.approx(38 / 40)
  assert out["time_down"] == pytest.approx((C + 2 * (C + M) + C) / N / total, rel=1e-6)
  assert out["time_wait"] == pytest.approx(2 * C / N / total, rel=1e-6)


def test_a_resumed_run_keeps_the_repairs_a_quorum_wait_cut_short(tmp_path):
  """The wait above (worker 0 back at step 4, not 5) survives a checkpoint after step 3: the
  resumed run's records are the whole run's."""
  from tests.helpers import full_and_crashed, read_records, without_wall
  cfg = _cfg(**{"nonblocking.enabled": True, "nonblocking.num_minibatches": 1,
                "nonblocking.deadline": "kth:3", "cluster.failures": "0:2:3,1:2:1",
                "cluster.quorum_policy": "wait", "eval_every": 2, "checkpoint_every": 4})
  full = full_and_crashed(cfg, tmp_path, at=5)
  resumed = train.train(cfg, str(tmp_path / "run"))
  assert resumed["sim_time"] == pytest.approx(full["sim_time"], rel=1e-12)
  assert resumed["minibatch_fraction"] == full["minibatch_fraction"] == 38 / 40
  assert (without_wall(read_records(tmp_path / "run" / "metrics.jsonl"))
          == without_wall(read_records(tmp_path / "full" / "metrics.jsonl")))


def test_each_step_s_record_names_who_took_no_part(tmp_path):
  """steps.jsonl (written with per-step records on): worker 1 down at steps 2-4 (records
  3-5), worker 3 at step 6 (record 7)."""
  import json
  c = config_lib.default_config()
  c.update(dict(num_workers=N, dataset="least_squares", num_steps=8, eval_every=8,
                progress=False, batch_size=B, algorithm="allreduce"))
  c.problem.update(dict(examples_per_worker=16, dim=4, full_batch=True))
  train.train(config_lib.override(c, {"cluster.failures": "1:2:3,3:6:1",
                                      "consensus.log_every_step": True}), str(tmp_path))
  rows = [json.loads(l) for l in (tmp_path / "steps.jsonl").read_text().splitlines()]
  assert {r["step"]: r.get("absent") for r in rows if "absent" in r} == {
      3: [1], 4: [1], 5: [1], 7: [3]}


def test_elastic_diloco_without_failures_or_stragglers_is_diloco():
  """DiLoCo as torchft and Decoupled DiLoCo run it elastically (Non-blocking SGD with one
  mini-batch, a quorum of 3 of 4 with a 10 ms grace, failures elastic with the joiner's fetch)
  on a cluster with no failures and no stragglers: every worker arrives together, so its
  records (losses, bytes, simulated time) are plain DiLoCo's."""
  base = {"algorithm": "diloco", "diloco.local_steps": 3, "eval_every": 3}
  plain = _run(**base)
  elastic = _run(**base, **{"nonblocking.enabled": True, "nonblocking.num_minibatches": 1,
                            "nonblocking.deadline": "kth:3:0.01", "cluster.rejoin_fetch": True,
                            "cluster.failure_policy": "elastic"})
  for key in ("train_loss", "gap", "bytes_sent", "sim_time", "consensus_distance"):
    assert elastic[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-9), key
  assert elastic["minibatch_fraction"] == 1.0


def test_goodput_is_the_fleet_s_time_whose_work_ends_in_the_model():
  """Closed forms of ``goodput`` (sum of the applied computations' seconds over n sim_time):
  homogeneous, c / (c + m); one worker 4x slower, (3 c + 4 c) / n / (4 c + m) (its own
  computation ends in the model, the others' waiting does not); worker 0 down for steps 2-4,
  (n STEPS - 3) c / n / (STEPS (c + m)); a restart redoes 3 steps and pays 1 s, which add to
  the time and not to the work."""
  total = STEPS * (C + M)
  assert _run()["goodput"] == pytest.approx(C / (C + M), rel=1e-6)
  slow = _run(**{"cluster.scenario": "one_slow", "cluster.slow_factor": 4.0})
  assert slow["goodput"] == pytest.approx(7 * C / N / (4 * C + M), rel=1e-6)
  down = _run(**{"cluster.failures": "0:2:3"})
  assert down["goodput"] == pytest.approx((N * STEPS - 3) * C / N / total, rel=1e-6)
  restart = _run(**{"cluster.failures": "1:6:2", "cluster.failure_policy": "restart",
                    "cluster.restart_every": 4, "cluster.restart_seconds": 1.0})
  assert restart["goodput"] == pytest.approx(STEPS * C / (total + 3 * (C + M) + 1.0), rel=1e-6)


def test_goodput_drops_the_mini_batch_a_deadline_cuts():
  """Non-blocking SGD, M = 4 mini-batches of c / 4, the last worker 3x slower, deadline at
  the fastest worker's end (c): the fast workers count 4 mini-batches (c each), the slow one
  1 (its first ends at 3 c / 4, its second would end at 3 c / 2: the c / 4 it ran of it is
  dropped). A step lasts c + m: goodput (3 c + 3 c / 4) / n / (c + m), below the busy time
  ``time_compute`` = c / (c + m)."""
  out = _run(**{"nonblocking.enabled": True, "nonblocking.num_minibatches": 4,
                "cluster.slowdown": (1.0, 1.0, 1.0, 3.0)})
  assert out["sim_time"] == pytest.approx(STEPS * (C + M), rel=1e-6)
  assert out["time_compute"] == pytest.approx(C / (C + M), rel=1e-6)
  assert out["goodput"] == pytest.approx((3 * C + 0.75 * C) / N / (C + M), rel=1e-6)
