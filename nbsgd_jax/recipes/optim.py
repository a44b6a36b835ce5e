"""The local optimizer and its learning-rate schedule, from the config (optax), with their
numbers as data.

``make_optimizer(cfg, hp)`` is the optimizer every worker applies to its gradient (a recipe
wraps it: :meth:`nbsgd_jax.recipes.Builder.optimizer`), ``make_schedule(cfg, hp)`` its
learning rate per step. ``cfg`` gives the *structure* (which optimizer, which schedule,
Nesterov, whether momentum / weight decay / clipping are on); ``hp`` the *numbers*
(:func:`hparams`: peak rate, warm-up, decay, momentum, ...), plain floats or traced arrays:
a compiled step that reads them from its inputs runs any other rate or momentum without
compiling again (``docs/design.md``, "Runs as data"). The choice lists (:data:`OPTIMIZERS`,
:data:`LR_SCHEDULES`, :data:`WEIGHT_DECAY_ON`) live here; :mod:`nbsgd_jax.config` reads them.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

OPTIMIZERS = ("sgd", "adamw", "muon")
LR_SCHEDULES = ("constant", "cosine", "inverse_time", "step")
WEIGHT_DECAY_ON = ("all", "matrices")

# the config keys whose values reach the device only through :func:`hparams` (their
# on/off facts, :func:`structure`, are structure)
HPARAM_KEYS = ("learning_rate", "warmup_steps", "num_steps", "lr_min", "lr_time_scale",
               "lr_decay", "lr_milestones", "momentum", "adam_b2", "weight_decay",
               "grad_clip")


def hparams(cfg: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """The optimizer's and the schedule's numbers: float32 scalars ``learning_rate``,
  ``warmup_steps``, ``decay_steps`` (``max(num_steps - warmup_steps, 1)``), ``lr_min``,
  ``lr_time_scale``, ``lr_decay``, ``momentum``, ``adam_b2``, ``weight_decay``,
  ``grad_clip``, and ``lr_bounds``: int32 ``[len(lr_milestones)]``, the steps after the
  warm-up at which the step schedule decays (:func:`milestone_step`)."""
  f = lambda x: np.float32(x)
  bounds = [max(milestone_step(cfg, m) - cfg.warmup_steps, 1) for m in cfg.lr_milestones]
  return {"learning_rate": f(cfg.learning_rate), "warmup_steps": f(cfg.warmup_steps),
          "decay_steps": f(max(cfg.num_steps - cfg.warmup_steps, 1)), "lr_min": f(cfg.lr_min),
          "lr_time_scale": f(cfg.lr_time_scale), "lr_decay": f(cfg.lr_decay),
          "lr_bounds": np.asarray(sorted(bounds), np.int32).reshape(-1),
          "momentum": f(cfg.momentum), "adam_b2": f(cfg.adam_b2),
          "weight_decay": f(cfg.weight_decay), "grad_clip": f(cfg.grad_clip)}


def structure(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
  """What of :data:`HPARAM_KEYS` changes the program rather than its inputs: whether
  momentum, weight decay and clipping are on (SGD's momentum buffer, the chain's parts)."""
  return {"momentum_on": bool(cfg.momentum), "weight_decay_on_": bool(cfg.weight_decay),
          "grad_clip_on": bool(cfg.grad_clip)}


def make_schedule(cfg: ml_collections.ConfigDict,
                  hp: Optional[Mapping[str, Any]] = None) -> optax.Schedule:
  """Learning rate per step: optional linear warm-up, then constant, cosine decay to
  ``lr_min`` at T (nanoGPT's ``min_lr``), inverse time ``learning_rate * t0 /
  (t + t0)``, ``t0 = lr_time_scale`` (the step sizes of the PL analyses, e.g. Haddadpour et
  al. 2019: ``2 / (mu (t + a))``), or step decays (``lr_decay`` at each of ``lr_milestones``
  x T, counted from step 0; Goyal et al. 2017; the phases of Kong et al. 2021), T =
  ``num_steps``. The step is the optimizer's own count: a worker's updates, one per gradient
  it applies (on the event clock, its own events: with ``budget_unit="grads_per_worker"``
  the schedule ends with the run for the mean worker).

  The formulas of optax's ``linear_schedule``, ``cosine_decay_schedule``,
  ``piecewise_constant_schedule`` and ``join_schedules`` (the tests hold them to optax's),
  written so that every number may be a traced array.

  Args:
    cfg: the config (its ``lr_schedule`` is structure).
    hp: :func:`hparams` (floats or arrays); None: those of ``cfg``.
  """
  hp = hparams(cfg) if hp is None else hp
  kind = cfg.lr_schedule
  lr, warm = hp["learning_rate"], hp["warmup_steps"]

  def main(t):
    if kind == "step":  # lr * lr_decay^(bounds passed)
      passed = jnp.sum(jnp.asarray(hp["lr_bounds"]) <= t)
      return lr * hp["lr_decay"] ** passed.astype(jnp.float32)
    if kind == "cosine":
      d = hp["decay_steps"]
      alpha = hp["lr_min"] / lr
      cos = 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(t, d) / d))
      return lr * ((1 - alpha) * cos + alpha)
    if kind == "inverse_time":
      return lr * hp["lr_time_scale"] / (t + hp["lr_time_scale"])
    return lr * jnp.ones_like(t)

  def schedule(count):
    t = jnp.asarray(count, jnp.float32)
    warming = lr * t / jnp.maximum(warm, 1.0)
    return jnp.where(t < warm, warming, main(t - warm))

  return schedule


def schedule_count(opt_state: Any) -> Optional[jax.Array]:
  """The local optimizer's own count in a worker's transform state ``opt_state`` (any
  pytree): the ``count`` of the first optax ``ScaleByScheduleState`` in ``jax.tree`` order,
  the stage of :func:`make_optimizer` that scales by :func:`make_schedule` (Muon's two
  branches hold one each, equal). It advances once per update the optimizer applies, not on
  the steps it skips (:func:`nbsgd_jax.transforms.skip_when_idle` keeps the state). None:
  no scheduled optax optimizer in ``opt_state``."""
  is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_sched) if is_sched(x)]
  return found[0].count if found else None


def step_rate(cfg: ml_collections.ConfigDict, opt_state: Any,
              hp: Optional[Mapping[str, Any]] = None) -> tuple[Any, Any]:
  """``(learning_rate, opt_step)`` of a worker's local optimizer at this step, the numbers it
  applies: ``opt_step`` = :func:`schedule_count` of ``opt_state`` (int32 scalar) and
  ``learning_rate`` = :func:`make_schedule` ``(cfg, hp)`` at it (float32 scalar, the schedule
  :func:`make_optimizer` builds from the same ``cfg`` and ``hp``). The trainer puts them in
  the step's context (``StepContext.learning_rate`` / ``opt_step``) before the recipe's
  transform runs; ``(None, None)`` when ``opt_state`` holds no scheduled optimizer.

  Args:
    cfg: the run's config (its ``lr_schedule`` is structure).
    opt_state: one worker's transform state, before this step's update.
    hp: the step's hyperparameters (:func:`hparams`' keys among them; arrays or floats);
      None: those of ``cfg``.
  """
  count = schedule_count(opt_state)
  if count is None:
    return None, None
  count = jnp.asarray(count, jnp.int32)
  return jnp.asarray(make_schedule(cfg, hp)(count), jnp.float32), count


def milestone_step(cfg: ml_collections.ConfigDict, fraction: float) -> int:
  """The first step (0-based) with the decayed rate of the milestone at ``fraction`` of
  ``num_steps``: ``round(fraction * num_steps)``."""
  return int(round(fraction * cfg.num_steps))


def make_optimizer(cfg: ml_collections.ConfigDict,
                   hp: Optional[Mapping[str, Any]] = None) -> optax.GradientTransformation:
  """Local optimizer: ``config.optimizer="sgd"``: L2 weight decay added to the gradient, then
  SGD with (Nesterov) momentum; ``"adamw"``: AdamW (Loshchilov & Hutter 2019; DiLoCo's inner
  optimizer, Douillard et al. 2023) with ``b1 = momentum``, ``b2 = adam_b2`` and decoupled
  ``weight_decay``; ``"muon"``: optax's Muon (``optax.contrib.muon``, Jordan et al. 2024:
  the momentum of each matrix orthogonalised by Newton-Schulz, the other parameters by Adam;
  MuLoCo is DiLoCo with it as the inner optimizer) with ``beta = momentum``, decoupled
  ``weight_decay`` and Adam's ``b2 = adam_b2``. ``weight_decay_on="matrices"`` decays only parameters with >= 2 axes
  (karpathy/nanoGPT ``configure_optimizers``); ``grad_clip > 0`` first clips the gradient to
  that global L2 norm (``optax.clip_by_global_norm``, nanoGPT's ``grad_clip``).

  Args:
    cfg: the config (structure: :func:`structure` and the choices).
    hp: :func:`hparams` (floats or traced arrays); None: those of ``cfg``. The state's
      structure does not depend on ``hp``: one ``init`` serves every value.
  """
  hp = hparams(cfg) if hp is None else hp
  mask = None
  if cfg.weight_decay_on == "matrices":
    mask = lambda params: jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)
  sched = make_schedule(cfg, hp)
  if cfg.optimizer == "adamw":
    opt = optax.adamw(sched, b1=hp["momentum"], b2=hp["adam_b2"],
                      weight_decay=hp["weight_decay"], mask=mask)
  elif cfg.optimizer == "muon":
    opt = optax.contrib.muon(sched, beta=hp["momentum"], weight_decay=hp["weight_decay"],
                             weight_decay_mask=mask, nesterov=cfg.nesterov,
                             adam_b2=hp["adam_b2"])
  else:
    opt = optax.chain(
        optax.add_decayed_weights(hp["weight_decay"], mask) if cfg.weight_decay
        else optax.identity(),
        optax.sgd(sched, momentum=hp["momentum"] if cfg.momentum else None,
                  nesterov=cfg.nesterov))
  return optax.chain(optax.clip_by_global_norm(hp["grad_clip"]), opt) if cfg.grad_clip else opt
