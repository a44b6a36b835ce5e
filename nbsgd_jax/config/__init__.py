"""Default configuration and validation.

``default_config()`` holds every key the trainer reads, with its default, assembled from
parts that live beside the code reading them: the top-level keys (:data:`TOP_LEVEL`), the
components' sections (:data:`SECTIONS`) and the algorithms' own sections (registered with
them, :data:`nbsgd_jax.recipes.SECTIONS`). Experiment files (``experiments/configs/*.py``)
start from it and change what they need. ``validate(cfg)`` checks every key before anything
is compiled and raises :class:`ConfigError` with one line per problem, each naming the key,
the value and what is allowed:

* each section is checked by its component (:func:`section_checks`), also when the section is
  off (a bad value is an error wherever it is);
* which algorithm supports which section is the recipe registry's
  (``nbsgd_jax.recipes.combination_errors``, through :func:`_combination_errors`).

The choice lists are their modules' (``topology.TOPOLOGIES``, ``codecs.names()``, ...); this
module imports them and no module below it imports this one. ``inactive_warnings(cfg)``
names the keys changed from their default in a section that is off (:func:`switches`: from
:data:`SWITCHES` and the two registries); ``warn_inactive`` prints them.

This module holds the validation and re-exports the rest: the keys and their defaults live in
:mod:`nbsgd_jax.config.defaults`, the switches and the warnings in
:mod:`nbsgd_jax.config.switches`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import math
import os
import sys
from typing import Callable

import ml_collections

from nbsgd_jax.core import backends as backends_lib
from nbsgd_jax.core import checks
from nbsgd_jax import data as data_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.config import renamed as renamed_lib
from nbsgd_jax.config.defaults import (SECTIONS, TOP_LEVEL, _setup_defaults,  # noqa: F401
                                       _training_defaults, default_config)
from nbsgd_jax.config.switches import (CONTROL_KEYS, CRITICAL_KEYS, SWITCHES,  # noqa: F401
                                       Switch, _switched_keys, inactive_keys,
                                       inactive_warnings, odd_warnings, switches, warn_inactive)
# the choice lists, each owned by its module (config.X for the docs, scripts and tests)
from nbsgd_jax.core.backends import BACKENDS  # noqa: F401
from nbsgd_jax.data import SCHEMES, TEXT_SCHEMES  # noqa: F401
from nbsgd_jax.models import COMPUTE_DTYPES, MODELS, NORMS
from nbsgd_jax.recipes.optim import LR_SCHEDULES, OPTIMIZERS, WEIGHT_DECAY_ON
from nbsgd_jax.models import forms as forms_lib
from nbsgd_jax.models.problems import PROBLEMS as SYNTHETIC  # with their known F*
from nbsgd_jax.topology import MIXING_WEIGHTS, TOPOLOGIES  # noqa: F401
from nbsgd_jax.transforms.wrappers import ORDERS as DPSGD_ORDERS  # noqa: F401

SWEEP_RUNS = ("auto", "stacked", "in_turn")  # config.sweep_runs (nbsgd_jax.run.sweep)
BUDGET_UNITS = ("steps", "grads_per_worker")  # config.budget_unit (run/budget.py, Budget)
PARTITIONS = tuple(dict.fromkeys(SCHEMES + TEXT_SCHEMES))  # images: SCHEMES; text: TEXT_SCHEMES

# the built-in algorithms (recipes.REGISTRY also holds those registered from outside)
ALGORITHMS = tuple(recipes_lib.REGISTRY)


def override(cfg: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
  """Set ``cfg`` keys in place from ``{"key": value, "section.key": value}`` (the CLI's
  ``--config.section.key`` spelling, for scripts and tests); returns ``cfg``.

  Raises:
    ConfigError: a key that ``default_config()`` does not have (named in the message; an old
      name of a renamed key names its new one, :mod:`nbsgd_jax.config.renamed`).
  """
  for name, value in overrides.items():
    *sections, key = name.split(".")
    node = cfg
    for sec in sections:
      node = node.get(sec) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or key not in node:
      raise ConfigError(unknown_key_errors([name]) or [f"config.{name} is not a configuration key"])
    try:
      node[key] = value
    except TypeError:  # ConfigDict is type-safe: the default's type (int -> float allowed)
      t = type(node[key])
      raise ConfigError([f"config.{name}={value!r} is not allowed: it must be "
                         f"{TYPE_NAMES.get(t, 'of type ' + t.__name__)}"]) from None
  return cfg


TYPE_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string",
               tuple: "a tuple"}


def flatten_dict(d: dict, prefix: str = "") -> dict:
  """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (a config as JSON, dotted keys; order kept)."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten_dict(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def unknown_key_errors(keys) -> list[str]:
  """One line per dotted key in ``keys`` that ``default_config()`` lacks, with the closest
  known key: ``config.learnin_rate is not a configuration key (did you mean
  config.learning_rate?)``."""
  known = list(flatten_dict(default_config().to_dict()))
  known += sorted({k.rsplit(".", 1)[0] for k in known if "." in k})  # the sections
  errors = []
  for key in keys:
    if renamed_lib.renamed_error(key):
      errors.append(renamed_lib.renamed_error(key))
    elif key not in known:
      close = difflib.get_close_matches(key, known, n=1)
      errors.append(f"config.{key} is not a configuration key"
                    + (f" (did you mean config.{close[0]}?)" if close else ""))
  return errors


class ConfigError(ValueError):
  """Bad configuration; ``.errors`` holds one line per problem."""

  def __init__(self, errors: list[str]):
    self.errors = list(errors)
    super().__init__("\n".join(self.errors))


# ----------------------------------------------------------------------------- sections
# ``_check_SECTION(cfg, errs)`` appends one line per bad value of its keys, whatever the other
# sections say (a bad value is an error even in a section that is off). Rules between keys
# are here when they are about values; which algorithm supports which section is the recipe
# registry's (_combination_errors).


def check_top_level(cfg, errs: list) -> None:
  """algorithm, workers, model, data, optimizer, evaluation and checkpoint keys."""
  checks.choice(cfg, errs, "algorithm", algorithm_names())
  checks.integer(cfg, errs, "num_workers", 1)
  checks.choice(cfg, errs, "model", model_names())
  d = cfg.get("resnet_depth")
  if not (checks.is_int(d) and d >= 8 and (d - 2) % 6 == 0):
    errs.append(f"config.resnet_depth={d!r} is not allowed: it must be 6 k + 2 with k >= 1 "
                "(8, 14, 20, 32, 44, 56, 110)")
  if checks.integer(cfg, errs, "norm_groups", 1) and 16 % cfg.norm_groups:
    errs.append(f"config.norm_groups={cfg.norm_groups} is not allowed: it must divide 16 "
                "(1, 2, 4, 8 or 16)")
  checks.choice(cfg, errs, "compute_dtype", COMPUTE_DTYPES)
  checks.choice(cfg, errs, "conv_impl", forms_lib.CONV_CHOICES)
  checks.choice(cfg, errs, "pool_impl", forms_lib.POOL_CHOICES)
  checks.choice(cfg, errs, "residuals", forms_lib.RESIDUAL_CHOICES)
  for key, allowed in (("norm", NORMS), ("optimizer", OPTIMIZERS), ("partition", PARTITIONS),
                       ("lr_schedule", LR_SCHEDULES), ("sweep_runs", SWEEP_RUNS),
                       ("weight_decay_on", WEIGHT_DECAY_ON)):
    checks.choice(cfg, errs, key, allowed)
  checks.number(cfg, errs, "adam_b2", 0, hi=1, hi_open=True)
  checks.number(cfg, errs, "dirichlet_alpha", 0, lo_open=True)
  checks.integer(cfg, errs, "batch_size", 1)
  checks.number(cfg, errs, "learning_rate", 0, lo_open=True)
  checks.integer(cfg, errs, "warmup_steps", 0)
  checks.number(cfg, errs, "momentum", 0, hi=1, hi_open=True)  # 1: eta / (1 - momentum) infinite
  checks.choice(cfg, errs, "budget_unit", BUDGET_UNITS)
  for key, lo in (("num_steps", 0), ("eval_every", 1),
                  ("eval_train_examples", 1), ("eval_test_examples", 0),
                  ("validation_examples", 0), ("eval_worker_examples", 0), ("seed", 0),
                  ("stop_step", 0)):
    checks.integer(cfg, errs, key, lo)
  for key in ("weight_decay", "grad_clip", "stop_sim_time", "stop_train_loss"):
    checks.number(cfg, errs, key, 0)
  if checks.integer(cfg, errs, "steps_per_dispatch", 0) and cfg.steps_per_dispatch > 1 and (
      cfg.cluster.get("clock") == "wall"):
    errs.append(f"config.steps_per_dispatch={cfg.steps_per_dispatch} is not allowed with "
                "config.cluster.clock='wall': each step is timed on the host; use 1 (or 0: "
                "auto)")
  for key in ("nesterov", "progress", "tensorboard", "double_buffer", "gather_gradients",
              "eval_worker_accuracy", "overwrite", "text_unknown_id"):
    checks.boolean(cfg, errs, key)
  for key in ("data_dir", "data_path", "data_cache", "imports", "compilation_cache", "sweep",
              "init_from"):
    checks.string(cfg, errs, key)
  _check_dataset(cfg, errs)
  lr = cfg.get("learning_rate")
  if checks.number(cfg, errs, "lr_min", 0) and cfg.get("lr_schedule") == "cosine" and (
      checks.is_num(lr) and lr > 0 and cfg.lr_min > lr):
    errs.append(f"config.lr_min={cfg.lr_min} is not allowed with config.learning_rate="
                f"{cfg.learning_rate}: the cosine decays to it, it must be <= learning_rate")
  checks.number(cfg, errs, "lr_time_scale", 0, lo_open=True)
  checks.number(cfg, errs, "lr_decay", 0, lo_open=True, hi=1)
  ms = cfg.get("lr_milestones")
  if (not isinstance(ms, (tuple, list)) or not ms
      or not all(checks.is_num(x) and 0 < x < 1 for x in ms) or list(ms) != sorted(set(ms))):
    errs.append(f"config.lr_milestones={ms!r} is not allowed: it must be a non-empty tuple of "
                "increasing fractions of num_steps in (0, 1), e.g. (0.5, 0.75)")
  for key, length in (("mlp_hidden", 0), ("cnn_channels", 2)):
    v = cfg.get(key)
    if (not isinstance(v, (tuple, list)) or not all(checks.is_int(x) and x >= 1 for x in v)
        or (length and len(v) != length)):
      errs.append(f"config.{key}={v!r} is not allowed: it must be a tuple of "
                  f"{'two ' if length else ''}integers >= 1, e.g. {default_config()[key]!r}")
  if checks.integer(cfg, errs, "checkpoint_every", 0, note="0: no checkpoints"):
    ce, ee = cfg.checkpoint_every, cfg.get("eval_every")
    if ce and checks.is_int(ee) and ee >= 1 and ce % ee:
      errs.append(f"config.checkpoint_every={ce} is not allowed with config.eval_every={ee}: "
                  "checkpoints are taken at evaluations, it must be a multiple of eval_every")


def _check_dataset(cfg, errs: list) -> None:
  """dataset, with a data_path where the source needs one and a model that reads it."""
  ds = cfg.get("dataset")
  named = (data_lib.IMAGE_DATASETS + data_lib.TEXT_DATASETS + SYNTHETIC
           + tuple(data_lib.REGISTRY) + (data_lib.GIVEN,))
  if not isinstance(ds, str) or not (ds in named or (ds.startswith("tfds:") and len(ds) > 5)):
    errs.append(f"config.dataset={ds!r} is not allowed: use one of {list(named)} or "
                "'tfds:<name>' (e.g. 'tfds:mnist', 'tfds:cifar10', 'tfds:tiny_shakespeare')")
    return
  if ds in data_lib.PATH_DATASETS and cfg.get("data_path") == "":
    # (a path that does not exist is named by the loader, before anything is written)
    errs.append(f"config.data_path='' is not allowed with config.dataset={ds!r}: give the "
                f"{'text file' if ds == 'text_file' else 'directory or archive'} to read")
  model = cfg.get("model")
  if ds in data_lib.TEXT_DATASETS and model in MODELS and model != "transformer":
    errs.append(f"config.dataset={ds!r} is a text data set: it needs config.model='transformer'"
                f" (got {model!r})")
  if ds in data_lib.IMAGE_DATASETS and model == "transformer":
    errs.append(f"config.model='transformer' is not allowed with config.dataset={ds!r}: the "
                f"language model reads text ({list(data_lib.TEXT_DATASETS)} or tfds:<name>)")


# The checks of the top-level keys (each beside the code that reads them).
SECTION_CHECKS: dict[str, Callable[[ml_collections.ConfigDict, list], None]] = {
    "top_level": check_top_level,
    "topology": topology_lib.check_config,
    "backend": backends_lib.check_config,
}


def section_checks() -> dict[str, Callable[[ml_collections.ConfigDict, list], None]]:
  """Every check: the top-level keys' (:data:`SECTION_CHECKS`), the components' sections'
  (:data:`SECTIONS`) and the algorithms' own (:data:`nbsgd_jax.recipes.SECTIONS`, registered
  algorithms included)."""
  sections = {**SECTIONS, **recipes_lib.SECTIONS}
  return {**SECTION_CHECKS, **{name: section.check for name, section in sections.items()}}


def _check_finite(cfg, errs: list) -> None:
  """Non-finite floats anywhere (NaN passes the range checks), unless the key has a line."""
  def leaves(node, prefix=""):
    for k, v in node.items():
      if isinstance(v, ml_collections.ConfigDict):
        yield from leaves(v, f"{prefix}{k}.")
      else:
        yield prefix + k, v
  for key, v in leaves(cfg):
    if (isinstance(v, float) and not math.isfinite(v)
        and not any(e.startswith(f"config.{key}=") for e in errs)):
      errs.append(f"config.{key}={v!r} is not allowed: it must be a finite number")


def model_names() -> tuple:
  """Built-in, registered (:func:`nbsgd_jax.models.register_model`) and ``"module"`` (a flax
  module given to ``train(model=...)``)."""
  return models_lib.model_names()


IMPORTS_ALLOWED = ("comma-separated module names on sys.path (examples.easgd: run from the "
                   "directory that holds examples/) or .py file paths (path/to/my_algo.py)")


def import_modules(cfg) -> None:
  """Import ``config.imports``: comma-separated entries, each a module name found on
  ``sys.path`` (``examples.easgd``; ``python -m`` puts the current directory there) or a
  Python file's path (an entry that ends in ``.py`` or holds a ``/``: ``path/to/my_algo.py``,
  relative to the current directory), imported by path
  (``importlib.util.spec_from_file_location``) as the module named after the file's stem
  (``my_algo``), once per process. They may register models, data sets and recipes.

  Raises:
    ConfigError: an entry that cannot be imported, one line naming ``config.imports``, the
      entry and the reason (a missing module or file, an error raised while importing it, a
      file whose module name another loaded module holds).
  """
  names = [m.strip() for m in str(cfg.get("imports") or "").split(",") if m.strip()]
  for name in names:
    try:
      if name.endswith(".py") or "/" in name or os.sep in name:
        _import_file(name)
      else:
        importlib.import_module(name)
    except Exception as e:  # the user's module: any failure is named
      why = " ".join(f"{type(e).__name__}: {e}".split())  # one line
      raise ConfigError([f"config.imports={cfg.imports!r} is not allowed: cannot import "
                         f"{name!r} ({why}); use {IMPORTS_ALLOWED}"]) from None


def _import_file(path: str):
  """The module of the Python file ``path``, imported by path as the module named after its
  stem (kept in ``sys.modules``; a second call returns it).

  Raises:
    FileNotFoundError: no such file. ImportError: another module holds the name. Whatever
      the file raises while it runs.
  """
  full = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(full):
    raise FileNotFoundError(f"no file {full}")
  name = os.path.splitext(os.path.basename(full))[0]
  loaded = sys.modules.get(name)
  if loaded is not None:
    if os.path.abspath(getattr(loaded, "__file__", "") or "") == full:
      return loaded
    raise ImportError(f"a module named {name!r} is loaded already (from "
                      f"{getattr(loaded, '__file__', None) or 'built-in'}): rename the file")
  spec = importlib.util.spec_from_file_location(name, full)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses and pickle look the module up there
  try:
    spec.loader.exec_module(module)
  except BaseException:
    sys.modules.pop(name, None)
    raise
  return module


def algorithm_names() -> list[str]:
  """The registered recipes (:data:`nbsgd_jax.recipes.REGISTRY`; a recipe registered from
  outside the package counts)."""
  return list(recipes_lib.REGISTRY)


def _combination_errors(cfg) -> list:
  """The combinations of sections that are mathematically undefined for ``cfg.algorithm``:
  the recipe registry decides (:func:`nbsgd_jax.recipes.combination_errors`; it sees ``cfg``
  before the values are known to be good)."""
  if cfg.get("algorithm") not in recipes_lib.REGISTRY:
    return []  # reported by the algorithm check
  return list(recipes_lib.combination_errors(cfg))


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Check a configuration before any compilation: keys ``default_config()`` lacks (a typo),
  every section (:data:`SECTION_CHECKS`), non-finite floats, then the combinations of sections
  (:func:`_combination_errors`).

  Raises:
    ConfigError: one line per problem, ``config.KEY=VALUE is not allowed: ...``, all at once.
  """
  errs: list = unknown_key_errors(flatten_dict(cfg.to_dict()))
  if errs:  # a typo: the other checks would read the default instead
    raise ConfigError(errs)
  for check in section_checks().values():
    check(cfg, errs)
  _check_finite(cfg, errs)
  errs.extend(_combination_errors(cfg))
  if errs:
    raise ConfigError(errs)
