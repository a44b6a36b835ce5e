"""The event clock as a run's clock: the host parts of the asynchronous family
(:class:`EventTimes`: AD-PSGD, SGP, SwarmSGD; :class:`ServerEventTimes`: asynchronous DiLoCo),
each device step one batch of events of :class:`~nbsgd_jax.host.event_clock.EventClock`
(its semantics, the batches and the three kinds of staleness are in
:mod:`nbsgd_jax.host.event_clock`). The released codes' orders are in
:mod:`nbsgd_jax.host.async_orders`."""

from __future__ import annotations

import copy
import functools
from typing import Callable, Optional

import numpy as np

from nbsgd_jax.communications import Round
from nbsgd_jax.communications.adjacency import Neighbours
from nbsgd_jax.host import clock as clock_lib
from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host import outages as outages_lib
from nbsgd_jax.host.event_clock import (  # noqa: F401 (the clock's names, re-exported)
    Event, EventClock, RandomWalkToken, batch_inputs, draw_index, random_peer)
from nbsgd_jax.host.parts import HostPart
from nbsgd_jax.transforms.asynchronous import Events


class EventTimes(HostPart):
  """The event clock as the run's clock (a recipe's ``Recipe.clock``, in place of the
  lockstep :class:`~nbsgd_jax.host.parts.Clock`): each device step is one batch of events
  (:meth:`EventClock.next_batch`).

  Worker i's computation of its own step k takes the cluster model's time of its M
  mini-batches at step k (:func:`~nbsgd_jax.host.cluster.minibatch_finish_times`, plus
  ``cluster.step_overhead``); an event that averages with a peer sends one model and the worker
  starts its next computation after the alpha-beta time of that message (``latency +
  bytes / bandwidth``, :func:`~nbsgd_jax.host.clock.comm_time`; the bytes are the
  communication's :meth:`~nbsgd_jax.communications.pairwise.PairwiseAverage.message_bytes`).
  The model a worker reads for its next gradient is its model right after its event.

  Each event applies one gradient computation of its worker, so a device step holds as many
  as its batch has events (:meth:`computed`; AD-PSGD on the main job with stragglers: 0.27
  per worker); a budget in gradient computations per worker is the device steps that reach
  it from step 0 (:meth:`steps_for`: the events depend on the cluster and the seeds alone,
  not on the model, so a fresh clock replays them).

  Inputs: ``events`` (:class:`~nbsgd_jax.transforms.asynchronous.Events`) ``start``, ``fire``,
  ``peer``, ``apply`` (``fire``: every event applies its gradient). Record: ``sim_time`` (s, the last event's time), ``events`` (applied so far),
  ``grads_per_worker`` (the workers' mean gradient computations applied so far), and over
  the applied events (module docstring; a worker reads its model at its previous event):
  ``staleness_tau`` / ``staleness_tau_max`` (mean and max of the paper's tau: every worker's
  events between the read and the event, AD-PSGD's tau_k of Lian et al. 2018, Sec. 3;
  :meth:`EventClock.tau`), ``staleness_own_steps`` / ``staleness_own_steps_max`` (the changes
  to the worker's own model in between) and ``staleness_s`` (the mean age in s of the
  gradient when applied, from the read).

  Args:
    cluster: the :class:`~nbsgd_jax.host.cluster.Cluster`.
    touch, reach, resources: as :class:`EventClock`.
    message_bytes: bytes of one exchange's message.
    step_overhead: s added to each computation (``cluster.step_overhead``).
  """

  name = "clock"

  def __init__(self, cluster, touch: Callable, message_bytes: float,
               step_overhead: float = 0.0, reach: Optional[Callable] = None,
               resources: int = 0):
    self.cluster = cluster
    self.overhead = float(step_overhead)
    self.message_bytes = float(message_bytes)
    self.message_s = float(clock_lib.comm_time(cluster, 1.0, self.message_bytes)[0])
    self._pairs: dict = {}  # (i, j) -> pair_s(i, j), as asked (a worker has few peers)
    self._rule0 = copy.deepcopy(touch)  # an event rule with state, as it starts
    self._reach, self._resources = reach, resources
    self.outages: Optional[outages_lib.Outages] = None  # failures (set_outages)
    self.restarts: Optional[outages_lib.RestartPauses] = None  # the restart policy's
    self.fleet = outages_lib.FleetTime(cluster.n)  # where the time went, goodput
    self.clock = self._new_clock(touch)
    self.started = np.ones(cluster.n, bool)  # every worker reads x_0 at step 0
    self.events, self.stale_steps, self.stale_s, self.stale_max = 0, 0, 0.0, 0
    self.grads_computed = 0  # gradients the device steps computed, used or not

  def _duration(self, k: int) -> np.ndarray:
    return cluster_lib.minibatch_finish_times(self.cluster, k)[:, -1] + self.overhead

  def _new_clock(self, touch) -> EventClock:
    """An :class:`EventClock` of this cluster whose ``comm`` sees what each event touched."""
    clock = EventClock(self.cluster.n, self._duration, touch,
                       lambda i, k: self._comm(i, k, clock.drawn(i, k)), self._reach,
                       self._resources, outages=self.outages)
    return clock

  def set_outages(self, outages: Optional[outages_lib.Outages]) -> None:
    """The run's failures (:mod:`nbsgd_jax.host.outages`: a crash loses the computation in
    flight, the worker starts it again after its repair; a partner down at an event's time
    is not averaged with), set before the first step: the clock starts again with them."""
    if outages is None and self.outages is None:
      return
    self.outages = outages
    self.clock = self._new_clock(copy.deepcopy(self._rule0))

  def set_restarts(self, restarts: Optional[outages_lib.RestartPauses]) -> None:
    """The restart policy's pauses (:class:`~nbsgd_jax.host.outages.RestartPauses`): the
    events run on in the job's progress time; ``sim_time`` adds the restarts' cost."""
    self.restarts = restarts

  def _time_fields(self) -> dict:
    """``sim_time`` (s: the last event's progress plus the restarts before it), with the
    restart policy ``restarts`` and ``restart_lost`` (s), and the time split and goodput."""
    now = self.clock.now
    if self.restarts is None:
      return {"sim_time": now, **self.fleet.record(now)}
    count, lost = self.restarts.lost(now)
    return {"sim_time": now + lost, "restarts": float(count), "restart_lost": lost,
            **self.fleet.record(now + lost, lost)}

  def _computes(self, i: int, k: int) -> bool:
    """Whether worker i's event k ends a gradient computation (else a message)."""
    del i, k
    return True

  def _next_batch(self) -> list:
    """The clock's next batch, each event's time split (:class:`~nbsgd_jax.host.outages.
    FleetTime`)."""
    batch = self.clock.next_batch()
    for e in batch:
      self.fleet.add(e, self.outages, self._computes(e.worker, e.step))
    return batch

  def _rereads(self, batch: list, peer: np.ndarray, fire: np.ndarray) -> np.ndarray:
    """bool ``[n]``: the workers whose computation in flight a failure will discard and
    that a peer's average of this batch changed before they read their model again (after
    the repair, :meth:`~nbsgd_jax.host.outages.Outages.run`): the gradient they hold is
    computed again at the next step, on the model they will read (nobody averages with a
    worker while it is down, so its model at the repair is its model now)."""
    out = np.zeros(self.cluster.n, bool)
    if self.outages is None:
      return out
    for e in batch:
      j = int(peer[e.worker])
      if j == e.worker or fire[j]:
        continue
      start, k = float(self.clock.start[j]), int(self.clock.steps[j])
      begin = self.outages.run(j, start, self.clock.seconds(j, k))[0]
      out[j] |= begin > start and e.time < begin
    return out

  def _live_pairs(self, batch: list, peer: np.ndarray) -> np.ndarray:
    """``peer`` without the pairs whose partner is down at the event's time (the average
    is dropped; the initiator still paid the message: :mod:`nbsgd_jax.host.outages`)."""
    if self.outages is None:
      return peer
    peer = peer.copy()
    for e in batch:
      j = peer[e.worker]
      if j != e.worker and self.outages.down_at(int(j), e.time):
        peer[e.worker], peer[j] = e.worker, j
    return peer

  def pair_s(self, i: int, j: int) -> float:
    """Seconds of one message from worker ``i`` to ``j`` (``j = n``: the server, which sits
    with worker 0): the cluster's link, or on a hierarchical network
    (``cluster.levels``) the link between them."""
    net = self.cluster.network
    if net is None:
      return self.message_s
    if (i, j) not in self._pairs:
      lv = int(net.level(i, 0 if j >= self.cluster.n else j))
      self._pairs[(i, j)] = float(net.latency[lv] + self.message_bytes / net.bandwidth[lv])
    return self._pairs[(i, j)]

  def _comm(self, i: int, k: int, touched: tuple) -> float:
    peers = [j for j in touched if j != i]
    return self.pair_s(i, peers[0]) if peers else 0.0

  def sample(self) -> np.ndarray:
    """int32 ``[n]``: the index of each worker's data draw for the gradient it computes in
    the next device step: the gradients it applied so far (:meth:`computed`), asked before
    the step's batch (``Events.sample``: a worker's k-th gradient reads the lockstep clock's
    draw of step k, common random numbers across clocks)."""
    return self.computed(self.clock.steps).astype(np.int32)

  def inputs(self, step, inputs, probe):
    sample = self.sample()
    batch = self._next_batch()
    masks = batch_inputs(batch, self.cluster.n)
    peer = self._live_pairs(batch, masks["peer"])
    inputs.events = Events(fire=masks["fire"], start=self.started, peer=peer,
                           apply=masks["fire"], sample=sample, compute=self.started)
    self.started = masks["fire"] | self._rereads(batch, peer, masks["fire"])
    self.events += len(batch)
    for e in batch:  # stale_steps, stale_max: the own-model count
      self.stale_steps += e.staleness
      self.stale_s += e.time - e.read
      self.stale_max = max(self.stale_max, e.staleness)

  def observe(self, step, inputs, report, probe):
    """Counts the gradients the step computed: the report's ``grads_computed`` (the
    gathered step, :mod:`nbsgd_jax.run.gathered`: the computing workers' bucket), else one
    per worker (the plain step computes every worker's); the step's record gets its
    count."""
    del step, inputs, probe
    got = report.get("grads_computed")
    got = self.cluster.n if got is None else int(np.sum(got))
    self.grads_computed += got
    return {"grads_computed": got}

  def computed(self, steps: np.ndarray) -> np.ndarray:
    """int ``[n]``, the gradient computations each worker applied after ``steps[i]`` events
    of its own (an event applies one)."""
    return np.asarray(steps, np.int64)

  def steps_for(self, grads):
    """For each budget ``grads[j]`` (increasing), the fewest batches from step 0 after which
    the workers' mean :meth:`computed` reaches it, counted on a fresh clock (the same events:
    they depend on the cluster and the seeds alone). A batch holds at most one event per
    worker, so the mean grows by at most 1 a step: it ends within one batch of the budget."""
    clock, n, step, out = self._new_clock(copy.deepcopy(self._rule0)), self.cluster.n, 0, []
    for g in grads:
      while int(self.computed(clock.steps).sum()) < g * n:
        clock.next_batch()
        step += 1
      out.append(step)
    return out

  def rounds(self, step, inputs, report) -> list:
    """The step's exchanges as one :class:`~nbsgd_jax.communications.Round` (each paired
    worker sends one model to its peer), from the host's own draws: the bytes the device
    must report."""
    del step, report
    n = self.cluster.n
    peer = np.asarray(inputs.events.peer)
    paired = (peer != np.arange(n)).astype(np.float64)
    return [Round(Neighbours(np.stack([np.arange(n), peer], 1)), paired,
                  paired * self.message_bytes)]

  def record(self):
    per = max(self.events, 1)
    return {"events": self.events,
            "grads_per_worker": float(self.computed(self.clock.steps).mean()),
            "grads_computed": self.grads_computed / self.cluster.n, **self._staleness(per),
            **self._time_fields()}

  def _staleness(self, per: int) -> dict:
    events, total, top = self.clock.tau()
    return {"staleness_tau": total / max(events, 1), "staleness_tau_max": top,
            "staleness_own_steps": self.stale_steps / per,
            "staleness_own_steps_max": self.stale_max, "staleness_s": self.stale_s / per}

  def state_dict(self):
    return {"clock": self.clock.state_dict(), "started": self.started.tolist(),
            "events": self.events, "stale_steps": self.stale_steps, "stale_s": self.stale_s,
            "stale_max": self.stale_max, "grads_computed": self.grads_computed,
            "fleet": self.fleet.state_dict()}

  def load_state_dict(self, d):
    self.clock.load_state_dict(d["clock"])
    self.started = np.asarray(d["started"], bool)
    self.events, self.stale_steps = int(d["events"]), int(d["stale_steps"])
    self.stale_s, self.stale_max = float(d["stale_s"]), int(d["stale_max"])
    self.grads_computed = int(d.get("grads_computed", 0))  # 0: a checkpoint from before it
    self.fleet.load_state_dict(d.get("fleet", {}))


PULLS = ("arrival", "instant")  # when an asynchronous DiLoCo worker reads the server's model


class ServerEventTimes(EventTimes):
  """The event clock of asynchronous DiLoCo (:func:`nbsgd_jax.transforms.asynchronous.
  server_rounds`): worker i repeats a cycle of ``local_steps[i] + 1`` events: a pull of the
  server's model (it takes one message's time), then its inner steps (the cluster model's
  time each), the last one pushing its pseudo-gradient (one message's time before its next
  pull). Pushes and pulls touch the server (resource ``n``), so none shares a batch with
  another; inner steps touch their worker alone.

  A pull computes no gradient; each inner step computes one (:meth:`computed`).

  When a worker reads the server's model (``pull``, the config's ``async_diloco.pull``):

  * ``"arrival"``: at the end of its pull's transfer (the pull event), so the model it reads
    includes every push applied before then, pushes that arrived after its own included;
  * ``"instant"``: when it asks, right after its own push: the server's model at that time,
    after every push of the same time (simultaneous events processed together, as
    google-deepmind/asyncdiloco's toy notebook, commit e783a30, ``AsyncExperiment.run``,
    synchronises every worker that finished at that time before ``train()`` restarts them);
    its transfer still takes its time before the worker computes (the two messages). With
    messages of zero seconds a pull of the same time may come before a later worker's push
    (the clock's ties go by worker): that worker's read misses the push.

  Inputs: ``events`` ``fire``, ``pull``, ``push``, ``read`` (the worker reads the
  server's model after this step's push, if any), ``staleness`` (at a push: the server
  updates since the worker's read). Record: as :class:`EventTimes`, ``pushes`` for
  ``events``, and over the pushes: ``staleness_tau`` / ``staleness_tau_max`` (mean and max of
  the server updates between the worker's pull and its push: a pseudo-gradient's staleness as
  Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling", arXiv 2401.09135,
  count it, and as google-deepmind/asyncdiloco's toy notebook's ``get_sync_weight`` takes it)
  and ``staleness_s`` (s from the pull's read of the server model to the push); no own-model
  count (no other worker changes a worker's model).

  Args:
    cluster, message_bytes, step_overhead: as :class:`EventTimes`.
    local_steps: int ``[n]``, H_i >= 1 (dynamic local updates: fewer for slower workers).
    pull: one of :data:`PULLS`, when a worker reads (above).

  Raises:
    ValueError: an unknown ``pull`` (named).
  """

  def __init__(self, cluster, message_bytes: float, local_steps, step_overhead: float = 0.0,
               pull: str = "arrival"):
    if pull not in PULLS:
      raise ValueError(f"async_diloco.pull={pull!r} is not allowed: use one of {list(PULLS)}")
    self.pull, self.asked = pull, np.full(cluster.n, -1.0)  # s, a waiting worker's push
    self.cycle = np.asarray(local_steps, np.int64) + 1
    server = cluster.n
    touch = lambda i, k: (i, server) if k % self.cycle[i] in (0, self.cycle[i] - 1) else (i,)
    super().__init__(cluster, touch, message_bytes, step_overhead, lambda i: (i, server), 1)
    self.pushes, self.pulled, self.pulled_at = 0, np.zeros(cluster.n, np.int64), np.zeros(
        cluster.n)

  def _computes(self, i, k):
    return bool(k % self.cycle[i])  # a pull moves a model: a message

  def _kinds(self, k: int) -> np.ndarray:
    return k % self.cycle  # 0: a pull, cycle - 1: a push, else an inner step

  @functools.cached_property
  def _server_s(self) -> np.ndarray:
    """float64 ``[n]``: seconds of each worker's message to the server (:meth:`pair_s`)."""
    return np.array([self.pair_s(i, self.cluster.n) for i in range(self.cluster.n)])

  def computed(self, steps):
    """Events less pulls: event k of worker i is a pull when ``k % cycle_i == 0``, so
    ``ceil(steps_i / cycle_i)`` of its first ``steps_i`` are."""
    steps = np.asarray(steps, np.int64)
    return steps - (steps + self.cycle - 1) // self.cycle

  def _duration(self, k: int) -> np.ndarray:
    compute = cluster_lib.minibatch_finish_times(self.cluster, k)[:, -1] + self.overhead
    return np.where(self._kinds(k) == 0, self._server_s, compute)

  def _comm(self, i: int, k: int, touched: tuple) -> float:
    return self.pair_s(i, self.cluster.n) if k % self.cycle[i] == self.cycle[i] - 1 else 0.0

  def inputs(self, step, inputs, probe):
    n, sample = self.cluster.n, self.sample()
    batch = self._next_batch()
    pull, push, stale = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, np.int32)
    read, now = np.zeros(n, bool), self.clock.now  # the batch's one server event's time
    for e in batch:
      kind = e.step % self.cycle[e.worker]
      if kind == 0:
        pull[e.worker], read[e.worker], now = True, self.pull == "arrival", e.time
      if kind == self.cycle[e.worker] - 1 and self.pull == "instant":
        self.asked[e.worker], now = e.time, e.time
        read |= self.asked == e.time  # every worker waiting since this time reads
      if kind == self.cycle[e.worker] - 1:
        push[e.worker], stale[e.worker] = True, self.pushes - self.pulled[e.worker]
        self.pushes += 1
        self.events += 1
        self.stale_steps += int(stale[e.worker])
        self.stale_s += e.time - self.pulled_at[e.worker]
        self.stale_max = max(self.stale_max, int(stale[e.worker]))
    self.asked[pull] = -1.0  # none (a push's time is > 0)
    self.pulled[read], self.pulled_at[read] = self.pushes, now  # the version and time read
    fire = batch_inputs(batch, n)["fire"]
    inputs.events = Events(fire=fire, pull=pull, push=push, read=read, staleness=stale,
                           sample=sample, compute=fire & ~pull)

  def rounds(self, step, inputs, report) -> list:
    """Each push and pull moves one model."""
    del step, report
    n = self.cluster.n
    moved = (inputs.events.pull | inputs.events.push).astype(np.float64)
    return [Round(Neighbours(np.arange(n)[:, None]), moved, moved * self.message_bytes)]

  def record(self):
    rec = super().record()
    rec["pushes"] = rec.pop("events")
    return rec

  def _staleness(self, per: int) -> dict:
    """Over the pushes (stale_steps, stale_max: server updates since the pull)."""
    return {"staleness_tau": self.stale_steps / per, "staleness_tau_max": self.stale_max,
            "staleness_s": self.stale_s / per}

  def state_dict(self):
    return {**super().state_dict(), "pushes": self.pushes, "pulled": self.pulled.tolist(),
            "pulled_at": self.pulled_at.tolist(), "asked": self.asked.tolist()}

  def load_state_dict(self, d):
    super().load_state_dict(d)
    self.pushes, self.pulled = int(d["pushes"]), np.asarray(d["pulled"], np.int64)
    self.pulled_at = np.asarray(d["pulled_at"], np.float64)
    self.asked = np.asarray(d.get("asked", self.asked), np.float64)


__all__ = ["Event", "EventClock", "EventTimes", "PULLS", "ServerEventTimes", "batch_inputs",
           "draw_index", "random_peer"]
