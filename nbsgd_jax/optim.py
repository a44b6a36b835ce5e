"""The local optimizer and its learning-rate schedule, from the config (optax).

``make_schedule(cfg)`` is the learning rate per step, ``make_optimizer(cfg)`` the optimizer
every worker applies to its gradient (a recipe wraps it: :meth:`nbsgd_jax.recipes.Builder.
optimizer`). The choice lists (:data:`OPTIMIZERS`, :data:`LR_SCHEDULES`,
:data:`WEIGHT_DECAY_ON`) live here; :mod:`nbsgd_jax.config` reads them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("constant", "cosine", "inverse_time", "step")
WEIGHT_DECAY_ON = ("all", "matrices")


def make_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Learning rate per step: optional linear warm-up, then constant, cosine decay to 0,
  inverse time ``learning_rate * t0 / (t + t0)``, ``t0 = lr_time_scale`` (the step sizes of
  the PL analyses, e.g. Haddadpour et al. 2019: ``2 / (mu (t + a))``), or step decays
  (``lr_decay`` at each of ``lr_milestones`` x ``num_steps``, counted from step 0; Goyal et
  al. 2017; the phases of Kong et al. 2021)."""
  decay_steps = max(cfg.num_steps - cfg.warmup_steps, 1)
  if cfg.lr_schedule == "step":
    bounds: dict = {}
    for f in cfg.lr_milestones:  # two milestones on one step decay twice there
      b = max(milestone_step(cfg, f) - cfg.warmup_steps, 1)
      bounds[b] = bounds.get(b, 1.0) * cfg.lr_decay
    main = optax.piecewise_constant_schedule(cfg.learning_rate, bounds)
  elif cfg.lr_schedule == "cosine":  # to lr_min at num_steps (nanoGPT's min_lr)
    main = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps,
                                       alpha=cfg.lr_min / cfg.learning_rate)
  elif cfg.lr_schedule == "inverse_time":  # eta_t = eta t0 / (t + t0), e.g. 2 / (mu (t + a))
    lr, t0 = cfg.learning_rate, float(cfg.lr_time_scale)
    main = lambda step: lr * t0 / (step + t0)
  else:
    main = optax.constant_schedule(cfg.learning_rate)
  if cfg.warmup_steps:
    warm = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warm, main], [cfg.warmup_steps])
  return main


def milestone_step(cfg: ml_collections.ConfigDict, fraction: float) -> int:
  """The first step (0-based) with the decayed rate of the milestone at ``fraction`` of
  ``num_steps``: ``round(fraction * num_steps)``."""
  return int(round(fraction * cfg.num_steps))


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Local optimizer: ``config.optimizer="sgd"``: L2 weight decay added to the gradient, then
  SGD with (Nesterov) momentum; ``"adamw"``: AdamW (Loshchilov & Hutter 2019; DiLoCo's inner
  optimizer, Douillard et al. 2023) with ``b1 = momentum``, ``b2 = adam_b2`` and decoupled
  ``weight_decay``. ``weight_decay_on="matrices"`` decays only parameters with >= 2 axes
  (karpathy/nanoGPT ``configure_optimizers``); ``grad_clip > 0`` first clips the gradient to
  that global L2 norm (``optax.clip_by_global_norm``, nanoGPT's ``grad_clip``)."""
  mask = None
  if cfg.weight_decay_on == "matrices":
    mask = lambda params: jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)
  if cfg.optimizer == "adamw":
    opt = optax.adamw(make_schedule(cfg), b1=cfg.momentum, b2=cfg.adam_b2,
                      weight_decay=cfg.weight_decay, mask=mask)
  else:
    opt = optax.chain(
        optax.add_decayed_weights(cfg.weight_decay, mask) if cfg.weight_decay
        else optax.identity(),
        optax.sgd(make_schedule(cfg), momentum=cfg.momentum or None, nesterov=cfg.nesterov))
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt) if cfg.grad_clip else opt
