"""How many failures and fail-slow episodes a run's simulated fleet met (:class:`FaultCounts`,
a host part after the clock): the counts the report's table shows beside the time by cause
(``docs/clock.md``).

A failure (:class:`~nbsgd_jax.host.failures.Failure`, of the schedule ``cluster.failures`` or
the process ``cluster.failure_mtbf``) counts once it has begun: on the lockstep clock its
first step is among the steps taken; on the event clock (where worker w's failure at its step
``s`` is down from ``s s0_w`` seconds, :mod:`nbsgd_jax.host.outages`) its start is before the
clock's time. A fail-slow episode (:class:`~nbsgd_jax.host.episodes.SlowEpisodes`) counts
once its first slow step is among the steps the worker took (the event clock: its own
computations). Both are counted on copies of the run's draws made before the run (the same
seeds, so the same failures and episodes), which the run's own draws never see.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Optional

import numpy as np

from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host.parts import Clock, HostPart


class FaultCounts(HostPart):
  """The failures and episodes begun so far (module docstring).

  Record: ``failures`` (with failures on: a schedule or ``cluster.failure_mtbf`` > 0; 0 when
  none has begun) and ``episodes`` (with ``cluster.episode_rate`` > 0), each a count over
  every worker.

  Args:
    schedule: the schedule's :class:`~nbsgd_jax.host.failures.Failure` s.
    process: a :class:`~nbsgd_jax.host.failures.FailureProcess` (a copy of the run's), or
      None.
    episodes: a :class:`~nbsgd_jax.host.episodes.SlowEpisodes` (a copy of the run's), or None.
    failed: ``() -> float [n]``, how far each worker is on its failures' timeline, in steps
      (a failure counts when its start is below it); None: no failures counted.
    stepped: ``() -> int [n]``, the steps each worker took (its episodes' timeline).
  """

  name = "faults"

  def __init__(self, schedule, process, episodes, failed: Optional[Callable],
               stepped: Callable):
    self.schedule, self.process, self.episodes = list(schedule), process, episodes
    self.failed, self.stepped = failed, stepped

  def _failures(self) -> int:
    reach = np.asarray(self.failed(), np.float64)
    count = sum(1 for f in self.schedule if f.start < reach[f.worker])
    if self.process is not None:
      for i, r in enumerate(reach):
        count += sum(1 for f in self.process.worker_failures(i, int(math.ceil(r)))
                     if f.start < r)
    return count

  def record(self):
    out = {}
    if self.failed is not None:
      out["failures"] = self._failures()
    if self.episodes is not None:
      steps = np.asarray(self.stepped(), np.int64)
      out["episodes"] = sum(len(self.episodes.episodes(i, int(s))) for i, s in enumerate(steps))
    return out


def fault_counts(cfg, cluster, clock) -> Optional[FaultCounts]:
  """The :class:`FaultCounts` of a run (None with neither failures nor episodes): ``cfg``
  its config, ``cluster`` its :class:`~nbsgd_jax.host.cluster.Cluster`, ``clock`` its clock
  part (the lockstep :class:`~nbsgd_jax.host.parts.Clock`, or an event clock's
  :class:`~nbsgd_jax.host.events.EventTimes`: its ``clock.now`` (s) and ``clock.steps``)."""
  on = failures_lib.failures_on(cfg)
  if not on and cluster.episodes is None:
    return None
  n = cluster.n
  if isinstance(clock, Clock):  # lockstep: every worker takes every step
    stepped = lambda: np.full(n, clock.steps)
    failed = stepped
  else:  # the event clock: a failure of step s starts at s s0_w seconds
    s0 = failures_lib.nominal_step_seconds(cluster)
    stepped = lambda: clock.clock.steps
    failed = lambda: clock.clock.now / s0
  process = failures_lib.failure_process(cfg, cluster) if on else None
  return FaultCounts(failures_lib.parse_failures(cfg.cluster.failures, n) if on else [],
                     process, copy.deepcopy(cluster.episodes), failed if on else None, stepped)


__all__ = ["FaultCounts", "fault_counts"]
