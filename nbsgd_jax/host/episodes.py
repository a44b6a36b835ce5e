"""Compute speed over time: fail-slow episodes and per-worker compute traces.

* :class:`SlowEpisodes`: each worker, independently, alternates normal periods and fail-slow
  episodes. The gap before an episode is exponential with mean ``1 / rate`` (``rate``:
  onsets per worker per hour of computation), an episode lasts a lognormal time (median
  ``median`` seconds, log-standard deviation ``sigma``), and during it the worker computes
  ``factor`` times slower. Times are laid on the worker's steps: a gap of ``g`` seconds is
  ``g / s0`` steps at its nominal step time ``s0``, an episode of ``L`` seconds is
  ``ceil(L / (factor s0))`` slow steps (at least one); so a step is inside an episode or not,
  and the draw does not depend on the rest of the run: worker ``i``'s episodes come from
  ``SeedSequence(seed, spawn_key=(2, i))``, the same whichever steps are asked for first.
* :class:`ComputeTrace`: a CSV of ``step,worker,seconds`` rows, each the worker's seconds of
  computation per step from that step on (until its next row); before its first row a worker
  computes at the cluster's own speed. Replayed exactly (``docs/clock.md``, "Compute over
  time", gives the format and an example).

Both enter every clock through :func:`nbsgd_jax.host.cluster.minibatch_finish_times`, the one
place a step's compute time is made (the lockstep clock, the event clock and the wall clock
read it).
"""

from __future__ import annotations

import csv
import math
from typing import Optional

import numpy as np

from nbsgd_jax.core import checks


class SlowEpisodes:
  """Fail-slow episodes (module docstring).

  Args:
    n: workers.
    step_seconds: float ``[n]``, each worker's nominal seconds per step.
    rate: onsets per worker per hour, >= 0 (0: none).
    median: an episode's median duration, seconds, > 0.
    sigma: the log-standard deviation of the duration, >= 0.
    factor: the slowdown during an episode, >= 1.
    seed: integer >= 0.

  Raises:
    ValueError: a value out of range (named as its ``cluster.episode_*`` key).
  """

  def __init__(self, n: int, step_seconds, rate: float, median: float, sigma: float,
               factor: float, seed: int = 0):
    for key, v, lo, strict in (("episode_rate", rate, 0.0, False),
                               ("episode_median", median, 0.0, True),
                               ("episode_sigma", sigma, 0.0, False),
                               ("episode_factor", factor, 1.0, False)):
      if not checks.is_num(v) or not math.isfinite(v) or (v <= lo if strict else v < lo):
        raise checks.not_allowed(f"cluster.{key}", v,
                                 f"it must be a finite number {'>' if strict else '>='} {lo}")
    self.n, self.rate, self.median, self.sigma = n, float(rate), float(median), float(sigma)
    self.factor, self.seed = float(factor), int(seed)
    self.step_seconds = np.broadcast_to(np.asarray(step_seconds, np.float64), (n,))
    self._spans = [[] for _ in range(n)]  # per worker: [(first step, last step + 1)]
    self._rngs = [np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(2, i)))
                  for i in range(n)]
    self._drawn = np.zeros(n, np.float64)  # seconds of the worker's timeline drawn so far
    self._flat = (np.zeros(0, np.int64),) * 3  # every span as arrays: worker, first, end

  def _extend(self, i: int, step: int) -> list:
    """Draw worker ``i``'s episodes until its timeline passes ``step``: the new
    ``[(i, first, end)]``."""
    s0, new = self.step_seconds[i], []
    while self._drawn[i] <= (step + 1) * s0:
      gap = self._rngs[i].exponential(3600.0 / self.rate)
      length = self.median * math.exp(self.sigma * self._rngs[i].standard_normal())
      first = int(math.floor((self._drawn[i] + gap) / s0))
      steps = max(1, int(math.ceil(length / (self.factor * s0))))  # slow steps in it
      self._spans[i].append((first, first + steps))
      new.append((i, first, first + steps))
      self._drawn[i] = (first + steps) * s0  # the timeline in nominal steps again
    return new

  def episodes(self, i: int, upto: int) -> list:
    """Worker ``i``'s episodes that start before step ``upto``: ``[(first, end)]`` steps."""
    if self.rate == 0:
      return []
    self._extend(i, upto)
    return [(a, b) for a, b in self._spans[i] if a < upto]

  def factors(self, step: int) -> np.ndarray:
    """float64 ``[n]``: each worker's slowdown factor at ``step`` (``factor`` inside an
    episode, else 1)."""
    out = np.ones(self.n)
    if self.rate == 0:
      return out
    behind = np.flatnonzero(self._drawn <= (step + 1) * self.step_seconds)
    new = [span for i in behind for span in self._extend(int(i), step)]
    if new:  # appended, not rebuilt: a run's steps keep extending the timelines
      self._flat = tuple(np.concatenate([old, np.array(v, np.int64)])
                         for old, v in zip(self._flat, zip(*new)))
    worker, first, end = self._flat
    out[worker[(first <= step) & (step < end)]] = self.factor
    return out


class ComputeTrace:
  """Per-worker seconds of computation per step, replayed from a CSV (module docstring).

  Args:
    path: the CSV file (a header ``step,worker,seconds``, then one row per change).
    n: workers.

  Raises:
    ValueError: an unreadable file, a bad row, a worker outside ``[0, n)``, seconds <= 0
      (named as ``cluster.trace``, with the line).
  """

  def __init__(self, path: str, n: int):
    self.n, self.path = n, path
    rows: list = []
    try:
      with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or set(reader.fieldnames) < {"step", "worker", "seconds"}:
          raise checks.not_allowed("cluster.trace", path,
                                   "its header must be step,worker,seconds")
        for line, row in enumerate(reader, start=2):
          rows.append(self._row(row, line))
    except OSError as e:
      raise checks.not_allowed("cluster.trace", path, f"it cannot be read ({e.strerror})") from None
    self._changes = [sorted((s, sec) for s, w, sec in rows if w == i) for i in range(n)]

  def _row(self, row: dict, line: int) -> tuple:
    try:
      step, worker, seconds = int(row["step"]), int(row["worker"]), float(row["seconds"])
    except (TypeError, ValueError):
      raise checks.not_allowed("cluster.trace", self.path,
                               f"line {line} is not step,worker,seconds numbers") from None
    if step < 0 or not 0 <= worker < self.n or not seconds > 0 or not math.isfinite(seconds):
      raise checks.not_allowed("cluster.trace", self.path, f"line {line} needs step >= 0, "
                               f"0 <= worker < {self.n} and finite seconds > 0")
    return step, worker, seconds

  def seconds(self, step: int) -> np.ndarray:
    """float64 ``[n]``: each worker's traced seconds per step at ``step``, NaN before its
    first row."""
    out = np.full(self.n, np.nan)
    for i, changes in enumerate(self._changes):
      for s, sec in changes:
        if s > step:
          break
        out[i] = sec
    return out


def step_minibatch_time(cluster, step: int) -> np.ndarray:
  """float64 ``[n]``: seconds per mini-batch of each worker at ``step`` before delays: its
  speed (:attr:`nbsgd_jax.host.cluster.Cluster.minibatch_time`) times a fail-slow episode's factor, or its traced
  seconds per step over ``M`` (this module), plus the overhead."""
  t = cluster.minibatch_time
  if cluster.episodes is None and cluster.trace is None:
    return t
  work = t - cluster.overhead
  if cluster.episodes is not None:
    work = work * cluster.episodes.factors(step)
  if cluster.trace is not None:
    traced = cluster.trace.seconds(step) / cluster.num_minibatches
    work = np.where(np.isnan(traced), work, traced)
  return work + cluster.overhead


def check_config(cfg, errs: list) -> None:
  """cluster.episode_*: rate >= 0, median > 0, sigma >= 0, factor >= 1; cluster.trace a
  string (the file is read when the cluster is built)."""
  checks.number(cfg, errs, "cluster.episode_rate", 0)
  checks.number(cfg, errs, "cluster.episode_median", 0, lo_open=True)
  checks.number(cfg, errs, "cluster.episode_sigma", 0)
  checks.number(cfg, errs, "cluster.episode_factor", 1)
  checks.string(cfg, errs, "cluster.trace")


def speed_over_time(n: int, step_seconds, rate: float = 0.0, median: float = 1.0,
                    sigma: float = 0.0, factor: float = 1.0, trace: str = "",
                    seed: int = 0) -> tuple[Optional[SlowEpisodes], Optional[ComputeTrace]]:
  """The episodes (None when ``rate`` is 0) and the trace (None without a path)."""
  episodes = SlowEpisodes(n, step_seconds, rate, median, sigma, factor, seed)
  return (episodes if rate else None), (ComputeTrace(trace, n) if trace else None)


__all__ = ["ComputeTrace", "SlowEpisodes", "check_config", "speed_over_time",
           "step_minibatch_time"]
