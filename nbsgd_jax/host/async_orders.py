"""The host halves of the released codes' update orders (``ad_psgd.order='released'``,
``swarm_sgd.averaging='one_sided'``) on the event clock (:mod:`nbsgd_jax.host.events`).

:class:`GossipLoopTimes`: AD-PSGD as facebookresearch/stochastic_gradient_push releases it
(``gossip/ad_psgd.py``, ``BilatGossipDataParallel``, commit e682064). Each worker runs two
processes. The training process computes a gradient on the model it pulled, hands it to the
gossip process (``_transfer_grads``) and pulls the gossip process's model (``_pull_model``).
The gossip process loops (``_gossip_target``): if a gradient was written, apply it (torch SGD:
momentum, Nesterov, weight decay), then ONE bilateral mix with a peer (``gossiper.py``,
``BilatPushPull.mix``: ``x <- (x + x_peer) / 2`` on both), and again. So the gradient comes
first and the averages run back to back, several per gradient when a mix is faster than a
gradient. Modelled on the event clock as:

* a worker's events are its gossip-loop iterations; each takes one message's time (the
  alpha-beta time of one model, :func:`~nbsgd_jax.host.clock.comm_time`), whether or not it
  mixes, and happens at once at its end: the gradient (when one is due), then the average
  with the peer the pairing draws (:func:`~nbsgd_jax.host.events.random_peer`; a passive
  worker of the bipartite pairing, or one without neighbours, mixes with nobody);
* worker i's gradient c is computed for the cluster model's time of its own step c
  (:func:`~nbsgd_jax.host.cluster.minibatch_finish_times`, plus ``cluster.step_overhead``)
  from its read, and applied at the first of its events at or after the computation's end:
  ``ceil(t_c / message_s)`` events after the event that applied gradient c - 1 (at least one;
  gradient 0 from time 0);
* the worker reads its next model right after the event that applied its gradient (the model
  after that event's average): the device's ``start`` mask.

Not modelled: a passive worker's non-blocking receive (in the reference its loop spins and
completes a mix only when an active peer's message arrived; here every worker's iteration
takes one message's time and the initiator's draw alone decides the pair), the training
process's read racing the gradient's application (in the reference ``_pull_model`` runs right
after ``_transfer_grads``, possibly before the gossip process applied the gradient: here the
read sees it), the lock's serialisation and the learning-rate hand-over.

:class:`OneSidedTimes`: SwarmSGD as ICLR-PopSGD/PopSGD releases it (``worker.py``, commit
4f0c6f0, the loop after "Choose a random partner"): after each local step the worker
publishes a copy of its model (``model_to_copy`` under an exclusive window lock), draws a
partner, reads the partner's *published* copy (``win.Get``) and sets its own model to the
average; the partner is left unchanged. The clock is :class:`~nbsgd_jax.host.events.
EventTimes` (the event still touches the partner: the initiator reads its copy, so no event
of the partner's is reordered across it); only the partner sends: one model to the initiator.

Records (:class:`GossipLoopTimes`, per applied gradient, mean over gradients): ``staleness_s``
(s from the read to the application), ``staleness_tau`` / ``staleness_tau_max`` (events of
every worker applied between the read and the application, in the order the device applies
them: Lian et al. 2018's tau, x_hat = x_{k - tau}), ``staleness_own_steps`` /
``staleness_own_steps_max`` (changes to the worker's own model between the read and the
application: its own mixes and its peers'). :class:`OneSidedTimes` records as
:class:`~nbsgd_jax.host.events.EventTimes` (which counts a partner's read as a change to the
partner's model, though one-sided averaging leaves it unchanged).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Optional

import numpy as np

from nbsgd_jax.communications import Round
from nbsgd_jax.communications.adjacency import Neighbours
from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host import events as events_lib
from nbsgd_jax.transforms.asynchronous import Events

STALENESS = ("staleness_s", "staleness_tau", "staleness_tau_max", "staleness_own_steps",
             "staleness_own_steps_max")


class GossipLoopTimes(events_lib.EventTimes):
  """The released AD-PSGD's cadence as the run's clock (module docstring).

  Inputs: ``events`` ``start`` (the worker read its model after the last step's event),
  ``fire`` (its gossip iteration is in the batch), ``peer``, ``apply`` (the iteration applies
  its in-flight gradient). Record: ``sim_time``, ``events`` (gossip iterations so far),
  ``grads_per_worker`` (gradients applied, mean over workers) and the staleness of the module
  docstring.

  Args:
    cluster, touch, message_bytes, step_overhead, reach: as :class:`~nbsgd_jax.host.events.
      EventTimes` (``touch``: the pairing of each iteration).

  Raises:
    ValueError: a message that takes no time (the loop would not advance).
  """

  def __init__(self, cluster, touch: Callable, message_bytes: float,
               step_overhead: float = 0.0, reach: Optional[Callable] = None):
    self._gaps: dict = {}  # worker -> the events that apply a gradient, increasing
    self._rows: dict = {}  # own step c -> the computation's seconds [n]
    super().__init__(cluster, touch, message_bytes, step_overhead, reach)
    if not self.message_s > 0:
      raise ValueError(f"a message of {self.message_bytes:g} bytes takes {self.message_s:g} s "
                       "(cluster.latency, cluster.bandwidth): ad_psgd.order='released' needs "
                       "a positive time per gossip iteration")
    self._reset()

  def _reset(self):
    n = self.cluster.n
    self.events, self.started = 0, np.ones(n, bool)
    self.version = np.zeros(n, np.int64)  # changes to each worker's model so far
    self.read_version = np.zeros(n, np.int64)  # at each worker's read
    self.read_event = np.zeros(n, np.int64)  # events applied (all workers) at its read
    self.read_time = np.zeros(n)  # s, its read
    self.grads, self.stale = 0, {"s": 0.0, "tau": 0, "tau_max": 0, "own": 0, "own_max": 0}

  def _duration(self, k: int) -> np.ndarray:
    return np.full(self.cluster.n, self.message_s)  # every iteration: one message

  def _comm(self, i: int, k: int, touched: tuple) -> float:
    return 0.0

  def _computes(self, i, k):
    return False  # an iteration is one message; its gradients overlap them (inputs)

  def compute_s(self, c: int) -> np.ndarray:
    """float64 ``[n]``: s of each worker's gradient c (its own step c)."""
    if c not in self._rows:
      self._rows[c] = (cluster_lib.minibatch_finish_times(self.cluster, c)[:, -1]
                       + self.overhead)
    return self._rows[c]

  def applying(self, i: int, upto: int) -> list:
    """Worker i's events (own indices, increasing) that apply a gradient, through event
    ``upto`` at least (module docstring)."""
    out = self._gaps.setdefault(i, [])
    while not out or out[-1] < upto:
      gap = max(1, math.ceil(float(self.compute_s(len(out))[i]) / self.message_s - 1e-9))
      out.append((out[-1] if out else -1) + gap)
    return out

  def computed(self, steps) -> np.ndarray:
    """int ``[n]``: gradients worker i applied in its first ``steps[i]`` events."""
    steps = np.asarray(steps, np.int64)
    return np.asarray([np.searchsorted(self.applying(i, int(s)), int(s))
                       for i, s in enumerate(steps)], np.int64)

  def inputs(self, step, inputs, probe):
    sample = self.sample()
    batch = self._next_batch()
    n = self.cluster.n
    masks = events_lib.batch_inputs(batch, n)
    apply = np.zeros(n, bool)
    for e in batch:  # in the order the device applies them
      i = e.worker
      gaps = self.applying(i, e.step)
      due = gaps[bisect.bisect_left(gaps, e.step)] == e.step
      if due:
        self._stale(i, e.time)
        g = bisect.bisect_left(gaps, e.step)  # its gradient's index: overlapped, useful
        self.fleet.compute[i] += float(self.compute_s(g)[i])
        self.fleet.useful[i] += float(self.compute_s(g)[i])
      self.version[list(e.touched)] += 1
      self.events += 1
      if due:
        apply[i] = True
        self.read_version[i], self.read_event[i] = self.version[i], self.events
        self.read_time[i] = e.time
    inputs.events = Events(fire=masks["fire"], start=self.started,
                           peer=self._live_pairs(batch, masks["peer"]),
                           apply=apply, sample=sample, compute=self.started)
    self.started = apply

  def _stale(self, i: int, t: float) -> None:
    s = self.stale
    tau, own = self.events - int(self.read_event[i]), int(self.version[i] - self.read_version[i])
    s["s"] += t - float(self.read_time[i])
    s["tau"], s["tau_max"] = s["tau"] + tau, max(s["tau_max"], tau)
    s["own"], s["own_max"] = s["own"] + own, max(s["own_max"], own)
    self.grads += 1

  def record(self):
    per, s = max(self.grads, 1), self.stale
    return {"events": self.events,
            "grads_per_worker": float(self.computed(self.clock.steps).mean()),
            "staleness_s": s["s"] / per, "staleness_tau": s["tau"] / per,
            "staleness_tau_max": s["tau_max"], "staleness_own_steps": s["own"] / per,
            "staleness_own_steps_max": s["own_max"],
            "grads_computed": self.grads_computed / self.cluster.n, **self._time_fields()}

  def state_dict(self):
    return {"clock": self.clock.state_dict(), "started": self.started.tolist(),
            "events": self.events, "version": self.version.tolist(),
            "read_version": self.read_version.tolist(), "read_event": self.read_event.tolist(),
            "read_time": self.read_time.tolist(), "grads": self.grads, "stale": dict(self.stale),
            "grads_computed": self.grads_computed, "fleet": self.fleet.state_dict()}

  def load_state_dict(self, d):
    self.clock.load_state_dict(d["clock"])
    self.started = np.asarray(d["started"], bool)
    self.events, self.grads = int(d["events"]), int(d["grads"])
    self.grads_computed = int(d.get("grads_computed", 0))
    self.fleet.load_state_dict(d.get("fleet", {}))
    self.version = np.asarray(d["version"], np.int64)
    self.read_version = np.asarray(d["read_version"], np.int64)
    self.read_event = np.asarray(d["read_event"], np.int64)
    self.read_time = np.asarray(d["read_time"], np.float64)
    self.stale = dict(d["stale"])


class OneSidedTimes(events_lib.EventTimes):
  """:class:`~nbsgd_jax.host.events.EventTimes` with one-sided averaging's bytes (module
  docstring): in each pair only the partner (the touched worker that does not fire) sends,
  one model to the initiator."""

  def rounds(self, step, inputs, report) -> list:
    del step, report
    n = self.cluster.n
    peer, fire = np.asarray(inputs.events.peer), np.asarray(inputs.events.fire)
    sends = ((peer != np.arange(n)) & ~fire).astype(np.float64)
    return [Round(Neighbours(np.stack([np.arange(n), peer], 1)), sends,
                  sends * self.message_bytes)]


__all__ = ["GossipLoopTimes", "OneSidedTimes", "STALENESS"]
