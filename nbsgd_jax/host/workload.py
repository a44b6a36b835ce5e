"""The cluster's workload as a host part (:class:`Workload`): every worker's mini-batch finish
times on the simulated cluster (:mod:`nbsgd_jax.host.cluster`), Non-blocking SGD's deadline
and the mini-batches finished by it (He & Dube 2022), and the seconds each worker computed,
of which ``useful`` ended in the model (the goodput's numerator, :mod:`nbsgd_jax.host.
ledger`)."""

from __future__ import annotations

import numpy as np

from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host.parts import HostPart


class Workload(HostPart):
  """The cluster model (:mod:`nbsgd_jax.host.cluster`): every worker's mini-batch finish times, and
  for Non-blocking SGD (He & Dube 2022) the deadline and the mini-batches finished by it.

  Inputs: ``count`` int32 ``[n]`` (``M`` when blocking; 0 for a failed worker), ``total``
  (their sum), and the host-only ``compute`` (seconds of computation of each worker in the
  step, plus ``step_overhead``), ``useful`` (of those seconds, the ones whose work enters the
  model: up to the end of the last counted mini-batch, plus ``step_overhead``; a mini-batch
  still running at a deadline is dropped) and ``deadline`` (seconds; ``inf`` when blocking). A failed
  worker computes nothing and sets no deadline. Record: ``minibatch_fraction``, the
  mini-batches counted so far over ``n M`` per step (1 for a blocking run without failures).

  Args:
    cluster: the :class:`~nbsgd_jax.host.cluster.Cluster`.
    nonblocking: whether workers stop at the deadline.
    deadline: the deadline rule (:func:`nbsgd_jax.host.cluster.parse_deadline`); ``"adaptive"``
      is set from earlier steps (:class:`nbsgd_jax.host.cluster.DeadlineHistory`), the other rules
      from the step's own finish times.
    deadline_group: ``"all"`` (one deadline) or ``"neighbours"`` (each worker's over itself
      and whom it waits for in the step's ``primary`` communication).
    primary: the communication of a step (for ``"neighbours"``), or None.
    adaptive_k, window: the adaptive rule's ``k`` and window (steps).
    step_overhead: seconds per step after the computation (the update and the host's
      dispatch around the collective; ``cluster.step_overhead``), >= 0.

  Raises:
    ValueError: a bad deadline rule, group or adaptive parameter (named).
  """

  name = "workload"

  def __init__(self, cluster, nonblocking: bool = False, deadline="fastest",
               deadline_group: str = "all", primary=None, adaptive_k: float = 2.0,
               window: int = 10, step_overhead: float = 0.0):
    if deadline_group not in ("all", "neighbours"):
      raise ValueError(f"nonblocking.deadline_group={deadline_group!r} is not allowed: use "
                       "one of ['all', 'neighbours']")
    self.cluster, self.nonblocking, self.group = cluster, nonblocking, deadline_group
    self.rule = cluster_lib.check_deadline(cluster, cluster_lib.parse_deadline(deadline))
    self.history = cluster_lib.DeadlineHistory(cluster.n, self.rule, adaptive_k, window)
    self.primary, self.step_overhead = primary, float(step_overhead)
    self.counted = self.offered = 0  # mini-batches counted / the n M of every step so far

  def _group(self, step, inputs):
    if self.group != "neighbours" or self.primary is None or not inputs.period_end:
      return None if self.group != "neighbours" else np.eye(self.cluster.n, dtype=bool)
    adj = self.primary.live_pattern(step, inputs.active, inputs.alive).adjacency
    return adj

  def _deadline(self, step, inputs, finish, alive):
    if self.rule == "adaptive":
      return self.history.deadline()
    # a failed worker sets no deadline: its mini-batches never finish
    live = finish if alive is None else np.where(alive[:, None], finish, np.inf)
    return cluster_lib.deadline(live, self.rule, group=self._group(step, inputs))

  def inputs(self, step, inputs, probe):
    cl, n = self.cluster, self.cluster.n
    finish = cluster_lib.minibatch_finish_times(cl, step)
    alive = inputs.alive
    if self.nonblocking:
      dl = self._deadline(step, inputs, finish, alive)
      count = cluster_lib.finished_counts(finish, dl)
      compute = cluster_lib.compute_time(finish, dl)
      last = np.take_along_axis(finish, np.maximum(count - 1, 0)[:, None], 1)[:, 0]
      useful = np.where(count > 0, last, 0.0)  # the counted mini-batches' seconds
      self.history.observe(cluster_lib.full_time_estimate(last, count, cl.num_minibatches, dl),
                           alive)
    else:
      dl = np.inf
      count = np.full(n, cl.num_minibatches, np.int32)
      compute = useful = cluster_lib.compute_time(finish)
    compute = compute + self.step_overhead
    useful = np.where(useful > 0, useful + self.step_overhead, 0.0)
    if alive is not None:
      count = np.where(alive, count, 0)
      compute = np.where(alive, compute, 0.0)
      useful = np.where(alive, useful, 0.0)
    inputs.update(count=count.astype(np.int32), total=np.int32(count.sum()), compute=compute,
                  useful=useful, deadline=dl)
    self.counted += int(count.sum())
    self.offered += n * cl.num_minibatches

  def record(self):
    return {"minibatch_fraction": self.counted / max(self.offered, 1)}

  def state_dict(self):
    d = {"counted": self.counted, "offered": self.offered}
    if self.rule == "adaptive":
      d["history"] = self.history.state_dict()
    return d

  def load_state_dict(self, d):
    if "history" in d:
      self.history.load_state_dict(d["history"])
    self.counted, self.offered = int(d.get("counted", 0)), int(d.get("offered", 0))


class WholeBatches(HostPart):
  """The event clock's workload: each worker computes its whole batch (``count = M`` for
  every worker, ``total = n M``); the clock itself times each computation (its ``duration``:
  :func:`nbsgd_jax.host.cluster.minibatch_finish_times` of the worker's own step), so the
  lockstep :class:`Workload`'s per-step finish times (0.25 ms a step at n = 1,024) are not
  drawn.

  Args:
    cluster: the :class:`~nbsgd_jax.host.cluster.Cluster` (its n and M).
  """

  name = "workload"

  def __init__(self, cluster):
    self.cluster = cluster
    self.count = np.full(cluster.n, int(cluster.num_minibatches), np.int32)
    self.total = np.int32(self.count.sum())

  def inputs(self, step, inputs, probe):
    inputs.update(count=self.count, total=self.total)


__all__ = ["WholeBatches", "Workload"]
