"""The decentralized line that draws a fresh graph each round, as recipes with their config
sections (keys named as in each reference): Epidemic Learning and Teleportation
(``docs/algorithms.md``)."""

from __future__ import annotations

import ml_collections

from nbsgd_jax.communications import random_mixing as RM
from nbsgd_jax.core import checks
from nbsgd_jax.recipes.builder import Builder
from nbsgd_jax.recipes.registry import Recipe, Section, register
from nbsgd_jax.transforms import algorithms as A
from nbsgd_jax.transforms.wrappers import held_models

EL_VARIANTS = ("local", "oracle")
_MODELS = "it exchanges whole models (a codec on them is not built)"


def epidemic_defaults() -> ml_collections.ConfigDict:
  """``config.epidemic.*`` with their defaults: decentralizepy's ``config_EL.ini``."""
  s = ml_collections.ConfigDict()
  s.variant = "local"            # local: EL-Local (each node sends to s random others) |
                                 # oracle: EL-Oracle (a fresh random s-regular graph a round)
  s.graph_degree = 7             # s: the receivers (local) or the degree (oracle)
  s.rounds = 10                  # H: local steps per communication round (TRAIN_PARAMS rounds)
  return s


def check_epidemic_config(cfg, errs: list) -> None:
  """epidemic.variant; graph_degree, rounds >= 1."""
  checks.choice(cfg, errs, "epidemic.variant", EL_VARIANTS)
  checks.integer(cfg, errs, "epidemic.graph_degree", 1, note="s")
  checks.integer(cfg, errs, "epidemic.rounds", 1, note="H")


def _check_epidemic(cfg, errs: list) -> None:
  """A round within the run; ``s`` < n (and ``n s`` even for EL-Oracle)."""
  checks.period_within_run(cfg, errs, "epidemic.rounds", True)
  c, n = cfg.epidemic, cfg.num_workers
  s = c.get("graph_degree")
  if checks.is_int(s) and checks.is_int(n) and s >= 1 and (
      s > n - 1 or (c.get("variant") == "oracle" and (n * s) % 2)):
    errs.append(f"config.epidemic.graph_degree={s} is not allowed with config.num_workers={n}:"
                f" it must be at most {n - 1}" + (", with n s even (an s-regular graph)"
                                                  if c.get("variant") == "oracle" else ""))


EPIDEMIC = Section(epidemic_defaults, check_epidemic_config,
                   "Epidemic Learning (de Vos et al. 2023)")


@register("epidemic", no_compression="Epidemic Learning " + _MODELS,
          sections={"epidemic": EPIDEMIC}, check=_check_epidemic, face="epidemic")
def epidemic(b: Builder) -> Recipe:
  """Epidemic Learning (de Vos et al. 2023): H local steps, then each node's uniform average
  of its model and those it received over the round's random graph (EL-Local or EL-Oracle)."""
  c = b.cfg.epidemic
  rule = (RM.epidemic_local if c.variant == "local" else RM.epidemic_oracle)(
      b.n, c.graph_degree, b.cfg.seed)
  mixing = RM.RandomMixing(b.n, rule, c.rounds, b.axis_name, "epidemic")
  return Recipe(A.epidemic(b.optimizer("local"), mixing), decentralized=True, primary=mixing,
                planner=b.fixed_periods(c.rounds))


def teleportation_defaults() -> ml_collections.ConfigDict:
  """``config.teleportation.*`` with their defaults: the reference simulator's arguments
  (its ``--sample-size`` default 10 is not a power of two; 8 here)."""
  s = ml_collections.ConfigDict()
  s.sample_size = 8              # k: active nodes (slots) per round, a power of two
  s.local_steps = 5              # H: local steps of an active node per round
  return s


def check_teleportation_config(cfg, errs: list) -> None:
  """teleportation.sample_size >= 2, local_steps >= 1."""
  checks.integer(cfg, errs, "teleportation.sample_size", 2, note="k")
  checks.integer(cfg, errs, "teleportation.local_steps", 1, note="H")


def _check_teleportation(cfg, errs: list) -> None:
  """A round within the run; ``k`` a power of two at most n."""
  checks.period_within_run(cfg, errs, "teleportation.local_steps", True)
  k, n = cfg.teleportation.get("sample_size"), cfg.num_workers
  if checks.is_int(k) and checks.is_int(n) and k >= 2 and (k > n or k & (k - 1)):
    errs.append(f"config.teleportation.sample_size={k} is not allowed with "
                f"config.num_workers={n}: it must be a power of two at most {n} (the slots' "
                "graph is log2(k)-regular)")


TELEPORTATION = Section(teleportation_defaults, check_teleportation_config,
                        "Teleportation (Takezawa & Stich 2025)")


@register("teleportation", no_compression="Teleportation " + _MODELS,
          sections={"teleportation": TELEPORTATION}, check=_check_teleportation,
          face="teleportation")
def teleportation(b: Builder) -> Recipe:
  """Teleportation (Takezawa & Stich 2025): k of the n nodes active per round, holding k slots
  that average over a fixed log2(k)-regular graph and move to the next round's nodes; an
  evaluation reads the mean of the slots' models."""
  c = b.cfg.teleportation
  rule = RM.teleportation(b.n, c.sample_size, b.cfg.seed)
  mixing = RM.RandomMixing(b.n, rule, c.local_steps, b.axis_name, "teleportation")
  return Recipe(A.teleportation(b.optimizer("local"), mixing), decentralized=True,
                primary=mixing, evaluated=held_models, planner=b.fixed_periods(c.local_steps))
