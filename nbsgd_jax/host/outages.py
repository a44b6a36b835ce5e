"""Failures on the event clock: each worker's down spans in simulated seconds
(:class:`Outages`), and what they do to a computation (:meth:`Outages.run`).

The lockstep clock lays a failure on steps (:class:`~nbsgd_jax.host.failures.Failure`:
worker w down for its steps ``s .. s + d - 1``; the failure process draws its up and repair
times in seconds and lays them on each worker's nominal step time ``s0_w``,
:func:`~nbsgd_jax.host.failures.nominal_step_seconds`). On the event clock the same failures
are spans of simulated time, ``[s s0_w, (s + d) s0_w)``: the schedule's steps and the
process's draws mean the same seconds on both clocks.

The rules (each the simplest one a real fleet follows; ``docs/clock.md``, "Failures on the
event clock"):

* **A crashed worker's computation in flight is lost.** A failure that starts while worker
  w computes (after its computation started, before it ends) discards that work; after the
  repair (and, with ``cluster.rejoin_fetch``, one model message from the cluster, its
  ``fetch`` seconds) the worker starts the same computation again, reading its model then.
  A worker that is down when its computation would start (a failure during its message)
  starts it after the repair and the fetch. Its model is the one it held: as on the lockstep
  clock's elastic policy, a failed worker keeps its state and the others go on without it.
* **Messages in flight are delivered.** An event's exchange (AD-PSGD's average, a push to
  the server) is applied at the event's time, before the message's seconds are charged to
  the sender's next computation: a failure after the event cannot undo it.
* **A partner who is down at the event's time** (AD-PSGD's, SwarmSGD's random neighbour):
  the initiator's average is dropped (it applies its gradient alone) and it pays the
  message's seconds, a send that times out: so a failure moves no other worker's events.
  The released codes leave this open: facebookresearch/stochastic_gradient_push's
  ``gossip/ad_psgd.py`` (commit ac9af237) assumes every peer alive, and ICLR-PopSGD's
  ``worker.py`` (commit 4f0c6f0) draws from all workers; our rule is named here.
* **A worker that has died pushes nothing**: its push is an event, and it has none while it
  is down; its computation in flight is lost as above.
* **Its time down is charged** as ``time_down`` (the seconds of its spans inside the run).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Optional, Sequence

import numpy as np

from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host import ledger


class Outages:
  """Each worker's down spans in seconds (module docstring).

  Args:
    n: workers.
    step_seconds: float ``[n]``, each worker's nominal seconds per step (``s0``), > 0.
    failures: a schedule (:class:`~nbsgd_jax.host.failures.Failure` s), laid at ``s0``.
    process: a :class:`~nbsgd_jax.host.failures.FailureProcess`, or None.
    fetch: float ``[n]`` or a number: seconds of the model message a worker receives before
      it computes again after a repair (``cluster.rejoin_fetch``; 0: none).
  """

  def __init__(self, n: int, step_seconds, failures: Sequence = (), process=None, fetch=0.0):
    self.n = int(n)
    self.s0 = np.broadcast_to(np.asarray(step_seconds, np.float64), (self.n,))
    self.fetch = np.broadcast_to(np.asarray(fetch, np.float64), (self.n,))
    self.process = process
    self._fixed = [[] for _ in range(self.n)]
    for f in failures:
      self._fixed[f.worker].append(f)
    self._spans: list = [[] for _ in range(self.n)]  # per worker: sorted (start, end) s
    self._starts: list = [[] for _ in range(self.n)]
    self._upto = np.full(self.n, -1.0)  # s: the spans are known up to this time

  def _known(self, i: int, t: float) -> None:
    """Worker i's spans that start before ``t`` (s), laid (the process drawn that far)."""
    if self._upto[i] >= t:
      return
    horizon = max(t, 2.0 * self._upto[i])
    steps = int(math.ceil(horizon / self.s0[i])) + 1
    fails = list(self._fixed[i])
    if self.process is not None:
      fails += self.process.worker_failures(i, steps)
    spans = sorted((f.start * self.s0[i], (f.start + f.duration) * self.s0[i]) for f in fails)
    merged: list = []
    for a, b in spans:
      if merged and a <= merged[-1][1]:
        merged[-1] = (merged[-1][0], max(merged[-1][1], b))
      else:
        merged.append((a, b))
    self._spans[i], self._starts[i] = merged, [a for a, _ in merged]
    self._upto[i] = horizon

  def spans(self, i: int, until: float) -> list:
    """Worker i's down spans ``(start, end)`` (s) that start before ``until``."""
    self._known(i, until)
    return self._spans[i][:bisect.bisect_left(self._starts[i], until)]

  def down_at(self, i: int, t: float) -> bool:
    """Whether worker i is down at time ``t`` (s): inside one of its spans."""
    self._known(i, t + float(self.s0[i]))
    k = bisect.bisect_right(self._starts[i], t) - 1
    return k >= 0 and t < self._spans[i][k][1]

  def run(self, i: int, start: float, seconds: float) -> tuple:
    """Worker i's computation of ``seconds`` that would start at ``start`` (s), through its
    failures (module docstring).

    Returns:
      ``(begin, finish, down, lost, fetched)``: s when the attempt that completes starts and
      when it ends; the seconds the worker was down from ``start`` to ``begin``; the seconds
      of computation lost to crashes; the seconds of model fetches after repairs.
    """
    t, down, lost, fetched = float(start), 0.0, 0.0, 0.0
    while True:
      span = self._first_after(i, t, t + seconds)
      if span is None:
        return t, t + seconds, down, lost, fetched
      a, b = span
      lost += max(0.0, a - t)
      down += b - max(a, t)
      t = b + float(self.fetch[i])
      fetched += float(self.fetch[i])

  def split(self, i: int, start: float, end: float) -> tuple:
    """What filled worker i's time from ``start``, when its computation was due to start, to
    ``end``, when it completed (an event: :meth:`run` went through its failures).

    Returns:
      ``(seconds, down, lost, fetched)``: the completed attempt's seconds, the seconds down,
      the computation lost to crashes and the fetches' seconds; they add up to
      ``end - start``.
    """
    spans = [(max(a, start), min(b, end)) for a, b in self.spans(i, end) if b > start]
    if not spans:
      return end - start, 0.0, 0.0, 0.0
    down = sum(b - a for a, b in spans)
    fetched = len(spans) * float(self.fetch[i])
    seconds = end - (spans[-1][1] + float(self.fetch[i]))
    return seconds, down, (end - start) - down - fetched - seconds, fetched

  def _first_after(self, i: int, t: float, until: float) -> Optional[tuple]:
    """Worker i's first span that ends after ``t`` and starts before ``until`` (s), or
    None."""
    self._known(i, until)
    spans, k = self._spans[i], bisect.bisect_right(self._starts[i], t) - 1
    if k >= 0 and spans[k][1] > t:
      return spans[k]
    if k + 1 < len(spans) and spans[k + 1][0] < until:
      return spans[k + 1]
    return None


class FleetTime:
  """Where an event-clock run's time went, per worker (the event clock's half of
  :mod:`nbsgd_jax.host.ledger`): each event's computation from when it was due to start
  (its previous event plus that event's message) to its end, split by :meth:`Outages.split`.

  ``time_compute`` (the computations' seconds, the completed and the lost), ``time_comm``
  (the messages between a worker's events, pulls of a server's model, fetches after
  repairs), ``time_down``, and ``time_wait`` (the rest of ``n x sim_time``: the end of the
  run after a worker's last event), each a fraction of ``sim_time``, the mean over the
  workers; ``goodput`` (:func:`nbsgd_jax.host.ledger.goodput`): the completed computations
  whose gradient is applied, over ``n x sim_time``.

  Args:
    n: workers.
  """

  def __init__(self, n: int):
    self.compute, self.useful = np.zeros(n), np.zeros(n)
    self.comm, self.down = np.zeros(n), np.zeros(n)

  def add(self, event, outages: Optional[Outages], computes: bool) -> None:
    """One applied event (an :class:`~nbsgd_jax.host.event_clock.Event`: its ``read``, the
    worker's previous event, ``start`` and ``time``); ``computes``: its span is a gradient
    computation (else a message, e.g. a pull of the server's model)."""
    i = event.worker
    if outages is None:
      seconds, down, lost, fetched = event.time - event.start, 0.0, 0.0, 0.0
    else:
      seconds, down, lost, fetched = outages.split(i, event.start, event.time)
    self.comm[i] += event.start - event.read + fetched + (0.0 if computes else seconds)
    self.compute[i] += lost + (seconds if computes else 0.0)
    self.useful[i] += seconds if computes else 0.0
    self.down[i] += down

  def record(self, sim_time: float, restarted: float = 0.0) -> dict:
    """The records' fields (class docstring) at ``sim_time`` (s); ``restarted``: s every
    worker lost to restarts (:class:`RestartPauses`), down time."""
    total = max(float(sim_time), 1e-300)
    parts = {k: float(np.mean(v)) / total for k, v in (
        ("time_compute", self.compute), ("time_comm", self.comm),
        ("time_down", self.down + restarted))}
    parts["time_wait"] = max(0.0, 1.0 - sum(parts.values()))
    return {**parts, "goodput": ledger.goodput(self.useful, total)}

  def state_dict(self) -> dict:
    return {k: getattr(self, k).tolist() for k in ("compute", "useful", "comm", "down")}

  def load_state_dict(self, d: dict) -> None:
    for k in ("compute", "useful", "comm", "down"):
      if k in d:  # a checkpoint from before: the split restarts here
        setattr(self, k, np.asarray(d[k], np.float64))


class RestartPauses:
  """The restart policy on the event clock (``cluster.failure_policy="restart"``): a failure
  restarts the whole job from its last checkpoint, nobody drops out, and a deterministic job
  replays the same events; so the event clock runs on unchanged, in the job's *progress*
  time, and a restart is a pause of every worker inserted into it. A failure at progress time
  ``f`` (worker w's failure at its step s: ``f = s s0_w``, as :class:`Outages` lays it) costs
  ``(f - C) + R``: the progress since the last checkpoint ``C`` (checkpoints every
  ``restart_every`` nominal steps of progress, ``P = restart_every mean(s0)``, at ``P, 2P,
  ...``), computed again, plus the restart's ``R`` seconds; the simulated time of progress
  ``p`` is ``p`` plus the costs of the failures before it (:meth:`wall`). Two failures
  between checkpoints each lose everything since the checkpoint and one restart, as
  :class:`nbsgd_jax.host.ledger.Restarts` charges the lockstep clock.

  Args:
    n: workers.
    step_seconds: float ``[n]``, the nominal step ``s0`` of each worker.
    failures: the schedule's :class:`~nbsgd_jax.host.failures.Failure` s.
    process: a :class:`~nbsgd_jax.host.failures.FailureProcess`, or None.
    every: ``restart_every``, steps between checkpoints, >= 1.
    seconds: ``R``, a restart's own seconds, >= 0.
  """

  def __init__(self, n: int, step_seconds, failures: Sequence = (), process=None,
               every: int = 1, seconds: float = 0.0):
    self.n, self.process = int(n), process
    self.s0 = np.broadcast_to(np.asarray(step_seconds, np.float64), (self.n,))
    self.period, self.seconds = float(every) * float(self.s0.mean()), float(seconds)
    self._fixed = sorted(f.start * self.s0[f.worker] for f in failures)

  def starts(self, progress: float) -> list:
    """The failures' progress times before ``progress`` (s), increasing."""
    out = [f for f in self._fixed if f < progress]
    if self.process is not None:
      for i in range(self.n):
        upto = int(math.ceil(progress / self.s0[i])) + 1
        out += [f.start * self.s0[i] for f in self.process.worker_failures(i, upto)]
    return sorted(f for f in out if f < progress)

  def lost(self, progress: float) -> tuple:
    """``(restarts, seconds lost)`` before ``progress`` (s)."""
    starts = self.starts(progress)
    return len(starts), float(sum(f % self.period + self.seconds for f in starts))

  def wall(self, progress: float) -> float:
    """The simulated time (s) at which the job reaches ``progress``."""
    return progress + self.lost(progress)[1]


def outages_of(cfg, cluster, fetch_seconds: Callable[[], np.ndarray]) -> Optional[Outages]:
  """The :class:`Outages` of ``cfg.cluster``'s failures (schedule and rate) on ``cluster``,
  or None without failures; ``fetch_seconds()``: float ``[n]``, each worker's model message
  (asked only with ``cluster.rejoin_fetch``)."""
  if not failures_lib.failures_on(cfg) or cfg.cluster.failure_policy == "restart":
    return None
  fails = failures_lib.parse_failures(cfg.cluster.failures, cluster.n)
  fetch = fetch_seconds() if cfg.cluster.rejoin_fetch else 0.0
  return Outages(cluster.n, failures_lib.nominal_step_seconds(cluster), fails,
                 failures_lib.failure_process(cfg, cluster), fetch)


def restarts_of(cfg, cluster) -> Optional[RestartPauses]:
  """The :class:`RestartPauses` of ``cfg.cluster``'s failures under
  ``failure_policy="restart"``, or None."""
  if not failures_lib.failures_on(cfg) or cfg.cluster.failure_policy != "restart":
    return None
  c = cfg.cluster
  return RestartPauses(cluster.n, failures_lib.nominal_step_seconds(cluster),
                       failures_lib.parse_failures(c.failures, cluster.n),
                       failures_lib.failure_process(cfg, cluster), c.restart_every,
                       c.restart_seconds)


__all__ = ["FleetTime", "Outages", "RestartPauses", "outages_of", "restarts_of"]
