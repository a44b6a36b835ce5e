"""The host side of a step: who communicates, who finished what, and the simulated clock.

Each step the :class:`Simulator` (numpy, on the host)

1. draws the step's communication pattern (MATCHA's activations; the phase of a
   time-varying topology) and its cost per worker: messages and bytes;
2. draws every worker's mini-batch finish times from the cluster model
   (:mod:`nbsgd_jax.cluster`) and, for Non-blocking SGD (He & Dube 2022), the deadline and
   the number of mini-batches each worker finished by it;
3. advances the per-worker clocks by the max-plus rule
   ``c_i <- max_{j in N(i) + {i}} (c_j + compute_j) + comm_i`` (all-reduce: ``N(i)`` is
   everyone), with ``comm_i = latency * messages_i + bytes_i / bandwidth``.

It returns the step's :class:`~nbsgd_jax.algorithms.base.StepInputs` (arrays with a leading
worker axis, fed to the jitted step, never a recompilation) and ``sim_time`` = the latest
worker clock (s).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from nbsgd_jax import cluster as cluster_lib
from nbsgd_jax import collectives
from nbsgd_jax import topology as topology_lib


class CommPattern(NamedTuple):
  """One step's communication, per worker.

  Attributes:
    adjacency: bool ``[n, n]`` (who waits for whom), or None for all-to-all (all-reduce).
    messages: float ``[n]``, messages sent.
    num_bytes: float ``[n]``, bytes sent.
    active: bool ``[K]``, MATCHA activations (``[1]`` False otherwise).
  """

  adjacency: np.ndarray | None
  messages: np.ndarray
  num_bytes: np.ndarray
  active: np.ndarray


def comm_pattern(algorithm: str, step: int, n: int, model_bytes: float,
                 topology: topology_lib.Topology | None = None, plan=None,
                 matcha_seed: int = 0) -> CommPattern:
  """The communication of ``algorithm`` at ``step`` (see :class:`CommPattern`).

  * ``allreduce``, ``allreduce_ring``: ring all-reduce, ``2 (n - 1)`` messages of ``S / n``
    bytes (Patarasuk & Yuan 2009), everyone waits for everyone.
  * ``dpsgd``: one model to each neighbour of ``W_t``; a worker waits for its neighbours.
  * ``matcha``: one model per active matching that pairs the worker (Wang et al. 2019).
  * ``sparse_allgather``: sparsified all-reduce (Shi et al. 2019); ``model_bytes`` is then one
    sparse message, sent to each of the ``n - 1`` others.

  Raises:
    ValueError: unknown algorithm, or a missing topology / plan.
  """
  none = np.zeros((1,), bool)
  if algorithm in ("allreduce", "allreduce_ring"):
    msgs = np.full(n, 2.0 * (n - 1))
    return CommPattern(None, msgs, np.full(n, collectives.ring_all_reduce_bytes(model_bytes, n)),
                       none)
  if algorithm == "sparse_allgather":  # each worker's sparse message reaches the n - 1 others
    return CommPattern(None, np.full(n, float(n - 1)), np.full(n, (n - 1) * model_bytes), none)
  if algorithm == "dpsgd":
    if topology is None:
      raise ValueError("dpsgd needs a topology")
    adj = topology.mixing_matrix_at(step) != 0.0
    np.fill_diagonal(adj, True)
    deg = adj.sum(axis=1) - 1.0
    return CommPattern(adj, deg, deg * model_bytes, none)
  if algorithm == "matcha":
    if plan is None:
      raise ValueError("matcha needs a MatchaPlan")
    from nbsgd_jax import matcha as matcha_lib
    active = matcha_lib.sample_activations(plan, matcha_seed, step)
    adj = np.eye(n, dtype=bool)
    for j, m in enumerate(plan.matchings):
      if active[j]:
        for a, b in m:
          adj[a, b] = adj[b, a] = True
    deg = adj.sum(axis=1) - 1.0
    return CommPattern(adj, deg, deg * model_bytes, active if len(active) else none)
  raise ValueError(f"algorithm={algorithm!r} has no communication model")


class Simulator:
  """Per-step host schedule and simulated clock of a run (see module docstring).

  Args:
    algorithm: ``config.algorithm``.
    cluster: the :class:`~nbsgd_jax.cluster.Cluster`.
    model_bytes: bytes of one model / gradient message ``S``.
    nonblocking: whether workers stop at the deadline (else every worker finishes all M).
    deadline: a deadline rule (:func:`nbsgd_jax.cluster.parse_deadline`).
    deadline_group: ``"all"``: one deadline for every worker (e.g. when the fastest worker of
      all finishes its M mini-batches); ``"neighbours"``: each worker's deadline over itself
      and the workers it communicates with this step.
    topology, plan, matcha_seed: as for :func:`comm_pattern`.
    failures: :class:`nbsgd_jax.cluster.Failure` s (simulated worker failures).
  """

  def __init__(self, algorithm: str, cluster: cluster_lib.Cluster, model_bytes: float,
               nonblocking: bool = False, deadline="fastest", topology=None, plan=None,
               matcha_seed: int = 0, deadline_group: str = "all", failures=()):
    self.algorithm, self.cluster, self.model_bytes = algorithm, cluster, float(model_bytes)
    self.nonblocking = nonblocking
    self.rule = cluster_lib.check_deadline(cluster, cluster_lib.parse_deadline(deadline))
    self.topology, self.plan, self.matcha_seed = topology, plan, matcha_seed
    if deadline_group not in ("all", "neighbours"):
      raise ValueError(f"nonblocking.deadline_group={deadline_group!r} is not allowed: use "
                       "one of ['all', 'neighbours']")
    self.deadline_group = deadline_group
    self.failures = list(failures)
    self.clocks = np.zeros(cluster.n)

  @property
  def sim_time(self) -> float:
    """Simulated seconds until the slowest worker finished its last step."""
    return float(self.clocks.max())

  def step(self, step: int, communicate: bool = True) -> tuple[dict, CommPattern]:
    """Advance the clocks over ``step``; with ``communicate=False`` (a local step of local
    SGD / DiLoCo) nothing is sent and no worker waits for another.

    Returns:
      ``(inputs, pattern)``: ``inputs`` a dict of numpy arrays with a leading worker axis,
      ``step`` int32 ``[n]``, ``count`` int32 ``[n]``, ``active`` bool ``[n, K]`` and, with
      ``failures``, ``alive`` bool ``[n, n]`` (row i: which workers are up, the same for
      every i; a failed worker has count 0, no compute time and sends nothing); the step's
      :class:`CommPattern`.
    """
    cl, n = self.cluster, self.cluster.n
    if communicate:
      pat = comm_pattern(self.algorithm, step, n, self.model_bytes, self.topology, self.plan,
                         self.matcha_seed)
    else:
      pat = CommPattern(np.eye(n, dtype=bool), np.zeros(n), np.zeros(n), np.zeros((1,), bool))
    finish = cluster_lib.minibatch_finish_times(cl, step)
    if self.nonblocking:
      group = pat.adjacency if self.deadline_group == "neighbours" else None
      dl = cluster_lib.deadline(finish, self.rule, group=group)
      count = cluster_lib.finished_counts(finish, dl)
      compute = cluster_lib.compute_time(finish, dl)
    else:
      count = np.full(n, cl.num_minibatches, np.int32)
      compute = cluster_lib.compute_time(finish)
    alive = None
    if self.failures:  # a failed worker: no mini-batch, no compute, nothing sent
      alive = cluster_lib.alive_mask(self.failures, step, n)
      count = np.where(alive, count, 0)
      compute = np.where(alive, compute, 0.0)
      messages, num_bytes = pat.messages * alive, pat.num_bytes * alive
      base = pat.adjacency if pat.adjacency is not None else np.ones((n, n), bool)
      adjacency = base & alive[:, None] & alive[None, :]
      np.fill_diagonal(adjacency, True)
      pat = pat._replace(messages=messages, num_bytes=num_bytes, adjacency=adjacency)
    comm = cluster_lib.comm_time(cl, pat.messages, pat.num_bytes)
    self.clocks = cluster_lib.advance_clocks(self.clocks, compute, comm, pat.adjacency)
    inputs = {"step": np.full(n, step, np.int32), "count": count.astype(np.int32),
              "active": np.broadcast_to(pat.active, (n,) + pat.active.shape).copy()}
    if alive is not None:
      inputs["alive"] = np.broadcast_to(alive, (n, n)).copy()
    return inputs, pat

  def extra(self, step: int, gossip_rounds: int, measurements: int,
            measure_bytes: float) -> None:
    """Advance the clocks over consensus control after ``step`` (Kong et al. 2021): first a
    measurement, then ``gossip_rounds`` times one more gossip of this step's pattern (MATCHA:
    of the base graph) and a measurement. A measurement is an all-reduce (everyone waits for everyone) of
    ``measure_bytes`` per worker; no computation.

    Raises:
      ValueError: negative counts.
    """
    if gossip_rounds < 0 or measurements < 0:
      raise ValueError(f"gossip_rounds={gossip_rounds}, measurements={measurements}: counts "
                       "must be >= 0")
    cl, n = self.cluster, self.cluster.n
    zero = np.zeros(n)
    # MATCHA's extra gossip runs over the base graph (algorithms.gossip_sgd, control_mixer)
    algo = "dpsgd" if self.algorithm == "matcha" else self.algorithm
    gossip = comm_pattern(algo, step, n, self.model_bytes, self.topology, self.plan,
                          self.matcha_seed)
    msgs = np.full(n, 2.0 * (n - 1) + 2.0 * (n - 1))  # the vector and the scalar all-reduce
    meas = cluster_lib.comm_time(cl, msgs, np.full(n, float(measure_bytes)))
    comm = cluster_lib.comm_time(cl, gossip.messages, gossip.num_bytes)
    rounds = max(gossip_rounds, measurements)
    for r in range(rounds):
      if r < measurements:
        self.clocks = cluster_lib.advance_clocks(self.clocks, zero, meas, None)
      if r < gossip_rounds:
        self.clocks = cluster_lib.advance_clocks(self.clocks, zero, comm, gossip.adjacency)
