"""The simulated clock against hand computations (docs/clock.md): the compute model, the
straggler models, the clock rules per communication, failures and the measured time per
example."""

import json
import math

import numpy as np
import optax
import pytest

from nbsgd_jax.host import cluster as cl
from nbsgd_jax import host as host_lib
from nbsgd_jax import train
from nbsgd_jax.communications import AllReduce, Gossip
from nbsgd_jax.transforms import gossip_step
from nbsgd_jax.host.parts import HostInputs

from tests.helpers import small_cfg


def _cfg(**overrides):
  """:func:`tests.helpers.small_cfg` (4 workers, batch 8) run for 4 steps; ``a__b`` stands
  for ``a.b``."""
  return small_cfg(**{"num_steps": 4, "eval_every": 4, **overrides})


# ----------------------------------------------------------------------------- compute model


def test_splitting_a_batch_does_not_change_a_blocking_step():
  """B examples at 1 ms each on slowdowns [1, 2]: 8 ms and 16 ms however many mini-batches;
  a per-iteration delay draw is the same for every M."""
  for delay in ("none", "shifted_exponential"):
    lasts = []
    for m in (1, 2, 4, 8):
      c = cl.make_cluster(2, m, slowdown=[1.0, 2.0], time_per_example=1e-3, batch_size=8,
                          delay=delay, delay_mean=0.01, delay_shift=0.002, seed=3)
      lasts.append(cl.minibatch_finish_times(c, 7)[:, -1])
    for last in lasts[1:]:
      np.testing.assert_allclose(last, lasts[0], rtol=1e-12)
    if delay == "none":
      np.testing.assert_allclose(lasts[0], [0.008, 0.016], rtol=1e-12)


def test_doubling_the_batch_doubles_the_compute():
  for m in (1, 4):
    a = cl.make_cluster(3, m, scenario="one_slow", time_per_example=2e-4, batch_size=16)
    b = a._replace(minibatch_size=2 * a.minibatch_size)
    np.testing.assert_allclose(cl.minibatch_finish_times(b, 0),
                               2 * cl.minibatch_finish_times(a, 0), rtol=1e-12)
    assert cl.make_cluster(3, m, batch_size=32).minibatch_size == 2 * a.minibatch_size


def test_overhead_is_per_minibatch_and_not_slowed_down():
  c = cl.make_cluster(2, 4, slowdown=[1.0, 3.0], time_per_example=1e-3, batch_size=8,
                      overhead=5e-4)
  # (8 / 4) * 1e-3 * s + 5e-4 = [2.5e-3, 6.5e-3] per mini-batch
  np.testing.assert_allclose(cl.minibatch_finish_times(c, 0)[:, -1], [0.010, 0.026])


def test_per_minibatch_delays_are_independent_draws():
  c = cl.make_cluster(200, 4, delay="shifted_exponential", delay_mean=0.01, delay_per="minibatch")
  d = cl.delays(c, 0)
  assert np.all(np.std(d, axis=1) > 0)  # four different draws per worker
  it = c._replace(delay_per="iteration")
  d = cl.delays(it, 0)
  np.testing.assert_allclose(np.std(d, axis=1), 0.0, atol=1e-15)  # one draw spread evenly


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["kth:4", "fastest"])
def test_blocking_and_nonblocking_see_the_same_realisation(rule):
  """Per-iteration delays: a non-blocking run that waits for everybody (kth:n) has the
  blocking run's sim_time for every M; with 'fastest' it is never slower."""
  base = dict(algorithm="allreduce", num_steps=4, eval_every=4, cluster__delay="shifted_exponential",
              cluster__delay_mean=0.02, cluster__delay_shift=0.001, cluster__seed=5)
  blocking = train.train(_cfg(**base))["sim_time"]
  for m in (1, 2, 4):
    nb = train.train(_cfg(**base, nonblocking__enabled=True, nonblocking__deadline=rule,
                          nonblocking__num_minibatches=m))["sim_time"]
    if rule == "kth:4":
      assert nb == pytest.approx(blocking, rel=1e-12)
    else:
      assert nb <= blocking + 1e-12


@pytest.mark.slow
def test_blocking_sim_time_is_the_same_for_every_m():
  times = {m: train.train(_cfg(algorithm="allreduce", nonblocking__num_minibatches=m,
                               cluster__scenario="one_slow"))["sim_time"]
           for m in (1, 2, 4)}
  assert times[1] == times[2] == times[4] > 0


@pytest.mark.slow
def test_sim_time_scales_with_the_batch():
  """No communication cost: sim_time is steps x B x time_per_example x slowest slowdown."""
  for b in (8, 16):
    s = train.train(_cfg(algorithm="allreduce", batch_size=b, cluster__latency=0.0,
                         cluster__bandwidth=1e30, cluster__scenario="one_slow",
                         cluster__slow_factor=3.0))
    assert s["sim_time"] == pytest.approx(4 * b * 1e-3 * 3.0, rel=1e-9)


def test_step_overhead_is_charged_once_per_step():
  kw = dict(algorithm="allreduce", cluster__latency=0.0, cluster__bandwidth=1e30)
  base = train.train(_cfg(**kw))["sim_time"]
  more = train.train(_cfg(**kw, cluster__step_overhead=0.005))["sim_time"]
  assert more - base == pytest.approx(4 * 0.005, rel=1e-9)


# ----------------------------------------------------------------------------- failures


def test_a_failed_fastest_worker_sets_no_deadline():
  """Four workers, M = 4, 10 ms / 20 ms mini-batches, the fastest (worker 0) down: the
  deadline is the next fastest's 80 ms and the others finish all four; the clock pays 80 ms
  plus the all-reduce over the three live workers."""
  c = cl.make_cluster(4, 4, slowdown=[1.0, 2.0, 2.0, 2.0], time_per_example=5e-3, batch_size=8,
                      latency=1e-3, bandwidth=1e30)
  comm = AllReduce(4, key="allreduce")
  host = host_lib.Host([host_lib.Failures(cl.parse_failures("0:0:1", 4), 4),
                        host_lib.Activations([comm]),
                        host_lib.Workload(c, nonblocking=True, deadline="fastest"),
                        host_lib.Clock(c, [comm])])
  inputs = host.inputs(0)
  np.testing.assert_array_equal(inputs.count, [0, 4, 4, 4])
  assert inputs.deadline == pytest.approx(0.080)
  np.testing.assert_allclose(inputs.compute, [0.0, 0.08, 0.08, 0.08])
  report = {"bytes/allreduce": np.zeros(4), "rounds/allreduce": np.ones(4, np.int32)}
  host.observe(0, inputs, report)
  # the live workers: 80 ms + 2 (n - 1) latency = 80 + 6 ms (worker 0 sends nothing)
  np.testing.assert_allclose(host.part("clock").clocks, [0.0, 0.086, 0.086, 0.086])


# ----------------------------------------------------------------------------- clock rules

PATH = np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])  # 1 - 0 - 2 ... a path


def _gossip_clock(order):
  """Path 0 - 1 - 2, compute [1, 2, 4] s, 1 s per message (worker i sends deg_i messages:
  comm = [1, 2, 1] s), no bytes."""
  c = cl.make_cluster(3, 1, slowdown=[1.0, 2.0, 4.0], time_per_example=1.0, batch_size=1,
                      latency=1.0, bandwidth=1e30)
  comm = gossip_step(optax.sgd(0.1), Gossip([PATH]), order).communications[-1]
  clock = host_lib.Clock(c, [comm])
  inputs = HostInputs(0, compute=np.array([1.0, 2.0, 4.0]))
  clock.observe(0, inputs, {"bytes/gossip": np.zeros(3), "rounds/gossip": np.ones(3)}, None)
  return clock.clocks


def test_parallel_gossip_overlaps_the_computation():
  """c_i <- max(c_i + compute_i, max_{j in N(i)} (c_j + comm_j)):
  worker 0: max(1, max(0 + 1, 0 + 2)) = 2; worker 1: max(2, max(1, 2, 1)) = 2;
  worker 2: max(4, max(2, 1)) = 4."""
  np.testing.assert_allclose(_gossip_clock("parallel"), [2.0, 2.0, 4.0])


def test_atc_gossip_sends_after_the_computation():
  """c_i <- max_{j in N(i)} (c_j + compute_j + comm_j), ready r = [1, 2, 4]:
  worker 0: max(1 + 1, 2 + 2) = 4; worker 1: max(1 + 1, 2 + 2, 4 + 1) = 5;
  worker 2: max(2 + 2, 4 + 1) = 5."""
  np.testing.assert_allclose(_gossip_clock("atc"), [4.0, 5.0, 5.0])


def test_allreduce_round_is_lockstep():
  """c <- max_j (c_j + compute_j) + comm_i: [0, 1, 0] + [1, 2, 4] -> 4, plus 1 s each."""
  out = cl.advance_clocks(np.array([0.0, 1.0, 0.0]), np.array([1.0, 2.0, 4.0]), np.ones(3))
  np.testing.assert_allclose(out, [5.0, 5.0, 5.0])


@pytest.mark.parametrize("latency,expected", [(5.0, [12.0, 12.0, 13.0, 14.0]),
                                              (1.0, [4.0, 6.0, 5.0, 8.0])])
def test_a_deferred_round_is_waited_for_only_tau_steps_later(latency, expected):
  """Streaming DiLoCo's overlap (tau = 2): two workers, compute [1, 2] s a step, an all-reduce
  launched after step 0 of 2 (n - 1) = 2 messages: it starts at max(1, 2) = 2 and arrives at
  2 + 2 latency. The workers go on (clocks [1, 2] -> [2, 4] -> [3, 6]) and wait for it at the
  end of step 2: latency 5 -> max([3, 6], 12) = [12, 12], then [13, 14] after step 3;
  latency 1 -> max([3, 6], 4) = [4, 6], then [5, 8]."""
  c = cl.make_cluster(2, 1, slowdown=[1.0, 2.0], time_per_example=1.0, batch_size=1,
                      latency=latency, bandwidth=1e30)
  comm = AllReduce(2, key="allreduce").deferred(2)
  clock = host_lib.Clock(c, [comm])
  inputs = HostInputs(0, compute=np.array([1.0, 2.0]))
  launch = {"bytes/allreduce": np.zeros(2), "rounds/allreduce": np.ones(2, np.int32)}
  clock.observe(0, inputs, launch, None)
  np.testing.assert_allclose(clock.clocks, [1.0, 2.0])  # nobody waits at the launch
  clock.observe(1, inputs, {}, None)
  np.testing.assert_allclose(clock.clocks, [2.0, 4.0])
  saved = clock.state_dict()
  clock.observe(2, inputs, {}, None)
  after2 = clock.clocks.copy()
  clock.observe(3, inputs, {}, None)
  np.testing.assert_allclose(np.concatenate([after2, clock.clocks]), expected)
  resumed = host_lib.Clock(c, [comm])  # a checkpoint between launch and landing keeps it
  resumed.load_state_dict(json.loads(json.dumps(saved)))
  resumed.observe(2, inputs, {}, None)
  np.testing.assert_allclose(resumed.clocks, after2)


@pytest.mark.slow
def test_parallel_dpsgd_step_on_a_ring_costs_max_of_compute_and_comm():
  """Homogeneous ring, no delays: a parallel D-PSGD step costs max(B tau, comm), an atc step
  B tau + comm (comm = 2 latency + 2 S / bandwidth)."""
  times = {}
  for order in ("parallel", "atc"):
    s = train.train(_cfg(algorithm="dpsgd", topology="ring", dpsgd__order=order,
                         cluster__latency=1e-3, cluster__bandwidth=1e7))
    times[order] = s["sim_time"]
    size = 4 * s["model_params"]
  compute, comm = 8 * 1e-3, 2 * 1e-3 + 2 * size / 1e7
  assert times["parallel"] == pytest.approx(4 * max(compute, comm), rel=1e-9)
  assert times["atc"] == pytest.approx(4 * (compute + comm), rel=1e-9)


# ----------------------------------------------------------------------------- deadlines


def test_adaptive_deadline_by_hand():
  h = cl.DeadlineHistory(4, "adaptive", k=2.0, window=2)
  assert h.deadline() == math.inf  # the first step waits for everybody
  h.observe([1.0, 2.0, 3.0, 10.0])
  h.observe([1.0, 2.0, 3.0, 4.0], live=[True, True, True, False])
  # pooled [1, 2, 3, 10, 1, 2, 3]: median 2, |x - 2| = [1, 0, 1, 8, 1, 0, 1], MAD 1 -> 2 + 2
  assert h.deadline() == pytest.approx(4.0)
  h.observe([5.0, 5.0, 5.0, 5.0])  # window 2: the first step drops out
  # [1, 2, 3, 5, 5, 5, 5]: median 5, MAD 0
  assert h.deadline() == pytest.approx(5.0)
  fastest = cl.DeadlineHistory(3, "fastest", window=3)
  for t in ([3.0, 1.0, 2.0], [3.0, 9.0, 2.0], [3.0, 1.0, 2.0]):
    fastest.observe(t)
  assert fastest.deadline() == pytest.approx(1.0)  # per-worker medians [3, 1, 2]
  with pytest.raises(ValueError, match=r"nonblocking\.adaptive_k=-1"):
    cl.DeadlineHistory(3, "adaptive", k=-1)
  with pytest.raises(ValueError, match=r"nonblocking\.window=0"):
    cl.DeadlineHistory(3, "adaptive", window=0)


def test_full_time_estimate():
  est = cl.full_time_estimate([4.0, 3.0, 0.0], [4, 2, 0], 4, 5.0)
  np.testing.assert_allclose(est, [4.0, 6.0, 20.0])


def test_adaptive_run_trains():
  s = train.train(_cfg(algorithm="allreduce", nonblocking__enabled=True,
                       nonblocking__deadline="adaptive", nonblocking__adaptive_k=0.0,
                       cluster__scenario="lognormal", num_steps=6, eval_every=6))
  assert math.isfinite(s["train_loss"]) and s["sim_time"] > 0


# ----------------------------------------------------------------------------- measured


@pytest.mark.slow
def test_measured_time_per_example_is_recorded(tmp_path):
  s = train.train(_cfg(algorithm="allreduce", cluster__measure_time_per_example=True,
                       num_steps=2, eval_every=2), str(tmp_path))
  assert s["time_per_example_measured"] is True
  assert 0 < s["time_per_example"] < 1 and math.isfinite(s["time_per_example"])
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved["time_per_example"] == s["time_per_example"]
  assert s["sim_time"] > 2 * 8 * s["time_per_example"] * 0.999


def test_configured_time_per_example_is_recorded():
  s = train.train(_cfg(algorithm="allreduce", cluster__time_per_example=2e-3,
                       num_steps=1, eval_every=1))
  assert s["time_per_example"] == 2e-3 and s["time_per_example_measured"] is False
