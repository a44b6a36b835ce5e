"""Consensus-control targets on the host (Kong et al., ICML 2021): the schedules and the host part.

:class:`Targets` gives every step its target Xi (``target`` input, float32 ``[n]``; ``inf``:
not controlled) from a :class:`TargetSchedule` (absolute, ratio of a
reference run, until a step) or a :class:`CriticalTarget` (``c Gamma_t``
from the measured gradient statistics, observed after every controlled step, and the
smoothness L estimated off the clock every ``smoothness_every`` steps).
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Optional

import numpy as np

from nbsgd_jax import consensus as consensus_lib
from nbsgd_jax.host.parts import HostPart


def _reference_curve(workdir: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, Xi) of a finished run: ``steps.jsonl`` (per step) if present, else the
  evaluations in ``metrics.jsonl``."""
  for name, key in (("steps.jsonl", "consensus_distance"), ("metrics.jsonl",
                                                            "consensus_distance")):
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      steps, xi = [], []
      with open(path) as f:
        for line in f:
          line = line.strip()
          if not line:
            continue
          rec = json.loads(line)
          if rec.get(key) is not None:
            steps.append(rec["step"])
            xi.append(rec[key])
      if steps:
        return np.asarray(steps, np.float64), np.asarray(xi, np.float64)
  raise ValueError(f"consensus.reference_workdir={workdir!r} is not allowed: it holds no "
                   "steps.jsonl or metrics.jsonl with consensus_distance values")


class TargetSchedule:
  """The target Xi of each step, on the host (``inf``: no control at that step).

  Args:
    target: absolute target Xi (> 0), or 0 to use ``target_ratio``.
    target_ratio: target = ratio x the reference run's Xi at that step (linear
      interpolation between its records; constant beyond them), > 0; needs
      ``reference_workdir``.
    reference_workdir: a finished run's workdir.
    until_step: control only the steps < until_step (0: always).

  Raises:
    ValueError: neither or both of target / target_ratio, negative values, or a reference
      run without consensus distances (the message names the field).
  """

  def __init__(self, target: float = 0.0, target_ratio: float = 0.0,
               reference_workdir: str = "", until_step: int = 0):
    if target < 0 or target_ratio < 0:
      raise ValueError(f"consensus.target={target!r} / consensus.target_ratio="
                       f"{target_ratio!r} are not allowed: they must be >= 0")
    if (target > 0) == (target_ratio > 0):
      raise ValueError("consensus control needs exactly one of consensus.target (absolute Xi) "
                       f"and consensus.target_ratio (x a reference run); got target={target!r}, "
                       f"target_ratio={target_ratio!r}")
    if until_step < 0:
      raise ValueError(f"consensus.until_step={until_step!r} is not allowed: it must be >= 0")
    self.target, self.ratio, self.until_step = float(target), float(target_ratio), until_step
    self._curve = None
    if self.ratio > 0:
      if not reference_workdir:
        raise ValueError("consensus.target_ratio needs consensus.reference_workdir (a finished "
                         "run's workdir)")
      self._curve = _reference_curve(reference_workdir)

  def at(self, step: int) -> float:
    """Target Xi for (0-based) ``step``; ``inf`` where control is off. The reference curve
    is read at ``step + 1`` (the Xi after the step)."""
    if self.until_step and step >= self.until_step:
      return math.inf
    if self._curve is None:
      return self.target
    steps, xi = self._curve
    return self.ratio * float(np.interp(step + 1, steps, xi))


NO_CONSTRAINT = float(np.finfo(np.float32).max)


class CriticalTarget:
  """Target ``c Gamma_t`` from measured quantities, on the host.

  Step t's target uses the gradient statistics up to step t - 1 (:func:`gradient_stats`, read
  back from the step's ``aux``), the step size of step t and the latest smoothness estimate;
  the first controlled step has target :data:`NO_CONSTRAINT` (it only measures). One step's
  sketch statistics are noisy (``grad_sq`` is often clipped to 0 when the noise term
  dominates), so they are averaged: an exponential moving average with decay ``ema`` over the
  controlled steps (``s <- ema s + (1 - ema) s_new``, started at the first observation; 0 uses
  the last step's only). The expected gradient norm and noise change slowly with the model,
  so the average trades little bias for much less variance.

  Args:
    num_workers: n.
    scale: c > 0.
    smoothness: L > 0, or 0 to take :meth:`set_smoothness` values (estimates).
    until_step: control only the steps < until_step (0: always).
    ema: decay of the moving average of the gradient statistics, in [0, 1).
    form: ``Gamma_t``'s constants, ``"derived"`` (default) or ``"paper"`` (Kong et al.'s
      Prop. 3.1), see :func:`critical_distance_sq`.

  Raises:
    ValueError: bad values (the message names the field).
  """

  def __init__(self, num_workers: int, scale: float = 1.0, smoothness: float = 0.0,
               until_step: int = 0, ema: float = 0.0, form: str = "derived"):
    if form not in consensus_lib.CRITICAL_FORMS:
      raise ValueError(f"form={form!r} is not allowed: use one of {list(consensus_lib.CRITICAL_FORMS)}")
    self.form = form
    if not 0 <= ema < 1:
      raise ValueError(f"consensus.critical_ema={ema!r} is not allowed: it must be in [0, 1)")
    if not scale > 0:
      raise ValueError(f"consensus.critical_scale={scale!r} is not allowed: it must be > 0")
    if smoothness < 0:
      raise ValueError(f"consensus.smoothness={smoothness!r} is not allowed: it must be >= 0")
    if until_step < 0:
      raise ValueError(f"consensus.until_step={until_step!r} is not allowed: it must be >= 0")
    self.n, self.scale, self.until_step = num_workers, float(scale), until_step
    self.smoothness = float(smoothness) if smoothness > 0 else None
    self._given = smoothness > 0
    self.ema = float(ema)
    self._stats = None

  def set_smoothness(self, value: float) -> None:
    """A new estimate of L (ignored when L was given, and when it is not a finite positive
    number, e.g. from a model with dead units: the previous estimate stays)."""
    value = float(value)
    if not self._given and math.isfinite(value) and value > 0:
      self.smoothness = value

  def state_dict(self) -> dict:
    """JSON-serialisable state (checkpoints)."""
    return {"smoothness": self.smoothness, "stats": self._stats}

  def load_state_dict(self, d: dict) -> None:
    """Continue from :meth:`state_dict`'s output."""
    self.smoothness = d["smoothness"]
    self._stats = None if d["stats"] is None else tuple(d["stats"])

  def observe(self, grad_sq: float, noise: float) -> None:
    """The gradient statistics of the step just taken (into the moving average)."""
    new = (float(grad_sq), float(noise))
    if self._stats is None:
      self._stats = new
    else:
      self._stats = tuple(self.ema * a + (1.0 - self.ema) * b for a, b in zip(self._stats, new))

  @property
  def stats(self) -> Optional[tuple]:
    """The averaged ``(grad_sq, noise)`` behind the next target, or None."""
    return self._stats

  def at(self, step: int, step_size: float) -> float:
    """Target Xi of (0-based) ``step`` with effective step size ``step_size``; ``inf`` where
    control is off, :data:`NO_CONSTRAINT` before any statistics or smoothness exist."""
    if self.until_step and step >= self.until_step:
      return math.inf
    if self._stats is None or self.smoothness is None:
      return NO_CONSTRAINT
    return self.scale * math.sqrt(consensus_lib.critical_distance_sq(*self._stats, step_size,
                                                       self.smoothness, self.n, self.form))


class Targets(HostPart):
  """Consensus-control targets (module docstring).

  Args:
    n: workers.
    schedule: a :class:`TargetSchedule` or
      :class:`CriticalTarget`.
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
    self.critical = isinstance(schedule, CriticalTarget)
    self.smoothness_every, self.until_step = smoothness_every, until_step
    self.extra_gossip = 0

  def needs_report(self, step, inputs):
    # the critical target of the next step uses this step's gradient statistics
    return self.critical and np.isfinite(inputs.target_value)

  def inputs(self, step, inputs, probe):
    if self.critical:
      estimate = (self.smoothness_every and step % self.smoothness_every == 0
                  and (not self.until_step or step < self.until_step))
      if estimate and probe is not None:
        self.schedule.set_smoothness(probe.smoothness())
      target = self.schedule.at(step, self.step_size(step))
    else:
      target = self.schedule.at(step)
    inputs.update(target=np.float32(target), target_value=float(target))

  def observe(self, step, inputs, report, probe):
    k = int(np.asarray(report["gossip_steps"])[0])
    m = int(np.asarray(report["measurements"])[0])
    self.extra_gossip += k
    if self.critical and m > 0:
      self.schedule.observe(float(np.asarray(report["grad_sq"])[0]),
                            float(np.asarray(report["grad_noise"])[0]))
    target = inputs.target_value
    fields = {"target": target if target < NO_CONSTRAINT else None}
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
