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
order does not depend on how events are batched, unless ``touch`` is an event rule with state
(``touch.in_order`` true, e.g. :class:`RandomWalkToken`, whose draw depends on the events
before it): then each batch is a prefix of the sequential order (it ends at the first event
that cannot join), ``touch`` is called once per event in the sequential order, and its
``state_dict`` / ``load_state_dict`` go into the clock's checkpoint.

**Batches** (:meth:`EventClock.next_batch`): one device step applies a batch of events with
per-worker masks (:func:`batch_inputs`). Events are taken in time order, each worker's
following events too (drawn ahead: ``touch`` and the times are functions of ``(i, k)``); one
joins the batch when no event before it in time, taken or left out, touches a worker it
touches, and no event of its worker was left out. So an event of a batch commutes with every
earlier event not in it, no two events of a batch share a worker, and applying the batch at
once equals applying its events one by one in time order
(``tests/host/test_events.py`` holds it to a plain sequential event loop).

**Staleness** of an event's gradient, whose worker read its model at its previous event (or
at time 0), three ways:

* ``tau`` (:meth:`EventClock.tau`): the events of *every* worker strictly between the read and
  the event in the sequential order. It is AD-PSGD's tau_k (Lian et al. 2018, ICML,
  "Asynchronous Decentralized Parallel SGD", Sec. 3 and Algorithm 1: the update of global
  iteration k uses x_hat_k = x_{k - tau_k}, k counting one update per event of any worker):
  a worker read x_{m + 1}, the models right after its previous event m, and its event is
  iteration k, so tau_k = k - m - 1. With n workers of equal speed it is about n - 1.
* own steps (``Event.staleness``): the changes to the worker's *own* model (events of others
  that touched it) between its read and its event; at most tau.
* seconds (``Event.time - Event.read``): the gradient's age when applied, from the read.

Batches are not in global time order (an event left out of a batch may be earlier than one
taken), so tau is not a counter in application order; :meth:`EventClock.tau` says how it is
counted.

The design follows the issue "Asynchronous decentralized training on the simulated clock"
(``docs/design.md``); the algorithms that use it (AD-PSGD, Lian et al. 2018, Algorithm 1;
SGP, Assran et al. 2019; SwarmSGD, Nadiradze et al. 2021; asynchronous DiLoCo, Liu et al.
2024) build their batches' device updates on these masks.
"""

from __future__ import annotations

import heapq
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np


class Event(NamedTuple):
  """One worker finishing a computation.

  Attributes:
    time: s (simulated) when it finished: the event's time.
    worker: the worker i.
    step: the worker's own step k (computations it finished before this one).
    touched: the workers it touches, ``worker`` first (``touch(i, k)``).
    start: s when the computation started (its previous event plus that event's message).
    staleness: the own-model count: changes to the worker's model by other workers' events
      between its read and this event (module docstring).
    read: s, when the worker read the model it computed on: its previous event, 0 at first.
  """

  time: float
  worker: int
  step: int
  touched: tuple
  start: float
  staleness: int
  read: float = 0.0


class EventClock:
  """The simulated times of ``n`` workers that do not step in lockstep (module docstring).

  Args:
    n: workers.
    duration: ``k -> float64 [n]``, every worker's seconds of computation for its own step
      ``k`` (each entry > 0; row i is read for worker i's step k only).
    touch: ``(i, k) -> tuple`` of the workers worker i's event k touches, ``i`` first
      (default: ``(i,)``); a function of ``(i, k)`` alone, or an event rule with state
      (``in_order = True``; module docstring).
    comm: ``(i, k) -> float``, s from worker i's event k to the start of its next computation
      (default 0).
    resources: shared objects an event may touch besides workers, named ``n .. n + resources
      - 1`` in ``touch`` (asynchronous DiLoCo's server: its pushes and pulls touch it, so no
      two of them share a batch).
    reach: ``i -> workers`` any event of worker i may touch, or None. Given, a worker's events
      after the first one a batch meets count as touching all of its reach (no look-ahead:
      a faster host, batches a little smaller); None: they are drawn ahead (module docstring).

  Raises:
    ValueError: ``n < 1``, or a ``touch`` that does not start with its worker or names an
      index outside ``[0, n + resources)`` (named, when drawn).
  """

  def __init__(self, n: int, duration: Callable[[int], np.ndarray],
               touch: Optional[Callable[[int, int], tuple]] = None,
               comm: Optional[Callable[[int, int], float]] = None,
               reach: Optional[Callable[[int], Sequence[int]]] = None, resources: int = 0):
    if n < 1:
      raise ValueError(f"n={n} is not allowed: at least one worker")
    self.n, self.resources = n, int(resources)
    self._duration = duration
    self._touch = touch or (lambda i, k: (i,))
    self._in_order = bool(getattr(touch, "in_order", False))
    self._comm = comm or (lambda i, k: 0.0)
    self._reach = reach
    self._pending: dict = {}  # worker -> (its next own step, the workers that event touches)
    self._reaches: dict = {}  # worker -> reach(worker)
    self._rows: dict = {}  # own step k -> duration(k), the latest few
    self.steps = np.zeros(n, np.int64)  # computations each worker finished
    self.start = np.zeros(n)  # s, when each worker's current computation started
    self.finish = np.array([self._seconds(i, 0) for i in range(n)])  # s, when it ends
    self.version = np.zeros(n + self.resources, np.int64)  # changes to each model so far
    self.read = np.zeros(n, np.int64)  # its version when its computation started
    self.last = np.zeros(n)  # s, each worker's last event (its read), 0 at first
    self.now = 0.0  # s, the time of the last event applied
    self._open: list = []  # heap of (time, worker): events applied, their tau not yet final
    self.order = 0  # events whose tau is final: they are the sequential order's first ones
    self.last_index = np.full(n, -1, np.int64)  # each worker's last final event's index
    self.tau_events, self.tau_sum, self.tau_max = 0, 0, 0  # over the final events

  def _seconds(self, i: int, k: int) -> float:
    if k not in self._rows:
      if len(self._rows) > 4 * self.n:
        self._rows.clear()
      self._rows[k] = np.asarray(self._duration(k), np.float64)
    return float(self._rows[k][i])

  def _touched(self, i: int, k: int) -> tuple:
    touched = tuple(int(j) for j in self._touch(i, k))
    top = self.n + self.resources
    if not touched or touched[0] != i or any(not 0 <= j < top for j in touched) \
        or len(set(touched)) != len(touched):
      raise ValueError(f"touch({i}, {k}) = {touched} is not allowed: distinct workers or "
                       f"resources in [0, {top}), worker {i} first")
    return touched

  def next_batch(self, limit: Optional[int] = None) -> list[Event]:
    """The next batch of events (module docstring), in time order; each worker in it starts
    its next computation. ``limit``: at most this many events (None: as many as commute)."""
    heap = [(float(self.finish[i]), i, int(self.steps[i])) for i in range(self.n)]
    heapq.heapify(heap)
    top = self.n + self.resources
    batch, covered = [], set()  # the workers of every event met so far, taken or not
    met, left = np.zeros(self.n, bool), self.n  # workers whose next event was met
    while left and (limit is None or len(batch) < limit) and len(covered) < top:
      t, i, k = heapq.heappop(heap)
      if not met[i]:  # its next event: taken if it commutes, else it and its later ones wait
        met[i], left = True, left - 1
        touched = self._next_touched(i, k)
        if covered.isdisjoint(touched):
          batch.append(self._apply(t, i, touched))
        elif self._in_order:  # a prefix of the sequential order: nothing after it is drawn
          break
      elif self._in_order:
        break
      elif self._reach is not None:  # its later events: within its reach, not drawn ahead
        covered.update(self._reach_of(i))
        continue
      else:
        touched = self._touched(i, k)
      covered.update(touched)
      heapq.heappush(heap, (t + float(self._comm(i, k)) + self._seconds(i, k + 1), i, k + 1))
    self._finalise()
    return batch

  def _finalise(self) -> None:
    """Numbers, in the sequential order, the applied events before the earliest pending one
    (no event still to come can precede them), and counts their tau (:meth:`tau`)."""
    j = int(np.argmin(self.finish))
    front, opened = (float(self.finish[j]), j), self._open
    while opened and opened[0] < front:
      i = heapq.heappop(opened)[1]
      tau = self.order - int(self.last_index[i]) - 1
      self.last_index[i], self.order = self.order, self.order + 1
      self.tau_events, self.tau_sum = self.tau_events + 1, self.tau_sum + tau
      self.tau_max = max(self.tau_max, tau)

  def tau(self) -> tuple:
    """``(events, sum, max)`` of tau over every event applied so far (module docstring).

    Counted by finalising, not at application: after each batch, every applied event before
    the earliest pending event (time, ties by worker) is final, since each worker's later
    events come after its pending one; final events are numbered in the sequential order
    (0, 1, ...), and an event numbered g whose worker's previous event is numbered g' (-1 for
    the read at time 0) has tau = g - g' - 1. That is O(log n) an event (a heap push and pop),
    where counting at application the events of every other worker inside the event's window
    would cost O(n) an event (the host scheduler's speed is benchmarked,
    ``benchmarks/events.py``). The applied events after that frontier (a few per worker) are
    numbered here, on a copy, with the events not yet applied that precede them drawn ahead
    (times and ``comm`` are functions of ``(i, k)``); this is done on each call (a record).
    """
    if not self._open:
      return self.tau_events, self.tau_sum, self.tau_max
    end, keys = max(self._open), [(t, i, True) for t, i in self._open]
    for j in range(self.n):  # the pending events of each worker before the last applied one
      t, k = float(self.finish[j]), int(self.steps[j])
      while (t, j) < end:
        keys.append((t, j, False))
        t, k = t + float(self._comm(j, k)) + self._seconds(j, k + 1), k + 1
    order, last = self.order, dict(enumerate(self.last_index.tolist()))
    events, total, top = self.tau_events, self.tau_sum, self.tau_max
    for _, i, applied in sorted(keys):
      if applied:
        tau = order - last[i] - 1
        events, total, top = events + 1, total + tau, max(top, tau)
      last[i], order = order, order + 1
    return events, total, top

  def drawn(self, i: int, k: int) -> tuple:
    """What worker i's event k touches, as drawn for its batch (an event rule with state is
    not asked twice); for ``comm`` callbacks that depend on it."""
    kept = self._pending.get(i)
    return kept[1] if kept is not None and kept[0] == k else self._touched(i, k)

  def _next_touched(self, i: int, k: int) -> tuple:
    """:meth:`_touched`, kept for each worker's pending event (met again in later batches)."""
    kept = self._pending.get(i)
    if kept is None or kept[0] != k:
      kept = self._pending[i] = (k, self._touched(i, k))
    return kept[1]

  def _reach_of(self, i: int) -> tuple:
    if i not in self._reaches:
      self._reaches[i] = tuple(int(j) for j in self._reach(i))
    return self._reaches[i]

  def _apply(self, t: float, i: int, touched: tuple) -> Event:
    """Worker i's event at ``t``: the versions and its next computation."""
    k = int(self.steps[i])
    event = Event(t, i, k, touched, float(self.start[i]),
                  int(self.version[i] - self.read[i]), float(self.last[i]))
    heapq.heappush(self._open, (t, i))
    self.last[i] = t
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
            "read": self.read.tolist(), "now": self.now, "last": self.last.tolist(),
            "open": [list(e) for e in self._open], "order": self.order,
            "last_index": self.last_index.tolist(),
            "tau": [self.tau_events, self.tau_sum, self.tau_max],
            "pending": [[i, k, list(t)] for i, (k, t) in self._pending.items()],
            **({"rule": self._touch.state_dict()} if hasattr(self._touch, "state_dict") else {})}

  def load_state_dict(self, d: dict) -> None:
    """Continue from :meth:`state_dict`'s output."""
    self.steps = np.asarray(d["steps"], np.int64)
    self.start = np.asarray(d["start"], np.float64)
    self.finish = np.asarray(d["finish"], np.float64)
    self.version = np.asarray(d["version"], np.int64)
    self.read = np.asarray(d["read"], np.int64)
    self.now = float(d["now"])
    if "tau" in d:  # else a checkpoint from before the paper's tau: the count restarts here
      # (each worker's first tau after it counts only the events since), reads at 0
      self.last = np.asarray(d["last"], np.float64)
      self._open = [(float(t), int(i)) for t, i in d["open"]]
      heapq.heapify(self._open)
      self.order, self.last_index = int(d["order"]), np.asarray(d["last_index"], np.int64)
      self.tau_events, self.tau_sum, self.tau_max = (int(v) for v in d["tau"])
    self._pending = {int(i): (int(k), tuple(int(j) for j in t))
                     for i, k, t in d.get("pending", ())}
    if "rule" in d:
      self._touch.load_state_dict(d["rule"])


def batch_inputs(batch: list, n: int) -> dict:
  """A batch's per-worker masks, from which the event clocks write the device step's
  :class:`~nbsgd_jax.transforms.asynchronous.Events` (``HostInputs.events``).

  Returns:
    ``{"fire": bool [n]`` (the worker's own event is in the batch), ``"peer": int32 [n]`` (for
    an event touching two workers, each one's other; else the worker itself),
    ``"touched": bool [n]``, ``"staleness": int32 [n]`` (the firing workers', else 0),
    ``"shared": bool [n]`` (the worker's event touches a resource)``}``.
  """
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


_MASK = (1 << 64) - 1


def draw_index(seed: int, i: int, k: int, m: int) -> int:
  """A uniform index in ``[0, m)`` from ``(seed, i, k)`` alone: splitmix64 (Steele, Lea,
  Flood, OOPSLA 2014) of the three, 0.3 us in Python against 20 us for a seeded numpy
  generator (the event clock draws one per event it meets)."""
  z = (seed * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9 + k * 0x94D049BB133111EB + 1) & _MASK
  for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
    z = ((z ^ (z >> shift)) * mult) & _MASK
  return ((z ^ (z >> 31)) * m) >> 64


def random_peer(neighbours: Callable[[int], Sequence[int]], seed: int,
                active: Optional[np.ndarray] = None, every: int = 1) -> Callable[[int, int], tuple]:
  """A random pairing as an event clock's ``touch``: worker i's event k averages with a
  neighbour drawn uniformly (AD-PSGD, Lian et al. 2018, Algorithm 1, line 2) by
  :func:`draw_index` of ``(seed, i, k)`` (the same draw however events are batched).

  Args:
    neighbours: ``i -> its neighbours``.
    seed: the draws' seed.
    active: bool ``[n]`` or None: only active workers initiate (the reference's bipartite
      active / passive roles, stochastic_gradient_push ``gossip/ad_psgd.py``); a passive
      worker's event touches itself alone.
    every: only every ``every``-th event of a worker pairs (events ``k`` with ``(k + 1) %
      every == 0``: SwarmSGD's H local steps between interactions); >= 1.
  """
  table, last = {}, {}  # worker -> its neighbours; worker -> (k, its last draw)

  def touch(i: int, k: int) -> tuple:
    if i not in table:
      table[i] = tuple(int(j) for j in neighbours(i))
    if last.get(i, (None,))[0] == k:
      return last[i][1]
    nb = table[i]
    if not nb or (active is not None and not active[i]) or (k + 1) % every:
      out = (i,)
    else:
      out = (i, nb[draw_index(seed, i, k, len(nb))])
    last[i] = (k, out)
    return out

  return touch


class RandomWalkToken:
  """An event rule with state: a token walks the graph. The holder's event touches
  ``(i, j)``, ``j`` a neighbour drawn uniformly by :func:`draw_index` of ``(seed, i, k)``, and
  hands the token to ``j``; any other worker's event touches itself alone. Where the token is
  depends on the events before, so the clock runs it in order (``in_order``). The pattern of
  random-walk methods, where one model or message travels a random walk over the workers
  (e.g. Walkman, Mao, Yu, Yin et al., IEEE Trans. Signal Process. 2020).

  Args:
    neighbours: ``i -> its neighbours``.
    seed: the draws' seed.
    holder: the worker that holds the token first.
  """

  in_order = True

  def __init__(self, neighbours: Callable[[int], Sequence[int]], seed: int, holder: int = 0):
    self.neighbours, self.seed, self.holder = neighbours, int(seed), int(holder)
    self._last: dict = {}  # worker -> (k, its last draw): a repeated (i, k) is not a new draw

  def __call__(self, i: int, k: int) -> tuple:
    if self._last.get(i, (None,))[0] == k:
      return self._last[i][1]
    nb = tuple(int(j) for j in self.neighbours(i))
    out = (i,)
    if i == self.holder and nb:
      out = (i, nb[draw_index(self.seed, i, k, len(nb))])
      self.holder = out[1]
    self._last[i] = (k, out)
    return out

  def state_dict(self) -> dict:
    return {"holder": self.holder, "last": [[i, k, list(t)] for i, (k, t) in self._last.items()]}

  def load_state_dict(self, d: dict) -> None:
    self.holder = int(d["holder"])
    self._last = {int(i): (int(k), tuple(t)) for i, k, t in d["last"]}


__all__ = ["Event", "EventClock", "RandomWalkToken", "batch_inputs", "draw_index", "random_peer"]
