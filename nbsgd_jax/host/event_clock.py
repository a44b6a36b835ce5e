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
(``tests/host/test_events.py`` holds it to a plain sequential event loop). With ``reach``
(every algorithm of the package) the scheduler finds a batch from a persistent index of each
worker's and resource's first events, in O(log n) an event and without visiting every worker
(:meth:`EventClock.next_batch`; the same batches as the plain heap loop,
``tests/host/test_events.py``; its speed, ``benchmarks/event_scheduler.py``).

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

The algorithms on it (AD-PSGD, Lian et al. 2018, Alg. 1; SwarmSGD, Nadiradze et al. 2021;
asynchronous DiLoCo, Liu et al. 2024; HALoS) build their device updates on these masks.
"""

from __future__ import annotations

import heapq
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from nbsgd_jax.host.event_rules import (  # noqa: F401 (re-exported: the clock's touch rules)
    RandomWalkToken, draw_index, random_peer)


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
    outages: the workers' failures (:class:`nbsgd_jax.host.outages.Outages`), or None: a
      computation a failure interrupts is lost and starts again after the repair, so the
      worker's event moves (the others' do not: ``touch`` and ``comm`` do not see them).

  Raises:
    ValueError: ``n < 1``, or a ``touch`` that does not start with its worker or names an
      index outside ``[0, n + resources)``, or a ``reach`` that names one (named, when
      drawn).
  """

  _slack = 64  # a persistent heap is rebuilt, its stale entries out, past 4 x its live + this

  def __init__(self, n: int, duration: Callable[[int], np.ndarray],
               touch: Optional[Callable[[int, int], tuple]] = None,
               comm: Optional[Callable[[int, int], float]] = None,
               reach: Optional[Callable[[int], Sequence[int]]] = None, resources: int = 0,
               outages=None):
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
    self.outages = outages  # failures: a computation through them (host/outages.py)
    self.finish = np.array([self._end(i, 0, 0.0) for i in range(n)])  # s, when it ends
    self.version = np.zeros(n + self.resources, np.int64)  # changes to each model so far
    self.read = np.zeros(n, np.int64)  # its version when its computation started
    self.last = np.zeros(n)  # s, each worker's last event (its read), 0 at first
    self.now = 0.0  # s, the time of the last event applied
    self._open: list = []  # heap of (time, worker): events applied, their tau not yet final
    self.order = 0  # events whose tau is final: they are the sequential order's first ones
    self.last_index = np.full(n, -1, np.int64)  # each worker's last final event's index
    self.tau_events, self.tau_sum, self.tau_max = 0, 0, 0  # over the final events
    self._unindex()

  def _unindex(self) -> None:
    """Drops the scheduler's persistent structures (rebuilt from the state on first use):
    ``_k`` (each worker's own step, a list: an entry is stale when its step is not the
    worker's), ``_front`` (:meth:`_fronts`) and the reach index (:meth:`_batch_reach`)."""
    self._k = self.steps.tolist()
    self._front: Optional[list] = None
    self._cover: Optional[list] = None  # object -> heap of (time, worker, step, 0 or 1)
    self._valid: list = []  # object -> its heap's entries of current steps
    self._cand: set = set()  # workers whose next event may be free
    self._ahead: dict = {}  # worker -> (step, comm, finish of the next): _enter's sums

  def seconds(self, i: int, k: int) -> float:
    """s of worker i's computation of its own step k (``duration(k)[i]``)."""
    return self._seconds(i, k)

  def _end(self, i: int, k: int, start: float) -> float:
    """s when worker i's computation of its step k, due to start at ``start``, ends: through
    its failures with ``outages`` (:meth:`nbsgd_jax.host.outages.Outages.run`)."""
    seconds = self._seconds(i, k)
    if self.outages is None:
      return start + seconds
    return self.outages.run(i, start, seconds)[1]

  def _seconds(self, i: int, k: int) -> float:
    if k not in self._rows:
      if len(self._rows) > 4 * self.n:
        self._rows.clear()
      self._rows[k] = np.asarray(self._duration(k), np.float64)
    return float(self._rows[k][i])

  def _touched(self, i: int, k: int) -> tuple:
    touched = tuple(map(int, self._touch(i, k)))
    top = self.n + self.resources
    if touched == (i,):  # the common cases first: one event in two touches its worker alone
      return touched
    if not touched or touched[0] != i or min(touched) < 0 or max(touched) >= top \
        or len(set(touched)) != len(touched):
      raise ValueError(f"touch({i}, {k}) = {touched} is not allowed: distinct workers or "
                       f"resources in [0, {top}), worker {i} first")
    return touched

  def next_batch(self, limit: Optional[int] = None) -> list[Event]:
    """The next batch of events (module docstring), in time order; each worker in it starts
    its next computation. ``limit``: at most this many events (None: as many as commute).

    Cost, in events (the scheduler is the host's share of a step: ``benchmarks/
    event_scheduler.py``): with ``reach``, O((E + F) (t + r) log n) a batch, E the events taken,
    F the events freed or re-checked (the first event of an object that changed), t and r
    the sizes of ``touch`` and ``reach``, from a persistent index (:meth:`_batch_reach`); an
    event rule with state, O(E log n) (a persistent heap of the workers' next events, popped
    up to the first event that cannot join); without ``reach`` (drawn ahead), O(n log n + D)
    a batch, D the events drawn ahead (every worker is visited: :meth:`_batch_drawn`).
    """
    if self._in_order:
      batch = self._batch_in_order(limit)
    elif self._reach is None:
      batch = self._batch_drawn(limit)
    else:
      batch = self._batch_reach(limit)
    self._finalise()
    return batch

  def _batch_drawn(self, limit: Optional[int]) -> list[Event]:
    """The rule as it reads, events drawn ahead: a heap of every worker's next event, popped
    in time order, each worker's later events pushed as they are met, until every worker's
    next event was met or every worker and resource is covered (the plain rule, the
    reference of the other two ways: ``tests/host/test_events.py``)."""
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
      else:
        touched = self._touched(i, k)
      covered.update(touched)
      heapq.heappush(heap, (self._end(i, k + 1, t + float(self._comm(i, k))), i, k + 1))
    return batch

  def _batch_in_order(self, limit: Optional[int]) -> list[Event]:
    """An event rule with state: the longest prefix of the sequential order whose events
    touch distinct workers and resources, popped from the persistent heap of the workers'
    next events (:meth:`_fronts`); it ends at the first event that does not commute or whose
    worker is already in the batch (its later event), which stays, drawn, for the next."""
    heap, top, now = self._fronts(), self.n + self.resources, self._k
    batch, covered, met = [], set(), set()
    while len(met) < self.n and (limit is None or len(batch) < limit) and len(covered) < top:
      t, i, k = heap[0]
      if now[i] != k:  # a worker's entry from before its last event
        heapq.heappop(heap)
        continue
      if i in met:  # the later event of a worker in the batch: the prefix ends
        break
      met.add(i)
      touched = self._next_touched(i, k)
      if not covered.isdisjoint(touched):
        break
      heapq.heappop(heap)
      batch.append(self._apply(t, i, touched))
      covered.update(touched)
    return batch

  def _batch_reach(self, limit: Optional[int]) -> list[Event]:
    """The batch of :meth:`_batch_drawn`'s rule with ``reach``, from a persistent index.

    With ``reach``, the events met before worker i's next event P_i are every other worker
    j's next event P_j (it covers what it touches, T_j) and its following one Q_j (it covers
    ``reach(j)``: j's later events add nothing more); the rule takes P_i iff none of them
    before P_i covers a member of T_i (the stops of the heap loop, every worker met or
    everything covered, change nothing: the first leaves no event, the second no event that
    commutes). So each object x (a worker or a resource) keeps a heap of the (time, worker)
    of the P_j that touch it and the Q_j whose reach holds it (stale entries, of a worker's
    earlier step, dropped when they surface), and P_i is taken iff it heads the heap of
    every member of T_i. Only a heap whose head changed can free an event: after a batch,
    the heads of the heaps its events' entries left or entered are the candidates of the
    next (with the free events a ``limit`` left out), each checked in O(t log n).
    """
    if self._cover is None:
      self._index()
    cover, valid, now, finish, pending = self._cover, self._valid, self._k, self.finish, \
        self._pending
    free = []
    for i in self._cand:
      for x in pending[i][1]:
        h = cover[x]
        while now[h[0][1]] != h[0][2]:  # (stale entries off; P_i keeps the heap non-empty)
          heapq.heappop(h)
        if h[0][1] != i:  # (P_i heads x's heap if i does: it precedes Q_i)
          break
      else:
        free.append((float(finish[i]), i))
    free.sort()
    take = free if limit is None else free[:limit]
    self._cand = {i for _, i in free[len(take):]}
    batch, changed = [], set()
    for t, i in take:
      touched = self._pending[i][1]
      batch.append(self._apply(t, i, touched))
      reach = self._reach_of(i)
      for x in touched:  # its entries of this step are stale now
        valid[x] -= 1
      for x in reach:
        valid[x] -= x != i
      changed.update(touched)
      changed.update(reach)
      self._enter(i)
      changed.update(self._pending[i][1])
    cand = self._cand
    for x in changed:
      h = cover[x]
      while h and now[h[0][1]] != h[0][2]:
        heapq.heappop(h)
      if h and h[0][3] == 0:  # a worker's next event heads x's heap: it may be free
        cand.add(h[0][1])
      if len(h) > 4 * valid[x] + self._slack:  # stale entries that did not surface yet
        h[:] = [e for e in h if now[e[1]] == e[2]]
        heapq.heapify(h)
    return batch

  def _index(self) -> None:
    """:meth:`_batch_reach`'s index from the clock's state: every worker's entries, every
    worker a candidate."""
    self._cover = [[] for _ in range(self.n + self.resources)]
    self._valid = [0] * (self.n + self.resources)
    for j in range(self.n):
      self._enter(j)
    self._cand = set(range(self.n))

  def _enter(self, j: int) -> None:
    """Worker j's entries for its next event P_j (the objects it touches, drawn) and the
    one after it, Q_j (its reach), at the times the heap loop would meet them."""
    k, t = self._k[j], float(self.finish[j])
    touched = self._next_touched(j, k)
    comm = float(self._comm(j, k))
    q = self._end(j, k + 1, t + comm)
    self._ahead[j] = (k, comm, q)  # for _apply: its message and next finish
    cover, valid = self._cover, self._valid
    for x in touched:
      heapq.heappush(cover[x], (t, j, k, 0))
      valid[x] += 1
    for x in self._reach_of(j):
      if x != j:  # (in j's own heap P_j, always there, precedes Q_j)
        heapq.heappush(cover[x], (q, j, k, 1))
        valid[x] += 1

  def _fronts(self) -> list:
    """The persistent heap of ``(finish, worker, step)`` of each worker's next event (a
    worker's entries of earlier steps are stale, dropped when they surface)."""
    if self._front is None:
      self._front = [(float(self.finish[i]), i, self._k[i]) for i in range(self.n)]
      heapq.heapify(self._front)
    return self._front

  def _finalise(self) -> None:
    """Numbers, in the sequential order, the applied events before the earliest pending one
    (no event still to come can precede them), and counts their tau (:meth:`tau`)."""
    heap, now = self._fronts(), self._k
    while now[heap[0][1]] != heap[0][2]:
      heapq.heappop(heap)
    if len(heap) > 4 * self.n + self._slack:
      heap[:] = [e for e in heap if now[e[1]] == e[2]]
      heapq.heapify(heap)
    front, opened = heap[0][:2], self._open
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
        t, k = self._end(j, k + 1, t + float(self._comm(j, k))), k + 1
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
      reach, top = tuple(dict.fromkeys(int(j) for j in self._reach(i))), self.n + self.resources
      if any(not 0 <= j < top for j in reach):
        raise ValueError(f"reach({i}) = {reach} is not allowed: workers or resources in "
                         f"[0, {top})")
      self._reaches[i] = reach
    return self._reaches[i]

  def _apply(self, t: float, i: int, touched: tuple) -> Event:
    """Worker i's event at ``t``: the versions and its next computation."""
    k, version = self._k[i], self.version
    event = Event(t, i, k, touched, float(self.start[i]), int(version[i] - self.read[i]),
                  float(self.last[i]))
    heapq.heappush(self._open, (t, i))
    self.last[i] = t
    for j in touched:  # distinct
      version[j] += 1
    self.read[i] = version[i]
    self.steps[i] = self._k[i] = k + 1
    ahead = self._ahead.get(i)
    if ahead is not None and ahead[0] == k:  # drawn by _enter: the same sums
      self.start[i], self.finish[i] = t + ahead[1], ahead[2]
      finish = ahead[2]
    else:
      self.start[i] = start = t + float(self._comm(i, k))
      self.finish[i] = finish = self._end(i, k + 1, start)
    if self._front is not None:
      heapq.heappush(self._front, (finish, i, k + 1))
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
    self._unindex()


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
  hit, share, first, second = [], [], [], []  # index lists: one numpy write each, not per event
  for e in batch:
    workers = [j for j in e.touched if j < n]
    hit += workers
    if len(workers) < len(e.touched):
      share.append(e.worker)
    if len(workers) == 2:
      first.append(workers[0])
      second.append(workers[1])
  own = [e.worker for e in batch]  # distinct workers: a batch's events touch disjoint sets
  fire[own], staleness[own] = True, [e.staleness for e in batch]
  touched[hit], shared[share] = True, True
  peer[first], peer[second] = second, first
  return {"fire": fire, "peer": peer, "touched": touched, "staleness": staleness, "shared": shared}


__all__ = ["Event", "EventClock", "RandomWalkToken", "batch_inputs", "draw_index", "random_peer"]
