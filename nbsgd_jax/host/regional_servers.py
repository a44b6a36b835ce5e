"""HALoS's host half: the event clock of a local parameter server (LPS) per region and a
global one (GPS) (Kim et al., ICML 2025, arXiv 2506.04531; utnslab/halos
``src/halos/simulation/common.py`` ``BaseAsyncSimulatior`` and ``exec_halos.py``
``HalosSimulator``, commit 4b5bf73768c1e039bd1f64c3a310025119f05e20). The device half is
:func:`nbsgd_jax.transforms.hierarchical.regional_servers`.

Worker i (region ``i // (n / L)``) repeats a cycle of ``H_i + 1`` events: a pull (its round's
two messages, the push's upload and the pull's download, each at the link between the worker
and its LPS, which sits with the region's first worker), then H_i inner steps (the cluster
model's time each), the last one pushing ``start - end`` to its LPS; the worker reads the
LPS's model at its push. This is the reference's round, ``2 comm + H_i step time``, from the
push that read (from time 0 for the first). Every push touches one shared resource, so the
pushes are applied one a device step in time order (the reference's heap; ties by worker).

When a push is the K-th since its LPS's last merge (``version == merged_version + K``, the
reference's equality: at most one message of the LPS in flight), the LPS sends its update;
the GPS receives it one message later (the link between the region's first worker and worker
0), steps, and sends its model back, which the LPS receives one message after that and merges
(its ``merged_version`` becomes its version then). These messages are drawn here in time order
and handed to the device in the step of the first push after them (:class:`~nbsgd_jax.
transforms.asynchronous.Events` ``slot_kind``, ``slot_region``: at most 2L a step, since each
LPS has one message in flight); nothing reads a server between its messages and the next
push, so applying them then is the reference's order.

Not modelled: the reference's ``worker_id * 1e-6`` ms added to each round (a tie-break: ties
go by worker here too) and the GPS's stop after ``total_steps`` trained steps (a run's budget
is the config's).

Record: as :class:`~nbsgd_jax.host.events.ServerEventTimes` (``pushes``, the staleness of a
push in its LPS's updates since the worker's read) and ``global_updates`` (GPS steps).
"""

from __future__ import annotations

import heapq

import numpy as np

from nbsgd_jax.communications import Round
from nbsgd_jax.communications.adjacency import Neighbours
from nbsgd_jax.host import events as events_lib
from nbsgd_jax.transforms.asynchronous import Events

GPS_RECV, LPS_RECV = 1, 2  # Events.slot_kind


class RegionalServerTimes(events_lib.ServerEventTimes):
  """The event clock of HALoS (module docstring).

  Args:
    cluster, message_bytes, local_steps, step_overhead: as
      :class:`~nbsgd_jax.host.events.ServerEventTimes`.
    regions: L (a divisor of n).
    accumulation: K, pushes an LPS takes between two sends.

  Raises:
    ValueError: L not a divisor of n, or K < 1 (named).
  """

  def __init__(self, cluster, message_bytes: float, local_steps, regions: int,
               accumulation: int, step_overhead: float = 0.0):
    n = cluster.n
    if regions < 1 or n % regions:
      raise ValueError(f"halos.regions={regions} is not allowed with num_workers={n}: a "
                       "divisor of n")
    if accumulation < 1:
      raise ValueError(f"halos.accumulation={accumulation} is not allowed: K >= 1")
    self.regions, self.per, self.k = int(regions), n // int(regions), int(accumulation)
    super().__init__(cluster, message_bytes, local_steps, step_overhead, "instant")
    push = lambda i, k: k % self.cycle[i] == self.cycle[i] - 1
    self._rule0 = lambda i, k: (i, n) if push(i, k) else (i,)
    self.clock = self._new_clock(self._rule0)
    self._reset_servers()

  def _reset_servers(self):
    self.version = np.zeros(self.regions, np.int64)
    self.merged = np.zeros(self.regions, np.int64)
    self.queue: list = []  # (time, seq, kind, region) of the servers' messages in flight
    self.seq, self.global_updates = 0, 0
    self.read_version = np.zeros(self.cluster.n, np.int64)

  def host(self, region: int) -> int:
    """The worker an LPS sits with: its region's first."""
    return region * self.per

  def _duration(self, k: int) -> np.ndarray:
    d = super()._duration(k)
    lps = [2 * self.pair_s(i, self.host(i // self.per)) for i in range(self.cluster.n)]
    return np.where(self._kinds(k) == 0, np.asarray(lps), d)

  def _comm(self, i: int, k: int, touched: tuple) -> float:
    return 0.0  # a round's two messages are its pull's time

  def _send(self, kind: int, region: int, t: float) -> None:
    heapq.heappush(self.queue, (t, self.seq, kind, region))
    self.seq += 1

  def _land(self, before: float) -> list:
    """The servers' messages that land before ``before`` s, in time order, applied here."""
    out = []
    while self.queue and self.queue[0][0] < before:
      t, _, kind, l = heapq.heappop(self.queue)
      out.append((kind, l))
      if kind == GPS_RECV:
        self.global_updates += 1
        self._send(LPS_RECV, l, t + self.pair_s(0, self.host(l)))
      else:
        self.merged[l] = self.version[l]
    return out

  def inputs(self, step, inputs, probe):
    n, sample = self.cluster.n, self.sample()
    batch = self._next_batch()
    pull, push, send = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    stale, slots = np.zeros(n, np.int32), []
    for e in batch:
      kind = e.step % self.cycle[e.worker]
      pull[e.worker] = kind == 0
      if kind != self.cycle[e.worker] - 1:
        continue
      i, l = e.worker, e.worker // self.per
      slots = self._land(e.time)
      push[i], stale[i] = True, self.version[l] - self.read_version[i]
      self.version[l] += 1
      self.read_version[i] = self.version[l]
      self.pushes, self.events = self.pushes + 1, self.events + 1
      self.stale_steps += int(stale[i])
      self.stale_s += e.time - self.pulled_at[i]
      self.stale_max = max(self.stale_max, int(stale[i]))
      self.pulled_at[i] = e.time
      if self.version[l] == self.merged[l] + self.k:
        send[i] = True
        self._send(GPS_RECV, l, e.time + self.pair_s(self.host(l), 0))
    s = 2 * self.regions
    kinds = np.zeros(s, np.int32)
    where = np.zeros(s, np.int32)
    for j, (kind, l) in enumerate(slots):
      kinds[j], where[j] = kind, l
    fire = events_lib.batch_inputs(batch, n)["fire"]
    inputs.events = Events(fire=fire, pull=pull,
                           push=push, read=push, staleness=stale, send=send,
                           slot_kind=np.tile(kinds, (n, 1)), slot_region=np.tile(where, (n, 1)),
                           sample=sample, compute=fire & ~pull)

  def rounds(self, step, inputs, report) -> list:
    """Each pull and push moves one model (the worker's); an LPS's send one (its host's), a
    GPS reply one (worker 0's)."""
    del step, report
    n, ev = self.cluster.n, inputs.events
    moved = (ev.pull | ev.push).astype(np.float64)
    for i in np.flatnonzero(ev.send):
      moved[self.host(i // self.per)] += 1.0
    moved[0] += float(np.sum(ev.slot_kind[0] == GPS_RECV))
    return [Round(Neighbours(np.arange(n)[:, None]), moved, moved * self.message_bytes)]

  def record(self):
    return {**super().record(), "global_updates": self.global_updates}

  def state_dict(self):
    return {**super().state_dict(), "version": self.version.tolist(),
            "merged": self.merged.tolist(), "queue": [list(q) for q in self.queue],
            "seq": self.seq, "global_updates": self.global_updates,
            "read_version": self.read_version.tolist()}

  def load_state_dict(self, d):
    super().load_state_dict(d)
    self.version = np.asarray(d["version"], np.int64)
    self.merged = np.asarray(d["merged"], np.int64)
    self.queue = [(float(t), int(q), int(k), int(l)) for t, q, k, l in d["queue"]]
    heapq.heapify(self.queue)
    self.seq, self.global_updates = int(d["seq"]), int(d["global_updates"])
    self.read_version = np.asarray(d["read_version"], np.int64)


__all__ = ["GPS_RECV", "LPS_RECV", "RegionalServerTimes"]
