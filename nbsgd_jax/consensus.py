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
* on the host (:mod:`nbsgd_jax.host.targets`): ``TargetSchedule``, the per-step target (absolute, a ratio of a
  reference run's Xi curve, only before ``until_step``, or off = ``inf``), and
  ``CriticalTarget``, the critical consensus distance ``Gamma_t`` estimated from measured
  quantities (gradient norm and noise from a sketch all-reduce of the gradients,
  :func:`gradient_stats`; smoothness L from Hessian power iteration,
  :func:`smoothness_estimate`).

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

Every extra gossip and every measurement is counted in the bytes the step reports and in the
simulated clock (:class:`nbsgd_jax.transforms.consensus.ControlRounds`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
from jax import lax
from jax.flatten_util import ravel_pytree

from nbsgd_jax import checks, collectives
from nbsgd_jax.axis import AXIS, tree_bytes, varying_like

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
                                 # Gamma_t, estimated on the fly (nbsgd_jax.host.targets.CriticalTarget)
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
