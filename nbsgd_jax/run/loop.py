"""The training loop: host inputs -> the compiled worker program -> reports back to the host
parts -> evaluation, records and checkpoints on their cadence.

Per-step outputs stay on the device until they are read, in one transfer, at each evaluation
or after a step whose report a host part needs at once (``Host.needs_report``): on the mesh
backend an extra program between in-flight steps can starve XLA:CPU's collective rendezvous.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Optional

import jax
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
  """The state of one run on the host: the set-up, the device state and what reads it."""

  def __init__(self, s: setup_lib.Setup, host, records: Records, watch: Stopwatch):
    self.s, self.host, self.records, self.watch = s, host, records, watch
    self.state = setup_lib.init_state(s)
    # the compiled program of k steps (run/step.py), or the wall clock's step
    self.program = (wallclock.WallClockStep(s, host.part("workload"))
                    if s.cfg.cluster.clock == "wall" else step_lib.Program(s))
    self.pending: list = []  # (steps, inputs, (loss, report), stacked) not yet read
    self.finite_fn = evaluation_lib.make_finite_fn()
    self._smooth_fn = None

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
    return self.watch.off_clock(self.state, lambda: float(task.train_loss(
        self.models(), self.model_states(), task.eval_data)))

  def smoothness(self) -> float:
    """L of the averaged model (Hessian power iteration; the critical target), off the clock."""
    cfg, task = self.s.cfg, self.s.task
    if self._smooth_fn is None:
      self._smooth_fn = jax.jit(lambda params, ms, data: consensus_lib.smoothness_estimate(
          lambda p: task.point_loss(p, evaluation_lib.average_state(ms), data),
          metrics_lib.average_model(params), cfg.consensus.smoothness_iters, cfg.seed)
          + cfg.weight_decay)
    return self.watch.off_clock(self.state, lambda: float(self._smooth_fn(
        self.models(), self.model_states(), task.eval_data)))

  # ---------------------------------------------------------------- the step and its reports

  def dispatch(self, first: int, last: int) -> int:
    """Run steps ``first, first + 1, ...`` before ``last``, at most
    ``config.steps_per_dispatch`` of them, in one dispatch of the compiled program
    (:class:`nbsgd_jax.run.step.Program`; one step when k = 1); a step whose report a host
    part needs at once ends the block, and its reports are read at once (off the clock). The
    host draws each step's inputs in order (the inputs of step t + 1 never depend on step t's
    report unless ``needs_report``). Returns the steps run."""
    k = self.s.cfg.steps_per_dispatch
    steps, inputs = [], []
    for t in range(first, min(first + k, last)):
      steps.append(t)
      inputs.append(self.host.inputs(t, self))
      if self.host.needs_report(t, inputs[-1]):
        break
    keys = tuple(i.period_end for i in inputs)
    self.state, out = self.program(self.state, self.s.worker_data,
                                   self.program.context(inputs), keys, inputs)
    self.pending.append((steps, inputs, out, self.program.stacked))
    if self.host.needs_report(steps[-1], inputs[-1]):
      self.watch.off_clock(self.state, self.flush)
    return len(steps)

  def _pending_steps(self):
    """``(step, inputs, loss [n], report)`` of every pending step, in order (one transfer)."""
    outs = self.s.backend.fetch([out for _, _, out, _ in self.pending])
    for (steps, inputs, _, stacked), out in zip(self.pending, outs):
      if not stacked:
        yield steps[0], inputs[0], *out
        continue
      j = 0
      for loss, report in out:  # one run of steps: [n, m] -> each step's [n]
        for r in range(loss.shape[1]):
          yield steps[j], inputs[j], loss[:, r], {k: v[:, r] for k, v in report.items()}
          j += 1

  def flush(self) -> Optional[float]:
    """Read the pending reports (one transfer): the host parts observe them in order,
    ``steps.jsonl`` gets one line per step. Returns the mean mini-batch loss (None when
    nothing was pending).

    Raises:
      TrainingDiverged: a non-finite step loss.
    """
    losses = []
    for step, inputs, loss, report in self._pending_steps():
      loss = np.asarray(loss, np.float64)
      if not np.all(np.isfinite(loss)):
        raise TrainingDiverged(step + 1, np.flatnonzero(~np.isfinite(loss)).tolist(), "loss")
      fields = self.host.observe(step, inputs, report, self)
      losses.append(loss.mean())
      rec = {"step": step + 1, "train_batch_loss": float(loss.mean())}
      rec.update({k: float(v[0]) for k, v in report.items() if not is_summed(k)})
      self.records.step({**rec, **fields})
    self.pending.clear()
    return float(np.mean(losses)) if losses else None

  def evaluate(self, step: int) -> dict:
    """The evaluation record after ``step`` steps (written to the records).

    Raises:
      TrainingDiverged: a non-finite model or loss of the averaged model.
    """
    batch_loss = self.flush()
    params = self.models()
    finite = np.asarray(self.finite_fn(params))
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
    return rec


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
  host measurements.

  Args:
    cfg: a config from :func:`nbsgd_jax.config.default_config` (possibly changed).
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
    ConfigError: bad configuration, before anything is compiled or written.
    TrainingDiverged: a non-finite loss or model (the last good checkpoint is kept).
  """
  with contextlib.ExitStack() as stack:  # checkpoints and writers closed on any exit
    return _run(cfg, workdir, hooks, stack, model, data)


def _run(cfg, workdir, hooks, stack, model=None, data=None) -> dict:
  from tqdm.auto import tqdm
  s = setup_lib.setup(cfg, model=model, data=data)
  fit_warnings = setup_lib.check_model_fit(s)
  host = setup_lib.make_host(s)  # may refuse the config: before any file is touched
  if cfg.tensorboard and workdir:
    check_tensorboard()
  main_process = jax.process_index() == 0
  if main_process:
    config_lib.warn_inactive(cfg)
    for line in fit_warnings:
      print(f"warning: {line}", file=sys.stderr)
  if workdir:
    finished = records_lib.check_workdir(cfg, workdir)
    if finished is not None:
      if main_process:
        print(f"workdir {workdir!r} holds this run, finished at step {finished['step']}: "
              "nothing to train (config.overwrite=True trains it again)", file=sys.stderr)
      return {**finished, "finished_before": True}
    if main_process:  # the files of the run there (config.overwrite)
      records_lib.clear_workdir(cfg, workdir)
    records_lib.make_workdir(workdir)
    if jax.process_count() > 1:  # no process opens the checkpoints before they are cleared
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("nbsgd_jax: workdir ready")
  ckpt, resume = _open_checkpoints(cfg, workdir, stack)
  per_step = (cfg.consensus.log_every_step or cfg.consensus.control
              or cfg.cluster.clock == "wall")
  records = Records(cfg, workdir if main_process else None, resume, per_step, stack, workdir)
  watch = Stopwatch()
  run = Run(s, host, records, watch)
  start = 0
  if resume is not None:
    run.state, saved = ckpt.restore(resume, run.state)
    host.load_state_dict(saved["host"])
    watch.seconds, start = saved["wall"], resume
    rec = records.history[-1]
  else:
    host.begin(run)
    rec = run.evaluate(0)
  bar = stack.enter_context(tqdm(
      total=cfg.num_steps, initial=start, disable=not cfg.progress or not main_process,
      desc=cfg.algorithm, unit="step", dynamic_ncols=True, mininterval=1.0))

  def run_hooks(step: int) -> None:
    for hook in hooks:
      watch.off_clock(run.state, lambda hook=hook: hook(step, run.state, s))

  watch.resume()
  done, stopped = start, (stop_reason(cfg, rec) if start else None)  # a resumed run
  while done < cfg.num_steps and stopped is None:
    run_hooks(done)  # before each dispatch
    step = done
    done += run.dispatch(step, min((step // cfg.eval_every + 1) * cfg.eval_every,
                                   cfg.num_steps))
    if done % cfg.eval_every == 0 or done == cfg.num_steps:
      watch.pause(run.state)
      rec = run.evaluate(done)
      bar.set_postfix({k: f"{rec[k]:.4g}" for k in ("train_loss", "test_accuracy", "gap")
                       if k in rec})
      stopped = stop_reason(cfg, rec)
      if ckpt is not None and (done % cfg.checkpoint_every == 0 or done == cfg.num_steps
                               or stopped is not None):  # the last step too: a re-run is done
        ckpt.save(done, run.state, {"host": host.state_dict(), "wall": watch.seconds})
      watch.resume()
    bar.update(done - step)
  watch.pause(run.state)
  run_hooks(done)
  return _summary(cfg, s, run, rec, done, stopped)


def stop_reason(cfg, rec: dict) -> Optional[str]:
  """Why training stops after the evaluation ``rec`` before ``num_steps``: ``"sim_time"``
  (``rec["sim_time"] >= cfg.stop_sim_time`` s), ``"train_loss"`` (``rec["train_loss"] <=
  cfg.stop_train_loss``), or None (go on; a knob at 0 is off)."""
  if cfg.stop_sim_time > 0 and rec["sim_time"] >= cfg.stop_sim_time:
    return "sim_time"
  if cfg.stop_train_loss > 0 and rec["train_loss"] <= cfg.stop_train_loss:
    return "train_loss"
  return None


def _summary(cfg, s, run: Run, rec: dict, steps: int, stopped: Optional[str]) -> dict:
  """The last evaluation plus the run's facts (``steps`` taken, ``stopped``: why before
  ``num_steps``, or None); written to ``summary.json``."""
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
                                    if wall > 0 else None)}
  run.records.summary(summary)
  summary["history"] = list(run.records.history)
  return summary


__all__ = ["Run", "TrainingDiverged", "train"]

