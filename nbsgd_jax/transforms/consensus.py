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
* on the host (:mod:`nbsgd_jax.host.consensus`, with the critical distance's formula and
  ``config.consensus``): ``TargetSchedule``, the per-step target (absolute, a ratio of a
  reference run's Xi curve, only before ``until_step``, or off = ``inf``), and
  ``CriticalTarget``, the critical consensus distance ``Gamma_t`` estimated from measured
  quantities (gradient norm and noise from a sketch all-reduce of the gradients,
  :func:`gradient_stats`; smoothness L from Hessian power iteration,
  :func:`smoothness_estimate`).

Here also: consensus control as a wrapper over any recipe that gossips, and the exact
consensus distance as a per-step diagnostic. :func:`consensus_control` runs the wrapped transform, then gossips again (at most K times) while
the measured ``Xi > ctx.target`` (:func:`control`); with
``gradient_stats`` it also estimates the gradient norm and noise behind the critical target
(:func:`gradient_stats`) on every controlled step. Its communications: the
controlling gossip and its measurements (:class:`ControlRounds`, interleaved as they run) and
the gradient sketch all-reduce; the clock charges the bytes the device reports.

Every extra gossip and every measurement is counted in the bytes the step reports and in the
simulated clock (:class:`ControlRounds`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from nbsgd_jax.communications import AllReduce, Communication, Pattern, Round, collectives
from nbsgd_jax.core.axis import AXIS, tree_bytes, varying_like
from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params)


# ----------------------------------------------------------------------------- the wrapper


class ControlRounds(Communication):
  """The extra gossip rounds and Xi measurements of consensus control, as the clock sees them:
  a measurement (an all-reduce of the model or sketch and of a scalar: ``4 (n - 1)``
  messages, everyone waits) then, ``k`` times, one more round of ``gossip`` and a measurement.

  The device reports ``gossip_steps`` (k), ``measurements`` (m) and the bytes of each kind
  (``bytes/consensus.gossip``, ``bytes/consensus.measure``).
  """

  def __init__(self, gossip: Communication, key: str = "consensus"):
    super().__init__(gossip.n, gossip.axis_name, key)
    self.gossip = gossip
    self.measure = AllReduce(gossip.n, gossip.axis_name, key + ".measure", parts=2)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    return self.gossip.pattern(step, active)

  def clock_rounds(self, step: int, active: np.ndarray, alive: Optional[np.ndarray],
                   report: dict) -> list[Round]:
    if "gossip_steps" not in report:
      return []
    k, m = int(np.max(report["gossip_steps"])), int(np.max(report["measurements"]))
    out: list[Round] = []
    if k:
      g = self.gossip.live_pattern(step, active, alive)
      g_round = Round(g.adjacency, g.messages,
                      np.asarray(report[f"bytes/{self.key}.gossip"], np.float64) / k,
                      g.collective)
    if m:
      p = self.measure.live_pattern(step, active, alive)
      m_round = Round(p.adjacency, p.messages,
                      np.asarray(report[f"bytes/{self.key}.measure"], np.float64) / m,
                      p.collective)
    for r in range(max(k, m)):
      if r < m:
        out.append(m_round)
      if r < k:
        out.append(g_round)
    return out


def consensus_control(inner, gossip: Communication, settings: Control,
                      num_workers: int, log_consensus: bool = False) -> WorkerTransform:
  """``inner``, then gossip over ``gossip`` while ``Xi > ctx.target`` (Kong et al. 2021).

  Args:
    inner: the wrapped transform (a recipe that gossips).
    gossip: the communication of the extra rounds (MATCHA: the base graph's static W; one
      sampled W(t) is contractive only in expectation).
    settings: the static settings (:class:`Control`); with
      ``settings.gradient_stats`` the critical target's statistics are measured too.
    num_workers: n.
    log_consensus: also report the exact Xi after the step (``consensus_distance``).

  Returns:
    a :class:`~nbsgd_jax.transforms.WorkerTransform` whose report adds ``gossip_steps``,
    ``measurements``, ``measured_consensus_distance`` (0 where not measured) and, with
    gradient statistics, ``grad_sq`` and ``grad_noise``.

  Raises:
    ValueError: bad ``settings`` values (named).
  """
  check_control(settings)
  inner = as_worker_transform(inner)
  rounds = ControlRounds(gossip)
  stats = AllReduce(num_workers, gossip.axis_name, "consensus_stats", parts=2)
  axis = gossip.axis_name

  def grad_stats(grads, ctx):
    key = jax.random.fold_in(jax.random.PRNGKey(settings.seed + 1), ctx.step)
    cost = gradient_stats_bytes(num_workers, settings)

    def on(g):
      gs, noise = gradient_stats(g, settings, key, num_workers, axis)
      return gs, noise, jnp.float32(cost), jnp.int32(1)

    def off(g):
      del g
      return jnp.float32(0.0), jnp.float32(0.0), jnp.float32(0.0), jnp.int32(0)

    gs, noise, sent, used = lax.cond(jnp.isfinite(ctx.target), on, off, grads)
    sent = stats.charge(varying_like(sent, grads), ctx)
    return {"grad_sq": gs, "grad_noise": noise, **stats.report(sent, used)}

  def mix_bytes(p, ctx):
    mixed, report = gossip.mix(p, ctx)
    return mixed, report["bytes_sent"]

  def update(grads, state, params, ctx):
    extra = grad_stats(grads, ctx) if settings.gradient_stats else {}
    updates, state, report = inner.update(grads, state, params, ctx)
    x = optax.apply_updates(params, updates)
    x, _, aux = control(x, mix_bytes, ctx, num_workers, settings, axis)
    gossiped = aux["gossip_bytes"]  # already 0 for a failed worker (Gossip.mix)
    measure = rounds.charge(aux["measure_bytes"], ctx)  # a failed worker measures nothing
    ctl = {"gossip_steps": aux["gossip_steps"], "measurements": aux["measurements"],
           "measured_consensus_distance": aux["consensus_distance"],
           "bytes_sent": gossiped + measure, f"bytes/{rounds.key}.gossip": gossiped,
           f"bytes/{rounds.key}.measure": measure}
    report = merge_reports(report, ctl, extra)
    if log_consensus:
      report = merge_reports(report, {"consensus_distance": exact_distance(x, axis)})
    return replace_params(params, x), state, report

  comms = inner.communications + (rounds,) + ((stats,) if settings.gradient_stats else ())
  return WorkerTransform(inner.init, update, comms)


def exact_distance(params: Any, axis_name) -> jax.Array:
  """Exact ``Xi`` of the workers' models (float32, the same on every worker; a diagnostic of
  the simulation, not charged in bytes)."""
  return jnp.sqrt(measure_sq(params, Control(), None, axis_name))


def log_consensus_distance(inner, axis_name) -> WorkerTransform:
  """``inner`` plus the exact Xi after the step in the report (``consensus_distance``)."""
  inner = as_worker_transform(inner)

  def update(grads, state, params, ctx):
    updates, state, report = inner.update(grads, state, params, ctx)
    xi = exact_distance(optax.apply_updates(params, updates), axis_name)
    return updates, state, merge_reports(report, {"consensus_distance": xi})

  return WorkerTransform(inner.init, update, inner.communications)


# ----------------------------------------------------------------------------- measurement and control

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
    gradient_stats: also estimate the gradient norm and noise of every controlled step
      (:func:`gradient_stats`, one sketch all-reduce of the gradients) for
      :class:`CriticalTarget`.
  """

  max_gossip_steps: int = 5
  measure: str = "exact"
  sketch_size: int = 1024
  seed: int = 0
  gradient_stats: bool = False


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
               axis_name: str = AXIS, alive: Optional[jax.Array] = None) -> jax.Array:
  """``Xi^2`` of the workers' models, inside the worker program (same value on every worker).

  With ``alive`` (bool ``[n]``, simulated failures) Xi is that of the live workers:
  ``(1/|L|) sum_{i in L} ||x_i - x_bar_L||^2`` with ``x_bar_L`` their mean (a failed worker's
  frozen model is out of gossip's reach and would make a target unreachable).

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
  if alive is None:
    dev = flat - lax.pmean(flat, axis_name)
    return lax.pmean(jnp.sum(jnp.square(dev)), axis_name)
  up = alive.astype(jnp.float32)
  w = up[lax.axis_index(axis_name)] / jnp.maximum(jnp.sum(up), 1.0)
  dev = flat - lax.psum(w * flat, axis_name)
  return lax.psum(w * jnp.sum(jnp.square(dev)), axis_name)


def measure_sq_reference(params: Any) -> float:
  """Exact ``Xi^2`` of a stack ``[n, ...]`` in float64 numpy (an independent reference)."""
  leaves = [np.asarray(x, np.float64).reshape(np.shape(x)[0], -1)
            for x in jax.tree.leaves(params)]
  x = np.concatenate(leaves, axis=1)
  return float(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))


def gradient_stats_bytes(num_workers: int, c: Control) -> float:
  """Bytes one worker sends for :func:`gradient_stats`: a ring all-reduce of the r float32
  sketch coordinates and one of a scalar."""
  return (collectives.ring_all_reduce_bytes(4 * c.sketch_size, num_workers)
          + collectives.ring_all_reduce_bytes(4, num_workers))


def gradient_stats(grads: Any, c: Control, key: jax.Array, num_workers: int,
                   axis_name: str = AXIS) -> tuple[jax.Array, jax.Array]:
  """Estimates of ``||grad f(x_bar)||^2`` and the gradient noise ``sigma^2``, in the worker
  program, from a sketch of r = ``c.sketch_size`` coordinates (the same on every worker).

  With ``s_i`` = worker i's gradient at r coordinates drawn uniformly with replacement, scaled
  by ``sqrt(d / r)`` (so ``E ||s||^2 = ||g||^2``), ``m = pmean(s_i)``:

  * ``noise = n / (n - 1) pmean(||s_i - m||^2)``: unbiased for the spread
    ``1/(n-1) sum_i ||g_i - g_bar||^2`` = sigma^2 plus the data heterogeneity (an upper
    estimate of sigma^2 on non-iid data);
  * ``grad_sq = max(||m||^2 - noise / n, 0)``: ``||g_bar||^2`` less its noise.

  Args:
    grads: this worker's stochastic gradient (pytree).
    c: the :class:`Control` (``sketch_size``).
    key: PRNG key of the coordinates (the same on every worker).
    num_workers: n (>= 2 for the noise; n = 1 gives noise 0).
    axis_name: the worker axis.

  Returns:
    ``(grad_sq, noise)``, float32 scalars, the same on every worker. Cost:
    :func:`gradient_stats_bytes`.
  """
  flat, _ = ravel_pytree(grads)
  flat = flat.astype(jnp.float32)
  d = flat.shape[0]
  idx = jax.random.randint(key, (c.sketch_size,), 0, d)
  s = flat[idx] * jnp.float32(math.sqrt(d / c.sketch_size))
  m = lax.pmean(s, axis_name)
  spread = lax.pmean(jnp.sum(jnp.square(s - m)), axis_name)
  noise = spread * (num_workers / (num_workers - 1)) if num_workers > 1 else jnp.float32(0.0)
  grad_sq = jnp.maximum(jnp.sum(jnp.square(m)) - noise / num_workers, 0.0)
  return grad_sq, noise


def smoothness_estimate(loss_fn: Callable[[Any], jax.Array], params: Any, iters: int = 20,
                        seed: int = 0) -> jax.Array:
  """Estimate of the smoothness L = |lambda_max| of the Hessian of ``loss_fn`` at ``params``
  by power iteration with Hessian-vector products (forward-over-reverse).

  Args:
    loss_fn: ``params -> float32 scalar`` (e.g. the mean loss on a fixed batch).
    params: one model (pytree).
    iters: power iterations (>= 1); cost: ``iters`` Hessian-vector products, about
      2 x iters gradient evaluations.
    seed: of the start vector.

  Returns:
    float32 scalar ``||H v||`` for the last unit iterate v (-> |lambda|_max).

  Raises:
    ValueError: iters < 1.
  """
  if iters < 1:
    raise ValueError(f"consensus.smoothness_iters={iters!r} is not allowed: it must be >= 1")
  flat, unravel = ravel_pytree(params)

  def hvp(v):
    return ravel_pytree(jax.jvp(jax.grad(loss_fn), (params,), (unravel(v),))[1])[0]

  v = jax.random.normal(jax.random.PRNGKey(seed), flat.shape, flat.dtype)
  v = v / jnp.linalg.norm(v)

  def body(_, carry):
    v, _ = carry
    hv = hvp(v)
    norm = jnp.linalg.norm(hv)
    return hv / jnp.maximum(norm, 1e-30), norm

  _, norm = lax.fori_loop(0, iters, body, (v, jnp.zeros((), flat.dtype)))
  return norm


def control(params: Any, mix: Callable, inputs: Any, num_workers: int, c: Control,
            axis_name: str = AXIS) -> tuple[Any, jax.Array, dict]:
  """Extra gossip while ``Xi > inputs.target`` (at most ``c.max_gossip_steps``).

  Args:
    params: this worker's model after its usual step.
    mix: the mixer, ``(params, inputs) -> (mixed, bytes)``.
    inputs: this worker's :class:`~nbsgd_jax.transforms.StepContext`; ``inputs.target``
      is the float32 target Xi (``inf``: no control and no measurement this step).
    num_workers: n.
    c: the :class:`Control`.

  Returns:
    ``(params, bytes, aux)``: bytes of the extra gossip plus the measurements;
    ``aux = {"gossip_steps": int32, "consensus_distance": float32 (the last measured Xi, 0
    when not measured), "measurements": int32, "gossip_bytes", "measure_bytes": float32 (the
    two parts of the bytes)}``.
  """
  target = jnp.asarray(inputs.target, jnp.float32)
  base = jax.random.fold_in(jax.random.PRNGKey(c.seed), inputs.step)
  one_measure = jnp.float32(measure_bytes(tree_bytes(params), num_workers, c))

  def measure(p, k):
    return measure_sq(p, c, jax.random.fold_in(base, k), axis_name,
                      getattr(inputs, "alive", None))

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
    return p, k, jnp.sqrt(xi2), sent

  def off(p):
    return p, jnp.int32(0), jnp.float32(0.0), varying_like(jnp.float32(0.0), p)

  on = jnp.isfinite(target)
  p, k, xi, gossip = lax.cond(on, controlled, off, params)
  measurements = jnp.where(on, k + 1, 0).astype(jnp.int32)
  measured = measurements.astype(jnp.float32) * one_measure
  aux = {"gossip_steps": k, "consensus_distance": xi, "measurements": measurements,
         "gossip_bytes": gossip, "measure_bytes": measured}
  return p, gossip + measured, aux


