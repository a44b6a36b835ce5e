"""Consensus control for decentralized SGD (Kong, Lin, Koloskova, Jaggi and Stich, "Consensus
Control for Decentralized Deep Learning", ICML 2021).

The consensus distance ``Xi_t^2 = (1/n) sum_i ||x_i - x_bar||^2`` (their Eq. (1)) explains the
quality gap between decentralized and centralized training; keeping it below a critical value,
mostly early in training, closes the gap (their Sec. 4-5). Control, after a worker's usual
step (local update + one gossip):

    k = 0; measure Xi
    while Xi > target_t and k < K:   gossip once more (x <- W x); k += 1; measure Xi

Two programs live here:

* in the worker program (on the ``"workers"`` axis): :func:`measure_sq` (exact, one
  all-reduce of the model, or a sketch, one all-reduce of ``r`` sampled coordinates) and
  :func:`control` (the loop above, a ``lax.while_loop`` whose predicate is the same on every
  worker because Xi comes from an all-reduce);
* on the host: :class:`TargetSchedule`, the per-step target (absolute, a ratio of a
  reference run's Xi curve, only before ``until_step``, or off = ``inf``).

Every extra gossip and every measurement is counted in the bytes the step reports and in the
simulated clock (:meth:`nbsgd_jax.simulation.Simulator.extra`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from nbsgd_jax import collectives
from nbsgd_jax.algorithms.base import AXIS, tree_bytes, varying_like

MEASURES = ("exact", "sketch")


class Control(NamedTuple):
  """Static settings of consensus control.

  Attributes:
    max_gossip_steps: K, extra gossip steps at most per training step (>= 1).
    measure: ``"exact"`` (Xi from the all-reduced mean model) or ``"sketch"`` (Xi^2 estimated
      unbiasedly from ``sketch_size`` coordinates drawn uniformly with replacement, the
      same on every worker, scaled by d / r).
    sketch_size: r, coordinates of a sketch.
    seed: seed of the sketch coordinates.
  """

  max_gossip_steps: int = 5
  measure: str = "exact"
  sketch_size: int = 1024
  seed: int = 0


def check_control(c: Control) -> Control:
  """Raises ValueError naming the field for a bad :class:`Control`."""
  if not isinstance(c.max_gossip_steps, int) or c.max_gossip_steps < 1:
    raise ValueError(f"consensus.max_gossip_steps={c.max_gossip_steps!r} is not allowed: it "
                     "must be an int >= 1")
  if c.measure not in MEASURES:
    raise ValueError(f"consensus.measure={c.measure!r} is not allowed: use one of "
                     f"{list(MEASURES)}")
  if not isinstance(c.sketch_size, int) or c.sketch_size < 1:
    raise ValueError(f"consensus.sketch_size={c.sketch_size!r} is not allowed: it must be an "
                     "int >= 1")
  return c


def measure_bytes(model_bytes: float, num_workers: int, c: Control) -> float:
  """Bytes one worker sends for one Xi measurement: an all-reduce (ring, 2(n-1)/n of the
  message) of the model of ``model_bytes`` (exact) or of the r float32 sketch coordinates,
  plus one of the scalar ||x_i - x_bar||^2."""
  msg = model_bytes if c.measure == "exact" else 4 * c.sketch_size
  return (collectives.ring_all_reduce_bytes(msg, num_workers)
          + collectives.ring_all_reduce_bytes(4, num_workers))


def measure_sq(params: Any, c: Control, key: Optional[jax.Array] = None,
               axis_name: str = AXIS) -> jax.Array:
  """``Xi^2`` of the workers' models, inside the worker program (same value on every worker).

  Args:
    params: this worker's model (pytree).
    c: the :class:`Control` (``measure``, ``sketch_size``).
    key: PRNG key of the sketch coordinates; must be the same on every worker.
    axis_name: the worker axis.

  Returns:
    float32 scalar: exact Xi^2, or the sketch estimate
    ``(d / r) (1/n) sum_i sum_{s=1..r} (x_i[j_s] - x_bar[j_s])^2`` (unbiased).
  """
  flat, _ = ravel_pytree(params)
  flat = flat.astype(jnp.float32)
  if c.measure == "sketch":
    d = flat.shape[0]
    idx = jax.random.randint(key, (c.sketch_size,), 0, d)
    flat = flat[idx] * jnp.float32(math.sqrt(d / c.sketch_size))
  dev = flat - lax.pmean(flat, axis_name)
  return lax.pmean(jnp.sum(jnp.square(dev)), axis_name)


def measure_sq_reference(params: Any) -> float:
  """Exact ``Xi^2`` of a stack ``[n, ...]`` in float64 numpy (an independent reference)."""
  leaves = [np.asarray(x, np.float64).reshape(np.shape(x)[0], -1)
            for x in jax.tree.leaves(params)]
  x = np.concatenate(leaves, axis=1)
  return float(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))


def control(params: Any, mix: Callable, inputs: Any, num_workers: int, c: Control,
            axis_name: str = AXIS) -> tuple[Any, jax.Array, dict]:
  """Extra gossip while ``Xi > inputs.target`` (at most ``c.max_gossip_steps``).

  Args:
    params: this worker's model after its usual step.
    mix: the mixer, ``(params, inputs) -> (mixed, bytes)``.
    inputs: this worker's :class:`~nbsgd_jax.algorithms.base.StepInputs`; ``inputs.target``
      is the float32 target Xi (``inf``: no control and no measurement this step).
    num_workers: n.
    c: the :class:`Control`.

  Returns:
    ``(params, bytes, aux)``: bytes of the extra gossip plus the measurements;
    ``aux = {"gossip_steps": int32, "consensus_distance": float32 (the last measured Xi, 0
    when not measured), "measurements": int32}``.
  """
  target = jnp.asarray(inputs.target, jnp.float32)
  base = jax.random.fold_in(jax.random.PRNGKey(c.seed), inputs.step)
  one_measure = jnp.float32(measure_bytes(tree_bytes(params), num_workers, c))

  def measure(p, k):
    return measure_sq(p, c, jax.random.fold_in(base, k), axis_name)

  def controlled(p):
    def cond(state):
      _, k, xi2, _ = state
      return (k < c.max_gossip_steps) & (xi2 > target * target)

    def body(state):
      p, k, _, sent = state
      p, b = mix(p, inputs)
      return p, k + 1, measure(p, k + 1), sent + b

    zero = varying_like(jnp.float32(0.0), p)  # bytes may differ by worker (MATCHA)
    p, k, xi2, sent = lax.while_loop(cond, body, (p, jnp.int32(0), measure(p, 0), zero))
    return p, k, jnp.sqrt(xi2), sent + (k + 1).astype(jnp.float32) * one_measure

  def off(p):
    return p, jnp.int32(0), jnp.float32(0.0), varying_like(jnp.float32(0.0), p)

  on = jnp.isfinite(target)
  p, k, xi, sent = lax.cond(on, controlled, off, params)
  aux = {"gossip_steps": k, "consensus_distance": xi,
         "measurements": jnp.where(on, k + 1, 0).astype(jnp.int32)}
  return p, sent, aux


# ----------------------------------------------------------------------------- host


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
