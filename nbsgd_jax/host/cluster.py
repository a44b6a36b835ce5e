"""Simulated cluster: worker speeds, straggler delays, mini-batch finish times and failures
(the deadlines and the clock: :mod:`nbsgd_jax.host.clock`; the failures' model:
:mod:`nbsgd_jax.host.failures`).

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
from typing import NamedTuple, Optional, Sequence

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.host import episodes as episodes_lib
from nbsgd_jax.host.failures import (Failure, FailureProcess, alive_mask,  # noqa: F401
                                    failures_named, failures_on, parse_failures)
from nbsgd_jax.communications.adjacency import (Adjacency, Group, Neighbours,  # noqa: F401
                                                 live_adjacency)
# the clock's names, for the callers that read the cluster and its clock together
from nbsgd_jax.host.clock import (DeadlineHistory, DeadlineRule, advance_clocks,  # noqa: F401
                                  check_deadline, comm_time, compute_time, deadline,
                                  finished_counts, full_time_estimate, parse_deadline,
                                  round_time)

SCENARIOS = ("homogeneous", "one_slow", "lognormal")
DELAYS = ("none", "shifted_exponential", "bernoulli_exponential")
DELAY_PER = ("iteration", "minibatch")



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
    episodes: fail-slow episodes (:class:`nbsgd_jax.host.episodes.SlowEpisodes`), or None.
    trace: per-worker compute seconds over time (:class:`nbsgd_jax.host.episodes.
      ComputeTrace`), or None.
    network: the levels of a hierarchical network (:class:`nbsgd_jax.host.network.Network`),
      or None: every link is ``latency`` and ``bandwidth``.
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
  episodes: Optional[object] = None
  trace: Optional[object] = None
  network: Optional[object] = None

  @property
  def minibatch_time(self) -> np.ndarray:
    """float64 ``[n]``: seconds per mini-batch of each worker before delays."""
    return (self.minibatch_size * self.time_per_example * np.asarray(self.slowdown)
            + self.overhead)


def _check_real(field: str, x, low: float, strict: bool) -> float:
  if not checks.is_num(x) or not math.isfinite(float(x)):
    raise checks.not_allowed(field, x, "it must be a finite number")
  if (float(x) <= low) if strict else (float(x) < low):
    raise checks.not_allowed(field, x, f"it must be {'>' if strict else '>='} {low}")
  return float(x)


def _slowdowns(n, scenario, slowdown, spread, slow_factor, seed) -> np.ndarray:
  if slowdown is not None:
    try:
      s = np.asarray(slowdown, dtype=np.float64)
    except (TypeError, ValueError):
      raise checks.not_allowed("cluster.slowdown", slowdown, "it must be a list of numbers") from None
    if s.shape != (n,):
      raise checks.not_allowed("cluster.slowdown", slowdown, f"it must be a list of length num_workers={n}")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
      raise checks.not_allowed("cluster.slowdown", slowdown, "every entry must be finite and > 0")
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
  if not checks.is_int(n) or n < 1:
    raise checks.not_allowed("num_workers", n, "it must be an integer >= 1")
  if not checks.is_int(num_minibatches) or num_minibatches < 1:
    raise checks.not_allowed("nonblocking.num_minibatches", num_minibatches, "it must be an integer >= 1")
  if not checks.is_int(batch_size) or batch_size < 1:
    raise checks.not_allowed("batch_size", batch_size, "it must be an integer >= 1")
  if scenario not in SCENARIOS:
    raise checks.not_allowed("cluster.scenario", scenario, f"it must be one of {list(SCENARIOS)}")
  if delay not in DELAYS:
    raise checks.not_allowed("cluster.delay", delay, f"it must be one of {list(DELAYS)}")
  if delay_per not in DELAY_PER:
    raise checks.not_allowed("cluster.delay_per", delay_per, f"it must be one of {list(DELAY_PER)}")
  time_per_example = _check_real("cluster.time_per_example", time_per_example, 0.0, strict=True)
  overhead = _check_real("cluster.overhead", overhead, 0.0, strict=False)
  delay_mean = _check_real("cluster.delay_mean", delay_mean, 0.0, strict=False)
  delay_shift = _check_real("cluster.delay_shift", delay_shift, 0.0, strict=False)
  delay_prob = _check_real("cluster.delay_prob", delay_prob, 0.0, strict=False)
  if delay_prob > 1.0:
    raise checks.not_allowed("cluster.delay_prob", delay_prob, "it must be in [0, 1]")
  spread = _check_real("cluster.spread", spread, 0.0, strict=False)
  slow_factor = _check_real("cluster.slow_factor", slow_factor, 0.0, strict=True)
  latency = _check_real("cluster.latency", latency, 0.0, strict=False)
  bandwidth = _check_real("cluster.bandwidth", bandwidth, 0.0, strict=True)
  if not checks.is_int(seed) or seed < 0:
    raise checks.not_allowed("cluster.seed", seed, "it must be an integer >= 0")
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
  if not checks.is_int(step) or step < 0:
    raise checks.not_allowed("step", step, "it must be an integer >= 0")
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
  return np.cumsum(episodes_lib.step_minibatch_time(cluster, step)[:, None] + d, axis=1)

