"""The simulated cluster's config sections: ``config.cluster.*`` and ``config.nonblocking.*``
with their defaults and checks, and the :class:`~nbsgd_jax.host.cluster.Cluster` of a config
(:func:`from_config`). :mod:`nbsgd_jax.host.cluster` re-exports every name here."""

from __future__ import annotations

from typing import Optional

import ml_collections

from nbsgd_jax.core import checks
from nbsgd_jax.host import episodes as episodes_lib
from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host import network as network_lib
from nbsgd_jax.host.cluster import (DELAY_PER, DELAYS, SCENARIOS, Cluster, make_cluster)
from nbsgd_jax.host.clock import check_deadline, parse_deadline  # noqa: F401
from nbsgd_jax.host.failures import failures_named, failures_on, parse_failures


# cluster.* keys only the host reads (the clock, stragglers, speeds): not the compiled step's
HOST_KEYS = ("bandwidth", "delay", "delay_mean", "delay_per", "delay_prob", "delay_shift",
             "episode_factor", "episode_median", "episode_rate", "episode_sigma",
             "failure_mtbf", "failure_policy", "failure_repair", "failure_shape", "levels",
             "placement", "quorum_policy",
             "rejoin_fetch", "restart_every", "restart_seconds",
             "latency", "measure_time_per_example", "overhead", "scenario", "seed",
             "slow_factor", "slowdown", "spread", "step_overhead", "time_per_example", "trace")


def partial_minibatches(cfg) -> bool:
  """Whether a step's batch is split into ``nonblocking.num_minibatches`` mini-batches of which
  some may be dropped: with Non-blocking SGD (:func:`nbsgd_jax.run.step.gradient_source`)."""
  return cfg.nonblocking.get("enabled") is True


def counted_steps(cfg) -> bool:
  """Whether workers may contribute unequal work to a step: with Non-blocking SGD, and with
  simulated failures (a failed worker contributes nothing). Means are then count-weighted and
  the optimizer skips idle steps (:class:`nbsgd_jax.recipes.Builder`)."""
  return partial_minibatches(cfg) or failures_lib.drops_workers(cfg)


def num_minibatches(cfg) -> int:
  """``M`` of the cluster model: ``nonblocking.num_minibatches`` when mini-batches may be
  dropped (:func:`partial_minibatches`), else 1 (the batch at once)."""
  return cfg.nonblocking.num_minibatches if partial_minibatches(cfg) else 1


def from_config(cfg, time_per_example: Optional[float] = None) -> Cluster:
  """The :class:`Cluster` of ``cfg.cluster`` (``M`` from :func:`num_minibatches`, ``B`` from
  ``batch_size``).

  Args:
    cfg: the config.
    time_per_example: seconds, used instead of ``cluster.time_per_example`` when
      ``cluster.measure_time_per_example`` (:func:`nbsgd_jax.run.setup.
      measure_time_per_example`); None: the configured value.

  Raises:
    ValueError: a bad ``cluster.*`` value (the message names the field).
  """
  c = cfg.cluster
  tpe = c.time_per_example if time_per_example is None else time_per_example
  cl = make_cluster(
      cfg.num_workers, num_minibatches(cfg), scenario=c.scenario,
      slowdown=list(c.slowdown) or None, time_per_example=tpe, batch_size=cfg.batch_size,
      overhead=c.overhead, delay=c.delay, delay_per=c.delay_per, delay_mean=c.delay_mean,
      delay_shift=c.delay_shift, delay_prob=c.delay_prob, spread=c.spread,
      slow_factor=c.slow_factor, latency=c.latency, bandwidth=c.bandwidth, seed=c.seed)
  step_seconds = (cl.minibatch_time - cl.overhead) * cl.num_minibatches
  episodes, trace = episodes_lib.speed_over_time(
      cl.n, step_seconds, c.episode_rate, c.episode_median, c.episode_sigma, c.episode_factor,
      c.trace, c.seed)
  network = (network_lib.Network(cl.n, network_lib.parse_levels(c.levels, cl.n), cl.latency,
                                 cl.bandwidth, c.placement) if c.levels else None)
  return cl._replace(episodes=episodes, trace=trace, network=network)



def _value_errors(cfg) -> list:
  """The lines of the bad ``cluster.*`` values that ``make_cluster`` reads."""
  errs: list = []
  checks.choice(cfg, errs, "cluster.scenario", SCENARIOS)
  checks.choice(cfg, errs, "cluster.delay", DELAYS)
  checks.choice(cfg, errs, "cluster.delay_per", DELAY_PER)
  checks.boolean(cfg, errs, "cluster.measure_time_per_example")
  for key in ("time_per_example", "slow_factor", "bandwidth"):
    checks.number(cfg, errs, f"cluster.{key}", 0, lo_open=True)
  for key in ("spread", "delay_mean", "delay_shift", "latency", "overhead", "step_overhead"):
    checks.number(cfg, errs, f"cluster.{key}", 0)
  checks.number(cfg, errs, "cluster.delay_prob", 0, hi=1)
  checks.integer(cfg, errs, "cluster.seed", 0)
  episodes_lib.check_config(cfg, errs)
  checks.choice(cfg, errs, "cluster.allreduce_algorithm", ("ring", "tree"))
  g, n = cfg.cluster.get("allreduce_group_size"), cfg.get("num_workers")
  if checks.integer(cfg, errs, "cluster.allreduce_group_size", 0) and g and checks.is_int(n) and (
      g < 2 or n % g):
    errs.append(f"config.cluster.allreduce_group_size={g} is not allowed with "
                f"config.num_workers={n}: it must be 0 (a flat ring) or >= 2 and divide the "
                "workers")
  levels = cfg.cluster.get("levels")
  if not isinstance(levels, (tuple, list)):
    errs.append(f"config.cluster.levels={levels!r} is not allowed: it must be a tuple of "
                "'size:latency:bandwidth' strings (() for a flat network)")
  else:
    try:  # the levels tile the workers (when num_workers is itself good)
      network_lib.parse_levels(levels, n if checks.is_int(n) and n >= 1 else None)
    except ValueError as e:
      errs.append(f"config.{e}")
  place = cfg.cluster.get("placement")
  if not isinstance(place, (tuple, list)) or (len(place) and sorted(place) != list(
      range(n if checks.is_int(n) else -1))):
    errs.append(f"config.cluster.placement={place!r} is not allowed: it must be () or a "
                f"permutation of the workers 0..num_workers-1 (worker i's place)")
  elif len(place) and cfg.cluster.get("allreduce_group_size"):
    errs.append(f"config.cluster.placement={tuple(place)!r} is not allowed with "
                "config.cluster.allreduce_group_size: the hierarchical all-reduce groups "
                "consecutive workers")
  elif len(place) and isinstance(levels, (tuple, list)) and not levels:
    errs.append(f"config.cluster.placement={tuple(place)!r} is not allowed with "
                "config.cluster.levels=(): a place matters only on a hierarchical network "
                "(set cluster.levels, or placement=())")
  if checks.boolean(cfg, errs, "cluster.rebuild_collectives") and (
      cfg.cluster.get("rebuild_collectives") and cfg.cluster.get("allreduce_group_size")):
    errs.append(f"config.cluster.rebuild_collectives=True is not allowed with "
                f"config.cluster.allreduce_group_size="
                f"{cfg.cluster.get('allreduce_group_size')!r}: the "
                "rebuilt all-reduce is the flat one (ring or tree) over the live workers")
  failures_lib.check_config(cfg, errs)
  v = cfg.cluster.get("slowdown")
  if not isinstance(v, (tuple, list)) or not all(checks.is_num(x) and x > 0 for x in v):
    errs.append(f"config.cluster.slowdown={v!r} is not allowed: it must be a tuple of "
                "numbers > 0, one per worker (() for none)")
  return errs


def try_from_config(cfg) -> tuple:
  """``(from_config(cfg), None)``; ``(None, line)`` when the cluster refuses the values
  (non-finite, not one slowdown per worker); ``(None, None)`` when a value it needs is bad on
  its own (the section checks report it)."""
  n, m, b = (cfg.get("num_workers"), cfg.nonblocking.get("num_minibatches"),
             cfg.get("batch_size"))
  if _value_errors(cfg) or not all(checks.is_int(x) and x >= 1 for x in (n, m, b)):
    return None, None
  try:
    return from_config(cfg), None
  except ValueError as e:
    return None, f"config.{e}"


CLOCKS = ("simulated", "wall")


def cluster_defaults() -> ml_collections.ConfigDict:
  """``config.cluster.*`` with their defaults: simulated cluster behind sim_time (He & Dube)."""
  s = ml_collections.ConfigDict()
  s.scenario = "homogeneous"     # homogeneous | one_slow | lognormal (worker speeds)
  s.slowdown = ()                # explicit per-worker slowdown factors (overrides scenario)
  s.slow_factor = 4.0            # one_slow: slowdown of the last worker
  s.spread = 0.5                 # lognormal: sigma of log slowdown
  s.time_per_example = 1e-3      # s of forward + backward per example at slowdown 1
  s.measure_time_per_example = False  # True: time_per_example is timed on this
                                 # device at start (the run's model and batch), in summary.json
  s.overhead = 0.0               # s per mini-batch on top (launch, data), not slowed down
  s.step_overhead = 0.0          # s per step after the computation (the update, dispatch and
                                 # host sync around the collective), not slowed down
  s.delay_per = "iteration"      # iteration: one straggler delay per worker per step |
                                     # minibatch: one per mini-batch
  s.delay = "none"               # none | shifted_exponential | bernoulli_exponential
  s.delay_mean = 0.0             # s, mean of the exponential part of a straggler delay
  s.delay_shift = 0.0            # s, shift of shifted_exponential
  s.delay_prob = 0.0             # probability of a delay (bernoulli_exponential)
  s.latency = 1e-4               # s per message (alpha of the alpha-beta model); with
                                 # levels, of the outermost link
  s.bandwidth = 1e9              # bytes/s (1 / beta); with levels, of the outermost link
  s.levels = ()                  # a hierarchical network, innermost first: "size:latency:
                                 # bandwidth" each, e.g. ("8:1e-6:3e11", "4:1e-5:1.25e10");
                                 # a level's group (the sizes up to it multiplied) must
                                 # divide num_workers
  s.placement = ()               # levels: worker i's place (a permutation; () for i itself)
  s.allreduce_group_size = 0          # 0: a flat ring | g: the hierarchical all-reduce over groups
                                 # of g consecutive workers (reduce-scatter inside, all-reduce
                                 # across, all-gather inside)
  s.allreduce_algorithm = "ring"  # ring | tree: NCCL's double binary tree, 2 ceil(log2 n)
                                 # messages, 2 (n - 1) / n S bytes per worker on average and
                                 # the busiest worker's 2 S timed (S for n = 2, 3 S / 2 for
                                 # n = 3; with allreduce_group_size: its across phase)
  s.rebuild_collectives = False  # failures: True charges the all-reduce over the live
                                 # workers (torchft reconfigures its process group at each
                                 # quorum); False: over all n, as a fixed communicator
  s.seed = 0                     # seed of the delays and of lognormal speeds
  s.clock = "simulated"          # simulated: counts and sim_time from this model | wall:
                                 # each process runs its mini-batches against its own wall
                                 # clock (backend=multihost; deadlines in real seconds)
  s.emulate = True               # wall: each process sleeps so that its mini-batch times
                                 # follow this model (stragglers on homogeneous hardware)
  s.failures = ""                # simulated failures "worker:start:duration,...": the worker
                                 # is down for those steps (every algorithm)
  s.failure_mtbf = 0.0           # failures at a rate: mean hours a worker is up (0: none;
                                 # Llama 3's per GPU: about 50,700, docs/clock.md)
  s.failure_repair = 600.0       # s, mean time a failed worker is down (exponential; a
                                 # restart's 5-20 min as Meta's reliability study is quoted)
  s.failure_shape = 1.0          # Weibull shape of the up time (1: exponential)
  s.failure_policy = "elastic"   # elastic: the others go on | restart: from the checkpoint
  s.restart_every = 100          # restart: steps between the job's checkpoints
  s.restart_seconds = 600.0      # restart: s to reload, besides the steps lost since then
  s.quorum_policy = "go_on"      # go_on: a step with fewer than K workers up (deadline
                                 # kth:K[:G]) runs with them | wait: it waits for repairs
                                 # until K are up (torchft's lighthouse; docs/clock.md)
  s.rejoin_fetch = False         # elastic: a worker back from a failure fetches the current
                                 # model first (one model's bytes and time charged on its
                                 # link; for methods whose workers share a model)
  s.episode_rate = 0.0           # fail-slow episodes: onsets per worker per hour of its
                                 # computation (0: none; Greyhound's communication episodes:
                                 # about 0.03 per node-hour, docs/clock.md)
  s.episode_median = 1260.0      # s, median duration (lognormal; Greyhound Fig. 1: 21 min)
  s.episode_sigma = 1.5          # the log-standard deviation of an episode's duration
  s.episode_factor = 1.5         # a worker computes this many times slower in an episode
                                 # (Greyhound: 1.39-1.84x for network congestion)
  s.trace = ""                   # CSV of step,worker,seconds: each worker's compute seconds
                                 # per step from that step on (docs/clock.md)
  return s


def check_config(cfg, errs: list) -> None:
  """cluster.*: the simulated cluster behind sim_time and the failures; the wall clock runs
  on the multihost backend without failures."""
  errs.extend(_value_errors(cfg))
  checks.choice(cfg, errs, "cluster.clock", CLOCKS)
  checks.boolean(cfg, errs, "cluster.emulate")
  if cfg.cluster.get("clock") == "wall":
    if cfg.get("backend") != "multihost":
      errs.append(f"config.cluster.clock='wall' is not allowed with config.backend="
                  f"{cfg.get('backend')!r}: the wall clock runs processes apart (use "
                  "backend='multihost', e.g. through nbsgd_jax.launch)")
    if failures_on(cfg):
      errs.append(f"{failures_named(cfg)} is not allowed with config.cluster.clock='wall': "
                  "failures are simulated (use clock='simulated')")
    if cfg.cluster.get("levels") and cfg.cluster.get("emulate") is False:
      errs.append(f"config.cluster.levels={tuple(cfg.cluster.levels)!r} is not allowed with "
                  "config.cluster.clock='wall' and config.cluster.emulate=False: the wall "
                  "clock's links are then the real ones (emulate=True sleeps the modelled "
                  "links' time after each collective)")
    if cfg.nonblocking.get("deadline_group") == "neighbours" and cfg.nonblocking.get("enabled"):
      errs.append("config.nonblocking.deadline_group='neighbours' is not allowed with "
                  "config.cluster.clock='wall': one deadline for every process (use 'all')")
  _, line = try_from_config(cfg)
  if line:
    errs.append(line)
  fails = cfg.cluster.get("failures")
  if not isinstance(fails, str):
    errs.append(f"config.cluster.failures={fails!r} is not allowed: write a string "
                "'worker:start:duration,...' ('' for none)")
  elif fails.strip():
    try:
      parse_failures(fails, cfg.num_workers if checks.is_int(cfg.get("num_workers")) else 0)
    except ValueError as e:
      errs.append(f"config.{e}")


def nonblocking_defaults() -> ml_collections.ConfigDict:
  """``config.nonblocking.*`` with their defaults: Non-blocking SGD (He & Dube 2022)."""
  s = ml_collections.ConfigDict()
  s.enabled = False              # accumulate only the mini-batches finished by the deadline
  s.num_minibatches = 4          # M: mini-batches per worker batch (divides batch_size)
  s.deadline = "fastest"         # fastest | kth:K | kth:K:G (a quorum of K and G s of grace)
                                 # | adaptive | seconds (e.g. "0.05")
  s.adaptive_k = 2.0             # adaptive: deadline = median + k * MAD of finishing times
  s.window = 10                  # steps of finishing times behind adaptive (and, on the wall
                                 # clock, fastest / kth:K)
  s.deadline_group = "all"       # all: one deadline for every worker | neighbours:
                                        # each worker's over itself and its neighbours
  s.unroll = True                # unroll the loop over the M mini-batches (XLA CPU runs
                                 # convolutions in a rolled loop ~20x slower); False: a rolled
                                 # lax.scan, one mini-batch's activations live at a time
  return s


def check_nonblocking_config(cfg, errs: list) -> None:
  """nonblocking.*: M divides the batch when the batch is split; the deadline rule against the
  cluster."""
  checks.boolean(cfg, errs, "nonblocking.enabled")
  checks.boolean(cfg, errs, "nonblocking.unroll")
  m, b = cfg.nonblocking.get("num_minibatches"), cfg.get("batch_size")
  if (checks.integer(cfg, errs, "nonblocking.num_minibatches", 1) and partial_minibatches(cfg)
      and checks.is_int(b) and b >= 1 and b % m):
    errs.append(f"config.batch_size={b} is not allowed with "
                f"config.nonblocking.num_minibatches={m}: the batch must split into M equal "
                "mini-batches (batch_size divisible by num_minibatches)")
  checks.choice(cfg, errs, "nonblocking.deadline_group", ("all", "neighbours"))
  checks.number(cfg, errs, "nonblocking.adaptive_k", 0)
  checks.integer(cfg, errs, "nonblocking.window", 1)
  try:
    rule = parse_deadline(cfg.nonblocking.get("deadline"))
    if rule == "adaptive" and cfg.nonblocking.get("deadline_group") == "neighbours":
      errs.append("config.nonblocking.deadline='adaptive' is not allowed with "
                  "config.nonblocking.deadline_group='neighbours': the adaptive deadline is "
                  "one for every worker (use 'all')")
    cluster, _ = try_from_config(cfg)
    if cluster is not None:
      check_deadline(cluster, rule)
  except ValueError as e:
    errs.append(f"config.{e}")
