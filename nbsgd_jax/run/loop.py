"""The training loop: host inputs -> the compiled worker program -> reports back to the host
parts -> evaluation, records and checkpoints on their cadence.

One :class:`Stepper` drives ``R >= 1`` runs of one structure (a sweep's group,
:mod:`nbsgd_jax.run.sweep`; :func:`train` is the case ``R = 1``): each run keeps its own
host parts and records (:class:`Run`), the device holds their states stacked on a runs axis
and steps them in one program. Per-step outputs stay on the device until they are read, in
one transfer, at each evaluation or after a step whose report a host part needs at once
(``Host.needs_report``): on the mesh backend an extra program between in-flight steps can
starve XLA:CPU's collective rendezvous.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from nbsgd_jax import config as config_lib
from nbsgd_jax import consensus as consensus_lib
from nbsgd_jax import metrics as metrics_lib
from nbsgd_jax.run import evaluation as evaluation_lib
from nbsgd_jax.run import records as records_lib
from nbsgd_jax.run import setup as setup_lib
from nbsgd_jax.run import step as step_lib
from nbsgd_jax.run import wallclock
from nbsgd_jax.run.evaluation import TrainingDiverged
from nbsgd_jax.run.records import Records, check_tensorboard
from nbsgd_jax.run.stopwatch import Stopwatch
from nbsgd_jax.transforms.base import is_summed


class Run:
  """One run on the host: its set-up, host parts and records; its device state is a slice of
  its :class:`Stepper`'s (the host parts' ``probe``).

  Attributes:
    s, host, records: the run's set-up, :class:`~nbsgd_jax.host.Host` and records.
    stopped: why the run stopped before its ``num_steps`` (``"sim_time"``, ``"train_loss"``,
      ``"diverged"``), None while it runs.
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

  @property
  def active(self) -> bool:
    """Whether the run still trains (not stopped, steps left)."""
    return self.stopped is None and self.done < self.s.cfg.num_steps

  # ---------------------------------------------------------------- off-clock measurements

  def models(self):
    """The stacked models, whole on every device (evaluation reads whole models)."""
    p = self.state.params
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
      losses.append(loss.mean())
      rec = {"step": step + 1, "train_batch_loss": float(loss.mean())}
      rec.update({k: float(v[0]) for k, v in report.items() if not is_summed(k)})
      self.records.step({**rec, **fields})
    return float(np.mean(losses)) if losses else None

  def evaluate(self, step: int, batch_loss: Optional[float]) -> dict:
    """The evaluation record after ``step`` steps (written to the records).

    Raises:
      TrainingDiverged: a non-finite model or loss of the averaged model.
    """
    params = self.models()
    finite = np.asarray(evaluation_lib.finite_workers(params))
    if not finite.all():
      raise TrainingDiverged(step, np.flatnonzero(~finite).tolist(), "model")
    ev = self.s.task.evaluate(params, self.model_states(), self.s.task.eval_data)
    bad = [k for k in ("train_loss", "test_loss") if not math.isfinite(ev.get(k, 0.0))]
    if bad:  # finite workers whose average overflows the loss
      raise TrainingDiverged(step, [], bad[0])
    rec = {"step": step, "wall_time": self.watch.seconds, "train_batch_loss": batch_loss,
           **ev, **self.host.record()}
    if self.s.cfg.consensus.per_layer:
      rec["consensus_distance_layers"] = {
          k: float(v) for k, v in metrics_lib.consensus_distance_per_layer(params).items()}
    self.records.evaluation(rec)
    self.rec = rec
    return rec

  def next_evaluation(self) -> int:
    """The step of the run's next evaluation (its ``eval_every`` cadence, its last step)."""
    cfg = self.s.cfg
    return min((self.done // cfg.eval_every + 1) * cfg.eval_every, cfg.num_steps)


class Stepper:
  """The host <-> device exchange of the steps of ``R >= 1`` runs of one structure: each
  run's host parts draw its inputs, one compiled program steps every run
  (:class:`nbsgd_jax.run.step.Program`, with a runs axis when ``R > 1``), the reports go
  back to each run's host parts in order. The loop, the sweeps, the tests and the benchmarks
  step runs through it.

  Args:
    setups: the runs' set-ups (one structure: :func:`nbsgd_jax.hparams.structure_key`).
    hosts: their host parts.
    cache: the :class:`~nbsgd_jax.run.step.ProgramCache` (default: the process's).

  Attributes:
    state: the device state: one run's :class:`~nbsgd_jax.run.step.TrainState`, or the
      runs' stacked on a leading axis ``[R, n, ...]``.
    runs: the :class:`Run` of each set-up (records written by :meth:`attach`'s).
    watch: the group's :class:`~nbsgd_jax.run.stopwatch.Stopwatch` (wall time of the steps).
  """

  def __init__(self, setups: list, hosts: list, cache=None):
    self.setups, self.hosts = list(setups), list(hosts)
    self.R = len(self.setups)
    s = self.setups[0]
    self.watch = Stopwatch()
    self.runs: list[Run] = []
    self.pending: list = []  # (steps, inputs per run, outs) not yet read
    if self.R == 1:
      self.program = (wallclock.WallClockStep(s, hosts[0].part("workload"))
                      if s.cfg.cluster.clock == "wall" else step_lib.Program(s, cache))
      self.state, self.data, self.hparams = setup_lib.init_state(s), s.worker_data, None
    else:
      shared = _same_arrays([x.worker_data for x in self.setups])
      self.program = step_lib.Program(s, cache, runs=self.R, shared_data=shared)
      self.state = _stack([setup_lib.init_state(x) for x in self.setups])
      self.data = s.worker_data if shared else _stack([x.worker_data for x in self.setups])
      self.hparams = _stack([x.hparams for x in self.setups])

  def attach(self, records: list) -> list[Run]:
    """The :class:`Run` of each set-up, writing to ``records`` (one per run)."""
    self.runs = [Run(s, h, r, self, i)
                 for i, (s, h, r) in enumerate(zip(self.setups, self.hosts, records))]
    return self.runs

  def state_of(self, r: int):
    """Run ``r``'s train state (a slice of the stacked state when ``R > 1``)."""
    return self.state if self.R == 1 else jax.tree.map(lambda x: x[r], self.state)

  def dispatch(self, first: int, last: int) -> int:
    """Run steps ``first, first + 1, ...`` before ``last``, at most
    ``config.steps_per_dispatch`` of them, in one dispatch of the compiled program; a step
    whose report a host part of any run needs at once ends the block, and the reports are
    read at once (off the clock). Each run's host draws its inputs in order; a stopped run
    is stepped with its last inputs (its results are not read). Returns the steps run.

    Raises:
      ValueError: runs of one program whose host parts planned different period ends.
    """
    k = self.setups[0].cfg.steps_per_dispatch
    steps, inputs = [], [[] for _ in self.runs]
    for t in range(first, min(first + k, last)):
      steps.append(t)
      for run, mine in zip(self.runs, inputs):
        frozen = mine[-1] if mine else run.last_inputs
        mine.append(run.host.inputs(t, run) if run.active or frozen is None else
                    dataclasses.replace(frozen, step=t))
        run.last_inputs = mine[-1]
      if self._needs_report(t, inputs):
        break
    keys = self._keys(inputs)
    if self.R == 1:
      ctx = self.program.context(inputs[0])
      self.state, out = self.program(self.state, self.data, ctx, keys, inputs[0])
    else:
      ctx = step_lib.stacked_contexts(self.setups[0], inputs)
      self.state, out = self.program(self.state, self.data, ctx, keys, hparams=self.hparams)
    self.pending.append((steps, inputs, out))
    if self._needs_report(steps[-1], inputs):
      self.watch.off_clock(self.state, self.flush)
    return len(steps)

  def _needs_report(self, t: int, inputs: list) -> bool:
    return any(run.active and run.host.needs_report(t, mine[-1])
               for run, mine in zip(self.runs, inputs))

  def _keys(self, inputs: list) -> tuple:
    """The steps' period ends, the same for every running run."""
    keys = {tuple(i.period_end for i in mine)
            for run, mine in zip(self.runs, inputs) if run.active}
    if len(keys) > 1:
      raise ValueError(f"the runs of one program planned different period ends {keys}: "
                       "their plans must be structure (nbsgd_jax.sweeps.groups)")
    return keys.pop() if keys else tuple(i.period_end for i in inputs[0])

  def _pending_steps(self):
    """Per run, ``[(step, inputs, loss [n], report)]`` of every pending step, in order (one
    transfer for all runs)."""
    outs = self.setups[0].backend.fetch([out for _, _, out in self.pending])
    per_run: list = [[] for _ in self.runs]
    for (steps, inputs, _), out in zip(self.pending, outs):
      for r, mine in enumerate(inputs):
        if not getattr(self.program, "stacked", True):  # the wall clock's one step
          per_run[r].append((steps[0], mine[0], *out))
          continue
        j = 0
        for loss, report in out:  # one run of steps: [(R,) n, m] -> each step's [n]
          if self.R > 1:
            loss, report = loss[r], {k: v[r] for k, v in report.items()}
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
    if self.pending:
      for run, steps in zip(self.runs, self._pending_steps()):
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
                      "rec": r.rec} for r in self.runs], "wall": self.watch.seconds}

  def load_state_dict(self, d: dict) -> None:
    for run, saved in zip(self.runs, d["runs"]):
      run.host.load_state_dict(saved["host"])
      run.done, run.stopped, run.rec = saved["done"], saved["stopped"], saved["rec"]
    self.watch.seconds = d["wall"]


def _stack(trees: list):
  """The trees stacked on a new leading axis (the runs axis)."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _same_arrays(trees: list) -> bool:
  """Whether every tree holds the same values (then the runs share one copy)."""
  first = jax.tree.leaves(trees[0])
  return all(len(first) == len(jax.tree.leaves(t)) and all(
      a.shape == b.shape and bool(jnp.array_equal(a, b))
      for a, b in zip(first, jax.tree.leaves(t))) for t in trees[1:])


def _open_checkpoints(cfg, workdir, stack):
  """``(checkpointer, resume step)``; both None without checkpoints."""
  if not (workdir and cfg.checkpoint_every):
    return None, None
  from nbsgd_jax import checkpoint as checkpoint_lib
  ckpt = checkpoint_lib.Checkpointer(workdir)  # every process takes part
  stack.callback(ckpt.close)
  resume = ckpt.latest_step()  # this run's: records_lib.check_workdir refused another's
  if resume is not None:
    if jax.process_index() == 0:
      print(f"resuming from the checkpoint of step {resume} in {ckpt.directory}",
            file=sys.stderr, flush=True)
  return ckpt, resume


def train(cfg: ml_collections.ConfigDict, workdir: Optional[str] = None,
          hooks: tuple = (), *, model=None, data=None) -> dict:
  """Run one training job.

  Writes ``workdir/config.json``, ``workdir/metrics.jsonl`` (one object per evaluation:
  ``step``, ``sim_time`` (s on the simulated cluster, :class:`nbsgd_jax.host.Clock`),
  ``wall_time`` s, ``train_loss``, ``train_batch_loss``, ``test_loss``, ``test_accuracy``,
  ``consensus_distance``, ``bytes_sent`` (bytes per worker, cumulative), ``rounds``
  (communication rounds so far) and, for decentralized recipes, ``worker_test_accuracy``),
  ``workdir/steps.jsonl`` (per step, with consensus control or ``consensus.log_every_step``)
  and ``workdir/summary.json`` (with ``periods`` for periodic recipes, ``steps`` taken and
  ``stopped``: ``"sim_time"`` / ``"train_loss"`` where ``cfg.stop_sim_time`` /
  ``cfg.stop_train_loss`` ended training at an evaluation before ``num_steps``, else None).
  ``wall_time`` counts the training steps (compilation included), not evaluation, hooks or
  host measurements. A config that differs from an earlier run of this process only in its
  hyperparameters compiles nothing (:data:`nbsgd_jax.run.step.PROGRAMS`); a grid of runs is
  :func:`nbsgd_jax.run.sweep.sweep`.

  Args:
    cfg: a config from :func:`nbsgd_jax.config.default_config` (possibly changed), with
      ``sweep`` empty.
    workdir: output directory (created), or None to write nothing.
    hooks: callables ``hook(step, state, setup)`` run on the host before step ``step``
      (0-based; with ``steps_per_dispatch`` k > 1, before each dispatch: the first step of
      each block) with the state after ``step`` steps (and once after the last step, with
      ``step = num_steps``); a hook must not keep ``state`` (its buffers are donated to the
      next step); its time is not counted in ``wall_time``.
    model: your own flax ``nn.Module`` (inputs ``[B, ...]`` to logits ``[B, classes]``, or
      tokens ``[B, T]`` to ``[B, T, vocab]``), trained as the built-in models are; with
      ``config.model="module"``.
    data: your own :class:`nbsgd_jax.data.ArrayDataset` (numpy features and integer labels)
      or :class:`nbsgd_jax.data.TokenDataset`, partitioned (iid / Dirichlet), sampled,
      evaluated and recorded as the built-in data sets are; with ``config.dataset="arrays"``.

  Returns:
    the summary dict (last evaluation plus run facts), with ``history`` (every evaluation);
    when ``workdir`` already holds this run finished, the stored one, read back (nothing is
    trained or written), with ``finished_before: True``.

  Raises:
    ConfigError: bad configuration (a non-empty ``sweep`` included), before anything is
      compiled or written.
    TrainingDiverged: a non-finite loss or model (the last good checkpoint is kept).
  """
  if cfg.get("sweep"):
    raise config_lib.ConfigError([
        f"config.sweep={cfg.sweep!r} is not allowed with train(): a grid of runs is "
        "nbsgd_jax.train.sweep(cfg, workdir) (the command line runs either)"])
  with contextlib.ExitStack() as stack:  # checkpoints and writers closed on any exit
    return _run(cfg, workdir, hooks, stack, model, data)


def prepare(cfg, model=None, data=None, quiet: bool = False) -> tuple:
  """``(setup, host)`` of a config, checked against the model and the data, its warnings
  printed (process 0, unless ``quiet``); nothing is written.

  Raises:
    ConfigError: a bad config (named).
  """
  s = setup_lib.setup(cfg, model=model, data=data)
  fit_warnings = setup_lib.check_model_fit(s)
  host = setup_lib.make_host(s)  # may refuse the config: before any file is touched
  if cfg.tensorboard:
    check_tensorboard()
  if jax.process_index() == 0 and not quiet:
    config_lib.warn_inactive(cfg)
    for line in fit_warnings:
      print(f"warning: {line}", file=sys.stderr)
  return s, host


def open_workdir(cfg, workdir: str) -> Optional[dict]:
  """Make ``workdir`` ready for ``cfg``'s run: its stored summary when it holds this run
  finished (nothing touched), else None after clearing another run (``config.overwrite``)
  and creating it.

  Raises:
    ConfigError: a workdir that cannot be used or holds another run (named).
  """
  finished = records_lib.check_workdir(cfg, workdir)
  if finished is not None:
    return finished
  if jax.process_index() == 0:  # the files of the run there (config.overwrite)
    records_lib.clear_workdir(cfg, workdir)
  records_lib.make_workdir(workdir)
  if jax.process_count() > 1:  # no process opens the checkpoints before they are cleared
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("nbsgd_jax: workdir ready")
  return None


def per_step_records(cfg) -> bool:
  """Whether the run writes ``steps.jsonl``."""
  return bool(cfg.consensus.log_every_step or cfg.consensus.control
              or cfg.cluster.clock == "wall")


def _run(cfg, workdir, hooks, stack, model=None, data=None) -> dict:
  s, host = prepare(cfg, model, data)
  main_process = jax.process_index() == 0
  if workdir:
    finished = open_workdir(cfg, workdir)
    if finished is not None:
      if main_process:
        print(f"workdir {workdir!r} holds this run, finished at step {finished['step']}: "
              "nothing to train (config.overwrite=True trains it again)", file=sys.stderr)
      return {**finished, "finished_before": True}
  ckpt, resume = _open_checkpoints(cfg, workdir, stack)
  records = Records(cfg, workdir if main_process else None, resume, per_step_records(cfg),
                    stack, workdir)
  stepper = Stepper([s], [host])
  (run,) = stepper.attach([records])
  if resume is not None:
    stepper.state, saved = ckpt.restore(resume, stepper.state)
    host.load_state_dict(saved["host"])
    stepper.watch.seconds, run.done = saved["wall"], resume
    run.rec = records.history[-1]
    run.stopped = stop_reason(cfg, run.rec)
  else:
    host.begin(run)
    run.evaluate(0, None)
  bar = stack.enter_context(progress_bar(cfg.num_steps, run.done, cfg.algorithm,
                                         cfg.progress and main_process))

  def save(done):
    ckpt.save(done, stepper.state, {"host": host.state_dict(), "wall": stepper.watch.seconds})

  loop(stepper, bar, ckpt and save, cfg.checkpoint_every, hooks)
  if run.error is not None:
    raise run.error
  return _summary(cfg, s, run, run.rec, run.done, run.stopped)


def progress_bar(total: int, initial: int, desc: str, enabled: bool):
  """The tqdm bar of the training steps."""
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit="step",
              dynamic_ncols=True, mininterval=1.0)


def loop(stepper: Stepper, bar, save=None, checkpoint_every: int = 0, hooks: tuple = ()):
  """Step every run of ``stepper`` to its ``num_steps`` or its stop: dispatches to the next
  evaluation of any run, each run evaluated on its own cadence and stop rules
  (:func:`stop_reason`); ``save(done)`` after an evaluation at a multiple of
  ``checkpoint_every`` and at the end. A run that diverges stops (its error in
  ``run.error``), the others go on.

  Args:
    stepper: the runs (their ``done`` and ``rec`` set: from step 0 after the first
      evaluation, or as a checkpoint left them).
    bar: the progress bar (steps of the slowest run).
    save: ``done -> None``, or None without checkpoints.
    checkpoint_every: steps between checkpoints.
    hooks: ``hook(step, state, setup)`` (one run only).
  """
  runs, watch = stepper.runs, stepper.watch

  def run_hooks(step: int) -> None:
    for hook in hooks:
      watch.off_clock(stepper.state, lambda hook=hook: hook(step, stepper.state,
                                                            stepper.setups[0]))

  watch.resume()
  prev = min(r.done for r in runs)
  while any(r.active for r in runs):
    done = min(r.done for r in runs if r.active)
    run_hooks(done)  # before each dispatch
    due = {r.index: r.next_evaluation() for r in runs if r.active}
    done += stepper.dispatch(done, min(due.values()))
    evaluating = []
    for r in runs:
      if r.active:
        r.done = done
        if due[r.index] == done:
          evaluating.append(r)
    if evaluating:
      watch.pause(stepper.state)
      rec = _evaluate(stepper, evaluating, done)
      if rec is not None:
        bar.set_postfix({k: f"{rec[k]:.4g}" for k in ("train_loss", "test_accuracy", "gap")
                         if k in rec})
      good = [r for r in runs if r.stopped != "diverged"]  # the last good checkpoint stays
      if save is not None and good and (done % checkpoint_every == 0
                                        or not any(r.active for r in runs)):
        save(done)  # the last step too: a re-run is done
      watch.resume()
    bar.update(done - prev)
    prev = done
  watch.pause(stepper.state)
  run_hooks(min(r.done for r in runs))


def _evaluate(stepper: Stepper, evaluating: list, done: int) -> Optional[dict]:
  """Read the pending reports and evaluate the runs at their evaluation step (a run that
  diverges stops, its error in ``run.error``). Returns the first run's record, if any."""
  losses = stepper.flush()
  first = None
  for r in evaluating:
    if r.stopped is not None:  # diverged in the flush
      continue
    try:
      rec = r.evaluate(done, losses[r.index])
    except TrainingDiverged as e:
      r.error, r.stopped = e, "diverged"
      continue
    r.stopped = stop_reason(r.s.cfg, rec)
    first = rec if first is None else first
  return first


def stop_reason(cfg, rec: dict) -> Optional[str]:
  """Why training stops after the evaluation ``rec`` before ``num_steps``: ``"sim_time"``
  (``rec["sim_time"] >= cfg.stop_sim_time`` s), ``"train_loss"`` (``rec["train_loss"] <=
  cfg.stop_train_loss``), or None (go on; a knob at 0 is off)."""
  if cfg.stop_sim_time > 0 and rec["sim_time"] >= cfg.stop_sim_time:
    return "sim_time"
  if cfg.stop_train_loss > 0 and rec["train_loss"] <= cfg.stop_train_loss:
    return "train_loss"
  return None


def _summary(cfg, s, run: Run, rec: dict, steps: int, stopped: Optional[str],
             extra: Optional[dict] = None) -> dict:
  """The last evaluation plus the run's facts (``steps`` taken, ``stopped``: why before
  ``num_steps``, or None; ``extra``); written to ``summary.json``."""
  params = run.state.params  # sizes from shapes: indexing a mesh-sharded worker needs a gather
  periods = {}
  if s.recipe.periodic:
    periods = {"periods": run.host.part("planner").planner.periods}
  wall = run.watch.seconds
  cluster = run.host.part("workload").cluster
  summary = {**rec, "algorithm": cfg.algorithm, "num_workers": cfg.num_workers,
             "backend": cfg.backend, "model": (type(s.model).__name__ if cfg.model == "module" else cfg.model)
                       if s.model is not None else "linear",
             "dataset": cfg.dataset,
             "model_params": int(sum(np.prod(x.shape[1:]) for x in jax.tree.leaves(params))),
             **periods, **s.task.facts,
             "time_per_example": cluster.time_per_example,
             "time_per_example_measured": bool(cfg.cluster.measure_time_per_example),
             "steps": steps, "stopped": stopped,
             "bytes_per_step": rec["bytes_sent"] / steps if steps else 0.0,
             "samples_per_second": (steps * cfg.batch_size * cfg.num_workers / wall
                                    if wall > 0 else None), **(extra or {})}
  run.records.summary(summary)
  summary["history"] = list(run.records.history)
  return summary


summarize = _summary

__all__ = ["Run", "Stepper", "TrainingDiverged", "loop", "train"]
