"""The host side of a run as parts (numpy only): each gives a step's inputs, observes the
step's report, adds fields to the records and holds checkpointable state.

A step on the host (:class:`Host`)::

    inputs = host.inputs(step, probe)        # a HostInputs, every part fills its fields
    ... the compiled worker program runs with StepContext(inputs) ...
    host.observe(step, inputs, report, probe)  # every part reads the report (host numpy)

The parts, in order: :class:`Failures` (``alive``), :class:`Activations` (what the
communications draw: MATCHA's ``active``), :class:`Periods` (local SGD / DiLoCo:
``period_end``), :class:`~nbsgd_jax.host.workload.Workload` (the cluster model: ``count``,
``total`` and the compute times; He & Dube 2022), consensus targets (:mod:`nbsgd_jax.host.consensus`), :class:`Clock`
(the simulated clock) and :class:`Totals` (bytes and communication rounds).

``probe`` gives off-clock measurements of the current models (``probe.train_loss()``,
``probe.smoothness()``). A part that must observe a step before the next one is drawn says so
in ``needs_report(step, inputs)`` (the loop then reads the pending reports at once, off the
clock, instead of at the next evaluation).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import numpy as np

from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host import failures as failures_lib


@dataclasses.dataclass
class HostInputs:
  """The host's inputs of one step, filled by the parts in order (:meth:`Host.inputs`); the
  compiled step reads ``step``, ``count``, ``total``, ``active``, ``alive`` and ``target``
  (its :class:`~nbsgd_jax.transforms.StepContext`), the parts the others.

  Attributes:
    step: the (0-based) step.
    count: int32 ``[n]``, mini-batches each worker finished by the deadline (Workload; He &
      Dube 2022), 0 for a failed worker.
    total: int32, ``sum_i count_i``.
    compute: float64 ``[n]``, s of computation of each worker in the step (Workload).
    useful: float64 ``[n]``, s of that computation whose gradients enter the model (the
      counted mini-batches'; goodput, :mod:`nbsgd_jax.host.ledger`), or None: all of it.
    deadline: s after the step's start (``inf``: none, a blocking step).
    active: bool ``[K]``, what the communications draw (MATCHA's activations; ``[1]`` False
      when none).
    alive: bool ``[n]``, the workers up (Failures), or None without failures.
    joined: bool ``[n]``, the workers up again this step after a failure (Failures; host).
    quorum_wait, repaired: s the job waited below its quorum before the step, and bool
      ``[n]`` the workers repaired then (Failures, ``cluster.quorum_policy='wait'``; host).
    target: float32, the consensus-control target Xi (Targets), or None without control.
    target_value: the same as a Python float (``inf``: not controlled at this step).
    period_end: whether the step ends a communication period (Periods; any static hashable
      value, e.g. Streaming DiLoCo's fragment), True for recipes without periods.
    wall_step_s: s the step took on the wall clock (``cluster.clock='wall'``), else None.
    shared: the open context a part adds for the compiled step, ``{key: array}``, the same
      for every worker (``StepContext.shared``; a key is structure, a value is not).
    per_worker: the open per-worker context, ``{key: array [n, ...]}`` (``StepContext.
      per_worker``: worker i reads row i), e.g. a worker's own step count or the age of its
      gradient.
    events: the event clock's masks of the step, a
      :class:`~nbsgd_jax.transforms.asynchronous.Events` of ``[n]`` arrays (``StepContext.
      events``), or None on the lockstep clock.
  """

  step: int
  count: Optional[np.ndarray] = None
  total: Optional[np.int32] = None
  compute: Optional[np.ndarray] = None
  useful: Optional[np.ndarray] = None
  deadline: float = math.inf
  active: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((1,), bool))
  alive: Optional[np.ndarray] = None
  joined: Optional[np.ndarray] = None
  quorum_wait: float = 0.0
  repaired: Optional[np.ndarray] = None
  target: Optional[np.float32] = None
  target_value: Optional[float] = None
  period_end: Any = True
  wall_step_s: Optional[float] = None
  shared: dict = dataclasses.field(default_factory=dict)
  per_worker: dict = dataclasses.field(default_factory=dict)
  events: Any = None

  def update(self, **values) -> None:
    """Set fields by name.

    Raises:
      AttributeError: a name that is not a field (named).
    """
    for name, value in values.items():
      if name not in self.__dataclass_fields__:
        raise AttributeError(f"HostInputs has no field {name!r}")
      setattr(self, name, value)


class HostPart:
  """Base of a host part (see module docstring); every method is optional."""

  name = "part"

  def needs_report(self, step: int, inputs: HostInputs) -> bool:
    """Whether this step's report must be observed before the next step is drawn."""
    del step, inputs
    return False

  def begin(self, probe) -> None:
    """Before the first step of a new run (not on resume)."""

  def inputs(self, step: int, inputs: HostInputs, probe) -> None:
    """Add this part's entries to ``inputs`` (numpy) for (0-based) ``step``."""

  def observe(self, step: int, inputs: HostInputs, report: dict, probe) -> Optional[dict]:
    """Read the step's report (each value a numpy ``[n]`` array); may return fields for the
    step's record (``steps.jsonl``)."""
    return None

  def record(self) -> dict:
    """Fields for the evaluation records (``metrics.jsonl``)."""
    return {}

  def own_plan(self) -> bool:
    """Whether the period ends this part plans depend on the run's own results: such a
    run's period ends are its program's structure, so a sweep trains it alone."""
    return False

  def steps_for(self, grads: Sequence[int]) -> Optional[list[int]]:
    """For each budget ``grads[j]`` (gradient computations per worker, increasing), the
    fewest device steps from step 0 after which the workers' mean count reaches it; None: no
    say (the clock of the run answers: :meth:`Host.steps_for`)."""
    del grads
    return None

  def state_dict(self) -> Optional[dict]:
    """JSON-serialisable state for checkpoints (None: stateless)."""
    return None

  def load_state_dict(self, d: dict) -> None:
    """Continue from :meth:`state_dict`'s output."""


class Failures(HostPart):
  """Simulated worker failures, a schedule (:func:`nbsgd_jax.host.cluster.parse_failures`)
  and a rate (:class:`nbsgd_jax.host.failures.FailureProcess`, or None): ``alive`` bool
  ``[n]`` on every step; without failures no ``alive`` input at all (a lighter program).
  Below a ``quorum`` (``cluster.quorum_policy='wait'``) a step first waits for repairs
  (:class:`~nbsgd_jax.host.failures.QuorumWait`: ``quorum_wait``, ``repaired``)."""

  name = "failures"

  def __init__(self, failures: Sequence[cluster_lib.Failure], n: int, process=None,
               quorum=None):
    self.failures, self.n, self.process = list(failures), n, process
    self.live = failures_lib.QuorumWait(self.failures, n, process, quorum)

  def inputs(self, step, inputs, probe):
    if self.failures or self.process is not None:
      inputs.quorum_wait, inputs.repaired = self.live.wait(step)
      inputs.alive = self.alive(step)
      inputs.joined = failures_lib.joined_at(self.alive, step)

  def alive(self, step: int) -> np.ndarray:
    return self.live.alive(step)

  def state_dict(self):
    return self.live.state_dict() if self.live.quorum else None

  def load_state_dict(self, d):
    self.live.load_state_dict(d)


class Activations(HostPart):
  """What the recipe's communications draw on the host each step (their ``host_inputs``,
  e.g. MATCHA's activations ``active``, ``[1]`` False when none; the keys a communication
  adds to ``shared`` or ``per_worker``, e.g. a round's random mixing matrix)."""

  name = "activations"

  def __init__(self, communications: Sequence):
    self.communications = list(communications)

  def inputs(self, step, inputs, probe):
    inputs.active = np.zeros((1,), bool)
    for comm in self.communications:
      for name, value in comm.host_inputs(step).items():
        if name in ("shared", "per_worker"):  # open dicts: each communication adds its keys
          getattr(inputs, name).update(value)
        else:
          inputs.update(**{name: value})


class Periods(HostPart):
  """Communication periods of local SGD / DiLoCo: ``period_end`` from a
  :class:`nbsgd_jax.host.periods.SyncPlanner`; ADA-LUPA observes the training loss at step 0 and
  after every synchronisation (read at once: :meth:`needs_report`)."""

  name = "planner"

  def __init__(self, planner):
    self.planner = planner

  def needs_report(self, step, inputs):
    return self.planner.needs_loss and bool(inputs.period_end)  # the next period needs F

  def own_plan(self):
    return self.planner.needs_loss  # ADA-LUPA: the periods follow the run's own losses

  def begin(self, probe):
    if self.planner.needs_loss:
      self.planner.observe(probe.train_loss())

  def inputs(self, step, inputs, probe):
    inputs.period_end = self.planner.sync_now(step)

  def observe(self, step, inputs, report, probe):
    if self.planner.needs_loss and inputs.period_end:
      self.planner.observe(probe.train_loss())

  def state_dict(self):
    return self.planner.state_dict()

  def load_state_dict(self, d):
    self.planner.load_state_dict(d)


class Clock(HostPart):
  """The simulated clock: per-worker clocks advanced round by round
  (:func:`nbsgd_jax.host.cluster.advance_clocks`; ``docs/clock.md``) for every round the
  communications report (their ``clock_rounds``: who waits for whom, lockstep or point to
  point, whether it overlaps the computation, messages, and the bytes the device reported),
  with ``comm_i = latency * messages_i + bytes_i / bandwidth``. The step's computation enters
  the first round; a step with no communication (a local step) only computes. A deferred
  round (``Round.delay = tau > 0``: Streaming DiLoCo's overlapped all-reduce) starts like any
  other but nobody waits for it until the end of step ``t + tau``: then
  ``c_i <- max(c_i, arrival_i)``.

  A step is one gradient computation per worker (a lockstep step: every worker computes its
  gradient; Non-blocking SGD's partial batches and a failed worker's step included), so
  a budget of B gradient computations per worker is B steps (:meth:`steps_for`).

  Record: ``sim_time`` (s), the latest worker clock; ``grads_per_worker``, the steps so far.
  """

  name = "clock"

  def __init__(self, cluster, communications: Sequence, fetch=None):
    self.cluster, self.communications, self.fetch = cluster, list(communications), fetch
    self.clocks = np.zeros(cluster.n)
    self.pending: list = []  # [step the result is needed, arrival times [n]] of deferred rounds
    self.blocking = np.zeros(cluster.n)
    self.steps = 0  # steps observed (step + 1 of the last: no state of its own to restore)

  def steps_for(self, grads):
    """The points themselves: one gradient computation per worker a step."""
    return [int(g) for g in grads]

  @property
  def sim_time(self) -> float:
    """Simulated seconds until the slowest worker finished its last step."""
    return float(self.clocks.max())

  def rounds(self, step: int, inputs: HostInputs, report: dict) -> list:
    """Every :class:`~nbsgd_jax.communications.Round` of the step, in chain order."""
    out = []
    fetch = self.fetch and self.fetch.round(inputs.joined, inputs.alive)
    out = [fetch] if fetch else []  # a joiner fetches the model before it computes
    for comm in self.communications:
      out += comm.clock_rounds(step, inputs.active, inputs.alive, report)
    return out

  def observe(self, step, inputs, report, probe):
    compute = np.asarray(inputs.compute, np.float64)
    self.blocking = np.zeros(self.cluster.n)  # the step's blocking rounds' seconds (Ledger)
    if inputs.quorum_wait and inputs.alive is not None:  # the step's quorum formed this late
      self.clocks = np.where(inputs.alive, self.clocks.max() + inputs.quorum_wait, self.clocks)
    for r in self.rounds(step, inputs, report):
      comm = cluster_lib.round_time(self.cluster, r)
      if not r.overlap and not r.delay:
        self.blocking = self.blocking + comm
      done = cluster_lib.advance_clocks(self.clocks, compute, comm, r.adjacency,
                                        r.collective, r.overlap)
      if r.delay:
        self.pending.append([step + int(r.delay), done.tolist()])
        continue
      self.clocks, compute = done, np.zeros_like(compute)
    self.clocks = self.clocks + compute  # nothing waited for: the step only computed
    arrived = [np.asarray(a) for due, a in self.pending if due == step]
    self.pending = [p for p in self.pending if p[0] != step]
    for a in arrived:
      self.clocks = np.maximum(self.clocks, a)
    self.steps = step + 1
    return None

  def record(self):
    return {"sim_time": self.sim_time, "grads_per_worker": float(self.steps)}

  def state_dict(self):
    return {"clocks": self.clocks.tolist(), "pending": self.pending}

  def load_state_dict(self, d):
    self.clocks = np.asarray(d["clocks"], np.float64)
    self.pending = [[int(due), list(a)] for due, a in d.get("pending", [])]


class Totals(HostPart):
  """Bytes sent per worker (mean over workers, cumulative, float64) and communication rounds
  (steps that communicated: every step, or the synchronisations of periodic recipes; a
  step that only receives a deferred result does not count).

  Record: ``bytes_sent``, ``rounds``.
  """

  name = "totals"

  def __init__(self, fetch=None):
    self.bytes_sent, self.rounds, self.fetch = 0.0, 0, fetch

  def observe(self, step, inputs, report, probe):
    if "bytes_sent" in report:
      self.bytes_sent += float(np.mean(np.asarray(report["bytes_sent"], np.float64)))
    fetch = self.fetch and self.fetch.round(inputs.joined, inputs.alive)
    self.bytes_sent += float(np.mean(fetch.num_bytes)) if fetch else 0.0
    sync = bool(inputs.period_end)
    self.rounds += int(sync and any(k.startswith("rounds/") for k in report))
    return None

  def record(self):
    return {"bytes_sent": self.bytes_sent, "rounds": self.rounds}

  def state_dict(self):
    return {"bytes_sent": self.bytes_sent, "rounds": self.rounds}

  def load_state_dict(self, d):
    self.bytes_sent, self.rounds = float(d["bytes_sent"]), int(d["rounds"])


class Host:
  """The host parts of a run, in order (see module docstring)."""

  def __init__(self, parts: Sequence[HostPart]):
    self.parts = list(parts)
    names = [p.name for p in self.parts]
    if len(set(names)) != len(names):
      raise ValueError(f"host parts need distinct names, got {names}")

  def needs_report(self, step: int, inputs: HostInputs) -> bool:
    """Whether some part must observe this step before the next is drawn."""
    return any(p.needs_report(step, inputs) for p in self.parts)

  def part(self, name: str) -> Any:
    """The part called ``name`` (KeyError if absent)."""
    for p in self.parts:
      if p.name == name:
        return p
    raise KeyError(name)

  def begin(self, probe) -> None:
    for p in self.parts:
      p.begin(probe)

  def inputs(self, step: int, probe=None) -> HostInputs:
    """The (0-based) step's host inputs, every part's fields filled in order."""
    inputs = HostInputs(int(step))
    for p in self.parts:
      p.inputs(step, inputs, probe)
    return inputs

  def observe(self, step: int, inputs: HostInputs, report: dict, probe=None) -> dict:
    """Every part reads the step's report; returns the parts' step-record fields."""
    fields: dict = {}
    for p in self.parts:
      fields.update(p.observe(step, inputs, report, probe) or {})
    return fields

  def own_plan(self) -> bool:
    """Whether any part plans from the run's own results (:meth:`HostPart.own_plan`)."""
    return any(p.own_plan() for p in self.parts)

  def steps_for(self, grads: Sequence[int]) -> list[int]:
    """For each budget ``grads[j]`` (gradient computations per worker, increasing), the
    device steps from step 0 that reach it: the first part's answer
    (:meth:`HostPart.steps_for`: the run's clock, lockstep or the event clock).

    Raises:
      ValueError: no part answers (a host without a clock).
    """
    for p in self.parts:
      steps = p.steps_for(grads)
      if steps is not None:
        return steps
    raise ValueError(f"no host part of {[p.name for p in self.parts]} says how many gradient "
                     "computations a device step holds (a run's clock does)")

  def record(self) -> dict:
    out: dict = {}
    for p in self.parts:
      out.update(p.record())
    return out

  def state_dict(self) -> dict:
    return {p.name: p.state_dict() for p in self.parts if p.state_dict() is not None}

  def load_state_dict(self, d: dict) -> None:
    for p in self.parts:
      if p.name in d:
        p.load_state_dict(d[p.name])
