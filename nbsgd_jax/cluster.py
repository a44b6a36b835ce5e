"""Simulated cluster: mini-batch finish times, deadlines and the max-plus clock.

Host-side numpy, evaluated once per training step (never inside ``jit``).

Model (He & Dube, arXiv 2211.00889; ``docs/algorithms.md``, "Simulated cluster and clock").
Each of ``n`` workers splits its batch into ``M`` mini-batches. Mini-batch ``j`` on worker
``i`` takes ``base_time * slowdown_i + d_ij`` seconds, with ``d_ij``
a random straggler delay:

* ``"none"``: ``d_ij = 0``;
* ``"shifted_exponential"``: ``d_ij = delay_shift + Exp(mean=delay_mean)``;
* ``"bernoulli_exponential"``: ``d_ij = Bernoulli(delay_prob) * Exp(mean=delay_mean)``.

Mini-batches run back to back, so the finish times ``finish[i, j]`` (seconds after the start
of the iteration) are the cumulative sums over ``j``. At a deadline (:func:`deadline`) worker
``i`` has finished ``m_i`` mini-batches (:func:`finished_counts`); the rest are dropped.

Clock: per-worker simulated clocks follow the max-plus recursion (:func:`advance_clocks`)
``c_i <- max_{j in N(i) + {i}} (c_j + compute_j) + comm_i`` with the alpha-beta
communication cost ``comm_i = latency * messages_i + bytes_i / bandwidth`` (Hockney 1994,
:func:`comm_time`).

Randomness: step ``t`` draws from ``np.random.default_rng([seed, t])``, so a step's delays do
not depend on which steps were simulated before (resume-friendly).

Errors: bad input raises ``ValueError("<field>=<value> is not allowed: ...")`` naming the
config field (``num_workers``, ``nonblocking.num_minibatches``, ``nonblocking.deadline``,
``cluster.<name>``).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np

from nbsgd_jax import checks

SCENARIOS = ("homogeneous", "one_slow", "lognormal")
DELAYS = ("none", "shifted_exponential", "bernoulli_exponential")

DeadlineRule = Union[str, float]  # "fastest", "kth:K" or a fixed budget in seconds


class Cluster(NamedTuple):
  """A simulated cluster.

  Attributes:
    n: number of workers (``num_workers``).
    num_minibatches: mini-batches per worker per step, ``M``.
    base_time: seconds per mini-batch on a worker with slowdown 1.
    slowdown: float64 ``[n]``, every entry > 0; worker ``i`` takes
      ``base_time * slowdown[i]`` seconds per mini-batch before delays.
    delay: one of ``DELAYS``.
    delay_mean: mean of the exponential part of the delay, seconds.
    delay_shift: constant part of the shifted-exponential delay, seconds.
    delay_prob: probability that a mini-batch is delayed (bernoulli_exponential).
    latency: alpha, seconds per message.
    bandwidth: 1 / beta, bytes per second.
    seed: non-negative integer seed of the delay draws.
  """
  n: int
  num_minibatches: int
  base_time: float
  slowdown: np.ndarray
  delay: str
  delay_mean: float
  delay_shift: float
  delay_prob: float
  latency: float
  bandwidth: float
  seed: int


def _err(field: str, value, why: str) -> ValueError:
  return ValueError(f"{field}={value!r} is not allowed: {why}")


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_real(field: str, x, low: float, strict: bool) -> float:
  if not _is_real(x) or not math.isfinite(float(x)):
    raise _err(field, x, "it must be a finite number")
  if (float(x) <= low) if strict else (float(x) < low):
    raise _err(field, x, f"it must be {'>' if strict else '>='} {low}")
  return float(x)


def make_cluster(n: int, num_minibatches: int, scenario: str = "homogeneous",
                 slowdown: Optional[Sequence[float]] = None, base_time: float = 0.01,
                 delay: str = "none", delay_mean: float = 0.0, delay_shift: float = 0.0,
                 delay_prob: float = 0.0, spread: float = 0.5, slow_factor: float = 4.0,
                 latency: float = 1e-4, bandwidth: float = 1e9, seed: int = 0) -> Cluster:
  """Builds and validates a :class:`Cluster`.

  Speeds (``slowdown``, used when ``slowdown`` is None):

  * ``"homogeneous"``: all 1 (equal speeds; random delays are configured separately).
  * ``"one_slow"``: all 1 except worker ``n - 1``, which has ``slow_factor``.
  * ``"lognormal"``: ``exp(N(0, spread^2))`` per worker, divided by its minimum so the fastest
    worker has slowdown 1; drawn from ``SeedSequence(seed, spawn_key=(1,))`` (independent of
    the per-step delay streams).

  An explicit ``slowdown`` (length ``n``, every entry > 0) overrides the scenario (the
  scenario name is still validated).

  Args:
    n: number of workers, >= 1.
    num_minibatches: ``M``, integer >= 1.
    scenario: one of ``SCENARIOS``.
    slowdown: optional explicit per-worker slowdowns ``[n]``.
    base_time: seconds per mini-batch at slowdown 1, > 0.
    delay: one of ``DELAYS``.
    delay_mean: seconds, >= 0.
    delay_shift: seconds, >= 0.
    delay_prob: in [0, 1].
    spread: lognormal standard deviation, >= 0.
    slow_factor: slowdown of the slow worker in ``"one_slow"``, > 0.
    latency: seconds per message, >= 0.
    bandwidth: bytes per second, > 0.
    seed: integer >= 0.

  Returns:
    The cluster.

  Raises:
    ValueError: any argument out of range, naming its config field.
  """
  if not _is_int(n) or n < 1:
    raise _err("num_workers", n, "it must be an integer >= 1")
  if not _is_int(num_minibatches) or num_minibatches < 1:
    raise _err("nonblocking.num_minibatches", num_minibatches, "it must be an integer >= 1")
  if scenario not in SCENARIOS:
    raise _err("cluster.scenario", scenario, f"it must be one of {list(SCENARIOS)}")
  if delay not in DELAYS:
    raise _err("cluster.delay", delay, f"it must be one of {list(DELAYS)}")
  base_time = _check_real("cluster.base_time", base_time, 0.0, strict=True)
  delay_mean = _check_real("cluster.delay_mean", delay_mean, 0.0, strict=False)
  delay_shift = _check_real("cluster.delay_shift", delay_shift, 0.0, strict=False)
  delay_prob = _check_real("cluster.delay_prob", delay_prob, 0.0, strict=False)
  if delay_prob > 1.0:
    raise _err("cluster.delay_prob", delay_prob, "it must be in [0, 1]")
  spread = _check_real("cluster.spread", spread, 0.0, strict=False)
  slow_factor = _check_real("cluster.slow_factor", slow_factor, 0.0, strict=True)
  latency = _check_real("cluster.latency", latency, 0.0, strict=False)
  bandwidth = _check_real("cluster.bandwidth", bandwidth, 0.0, strict=True)
  if not _is_int(seed) or seed < 0:
    raise _err("cluster.seed", seed, "it must be an integer >= 0")

  if slowdown is not None:
    try:
      s = np.asarray(slowdown, dtype=np.float64)
    except (TypeError, ValueError):
      raise _err("cluster.slowdown", slowdown, "it must be a list of numbers") from None
    if s.shape != (n,):
      raise _err("cluster.slowdown", slowdown, f"it must be a list of length num_workers={n}")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
      raise _err("cluster.slowdown", slowdown, "every entry must be finite and > 0")
  elif scenario == "homogeneous":
    s = np.ones(n)
  elif scenario == "one_slow":
    s = np.ones(n)
    s[n - 1] = slow_factor
  else:  # lognormal
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(1,)))
    s = np.exp(rng.normal(0.0, spread, size=n))
    s = s / s.min()
  s = s.copy()
  s.flags.writeable = False
  return Cluster(n=int(n), num_minibatches=int(num_minibatches), base_time=base_time,
                 slowdown=s, delay=delay, delay_mean=delay_mean, delay_shift=delay_shift,
                 delay_prob=delay_prob, latency=latency, bandwidth=bandwidth, seed=int(seed))


def minibatch_finish_times(cluster: Cluster, step: int) -> np.ndarray:
  """Finish times of every mini-batch in one step.

  ``finish[i, j] = sum_{k <= j} (base_time * slowdown_i + d_ik)``, with delays from
  ``np.random.default_rng([seed, step])`` (reproducible per (seed, step), independent of call
  order).

  Args:
    cluster: the cluster.
    step: training step, integer >= 0.

  Returns:
    float64 ``[n, M]``, seconds after the start of the iteration; non-decreasing along ``M``.

  Raises:
    ValueError: ``step`` not an integer >= 0.
  """
  if not _is_int(step) or step < 0:
    raise _err("step", step, "it must be an integer >= 0")
  n, m = cluster.n, cluster.num_minibatches
  per = np.broadcast_to(cluster.base_time * np.asarray(cluster.slowdown)[:, None], (n, m))
  if cluster.delay == "none":
    d = np.zeros((n, m))
  else:
    rng = np.random.default_rng([cluster.seed, int(step)])
    if cluster.delay == "shifted_exponential":
      d = cluster.delay_shift + rng.exponential(cluster.delay_mean, size=(n, m))
    else:  # bernoulli_exponential
      hit = rng.random((n, m)) < cluster.delay_prob
      d = hit * rng.exponential(cluster.delay_mean, size=(n, m))
  return np.cumsum(per + d, axis=1)


def parse_deadline(value) -> DeadlineRule:
  """Validates a deadline rule (``nonblocking.deadline``).

  Args:
    value: ``"fastest"``, ``"kth:K"`` (integer ``K >= 1``), or a fixed budget in seconds
      (a number or numeric string, finite and > 0).

  Returns:
    ``"fastest"``, ``"kth:K"`` (normalised) or a float number of seconds.

  Raises:
    ValueError: anything else, naming ``nonblocking.deadline``.
  """
  field = "nonblocking.deadline"
  why = "it must be 'fastest', 'kth:K' with an integer K >= 1, or a number of seconds > 0"
  if isinstance(value, str):
    v = value.strip()
    if v == "fastest":
      return v
    if v.startswith("kth:"):
      try:
        k = int(v[4:])
      except ValueError:
        raise _err(field, value, why) from None
      if k < 1:
        raise _err(field, value, why)
      return f"kth:{k}"
    try:
      seconds = float(v)
    except ValueError:
      raise _err(field, value, why) from None
  else:
    seconds = value
  if not _is_real(seconds) or not math.isfinite(float(seconds)) or float(seconds) <= 0:
    raise _err(field, value, why)  # the value as given
  return float(seconds)


def _check_finish(finish) -> np.ndarray:
  f = np.asarray(finish, dtype=np.float64)
  if f.ndim != 2 or f.shape[0] < 1 or f.shape[1] < 1:
    raise _err("finish", getattr(finish, "shape", finish), "it must be an [n, M] array, n, M >= 1")
  return f


def _check_adjacency(field: str, adj, n: int) -> np.ndarray:
  a = np.asarray(adj)
  if a.shape != (n, n):
    raise _err(field, a.shape, f"it must be a boolean [n, n] matrix with n={n}")
  return a.astype(bool) | np.eye(n, dtype=bool)


def deadline(finish: np.ndarray, rule: DeadlineRule = "fastest",
             group: Optional[np.ndarray] = None) -> Union[float, np.ndarray]:
  """The deadline of one step.

  Rules (validated by :func:`parse_deadline`):

  * ``"fastest"``: the time the fastest worker finishes all ``M``: ``min_i finish[i, M-1]``.
  * ``"kth:K"``: the K-th smallest ``finish[i, M-1]`` (``K = 1`` is ``"fastest"``,
    ``K = n`` waits for everybody); ``1 <= K <= n``.
  * a float: a fixed budget in seconds.

  With ``group`` (boolean adjacency ``[n, n]``, row ``i`` = worker ``i``'s neighbourhood; the
  diagonal is treated as True), worker ``i``'s deadline is the rule applied to its own
  neighbourhood (decentralized algorithms). For ``"kth:K"`` with a neighbourhood smaller than
  ``K`` the slowest worker of that neighbourhood is used.

  Args:
    finish: float ``[n, M]`` finish times, seconds (:func:`minibatch_finish_times`).
    rule: the deadline rule.
    group: optional boolean ``[n, n]``.

  Returns:
    A float (seconds) without ``group``, else float64 ``[n]``.

  Raises:
    ValueError: bad rule (``nonblocking.deadline``), ``K > n``, or bad shapes.
  """
  f = _check_finish(finish)
  n = f.shape[0]
  rule = parse_deadline(rule)
  last = f[:, -1]
  if isinstance(rule, str) and rule.startswith("kth:"):
    k = int(rule[4:])
    if k > n:
      raise _err("nonblocking.deadline", rule, f"K must be <= num_workers={n}")
  else:
    k = 1
  if group is None:
    if isinstance(rule, float):
      return rule
    return float(np.sort(last)[k - 1])
  a = _check_adjacency("group", group, n)
  if isinstance(rule, float):
    return np.full(n, rule)
  out = np.empty(n)
  for i in range(n):
    times = np.sort(last[a[i]])
    out[i] = times[min(k, times.size) - 1]
  return out


def finished_counts(finish: np.ndarray, deadline: Union[float, np.ndarray]) -> np.ndarray:
  """Number of mini-batches each worker finished by the deadline.

  Args:
    finish: float ``[n, M]`` finish times, seconds.
    deadline: seconds, a scalar or ``[n]`` (per worker).

  Returns:
    int32 ``[n]``: ``#{j : finish[i, j] <= deadline_i}``, in ``[0, M]``.

  Raises:
    ValueError: bad shapes.
  """
  f = _check_finish(finish)
  d = _check_deadline_array(deadline, f.shape[0])
  return np.sum(f <= d[:, None], axis=1).astype(np.int32)


def _check_deadline_array(deadline, n: int) -> np.ndarray:
  d = np.asarray(deadline, dtype=np.float64)
  if d.ndim == 0:
    d = np.full(n, float(d))
  if d.shape != (n,):
    raise _err("deadline", d.shape, f"it must be a scalar or an [n] array with n={n}")
  return d


def compute_time(finish: np.ndarray,
                 deadline: Union[float, np.ndarray, None] = None) -> np.ndarray:
  """Seconds each worker spends computing in one step.

  Non-blocking (``deadline`` given): ``min(deadline_i, finish[i, M-1])``. A worker that has
  not finished all ``M`` keeps computing its current mini-batch until the deadline (that work
  is dropped), so it is busy until the deadline; a worker that finishes all ``M`` earlier is
  done at ``finish[i, M-1]``. Blocking (``deadline`` None): ``finish[:, M-1]``.

  Args:
    finish: float ``[n, M]`` finish times, seconds.
    deadline: seconds, scalar or ``[n]``, or None for blocking algorithms.

  Returns:
    float64 ``[n]``, seconds.

  Raises:
    ValueError: bad shapes.
  """
  f = _check_finish(finish)
  last = f[:, -1].copy()
  if deadline is None:
    return last
  return np.minimum(_check_deadline_array(deadline, f.shape[0]), last)


def comm_time(cluster: Cluster, messages, num_bytes) -> np.ndarray:
  """Alpha-beta communication time (Hockney 1994).

  ``comm_i = latency * messages_i + num_bytes_i / bandwidth``.

  Args:
    cluster: the cluster (``latency`` s/message, ``bandwidth`` bytes/s).
    messages: messages sent per worker, scalar or ``[n]``, >= 0.
    num_bytes: bytes sent per worker, scalar or ``[n]``, >= 0.

  Returns:
    float64 ``[n]``, seconds.

  Raises:
    ValueError: negative or non-finite counts, or wrong shapes.
  """
  n = cluster.n
  out = []
  for field, x in (("messages", messages), ("num_bytes", num_bytes)):
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
      a = np.full(n, float(a))
    if a.shape != (n,):
      raise _err(field, a.shape, f"it must be a scalar or an [n] array with n={n}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
      raise _err(field, x, "every entry must be finite and >= 0")
    out.append(a)
  return cluster.latency * out[0] + out[1] / cluster.bandwidth


def advance_clocks(clocks: np.ndarray, compute: np.ndarray, comm: np.ndarray,
                   adjacency: Optional[np.ndarray] = None) -> np.ndarray:
  """One step of the max-plus clock recursion.

  ``c_i <- max_{j in N(i) + {i}} (c_j + compute_j) + comm_i``: worker ``i`` waits for its own
  computation and for every neighbour's, then communicates. ``adjacency`` None means
  all-to-all (all-reduce: everyone waits for the slowest worker). ``adjacency`` is boolean
  ``[n, n]`` with row ``i`` listing whom worker ``i`` receives from; the diagonal is treated
  as True.

  Args:
    clocks: float ``[n]``, seconds.
    compute: float ``[n]``, seconds (:func:`compute_time`).
    comm: float ``[n]``, seconds (:func:`comm_time`).
    adjacency: optional boolean ``[n, n]``.

  Returns:
    float64 ``[n]``, the new clocks in seconds.

  Raises:
    ValueError: shapes that disagree.
  """
  c = np.asarray(clocks, dtype=np.float64)
  if c.ndim != 1 or c.size < 1:
    raise _err("clocks", c.shape, "it must be an [n] array, n >= 1")
  n = c.size
  arrs = []
  for field, x in (("compute", compute), ("comm", comm)):
    a = np.asarray(x, dtype=np.float64)
    if a.shape != (n,):
      raise _err(field, a.shape, f"it must be an [n] array with n={n}")
    arrs.append(a)
  ready = c + arrs[0]
  if adjacency is None:
    return ready.max() + arrs[1]
  a = _check_adjacency("adjacency", adjacency, n)
  return np.where(a, ready[None, :], -np.inf).max(axis=1) + arrs[1]


def check_deadline(cluster: Cluster, rule: DeadlineRule) -> DeadlineRule:
  """Validates a deadline rule against a cluster.

  A fixed budget below the smallest possible first mini-batch time,
  ``min_i base_time * slowdown_i`` (+ ``delay_shift`` for shifted-exponential delays), would
  let no worker finish anything. ``"kth:K"`` needs ``K <= n``.

  Args:
    cluster: the cluster.
    rule: a deadline rule (anything :func:`parse_deadline` accepts).

  Returns:
    The parsed rule.

  Raises:
    ValueError: naming ``nonblocking.deadline``.
  """
  parsed = parse_deadline(rule)
  if isinstance(parsed, float):
    first = cluster.base_time * float(np.min(cluster.slowdown))
    if cluster.delay == "shifted_exponential":
      first += cluster.delay_shift
    if parsed < first:
      raise _err("nonblocking.deadline", rule,
                 f"no worker can finish a mini-batch before it (the fastest first mini-batch "
                 f"takes at least {first:g} s)")
  elif parsed.startswith("kth:") and int(parsed[4:]) > cluster.n:
    raise _err("nonblocking.deadline", rule, f"K must be <= num_workers={cluster.n}")
  return parsed


# ----------------------------------------------------------------------------- failures


class Failure(NamedTuple):
  """Worker ``worker`` is down for the (0-based) steps ``start .. start + duration - 1``."""

  worker: int
  start: int
  duration: int


def parse_failures(spec: str, n: int) -> list[Failure]:
  """``"W:S:D,W:S:D,..."`` (worker, first step, number of steps) as :class:`Failure` s.

  Raises:
    ValueError: a malformed entry, a worker outside ``[0, n)``, ``S < 0`` or ``D < 1``
      (the message names ``cluster.failures``).
  """
  out = []
  for item in (spec or "").replace(" ", "").split(","):
    if not item:
      continue
    parts = item.split(":")
    try:
      w, s, d = (int(p) for p in parts)
    except ValueError:
      raise _err("cluster.failures", spec, "write worker:start:duration entries separated "
                 "by commas, e.g. '3:100:50,5:200:20'") from None
    if not 0 <= w < n or s < 0 or d < 1:
      raise _err("cluster.failures", spec, f"entry {item!r} needs 0 <= worker < {n}, "
                 "start >= 0 and duration >= 1")
    out.append(Failure(w, s, d))
  return out


def alive_mask(failures: list[Failure], step: int, n: int) -> np.ndarray:
  """bool ``[n]``: the workers up at (0-based) ``step``."""
  alive = np.ones(n, bool)
  for f in failures:
    if f.start <= step < f.start + f.duration:
      alive[f.worker] = False
  return alive


# ----------------------------------------------------------------------------- config


def from_config(cfg) -> Cluster:
  """The :class:`Cluster` of ``cfg.cluster`` (M from ``cfg.nonblocking``).

  Raises:
    ValueError: a bad ``cluster.*`` value (the message names the field).
  """
  c = cfg.cluster
  return make_cluster(
      cfg.num_workers, cfg.nonblocking.num_minibatches, scenario=c.scenario,
      slowdown=list(c.slowdown) or None, base_time=c.base_time, delay=c.delay,
      delay_mean=c.delay_mean, delay_shift=c.delay_shift, delay_prob=c.delay_prob,
      spread=c.spread, slow_factor=c.slow_factor, latency=c.latency, bandwidth=c.bandwidth,
      seed=c.seed)


def _value_errors(cfg) -> list:
  """The lines of the bad ``cluster.*`` values that ``make_cluster`` reads."""
  errs: list = []
  checks.choice(cfg, errs, "cluster.scenario", SCENARIOS)
  checks.choice(cfg, errs, "cluster.delay", DELAYS)
  for key in ("base_time", "slow_factor", "bandwidth"):
    checks.number(cfg, errs, f"cluster.{key}", 0, lo_open=True)
  for key in ("spread", "delay_mean", "delay_shift", "latency"):
    checks.number(cfg, errs, f"cluster.{key}", 0)
  checks.number(cfg, errs, "cluster.delay_prob", 0, hi=1)
  checks.integer(cfg, errs, "cluster.seed", 0)
  v = cfg.cluster.get("slowdown")
  if not isinstance(v, (tuple, list)) or not all(checks.is_num(x) and x > 0 for x in v):
    errs.append(f"config.cluster.slowdown={v!r} is not allowed: it must be a tuple of "
                "numbers > 0, one per worker (() for none)")
  return errs


def try_from_config(cfg) -> tuple:
  """``(from_config(cfg), None)``; ``(None, line)`` when the cluster refuses the values
  (non-finite, not one slowdown per worker); ``(None, None)`` when a value it needs is bad on
  its own (the section checks report it)."""
  n, m = cfg.get("num_workers"), cfg.nonblocking.get("num_minibatches")
  if _value_errors(cfg) or not (checks.is_int(n) and n >= 1 and checks.is_int(m) and m >= 1):
    return None, None
  try:
    return from_config(cfg), None
  except ValueError as e:
    return None, f"config.{e}"


def check_config(cfg, errs: list) -> None:
  """cluster.*: the simulated cluster behind sim_time and the failures."""
  errs.extend(_value_errors(cfg))
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


def check_nonblocking_config(cfg, errs: list) -> None:
  """nonblocking.*: M divides the batch when the batch is split; the deadline rule against the
  cluster."""
  from nbsgd_jax import config as config_lib
  checks.boolean(cfg, errs, "nonblocking.enabled")
  m, b = cfg.nonblocking.get("num_minibatches"), cfg.get("batch_size")
  if (checks.integer(cfg, errs, "nonblocking.num_minibatches", 1) and config_lib.partial_minibatches(cfg)
      and checks.is_int(b) and b >= 1 and b % m):
    errs.append(f"config.batch_size={b} is not allowed with "
                f"config.nonblocking.num_minibatches={m}: the batch must split into M equal "
                "mini-batches (batch_size divisible by num_minibatches)")
  checks.choice(cfg, errs, "nonblocking.deadline_group", ("all", "neighbours"))
  try:
    rule = parse_deadline(cfg.nonblocking.get("deadline"))
    cluster, _ = try_from_config(cfg)
    if cluster is not None:
      check_deadline(cluster, rule)
  except ValueError as e:
    errs.append(f"config.{e}")
