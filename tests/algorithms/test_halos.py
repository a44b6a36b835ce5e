"""HALoS (``algorithm=halos``; Kim et al., ICML 2025; utnslab/halos @4b5bf73) against the
numpy transcription of the reference's servers and event loop (``tests/references/halos.py``,
which imports nothing from the package): the transcription's own timing rule draws the
events, its servers apply them, and the framework's run (host clock and device step) must
hold the same LPS and GPS models after every push."""

import jax
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train
from nbsgd_jax.models import problems
from nbsgd_jax.transforms.hierarchical import HalosState

from tests.helpers import least_squares_cfg, make_stepper
from tests.references import halos as ref

N, M, DIM, REGIONS = 8, 16, 4, 2
LR, MOM, WD, TPE = 0.05, 0.9, 1e-3, 1e-3
H, K, ALPHA = 3, 4, 0.25
LPS = dict(lr=0.8, beta=0.9, c=0.0, buffer_size=2)
GPS = dict(lr=0.6, beta=0.5, c=0.0, buffer_size=2)
# distinct speeds: no two rounds end at one time, so no order rests on a float tie
SLOW = (1.0, 1.37, 2.13, 2.93, 1.11, 1.71, 2.51, 3.3)


def _cfg(levels=(), **kw):
  return least_squares_cfg(
      n=N, m=M, dim=DIM, lr=LR, momentum=MOM, weight_decay=WD, slowdown=SLOW,
      time_per_example=TPE, latency=0.0, bandwidth=2000.0, algorithm="halos", **{
          "num_steps": 10 ** 5, "eval_every": 10 ** 5,
          "halos.regions": REGIONS, "halos.local_steps": H, "halos.accumulation": K,
          "halos.merge_weight": ALPHA, "halos.lps_lr": LPS["lr"],
          "halos.lps_momentum": LPS["beta"], "halos.lps_buffer": LPS["buffer_size"],
          "halos.gps_lr": GPS["lr"], "halos.gps_momentum": GPS["beta"],
          "halos.gps_buffer": GPS["buffer_size"], "cluster.levels": levels, **kw})


def _local_update():
  """A worker's H full-batch steps of SGD (Nesterov momentum, weight decay; the buffer kept
  across rounds, as the reference's worker keeps its optimizer) on its own shard."""
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  buf = [np.zeros(DIM) for _ in range(N)]

  def update(w, params):
    x = np.asarray(params[0], np.float64)
    for _ in range(H):
      d = a[w].T @ (a[w] @ x - b[w]) / M + WD * x
      buf[w] = MOM * buf[w] + d
      x = x - LR * (d + MOM * buf[w])
    return [x.astype(np.float32)]

  return update


def _reference(x0, bandwidths, pushes):
  speeds = 1.0 / np.asarray(SLOW)
  per = N // REGIONS
  events, _ = ref.event_order(
      [list(speeds[l * per:(l + 1) * per]) for l in range(REGIONS)], bandwidths,
      model_bytes=4 * DIM, num_lps=REGIONS, num_workers_per_lps=per,
      local_updates_accumulation=K, num_local_steps=H, local_step_time_ms=M * TPE * 1e3,
      num_events=4 * pushes, rescale_num_local_steps=False)
  trace = ref.halos_run([x0.astype(np.float32)], events, _local_update(), num_lps=REGIONS,
                        num_workers_per_lps=per, lps_opt_config=LPS, gps_opt_config=GPS,
                        model_merge_weight=ALPHA, local_updates_accumulation=K)
  return [r for r in trace if r["event"][0] == "worker_push"][:pushes]


def _after_each_push(cfg, pushes):
  """(LPS models [L, DIM], GPS model, sent) after each of the first ``pushes`` pushes."""
  stepper = make_stepper(cfg)
  x0 = np.asarray(stepper.state.params["w"][0])
  clock, out = stepper.runs[0].host.part("clock"), []
  while clock.pushes < pushes:
    before = clock.pushes
    stepper.steps(1)
    if clock.pushes == before:
      continue
    st = next(x for x in jax.tree.leaves(stepper.state.opt_state,
                                         is_leaf=lambda z: isinstance(z, HalosState))
              if isinstance(x, HalosState))
    lps = np.asarray(st.lps.x["w"])[::N // REGIONS]
    gps = np.asarray(st.gps.x["w"])
    np.testing.assert_array_equal(gps, np.broadcast_to(gps[0], gps.shape))  # one GPS
    out.append((lps, gps[0], clock))
  return x0, out


@pytest.mark.parametrize("levels, bandwidths", [
    ((), [[2000 * 8e-9] * 2] * 2),
    # regions of 4 behind a 5x slower link: the LPS of region 1 talks to the GPS (with worker
    # 0) over it; region 0's LPS and the GPS share region 0's link, as the reference's bw[0][0]
    (("4:0:2000",), [[2000 * 8e-9, 400 * 8e-9], [400 * 8e-9, 2000 * 8e-9]]),
])
def test_halos_equals_the_reference_event_loop_after_every_push(levels, bandwidths):
  """60 pushes (several LPS sends, GPS steps and merges in each region): every LPS's and the
  GPS's model after each push equal the transcription's to float32 rounding."""
  pushes = 60
  cfg = _cfg(levels, **({"cluster.bandwidth": 400.0} if levels else {}))
  x0, got = _after_each_push(cfg, pushes)
  want = _reference(x0, bandwidths, pushes)
  assert sum(r["sent"] for r in want) >= 6 and want[-1]["gps_t"] >= 4
  for p, ((lps, gps, _), r) in enumerate(zip(got, want)):
    for l in range(REGIONS):
      np.testing.assert_allclose(lps[l], r["lps"][l][0], rtol=2e-5, atol=2e-6,
                                 err_msg=f"push {p}, LPS {l}")
    np.testing.assert_allclose(gps, r["gps"][0], rtol=2e-5, atol=2e-6, err_msg=f"push {p}")
  assert got[-1][2].global_updates == want[-1]["gps_t"]


def test_halos_charges_every_message_and_evaluates_the_global_model():
  """Bytes: each pull and push moves one model (16 bytes here), each LPS send and GPS reply
  one more; the records count the GPS's steps; the evaluated model is the GPS's."""
  out = train.train(_cfg(num_steps=120, eval_every=120))["history"][-1]
  stepper = make_stepper(_cfg())
  stepper.steps(120)
  clock = stepper.runs[0].host.part("clock")
  rec = clock.record()
  pulls = int(np.sum(clock.clock.steps // clock.cycle + (clock.clock.steps % clock.cycle > 0)))
  sends = clock.global_updates + len([q for q in clock.queue if q[2] == 1])
  messages = pulls + rec["pushes"] + sends + clock.global_updates
  np.testing.assert_allclose(out["bytes_sent"] * N, messages * 4 * DIM, rtol=1e-6)
  assert rec["global_updates"] >= 2


def test_bad_halos_regions_is_one_line_naming_the_key():
  with pytest.raises(ValueError, match=r"halos\.regions=3"):
    train.train(_cfg(**{"halos.regions": 3}))


@pytest.mark.slow  # two runs and a resume
def test_a_crashed_halos_run_resumes_to_the_records_of_a_run_never_stopped(tmp_path):
  """The servers' messages in flight, the LPS versions and the GPS's steps travel in the
  checkpoint: a run stopped after a checkpoint resumes to the same records."""
  from tests.helpers import full_and_crashed, read_records, without_wall
  cfg = _cfg(num_steps=40, eval_every=8, checkpoint_every=16)
  full = full_and_crashed(cfg, tmp_path, at=20)
  train.train(cfg, str(tmp_path / "run"))
  assert full["global_updates"] >= 1
  assert (without_wall(read_records(tmp_path / "run" / "metrics.jsonl"))
          == without_wall(read_records(tmp_path / "full" / "metrics.jsonl")))
