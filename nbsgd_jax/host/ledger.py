"""Where a lockstep run's simulated time went, and what it would have taken without stragglers
and failures (:class:`Ledger`, a host part after the :class:`~nbsgd_jax.host.parts.Clock`).

Per worker, over the run: the seconds it computed (its steps' ``compute``), the seconds it
spent in blocking communication rounds (``comm_i`` of every round that is neither overlapped
nor deferred: the hidden part of an overlapped round is not communication time), the job's
seconds that passed while it was down (a failure), and the rest of the job's time, waiting
for others (including the end of the run after its own last step). Each as a fraction of the
job's time (``sim_time``), the mean over the workers: ``time_compute + time_comm + time_wait +
time_down = 1``.

The counterfactual ``sim_time_ideal``: the same steps and communication rounds (the bytes the
device reported; a failed worker's are 0) on a second :class:`~nbsgd_jax.host.parts.Clock`,
every worker up and computing at slowdown 1 without straggler delays, episodes or traces
(``time_per_example x batch + overhead`` per step, and the step overhead).
"""

from __future__ import annotations

import numpy as np

from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host.parts import Clock, HostPart


class Ledger(HostPart):
  """The time split and the counterfactual (module docstring).

  Args:
    clock: the run's :class:`~nbsgd_jax.host.parts.Clock` (observed before this part).
    step_overhead: seconds per step after the computation (``cluster.step_overhead``).
  """

  name = "ledger"

  def __init__(self, clock: Clock, step_overhead: float = 0.0):
    cl = clock.cluster
    self.clock, n = clock, cl.n
    self.shadow = Clock(cl, clock.communications)
    self.nominal = np.full(n, cl.minibatch_size * cl.time_per_example * cl.num_minibatches
                           + cl.overhead * cl.num_minibatches + float(step_overhead))
    self.compute, self.comm, self.down = np.zeros(n), np.zeros(n), np.zeros(n)
    self.last = np.zeros(n)

  def observe(self, step, inputs, report, probe):
    alive = np.ones(len(self.last), bool) if inputs.alive is None else np.asarray(inputs.alive)
    comm = sum((cluster_lib.comm_time(self.clock.cluster, r.messages, r.num_bytes)
                for r in self.clock.rounds(step, inputs, report)
                if not r.overlap and not r.delay), np.zeros(len(self.last)))
    job = float(self.clock.clocks.max() - self.last.max())
    self.compute += np.asarray(inputs.compute, np.float64)
    self.comm += np.where(alive, comm, 0.0)
    self.down += np.where(alive, 0.0, job)
    self.last = self.clock.clocks.copy()
    ideal = type(inputs)(**{**vars(inputs), "compute": self.nominal, "alive": None})
    self.shadow.observe(step, ideal, report, probe)
    return None

  def record(self):
    total = max(float(self.clock.clocks.max()), 1e-300)
    parts = {k: float(np.mean(v)) / total
             for k, v in (("time_compute", self.compute), ("time_comm", self.comm),
                          ("time_down", self.down))}
    parts["time_wait"] = max(0.0, 1.0 - sum(parts.values()))
    return {**parts, "sim_time_ideal": self.shadow.sim_time}

  def state_dict(self):
    return {"compute": self.compute.tolist(), "comm": self.comm.tolist(),
            "down": self.down.tolist(), "last": self.last.tolist(),
            "shadow": self.shadow.state_dict()}

  def load_state_dict(self, d):
    for key in ("compute", "comm", "down", "last"):
      setattr(self, key, np.asarray(d[key], np.float64))
    self.shadow.load_state_dict(d["shadow"])


__all__ = ["Ledger"]
