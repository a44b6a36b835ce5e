"""The asynchronous family on the event clock (``nbsgd_jax/recipes/asynchronous.py``) against
independent references.

AD-PSGD's reference is a plain sequential event loop in numpy float64, written from the paper
and the reference code, not from the package: Lian, Zhang, Zhang, Liu, "Asynchronous
Decentralized Parallel Stochastic Gradient Descent", ICML 2018, Algorithm 1 (a worker computes
its gradient on its read of its model; at its event it averages with a neighbour drawn
uniformly, (x_i + x_j) / 2 for both, then applies the stale gradient), with the local step of
the reference's gossip process (facebookresearch/stochastic_gradient_push,
``gossip/ad_psgd.py``, ``BilatGossipDataParallel._gossip_target``, commit
ac9af237e195c812ebad08fc4697e3de1fa96ff8: ``torch.optim.SGD(lr, momentum, weight_decay,
nesterov)``, i.e. ``d = g + wd x; buf = m buf + d; d = d + m buf; x -= lr d``) and the
cluster's times written out (the peer of worker i's event k is the seeded draw
``draw_index(seed, i, k, degree)``, an input of the run like its seed): worker i computes for ``batch * time_per_example * slowdown_i``
seconds, and after an exchange it sends one model (``latency + 4 d / bandwidth``) before its
next computation.
"""

import heapq

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.models import problems
from nbsgd_jax import train
from nbsgd_jax.host.events import draw_index  # the seeded draw: an input, like a seed
from tests.helpers import least_squares_cfg, make_stepper, slow_except

N, M, DIM = 8, 16, 4
SLOW = (1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 5.0, 5.0)  # 3 speeds
LR, MOM, WD, TPE, LAT, BW = 0.05, 0.9, 1e-3, 1e-3, 1e-4, 1e6


def _cfg(**kw):
  return least_squares_cfg(n=N, m=M, dim=DIM, lr=LR, momentum=MOM, weight_decay=WD,
                           slowdown=SLOW, time_per_example=TPE, latency=LAT, bandwidth=BW,
                           **{"num_steps": 30, "eval_every": 30, **kw})


def sequential(x0, keep, seed=0, every=1, swarm=False):
  """AD-PSGD (or SwarmSGD: ``swarm``, a local step at every event and an average after every
  ``every``-th) event by event (module docstring): the events ``(worker, own step)`` of
  ``keep`` applied in time order (ties by worker). Returns ``(x [n, d], mean staleness)``."""
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  grad = lambda i, x: a[i].T @ (a[i] @ x - b[i]) / M
  nbrs = [sorted({(i - 1) % N, (i + 1) % N}) for i in range(N)]
  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  buf, held = np.zeros_like(x), np.stack([grad(i, x[i]) for i in range(N)])
  changes, read, stale = np.zeros(N, int), np.zeros(N, int), []
  heap = [(M * TPE * SLOW[i], i, 0) for i in range(N)]
  heapq.heapify(heap)
  while heap:
    t, i, k = heapq.heappop(heap)
    if (i, k) not in keep:
      continue
    pairs = (k + 1) % every == 0
    j = nbrs[i][draw_index(seed, i, k, len(nbrs[i]))] if pairs else i
    stale.append(changes[i] - read[i])
    if not swarm:
      x[i] = x[j] = (x[i] + x[j]) / 2
    d = held[i] + WD * x[i]
    buf[i] = MOM * buf[i] + d
    x[i] -= LR * (d + MOM * buf[i])
    if swarm:
      x[i] = x[j] = (x[i] + x[j]) / 2
    changes[list({i, j})] += 1
    held[i], read[i] = grad(i, x[i]), changes[i]
    send = LAT + 4 * DIM / BW if j != i else 0.0
    heapq.heappush(heap, (t + send + M * TPE * SLOW[i], i, k + 1))
  return x, float(np.mean(stale))


@pytest.mark.parametrize("algorithm, over, ref", [
    ("ad_psgd", {}, {}),
    ("swarm_sgd", {"swarm_sgd.local_steps": 3}, {"every": 3, "swarm": True})])
def test_equals_the_sequential_event_loop(algorithm, over, ref):
  """30 device steps (batches of events) equal the events they applied, run one by one by the
  numpy loop, to 1e-6 relative; the logged mean staleness is the loop's."""
  s = train.setup(_cfg(algorithm=algorithm, **over))
  stepper = train.Stepper.of(s)
  x0 = np.asarray(stepper.state.params["w"][0])
  steps = stepper.steps(30)
  clock = stepper.runs[0].host.part("clock")
  done = clock.clock.steps
  assert sum(int(inputs.events.fire.sum()) for _, inputs, _, _ in steps) == done.sum()
  keep = {(i, k) for i in range(N) for k in range(int(done[i]))}
  want, stale = sequential(x0, keep, **ref)
  got = np.asarray(stepper.state.params["w"], np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
  rec = clock.record()
  assert rec["events"] == done.sum() > 30  # batches of several events
  assert rec["staleness_own_steps"] == pytest.approx(stale) and stale > 0
  assert done[0] > done[7]  # the fast workers made more steps


def test_bipartite_pairing_pairs_an_active_with_a_passive_worker():
  from nbsgd_jax import recipes
  s = train.setup(_cfg(**{"ad_psgd.pairing": "bipartite"}))
  side = recipes.two_colouring(N, s.topology.edges)
  pairs = 0
  for _, inputs, _, _ in train.Stepper.of(s).steps(20):
    peer = inputs.events.peer
    for i in np.flatnonzero(peer != np.arange(N)):
      assert side[i] != side[peer[i]]
      pairs += 1
  assert pairs > 0


@pytest.mark.parametrize("over, named", [
    ({"ad_psgd.pairing": "bipartite", "num_workers": 7, "problem.shards": 7,
      "cluster.slowdown": ()},
     "config.ad_psgd.pairing='bipartite' is not allowed"),
    ({"ad_psgd.pairing": "pairs"}, "ad_psgd.pairing"),
    ({"nonblocking.enabled": True}, "config.nonblocking.enabled=True is not allowed"),
    ({"cluster.rebuild_collectives": True},
     "config.cluster.rebuild_collectives=True is not allowed"),
    ({"cluster.failures": "1:0:5", "ad_psgd.order": "released"},
     "config.cluster.failures='1:0:5' is not allowed with config.ad_psgd.order='released'"),
    ({"algorithm": "sgp", "sgp.delay": -1}, "config.sgp.delay=-1 is not allowed"),
    ({"algorithm": "async_diloco", "async_diloco.staleness_weight": "linear"},
     "config.async_diloco.staleness_weight='linear' is not allowed"),
    ({"algorithm": "async_diloco", "diloco.outer_nesterov": False},
     "config.diloco.outer_nesterov=False is not allowed"),
    ({"algorithm": "sgp", "sgp.delay": 2},
     "config.sgp.delay=2 is not allowed with config.sgp.overlap=False"),
])
def test_bad_input_is_one_line_naming_the_key(over, named):
  with pytest.raises(config_lib.ConfigError, match=named.replace("[", r"\[")):
    train.setup(_cfg(**over))


# ----------------------------------------------------------------------------- SGP


def reference_sgp(x0, steps, overlap, synch_freq):
  """SGP as facebookresearch/stochastic_gradient_push ``gossip/distributed.py`` runs it
  (commit e682064; ``GossipDataParallel(push_sum=True, overlap, synch_freq)``), all workers
  in lockstep, in numpy float64. Per iteration: with ``overlap``, the forward pre-hook
  (``__make_forward_pre_hook``, lines 574-584): ``non_blocking = num_updates < synch_freq``;
  ``_query_gossip_queue(non_blocking)`` (lines 336-387) returns False when no round is in
  flight, and otherwise lands the round (adds the received residuals) only when it blocks: the
  limit of slow communication, where a non-blocking query never finds the round arrived (it
  then returns None); ``num_updates = 0`` after a landing, ``+= 1`` otherwise (iteration 0
  included); then ``transfer_params`` (lines 389-435) sends a round only when none is in flight:
  keep half of the numerator and weight, send half to the peer. Then the gradient at the
  de-biased ``z = x / w`` and ``torch.optim.SGD``'s step on the numerator; without overlap,
  after the step, one blocking push-sum round. Round r goes to ``i + 2^(r mod log2 n)`` (the
  package's one-peer exponential graph; the reference's DynamicDirectedExponentialGraph also
  alternates the backward peers ``i - 2^r``). Returns the de-biased models after ``steps``
  iterations (and a round the next pre-hook would land, landed)."""
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  levels = (N - 1).bit_length()
  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  w, buf = np.ones(N), np.zeros_like(x)
  flight, num_updates, r = None, 0, 0

  def query(non_blocking):
    nonlocal flight, x, w
    if flight is None:
      return False  # "not gossiping right now"
    if non_blocking:
      return None  # the flag is not set yet: slow communication
    to, part_x, part_w = flight
    np.add.at(x, to, part_x)
    np.add.at(w, to, part_w)
    flight = None
    return True

  def pre_hook():
    nonlocal num_updates, flight, x, w, r
    if query(num_updates < synch_freq):
      num_updates = 0
    else:
      num_updates += 1
    if flight is None:  # transfer_params: only when the last round was mixed
      to = (np.arange(N) + 2 ** (r % levels)) % N
      r += 1
      x, w = x / 2, w / 2
      flight = (to, x.copy(), w.copy())

  for k in range(steps):
    if overlap:
      pre_hook()
    z = x / w[:, None]
    g = np.stack([a[i].T @ (a[i] @ z[i] - b[i]) / M for i in range(N)])
    d = g + WD * x
    buf = MOM * buf + d
    x = x - LR * (d + MOM * buf)
    if not overlap:
      src = (np.arange(N) - 2 ** (k % levels)) % N
      x, w = (x + x[src]) / 2, (w + w[src]) / 2
  if overlap and flight is not None and num_updates >= synch_freq:
    query(False)
  return x / w[:, None]


@pytest.mark.parametrize("overlap, synch_freq", [(False, 0), (True, 0), (True, 1), (True, 2)])
@pytest.mark.parametrize("steps", [1, 2, 3, 25])
def test_sgp_equals_the_reference_s_iterations(overlap, synch_freq, steps):
  """``steps`` steps of ``sgp`` equal the numpy transcription of the reference's iterations to
  1e-6 relative: SGP; Overlap-SGP landing each round at the end of its step (synch_freq 0),
  and with synch_freq s = 1, 2 the first round after s steps and every later one after s + 1
  (the pre-hook counts iteration 0)."""
  s = train.setup(_cfg(algorithm="sgp", topology="one_peer_exponential", **{
      "sgp.overlap": overlap, "sgp.delay": synch_freq}))
  stepper = train.Stepper.of(s)
  x0 = np.asarray(stepper.state.params["w"][0])
  stepper.steps(steps)
  want = reference_sgp(x0, steps, overlap, synch_freq)
  got = np.asarray(stepper.state.params["w"], np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_sgp_without_overlap_is_dpsgd_over_the_same_graph():
  """Every phase of the one-peer exponential graph, (I + P_t) / 2, is doubly stochastic: the
  push-sum weights stay 1 and SGP is D-PSGD over W_t (local step, then gossip)."""
  out = {}
  for algorithm in ("sgp", "dpsgd"):
    stepper = make_stepper(_cfg(algorithm=algorithm,
                                topology="one_peer_exponential"))
    stepper.steps(25)
    out[algorithm] = np.asarray(stepper.state.params["w"])
  np.testing.assert_allclose(out["sgp"], out["dpsgd"], rtol=1e-6, atol=1e-7)


FAILS = "3:2:5,6:1:2,0:7:3"  # worker:start:duration, in steps of the worker's nominal time


def sequential_with_failures(x0, keep, spec=FAILS, seed=0):
  """AD-PSGD event by event with failures, written from the rules of docs/clock.md
  ("Failures on the event clock"), not from the package: worker w is down over
  ``[s s0_w, (s + d) s0_w)`` (``s0_w = M * TPE * SLOW[w]``, its nominal step); a computation
  a failure interrupts (or that would start while it is down) is lost and starts again at the
  repair, where the worker reads its model again (its gradient is recomputed); a partner
  down at the event's time is not averaged with, and the initiator still pays the message's
  time; the events ``keep`` are applied in time order, a read before an event of the same
  time. Returns ``x [n, d]``."""
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  grad = lambda i, x: a[i].T @ (a[i] @ x - b[i]) / M
  nbrs = [sorted({(i - 1) % N, (i + 1) % N}) for i in range(N)]
  spans = [[] for _ in range(N)]
  for item in spec.split(","):
    w, s, d = (int(v) for v in item.split(":"))
    s0 = M * TPE * SLOW[w]
    spans[w].append((s * s0, (s + d) * s0))
  down = lambda j, t: any(p <= t < q for p, q in spans[j])

  def begin(i, t):  # when worker i's computation due at t starts for good
    dur = M * TPE * SLOW[i]
    while True:
      hit = [(p, q) for p, q in spans[i] if p < t + dur and q > t]
      if not hit:
        return t
      t = min(hit)[1]

  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  buf, held = np.zeros_like(x), np.stack([grad(i, x[i]) for i in range(N)])
  heap = []
  for i in range(N):
    t0 = begin(i, 0.0)
    if t0 > 0:
      heapq.heappush(heap, (t0, 0, i, 0))
    heapq.heappush(heap, (t0 + M * TPE * SLOW[i], 1, i, 0))
  while heap:
    t, kind, i, k = heapq.heappop(heap)
    if (i, k) not in keep:
      continue
    if kind == 0:  # the read after a repair
      held[i] = grad(i, x[i])
      continue
    j = nbrs[i][draw_index(seed, i, k, len(nbrs[i]))]
    if not down(j, t):
      x[i] = x[j] = (x[i] + x[j]) / 2
    d = held[i] + WD * x[i]
    buf[i] = MOM * buf[i] + d
    x[i] -= LR * (d + MOM * buf[i])
    held[i] = grad(i, x[i])
    start = t + LAT + 4 * DIM / BW
    t1 = begin(i, start)
    if t1 > start:
      heapq.heappush(heap, (t1, 0, i, k + 1))
    heapq.heappush(heap, (t1 + M * TPE * SLOW[i], 1, i, k + 1))
  return x


def test_with_failures_equals_the_sequential_event_loop():
  """AD-PSGD with a failure schedule (three workers down, one of them a fast worker that
  crashes mid-computation): 40 device steps equal the event-by-event loop with failures to
  1e-6 relative; a down worker fires no event inside its span, and every other worker's
  events keep their times (the clock's events with and without the failures)."""
  s = train.setup(_cfg(num_steps=40, **{"cluster.failures": FAILS}))
  stepper = train.Stepper.of(s)
  x0 = np.asarray(stepper.state.params["w"][0])
  stepper.steps(40)
  clock = stepper.runs[0].host.part("clock")
  done = clock.clock.steps
  keep = {(i, k) for i in range(N) for k in range(int(done[i]))}
  want = sequential_with_failures(x0, keep)
  got = np.asarray(stepper.state.params["w"], np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
  plain = sequential_with_failures(x0, keep, spec="7:100000:1")
  assert not np.allclose(plain, want, rtol=1e-3)  # the failures changed the run
  rec = clock.record()
  assert rec["time_down"] > 0 and 0 < rec["goodput"] < rec["time_compute"] <= 1


def _event_times(over, batches=60):
  part = train.make_host(train.setup(_cfg(**over))).part("clock")
  times = {}
  for _ in range(batches):
    for e in part.clock.next_batch():
      times.setdefault(e.worker, []).append(e.time)
  return times


def test_a_down_worker_fires_no_event_in_its_span_and_the_others_keep_their_times():
  """Worker 3 (nominal step s0 = 32 ms) down over [2 s0, 7 s0): none of its events falls
  inside; its computation in flight at 2 s0 is lost and restarts at 7 s0 (its next event
  at 7 s0 + s0 = 8 s0, 0.256 s); every other worker's event times equal those of the run
  without failures (a partner down costs the initiator the message's time all the same)."""
  s0 = M * TPE * SLOW[3]
  plain, failed = _event_times({}), _event_times({"cluster.failures": "3:2:5"})
  assert all(not 2 * s0 < t < 7 * s0 for t in failed[3])
  after = [t for t in failed[3] if t >= 7 * s0]
  assert after[0] == pytest.approx(8 * s0, rel=1e-12)
  for i in set(range(N)) - {3}:
    m = min(len(plain[i]), len(failed[i]))
    np.testing.assert_allclose(failed[i][:m], plain[i][:m], rtol=1e-12)


FAULTS = {"schedule": {"cluster.failures": "1:1:6,5:0:4"},
          "rate": {"cluster.failure_mtbf": 1e-5, "cluster.failure_repair": 0.03,
                   "cluster.rejoin_fetch": True}}
EVENT_ALGORITHMS = {
    "ad_psgd": {}, "swarm_sgd": {"swarm_sgd.local_steps": 2},
    "async_diloco": {"diloco.local_steps": 3},
    "halos": {"halos.regions": 2, "halos.local_steps": 2, "halos.accumulation": 2}}


@pytest.mark.parametrize("algorithm, fault", slow_except(
    [(a, f) for f in FAULTS for a in EVENT_ALGORITHMS],
    fast=(("ad_psgd", "rate"), ("async_diloco", "schedule"))))
def test_every_event_clock_algorithm_runs_through_failures(algorithm, fault):
  """A failure schedule and a failure rate (Weibull up times, exponential repairs, the model
  fetched on rejoining) on each event-clock algorithm: the run's records show the time down,
  goodput within the computing time (a crash's lost work is computing, not goodput), and a
  time split that adds up to 1."""
  over = {"algorithm": algorithm, "num_steps": 60, "eval_every": 60,
          **EVENT_ALGORITHMS[algorithm]}
  plain = train.train(_cfg(**over))
  out = train.train(_cfg(**over, **FAULTS[fault]))
  assert plain["time_down"] == 0 and out["time_down"] > 0
  assert 0 < out["goodput"] <= out["time_compute"] + 1e-12
  assert plain["goodput"] == pytest.approx(plain["time_compute"], rel=1e-9)  # nothing lost
  split = sum(out[k] for k in ("time_compute", "time_comm", "time_wait", "time_down"))
  assert split == pytest.approx(1.0, abs=1e-9)
  assert np.isfinite(out["train_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ad_psgd", "async_diloco"])
def test_a_crash_and_resume_with_failures_equals_the_run_never_stopped(algorithm, tmp_path):
  from tests.helpers import full_and_crashed, read_records, without_wall
  cfg = _cfg(algorithm=algorithm, num_steps=40, eval_every=8, checkpoint_every=16,
             **EVENT_ALGORITHMS[algorithm], **FAULTS["rate"])
  full_and_crashed(cfg, tmp_path, at=20)
  train.train(cfg, str(tmp_path / "run"))
  assert (without_wall(read_records(tmp_path / "run" / "metrics.jsonl"))
          == without_wall(read_records(tmp_path / "full" / "metrics.jsonl")))


def test_the_restart_policy_pauses_the_job_and_replays_the_same_events():
  """``failure_policy=restart`` on the event clock, closed forms: checkpoints every 4 nominal
  steps of progress (P = 4 mean(s0) = 4 x 38 ms = 0.152 s: the workers' s0 are 16, 32 and
  80 ms); worker 3 (s0 = 32 ms) fails at its step 7 (progress 0.224 s: 0.072 s since the
  checkpoint at 0.152 s) and worker 0 (s0 = 16 ms) at its step 12 (0.192 s: 0.040 s since it),
  restarts of 0.5 s: the job loses 0.072 + 0.5 + 0.040 + 0.5 = 1.112 s, its events and model
  are those of the run without failures (a deterministic job replays them), and every
  worker is down for the lost time."""
  over = {"num_steps": 40, "eval_every": 40}
  plain = train.train(_cfg(**over))
  out = train.train(_cfg(**over, **{
      "cluster.failures": "3:7:1,0:12:1", "cluster.failure_policy": "restart",
      "cluster.restart_every": 4, "cluster.restart_seconds": 0.5}))
  s0 = np.asarray(SLOW) * M * TPE
  assert s0.mean() == pytest.approx(0.038)
  assert plain["sim_time"] > 0.224  # both failures inside the run's progress
  assert (out["restarts"], out["restart_lost"]) == (2.0, pytest.approx(1.112, rel=1e-9))
  assert out["sim_time"] == pytest.approx(plain["sim_time"] + 1.112, rel=1e-9)
  assert out["train_loss"] == plain["train_loss"] and out["events"] == plain["events"]
  assert out["time_down"] == pytest.approx(1.112 / out["sim_time"], rel=1e-9)
  assert out["goodput"] == pytest.approx(plain["goodput"] * plain["sim_time"] / out["sim_time"],
                                         rel=1e-9)
