"""Default configuration and validation.

``default_config()`` holds every key the trainer reads, with its default; experiment files
(``experiments/configs/*.py``) start from it and change what they need. ``validate(cfg)``
checks every key before anything is compiled and raises :class:`ConfigError` with one line
per problem, each naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import ml_collections

ALGORITHMS = ("allreduce", "allreduce_ring", "dpsgd", "matcha", "local_sgd", "diloco")
DECENTRALIZED = ("dpsgd", "matcha", "local_sgd", "diloco")
PERIODIC = ("local_sgd", "diloco")  # communicate only at the end of a period
from nbsgd_jax.local_sgd import AVERAGINGS as LOCAL_AVERAGINGS  # noqa: E402 (jax-free)
from nbsgd_jax.local_sgd import OPT_STATE_SYNCS  # noqa: E402
from nbsgd_jax.local_sgd import SCHEDULES as TAU_SCHEDULES  # noqa: E402
TOPOLOGIES = ("ring", "torus", "exponential", "one_peer_exponential", "complete", "star",
              "erdos_renyi")
MIXING_WEIGHTS = ("metropolis_hastings", "uniform", "best_constant")
BACKENDS = ("simulate", "mesh", "multihost")
MODELS = ("logreg", "mlp", "cnn")
PARTITIONS = ("iid", "dirichlet")
DPSGD_ORDERS = ("parallel", "atc")
LR_SCHEDULES = ("constant", "cosine")
COMPRESSIONS = ("none", "top_k", "gaussian_k", "random_k")


def default_config() -> ml_collections.ConfigDict:
  """Every configuration key with its default (units in the comments)."""
  c = ml_collections.ConfigDict()
  c.algorithm = "dpsgd"          # one of ALGORITHMS
  c.num_workers = 8              # workers n
  c.topology = "ring"            # communication graph of decentralized algorithms
  c.mixing_weights = "metropolis_hastings"  # how W is built from the graph
  c.topology_p = 0.3             # erdos_renyi edge probability, in (0, 1]
  c.topology_seed = 0            # erdos_renyi graph seed
  c.topology_rows = 0            # torus rows (0: most square rows x cols = num_workers)
  c.topology_cols = 0            # torus cols (0: num_workers / rows)
  c.backend = "simulate"         # simulate (jax.vmap) | mesh (jax.shard_map over devices) |
                                 # multihost (mesh over the devices of every process)
  c.workers_per_device = 0       # mesh: k workers per device (vmap inside shard_map); 0: the
                                 # smallest k with num_workers / k <= devices
  c.model = "cnn"                # logreg | mlp | cnn
  c.mlp_hidden = (256,)          # hidden sizes of the MLP
  c.cnn_channels = (6, 16)       # conv widths of the CNN
  c.dataset = "mnist10k"         # mnist10k (embedded) | tfds:<name>
  c.data_dir = ""                # tfds data_dir ("" = tfds default)
  c.partition = "iid"            # iid | dirichlet (over labels)
  c.dirichlet_alpha = 0.5        # concentration of the Dirichlet partition (> 0)
  c.batch_size = 32              # examples per worker per step
  c.learning_rate = 0.05         # SGD step size (peak value of the schedule)
  c.lr_schedule = "constant"     # constant | cosine (decay to 0 at num_steps)
  c.warmup_steps = 0             # linear warm-up from 0 over this many steps
  c.momentum = 0.9               # heavy-ball momentum in [0, 1) (0 = plain SGD)
  c.nesterov = False             # Nesterov momentum
  c.weight_decay = 0.0           # L2 coefficient added to the gradient
  c.num_steps = 1000             # training steps (iterations)
  c.eval_every = 100             # steps between evaluations (a final one is always made)
  c.eval_train_examples = 2000   # training examples used for train_loss (averaged model)
  c.seed = 0                     # init, data order and partition seed
  c.progress = True              # tqdm progress bar
  c.tensorboard = False          # also write workdir/tensorboard event files (tensorboardX):
                                 # the same scalars as metrics.jsonl
  c.checkpoint_every = 0         # steps between orbax checkpoints in workdir/checkpoints (a
                                 # multiple of eval_every; 0: none); a run started again in
                                 # the same workdir resumes from the newest one
  c.dpsgd = ml_collections.ConfigDict()
  c.dpsgd.order = "parallel"     # parallel (Lian et al.: gossip x while computing g(x)) | atc
  c.cluster = ml_collections.ConfigDict()  # simulated cluster behind sim_time (He & Dube)
  c.cluster.scenario = "homogeneous"  # homogeneous | one_slow | lognormal (worker speeds)
  c.cluster.slowdown = ()        # explicit per-worker slowdown factors (overrides scenario)
  c.cluster.slow_factor = 4.0    # one_slow: slowdown of the last worker
  c.cluster.spread = 0.5         # lognormal: sigma of log slowdown
  c.cluster.base_time = 0.01     # s of compute per mini-batch at slowdown 1
  c.cluster.delay = "none"       # none | shifted_exponential | bernoulli_exponential
  c.cluster.delay_mean = 0.0     # s, mean of the exponential part of a straggler delay
  c.cluster.delay_shift = 0.0    # s, shift of shifted_exponential
  c.cluster.delay_prob = 0.0     # probability of a delay per mini-batch (bernoulli_exponential)
  c.cluster.latency = 1e-4       # s per message (alpha of the alpha-beta model)
  c.cluster.bandwidth = 1e9      # bytes/s (1 / beta)
  c.cluster.seed = 0             # seed of the delays and of lognormal speeds
  c.cluster.failures = ""        # simulated failures "worker:start:duration,...": the worker
                                 # is down for those steps (allreduce*, dpsgd, matcha)
  c.nonblocking = ml_collections.ConfigDict()  # Non-blocking SGD (He & Dube 2022)
  c.nonblocking.enabled = False  # accumulate only the mini-batches finished by the deadline
  c.nonblocking.num_minibatches = 4  # M: mini-batches per worker batch (divides batch_size)
  c.nonblocking.deadline = "fastest"  # fastest | kth:K | seconds (e.g. "0.05")
  c.nonblocking.deadline_group = "all"  # all: one deadline for every worker | neighbours:
                                        # each worker's over itself and its neighbours
  c.compression = ml_collections.ConfigDict()  # gradient sparsification (Shi et al. 2019)
  c.compression.name = "none"    # none | top_k | gaussian_k | random_k (with allreduce)
  c.compression.density = 0.01   # k / d, in (0, 1]
  c.compression.error_feedback = True  # keep the unsent residual and add it next step
  c.compression.flatten = True   # one selection over the whole model (False: per layer)
  c.compression.gaussian_rounds = 8  # gaussian_k: max threshold corrections toward k
  c.compression.gaussian_correction = "bracket"  # bracket | paper (x0.5 / x1.5 steps only)
  c.local_sgd = ml_collections.ConfigDict()  # LUPA-SGD (Haddadpour et al. 2019)
  c.local_sgd.tau = 4            # local steps per communication period (tau_0 of ada_lupa)
  c.local_sgd.schedule = "fixed"  # fixed | ada_lupa | linear | post_local (see local_sgd.py)
  c.local_sgd.alpha = 0.1        # linear: tau_i = ceil(tau (1 + alpha i))
  c.local_sgd.switch_step = 0    # post_local: tau = 1 before this step, then tau
  c.local_sgd.max_tau = 0        # cap on any period (0: none)
  c.local_sgd.averaging = "mean"  # mean (exact average) | gossip (one step over topology)
  c.local_sgd.opt_state = "keep"  # at a sync: keep local | average | reset the optimizer state
  c.diloco = ml_collections.ConfigDict()  # DiLoCo (Douillard et al. 2023)
  c.diloco.inner_steps = 50      # H: inner steps per round
  c.diloco.outer_lr = 0.7        # outer SGD learning rate
  c.diloco.outer_momentum = 0.9  # outer momentum (0: plain SGD)
  c.diloco.outer_nesterov = True  # Nesterov outer momentum
  c.consensus = ml_collections.ConfigDict()  # consensus distance (Kong et al. 2021)
  c.consensus.control = False    # dpsgd / matcha: gossip again while Xi > target
  c.consensus.target = 0.0       # absolute target Xi (parameter units); 0: use target_ratio
  c.consensus.target_ratio = 0.0  # target = ratio x reference run's Xi at each step
  c.consensus.reference_workdir = ""  # the reference run (its steps.jsonl or metrics.jsonl)
  c.consensus.critical = False   # target = critical_scale x the critical consensus distance
                                 # Gamma_t, estimated on the fly (nbsgd_jax.consensus.CriticalTarget)
  c.consensus.critical_scale = 1.0  # c in target = c Gamma_t
  c.consensus.critical_ema = 0.9  # moving-average decay of the gradient statistics behind
                                  # Gamma_t, in [0, 1) (0: the last step's only)
  c.consensus.smoothness = 0.0   # L of Gamma_t; 0: estimated (Hessian power iteration)
  c.consensus.smoothness_every = 100  # re-estimate L every this many steps
  c.consensus.smoothness_iters = 20  # power iterations (Hessian-vector products) per estimate
  c.consensus.until_step = 0     # control only steps < until_step (0: always)
  c.consensus.max_gossip_steps = 5  # K: extra gossip steps per training step at most
  c.consensus.measure = "exact"  # exact (all-reduce of the model) | sketch (r coordinates)
  c.consensus.sketch_size = 1024  # r, coordinates of a sketch measurement
  c.consensus.log_every_step = False  # write workdir/steps.jsonl (Xi of every step)
  c.consensus.per_layer = False  # add consensus_distance_layers to every evaluation
  c.matcha = ml_collections.ConfigDict()
  c.matcha.budget = 0.5          # communication budget C_b in (0, 1]: expected fraction of
                                 # matchings active per step (1 = D-PSGD with W = I - alpha L)
  c.matcha.seed = 0              # seed of the shared Bernoulli activations
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


class ConfigError(ValueError):
  """Bad configuration; ``.errors`` holds one line per problem."""

  def __init__(self, errors: list[str]):
    self.errors = list(errors)
    super().__init__("\n".join(self.errors))


def _is_int(v: Any) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Check a configuration before any compilation.

  Raises:
    ConfigError: one message per bad key: ``config.KEY=VALUE ...: allowed ...``.
  """
  errs: list[str] = []

  def choice(key, allowed):
    v = cfg.get(key)
    if v not in allowed:
      errs.append(f"config.{key}={v!r} is not allowed: use one of {list(allowed)}")

  def integer(key, lo):
    v = cfg.get(key)
    if not _is_int(v) or v < lo:
      errs.append(f"config.{key}={v!r} is not allowed: it must be an integer >= {lo}")

  def number(key, lo, lo_open=False, hi=None, hi_open=False):
    v = cfg.get(key)
    bad = not _is_num(v) or v < lo or (lo_open and v == lo) or (hi is not None and (
        v > hi or (hi_open and v == hi)))
    if bad:
      rng = f"{'>' if lo_open else '>='} {lo}" + (
          f" and {'<' if hi_open else '<='} {hi}" if hi is not None else "")
      errs.append(f"config.{key}={v!r} is not allowed: it must be a number {rng}")

  choice("algorithm", ALGORITHMS)
  integer("num_workers", 1)
  choice("topology", TOPOLOGIES)
  choice("mixing_weights", MIXING_WEIGHTS)
  choice("backend", BACKENDS)
  choice("model", MODELS)
  choice("partition", PARTITIONS)
  number("dirichlet_alpha", 0, lo_open=True)
  integer("batch_size", 1)
  number("learning_rate", 0, lo_open=True)
  choice("lr_schedule", LR_SCHEDULES)
  integer("warmup_steps", 0)
  number("momentum", 0, hi=1, hi_open=True)  # 1: no decay, eta / (1 - momentum) infinite
  number("weight_decay", 0)
  integer("num_steps", 0)
  integer("eval_every", 1)
  integer("eval_train_examples", 1)
  integer("seed", 0)
  number("topology_p", 0, lo_open=True, hi=1)
  integer("topology_seed", 0)
  integer("topology_rows", 0)
  integer("topology_cols", 0)
  if (cfg.get("topology") == "torus" and _is_int(cfg.get("num_workers"))
      and _is_int(cfg.topology_rows) and _is_int(cfg.topology_cols)
      and (cfg.topology_rows or cfg.topology_cols)):
    r, c = cfg.topology_rows, cfg.topology_cols
    if r and c and r * c != cfg.num_workers:
      errs.append(f"config.topology_rows={r} x config.topology_cols={c} is not allowed with "
                  f"config.num_workers={cfg.num_workers}: rows x cols must equal num_workers")
    elif (r or c) and cfg.num_workers % (r or c):
      errs.append(f"config.topology_{'rows' if r else 'cols'}={r or c} is not allowed: it must "
                  f"divide config.num_workers={cfg.num_workers}")
  def boolean(key):
    v = cfg.get(key)
    if not isinstance(v, bool):
      errs.append(f"config.{key}={v!r} is not allowed: use True or False")

  def string(key):
    v = cfg.get(key)
    if not isinstance(v, str):
      errs.append(f"config.{key}={v!r} is not allowed: it must be a string")

  for key in ("nesterov", "progress", "tensorboard", "compression.error_feedback",
              "compression.flatten"):
    boolean(key)
  for key in ("data_dir", "consensus.reference_workdir"):
    string(key)
  for key, length in (("mlp_hidden", 0), ("cnn_channels", 2)):
    v = cfg.get(key)
    if (not isinstance(v, (tuple, list)) or not all(_is_int(x) and x >= 1 for x in v)
        or (length and len(v) != length)):
      errs.append(f"config.{key}={v!r} is not allowed: it must be a tuple of "
                  f"{'two ' if length else ''}integers >= 1, e.g. {default_config()[key]!r}")
  ce, ee = cfg.get("checkpoint_every"), cfg.get("eval_every")
  if not _is_int(ce) or ce < 0:
    errs.append(f"config.checkpoint_every={ce!r} is not allowed: it must be an integer >= 0 "
                "(0: no checkpoints)")
  elif ce and _is_int(ee) and ee >= 1 and ce % ee:
    errs.append(f"config.checkpoint_every={ce} is not allowed with config.eval_every={ee}: "
                "checkpoints are taken at evaluations, it must be a multiple of eval_every")
  from nbsgd_jax import cluster as cluster_lib  # numpy only
  n_cluster_errs = len(errs)
  choice("cluster.scenario", cluster_lib.SCENARIOS)
  choice("cluster.delay", cluster_lib.DELAYS)
  for key in ("base_time", "slow_factor", "bandwidth"):
    number(f"cluster.{key}", 0, lo_open=True)
  for key in ("spread", "delay_mean", "delay_shift", "latency"):
    number(f"cluster.{key}", 0)
  number("cluster.delay_prob", 0, hi=1)
  integer("cluster.seed", 0)
  v = cfg.cluster.get("slowdown")
  if not isinstance(v, (tuple, list)) or not all(_is_num(x) and x > 0 for x in v):
    errs.append(f"config.cluster.slowdown={v!r} is not allowed: it must be a tuple of "
                "numbers > 0, one per worker (() for none)")
  cluster_ok = len(errs) == n_cluster_errs
  v = cfg.matcha.budget
  if not _is_num(v) or not 0 < v <= 1:
    errs.append(f"config.matcha.budget={v!r} is not allowed: it must be a number > 0 and <= 1")
  if not _is_int(cfg.matcha.seed) or cfg.matcha.seed < 0:
    errs.append(f"config.matcha.seed={cfg.matcha.seed!r} is not allowed: it must be an "
                "integer >= 0")
  if cfg.get("algorithm") == "matcha" and cfg.get("topology") == "one_peer_exponential":
    errs.append("config.topology='one_peer_exponential' is not allowed with "
                "config.algorithm='matcha': MATCHA samples matchings of a static base graph")
  m = cfg.nonblocking.num_minibatches
  if not _is_int(m) or m < 1:
    errs.append(f"config.nonblocking.num_minibatches={m!r} is not allowed: it must be an "
                "integer >= 1")
  elif _is_int(cfg.get("batch_size")) and cfg.batch_size >= 1 and cfg.batch_size % m:
    errs.append(f"config.batch_size={cfg.batch_size} is not allowed with "
                f"config.nonblocking.num_minibatches={m}: the batch must split into M equal "
                "mini-batches (batch_size divisible by num_minibatches)")
  if cfg.nonblocking.deadline_group not in ("all", "neighbours"):
    errs.append(f"config.nonblocking.deadline_group={cfg.nonblocking.deadline_group!r} is not "
                "allowed: use one of ['all', 'neighbours']")
  if not isinstance(cfg.nonblocking.enabled, bool):
    errs.append(f"config.nonblocking.enabled={cfg.nonblocking.enabled!r} is not allowed: use "
                "True or False")
  try:
    rule = cluster_lib.parse_deadline(cfg.nonblocking.deadline)
  except ValueError as e:
    errs.append(f"config.{e}")
    rule = None
  if (cluster_ok and _is_int(cfg.get("num_workers")) and cfg.num_workers >= 1 and _is_int(m)
      and m >= 1):  # the cluster's own checks (finite values, slowdown per worker), deadline
    try:
      cl = make_cluster(cfg)
      if rule is not None:
        cluster_lib.check_deadline(cl, rule)
    except ValueError as e:
      errs.append(f"config.{e}")
  comp = cfg.compression
  if comp.name not in COMPRESSIONS:
    errs.append(f"config.compression.name={comp.name!r} is not allowed: use one of "
                f"{list(COMPRESSIONS)}")
  elif comp.name != "none":
    if not _is_num(comp.density) or not 0 < comp.density <= 1:
      errs.append(f"config.compression.density={comp.density!r} is not allowed: it must be a "
                  "number > 0 and <= 1")
    rounds = comp.gaussian_rounds
    if not (isinstance(rounds, int) and not isinstance(rounds, bool) and 0 <= rounds <= 64):
      errs.append(f"config.compression.gaussian_rounds={rounds!r} is not allowed: it must be "
                  "an int in [0, 64]")
    if comp.gaussian_correction not in ("bracket", "paper"):
      errs.append(f"config.compression.gaussian_correction={comp.gaussian_correction!r} is not "
                  "allowed: use 'bracket' or 'paper'")
    if cfg.get("algorithm") != "allreduce":
      errs.append(f"config.compression.name={comp.name!r} is not allowed with "
                  f"config.algorithm={cfg.get('algorithm')!r}: sparsification runs on "
                  "'allreduce' (sparse all-gather)")
    if cfg.nonblocking.enabled:
      errs.append(f"config.compression.name={comp.name!r} is not allowed with "
                  "config.nonblocking.enabled=True: not combined yet")
  ls = cfg.local_sgd
  for key, allowed in (("schedule", TAU_SCHEDULES), ("averaging", LOCAL_AVERAGINGS),
                       ("opt_state", OPT_STATE_SYNCS)):
    if ls.get(key) not in allowed:
      errs.append(f"config.local_sgd.{key}={ls.get(key)!r} is not allowed: use one of "
                  f"{list(allowed)}")
  for key, lo in (("tau", 1), ("switch_step", 0), ("max_tau", 0)):
    if not _is_int(ls.get(key)) or ls.get(key) < lo:
      errs.append(f"config.local_sgd.{key}={ls.get(key)!r} is not allowed: it must be an "
                  f"integer >= {lo}")
  if not _is_num(ls.alpha) or ls.alpha < 0:
    errs.append(f"config.local_sgd.alpha={ls.alpha!r} is not allowed: it must be a number >= 0")
  dl = cfg.diloco
  if not _is_int(dl.inner_steps) or dl.inner_steps < 1:
    errs.append(f"config.diloco.inner_steps={dl.inner_steps!r} is not allowed: it must be an "
                "integer >= 1 (H)")
  if not _is_num(dl.outer_lr) or dl.outer_lr <= 0:
    errs.append(f"config.diloco.outer_lr={dl.outer_lr!r} is not allowed: it must be a number > 0")
  if not _is_num(dl.outer_momentum) or not 0 <= dl.outer_momentum < 1:
    errs.append(f"config.diloco.outer_momentum={dl.outer_momentum!r} is not allowed: it must "
                "be a number >= 0 and < 1")
  if not isinstance(dl.outer_nesterov, bool):
    errs.append(f"config.diloco.outer_nesterov={dl.outer_nesterov!r} is not allowed: use True "
                "or False")
  if cfg.get("algorithm") in PERIODIC and cfg.nonblocking.enabled is True:
    errs.append(f"config.algorithm={cfg.algorithm!r} is not allowed with "
                "config.nonblocking.enabled=True: not combined yet")
  cs = cfg.consensus
  for key in ("control", "log_every_step", "per_layer", "critical"):
    if not isinstance(cs.get(key), bool):
      errs.append(f"config.consensus.{key}={cs.get(key)!r} is not allowed: use True or False")
  for key, lo in (("max_gossip_steps", 1), ("sketch_size", 1), ("until_step", 0),
                  ("smoothness_every", 1), ("smoothness_iters", 1)):
    if not _is_int(cs.get(key)) or cs.get(key) < lo:
      errs.append(f"config.consensus.{key}={cs.get(key)!r} is not allowed: it must be an "
                  f"integer >= {lo}")
  for key in ("target", "target_ratio", "smoothness"):
    if not _is_num(cs.get(key)) or cs.get(key) < 0:
      errs.append(f"config.consensus.{key}={cs.get(key)!r} is not allowed: it must be a "
                  "number >= 0")
  ema = cs.get("critical_ema")
  if not _is_num(ema) or not 0 <= ema < 1:
    errs.append(f"config.consensus.critical_ema={ema!r} is not allowed: it must be a number "
                ">= 0 and < 1")
  if not _is_num(cs.get("critical_scale")) or cs.get("critical_scale") <= 0:
    errs.append(f"config.consensus.critical_scale={cs.get('critical_scale')!r} is not allowed: "
                "it must be a number > 0")
  if cs.measure not in ("exact", "sketch"):
    errs.append(f"config.consensus.measure={cs.measure!r} is not allowed: use one of "
                "['exact', 'sketch']")
  if cs.control is True:
    if cfg.get("algorithm") not in ("dpsgd", "matcha"):
      errs.append(f"config.consensus.control=True is not allowed with config.algorithm="
                  f"{cfg.get('algorithm')!r}: consensus control runs on 'dpsgd' and 'matcha'")
    given = [_is_num(cs.target) and cs.target > 0,
             _is_num(cs.target_ratio) and cs.target_ratio > 0, cs.critical is True]
    if sum(given) != 1:
      errs.append(f"config.consensus.target={cs.target!r}, config.consensus.target_ratio="
                  f"{cs.target_ratio!r} and config.consensus.critical={cs.critical!r} are not "
                  "allowed: give exactly one target (target > 0, target_ratio > 0 or "
                  "critical=True)")
    elif _is_num(cs.target_ratio) and cs.target_ratio > 0 and not cs.reference_workdir:
      errs.append(f"config.consensus.target_ratio={cs.target_ratio!r} is not allowed with "
                  f"config.consensus.reference_workdir={cs.reference_workdir!r}: it needs "
                  "config.consensus.reference_workdir (a finished run's workdir)")
  if cfg.dpsgd.order not in DPSGD_ORDERS:
    errs.append(f"config.dpsgd.order={cfg.dpsgd.order!r} is not allowed: use one of "
                f"{list(DPSGD_ORDERS)}")
  ds = cfg.get("dataset")
  if not isinstance(ds, str) or not (ds == "mnist10k" or (ds.startswith("tfds:") and len(ds) > 5)):
    errs.append(f"config.dataset={ds!r} is not allowed: use 'mnist10k' or 'tfds:<name>' "
                "(e.g. 'tfds:mnist', 'tfds:fashion_mnist', 'tfds:cifar10')")
  fails = cfg.cluster.get("failures")
  if not isinstance(fails, str):
    errs.append(f"config.cluster.failures={fails!r} is not allowed: write a string "
                "'worker:start:duration,...' ('' for none)")
  elif fails.strip():
    from nbsgd_jax import cluster as cluster_lib
    try:
      cluster_lib.parse_failures(fails, cfg.num_workers if _is_int(cfg.get("num_workers")) else 0)
    except ValueError as e:
      errs.append(f"config.{e}")
    if cfg.get("algorithm") not in ("allreduce", "allreduce_ring", "dpsgd", "matcha") or (
        cfg.compression.name != "none"):
      errs.append(f"config.cluster.failures={fails!r} is not allowed with config.algorithm="
                  f"{cfg.get('algorithm')!r} and config.compression.name="
                  f"{cfg.compression.name!r}: simulated failures run on 'allreduce', "
                  "'allreduce_ring', 'dpsgd' and 'matcha' without compression")
  k = cfg.get("workers_per_device")
  if not _is_int(k) or k < 0:
    errs.append(f"config.workers_per_device={k!r} is not allowed: it must be an integer >= 0 "
                "(0: chosen from the device count)")
  elif cfg.get("backend") == "mesh" and _is_int(cfg.get("num_workers")) and cfg.num_workers > 0:
    import jax  # deferred: validation of the rest needs no devices
    nd, n = jax.device_count(), cfg.num_workers
    if k and (n % k or n // k > nd):
      errs.append(f"config.workers_per_device={k} is not allowed with num_workers={n} on {nd} "
                  f"devices: it must divide num_workers with num_workers / workers_per_device "
                  f"<= {nd}")
  elif (cfg.get("backend") == "multihost" and _is_int(cfg.get("num_workers"))
        and cfg.num_workers > 0):
    import jax  # after jax.distributed.initialize (nbsgd_jax.multihost): all processes' devices
    nd, n, procs = jax.device_count(), cfg.num_workers, jax.process_count()
    if n % nd:
      errs.append(f"config.num_workers={n} is not allowed with config.backend='multihost' on "
                  f"{procs} process(es) with {nd} devices in all: the workers must divide "
                  f"evenly across processes and devices (a multiple of {nd})")
    elif k and k * nd != n:
      errs.append(f"config.workers_per_device={k} is not allowed with config.backend="
                  f"'multihost': num_workers={n} on {nd} devices puts {n // nd} on each "
                  "(0 picks it)")

  def leaves(node, prefix=""):  # non-finite floats anywhere: nan passes the range checks
    for k, v in node.items():
      if isinstance(v, ml_collections.ConfigDict):
        yield from leaves(v, f"{prefix}{k}.")
      else:
        yield prefix + k, v
  for key, v in leaves(cfg):
    if (isinstance(v, float) and not math.isfinite(v)
        and not any(e.startswith(f"config.{key}=") for e in errs)):
      errs.append(f"config.{key}={v!r} is not allowed: it must be a finite number")
  if errs:
    raise ConfigError(errs)


def make_cluster(cfg: ml_collections.ConfigDict):
  """The :class:`nbsgd_jax.cluster.Cluster` of ``cfg.cluster`` (M from ``cfg.nonblocking``).

  Raises:
    ValueError: a bad ``cluster.*`` value (the message names the field).
  """
  from nbsgd_jax import cluster as cluster_lib
  c = cfg.cluster
  return cluster_lib.make_cluster(
      cfg.num_workers, cfg.nonblocking.num_minibatches, scenario=c.scenario,
      slowdown=list(c.slowdown) or None, base_time=c.base_time, delay=c.delay,
      delay_mean=c.delay_mean, delay_shift=c.delay_shift, delay_prob=c.delay_prob,
      spread=c.spread, slow_factor=c.slow_factor, latency=c.latency, bandwidth=c.bandwidth,
      seed=c.seed)
