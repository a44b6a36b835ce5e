"""Consensus-control targets on the host (Kong et al., ICML 2021): the schedules and the host part.

:class:`Targets` gives every step its target Xi (``target`` input, float32 ``[n]``; ``inf``:
not controlled) from a :class:`TargetSchedule` (absolute, ratio of a
reference run, until a step) or a :class:`CriticalTarget` (``c Gamma_t``
from the measured gradient statistics, observed after every controlled step, and the
smoothness L estimated off the clock every ``smoothness_every`` steps).

The critical consensus distance (Kong et al. 2021, Sec. 3, Prop. 3.1: below it D-SGD
converges like centralized mini-batch SGD). With ``x_bar`` the mean model, ``g_bar`` the mean
stochastic gradient, L-smooth ``f`` and per-worker gradient noise ``sigma^2``, the descent
lemma for ``x_bar_{t+1} = x_bar_t - eta g_bar_t`` (eta <= 1/L) gives

    E f(x_bar_{t+1}) <= f(x_bar_t) - eta/2 ||grad f(x_bar_t)||^2 + L eta^2 sigma^2 / (2n)
                        + eta L^2 / 2 Xi_t^2,

the centralized bound plus the consensus term. That term costs at most half the progress term
plus the noise term, i.e. D-SGD keeps the centralized rate up to a factor 2, when

    Xi_t^2 <= Gamma_t^2 = ||grad f(x_bar_t)||^2 / (2 L^2) + eta sigma^2 / (L n).

This is the form of Kong et al.'s critical value (gradient-norm term over L^2 plus a noise term
eta sigma^2 / (L n)) with the constants of the derivation above (``form="derived"``). Kong et al.'s Proposition 3.1 states the critical consensus distance as

    Gamma_t^2 := (1 / (L n)) eta sigma^2 + (1 / (8 L^2)) ||grad f(x_bar_t)||^2

(``form="paper"``, the config's default ``consensus.critical_form``: a gradient term 4x
smaller, the noise term the same). That statement is
taken from a secondary source quoting Prop. 3.1 (and agrees with our reading of the paper);
the paper's own text (arXiv 2102.04828) could not be retrieved here, so check it before
relying on the constant. ``eta`` is the effective step ``lr_t / (1 - momentum)``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Optional

import ml_collections
import numpy as np

from nbsgd_jax.core import checks
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
    if form not in CRITICAL_FORMS:
      raise ValueError(f"form={form!r} is not allowed: use one of {list(CRITICAL_FORMS)}")
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
    return self.scale * math.sqrt(critical_distance_sq(*self._stats, step_size,
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


# ----------------------------------------------------------------------------- Gamma_t


CRITICAL_FORMS = ("derived", "paper")
# the coefficient c of ||grad f||^2 / L^2 in Gamma^2 = c ||grad f||^2 / L^2 + eta sigma^2 / (L n)
_GRAD_COEF = {"derived": 1.0 / 2.0, "paper": 1.0 / 8.0}


def critical_distance_sq(grad_sq: float, noise: float, step_size: float, smoothness: float,
                         num_workers: int, form: str = "derived") -> float:
  """The critical consensus distance squared, in squared parameter units.

  * ``"derived"``: ``Gamma^2 = ||grad f||^2 / (2 L^2) + eta sigma^2 / (L n)`` (the descent-lemma
    derivation in the module docstring; Kong et al.'s form, our constants);
  * ``"paper"``: ``Gamma^2 = eta sigma^2 / (L n) + ||grad f||^2 / (8 L^2)``, Kong et al. 2021,
    Proposition 3.1 (as quoted, see the module docstring).

  Args:
    grad_sq: ``||grad f(x_bar)||^2``; noise: ``sigma^2`` (per-worker gradient variance);
    step_size: eta; smoothness: L > 0; num_workers: n >= 1; form: one of CRITICAL_FORMS.
  Raises:
    ValueError: smoothness <= 0, num_workers < 1 or an unknown form.
  """
  if not smoothness > 0:
    raise ValueError(f"smoothness={smoothness!r} is not allowed: it must be > 0")
  if num_workers < 1:
    raise ValueError(f"num_workers={num_workers!r} is not allowed: it must be >= 1")
  if form not in CRITICAL_FORMS:
    raise ValueError(f"form={form!r} is not allowed: use one of {list(CRITICAL_FORMS)}")
  return (_GRAD_COEF[form] * grad_sq / smoothness ** 2
          + step_size * noise / (smoothness * num_workers))


# The target while no gradient statistics exist yet (the first controlled step): finite, so
# the step measures Xi and the gradients, but never binding.


# ----------------------------------------------------------------------------- config


def consensus_defaults() -> ml_collections.ConfigDict:
  """``config.consensus.*`` with their defaults: consensus distance (Kong et al. 2021)."""
  s = ml_collections.ConfigDict()
  s.control = False              # recipes that gossip every step (recipes.gossip_recipes():
                                 # D-PSGD, MATCHA, CHOCO, gradient tracking, D^2, Gossip-PGA):
                                 # gossip again while Xi > target
  s.target = 0.0                 # absolute target Xi (parameter units); 0: use target_ratio
  s.target_ratio = 0.0           # target = ratio x reference run's Xi at each step
  s.reference_workdir = ""       # the reference run (its steps.jsonl or metrics.jsonl)
  s.critical = False             # target = critical_scale x the critical consensus distance
                                 # Gamma_t, estimated on the fly (nbsgd_jax.host.consensus.CriticalTarget)
  s.critical_scale = 1.0         # c in target = c Gamma_t
  s.critical_form = "paper"      # Gamma_t's constants: paper (Kong et al. Prop. 3.1,
                                 # ||grad f||^2 / (8 L^2) + eta sigma^2 / (L n)) | derived
  s.critical_ema = 0.9           # moving-average decay of the gradient statistics behind
                                  # Gamma_t, in [0, 1) (0: the last step's only)
  s.smoothness = 0.0             # L of Gamma_t; 0: estimated (Hessian power iteration)
  s.smoothness_every = 100       # re-estimate L every this many steps
  s.smoothness_iters = 20        # power iterations (Hessian-vector products) per estimate
  s.until_step = 0               # control only steps < until_step (0: always)
  s.max_gossip_steps = 5         # K: extra gossip steps per training step at most
  s.measure = "exact"            # exact (all-reduce of the model) | sketch (r coordinates)
  s.sketch_size = 1024           # r, coordinates of a sketch measurement
  s.log_every_step = False       # write workdir/steps.jsonl (Xi of every step)
  s.per_layer = False            # add consensus_distance_layers to every evaluation
  return s


def check_config(cfg, errs: list) -> None:
  """consensus.*; with control on, exactly one target (and target_ratio's reference run)."""
  for key in ("control", "log_every_step", "per_layer", "critical"):
    checks.boolean(cfg, errs, f"consensus.{key}")
  for key, lo in (("max_gossip_steps", 1), ("sketch_size", 1), ("until_step", 0),
                  ("smoothness_every", 1), ("smoothness_iters", 1)):
    checks.integer(cfg, errs, f"consensus.{key}", lo)
  for key in ("target", "target_ratio", "smoothness"):
    checks.number(cfg, errs, f"consensus.{key}", 0)
  checks.number(cfg, errs, "consensus.critical_ema", 0, hi=1, hi_open=True)
  checks.number(cfg, errs, "consensus.critical_scale", 0, lo_open=True)
  checks.choice(cfg, errs, "consensus.measure", ("exact", "sketch"))
  checks.choice(cfg, errs, "consensus.critical_form", CRITICAL_FORMS)
  checks.string(cfg, errs, "consensus.reference_workdir")
  cs = cfg.consensus
  if cs.get("control") is not True:
    return
  given = [checks.is_num(cs.target) and cs.target > 0,
           checks.is_num(cs.target_ratio) and cs.target_ratio > 0, cs.critical is True]
  if sum(given) != 1:
    errs.append(f"config.consensus.target={cs.target!r}, config.consensus.target_ratio="
                f"{cs.target_ratio!r} and config.consensus.critical={cs.critical!r} are not "
                "allowed: give exactly one target (target > 0, target_ratio > 0 or "
                "critical=True)")
  elif given[1] and not cs.reference_workdir:
    errs.append(f"config.consensus.target_ratio={cs.target_ratio!r} is not allowed with "
                f"config.consensus.reference_workdir={cs.reference_workdir!r}: it needs "
                "config.consensus.reference_workdir (a finished run's workdir)")
