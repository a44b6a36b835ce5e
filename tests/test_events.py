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
RING = [((i - 1) % N, (i + 1) % N) for i in range(N)]
CURVE = np.linspace(0.5, 2.0, N)
CENTRE = np.arange(N * D, dtype=np.float64).reshape(N, D) / 7.0


def duration(k):
  """Each worker's seconds for its own step k: its speed times a seeded jitter."""
  return SPEED * (1.0 + 0.25 * np.random.default_rng([7, k]).random(N))


def partner(i, k):
  return RING[i][int(np.random.default_rng([3, i, k]).integers(2))]


def touch(i, k):
  return (i, partner(i, k))


def reach(i):
  return (i,) + RING[i]


def comm(i, k):
  return 0.05 * (1 + (i + k) % 3)


def grad(i, x):
  return CURVE[i] * (x - CENTRE[i])


def sequential(keep):
  """The events of ``keep`` (a set of ``(worker, own step)``) applied one by one in time
  order: ``(x, [(time, worker, step, staleness)])``; a worker stops at its first event not
  in ``keep``."""
  x = np.zeros((N, D))
  g = np.array([grad(i, x[i]) for i in range(N)])
  steps, changed = [0] * N, [0] * N  # changed: others' events on i since its read
  heap = [(duration(0)[i], i) for i in range(N)]
  heapq.heapify(heap)
  order = []
  while heap:
    t, i = heapq.heappop(heap)
    k = steps[i]
    if (i, k) not in keep:
      continue
    j = partner(i, k)
    order.append((t, i, k, changed[i]))
    avg = (x[i] + x[j]) / 2
    x[i], x[j] = avg - LR * g[i], avg
    changed[j] += 1
    changed[i] = 0
    g[i] = grad(i, x[i])  # its next read
    steps[i] = k + 1
    heapq.heappush(heap, (t + comm(i, k) + duration(k + 1)[i], i))
  return x, order


def batched(num_batches):
  """The same toy stepped in the clock's batches with per-worker masks (as a device step
  would): ``(x, events in application order, batch sizes)``."""
  clock = events_lib.EventClock(N, duration, touch, comm, reach)
  x = np.zeros((N, D))
  g = np.array([grad(i, x[i]) for i in range(N)])
  applied, sizes = [], []
  for _ in range(num_batches):
    batch = clock.next_batch()
    m = events_lib.batch_inputs(batch, N)
    avg = np.where(m["touched"][:, None], (x + x[m["peer"]]) / 2, x)
    x = avg - LR * m["fire"][:, None] * g
    g = np.where(m["fire"][:, None], np.array([grad(i, x[i]) for i in range(N)]), g)
    applied += batch
    sizes.append(len(batch))
  return x, applied, sizes


def test_batches_equal_the_sequential_event_loop():
  x, applied, sizes = batched(40)
  want_x, order = sequential({(e.worker, e.step) for e in applied})
  assert len(order) == len(applied) == sum(sizes)
  np.testing.assert_allclose(x, want_x, rtol=1e-12, atol=1e-12)
  by_event = {(e.worker, e.step): e for e in applied}
  for t, i, k, stale in order:  # the same times and staleness, event by event
    assert by_event[(i, k)].time == pytest.approx(t, rel=1e-12)
    assert by_event[(i, k)].staleness == stale
  assert np.mean(sizes) > 1.5  # commuting events do share a device step
  assert max(e.staleness for e in applied) >= 1  # the slow workers' reads go stale


def test_a_batch_s_events_touch_disjoint_workers_in_time_order():
  clock = events_lib.EventClock(N, duration, touch, comm, reach)
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
  a = events_lib.EventClock(N, duration, touch, comm, reach)
  for _ in range(5):
    assert len(a.next_batch(limit=2)) <= 2
  b = events_lib.EventClock(N, duration, touch, comm, reach)
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


def test_without_a_reach_every_event_is_its_own_batch():
  """``touch`` given without ``reach``: any worker may be touched, so nothing commutes."""
  clock = events_lib.EventClock(N, duration, touch, comm)
  assert [len(clock.next_batch()) for _ in range(10)] == [1] * 10
