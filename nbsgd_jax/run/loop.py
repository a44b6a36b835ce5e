"""The training loop: host inputs -> the compiled worker program -> reports back to the host
parts -> evaluation, records and checkpoints on their cadence.

One :class:`~nbsgd_jax.run.stepper.Stepper` drives ``R >= 1`` runs of one structure (a sweep's group,
:mod:`nbsgd_jax.run.sweep`; :func:`train` is the case ``R = 1``): each run keeps its own
host parts and records (:class:`Run`), the device holds their states stacked on a runs axis
and steps them in one program. Per-step outputs stay on the device until they are read, in
one transfer, at each evaluation or after a step whose report a host part needs at once
(``Host.needs_report``): on the mesh backend an extra program between in-flight steps can
starve XLA:CPU's collective rendezvous.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from typing import Optional, Sequence

import jax
import ml_collections
import numpy as np

from nbsgd_jax import config as config_lib
from nbsgd_jax.run import naming
from nbsgd_jax.run import records as records_lib
from nbsgd_jax.run import setup as setup_lib
from nbsgd_jax.run.evaluation import TrainingDiverged
from nbsgd_jax.run.records import Records, check_tensorboard
from nbsgd_jax.run.stepper import Run, Stepper


def open_checkpoints(cfg, workdir, stack, like):
  """``(checkpointer, resume step, state, saved host JSON)`` of the newest checkpoint that
  can be read whole (:meth:`~nbsgd_jax.core.checkpoint.Checkpointer.restore_newest`: each
  damaged one is one ``warning:`` line and is moved aside); ``(checkpointer, None, like,
  None)`` for a new run and ``(None, None, like, None)`` without checkpoints. Nothing in
  the workdir is cut back before this.

  Raises:
    ConfigError: checkpoints that exist but none can be read (named).
  """
  if not (workdir and cfg.checkpoint_every):
    return None, None, like, None
  from nbsgd_jax.core import checkpoint as checkpoint_lib
  ckpt = checkpoint_lib.Checkpointer(workdir)  # every process takes part
  stack.callback(ckpt.close)
  main = jax.process_index() == 0
  warn = lambda line: main and print(f"warning: {line}", file=sys.stderr, flush=True)
  try:  # this run's checkpoints: records_lib.check_workdir refused another's
    resume, state, saved = ckpt.restore_newest(like, warn, move_aside=main)
  except checkpoint_lib.Unreadable as e:
    raise config_lib.ConfigError([str(e)]) from None
  if resume is not None and main:
    print(f"resuming from the checkpoint of step {resume} in {ckpt.directory}",
          file=sys.stderr, flush=True)
  return ckpt, resume, state, saved


def train(cfg: ml_collections.ConfigDict, workdir: Optional[str] = None,
          hooks: tuple = (), *, model=None, data=None) -> dict:
  """Run one training job.

  Writes ``workdir/config.json``, ``workdir/metrics.jsonl`` (one object per evaluation:
  ``step``, ``sim_time`` (s on the simulated cluster, :class:`nbsgd_jax.host.Clock`),
  ``grads_per_worker`` (the workers' mean gradient computations so far: the unit of
  ``num_steps`` with ``config.budget_unit = "grads_per_worker"``),
  ``wall_time`` s, ``train_loss``, ``train_batch_loss``, ``test_loss``, ``test_accuracy``,
  ``consensus_distance``, ``bytes_sent`` (bytes per worker, cumulative), ``rounds``
  (communication rounds so far) and, for decentralized recipes, ``worker_test_accuracy``),
  ``workdir/steps.jsonl`` (per step, with consensus control or ``consensus.log_every_step``)
  and ``workdir/summary.json`` (with ``periods`` for periodic recipes, ``steps`` taken and
  ``stopped``: ``"sim_time"`` / ``"train_loss"`` / ``"step"`` where ``cfg.stop_sim_time`` /
  ``cfg.stop_train_loss`` / ``cfg.stop_step`` ended training at an evaluation before
  ``num_steps``, else None).
  ``wall_time`` counts the training steps (compilation included), not evaluation, hooks or
  host measurements; ``summary.json``'s ``run_seconds`` the whole ``train()`` of this process
  (set-up, compilation, steps, evaluations, checkpoints). A config that differs from an earlier run of this process only in its
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


def open_workdir(cfg, workdir: str, stack: contextlib.ExitStack) -> Optional[dict]:
  """Make ``workdir`` ready for ``cfg``'s run: its lock taken first (the main process,
  held until ``stack`` closes: :func:`~nbsgd_jax.run.records.lock_workdir`); its stored
  summary when it holds this run finished (nothing else touched), else None after clearing
  another run (``config.overwrite``) and creating it.

  Raises:
    ConfigError: a workdir that cannot be used, is in use by another process or holds
      another run (named).
  """
  if jax.process_index() == 0:
    records_lib.lock_workdir(workdir, stack)
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
  start = time.perf_counter()
  parts = [prepare(cfg, model, data)]
  (summary,), runs = drive([cfg], parts, [workdir], workdir, stack, [tuple(hooks)],
                           raise_errors=True,
                           extra=lambda: {"run_seconds": time.perf_counter() - start})
  if runs is None and jax.process_index() == 0:
    print(f"workdir {workdir!r} holds this run, finished at step {summary['step']}: "
          "nothing to train (config.overwrite=True trains it again)", file=sys.stderr)
  return summary


def drive(cfgs: list, parts: list, dirs: list, checkpoints: Optional[str],
          stack: contextlib.ExitStack, hooks: Sequence[tuple] = (), bar=None,
          raise_errors: bool = False, extra=None) -> tuple:
  """The one driver of training: runs of one structure stepped by one
  :class:`~nbsgd_jax.run.stepper.Stepper` (:func:`train` is one run, a sweep's group
  (:mod:`nbsgd_jax.run.sweep`) several): each run's workdir opened (its lock, a finished run
  read back, another run's files cleared), the checkpoints opened and resumed, the records
  attached, the loop run and every run summarised.

  Args:
    cfgs, parts: the runs' configs and ``(setup, host)`` (:func:`prepare`).
    dirs: each run's records directory, or None to write nothing.
    checkpoints: the checkpoint directory of the runs (one stacked state), or None.
    stack: closes the checkpoints, writers and locks on any exit.
    hooks: per run, a tuple of ``hook(step, state, setup)`` (:func:`train`).
    bar: the progress bar to advance (a sweep's), or None for one of the run's own.
    raise_errors: raise a run's :class:`TrainingDiverged` (before its summary is written)
      instead of recording it in the summary.
    extra: ``() -> dict`` of facts added to each summary when it is made, or None.

  Returns:
    ``(summaries, runs)``: one summary per run, in order, and the :class:`Run` s; when every
    run's directory holds it finished, its stored summaries (``finished_before: True``) and
    None (nothing trained or written).

  Raises:
    ConfigError: a workdir or checkpoint that cannot be used (named); TrainingDiverged (with
      ``raise_errors``).
  """
  main = jax.process_index() == 0
  finished = [open_workdir(c, d, stack) if d else None for c, d in zip(cfgs, dirs)]
  if all(f is not None for f in finished):
    return [{**f, "finished_before": True} for f in finished], None
  if checkpoints and checkpoints not in dirs and cfgs[0].overwrite and main \
      and os.path.isdir(checkpoints):  # a group's own checkpoints: the group starts again
    shutil.rmtree(checkpoints)
  stepper = Stepper([p[0] for p in parts], [p[1] for p in parts], hooked=any(hooks))
  ckpt, resume, stepper.state, saved = open_checkpoints(cfgs[0], checkpoints, stack,
                                                        stepper.full_state())
  saved = _upgrade(cfgs[0], resume, saved)
  kept = [None] * len(cfgs) if saved is None else [r.get("records") for r in saved["runs"]]
  records = [Records(c, d if main else None, resume, per_step_records(c), stack, d, mine)
             for c, d, mine in zip(cfgs, dirs, kept)]
  runs = stepper.attach(records)
  if resume is not None:
    stepper.load_state_dict(saved)
  else:
    for run in runs:
      run.host.begin(run)
      run.evaluate(0, None)
  if bar is None:
    bar = stack.enter_context(progress_bar(runs[0].num_steps, runs[0].done,
                                           naming.algorithm_as_run(cfgs[0]),
                                           cfgs[0].progress and main))
  save = ckpt and (lambda step: ckpt.save(step, stepper.full_state(), stepper.state_dict()))
  loop(stepper, bar, save, cfgs[0].checkpoint_every, [tuple(h) for h in hooks])
  if raise_errors:
    for run in runs:
      if run.error is not None:
        raise run.error
  return [summarize(c, r.s, r, r.rec, r.done, r.stopped,
                    {**({"error": str(r.error)} if r.error is not None else {}),
                     **(extra() if extra else {})}) for c, r in zip(cfgs, runs)], runs


def _upgrade(cfg, resume: Optional[int], saved: Optional[dict]) -> Optional[dict]:
  """A checkpoint's host JSON in the driver's form (``{"runs": [...], "wall", "members"}``);
  a one-run checkpoint of the earlier form (``{"host", "wall", "records"}``) converted."""
  if saved is None or "runs" in saved:
    return saved
  rec = saved["records"][-1]
  return {"runs": [{"host": saved["host"], "done": resume, "stopped": stop_reason(cfg, rec),
                    "rec": rec, "records": saved["records"]}],
          "wall": saved["wall"], "members": [0]}


def progress_bar(total: int, initial: int, desc: str, enabled: bool):
  """The tqdm bar of the training steps."""
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit="step",
              dynamic_ncols=True, mininterval=1.0)


def loop(stepper: Stepper, bar, save=None, checkpoint_every: int = 0,
         hooks: Sequence[tuple] = ()):
  """Step every run of ``stepper`` to its last step (:attr:`~nbsgd_jax.run.stepper.Run.
  num_steps`: ``num_steps``, or the steps that reach its budget in gradient computations per
  worker) or its stop: dispatches to the next
  evaluation of any run, each run evaluated on its own cadence and stop rules
  (:func:`stop_reason`); ``save(done)`` after an evaluation at a multiple of
  ``checkpoint_every`` and at the end. A run that diverges stops (its error in
  ``run.error``), the others go on.

  Args:
    stepper: the runs (their ``done`` and ``rec`` set: from step 0 after the first
      evaluation, or as a checkpoint left them).
    bar: the progress bar (steps of the slowest run).
    save: ``done -> None``, or None without checkpoints.
    checkpoint_every: steps between checkpoints (with a budget, gradient computations per
      worker: :meth:`~nbsgd_jax.run.stepper.Run.checkpoint_due`).
    hooks: per run, a tuple of ``hook(step, state, setup)`` (:func:`train`) called with
      that run's state and set-up (empty: none).
  """
  runs, watch = stepper.runs, stepper.watch

  def run_hooks(step: int, which) -> None:
    for r in sorted(which):
      for hook in hooks[r] if r < len(hooks) else ():
        watch.off_clock(stepper.state, lambda hook=hook, r=r: hook(
            step, stepper.state_of(r), stepper.setups[r]))

  watch.resume()
  prev = min(r.done for r in runs)
  while any(r.active for r in runs):
    done = min(r.done for r in runs if r.active)
    run_hooks(done, {r.index for r in runs if r.active})  # before each dispatch
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
      stepper.compact()
      good = [r for r in runs if r.stopped != "diverged"]  # the last good checkpoint stays
      if save is not None and good and (any(r.checkpoint_due(done, checkpoint_every)
                                            for r in evaluating)
                                        or not any(r.active for r in runs)):
        save(done)  # the last step too: a re-run is done
      watch.resume()
    bar.update(done - prev)
    prev = done
  watch.pause(stepper.state)
  for r in runs:
    run_hooks(r.done, {r.index})


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
  cfg.stop_train_loss``), ``"step"`` (``rec["step"] >= cfg.stop_step``: a prefix of the
  run), or None (go on; a knob at 0 is off)."""
  if cfg.stop_sim_time > 0 and rec["sim_time"] >= cfg.stop_sim_time:
    return "sim_time"
  if cfg.stop_train_loss > 0 and rec["train_loss"] <= cfg.stop_train_loss:
    return "train_loss"
  if cfg.stop_step > 0 and rec["step"] >= cfg.stop_step:
    return "step"
  return None


def summarize(cfg, s, run: Run, rec: dict, steps: int, stopped: Optional[str],
             extra: Optional[dict] = None) -> dict:
  """The last evaluation plus the run's facts (``steps`` taken, ``stopped``: why before
  ``num_steps``, or None; ``extra``); written to ``summary.json``."""
  params = run.state.params  # sizes from shapes: indexing a mesh-sharded worker needs a gather
  periods = {}
  if s.recipe.periodic:
    periods = {"periods": run.host.part("planner").planner.periods}
  wall = run.watch.seconds
  cluster = run.host.part("workload").cluster
  summary = {**rec, "algorithm": cfg.algorithm,
             "algorithm_as_run": naming.algorithm_as_run(cfg), "num_workers": cfg.num_workers,
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


__all__ = ["Run", "Stepper", "TrainingDiverged", "drive", "loop", "train"]
