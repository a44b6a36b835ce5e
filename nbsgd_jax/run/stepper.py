"""The stepper: the host <-> device exchange of the steps of ``R >= 1`` runs of one structure
(:class:`Stepper`), and each run's host side (:class:`Run`: its host parts, records,
evaluation). The loop (:mod:`nbsgd_jax.run.loop`), the sweeps (:mod:`nbsgd_jax.run.sweep`),
the tests and the scripts step runs through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from nbsgd_jax.transforms import consensus as consensus_lib
from nbsgd_jax.models import forms as forms_lib
from nbsgd_jax.core import metrics as metrics_lib
from nbsgd_jax.run import evaluation as evaluation_lib
from nbsgd_jax.run import setup as setup_lib
from nbsgd_jax.run import step as step_lib
from nbsgd_jax.run import wallclock
from nbsgd_jax.run.budget import Budget
from nbsgd_jax.run.evaluation import TrainingDiverged
from nbsgd_jax.run.records import Records
from nbsgd_jax.run.stopwatch import Stopwatch
from nbsgd_jax.transforms.base import is_summed


class Run:
  """One run on the host: its set-up, host parts and records; its device state is a slice of
  its :class:`Stepper`'s (the host parts' ``probe``).

  Attributes:
    s, host, records: the run's set-up, :class:`~nbsgd_jax.host.Host` and records.
    stopped: why the run stopped before its last step (:attr:`num_steps`: ``"sim_time"``,
      ``"train_loss"``, ``"step"``, ``"diverged"``), None while it runs.
    done: the steps it has taken (frozen when it stopped).
    rec: its last evaluation record.
  """

  def __init__(self, s: setup_lib.Setup, host, records: Records, stepper: "Stepper",
               index: int):
    self.s, self.host, self.records = s, host, records
    self.stepper, self.index = stepper, index
    self.stopped: Optional[str] = None
    self.done, self.rec, self.last_inputs = 0, None, None
    self.error: Optional[TrainingDiverged] = None
    self._smooth_fn = None

  @property
  def state(self):
    """This run's train state (its slice of a sweep's stacked state)."""
    return self.stepper.state_of(self.index)

  @property
  def watch(self) -> Stopwatch:
    return self.stepper.watch

  @functools.cached_property
  def budget(self) -> Optional[Budget]:
    """Its :class:`Budget` (``config.budget_unit = "grads_per_worker"``), else None."""
    return Budget.of(self.s.cfg, self.host)

  @property
  def num_steps(self) -> int:
    """The device steps the run takes: ``config.num_steps``, or with a budget the steps that
    reach it."""
    return self.s.cfg.num_steps if self.budget is None else self.budget.steps[-1]

  @property
  def active(self) -> bool:
    """Whether the run still trains (not stopped, steps left)."""
    return self.stopped is None and self.done < self.num_steps

  # ---------------------------------------------------------------- off-clock measurements

  def models(self, own: bool = False):
    """The stacked models an evaluation reads (``Recipe.evaluated``, by default the workers'
    parameters; ``own``: the workers' parameters always), whole on every device (evaluation
    reads whole models)."""
    p, read = self.state.params, self.s.recipe.evaluated
    if read is not None and not own:
      p = read(self.state.opt_state, p)
    return p if self.s.backend.mesh is None else self.s.backend.replicate(p)

  def model_states(self):
    """The stacked model states (BatchNorm statistics), whole on every device."""
    m = self.state.model_state
    return m if self.s.backend.mesh is None else self.s.backend.replicate(m)

  def train_loss(self) -> float:
    """``F`` of the averaged model (the task's; ADA-LUPA), off the clock."""
    task = self.s.task
    return self.watch.off_clock(self.stepper.state, lambda: float(task.train_loss(
        self.models(), self.model_states(), task.eval_data)))

  def smoothness(self) -> float:
    """L of the averaged model (Hessian power iteration; the critical target), off the clock."""
    cfg, task = self.s.cfg, self.s.task
    if self._smooth_fn is None:
      self._smooth_fn = jax.jit(lambda params, ms, data: consensus_lib.smoothness_estimate(
          lambda p: task.point_loss(p, evaluation_lib.average_state(ms), data),
          metrics_lib.average_model(params), cfg.consensus.smoothness_iters, cfg.seed)
          + cfg.weight_decay)
    return self.watch.off_clock(self.stepper.state, lambda: float(self._smooth_fn(
        self.models(), self.model_states(), task.eval_data)))

  # ---------------------------------------------------------------- reports and evaluation

  def observe(self, steps: list) -> Optional[float]:
    """The host parts observe the run's pending steps ``[(step, inputs, loss [n], report)]``
    in order, ``steps.jsonl`` gets one line per step. Returns the mean mini-batch loss (None
    when nothing was pending).

    Raises:
      TrainingDiverged: a non-finite step loss.
    """
    losses = []
    for step, inputs, loss, report in steps:
      loss = np.asarray(loss, np.float64)
      if not np.all(np.isfinite(loss)):
        raise TrainingDiverged(step + 1, np.flatnonzero(~np.isfinite(loss)).tolist(), "loss")
      fields = self.host.observe(step, inputs, report, self)
      loss = computed_losses(inputs, loss)
      if loss.size:
        losses.append(loss.mean())
      rec = {"step": step + 1, "train_batch_loss": float(loss.mean()) if loss.size else None}
      rec.update({k: float(v[0]) for k, v in report.items() if not is_summed(k)})
      self.records.step({**rec, **fields})
    return float(np.mean(losses)) if losses else None

  def evaluate(self, step: int, batch_loss: Optional[float]) -> dict:
    """The evaluation record after ``step`` steps (written to the records): the models
    ``Recipe.evaluated`` reads (DiLoCo's outer model, the server's), but ``consensus_distance``
    and ``worker_test_accuracy`` of the workers' own models (:meth:`models` ``own``).

    Raises:
      TrainingDiverged: a non-finite model or loss of the averaged model.
    """
    params = self.models()
    finite = np.asarray(evaluation_lib.finite_workers(params))
    if not finite.all():
      raise TrainingDiverged(step, np.flatnonzero(~finite).tolist(), "model")
    ev = self.s.task.evaluate(params, self.model_states(), self.s.task.eval_data)
    own = params if self.s.recipe.evaluated is None else self.models(own=True)
    if own is not params:  # Xi of the workers' own models, not of the replicas evaluated
      ev["consensus_distance"] = float(metrics_lib.consensus_distance(own))
      if "worker_test_accuracy" in ev:  # the workers' own models' too, not the replicas'
        ev["worker_test_accuracy"] = self.s.task.evaluate(
            own, self.model_states(), self.s.task.eval_data)["worker_test_accuracy"]
    bad = [k for k in ("train_loss", "test_loss") if not math.isfinite(ev.get(k, 0.0))]
    if bad:  # finite workers whose average overflows the loss
      raise TrainingDiverged(step, [], bad[0])
    rec = {"step": step, "wall_time": self.watch.seconds, "train_batch_loss": batch_loss,
           **ev, **self.host.record()}
    if self.s.cfg.consensus.per_layer:
      rec["consensus_distance_layers"] = {
          k: float(v) for k, v in metrics_lib.consensus_distance_per_layer(own).items()}
    self.records.evaluation(rec)
    self.rec = rec
    return rec

  def next_evaluation(self) -> int:
    """The step of the run's next evaluation (its ``eval_every`` cadence, its last step;
    with a budget, the step that reaches its next budget point)."""
    cfg = self.s.cfg
    if self.budget is not None:
      return self.budget.next_step(self.done)
    return min((self.done // cfg.eval_every + 1) * cfg.eval_every, cfg.num_steps)

  def checkpoint_due(self, step: int, every: int) -> bool:
    """Whether an evaluation at device step ``step`` is on the cadence of a checkpoint every
    ``every`` steps (with a budget: gradient computations per worker, as ``eval_every``);
    ``every`` = 0: never."""
    if not every:
      return False
    if self.budget is None:
      return step % every == 0
    point = self.budget.point_at(step)
    return point is not None and point % every == 0


AUTO_DISPATCH_MAX = 16  # the largest k that config.steps_per_dispatch = 0 (auto) picks


def computed_losses(inputs, loss: np.ndarray) -> np.ndarray:
  """The step's mini-batch losses of the workers that computed a gradient: on the event
  clock those of ``inputs.events.compute`` (the others computed none, or one that was
  dropped), else every worker's."""
  events = inputs.events
  compute = None if events is None else getattr(events, "compute", None)
  return loss if compute is None else loss[np.asarray(compute, bool)]


def dispatch_size(setups: list, hooked: bool = False, platform: Optional[str] = None) -> int:
  """k, the steps per dispatch of the runs ``setups`` (one structure): their
  ``config.steps_per_dispatch``, or for 0 (auto) the largest divisor of every run's
  ``eval_every`` up to :data:`AUTO_DISPATCH_MAX`, and 1 where blocks would change what the
  run does or compiles, or would be slower: hooks (they run before each dispatch),
  ``cluster.clock="wall"`` (each step timed on the host), periodic recipes (each pattern of
  local and synchronising steps in a block is a program of its own: at most one per tau for
  k = 1) and a CPU (``platform``, default ``jax.default_backend()``:
  :func:`nbsgd_jax.models.forms.blocks_pay`, measured in ``docs/steps_per_dispatch.md``).

  A step's results do not depend on k (``tests/run/test_dispatch.py``).
  """
  cfg = setups[0].cfg
  if cfg.steps_per_dispatch:
    return int(cfg.steps_per_dispatch)
  if hooked or cfg.cluster.clock == "wall" or setups[0].recipe.periodic:
    return 1
  if not forms_lib.blocks_pay(platform or jax.default_backend()):
    return 1
  every = math.gcd(*(s.cfg.eval_every for s in setups))
  return max(k for k in range(1, AUTO_DISPATCH_MAX + 1) if every % k == 0)


class Stepper:
  """The host <-> device exchange of the steps of ``R >= 1`` runs of one structure: each
  run's host parts draw its inputs, one compiled program steps every run
  (:class:`nbsgd_jax.run.step.Program`, with a runs axis when ``R > 1``), the reports go
  back to each run's host parts in order. The loop, the sweeps, the tests and the benchmarks
  step runs through it.

  Args:
    setups: the runs' set-ups (one structure: :func:`nbsgd_jax.run.hparams.structure_key`).
    hosts: their host parts.
    cache: the :class:`~nbsgd_jax.run.step.ProgramCache` (default: the process's).
    hooked: whether hooks run before each dispatch (:func:`dispatch_size`).

  Attributes:
    state: the device state: one run's :class:`~nbsgd_jax.run.step.TrainState`, or the
      runs' stacked on a leading axis ``[R, n, ...]``.
    runs: the :class:`Run` of each set-up (records written by :meth:`attach`'s).
    watch: the group's :class:`~nbsgd_jax.run.stopwatch.Stopwatch` (wall time of the steps).
    k: the steps per dispatch (:func:`dispatch_size`).
  """

  def __init__(self, setups: list, hosts: list, cache=None, hooked: bool = False):
    self.setups, self.hosts, self.cache = list(setups), list(hosts), cache
    self.k = dispatch_size(self.setups, hooked)
    self.R = len(self.setups)
    s = self.setups[0]
    self.watch = Stopwatch()
    self.runs: list[Run] = []
    self.pending: list = []  # (steps, members, inputs per member, outs) not yet read
    self.last_read: list = []  # per run, the steps the last flush read
    self.members = list(range(self.R))  # the runs in the program, in the stacked order
    self.parked: dict = {}  # run -> state of a stopped run taken out of the program
    if self.R == 1:
      self.program = (wallclock.WallClockStep(s, hosts[0].part("workload"))
                      if s.cfg.cluster.clock == "wall" else step_lib.Program(s, cache))
      self.state, self.data, self.hparams = setup_lib.init_state(s), s.worker_data, None
    else:
      self.shared = setup_lib.same_trees([x.worker_data for x in self.setups])
      self.state = setup_lib.init_states(self.setups)
      self.data = s.worker_data if self.shared else _stack([x.worker_data for x in self.setups])
      self.hparams = _stack([x.hparams for x in self.setups])
      self.program = step_lib.Program(s, cache, runs=self.R, shared_data=self.shared)

  @classmethod
  def of(cls, s: setup_lib.Setup, host=None, cache=None) -> "Stepper":
    """The stepper of one new run that writes nothing, for scripts and tests (with
    :meth:`steps`): ``s``'s host parts (default :func:`~nbsgd_jax.run.setup.make_host`),
    begun at step 0 (ADA-LUPA reads the initial loss)."""
    stepper = cls([s], [host if host is not None else setup_lib.make_host(s)], cache)
    (run,) = stepper.attach([Records(s.cfg, None, None, False, contextlib.ExitStack())])
    run.host.begin(run)
    return stepper

  def steps(self, count: int, edit: Optional[Callable] = None, *,
            read_each_dispatch: bool = True) -> list:
    """``count`` more steps of a one-run stepper, the reports read and observed by the host
    parts (as the loop does, without evaluations).

    Args:
      count: steps to run.
      edit: ``edit(inputs)``, called on each step's host inputs after the host parts drew
        them and before the program reads them (a test's forced counts or targets).
      read_each_dispatch: read each dispatch's reports at once (a test's step by step);
        False: once after the last step, as the loop does between evaluations (a
        benchmark's timing; a host part that needs a report at once still gets it).

    Returns:
      ``[(step, inputs, loss [n], report)]`` per step, numpy.

    Raises:
      TrainingDiverged: a non-finite loss.
    """
    (run,) = self.runs
    out, target = [], run.done + count
    while run.done < target:
      run.done += self.dispatch(run.done, target, edit)
      if self.pending and (read_each_dispatch or run.done >= target):
        self.flush()
      if not self.pending:  # read here or by the dispatch (a host part needed it at once)
        if run.error is not None:
          raise run.error
        out += self.last_read[0]
        self.last_read = [[]]
    return out

  def attach(self, records: list) -> list[Run]:
    """The :class:`Run` of each set-up, writing to ``records`` (one per run)."""
    self.runs = [Run(s, h, r, self, i)
                 for i, (s, h, r) in enumerate(zip(self.setups, self.hosts, records))]
    return self.runs

  def state_of(self, r: int):
    """Run ``r``'s train state (a slice of the stacked state when ``R > 1``)."""
    if self.R == 1:
      return self.state
    if r in self.parked:
      return self.parked[r]
    i = self.members.index(r)
    return jax.tree.map(lambda x: x[i], self.state)

  def full_state(self):
    """Every run's state stacked in run order (a checkpoint's device state)."""
    if self.R == 1 or self.members == list(range(self.R)):
      return self.state
    return _stack([self.state_of(r) for r in range(self.R)])

  def keep(self, members: list, state=None) -> None:
    """Step only the runs ``members`` from now on (one new compilation for their number):
    the others' states are parked. ``state``: every run's stacked state to take them from
    (a checkpoint's), else the current one. Only between dispatches, nothing pending."""
    full = self.full_state() if state is None else state
    self.parked = {r: jax.tree.map(lambda x, r=r: x[r], full) for r in range(self.R)
                   if r not in members}
    idx = jnp.asarray(members)
    self.state = jax.tree.map(lambda x: x[idx], full)
    self.hparams = _stack([self.setups[r].hparams for r in members])
    if not self.shared:
      self.data = _stack([self.setups[r].worker_data for r in members])
    self.members = list(members)
    self.program = step_lib.Program(self.setups[0], self.cache, runs=len(members),
                                    shared_data=self.shared)

  def compact(self) -> None:
    """Take the stopped runs out of the program once a quarter of its runs stopped: on a
    device whose step time grows with R (a CPU) a stopped run costs as much as a running
    one, and each new number of runs costs one compilation (at most ~log_{4/3} R)."""
    active = [r for r in self.members if self.runs[r].active]
    stopped = len(self.members) - len(active)
    if self.R > 1 and active and stopped and 4 * stopped >= len(self.members) \
        and not self.pending:
      self.keep(active)

  def dispatch(self, first: int, last: int, edit: Optional[Callable] = None) -> int:
    """Run steps ``first, first + 1, ...`` before ``last``, at most
    ``config.steps_per_dispatch`` of them, in one dispatch of the compiled program; a step
    whose report a host part of any run needs at once ends the block, and the reports are
    read at once (off the clock). Each run's host draws its inputs in order; a stopped run
    is stepped with its last inputs (its results are not read). ``edit(inputs)``: applied to
    each step's drawn inputs (:meth:`steps`). Returns the steps run.

    Raises:
      ValueError: runs of one program whose host parts planned different period ends.
    """
    k = self.k
    members = [self.runs[r] for r in self.members]
    steps, inputs = [], [[] for _ in members]
    for t in range(first, min(first + k, last)):
      steps.append(t)
      for run, mine in zip(members, inputs):
        frozen = mine[-1] if mine else run.last_inputs
        mine.append(run.host.inputs(t, run) if run.active or frozen is None else
                    dataclasses.replace(frozen, step=t))
        if edit is not None:
          edit(mine[-1])
        run.last_inputs = mine[-1]
      if self._needs_report(t, members, inputs):
        break
    keys = self._keys(members, inputs)
    if self.R == 1:
      ctx = self.program.context(inputs[0])
      self.state, out = self.program(self.state, self.data, ctx, keys, inputs[0])
    else:
      ctx = step_lib.stacked_contexts(self.setups[0], inputs)
      self.state, out = self.program(self.state, self.data, ctx, keys, hparams=self.hparams)
    self.pending.append((steps, list(self.members), inputs, out))
    if self._needs_report(steps[-1], members, inputs):
      self.watch.off_clock(self.state, self.flush)
    return len(steps)

  @staticmethod
  def _needs_report(t: int, members: list, inputs: list) -> bool:
    return any(run.active and run.host.needs_report(t, mine[-1])
               for run, mine in zip(members, inputs))

  @staticmethod
  def _keys(members: list, inputs: list) -> tuple:
    """The steps' period ends, the same for every running run."""
    keys = {tuple(i.period_end for i in mine)
            for run, mine in zip(members, inputs) if run.active}
    if len(keys) > 1:
      raise ValueError(f"the runs of one program planned different period ends {keys}: "
                       "their plans must be structure (nbsgd_jax.run.grid.groups)")
    return keys.pop() if keys else tuple(i.period_end for i in inputs[0])

  def _pending_steps(self):
    """Per run, ``[(step, inputs, loss [n], report)]`` of every pending step, in order (one
    transfer for all runs)."""
    outs = self.setups[0].backend.fetch([out for *_, out in self.pending])
    per_run: list = [[] for _ in self.runs]
    for (steps, members, inputs, _), out in zip(self.pending, outs):
      for i, (r, mine) in enumerate(zip(members, inputs)):
        if not getattr(self.program, "stacked", True):  # the wall clock's one step
          per_run[r].append((steps[0], mine[0], *out))
          continue
        j = 0
        for loss, report in out:  # one run of steps: [(R,) n, m] -> each step's [n]
          if self.R > 1:
            loss, report = loss[i], {k: v[i] for k, v in report.items()}
          for c in range(loss.shape[1]):
            per_run[r].append((steps[j], mine[j], loss[:, c],
                               {k: v[:, c] for k, v in report.items()}))
            j += 1
    return per_run

  def flush(self) -> list:
    """Read the pending reports (one transfer); each running run's host parts observe its
    own (:meth:`Run.observe`). Returns each run's mean mini-batch loss (None: nothing
    pending, or the run stopped); a run whose loss is not finite gets its
    :class:`TrainingDiverged` in ``run.error`` and stops (``"diverged"``)."""
    out = [None] * self.R
    self.last_read = [[] for _ in self.runs]
    if self.pending:
      self.last_read = self._pending_steps()
      for run, steps in zip(self.runs, self.last_read):
        if run.stopped is not None:  # frozen: its steps are not read
          continue
        try:
          out[run.index] = run.observe(steps)
        except TrainingDiverged as e:
          run.error, run.stopped = e, "diverged"
    self.pending.clear()
    return out

  def state_dict(self) -> dict:
    """The host state of every run (a checkpoint's JSON)."""
    return {"runs": [{"host": r.host.state_dict(), "done": r.done, "stopped": r.stopped,
                      "rec": r.rec, "records": r.records.history} for r in self.runs],
            "wall": self.watch.seconds,
            "members": self.members}

  def load_state_dict(self, d: dict) -> None:
    for run, saved in zip(self.runs, d["runs"]):
      run.host.load_state_dict(saved["host"])
      run.done, run.stopped, run.rec = saved["done"], saved["stopped"], saved["rec"]
    self.watch.seconds = d["wall"]
    if self.R > 1 and d.get("members", self.members) != self.members:
      self.keep(d["members"])  # the checkpoint's program


_stack = setup_lib.stack_trees


__all__ = ["AUTO_DISPATCH_MAX", "Budget", "Run", "Stepper", "dispatch_size"]
