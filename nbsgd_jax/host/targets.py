"""Consensus-control targets as a host part (Kong et al., ICML 2021).

:class:`Targets` gives every step its target Xi (``target`` input, float32 ``[n]``; ``inf``:
not controlled) from a :class:`nbsgd_jax.consensus.TargetSchedule` (absolute, ratio of a
reference run, until a step) or a :class:`nbsgd_jax.consensus.CriticalTarget` (``c Gamma_t``
from the measured gradient statistics, observed after every controlled step, and the
smoothness L estimated off the clock every ``smoothness_every`` steps).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from nbsgd_jax import consensus as consensus_lib
from nbsgd_jax.host.parts import HostPart


class Targets(HostPart):
  """Consensus-control targets (module docstring).

  Args:
    n: workers.
    schedule: a :class:`~nbsgd_jax.consensus.TargetSchedule` or
      :class:`~nbsgd_jax.consensus.CriticalTarget`.
    step_size: ``step -> eta_t`` (the critical target's effective step size).
    smoothness_every: steps between estimates of L (critical target, L not given).
    until_step: control only the steps < until_step (0: always; L is estimated only then).

  Record: ``extra_gossip_steps`` (all steps so far). Step record: ``target`` (None where it
  does not bind), ``smoothness`` (critical), and None for the measured values of a step that
  measured nothing.
  """

  name = "consensus"

  def __init__(self, n: int, schedule, step_size: Optional[Callable[[int], float]] = None,
               smoothness_every: int = 0, until_step: int = 0):
    self.n, self.schedule, self.step_size = n, schedule, step_size
    self.critical = isinstance(schedule, consensus_lib.CriticalTarget)
    self.smoothness_every, self.until_step = smoothness_every, until_step
    self.extra_gossip = 0

  def needs_report(self, step, inputs):
    # the critical target of the next step uses this step's gradient statistics
    return self.critical and np.isfinite(inputs["target_value"])

  def inputs(self, step, inputs, probe):
    if self.critical:
      estimate = (self.smoothness_every and step % self.smoothness_every == 0
                  and (not self.until_step or step < self.until_step))
      if estimate and probe is not None:
        self.schedule.set_smoothness(probe.smoothness())
      target = self.schedule.at(step, self.step_size(step))
    else:
      target = self.schedule.at(step)
    inputs["target"] = np.float32(target)
    inputs["target_value"] = float(target)

  def observe(self, step, inputs, report, probe):
    k = int(np.asarray(report["gossip_steps"])[0])
    m = int(np.asarray(report["measurements"])[0])
    self.extra_gossip += k
    if self.critical and m > 0:
      self.schedule.observe(float(np.asarray(report["grad_sq"])[0]),
                            float(np.asarray(report["grad_noise"])[0]))
    target = inputs["target_value"]
    fields = {"target": target if target < consensus_lib.NO_CONSTRAINT else None}
    if self.critical:
      fields["smoothness"] = self.schedule.smoothness
    if m == 0:  # control off at this step: nothing measured
      fields["measured_consensus_distance"] = None
      fields.update({k: None for k in ("grad_sq", "grad_noise") if k in report})
    return fields

  def record(self):
    return {"extra_gossip_steps": self.extra_gossip}

  def state_dict(self):
    out = {"extra_gossip": self.extra_gossip}
    if self.critical:
      out["critical"] = self.schedule.state_dict()
    return out

  def load_state_dict(self, d):
    self.extra_gossip = int(d["extra_gossip"])
    if self.critical:
      self.schedule.load_state_dict(d["critical"])
