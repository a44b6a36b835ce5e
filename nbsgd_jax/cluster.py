"""Simulated cluster: mini-batch finish times, deadlines and the clock.

Host-side numpy, evaluated once per training step (never inside ``jit``).

Compute model (``docs/clock.md``). Each of ``n`` workers splits its batch of ``B`` examples
into ``M`` mini-batches of ``B / M`` examples (``M = 1`` when nothing is dropped: a blocking
run computes its batch at once). Mini-batch ``j`` on worker ``i`` takes

    ``(B / M) * time_per_example * slowdown_i + overhead + d_ij``

seconds: examples x seconds per example x the worker's slowdown, a fixed per-mini-batch
overhead (default 0), and a random straggler delay ``d_ij``. Splitting a batch into ``M``
mini-batches does not change a blocking step's time (with ``overhead = 0``).

Straggler delays (``delay_per``):

* ``"iteration"`` (the default; the usual model of a slow step of a worker: Dutta et al.,
  AISTATS 2018, "Slow and stale gradients can win the race", Sec. 3; Lee et al., IEEE Trans.
  Inf. Theory 2018, "Speeding up distributed machine learning using codes", Sec. II): one
  delay ``D_i`` per worker per step, spread evenly over its mini-batches (``d_ij = D_i / M``:
  the worker is slow for the whole step). The realisation does not depend on ``M``, so a
  blocking and a non-blocking run with one seed see the same slow steps.
* ``"minibatch"``: one draw per mini-batch (``d_ij`` independent; He & Dube 2022's
  simulation), so a worker's step with ``M`` mini-batches pays ``M`` draws.

Distributions of a draw ``D``:

* ``"none"``: ``D = 0``;
* ``"shifted_exponential"``: ``D = delay_shift + Exp(mean=delay_mean)`` (Lee et al. 2018);
* ``"bernoulli_exponential"``: ``D = Bernoulli(delay_prob) * Exp(mean=delay_mean)`` (an
  occasional slow step, e.g. a background job).

Mini-batches run back to back, so the finish times ``finish[i, j]`` (seconds after the start
of the iteration) are the cumulative sums over ``j``. At a deadline (:func:`deadline`) worker
``i`` has finished ``m_i`` mini-batches (:func:`finished_counts`); the rest are dropped.

Clock: see :mod:`nbsgd_jax.host.parts` (``Clock``) and :func:`advance_clocks`; the
alpha-beta communication cost ``comm_i = latency * messages_i + bytes_i / bandwidth``
(Hockney 1994, :func:`comm_time`).

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
DELAY_PER = ("iteration", "minibatch")

DeadlineRule = Union[str, float]  # "fastest", "kth:K", "adaptive" or a budget in seconds


class Cluster(NamedTuple):
  """A simulated cluster.

  Attributes:
    n: number of workers (``num_workers``).
    num_minibatches: mini-batches per worker per step, ``M``.
    time_per_example: seconds of forward and backward per example at slowdown 1.
    minibatch_size: examples per mini-batch, ``B / M``.
    overhead: fixed seconds per mini-batch (not scaled by the slowdown).
    slowdown: float64 ``[n]``, every entry > 0.
    delay: one of ``DELAYS``.
    delay_per: one of ``DELAY_PER``.
    delay_mean: mean of the exponential part of the delay, seconds.
    delay_shift: constant part of the shifted-exponential delay, seconds.
    delay_prob: probability of a delay (bernoulli_exponential).
    latency: alpha, seconds per message.
    bandwidth: 1 / beta, bytes per second.
    seed: non-negative integer seed of the delay draws.
  """
  n: int
  num_minibatches: int
  time_per_example: float
  minibatch_size: float
  overhead: float
  slowdown: np.ndarray
  delay: str
  delay_per: str
  delay_mean: float
  delay_shift: float
  delay_prob: float
  latency: float
  bandwidth: float
  seed: int

  @property
  def minibatch_time(self) -> np.ndarray:
    """float64 ``[n]``: seconds per mini-batch of each worker before delays."""
    return (self.minibatch_size * self.time_per_example * np.asarray(self.slowdown)
            + self.overhead)


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


def _slowdowns(n, scenario, slowdown, spread, slow_factor, seed) -> np.ndarray:
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
  return s


def make_cluster(n: int, num_minibatches: int, scenario: str = "homogeneous",
                 slowdown: Optional[Sequence[float]] = None, time_per_example: float = 1e-3,
                 batch_size: int = 32, overhead: float = 0.0, delay: str = "none",
                 delay_per: str = "iteration", delay_mean: float = 0.0, delay_shift: float = 0.0,
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
    num_minibatches: ``M``, integer >= 1 (1 for a blocking run: its batch at once).
    scenario: one of ``SCENARIOS``.
    slowdown: optional explicit per-worker slowdowns ``[n]``.
    time_per_example: seconds per example at slowdown 1, > 0.
    batch_size: examples per worker per step, ``B`` >= 1 (a mini-batch has ``B / M``).
    overhead: seconds per mini-batch, >= 0.
    delay: one of ``DELAYS``.
    delay_per: one of ``DELAY_PER``.
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
  if not _is_int(batch_size) or batch_size < 1:
    raise _err("batch_size", batch_size, "it must be an integer >= 1")
  if scenario not in SCENARIOS:
    raise _err("cluster.scenario", scenario, f"it must be one of {list(SCENARIOS)}")
  if delay not in DELAYS:
    raise _err("cluster.delay", delay, f"it must be one of {list(DELAYS)}")
  if delay_per not in DELAY_PER:
    raise _err("cluster.delay_per", delay_per, f"it must be one of {list(DELAY_PER)}")
  time_per_example = _check_real("cluster.time_per_example", time_per_example, 0.0, strict=True)
  overhead = _check_real("cluster.overhead", overhead, 0.0, strict=False)
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
  s = _slowdowns(n, scenario, slowdown, spread, slow_factor, seed)
  return Cluster(n=int(n), num_minibatches=int(num_minibatches),
                 time_per_example=time_per_example,
                 minibatch_size=float(batch_size) / int(num_minibatches), overhead=overhead,
                 slowdown=s, delay=delay, delay_per=delay_per, delay_mean=delay_mean,
                 delay_shift=delay_shift, delay_prob=delay_prob, latency=latency,
                 bandwidth=bandwidth, seed=int(seed))


def delays(cluster: Cluster, step: int) -> np.ndarray:
  """The straggler delays of one step, seconds, float64 ``[n, M]`` (``d_ij``; module
  docstring): per iteration, one draw per worker spread evenly over its ``M`` mini-batches;
  per mini-batch, one draw each. From ``np.random.default_rng([seed, step])``.

  Raises:
    ValueError: ``step`` not an integer >= 0.
  """
  if not _is_int(step) or step < 0:
    raise _err("step", step, "it must be an integer >= 0")
  n, m = cluster.n, cluster.num_minibatches
  if cluster.delay == "none":
    return np.zeros((n, m))
  rng = np.random.default_rng([cluster.seed, int(step)])
  size = (n, 1) if cluster.delay_per == "iteration" else (n, m)
  if cluster.delay == "shifted_exponential":
    d = cluster.delay_shift + rng.exponential(cluster.delay_mean, size=size)
  else:  # bernoulli_exponential
    hit = rng.random(size) < cluster.delay_prob
    d = hit * rng.exponential(cluster.delay_mean, size=size)
  if cluster.delay_per == "iteration":
    d = np.broadcast_to(d / m, (n, m))
  return d


def minibatch_finish_times(cluster: Cluster, step: int) -> np.ndarray:
  """Finish times of every mini-batch in one step.

  ``finish[i, j] = sum_{k <= j} ((B / M) * time_per_example * slowdown_i + overhead + d_ik)``
  with the delays of :func:`delays` (reproducible per (seed, step), independent of call
  order).

  Args:
    cluster: the cluster.
    step: training step, integer >= 0.

  Returns:
    float64 ``[n, M]``, seconds after the start of the iteration; non-decreasing along ``M``.

  Raises:
    ValueError: ``step`` not an integer >= 0.
  """
  d = delays(cluster, step)
  return np.cumsum(cluster.minibatch_time[:, None] + d, axis=1)


def parse_deadline(value) -> DeadlineRule:
  """Validates a deadline rule (``nonblocking.deadline``).

  Args:
    value: ``"fastest"``, ``"kth:K"`` (integer ``K >= 1``), ``"adaptive"`` (median + k MAD
      of recent finishing times, :class:`DeadlineHistory`), or a fixed budget in seconds (a
      number or numeric string, finite and > 0).

  Returns:
    ``"fastest"``, ``"kth:K"`` (normalised), ``"adaptive"`` or a float number of seconds.

  Raises:
    ValueError: anything else, naming ``nonblocking.deadline``.
  """
  field = "nonblocking.deadline"
  why = ("it must be 'fastest', 'kth:K' with an integer K >= 1, 'adaptive', or a number of "
         "seconds > 0")
  if isinstance(value, str):
    v = value.strip()
    if v in ("fastest", "adaptive"):
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


def full_time_estimate(last_finish, count, num_minibatches: int, deadline) -> np.ndarray:
  """Each worker's estimated time for all ``M`` mini-batches from what a deadline let it
  finish: ``last_finish`` when ``count = M``, ``last_finish * M / count`` for
  ``0 < count < M`` (its pace so far), ``deadline * M`` (a lower bound) when ``count = 0``.

  Args:
    last_finish: float ``[n]``, seconds at which each worker finished its last counted
      mini-batch.
    count: int ``[n]``, mini-batches finished, in ``[0, M]``.
    num_minibatches: ``M``.
    deadline: seconds, scalar or ``[n]`` (``inf`` for none).

  Returns:
    float64 ``[n]``, seconds.
  """
  last = np.asarray(last_finish, np.float64)
  c = np.asarray(count, np.float64)
  dl = np.broadcast_to(np.asarray(deadline, np.float64), last.shape)
  pace = np.where(c > 0, last / np.maximum(c, 1), dl)
  return np.where(c >= num_minibatches, last, pace * num_minibatches)


class DeadlineHistory:
  """Deadlines from the finishing times of recent steps: the rule of a real run (whose
  current finishing times are not known in advance) and of ``"adaptive"``.

  Every worker's estimated time for all ``M`` mini-batches (:func:`full_time_estimate`) of
  the last ``window`` steps is kept. Rules:

  * ``"fastest"``: the smallest over workers of each worker's median estimate;
  * ``"kth:K"``: the K-th smallest of them;
  * ``"adaptive"``: ``median + k * MAD`` of all estimates of live workers in the window
    (median absolute deviation; a robust straggler cut-off as proposed for hivemind's
    averaging, learning-at-home/hivemind#676): with ``k = 0`` half the workers finish;
  * a float: that many seconds.

  Before anything was observed the deadline is ``inf`` (the first step waits for every
  worker, and so measures them).

  Args:
    n: workers.
    rule: a parsed rule (:func:`parse_deadline`).
    k: the ``k`` of ``"adaptive"``, >= 0 (``nonblocking.adaptive_k``).
    window: steps kept, >= 1 (``nonblocking.window``).

  Raises:
    ValueError: ``k`` or ``window`` out of range (named).
  """

  def __init__(self, n: int, rule: DeadlineRule, k: float = 2.0, window: int = 10):
    if not _is_real(k) or not math.isfinite(float(k)) or k < 0:
      raise _err("nonblocking.adaptive_k", k, "it must be a finite number >= 0")
    if not _is_int(window) or window < 1:
      raise _err("nonblocking.window", window, "it must be an integer >= 1")
    self.n, self.rule, self.k, self.window = int(n), rule, float(k), int(window)
    self.times: list = []  # [n] float64 each, nan for a worker not observed (failed)

  def observe(self, estimates, live=None) -> None:
    """Adds one step's estimates (float ``[n]``, seconds; ``live`` bool ``[n]`` or None)."""
    e = np.asarray(estimates, np.float64).copy()
    if live is not None:
      e[~np.asarray(live, bool)] = np.nan
    self.times = (self.times + [e])[-self.window:]

  def deadline(self) -> float:
    """Seconds (``inf`` while nothing was observed)."""
    if isinstance(self.rule, float):
      return self.rule
    if not self.times:
      return math.inf
    t = np.stack(self.times)
    if np.all(np.isnan(t)):
      return math.inf
    if self.rule == "adaptive":
      x = t[np.isfinite(t)]
      med = float(np.median(x))
      return med + self.k * float(np.median(np.abs(x - med)))
    per = np.sort(np.nanmedian(np.where(np.isfinite(t), t, np.nan), axis=0))
    per = per[np.isfinite(per)]
    kth = int(self.rule[4:]) if self.rule.startswith("kth:") else 1
    return float(per[min(kth, per.size) - 1])

  def state_dict(self) -> dict:
    return {"times": [[None if np.isnan(v) else float(v) for v in t] for t in self.times]}

  def load_state_dict(self, d: dict) -> None:
    self.times = [np.asarray([np.nan if v is None else v for v in t], np.float64)
                  for t in d["times"]]


def _check_finish(finish) -> np.ndarray:
  f = np.asarray(finish, dtype=np.float64)
  if f.ndim != 2 or f.shape[0] < 1 or f.shape[1] < 1:
    raise _err("finish", getattr(finish, "shape", finish), "it must be an [n, M] array, n, M >= 1")
  return f


class Neighbours(NamedTuple):
  """Whom each worker waits for, as index lists: O(n d) memory and work for a graph of degree
  d (a dense ``[n, n]`` adjacency costs O(n^2) per round).

  Attributes:
    index: int ``[n, d]``, row ``i``: the workers ``i`` waits for; ``i`` itself is always in
      its neighbourhood (whether listed or not); repeats are allowed (pad a short row with
      ``i``).
  """

  index: np.ndarray

  @classmethod
  def of_lists(cls, rows: Sequence[Sequence[int]]) -> "Neighbours":
    """From one list per worker (of any lengths; padded with the worker itself)."""
    n = len(rows)
    d = max([len(r) for r in rows] + [0]) + 1
    index = np.repeat(np.arange(n)[:, None], d, axis=1)
    for i, r in enumerate(rows):
      index[i, 1:1 + len(r)] = r
    return cls(index)

  def dense(self) -> np.ndarray:
    """bool ``[n, n]``, the same neighbourhoods as an adjacency matrix (diagonal True)."""
    n = self.index.shape[0]
    a = np.eye(n, dtype=bool)
    a[np.repeat(np.arange(n), self.index.shape[1]), self.index.reshape(-1)] = True
    return a


class Group(NamedTuple):
  """Everyone waits for everyone in ``members`` (bool ``[n]``; an all-reduce among the live
  workers); a worker outside waits only for itself. O(n)."""

  members: np.ndarray

  def dense(self) -> np.ndarray:
    """bool ``[n, n]``, the same neighbourhoods as an adjacency matrix (diagonal True)."""
    m = np.asarray(self.members, bool)
    a = m[:, None] & m[None, :]
    np.fill_diagonal(a, True)
    return a


Adjacency = Union[None, np.ndarray, Neighbours, Group]
"""Who waits for whom in a round (``N(i)``, always holding ``i``): None (everyone), a bool
``[n, n]`` matrix (row i), :class:`Neighbours` (index lists) or :class:`Group`."""


def _check_adjacency(field: str, adj, n: int):
  """``adj`` validated: a :class:`Neighbours` with int64 indices in ``[0, n)``, a
  :class:`Group` with a bool ``[n]``, or a bool ``[n, n]`` matrix with a True diagonal."""
  if isinstance(adj, Neighbours):
    idx = np.asarray(adj.index)
    if idx.ndim != 2 or idx.shape[0] != n or not np.issubdtype(idx.dtype, np.integer):
      raise _err(field, idx.shape, f"Neighbours.index must be an integer [n, d] array with n={n}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
      raise _err(field, "Neighbours", f"every index must be in [0, {n})")
    return Neighbours(idx.astype(np.int64))
  if isinstance(adj, Group):
    m = np.asarray(adj.members)
    if m.shape != (n,):
      raise _err(field, m.shape, f"Group.members must be a boolean [n] array with n={n}")
    return Group(m.astype(bool))
  a = np.asarray(adj)
  if a.shape != (n, n):
    raise _err(field, a.shape, f"it must be a boolean [n, n] matrix with n={n}")
  return a.astype(bool) | np.eye(n, dtype=bool)


def neighbourhood_max(values: np.ndarray, adjacency: Adjacency) -> np.ndarray:
  """float64 ``[n]``: ``max_{j in N(i)} values_j`` for every worker ``i`` (``N(i)`` from a
  validated adjacency, :data:`Adjacency`); O(n) for None and :class:`Group`, O(n d) for
  :class:`Neighbours`, O(n^2) for a dense matrix."""
  v = np.asarray(values, np.float64)
  if adjacency is None:
    return np.full(v.shape, v.max())
  if isinstance(adjacency, Group):
    m = adjacency.members
    top = v[m].max() if m.any() else -np.inf
    return np.where(m, np.maximum(top, v), v)
  if isinstance(adjacency, Neighbours):
    return np.maximum(v[adjacency.index].max(axis=1, initial=-np.inf), v)
  return np.where(adjacency, v[None, :], -np.inf).max(axis=1)


def live_adjacency(adjacency: Adjacency, alive: np.ndarray) -> Adjacency:
  """``adjacency`` under failures: a failed worker waits only for itself and nobody waits for
  it (bool ``alive`` ``[n]``). None becomes a :class:`Group` of the live workers; the other
  forms keep theirs (a dense matrix stays dense)."""
  alive = np.asarray(alive, bool)
  n = alive.shape[0]
  if adjacency is None:
    return Group(alive.copy())
  if isinstance(adjacency, Group):
    return Group(np.asarray(adjacency.members, bool) & alive)
  if isinstance(adjacency, Neighbours):
    idx = np.asarray(adjacency.index)
    own = np.arange(n)[:, None]
    return Neighbours(np.where(alive[idx] & alive[:, None], idx, own))
  a = np.asarray(adjacency, bool) & alive[:, None] & alive[None, :]
  np.fill_diagonal(a, True)
  return a


def deadline(finish: np.ndarray, rule: DeadlineRule = "fastest",
             group: Adjacency = None) -> Union[float, np.ndarray]:
  """The deadline of one step.

  Rules (validated by :func:`parse_deadline`):

  * ``"fastest"``: the time the fastest worker finishes all ``M``: ``min_i finish[i, M-1]``.
  * ``"kth:K"``: the K-th smallest ``finish[i, M-1]`` (``K = 1`` is ``"fastest"``,
    ``K = n`` waits for everybody); ``1 <= K <= n``.
  * a float: a fixed budget in seconds.

  With ``group`` (an :data:`Adjacency`: a boolean ``[n, n]`` matrix, row ``i`` = worker ``i``'s
  neighbourhood, :class:`Neighbours` or :class:`Group`; ``i`` itself always belongs to it),
  worker ``i``'s deadline is the rule applied to its own
  neighbourhood (decentralized algorithms). For ``"kth:K"`` with a neighbourhood smaller than
  ``K`` the slowest worker of that neighbourhood is used.

  Args:
    finish: float ``[n, M]`` finish times, seconds (:func:`minibatch_finish_times`).
    rule: the deadline rule.
    group: optional :data:`Adjacency` (not None).

  Returns:
    A float (seconds) without ``group``, else float64 ``[n]``.

  Raises:
    ValueError: bad rule (``nonblocking.deadline``), ``K > n``, or bad shapes.
  """
  f = _check_finish(finish)
  n = f.shape[0]
  rule = parse_deadline(rule)
  if rule == "adaptive":
    raise _err("nonblocking.deadline", rule, "it is set from earlier steps: use a "
               "DeadlineHistory")
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
  if isinstance(a, Group):  # members: the rule over the members; the others: their own time
    m = a.members
    times = np.sort(last[m])
    return np.where(m, times[min(k, times.size) - 1] if times.size else 0.0, last)
  out = np.empty(n)
  for i in range(n):
    members = (np.unique(np.append(a.index[i], i)) if isinstance(a, Neighbours)
               else a[i])
    times = np.sort(last[members])
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
                   adjacency: Adjacency = None, collective: bool = True,
                   overlap: bool = False) -> np.ndarray:
  """One round of the clock (``docs/clock.md`` has the derivation and worked examples).

  Worker ``j`` is ready to send at ``r_j = c_j + compute_j`` (its computation of the step
  comes first), or at ``r_j = c_j`` with ``overlap`` (the round's input is known at the step's
  start: the ``parallel`` order of D-PSGD). Then

  * ``collective`` (an all-reduce): the round starts when the last worker of the
    neighbourhood is ready and takes ``comm_i``: ``c_i <- max_{j in N(i)} r_j + comm_i``;
  * point to point (gossip): worker ``i`` has what it needs when each neighbour's message
    has arrived and its own sends are done, ``c_i <- max_{j in N(i)} (r_j + comm_j)``;
  * with ``overlap`` worker ``i`` also finishes its computation:
    ``c_i <- max(c_i + compute_i, ...)``.

  ``N(i)`` includes ``i``; ``adjacency`` None means everyone. Work: O(n) for everyone or a
  :class:`Group`, O(n d) for :class:`Neighbours` of degree d, O(n^2) for a dense matrix.

  Args:
    clocks: float ``[n]``, seconds.
    compute: float ``[n]``, seconds of computation before (or during) this round.
    comm: float ``[n]``, seconds each worker spends sending (:func:`comm_time`).
    adjacency: whom each worker waits for (:data:`Adjacency`): None (everyone), a boolean
      ``[n, n]`` matrix (row ``i``), :class:`Neighbours` or :class:`Group`.
    collective: lockstep round (see above).
    overlap: the round starts with the step's computation.

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
  done = c + arrs[0]
  ready = c if overlap else done
  a = None if adjacency is None else _check_adjacency("adjacency", adjacency, n)
  if collective:
    out = neighbourhood_max(ready, a) + arrs[1]
  else:
    out = neighbourhood_max(ready + arrs[1], a)
  return np.maximum(out, done) if overlap else out


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
    first = float(np.min(cluster.minibatch_time))
    if cluster.delay == "shifted_exponential":
      first += cluster.delay_shift / (cluster.num_minibatches
                                      if cluster.delay_per == "iteration" else 1)
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


def num_minibatches(cfg) -> int:
  """``M`` of the cluster model: ``nonblocking.num_minibatches`` when mini-batches may be
  dropped (:func:`nbsgd_jax.config.partial_minibatches`), else 1 (the batch at once)."""
  from nbsgd_jax import config as config_lib
  return cfg.nonblocking.num_minibatches if config_lib.partial_minibatches(cfg) else 1


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
  return make_cluster(
      cfg.num_workers, num_minibatches(cfg), scenario=c.scenario,
      slowdown=list(c.slowdown) or None, time_per_example=tpe, batch_size=cfg.batch_size,
      overhead=c.overhead, delay=c.delay, delay_per=c.delay_per, delay_mean=c.delay_mean,
      delay_shift=c.delay_shift, delay_prob=c.delay_prob, spread=c.spread,
      slow_factor=c.slow_factor, latency=c.latency, bandwidth=c.bandwidth, seed=c.seed)


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
    if isinstance(cfg.cluster.get("failures"), str) and cfg.cluster.failures.strip():
      errs.append("config.cluster.failures is not allowed with config.cluster.clock='wall': "
                  "failures are simulated (use clock='simulated')")
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


def check_nonblocking_config(cfg, errs: list) -> None:
  """nonblocking.*: M divides the batch when the batch is split; the deadline rule against the
  cluster."""
  from nbsgd_jax import config as config_lib
  checks.boolean(cfg, errs, "nonblocking.enabled")
  checks.boolean(cfg, errs, "nonblocking.unroll")
  m, b = cfg.nonblocking.get("num_minibatches"), cfg.get("batch_size")
  if (checks.integer(cfg, errs, "nonblocking.num_minibatches", 1) and config_lib.partial_minibatches(cfg)
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
