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

Below a quorum (:class:`QuorumWait`, ``cluster.quorum_policy``): with ``"go_on"`` (the
default) a step with fewer than K workers up runs with them; with ``"wait"`` it waits for
repairs until K are up, as torchft's lighthouse forms no quorum below ``min_replicas``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from nbsgd_jax.communications import Round
from nbsgd_jax.communications.adjacency import Neighbours
from nbsgd_jax.core import checks
from nbsgd_jax.host.clock import parse_deadline

# config.cluster.failure_policy: elastic (the others go on without a failed worker) | restart
# (a failure restarts the job from its last checkpoint: nobody drops out, time is lost)
POLICIES = ("elastic", "restart")
# config.cluster.quorum_policy: go_on (a step with fewer than K workers up runs with them) |
# wait (it waits for repairs until K are up: torchft's lighthouse)
QUORUM_POLICIES = ("go_on", "wait")


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

  def worker_failures(self, i: int, upto: int) -> list[Failure]:
    """Worker i's failures that start before step ``upto`` (the event clock's
    :class:`~nbsgd_jax.host.outages.Outages` asks one worker at a time)."""
    self._extend(i, upto)
    return [f for f in self._down[i] if f.start < upto]

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
  failure_policy, restart_every >= 1, restart_seconds >= 0, rejoin_fetch, quorum_policy
  ('wait' needs a quorum: Non-blocking SGD with a ``kth:K`` or ``kth:K:G`` deadline, and the
  elastic policy)."""
  checks.boolean(cfg, errs, "cluster.rejoin_fetch")
  checks.number(cfg, errs, "cluster.failure_mtbf", 0)
  checks.number(cfg, errs, "cluster.failure_repair", 0, lo_open=True)
  checks.number(cfg, errs, "cluster.failure_shape", 0, lo_open=True)
  checks.choice(cfg, errs, "cluster.failure_policy", POLICIES)
  checks.integer(cfg, errs, "cluster.restart_every", 1)
  checks.number(cfg, errs, "cluster.restart_seconds", 0)
  if checks.choice(cfg, errs, "cluster.quorum_policy", QUORUM_POLICIES) and (
      cfg.cluster.get("quorum_policy") == "wait"):
    if quorum_size(cfg) is None:
      errs.append(f"config.cluster.quorum_policy='wait' is not allowed with "
                  f"config.nonblocking.deadline={cfg.nonblocking.get('deadline')!r} and "
                  f"config.nonblocking.enabled={cfg.nonblocking.get('enabled')!r}: the quorum "
                  "is the K of a 'kth:K' or 'kth:K:G' deadline of Non-blocking SGD (enabled=True)")
    if cfg.cluster.get("failure_policy") == "restart":
      errs.append("config.cluster.quorum_policy='wait' is not allowed with "
                  "config.cluster.failure_policy='restart': a restart brings every worker "
                  "back (use failure_policy='elastic')")


def nominal_step_seconds(cluster) -> np.ndarray:
  """float ``[n]``: each worker's nominal seconds per step, on which failures and repairs
  are laid (its computation at its slowdown, without overheads or delays)."""
  return np.broadcast_to((cluster.minibatch_time - cluster.overhead)
                         * cluster.num_minibatches, (cluster.n,)).astype(np.float64)


def failure_process(cfg, cluster):
  """The :class:`FailureProcess` of ``cfg.cluster.failure_mtbf`` (None when 0), laid on the
  nominal step times of ``cluster`` (a :class:`nbsgd_jax.host.cluster.Cluster`)."""
  c = cfg.cluster
  if not c.failure_mtbf:
    return None
  return FailureProcess(cluster.n, nominal_step_seconds(cluster), c.failure_mtbf,
                        c.failure_repair, c.failure_shape, c.seed)


def quorum_size(cfg):
  """K of the quorum: that of Non-blocking SGD's deadline ``kth:K`` or ``kth:K:G``
  (``nonblocking.deadline``, with ``nonblocking.enabled=True``), else None."""
  if cfg.nonblocking.get("enabled") is not True:
    return None
  try:
    rule = parse_deadline(cfg.nonblocking.get("deadline"))
  except ValueError:
    return None
  return int(rule[4:].split(":")[0]) if isinstance(rule, str) and rule.startswith("kth:") else None


class Quorum(NamedTuple):
  """What a job below its quorum waits for (:class:`QuorumWait`).

  Attributes:
    k: K, the workers a step needs (``nonblocking.deadline='kth:K[:G]'``).
    step_seconds: float ``[n]``, each worker's nominal seconds per step
      (:func:`nominal_step_seconds`): a repair of d steps lasts ``d step_seconds_w``.
  """

  k: int
  step_seconds: np.ndarray


def quorum(cfg, cluster):
  """The :class:`Quorum` of ``cluster.quorum_policy='wait'`` (None for ``'go_on'``)."""
  if cfg.cluster.get("quorum_policy", "go_on") != "wait":
    return None
  return Quorum(int(quorum_size(cfg)), nominal_step_seconds(cluster))


class QuorumWait:
  """Failures (a schedule and a process) under ``cluster.quorum_policy='wait'``: no step runs
  with fewer than K workers up. torchft's lighthouse forms no quorum below ``min_replicas``
  (``src/lighthouse.rs``, ``quorum_compute``: "New quorum not ready, only have N
  participants, need min_replicas K") and the replicas wait for the failed ones' repair.

  At a step with ``u < K`` workers up, the job waits for the ``K - u`` earliest repairs: a
  failed worker's repair has ``(end - step) step_seconds_w`` seconds left (its failure's steps
  laid on its nominal step time, as :class:`FailureProcess` lays them), and the wait ``W`` is
  the ``(K - u)``-th smallest of them. Those workers are up at this step (their failures end
  here); every other failed worker's repair went on for ``W`` seconds too, so its failure
  ends ``ceil((left - W) / step_seconds_w)`` steps after this one (at most where it ended).
  Later failures keep their steps. The step then starts ``W`` seconds after the job's last
  one ended (:class:`~nbsgd_jax.host.parts.Clock`): for the workers that were up, time
  waiting; for those repaired, time down (:class:`~nbsgd_jax.host.ledger.Ledger`).

  Example (``tests/host/test_ledger.py``): 4 workers, K = 3, steps of ``s0``; workers 0 and
  1 fail at step 2 for 3 and 1 steps. At step 2 two are up: the job waits ``W = s0`` for
  worker 1 (worker 0's repair has ``3 s0``), worker 0's failure now ends at step 4 (``2 s0``
  left after the wait): steps 2 and 3 run with workers 1-3, step 4 with all four.

  Args:
    failures: the schedule's :class:`Failure` s.
    n: workers.
    process: a :class:`FailureProcess`, or None.
    quorum: the :class:`Quorum`, or None (never waits: the failures as laid).
  """

  def __init__(self, failures, n: int, process, quorum: Quorum):
    self.failures, self.n, self.process, self.quorum = list(failures), n, process, quorum
    self.cut: dict = {}  # (worker, start): the step its failure ends, cut short by a wait
    self.last = None  # (step, seconds, repaired) of the last step decided

  def _spans(self, step: int) -> list:
    """``[(worker, start, end)]`` of the failures that started by ``step`` (ends cut)."""
    fs = self.failures + ([] if self.process is None else self.process.failures(step + 1))
    return [(f.worker, f.start, self.cut.get((f.worker, f.start), f.start + f.duration))
            for f in fs if f.start <= step]

  def alive(self, step: int) -> np.ndarray:
    """bool ``[n]``: the workers up at ``step``, after the waits decided so far."""
    alive = np.ones(self.n, bool)
    for w, s, e in self._spans(step):
      if s <= step < e:
        alive[w] = False
    return alive

  def wait(self, step: int) -> tuple:
    """``(seconds, repaired)``: the seconds the job waits before ``step`` (0.0: it has its
    quorum) and bool ``[n]``, the workers repaired during that wait (None when none). Called
    in step order; a second call for the same step returns the first's answer."""
    if self.quorum is None:
      return 0.0, None
    if self.last is not None and self.last[0] == step:
      return self.last[1], self.last[2]
    before = self.alive(step)
    need = self.quorum.k - int(before.sum())
    seconds, repaired = 0.0, None
    if need > 0:
      s0 = np.asarray(self.quorum.step_seconds, np.float64)
      spans = [x for x in self._spans(step) if x[1] <= step < x[2]]
      end: dict = {}
      for w, _, e in spans:
        end[w] = max(end.get(w, e), e)
      left = {w: (e - step) * s0[w] for w, e in end.items()}
      seconds = float(sorted(left.values())[need - 1])
      for w, s, e in spans:
        rest = left[w] - seconds
        back = step if rest <= 1e-9 * left[w] else step + math.ceil(rest / s0[w] - 1e-9)
        self.cut[(w, s)] = min(self.cut.get((w, s), e), back)
      repaired = ~before & self.alive(step)
    self.last = (step, seconds, repaired)
    return seconds, repaired

  def state_dict(self) -> dict:
    last = None if self.last is None else [
        self.last[0], self.last[1], None if self.last[2] is None else self.last[2].tolist()]
    return {"cut": [[w, s, e] for (w, s), e in self.cut.items()], "last": last}

  def load_state_dict(self, d: dict) -> None:
    self.cut = {(int(w), int(s)): int(e) for w, s, e in d["cut"]}
    last = d.get("last")
    self.last = None if last is None else (int(last[0]), float(last[1]), None if last[2] is None
                                           else np.asarray(last[2], bool))



def starts(failures: list, process, step: int) -> list[int]:
  """The workers whose failure (a schedule's or the process's) starts at ``step``."""
  found = [f.worker for f in failures if f.start == step]
  if process is not None:
    found += [f.worker for f in process.failures(step + 1) if f.start == step]
  return sorted(set(found))
