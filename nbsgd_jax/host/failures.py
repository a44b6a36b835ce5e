"""Simulated worker failures: a worker down for a run of steps (:class:`Failure`), given as
a schedule ``config.cluster.failures = "worker:start:duration,..."`` (:func:`parse_failures`)
or drawn at a rate (:class:`FailureProcess`, ``config.cluster.failure_mtbf``), and the
workers up at a step (:func:`alive_mask`; read by :class:`nbsgd_jax.host.parts.Failures`).
:mod:`nbsgd_jax.host.cluster` re-exports them.

The failure process: each worker, independently, is up for a Weibull time (shape
``failure_shape``, 1: exponential; mean ``failure_mtbf`` hours of its computation), then down
for an exponential repair time (mean ``failure_repair`` seconds), and so on. Times are laid on
the worker's steps at its nominal step time ``s0``: an up time of ``u`` seconds is ``u / s0``
steps, a repair of ``r`` seconds ``ceil(r / s0)`` steps (at least one). Worker ``i``'s draws
come from ``SeedSequence(seed, spawn_key=(3, i))``, the same whichever steps are asked for
first. With ``failure_policy="elastic"`` a failed worker computes and sends nothing and the
others go on without it; with ``"restart"`` a failure restarts the whole job from its last
checkpoint (:class:`nbsgd_jax.host.ledger.Restarts`): nobody drops out, the steps since the
checkpoint are computed again (the same steps: a deterministic job's trajectory does not
change) and the restart's seconds are paid.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from nbsgd_jax.communications import Round
from nbsgd_jax.communications.adjacency import Neighbours
from nbsgd_jax.core import checks

# config.cluster.failure_policy: elastic (the others go on without a failed worker) | restart
# (a failure restarts the job from its last checkpoint: nobody drops out, time is lost)
POLICIES = ("elastic", "restart")


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
      raise checks.not_allowed("cluster.failures", spec, "write worker:start:duration entries separated "
                 "by commas, e.g. '3:100:50,5:200:20'") from None
    if not 0 <= w < n or s < 0 or d < 1:
      raise checks.not_allowed("cluster.failures", spec, f"entry {item!r} needs 0 <= worker < {n}, "
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


class FailureProcess:
  """Failures at a rate (module docstring).

  Args:
    n: workers.
    step_seconds: float ``[n]``, each worker's nominal seconds per step.
    mtbf: mean up time, hours, > 0.
    repair: mean repair time, seconds, > 0.
    shape: the Weibull shape of the up time, > 0 (1: exponential).
    seed: integer >= 0.

  Raises:
    ValueError: a value out of range (named as its ``cluster.failure_*`` key).
  """

  def __init__(self, n: int, step_seconds, mtbf: float, repair: float, shape: float = 1.0,
               seed: int = 0):
    for key, v in (("failure_mtbf", mtbf), ("failure_repair", repair),
                   ("failure_shape", shape)):
      if not checks.is_num(v) or not math.isfinite(v) or v <= 0:
        raise checks.not_allowed(f"cluster.{key}", v, "it must be a finite number > 0")
    self.n, self.repair, self.shape = n, float(repair), float(shape)
    self.scale = 3600.0 * float(mtbf) / math.gamma(1.0 + 1.0 / self.shape)  # Weibull scale, s
    self.step_seconds = np.broadcast_to(np.asarray(step_seconds, np.float64), (n,))
    self._down = [[] for _ in range(n)]  # per worker: [Failure]
    self._rngs = [np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(3, i)))
                  for i in range(n)]
    self._drawn = np.zeros(n)  # steps of the worker's timeline drawn so far

  def _extend(self, i: int, step: int) -> None:
    s0 = self.step_seconds[i]
    while self._drawn[i] <= step:
      up = self.scale * self._rngs[i].weibull(self.shape)
      start = int(math.floor(self._drawn[i] + up / s0))
      steps = max(1, int(math.ceil(self._rngs[i].exponential(self.repair) / s0)))
      self._down[i].append(Failure(i, start, steps))
      self._drawn[i] = start + steps

  def failures(self, upto: int) -> list[Failure]:
    """Every worker's failures that start before step ``upto``."""
    for i in range(self.n):
      self._extend(i, upto)
    return [f for fs in self._down for f in fs if f.start < upto]

  def alive(self, step: int) -> np.ndarray:
    """bool ``[n]``: the workers up at ``step``."""
    return alive_mask(self.failures(step + 1), step, self.n)


def failures_on(cfg) -> bool:
  """Whether ``cfg`` simulates failures: a schedule (``cluster.failures``) or a rate
  (``cluster.failure_mtbf`` > 0)."""
  fails, mtbf = cfg.cluster.get("failures"), cfg.cluster.get("failure_mtbf")
  return ((isinstance(fails, str) and bool(fails.strip()))
          or (checks.is_num(mtbf) and mtbf > 0))


def drops_workers(cfg) -> bool:
  """Whether a failure removes a worker from the steps it is down for (failures under the
  ``elastic`` policy; under ``restart`` the job restarts and nobody drops out)."""
  return failures_on(cfg) and cfg.cluster.get("failure_policy", "elastic") == "elastic"


def failures_named(cfg) -> str:
  """The failures of ``cfg`` as its keys write them, for a refusal's line."""
  fails, mtbf = str(cfg.cluster.get("failures") or "").strip(), cfg.cluster.get("failure_mtbf")
  named = [f"config.cluster.failures={fails!r}"] if fails else []
  if checks.is_num(mtbf) and mtbf > 0:
    named.append(f"config.cluster.failure_mtbf={mtbf!r}")
  return " and ".join(named)


class ModelFetch:
  """A worker back from a failure fetches the current model before it computes again
  (``cluster.rejoin_fetch``; torchft's and Decoupled DiLoCo's joiners): one message of the
  model's bytes from the lowest worker up that did not join (the source), in a round of its
  own: the source sends one model to each joiner, one after another (its messages and bytes,
  in ``bytes_sent``), and a joiner has it when the source's sends are done (point to point,
  :func:`~nbsgd_jax.host.clock.advance_clocks`). One object for the clock's time
  (:class:`~nbsgd_jax.host.parts.Clock`) and the bytes (:class:`~nbsgd_jax.host.parts.Totals`).

  Args:
    n: workers.
    model_bytes: bytes of one model.
  """

  def __init__(self, n: int, model_bytes: float):
    self.n, self.model_bytes = int(n), float(model_bytes)

  def round(self, joined, alive):
    """The step's fetches as a :class:`~nbsgd_jax.communications.Round`, or None when no
    worker joined. ``joined``, ``alive``: bool ``[n]`` (or None: no failures)."""
    if joined is None or not np.any(joined):
      return None
    joined = np.asarray(joined, bool)
    source = int(np.argmax(np.asarray(alive, bool) & ~joined))
    peer = np.where(joined, source, np.arange(self.n))
    m = np.zeros(self.n)
    m[source] = joined.sum()  # the source sends one model to each joiner, one after another
    return Round(Neighbours(np.stack([np.arange(self.n), peer], 1)), m, m * self.model_bytes)


def joined_at(alive_of, step: int):
  """bool ``[n]``: the workers up at ``step`` and down at ``step - 1`` (``alive_of(step)``
  the mask), all False at step 0."""
  now = alive_of(step)
  return now & ~alive_of(step - 1) if step > 0 else np.zeros_like(now)


def check_config(cfg, errs: list) -> None:
  """cluster.failure_mtbf >= 0 (0: none), failure_repair > 0, failure_shape > 0,
  failure_policy, restart_every >= 1, restart_seconds >= 0, rejoin_fetch."""
  checks.boolean(cfg, errs, "cluster.rejoin_fetch")
  checks.number(cfg, errs, "cluster.failure_mtbf", 0)
  checks.number(cfg, errs, "cluster.failure_repair", 0, lo_open=True)
  checks.number(cfg, errs, "cluster.failure_shape", 0, lo_open=True)
  checks.choice(cfg, errs, "cluster.failure_policy", POLICIES)
  checks.integer(cfg, errs, "cluster.restart_every", 1)
  checks.number(cfg, errs, "cluster.restart_seconds", 0)


def failure_process(cfg, cluster):
  """The :class:`FailureProcess` of ``cfg.cluster.failure_mtbf`` (None when 0), laid on the
  nominal step times of ``cluster`` (a :class:`nbsgd_jax.host.cluster.Cluster`)."""
  c = cfg.cluster
  if not c.failure_mtbf:
    return None
  step_seconds = (cluster.minibatch_time - cluster.overhead) * cluster.num_minibatches
  return FailureProcess(cluster.n, step_seconds, c.failure_mtbf, c.failure_repair,
                        c.failure_shape, c.seed)



def starts(failures: list, process, step: int) -> list[int]:
  """The workers whose failure (a schedule's or the process's) starts at ``step``."""
  found = [f.worker for f in failures if f.start == step]
  if process is not None:
    found += [f.worker for f in process.failures(step + 1) if f.start == step]
  return sorted(set(found))
