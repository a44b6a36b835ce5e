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
"""

from __future__ import annotations

import difflib
import importlib
import math
import sys
from typing import Any, Callable, NamedTuple, TextIO

import ml_collections

from nbsgd_jax.data import augment as augment_lib
from nbsgd_jax.core import backends as backends_lib
from nbsgd_jax.core import checks
from nbsgd_jax import codecs as codecs_lib
from nbsgd_jax.host import consensus as consensus_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax.models import problems as problems_lib
from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.recipes import Section
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
BUDGET_UNITS = ("steps", "grads_per_worker")  # config.budget_unit (run/stepper.py, Budget)
PARTITIONS = tuple(dict.fromkeys(SCHEMES + TEXT_SCHEMES))  # images: SCHEMES; text: TEXT_SCHEMES

# the built-in algorithms (recipes.REGISTRY also holds those registered from outside)
ALGORITHMS = tuple(recipes_lib.REGISTRY)


def _setup_defaults() -> ml_collections.ConfigDict:
  """The top-level keys of the algorithm, workers, backend, model and data."""
  c = ml_collections.ConfigDict()
  c.algorithm = "dpsgd"          # a registered algorithm (recipes.REGISTRY)
  c.num_workers = 8              # workers n
  c.topology = "ring"            # communication graph of decentralized algorithms
                                 # (matcha_graph0: MATCHA's 8-node Erdos-Renyi graph 0)
  c.mixing_weights = "metropolis_hastings"  # how W is built from the graph
  c.topology_p = 0.3             # erdos_renyi edge probability, in (0, 1]
  c.topology_seed = 0            # erdos_renyi graph seed
  c.topology_rows = 0            # torus rows (0: most square rows x cols = num_workers)
  c.topology_cols = 0            # torus cols (0: num_workers / rows)
  c.backend = "simulate"         # simulate (jax.vmap) | mesh (jax.shard_map over devices) |
                                 # multihost (mesh over the devices of every process)
  c.workers_per_device = 0       # mesh: k workers per device (vmap inside shard_map); 0: the
                                 # smallest k with num_workers / k <= devices
  c.imports = ""                 # comma-separated modules imported before the run: they may
                                 # register models, data sets and recipes by name
                                 # (models.register_model, data.register_dataset)
  c.model = "cnn"                # logreg | mlp | cnn | resnet (CIFAR ResNet, He et al. 2016) |
                                 # transformer (decoder-only language model, config.lm; a
                                 # text data set, e.g. tfds:tiny_shakespeare)
  c.mlp_hidden = (256,)          # hidden sizes of the MLP
  c.cnn_channels = (6, 16)       # conv widths of the CNN
  c.conv_impl = "auto"           # auto | batched | per_worker: cnn / resnet convolutions under
                                 # vmap (batched: one grouped conv; per_worker: n ordinary
                                 # convs; auto: per_worker on a CPU with 2-64 workers per
                                 # device, else batched; forms.py)
  c.pool_impl = "auto"           # auto | window (nn.max_pool) | reshape (reshape + max, the
                                 # same values, an elementwise gradient): the CNN's max-pools
                                 # (auto: reshape where the sizes are even, else window)
  c.residuals = "auto"           # auto | fused | materialized: resnet's residual stream
                                 # stored once per block (auto: materialized on a CPU; forms.py)
  c.resnet_depth = 20            # resnet: 6 k + 2 layers (20: ResNet-20, 0.27 M parameters)
  c.norm = "batch"               # resnet: batch (BatchNorm, running statistics per worker)
                                 # | group (GroupNorm, no model state)
  c.norm_groups = 2              # groups of norm=group (divides 16)
  c.compute_dtype = "float32"    # float32 | bfloat16: the model's compute dtype (parameters,
                                 # gradients, optimizer state and messages stay float32)
  c.dataset = "mnist10k"         # images: mnist10k (embedded) | image_folder | cifar10 |
                                 # cifar100 (data_path) | tfds:<name>; text (model=transformer):
                                 # tiny_shakespeare (embedded) | text_file (data_path) |
                                 # tfds:<name>; least_squares | logistic (synthetic PL
                                 # problems, config.problem, known F*); a registered name;
                                 # arrays (train(data=ArrayDataset(...)))
  c.data_path = ""               # image_folder: a directory or .tar/.tar.gz/.tar.xz/.zip laid
                                 # out train/<class>/<image>, test/<class>/<image>; cifar10 /
                                 # cifar100: the python release (cifar-10-python.tar.gz or
                                 # cifar-10-batches-py/); text_file: a UTF-8 text file
  c.data_cache = ""              # image_folder: decoded .npz cache ("": ~/.cache/nbsgd_jax)
  c.data_dir = ""                # tfds data_dir ("" = tfds default)
  c.text_unknown_id = True       # text: one more id, reserved unknown (False: nanoGPT's ids)
  c.partition = "iid"            # iid | dirichlet (labels) | contiguous (text: own 1/n each)
  c.dirichlet_alpha = 0.5        # concentration of the Dirichlet partition (> 0)
  return c


def _training_defaults() -> ml_collections.ConfigDict:
  """The top-level keys of the optimizer, the schedule, evaluation and the run's records."""
  c = ml_collections.ConfigDict()
  c.batch_size = 32              # examples per worker per step
  c.learning_rate = 0.05         # SGD step size (peak value of the schedule)
  c.lr_schedule = "constant"     # constant | cosine (decay to 0 at num_steps) |
                                 # inverse_time: learning_rate * t0 / (step + t0) |
                                 # step: x lr_decay at each of lr_milestones
  c.lr_time_scale = 100.0        # steps, t0 of inverse_time
  c.lr_milestones = (0.5, 0.75)  # step: decays at these fractions of num_steps (Goyal et al.
                                 # 2017; Kong et al. 2021 on CIFAR-10), increasing in (0, 1)
  c.lr_decay = 0.1               # step: factor at each milestone, in (0, 1]
  c.warmup_steps = 0             # linear warm-up from 0 over this many steps
  c.lr_min = 0.0                 # cosine: the rate reached at num_steps (nanoGPT: lr / 10),
                                 # in [0, learning_rate]
  c.optimizer = "sgd"            # local optimizer: sgd (momentum, L2 weight decay) | adamw
                                 # (b1 = momentum, b2 = adam_b2, decoupled weight decay)
  c.adam_b2 = 0.999              # adamw: second-moment decay in [0, 1)
  c.momentum = 0.9               # heavy-ball momentum in [0, 1) (0 = plain SGD)
  c.nesterov = False             # Nesterov momentum
  c.weight_decay = 0.0           # L2 coefficient added to the gradient
  c.weight_decay_on = "all"      # all | matrices: only parameters with >= 2 axes decay (kernels,
                                 # embeddings; not biases or norm scales: nanoGPT's rule)
  c.grad_clip = 0.0              # clip each worker's gradient to this global L2 norm before
                                 # its optimizer (0: off; nanoGPT: 1.0)
  c.num_steps = 1000             # steps: the run's length (gradients per worker with budget_unit)
  c.budget_unit = "steps"        # unit of num_steps, eval_every, checkpoint_every, schedule:
                                 # steps | grads_per_worker (the same for every algorithm)
  c.eval_every = 100             # steps between evaluations (a final one is always made)
  c.eval_train_examples = 2000   # training examples used for train_loss (averaged model)
  c.eval_test_examples = 0       # test examples behind test_loss / test_accuracy: a fixed
                                 # uniform sample, the same at every evaluation (0: all)
  c.validation_examples = 0      # > 0: held-out training examples test_* is measured on
  c.eval_worker_accuracy = True  # decentralized recipes: also each worker's own test accuracy
                                 # (worker_test_accuracy, the mean over the workers)
  c.eval_worker_examples = 0     # test examples behind each worker's own accuracy, a fixed
                                 # sample (0: auto, n_test / n, >= 100: about one pass in all)
  c.stop_sim_time = 0.0          # s: stop at the first evaluation with sim_time >= this, before
                                 # num_steps (equal-time budgets; 0: off)
  c.stop_train_loss = 0.0        # stop at the first evaluation with train_loss <= this, before
                                 # num_steps (time to a target loss; 0: off)
  c.steps_per_dispatch = 0       # k: training steps per compiled dispatch (lax.scan over the
                                 # steps between evaluations whose host inputs are known in
                                 # advance; hooks run before each dispatch; clock=wall: 1);
                                 # 0: auto, the largest divisor of eval_every up to 16, and 1
                                 # with hooks, clock=wall, a periodic recipe or on a CPU
                                 # (run/stepper.py, forms.blocks_pay)
  c.double_buffer = True         # a spare set of parameter buffers: each step writes the new
                                 # parameters there (no fresh [n, d] buffer and copy when the
                                 # models are mixed); False: one set, less memory
  c.seed = 0                     # init, data order and partition seed
  c.sweep = ""                   # a grid of runs, one program per structure: axes separated
                                 # by ;, each key=v1,v2,... (a:b: the integers a..b-1), e.g.
                                 # learning_rate=0.05,0.1;seed=0:3 (docs/guide.md, Sweeps);
                                 # WORKDIR/<run>/ per run
  c.sweep_runs = "auto"          # how a sweep's runs of one structure train: stacked (one
                                 # program, a runs axis) | in_turn (one after another, compiled
                                 # once) | auto: stacked on a GPU / TPU, in turn on a CPU (a
                                 # CPU step's time grows with the runs: docs/results.md, Sweeps)
  c.compilation_cache = "default"  # directory of JAX's persistent compilation cache (a later
                                 # process reads programs back instead of compiling them);
                                 # default: $NBSGD_JAX_COMPILATION_CACHE, else
                                 # ~/.cache/nbsgd_jax/jax; none: off
  c.progress = True              # tqdm progress bar
  c.overwrite = False            # replace the run the workdir holds (its records and
                                 # checkpoints; the same run starts again from step 0); False:
                                 # this run finished is not trained again, unfinished it
                                 # resumes, another run is refused
  c.tensorboard = False          # also write workdir/tensorboard event files (tensorboardX):
                                 # the same scalars as metrics.jsonl
  c.checkpoint_every = 0         # steps between orbax checkpoints in workdir/checkpoints (a
                                 # multiple of eval_every; 0: none); a run started again in
                                 # the same workdir resumes from the newest one
  c.init_from = ""               # a run's workdir: start from its newest checkpoint's average
                                 # model (optimizer state and step count fresh); "": seeded init
  return c


# the top-level keys, in the order of docs/config.md
TOP_LEVEL = (_setup_defaults, _training_defaults)


def default_config() -> ml_collections.ConfigDict:
  """Every configuration key with its default (units in the comments): the top-level keys
  (:data:`TOP_LEVEL`), the components' sections (:data:`SECTIONS`) and the algorithms' own
  (:data:`nbsgd_jax.recipes.SECTIONS`)."""
  c = ml_collections.ConfigDict()
  for part in TOP_LEVEL:
    for key, value in part().items():
      c[key] = value
  for name, section in {**SECTIONS, **recipes_lib.SECTIONS}.items():
    c[name] = section.defaults()
  return c


def override(cfg: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
  """Set ``cfg`` keys in place from ``{"key": value, "section.key": value}`` (the CLI's
  ``--config.section.key`` spelling, for scripts and tests); returns ``cfg``.

  Raises:
    ConfigError: a key that ``default_config()`` does not have (named in the message).
  """
  for name, value in overrides.items():
    *sections, key = name.split(".")
    node = cfg
    for sec in sections:
      node = node.get(sec) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or key not in node:
      raise ConfigError([f"config.{name} is not a configuration key"])
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
    if key not in known:
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
                  ("validation_examples", 0), ("eval_worker_examples", 0), ("seed", 0)):
    checks.integer(cfg, errs, key, lo)
  for key in ("weight_decay", "grad_clip", "stop_sim_time", "stop_train_loss"):
    checks.number(cfg, errs, key, 0)
  if checks.integer(cfg, errs, "steps_per_dispatch", 0) and cfg.steps_per_dispatch > 1 and (
      cfg.cluster.get("clock") == "wall"):
    errs.append(f"config.steps_per_dispatch={cfg.steps_per_dispatch} is not allowed with "
                "config.cluster.clock='wall': each step is timed on the host; use 1 (or 0: "
                "auto)")
  for key in ("nesterov", "progress", "tensorboard", "double_buffer", "eval_worker_accuracy",
              "overwrite", "text_unknown_id"):
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


# The sections of the framework's components: each one's defaults and check beside the code
# that reads it (an algorithm's own sections come with its registration: recipes.SECTIONS).
SECTIONS: dict[str, Section] = {
    "lm": Section(models_lib.lm_defaults, models_lib.check_lm_config,
                     'model=transformer: sizes and options of the language model'),
    "augment": Section(augment_lib.augment_defaults, augment_lib.check_config,
                     'on-device input augmentation of image batches'),
    "dpsgd": Section(recipes_lib.dpsgd_defaults, recipes_lib.check_dpsgd_config,
                     "D-PSGD's order of the local step and the gossip (every recipe that gossips)"),
    "cluster": Section(cluster_lib.cluster_defaults, cluster_lib.check_config,
                     'simulated cluster behind sim_time (He & Dube)',
                     host=cluster_lib.HOST_KEYS),
    "nonblocking": Section(cluster_lib.nonblocking_defaults, cluster_lib.check_nonblocking_config,
                     'Non-blocking SGD (He & Dube 2022)'),
    "compression": Section(codecs_lib.compression_defaults, codecs_lib.check_config,
                     'codecs (nbsgd_jax.codecs), error feedback'),
    "consensus": Section(consensus_lib.consensus_defaults, consensus_lib.check_config,
                     'consensus distance (Kong et al. 2021)'),
    "problem": Section(problems_lib.problem_defaults, problems_lib.check_config,
                     'synthetic PL problems (dataset least_squares | logistic; Haddadpour et al. 2019)'),
}


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


def import_modules(cfg) -> None:
  """Import ``config.imports`` (comma-separated module names), which may register models,
  data sets and recipes.

  Raises:
    ConfigError: a module that cannot be imported (named, with the reason).
  """
  names = [m.strip() for m in str(cfg.get("imports") or "").split(",") if m.strip()]
  for name in names:
    try:
      importlib.import_module(name)
    except Exception as e:  # the user's module: any failure is named
      raise ConfigError([f"config.imports={cfg.imports!r}: cannot import {name!r}: "
                         f"{type(e).__name__}: {e}"]) from None


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


# ----------------------------------------------------------------------------- inactive keys


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
    Switch(("adam_b2",), "optimizer", lambda v: v == "adamw"),
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


def inactive_keys(cfg: ml_collections.ConfigDict) -> set[str]:
  """The dotted keys of the sections that are off in ``cfg`` (:data:`SWITCHES`): what a run
  does not depend on (e.g. to compare runs whatever those keys hold)."""
  default, out = default_config(), set()
  for switch in switches():
    if not switch.on(cfg.get(switch.switch)):
      out.update(_switched_keys(switch, default))
  return out


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
  dispatch size that does not divide ``eval_every`` (each shorter block compiles again)."""
  lines = []
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


def warn_inactive(cfg: ml_collections.ConfigDict, stream: TextIO | None = None) -> list[str]:
  """Print :func:`inactive_warnings` and :func:`odd_warnings` to ``stream`` (default
  ``sys.stderr``), each line as ``warning: LINE``; returns the lines."""
  lines = inactive_warnings(cfg) + odd_warnings(cfg)
  for line in lines:
    print(f"warning: {line}", file=stream or sys.stderr)
  return lines
