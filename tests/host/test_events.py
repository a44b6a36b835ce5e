"""The event clock (``nbsgd_jax/host/event_clock.py``) against a plain sequential event loop.

The reference below is written from the definition, not from the module: a heap of finish
times popped one event at a time (ties by worker index), each event applied at once, on a toy
of AD-PSGD (Lian et al. 2018, Algorithm 1: a worker's gradient is computed on its read of its
model; at its event it averages with a random neighbour, (x_i + x_j) / 2 for both, and applies
the stale gradient) over quadratics, with 8 workers of 3 speeds.
"""

import argparse
import heapq
import json

import numpy as np
import pytest

from nbsgd_jax.host import events as events_lib

N, D, LR = 8, 3, 0.1
SPEED = np.array([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 5.0, 5.0])  # 3 speeds: s per computation


class Toy:
  """AD-PSGD's events on quadratics: ``n`` workers of ``speed`` on the graph ``neighbours``."""

  def __init__(self, speed, neighbours, seed=0):
    self.n, self.speed, self.nb, self.seed = len(speed), np.asarray(speed), neighbours, seed
    self.curve = np.linspace(0.5, 2.0, self.n)
    self.centre = np.arange(self.n * D, dtype=np.float64).reshape(self.n, D) / 7.0

  def duration(self, k):
    """Each worker's seconds for its own step k: its speed times a seeded jitter."""
    return self.speed * (1.0 + 0.25 * np.random.default_rng([self.seed, 7, k]).random(self.n))

  def partner(self, i, k):
    nb = self.nb[i]
    return nb[int(np.random.default_rng([self.seed, 3, i, k]).integers(len(nb)))]

  def touch(self, i, k):
    return (i, self.partner(i, k))

  def comm(self, i, k):
    return 0.05 * (1 + (i + k) % 3)

  def grad(self, i, x):
    return self.curve[i] * (x - self.centre[i])

  def reach(self, i):
    return (i,) + tuple(self.nb[i])

  def clock(self, reach=False):
    return events_lib.EventClock(self.n, self.duration, self.touch, self.comm,
                                 self.reach if reach else None)


def ring(n):
  return [((i - 1) % n, (i + 1) % n) for i in range(n)]


TOY = Toy(SPEED, ring(N))
TOYS = {"ring of 8, 3 speeds": TOY,
        "complete graph of 6": Toy([1.0, 1.5, 1.5, 3.0, 3.0, 4.0],
                                   [[j for j in range(6) if j != i] for i in range(6)], 1),
        "star of 7": Toy([2.0] + [1.0, 1.2, 1.4, 1.6, 1.8, 2.0],
                         [list(range(1, 7))] + [[0]] * 6, 2),
        "ring of 32, lognormal": Toy(np.random.default_rng(5).lognormal(0, 0.5, 32), ring(32), 3)}
duration, touch, comm = TOY.duration, TOY.touch, TOY.comm


def sequential(toy, keep):
  """The events of ``keep`` (a set of ``(worker, own step)``) applied one by one in time
  order: ``(x, [(time, worker, step, staleness)])``; a worker stops at its first event not
  in ``keep``."""
  n = toy.n
  x = np.zeros((n, D))
  g = np.array([toy.grad(i, x[i]) for i in range(n)])
  steps, changed = [0] * n, [0] * n  # changed: others' events on i since its read
  heap = [(toy.duration(0)[i], i) for i in range(n)]
  heapq.heapify(heap)
  order = []
  while heap:
    t, i = heapq.heappop(heap)
    k = steps[i]
    if (i, k) not in keep:
      continue
    j = toy.partner(i, k)
    order.append((t, i, k, changed[i]))
    avg = (x[i] + x[j]) / 2
    x[i], x[j] = avg - LR * g[i], avg
    changed[j] += 1
    changed[i] = 0
    g[i] = toy.grad(i, x[i])  # its next read
    steps[i] = k + 1
    heapq.heappush(heap, (t + toy.comm(i, k) + toy.duration(k + 1)[i], i))
  return x, order


def batched(toy, num_batches, reach=False):
  """The same toy stepped in the clock's batches with per-worker masks (as a device step
  would): ``(x, events in application order, batch sizes)``."""
  n, clock = toy.n, toy.clock(reach)
  x = np.zeros((n, D))
  g = np.array([toy.grad(i, x[i]) for i in range(n)])
  applied, sizes = [], []
  for _ in range(num_batches):
    batch = clock.next_batch()
    m = events_lib.batch_inputs(batch, n)
    avg = np.where(m["touched"][:, None], (x + x[m["peer"]]) / 2, x)
    x = avg - LR * m["fire"][:, None] * g
    g = np.where(m["fire"][:, None], np.array([toy.grad(i, x[i]) for i in range(n)]), g)
    applied += batch
    sizes.append(len(batch))
  return x, applied, sizes


@pytest.mark.parametrize("reach", [False, True], ids=["drawn ahead", "reach"])
@pytest.mark.parametrize("name", list(TOYS))
def test_batches_equal_the_sequential_event_loop(name, reach):
  toy = TOYS[name]
  x, applied, sizes = batched(toy, 40, reach)
  want_x, order = sequential(toy, {(e.worker, e.step) for e in applied})
  assert len(order) == len(applied) == sum(sizes)
  np.testing.assert_allclose(x, want_x, rtol=1e-12, atol=1e-12)
  by_event = {(e.worker, e.step): e for e in applied}
  for t, i, k, stale in order:  # the same times and staleness, event by event
    assert by_event[(i, k)].time == pytest.approx(t, rel=1e-12)
    assert by_event[(i, k)].staleness == stale
  assert max(e.staleness for e in applied) >= 1  # the slow workers' reads go stale
  if toy.n >= 8:
    assert np.mean(sizes) > 1.5  # commuting events do share a device step


def test_a_batch_s_events_touch_disjoint_workers_in_time_order():
  clock = TOY.clock()
  last = {}
  for _ in range(30):
    batch = clock.next_batch()
    workers = [j for e in batch for j in e.touched]
    assert len(workers) == len(set(workers))
    assert [e.time for e in batch] == sorted(e.time for e in batch)
    for e in batch:  # each worker's own events in order, one per step
      assert e.step == last.get(e.worker, -1) + 1 and e.time > e.start
      last[e.worker] = e.step


def test_a_limit_and_a_checkpoint_continue_the_same_events():
  a = TOY.clock()
  for _ in range(5):
    assert len(a.next_batch(limit=2)) <= 2
  b = TOY.clock()
  b.load_state_dict(a.state_dict())
  for _ in range(10):
    assert a.next_batch() == b.next_batch()
  assert a.now == b.now > 0


def test_without_conflicts_every_worker_fires_in_turn():
  """Workers that touch only themselves commute: the first batch holds all n, at the
  durations of their step 0."""
  clock = events_lib.EventClock(N, duration)
  batch = clock.next_batch()
  assert sorted(e.worker for e in batch) == list(range(N))
  np.testing.assert_allclose(sorted(e.time for e in batch), np.sort(duration(0)))


@pytest.mark.parametrize("bad", [lambda i, k: (i + 1) % N, lambda i, k: (i, N),
                                 lambda i, k: (i, i)])
def test_a_bad_touch_is_refused_by_name(bad):
  clock = events_lib.EventClock(N, duration, lambda i, k: tuple(np.atleast_1d(bad(i, k))))
  with pytest.raises(ValueError, match=r"touch\(\d+, 0\) = .* is not allowed"):
    clock.next_batch()


def test_an_event_that_touches_everyone_is_its_own_batch():
  """An event touching every worker commutes with nothing: one event a batch."""
  clock = events_lib.EventClock(N, duration, lambda i, k: (i,) + tuple(j for j in range(N)
                                                                       if j != i))
  assert [len(clock.next_batch()) for _ in range(10)] == [1] * 10


def test_equal_speeds_on_a_ring_batch_disjoint_pairs():
  """Eight equal workers on a ring finish together: the first batch takes the first event and
  every later one (by worker index) whose pair is disjoint from all pairs before it, applied
  or not, as a hand count of the seeded draws gives (five seeds)."""
  sizes = []
  for seed in range(5):
    toy = Toy(np.ones(N), ring(N), seed)
    clock = events_lib.EventClock(N, lambda k: np.ones(N), toy.touch)
    seen, expect = set(), []
    for i in range(N):
      pair = set(toy.touch(i, 0))
      if seen.isdisjoint(pair):
        expect.append(i)
      seen |= pair
    assert [e.worker for e in clock.next_batch()] == expect
    sizes.append(len(expect))
  assert max(sizes) >= 2



# The paper's staleness tau (Lian et al. 2018, ICML, "Asynchronous Decentralized Parallel SGD",
# Sec. 3 and Algorithm 1: x_hat_k = x_{k - tau_k}, k counting one update per event of any
# worker), counted here straight from its definition: for each event, the events of every
# worker strictly between the worker's read (its previous event, time 0 at first) and the
# event, in the order of (time, worker), over ALL events, applied or not.


def sequential_events(n, seconds, wait, until):
  """Every event ``(time, worker, own step)`` before time ``until``, in sequential order: a
  heap of finish times (ties by worker); worker i's computation k takes ``seconds(i, k)`` s,
  and after its event k it waits ``wait(i, k)`` s (its message) before computing again."""
  heap = [(seconds(i, 0), i, 0) for i in range(n)]
  heapq.heapify(heap)
  out = []
  while heap[0][0] < until:
    t, i, k = heapq.heappop(heap)
    out.append((t, i, k))
    heapq.heappush(heap, (t + wait(i, k) + seconds(i, k + 1), i, k + 1))
  return out


def tau_by_count(order, applied):
  """``([tau], [s from the read])`` of the events ``applied`` (``(worker, step)``): the events
  of ``order`` strictly between each one's read and itself, counted one by one."""
  when = {(i, k): t for t, i, k in order}
  taus, ages = [], []
  for i, k in applied:
    t, read = when[(i, k)], when.get((i, k - 1), 0.0)
    taus.append(sum((read, i) < (u, j) < (t, i) for u, j, _ in order))
    ages.append(t - read)
  return taus, ages


@pytest.mark.parametrize("reach", [False, True], ids=["drawn ahead", "reach"])
@pytest.mark.parametrize("name", list(TOYS))
def test_tau_equals_a_count_of_the_events_in_between(name, reach):
  """After every batch, the clock's tau (events, sum and max over the events applied so far)
  is the count over the sequential order, although the batches are not in time order (an
  event left out of a batch comes later than ones taken); each event's ``read`` is its
  worker's previous event's time."""
  toy = TOYS[name]
  clock, applied, keys = toy.clock(reach), [], []
  for _ in range(25):
    batch = clock.next_batch()
    applied += [(e.worker, e.step) for e in batch]
    keys += [(e.time, e.worker) for e in batch]
    order = sequential_events(toy.n, lambda i, k: toy.duration(k)[i], toy.comm,
                              max(keys)[0] + 1e-9)
    taus, ages = tau_by_count(order, applied)
    assert clock.tau() == (len(applied), sum(taus), max(taus))
  when = {(i, k): t for t, i, k in order}
  for e in batch:
    assert e.read == when.get((e.worker, e.step - 1), 0.0)
  if name != "star of 7":  # (the star's events all touch its centre: one a batch)
    assert keys != sorted(keys)  # applied out of time order: a counter would be wrong
  assert np.mean(taus) > 1  # every worker's events count, not the own model's changes


def test_a_checkpoint_continues_the_tau_count():
  a = TOY.clock()
  for _ in range(7):
    a.next_batch()
  b = TOY.clock()
  b.load_state_dict(json.loads(json.dumps(a.state_dict())))
  assert a.tau() == b.tau()
  for _ in range(7):
    assert a.next_batch() == b.next_batch()
  assert a.tau() == b.tau() and a.tau()[0] > 0


@pytest.mark.parametrize("algorithm, over, every", [
    ("ad_psgd", {}, 1), ("swarm_sgd", {"swarm_sgd.local_steps": 3}, 3)])
def test_a_ring_run_records_the_paper_s_tau(algorithm, over, every):
  """An 8-worker ring run (``tests/algorithms/test_asynchronous.py``'s least-squares set-up, 3 speeds)
  records ``staleness_tau`` (mean, max) equal to the count over a plain event loop that
  replays its cluster: worker i computes for ``batch * time_per_example * slowdown_i`` s; its
  event k exchanges with a neighbour (the peer ``draw_index(seed, i, k, 2)`` of its two, which
  does not move the times; every event for AD-PSGD, every ``local_steps``-th for SwarmSGD) and
  then sends one model (``latency + 4 d / bandwidth``) before computing again.
  ``staleness_s`` is the mean time from the read (the previous event) to the event; the
  own-model count is no larger than tau."""
  from nbsgd_jax import train
  from tests.helpers import least_squares_cfg
  DIM, M, TPE, LAT, BW = 4, 16, 1e-3, 1e-4, 1e6
  SLOW = (1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 5.0, 5.0)  # 3 speeds
  cfg = least_squares_cfg(n=len(SLOW), m=M, dim=DIM, lr=0.05, momentum=0.9,
                          weight_decay=1e-3, slowdown=SLOW, time_per_example=TPE, latency=LAT,
                          bandwidth=BW, num_steps=30, eval_every=30, algorithm=algorithm,
                          **over)
  stepper = train.Stepper.of(train.setup(cfg))
  stepper.steps(30)
  part = stepper.runs[0].host.part("clock")
  done, n = part.clock.steps, len(SLOW)
  applied = [(i, k) for i in range(n) for k in range(int(done[i]))]
  pairs = lambda i, k: (k + 1) % every == 0
  order = sequential_events(n, lambda i, k: M * TPE * SLOW[i],
                            lambda i, k: LAT + 4 * DIM / BW if pairs(i, k) else 0.0,
                            part.clock.now + 1e-9)
  taus, ages = tau_by_count(order, applied)
  rec = part.record()
  assert rec["events"] == len(applied) > 30
  assert rec["staleness_tau"] == pytest.approx(np.mean(taus), rel=1e-12)
  assert rec["staleness_tau_max"] == max(taus)
  assert rec["staleness_s"] == pytest.approx(np.mean(ages), rel=1e-9)
  assert rec["staleness_own_steps"] < rec["staleness_tau"] > n / 2
  assert rec["staleness_own_steps_max"] <= rec["staleness_tau_max"]


def test_the_straggler_grid_s_staleness_is_its_replay():
  """docs/nonblocking/asynchronous/results.json's tau for AD-PSGD in the reference cell (seed
  0) is what ``reproduce_nonblocking.py --replay_staleness`` replays from the run's event
  clock, and its mean is n - 1 less an end effect (a worker's reads cut its time into
  windows: its gradients' taus add up to the other workers' updates)."""
  import os
  from tests.helpers import ROOT, load_script
  nb = load_script("reproduce_nonblocking")
  with open(os.path.join(ROOT, "docs", "nonblocking", "asynchronous", "results.json")) as f:
    rows = json.load(f)["scenarios"]["main"]["cells"]
  r = next(r for r in rows if r["cell"] == nb.REFERENCE_CELL and r["variant"] == "AD-PSGD")
  a = argparse.Namespace(workers=16, model="mlp", topology="ring", steps=200, eval_every=20,
                         event_step_factor=20.0, nb_step_factor=5.0)
  keys = nb.ASYNCHRONOUS["AD-PSGD"][0]
  history = nb._replay(nb.make_config(a, r["algorithm"], r["lr"], r["seeds"][0], r["cell"],
                                      events=True, **keys), r["time"]["per_seed"][0])
  for key in nb.STALENESS:
    assert nb.staleness_of(history, key) == pytest.approx(r[key]["per_seed"][0], rel=1e-12)
  assert a.workers - 1.1 < r["staleness_tau"]["per_seed"][0] < a.workers - 1
  assert r["staleness_tau_max"]["per_seed"][0] > 2 * a.workers  # slow workers, stragglers


# ------------------------------------------------------------------ an event rule with state


def _walk_in_order(toy, seed, count):
  """The first ``count`` events of a token walk, one by one in time order, from the
  definition: the holder's event touches a neighbour drawn by ``draw_index(seed, i, k)``,
  which takes the token; another worker's event touches itself alone. ``[(time, worker, step,
  touched)]``."""
  holder, steps, out = 0, [0] * toy.n, []
  heap = [(toy.duration(0)[i], i) for i in range(toy.n)]
  heapq.heapify(heap)
  while len(out) < count:
    t, i = heapq.heappop(heap)
    k, touched = steps[i], (i,)
    if i == holder:
      nb = toy.nb[i]
      holder = nb[events_lib.draw_index(seed, i, k, len(nb))]
      touched = (i, holder)
    out.append((t, i, k, touched))
    steps[i] = k + 1
    heapq.heappush(heap, (t + toy.comm(i, k) + toy.duration(k + 1)[i], i))
  return out


def _token_clock(toy, seed):
  rule = events_lib.RandomWalkToken(lambda i: toy.nb[i], seed)
  return events_lib.EventClock(toy.n, toy.duration, rule, toy.comm)


@pytest.mark.parametrize("name", ["ring of 8, 3 speeds", "star of 7"])
def test_an_event_rule_with_state_runs_in_the_sequential_order(name):
  """A token walk depends on the events before it: the clock's batches, end to end, are the
  sequential order itself, each batch's events touch distinct workers, and most batches
  still hold several events."""
  toy = TOYS[name]
  clock, got, sizes = _token_clock(toy, 4), [], []
  while len(got) < 120:
    batch = clock.next_batch()
    workers = [j for e in batch for j in e.touched]
    assert len(workers) == len(set(workers))
    got += [(e.time, e.worker, e.step, e.touched) for e in batch]
    sizes.append(len(batch))
  want = _walk_in_order(toy, 4, len(got))
  assert [g[1:] for g in got] == [w[1:] for w in want]
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=1e-12)
  assert sum(len(g[3]) == 2 for g in got) >= 10  # the token moved
  assert np.mean(sizes) > 1.2


def test_an_event_rule_with_state_continues_from_a_checkpoint():
  """The token's holder and the drawn but not yet applied event travel in the clock's JSON
  state: a fresh clock and rule continue with the same events."""
  a = _token_clock(TOY, 9)
  for _ in range(7):
    a.next_batch()
  b = _token_clock(TOY, 9)
  b.load_state_dict(json.loads(json.dumps(a.state_dict())))
  for _ in range(15):
    assert a.next_batch() == b.next_batch()


# ------------------------------------------------ the scheduler against the plain heap loop


class PlainClock(events_lib.EventClock):
  """The scheduler as it was before issue 69's item 2, kept as the rule's plain statement: a
  heap of every worker's next event built for each batch, popped in time order (each worker's
  later events pushed as they are met) until every worker was met or everything is covered;
  the earliest pending event found by a scan of ``finish``. O(n log n) a batch."""

  def next_batch(self, limit=None):
    heap = [(float(self.finish[i]), i, int(self.steps[i])) for i in range(self.n)]
    heapq.heapify(heap)
    top = self.n + self.resources
    batch, covered = [], set()
    met, left = np.zeros(self.n, bool), self.n
    while left and (limit is None or len(batch) < limit) and len(covered) < top:
      t, i, k = heapq.heappop(heap)
      if not met[i]:
        met[i], left = True, left - 1
        touched = self._next_touched(i, k)
        if covered.isdisjoint(touched):
          batch.append(self._apply(t, i, touched))
        elif self._in_order:
          break
      elif self._in_order:
        break
      elif self._reach is not None:
        covered.update(self._reach_of(i))
        continue
      else:
        touched = self._touched(i, k)
      covered.update(touched)
      heapq.heappush(heap, (t + float(self._comm(i, k)) + self._seconds(i, k + 1), i, k + 1))
    j = int(np.argmin(self.finish))
    front, opened = (float(self.finish[j]), j), self._open
    while opened and opened[0] < front:
      i = heapq.heappop(opened)[1]
      tau = self.order - int(self.last_index[i]) - 1
      self.last_index[i], self.order = self.order, self.order + 1
      self.tau_events, self.tau_sum = self.tau_events + 1, self.tau_sum + tau
      self.tau_max = max(self.tau_max, tau)
    return batch


def plain_batch_inputs(batch, n):
  """``batch_inputs`` written per event, as it was before issue 69's item 2."""
  fire, touched, shared = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
  peer, staleness = np.arange(n, dtype=np.int32), np.zeros(n, np.int32)
  for e in batch:
    fire[e.worker] = True
    workers = [j for j in e.touched if j < n]
    touched[workers] = True
    shared[e.worker] = len(workers) < len(e.touched)
    staleness[e.worker] = e.staleness
    if len(workers) == 2:
      i, j = workers
      peer[i], peer[j] = j, i
  return {"fire": fire, "peer": peer, "touched": touched, "staleness": staleness,
          "shared": shared}


def random_cluster(seed):
  """A random cluster and event rule: ``(make, uses a limit)``, ``make(cls)`` a fresh clock of
  class ``cls``. Times on a 0.25 s grid (ties between workers are common), messages of 0 or
  0.25 s; rules: AD-PSGD's random pairing (drawn ahead, or with its reach: the worker and its
  neighbours), with passive workers and SwarmSGD's every-H pairing, a token walk (in order),
  asynchronous DiLoCo's server (a resource touched by pulls and pushes) and HALoS-like
  regional servers (a resource per region, several resources), with a reach that may be
  narrower than the touches (the rule is the plain loop's whatever the reach says)."""
  rng = np.random.default_rng(seed)
  n = int(rng.integers(2, 24))
  speed = rng.integers(1, 5, n)
  duration = lambda k: 0.25 * speed * np.random.default_rng([seed, k]).integers(1, 4, n)
  comm = lambda i, k: 0.25 * ((i * 3 + k) % 2) if seed % 3 else 0.0
  graph = [[j for j in range(n) if j != i and (rng.random() < 0.3 or abs(i - j) == 1)]
           for i in range(n)]
  kind = ["pairing", "pairing reach", "swarm reach", "token", "server", "regions",
          "narrow reach"][seed % 7]
  resources, reach, touch = 0, None, None
  if kind.startswith("pairing") or kind == "swarm reach":
    active = rng.random(n) < 0.7 if seed % 2 else None
    touch = events_lib.random_peer(lambda i: graph[i], seed, active,
                                   3 if kind == "swarm reach" else 1)
    if kind != "pairing":
      reach = lambda i: (i,) + tuple(graph[i])
  elif kind == "token":
    touch = lambda: events_lib.RandomWalkToken(lambda i: graph[i], seed)
  elif kind in ("server", "regions"):
    resources = 1 if kind == "server" else int(rng.integers(2, 4))
    cycle = rng.integers(2, 5, n)
    home = lambda i: n + i % resources
    touch = lambda i, k: (i, home(i)) if k % cycle[i] in (0, cycle[i] - 1) else (i,)
    reach = lambda i: (i, home(i))
  else:  # pairs, but later events cover the worker alone: narrower than its touches
    touch = events_lib.random_peer(lambda i: graph[i], seed)
    reach = lambda i: (i,)
  make = lambda cls: cls(n, duration, touch() if kind == "token" else touch, comm, reach,
                         resources)
  return make, bool(seed % 4 == 1)


@pytest.mark.parametrize("seed", range(21))
def test_the_scheduler_s_batches_are_the_plain_loop_s(seed):
  """Over random clusters and rules (:func:`random_cluster`), with a ``limit`` on some, the
  scheduler's batches, times, staleness, tau and state equal :class:`PlainClock`'s batch by
  batch, also after a checkpoint taken mid-run (JSON) is loaded into a fresh clock, which
  continues with the same batches; the device masks equal the per-event loop's."""
  make, limited = random_cluster(seed)
  new, plain = make(events_lib.EventClock), make(PlainClock)
  rng = np.random.default_rng(seed)
  for b in range(60):
    if b == 30:  # a checkpoint: a fresh clock (and rule) continues from the JSON state
      state = json.loads(json.dumps(new.state_dict()))
      new = make(events_lib.EventClock)
      new.load_state_dict(state)
    limit = int(rng.integers(1, 4)) if limited and rng.random() < 0.5 else None
    got, want = new.next_batch(limit), plain.next_batch(limit)
    assert got == want, (b, got, want)
    masks, plain_masks = events_lib.batch_inputs(got, new.n), plain_batch_inputs(want, new.n)
    for key in plain_masks:
      np.testing.assert_array_equal(masks[key], plain_masks[key])
    assert new.tau() == plain.tau() and new.now == plain.now
    for key in ("steps", "start", "finish", "version", "read", "last", "last_index"):
      np.testing.assert_array_equal(getattr(new, key), getattr(plain, key))
  assert new.order == plain.order > 0


@pytest.mark.parametrize("seed", [3, 4, 5, 12])
def test_the_persistent_heaps_rebuilt_at_every_change_keep_the_batches(seed):
  """The scheduler's heaps rebuilt without their stale entries whenever they change (the
  slack that bounds their memory made negative), over a long run: the batches stay the plain
  loop's."""
  make, _ = random_cluster(seed)
  new, plain = make(events_lib.EventClock), make(PlainClock)
  new._slack = -10 ** 9
  for _ in range(400):
    assert new.next_batch() == plain.next_batch()
  assert new.tau() == plain.tau()


def test_the_random_clusters_exercise_every_way():
  """:func:`random_cluster`'s cases: each rule's batches often hold several events, and often
  leave an event out (a conflict), so the equality above is not vacuous."""
  sizes, short = {}, {}
  for seed in range(21):
    make, _ = random_cluster(seed)
    clock = make(PlainClock)
    got = [len(clock.next_batch()) for _ in range(30)]
    kind = (clock._in_order, clock._reach is None, clock.resources)
    sizes.setdefault(kind, []).extend(got)
    short.setdefault(kind, []).append(min(got) < clock.n)
  assert len(sizes) >= 5
  for kind in sizes:
    assert np.mean(sizes[kind]) > 1.2 and any(short[kind]), kind


def test_a_checkpoint_of_the_plain_loop_continues_in_the_scheduler():
  """A checkpoint written before the scheduler (its ``pending`` draws for the workers met)
  continues with the plain loop's batches."""
  make, _ = random_cluster(8)  # a pairing with reach
  plain = make(PlainClock)
  for _ in range(10):
    plain.next_batch()
  new = make(events_lib.EventClock)
  new.load_state_dict(json.loads(json.dumps(plain.state_dict())))
  for _ in range(20):
    assert new.next_batch() == plain.next_batch()
  assert new.tau() == plain.tau()


def test_a_reach_outside_the_workers_and_resources_is_refused_by_name():
  clock = events_lib.EventClock(N, duration, touch, comm, lambda i: (i, N + 1))
  with pytest.raises(ValueError, match=r"reach\(\d+\) = .* is not allowed"):
    clock.next_batch()
