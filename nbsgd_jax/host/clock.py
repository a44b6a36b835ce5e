"""The clock of the simulated cluster: deadlines, finished mini-batches and each worker's time.

Host-side numpy, evaluated once per training step (never inside ``jit``). From the finish
times of every worker's mini-batches (:func:`nbsgd_jax.host.cluster.minibatch_finish_times`):
the deadline of a step (:func:`deadline`: ``"fastest"``, ``"kth:K"``, ``"adaptive"`` from
earlier steps, :class:`DeadlineHistory`, or a budget in seconds), the mini-batches each worker
finished by it (:func:`finished_counts`), its compute time (:func:`compute_time`), the
alpha-beta cost of its messages ``comm_i = latency * messages_i + bytes_i / bandwidth``
(Hockney 1994, :func:`comm_time`) and the workers' clocks after a round
(:func:`advance_clocks`; ``docs/clock.md``).

Errors: bad input raises ``ValueError("<field>=<value> is not allowed: ...")`` naming the
config field.
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.communications.adjacency import (Adjacency, Group, Neighbours, check_adjacency,
                                                 neighbourhood_max)

DeadlineRule = Union[str, float]  # "fastest", "kth:K", "adaptive" or a budget in seconds


def parse_deadline(value) -> DeadlineRule:
  """Validates a deadline rule (``nonblocking.deadline``).

  Args:
    value: ``"fastest"``, ``"kth:K"`` (integer ``K >= 1``), ``"kth:K:G"`` (a grace window
      of ``G >= 0`` seconds after the K-th worker: a quorum of K, as torchft's
      ``min_replica_size`` with its quorum timeout), ``"adaptive"`` (median + k MAD of recent
      finishing times, :class:`DeadlineHistory`), or a fixed budget in seconds (a number or
      numeric string, finite and > 0).

  Returns:
    ``"fastest"``, ``"kth:K"`` or ``"kth:K:G"`` (normalised), ``"adaptive"`` or a float
    number of seconds.

  Raises:
    ValueError: anything else, naming ``nonblocking.deadline``.
  """
  field = "nonblocking.deadline"
  why = ("it must be 'fastest', 'kth:K' with an integer K >= 1 (or 'kth:K:G', a grace of G "
         ">= 0 seconds after the K-th), 'adaptive', or a number of seconds > 0")
  if isinstance(value, str):
    v = value.strip()
    if v in ("fastest", "adaptive"):
      return v
    if v.startswith("kth:"):
      try:
        parts = v[4:].split(":")
        k, grace = int(parts[0]), (float(parts[1]) if len(parts) == 2 else None)
        if len(parts) > 2:
          raise ValueError
      except ValueError:
        raise checks.not_allowed(field, value, why) from None
      if k < 1 or (grace is not None and not (math.isfinite(grace) and grace >= 0)):
        raise checks.not_allowed(field, value, why)
      return f"kth:{k}" if grace is None else f"kth:{k}:{grace:g}"
    try:
      seconds = float(v)
    except ValueError:
      raise checks.not_allowed(field, value, why) from None
  else:
    seconds = value
  if not checks.is_num(seconds) or not math.isfinite(float(seconds)) or float(seconds) <= 0:
    raise checks.not_allowed(field, value, why)  # the value as given
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
    if not checks.is_num(k) or not math.isfinite(float(k)) or k < 0:
      raise checks.not_allowed("nonblocking.adaptive_k", k, "it must be a finite number >= 0")
    if not checks.is_int(window) or window < 1:
      raise checks.not_allowed("nonblocking.window", window, "it must be an integer >= 1")
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
    kth = int(self.rule[4:].split(":")[0]) if self.rule.startswith("kth:") else 1
    return float(per[min(kth, per.size) - 1])

  def state_dict(self) -> dict:
    return {"times": [[None if np.isnan(v) else float(v) for v in t] for t in self.times]}

  def load_state_dict(self, d: dict) -> None:
    self.times = [np.asarray([np.nan if v is None else v for v in t], np.float64)
                  for t in d["times"]]


def _check_finish(finish) -> np.ndarray:
  f = np.asarray(finish, dtype=np.float64)
  if f.ndim != 2 or f.shape[0] < 1 or f.shape[1] < 1:
    raise checks.not_allowed("finish", getattr(finish, "shape", finish), "it must be an [n, M] array, n, M >= 1")
  return f


def deadline(finish: np.ndarray, rule: DeadlineRule = "fastest",
             group: Adjacency = None) -> Union[float, np.ndarray]:
  """The deadline of one step.

  Rules (validated by :func:`parse_deadline`):

  * ``"fastest"``: the time the fastest worker finishes all ``M``: ``min_i finish[i, M-1]``.
  * ``"kth:K"``: the K-th smallest ``finish[i, M-1]`` (``K = 1`` is ``"fastest"``,
    ``K = n`` waits for everybody); ``1 <= K <= n``; ``"kth:K:G"``: that plus ``G`` seconds
    (a quorum of K with a grace window: a worker whose batch is done by then takes part).
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
    raise checks.not_allowed("nonblocking.deadline", rule, "it is set from earlier steps: use a "
               "DeadlineHistory")
  last = f[:, -1]
  grace = 0.0
  if isinstance(rule, str) and rule.startswith("kth:"):
    k, *rest = rule[4:].split(":")
    k, grace = int(k), float(rest[0]) if rest else 0.0
    if k > n:
      raise checks.not_allowed("nonblocking.deadline", rule, f"K must be <= num_workers={n}")
  else:
    k = 1
  return _kth(last, k, rule, group, n) + grace


def _kth(last: np.ndarray, k: int, rule, group, n: int):
  """The K-th finish time of the workers (or of each worker's group), or the fixed budget."""
  if group is None:
    if isinstance(rule, float):
      return rule
    return float(np.sort(last)[k - 1])
  a = check_adjacency("group", group, n)
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
    raise checks.not_allowed("deadline", d.shape, f"it must be a scalar or an [n] array with n={n}")
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


def round_time(cluster, r) -> np.ndarray:
  """float64 ``[n]``: each worker's seconds in the round ``r`` (a
  :class:`~nbsgd_jax.communications.Round`): by the links its messages cross on a
  hierarchical network (:meth:`nbsgd_jax.host.network.Network.round_time`), else
  :func:`comm_time`."""
  if getattr(cluster, "network", None) is None:
    return comm_time(cluster, r.messages, r.num_bytes)
  return cluster.network.round_time(r.messages, r.num_bytes, r.adjacency, r.collective)


def comm_time(cluster, messages, num_bytes) -> np.ndarray:
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
      raise checks.not_allowed(field, a.shape, f"it must be a scalar or an [n] array with n={n}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
      raise checks.not_allowed(field, x, "every entry must be finite and >= 0")
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
    raise checks.not_allowed("clocks", c.shape, "it must be an [n] array, n >= 1")
  n = c.size
  arrs = []
  for field, x in (("compute", compute), ("comm", comm)):
    a = np.asarray(x, dtype=np.float64)
    if a.shape != (n,):
      raise checks.not_allowed(field, a.shape, f"it must be an [n] array with n={n}")
    arrs.append(a)
  done = c + arrs[0]
  ready = c if overlap else done
  a = None if adjacency is None else check_adjacency("adjacency", adjacency, n)
  if collective:
    out = neighbourhood_max(ready, a) + arrs[1]
  else:
    out = neighbourhood_max(ready + arrs[1], a)
  return np.maximum(out, done) if overlap else out


def check_deadline(cluster, rule: DeadlineRule) -> DeadlineRule:
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
      raise checks.not_allowed("nonblocking.deadline", rule,
                 f"no worker can finish a mini-batch before it (the fastest first mini-batch "
                 f"takes at least {first:g} s)")
  elif parsed.startswith("kth:") and int(parsed[4:].split(":")[0]) > cluster.n:
    raise checks.not_allowed("nonblocking.deadline", rule, f"K must be <= num_workers={cluster.n}")
  return parsed
