"""The keys that have no effect in a configuration: the switches of the sections that can be
off (:class:`Switch`, :data:`SWITCHES`, and :func:`switches` with the two registries), the
keys they turn off (:func:`inactive_keys`) and the warnings about such keys changed from their
default or values allowed but probably not meant (:func:`warn_inactive`).
:mod:`nbsgd_jax.config` re-exports them.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, NamedTuple, TextIO

import ml_collections

from nbsgd_jax import codecs as codecs_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax.config.defaults import default_config
from nbsgd_jax.models.problems import PROBLEMS as SYNTHETIC  # with their known F*
from nbsgd_jax.recipes.asynchronous import first_change


class Switch(NamedTuple):
  """``keys`` have an effect only while ``on(cfg[switch])``; ``"SECTION.*"`` stands for every
  key of the section but ``switch``."""
  keys: tuple[str, ...]
  switch: str
  on: Callable[[Any], bool]


CONTROL_KEYS = tuple(f"consensus.{k}" for k in (
    "target", "target_ratio", "reference_workdir", "critical", "critical_scale", "critical_ema",
    "critical_form",
    "smoothness", "smoothness_every", "smoothness_iters", "until_step", "max_gossip_steps",
    "measure", "sketch_size"))
CRITICAL_KEYS = tuple(f"consensus.{k}" for k in (
    "critical_scale", "critical_ema", "critical_form", "smoothness", "smoothness_every",
    "smoothness_iters"))

# One entry per section that can be off; a key under two switches is named by the first off.
# The algorithms' own sections are off while another algorithm runs (switches()).
SWITCHES = (
    Switch(("compression.*",), "compression.name", lambda v: v != codecs_lib.NONE),
    Switch(("nonblocking.*",), "nonblocking.enabled", lambda v: v is True),
    Switch(("dpsgd.order",), "algorithm",
           lambda v: v in recipes_lib.gossip_recipes()),
    Switch(CONTROL_KEYS, "consensus.control", lambda v: v is True),
    Switch(CRITICAL_KEYS, "consensus.critical", lambda v: v is True),
    Switch(("problem.*",), "dataset", lambda v: v in SYNTHETIC),
    Switch(("model", "mlp_hidden", "cnn_channels", "conv_impl", "pool_impl", "residuals",
            "partition",
            "dirichlet_alpha", "eval_train_examples", "eval_test_examples",
            "validation_examples", "eval_worker_accuracy", "eval_worker_examples", "compute_dtype",
            "augment.*"),
           "dataset",
           lambda v: v not in SYNTHETIC),
    Switch(("data_dir",), "dataset", lambda v: isinstance(v, str) and v.startswith("tfds:")),
    Switch(("data_path",), "dataset", lambda v: v in data_lib.PATH_DATASETS),
    Switch(("data_cache",), "dataset", lambda v: v == "image_folder"),
    Switch(("lr_min",), "lr_schedule", lambda v: v == "cosine"),
    Switch(("lm.*",), "model", lambda v: v == "transformer"),
    Switch(("adam_b2",), "optimizer", lambda v: v in ("adamw", "muon")),  # muon: its Adam part
    Switch(("nesterov",), "optimizer", lambda v: v == "sgd"),
    Switch(("norm", "norm_groups", "resnet_depth"), "model", lambda v: v == "resnet"),
    Switch(("norm_groups",), "norm", lambda v: v == "group"),
    Switch(("augment.*",), "model", lambda v: v != "transformer"),
    Switch(("lr_time_scale",), "lr_schedule", lambda v: v == "inverse_time"),
    Switch(("lr_milestones", "lr_decay"), "lr_schedule", lambda v: v == "step"),
    Switch(("local_sgd.offset_optimum",), "local_sgd.schedule", lambda v: v == "ada_lupa"),
    Switch(("topology_p", "topology_seed"), "topology", lambda v: v == "erdos_renyi"),
    Switch(("topology_rows", "topology_cols"), "topology", lambda v: v == "torus"),
    Switch(("cluster.emulate",), "cluster.clock", lambda v: v == "wall"),
    Switch(("cluster.slow_factor",), "cluster.scenario", lambda v: v == "one_slow"),
    Switch(("cluster.spread",), "cluster.scenario", lambda v: v == "lognormal"),
    Switch(("cluster.delay_mean", "cluster.delay_shift", "cluster.delay_prob",
            "cluster.delay_per"), "cluster.delay", lambda v: v != "none"),
)


def switches() -> list[Switch]:
  """:data:`SWITCHES` and one more per algorithm section (on while an algorithm registered
  with it runs), per ``compression.*`` key a codec reads (on while such a codec runs) and per
  key an algorithm ignores (``recipes.register(ignores=...)``: off while it runs)."""
  owned = [Switch((f"{n}.*",), "algorithm", lambda v, n=n: v in recipes_lib.section_owners(n))
           for n in recipes_lib.SECTIONS]
  codec_keys = dict.fromkeys(k for spec in codecs_lib.REGISTRY.values() for k in spec.keys)
  read = [Switch((f"compression.{k}",), "compression.name", lambda v, k=k: k in getattr(
      codecs_lib.REGISTRY.get(v), "keys", ())) for k in codec_keys]
  ignored = [Switch((k,), "algorithm",
                    lambda v, k=k: k not in getattr(recipes_lib.REGISTRY.get(v), "ignores", ()))
             for k in dict.fromkeys(k for e in recipes_lib.REGISTRY.values() for k in e.ignores)]
  return list(SWITCHES[:2]) + owned + read + ignored + list(SWITCHES[2:])


def _switched_keys(switch: Switch, default: ml_collections.ConfigDict) -> list[str]:
  keys = []
  for key in switch.keys:
    if key.endswith(".*"):
      section = key[:-2]
      keys += [f"{section}.{k}" for k in default[section].keys()
               if f"{section}.{k}" != switch.switch]
    else:
      keys.append(key)
  return keys


def inactive_reasons(cfg: ml_collections.ConfigDict) -> dict[str, tuple[str, Any]]:
  """``{dotted key: (switch, its value)}`` for the keys of the sections that are off in
  ``cfg`` (:data:`SWITCHES`), each with the first switch that turns it off (the one
  :func:`inactive_warnings` names)."""
  default, out = default_config(), {}
  for switch in switches():
    state = cfg.get(switch.switch)
    if not switch.on(state):
      for key in _switched_keys(switch, default):
        out.setdefault(key, (switch.switch, state))
  return out


def inactive_keys(cfg: ml_collections.ConfigDict) -> set[str]:
  """The dotted keys of the sections that are off in ``cfg`` (:data:`SWITCHES`): what a run
  does not depend on (e.g. to compare runs whatever those keys hold; a sweep axis over one
  is refused, :func:`nbsgd_jax.run.grid.expand`)."""
  return set(inactive_reasons(cfg))


def inactive_warnings(cfg: ml_collections.ConfigDict) -> list[str]:
  """One line per key changed from ``default_config()`` in a section that is off
  (:data:`SWITCHES`): ``config.KEY=VALUE has no effect: config.SWITCH=VALUE``. Raises
  nothing for bad values (``validate`` reports those)."""
  default, lines, named = default_config(), [], set()
  for switch in switches():
    state = cfg.get(switch.switch)
    if switch.on(state):
      continue
    for key in _switched_keys(switch, default):
      value = cfg.get(key)
      if key not in named and value != default.get(key):
        named.add(key)
        lines.append(f"config.{key}={value!r} has no effect: config.{switch.switch}={state!r}")
  return lines


def odd_warnings(cfg: ml_collections.ConfigDict) -> list[str]:
  """One line per value allowed but probably not meant: a warm-up longer than the run, a
  dispatch size that does not divide ``eval_every`` (each shorter block compiles again), and
  evaluations of an event-clock DiLoCo (``async_diloco``, ``halos``) before the step its
  evaluated model can first change (:func:`nbsgd_jax.recipes.asynchronous.first_change`: a
  lower bound; when the change comes depends on the event clock's times, known only while
  running, so a run shorter than the bound is refused and a longer one warned)."""
  lines = _early_evaluations(cfg)
  if cfg.warmup_steps > cfg.num_steps:
    lines.append(f"config.warmup_steps={cfg.warmup_steps} is longer than the run "
                 f"(config.num_steps={cfg.num_steps}): the learning rate never reaches "
                 f"config.learning_rate={cfg.learning_rate}")
  k = cfg.steps_per_dispatch
  if k > 1 and cfg.eval_every % k:
    lines.append(f"config.steps_per_dispatch={k} does not divide config.eval_every="
                 f"{cfg.eval_every}: every shorter block before an evaluation compiles once "
                 "more")
  return lines


def _early_evaluations(cfg) -> list[str]:
  """The line of :func:`odd_warnings` on evaluations before the evaluated model can change."""
  first, every = first_change(cfg), cfg.get("eval_every")
  if not first or not isinstance(every, int) or not 1 <= every < first[0] <= cfg.num_steps:
    return []
  step, _, why = first
  last = (step - 1) // every * every
  return [f"config.algorithm={cfg.algorithm!r}: its evaluated model cannot change before step "
          f"{step} ({why}), and the event clock's times decide when it first does: the "
          f"evaluations at steps {every} to {last} read the initial model"]


def warn_inactive(cfg: ml_collections.ConfigDict, stream: TextIO | None = None) -> list[str]:
  """Print :func:`inactive_warnings` and :func:`odd_warnings` to ``stream`` (default
  ``sys.stderr``), each line as ``warning: LINE``; returns the lines."""
  lines = inactive_warnings(cfg) + odd_warnings(cfg)
  for line in lines:
    print(f"warning: {line}", file=stream or sys.stderr)
  return lines
