"""Where a lockstep run's simulated time went, and what it would have taken without stragglers
and failures (:class:`Ledger`, a host part after the :class:`~nbsgd_jax.host.parts.Clock`);
and the restarts of a job whose failures restart it (:class:`Restarts`,
``cluster.failure_policy="restart"``).

Per worker, over the run: the seconds it computed (its steps' ``compute``), the seconds it
spent in blocking communication rounds (``comm_i`` of every round that is neither overlapped
nor deferred: the hidden part of an overlapped round is not communication time), the job's
seconds that passed while it was down (a failure), and the rest of the job's time, waiting
for others (including the end of the run after its own last step). Each as a fraction of the
job's time (``sim_time``), the mean over the workers: ``time_compute + time_comm + time_wait +
time_down = 1``; a restart's lost time (:class:`Restarts`) counts as down for every worker;
a wait for a quorum's repairs (``cluster.quorum_policy='wait'``) as down for the workers
down or repaired during it and as waiting for those that were up. ``goodput`` (:func:`goodput`)
is the part of ``time_compute`` whose work ends in the model, over the same time.

Each step's record (``steps.jsonl``, with per-step records on: ``consensus.log_every_step``)
names the workers that took no part in it, ``absent`` (down, or no mini-batch by a
deadline), when there are any.

The counterfactual ``sim_time_ideal``: the same steps and communication rounds (the bytes the
device reported; a failed worker's are 0) on a second :class:`~nbsgd_jax.host.parts.Clock`,
every worker up and computing at slowdown 1 without straggler delays, episodes or traces
(``time_per_example x batch + overhead`` per step, and the step overhead).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host.parts import Clock, HostPart


class Restarts(HostPart):
  """A failure restarts the whole job from its last checkpoint (``cluster.failure_policy=
  "restart"``): at a step where a failure starts, every clock advances by the job's time
  since the last checkpoint (the steps computed again: a deterministic job recomputes the
  same ones, so the trajectory does not change) plus ``seconds`` (reload and rejoin).
  Checkpoints are taken every ``every`` steps (at the end of steps ``every - 1``, ``2 every -
  1``, ...). Nobody drops out.

  The ledger of two failures between checkpoints (``docs/clock.md``, "Failures"). With a
  checkpoint at job time ``t0``, a failure at the end of step ``s`` (job time ``t1``) loses
  ``t1 - t0`` (steps ``ckpt + 1 .. s``) plus ``R = seconds``: the job restarts at ``t1 + R``
  from the checkpoint's state and is back at the end of step ``s`` at ``2 t1 - t0 + R``. The
  checkpoint it restarted from is still the last one, reached again at ``t1 + R`` (the
  restart's end, not the redo's). A second failure at the end of step ``s2`` (before the next
  checkpoint; the ``D`` seconds of steps ``s + 1 .. s2`` later) loses everything since that
  moment, all the steps since the checkpoint, ``(t1 - t0) + D``, plus one restart ``R``;
  so the checkpoint's time moves to ``t1 + R`` after a restart. E.g. steps of ``T`` s,
  checkpoints every 4 steps, failures at steps 2, 3 and 6: ``(3 T + R) + (4 T + R) + (3 T +
  R) = 10 T + 3 R`` lost (``tests/host/test_ledger.py``).

  Record: ``restarts``, and ``restart_lost`` (simulated seconds lost to them).

  Args:
    clock: the run's :class:`~nbsgd_jax.host.parts.Clock` (observed before this part).
    failures: the schedule's :class:`~nbsgd_jax.host.failures.Failure` s.
    process: a :class:`~nbsgd_jax.host.failures.FailureProcess`, or None.
    every: steps between checkpoints, >= 1.
    seconds: a restart's own seconds, >= 0.
  """

  name = "restarts"

  def __init__(self, clock: Clock, failures, process, every: int, seconds: float):
    self.clock, self.failures, self.process = clock, list(failures), process
    self.every, self.seconds = int(every), float(seconds)
    self.saved = 0.0  # the job's time at the last checkpoint
    self.count, self.lost = 0, 0.0

  def observe(self, step, inputs, report, probe):
    now = float(self.clock.clocks.max())
    if failures_lib.starts(self.failures, self.process, step):
      lost = now - self.saved + self.seconds
      self.clock.clocks = self.clock.clocks + lost
      self.count, self.lost = self.count + 1, self.lost + lost
      # the job is at its checkpoint's state again when the restart ends (then it computes
      # the lost steps again): a later failure before the next checkpoint loses from there
      self.saved = now + self.seconds
      now += lost
    if (step + 1) % self.every == 0:
      self.saved = now
    return None

  def record(self):
    return {"restarts": float(self.count), "restart_lost": self.lost}

  def state_dict(self):
    return {"saved": self.saved, "count": self.count, "lost": self.lost}

  def load_state_dict(self, d):
    self.saved, self.count, self.lost = float(d["saved"]), int(d["count"]), float(d["lost"])


def goodput(useful, sim_time: float) -> float:
  """The fraction of the fleet's time whose work ends in the model: ``sum_i useful_i / (n
  sim_time)``, ``useful_i`` the seconds worker i computed gradients that were applied (not
  the work a deadline dropped, a crash lost or a restart redid; not communication, waiting or
  time down). Decoupled DiLoCo's goodput, "useful training time as a fraction of wall-clock"
  (Douillard et al., arXiv 2604.21428, 2026: 88 % against 27 % for data parallelism), per
  chip; Llama 3's "effective training time" (Dubey et al. 2024, Sec. 3.3.4) is the job-level
  form. ``docs/clock.md``, "Goodput".

  Args:
    useful: float ``[n]``, seconds.
    sim_time: the job's seconds, > 0.
  """
  useful = np.asarray(useful, np.float64)
  return float(useful.sum() / (len(useful) * max(float(sim_time), 1e-300)))


class Ledger(HostPart):
  """The time split and the counterfactual (module docstring).

  Args:
    clock: the run's :class:`~nbsgd_jax.host.parts.Clock` (observed before this part).
    step_overhead: seconds per step after the computation (``cluster.step_overhead``).
  """

  name = "ledger"

  def __init__(self, clock: Clock, step_overhead: float = 0.0,
               restarts: Optional[Restarts] = None):
    cl = clock.cluster
    self.clock, self.restarts, n = clock, restarts, cl.n
    self.shadow = Clock(cl, clock.communications)
    self.nominal = np.full(n, cl.minibatch_size * cl.time_per_example * cl.num_minibatches
                           + cl.overhead * cl.num_minibatches + float(step_overhead))
    self.compute, self.comm, self.down = np.zeros(n), np.zeros(n), np.zeros(n)
    self.useful, self.last, self.restarted = np.zeros(n), np.zeros(n), 0.0

  def observe(self, step, inputs, report, probe):
    alive = np.ones(len(self.last), bool) if inputs.alive is None else np.asarray(inputs.alive)
    comm = self.clock.blocking  # the clock's own charge of the step's blocking rounds
    job = float(self.clock.clocks.max() - self.last.max())
    lost = 0.0 if self.restarts is None else self.restarts.lost - self.restarted
    self.restarted += lost
    self.compute += np.asarray(inputs.compute, np.float64)
    self.useful += np.asarray(inputs.compute if inputs.useful is None else inputs.useful,
                              np.float64)
    self.comm += np.where(alive, comm, 0.0)
    self.down += np.where(alive, lost, job)
    if inputs.repaired is not None:  # repaired while the job waited for its quorum: down
      self.down += np.where(inputs.repaired, inputs.quorum_wait, 0.0)
    self.last = self.clock.clocks.copy()
    ideal = type(inputs)(**{**vars(inputs), "compute": self.nominal, "alive": None,
                            "quorum_wait": 0.0, "repaired": None})
    self.shadow.observe(step, ideal, report, probe)
    absent = [] if inputs.count is None else np.flatnonzero(np.asarray(inputs.count) == 0)
    return {"absent": [int(i) for i in absent]} if len(absent) else None

  def record(self):
    total = max(float(self.clock.clocks.max()), 1e-300)
    parts = {k: float(np.mean(v)) / total
             for k, v in (("time_compute", self.compute), ("time_comm", self.comm),
                          ("time_down", self.down))}
    parts["time_wait"] = max(0.0, 1.0 - sum(parts.values()))
    return {**parts, "sim_time_ideal": self.shadow.sim_time,
            "goodput": goodput(self.useful, total)}

  def state_dict(self):
    return {"compute": self.compute.tolist(), "useful": self.useful.tolist(),
            "comm": self.comm.tolist(),
            "down": self.down.tolist(), "last": self.last.tolist(),
            "restarted": self.restarted, "shadow": self.shadow.state_dict()}

  def load_state_dict(self, d):
    for key in ("compute", "comm", "down", "last"):
      setattr(self, key, np.asarray(d[key], np.float64))
    self.useful = np.asarray(d.get("useful", d["compute"]), np.float64)  # before goodput
    self.restarted = float(d.get("restarted", 0.0))
    self.shadow.load_state_dict(d["shadow"])


__all__ = ["Ledger", "Restarts", "goodput"]
