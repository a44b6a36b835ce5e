"""The event clock of asynchronous training: each worker keeps its own simulated time, and an
event is a worker finishing its computation.

Worker i computes its ``k``-th update (its own step ``k``, counted from 0) for
``duration(k)[i]`` seconds (the cluster model: speeds and stragglers,
:func:`nbsgd_jax.host.cluster.minibatch_finish_times` of the worker's own step), starting when
its event ``k - 1`` ended (its read of the model). Its event ``k`` fires at the finish time,
touches the workers ``touch(i, k)`` (itself first, then, e.g., AD-PSGD's random neighbour), and
the worker starts computation ``k + 1`` ``comm(i, k)`` seconds later (the event's
communication). The sequential order is the order of the finish times, ties broken by worker
index; ``touch`` and ``comm`` must be functions of ``(i, k)`` alone (seeded draws), so the
order does not depend on how events are batched.

**Batches** (:meth:`EventClock.next_batch`): one device step applies a batch of events with
per-worker masks (:func:`batch_inputs`). Events are taken in time order; one joins the batch
when the workers it touches are disjoint from the *reach* of every worker whose event came
before it in the batch, taken or left out: ``reach(w)``, every worker an event of ``w`` may
touch (AD-PSGD: w and its neighbours), since w's later events, not drawn yet, may come before
it too. So an event of a batch commutes with every earlier event not in it (those of the
workers met before it, and their successors), no two events of a batch share a worker, and
applying the batch at once equals applying its events one by one in time order
(``tests/test_events.py`` holds it to a plain sequential event loop).

**Staleness** of an event's gradient: in steps, the changes to the worker's model (events of
others that touched it) between its read and its own event; in seconds, the time from its read
to its event (the gradient's age when applied).

The design follows the issue "Asynchronous decentralized training on the simulated clock"
(``docs/design.md``); the algorithms that use it (AD-PSGD, Lian et al. 2018, Algorithm 1;
SGP, Assran et al. 2019; SwarmSGD, Nadiradze et al. 2021; asynchronous DiLoCo, Liu et al.
2024) build their batches' device updates on these masks.
"""

from __future__ import annotations

import heapq
from typing import Callable, NamedTuple, Optional

import numpy as np


class Event(NamedTuple):
  """One worker finishing a computation.

  Attributes:
    time: s (simulated) when it finished: the event's time.
    worker: the worker i.
    step: the worker's own step k (computations it finished before this one).
    touched: the workers it touches, ``worker`` first (``touch(i, k)``).
    start: s when the computation started (its read of the model).
    staleness: changes to the worker's model by other workers' events between its read and
      this event.
  """

  time: float
  worker: int
  step: int
  touched: tuple
  start: float
  staleness: int


class EventClock:
  """The simulated times of ``n`` workers that do not step in lockstep (module docstring).

  Args:
    n: workers.
    duration: ``k -> float64 [n]``, every worker's seconds of computation for its own step
      ``k`` (each entry > 0; row i is read for worker i's step k only).
    touch: ``(i, k) -> tuple`` of the workers worker i's event k touches, ``i`` first
      (default: ``(i,)``).
    comm: ``(i, k) -> float``, s from worker i's event k to the start of its next computation
      (default 0).
    reach: ``i -> iterable``, every worker any event of worker i may touch (default: all
      workers when ``touch`` is given, else ``(i,)``): the smaller, the larger the batches.

  Raises:
    ValueError: ``n < 1``, or a ``touch`` that does not start with its worker or names a
      worker outside ``[0, n)`` (named, when drawn).
  """

  def __init__(self, n: int, duration: Callable[[int], np.ndarray],
               touch: Optional[Callable[[int, int], tuple]] = None,
               comm: Optional[Callable[[int, int], float]] = None,
               reach: Optional[Callable[[int], tuple]] = None):
    if n < 1:
      raise ValueError(f"n={n} is not allowed: at least one worker")
    self.n = n
    self._duration = duration
    self._touch = touch or (lambda i, k: (i,))
    self._comm = comm or (lambda i, k: 0.0)
    everyone = tuple(range(n))
    self._reach = reach or ((lambda i: everyone) if touch else (lambda i: (i,)))
    self._rows: dict = {}  # own step k -> duration(k), the latest few
    self.steps = np.zeros(n, np.int64)  # computations each worker finished
    self.start = np.zeros(n)  # s, when each worker's current computation started
    self.finish = np.array([self._seconds(i, 0) for i in range(n)])  # s, when it ends
    self.version = np.zeros(n, np.int64)  # changes to each worker's model so far
    self.read = np.zeros(n, np.int64)  # its version when its computation started
    self.now = 0.0  # s, the time of the last event applied

  def _seconds(self, i: int, k: int) -> float:
    if k not in self._rows:
      if len(self._rows) > 4 * self.n:
        self._rows.clear()
      self._rows[k] = np.asarray(self._duration(k), np.float64)
    return float(self._rows[k][i])

  def _touched(self, i: int, k: int) -> tuple:
    touched = tuple(int(j) for j in self._touch(i, k))
    if not touched or touched[0] != i or any(not 0 <= j < self.n for j in touched) \
        or len(set(touched)) != len(touched):
      raise ValueError(f"touch({i}, {k}) = {touched} is not allowed: distinct workers in "
                       f"[0, {self.n}), worker {i} first")
    return touched

  def next_batch(self, limit: Optional[int] = None) -> list[Event]:
    """The next batch of events (module docstring), in time order; each worker in it starts
    its next computation. ``limit``: at most this many events (None: as many as commute)."""
    heap = [(float(self.finish[i]), i) for i in range(self.n)]
    heapq.heapify(heap)
    batch, covered = [], set()  # the reach of the workers met so far
    while heap and (limit is None or len(batch) < limit) and len(covered) < self.n:
      t, i = heapq.heappop(heap)
      touched = self._touched(i, int(self.steps[i]))
      if covered.isdisjoint(touched):
        batch.append(self._apply(t, i, touched))
        heapq.heappush(heap, (float(self.finish[i]), i))  # its next event: i is covered
      covered.update(self._reach(i))  # its events, this one or later, may touch these
    return batch

  def _apply(self, t: float, i: int, touched: tuple) -> Event:
    """Worker i's event at ``t``: the versions and its next computation."""
    k = int(self.steps[i])
    event = Event(t, i, k, touched, float(self.start[i]),
                  int(self.version[i] - self.read[i]))
    self.version[list(touched)] += 1
    self.read[i] = self.version[i]
    self.steps[i] = k + 1
    self.start[i] = t + float(self._comm(i, k))
    self.finish[i] = self.start[i] + self._seconds(i, k + 1)
    self.now = max(self.now, t)
    return event

  def state_dict(self) -> dict:
    """JSON state (checkpoints: the events in flight are each worker's ``start`` and
    ``finish``)."""
    return {"steps": self.steps.tolist(), "start": self.start.tolist(),
            "finish": self.finish.tolist(), "version": self.version.tolist(),
            "read": self.read.tolist(), "now": self.now}

  def load_state_dict(self, d: dict) -> None:
    """Continue from :meth:`state_dict`'s output."""
    self.steps = np.asarray(d["steps"], np.int64)
    self.start = np.asarray(d["start"], np.float64)
    self.finish = np.asarray(d["finish"], np.float64)
    self.version = np.asarray(d["version"], np.int64)
    self.read = np.asarray(d["read"], np.int64)
    self.now = float(d["now"])


def batch_inputs(batch: list, n: int) -> dict:
  """A batch's per-worker masks for the device step (``HostInputs.per_worker``).

  Returns:
    ``{"fire": bool [n]`` (the worker's own event is in the batch), ``"peer": int32 [n]`` (for
    an event touching two workers, each one's other; else the worker itself),
    ``"touched": bool [n]``, ``"staleness": int32 [n]`` (the firing workers', else 0)``}``.
  """
  fire, touched = np.zeros(n, bool), np.zeros(n, bool)
  peer, staleness = np.arange(n, dtype=np.int32), np.zeros(n, np.int32)
  for e in batch:
    fire[e.worker] = True
    touched[list(e.touched)] = True
    staleness[e.worker] = e.staleness
    if len(e.touched) == 2:
      i, j = e.touched
      peer[i], peer[j] = j, i
  return {"fire": fire, "peer": peer, "touched": touched, "staleness": staleness}


__all__ = ["Event", "EventClock", "batch_inputs"]
