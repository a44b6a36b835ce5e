"""The event clock (``nbsgd_jax/host/events.py``) against a plain sequential event loop.

The reference below is written from the definition, not from the module: a heap of finish
times popped one event at a time (ties by worker index), each event applied at once, on a toy
of AD-PSGD (Lian et al. 2018, Algorithm 1: a worker's gradient is computed on its read of its
model; at its event it averages with a random neighbour, (x_i + x_j) / 2 for both, and applies
the stale gradient) over quadratics, with 8 workers of 3 speeds.
"""

import heapq

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
