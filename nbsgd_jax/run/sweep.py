"""A sweep: the runs of ``config.sweep`` trained as few programs as their structures allow
(:mod:`nbsgd_jax.sweeps` reads the grid and groups it).

Each group of runs that share a structure is ONE program on the simulate backend: the runs
stacked on a runs axis outside the worker axis (``jax.vmap`` over the workers' ``vmap``),
each run with its own hyperparameters, seed, data order, host parts (clock, stragglers,
Non-blocking counts, failures, periods, consensus targets) and records. On the mesh and
multihost backends the devices already hold the workers: the runs of a group go one after
another, and from the second on compile nothing (:data:`nbsgd_jax.run.step.PROGRAMS`).

``WORKDIR/sweep.json`` lists the runs and their groups; ``WORKDIR/<run>/`` holds each run's
``config.json``, ``metrics.jsonl``, ``summary.json`` as :func:`nbsgd_jax.run.loop.train`
writes them; ``WORKDIR/groups/<i>/checkpoints`` a group's checkpoints (its stacked state and
every run's host state), from which the same command resumes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from typing import Optional

import jax
import ml_collections

from nbsgd_jax import files as files_lib
from nbsgd_jax import sweeps as sweeps_lib
from nbsgd_jax.run import loop as loop_lib
from nbsgd_jax.run.records import Records


def sweep(cfg: ml_collections.ConfigDict, workdir: Optional[str] = None, *, model=None,
          data=None) -> list[dict]:
  """Train every run of the grid ``cfg.sweep`` (``docs/guide.md``, "Sweeps").

  Args:
    cfg: the sweep's config: every run is ``cfg`` with its axes' values.
    workdir: the sweep's directory (module docstring), or None to write nothing.
    model, data: your own module / data set, for every run (as :func:`~nbsgd_jax.run.loop.
      train`).

  Returns:
    the runs' summaries in grid order (each as ``train`` returns it, with ``run``: its name
    and ``overrides``); a run that diverged has ``stopped: "diverged"`` and ``error``, its
    last good evaluation as its figures, and the others went on.

  Raises:
    ConfigError: a bad grid or a run whose config is refused (named), before anything is
      written.
  """
  runs = sweeps_lib.expand(cfg)
  parts = [loop_lib.prepare(run.cfg, model, data, quiet=i > 0) for i, run in enumerate(runs)]
  alone = lambda i: cfg.backend != "simulate" or parts[i][1].own_plan()  # mesh: in turn
  index = sweeps_lib.groups(runs, model, data, alone=alone)
  groups = [[runs[i] for i in g] for g in index]
  prepared = [[parts[i] for i in g] for g in index]
  if workdir:
    _write_index(cfg, workdir, groups)
  total = sum(max(run.cfg.num_steps for run in group) for group in groups)
  done: dict = {}
  with loop_lib.progress_bar(total, 0, f"{cfg.algorithm} sweep of {len(runs)}",
                             cfg.progress and jax.process_index() == 0) as bar:
    for i, (group, parts) in enumerate(zip(groups, prepared)):
      bar.set_description(f"{cfg.algorithm} sweep: group {i + 1}/{len(groups)} "
                          f"({len(group)} runs)")
      with contextlib.ExitStack() as stack:
        done.update(_group(group, parts, workdir, i, bar, stack))
  return [{**done[run.name], "run": run.name, "overrides": run.overrides} for run in runs]


def _write_index(cfg, workdir: str, groups: list) -> None:
  """``WORKDIR/sweep.json``: the grid, its runs and their groups."""
  os.makedirs(workdir, exist_ok=True)
  index = {"sweep": cfg.sweep, "runs": [
      {"name": run.name, "overrides": run.overrides, "group": i}
      for i, group in enumerate(groups) for run in group], "groups": len(groups)}
  if jax.process_index() == 0:
    files_lib.atomic_write(os.path.join(workdir, "sweep.json"),
                           json.dumps(index, indent=2, default=str))


def _group(group: list, parts: list, workdir: Optional[str], index: int, bar,
           stack: contextlib.ExitStack) -> dict:
  """Train one group (one program); ``{run name: summary}``."""
  main = jax.process_index() == 0
  dirs = [os.path.join(workdir, run.name) if workdir else None for run in group]
  cfg0 = group[0].cfg
  gdir = os.path.join(workdir, "groups", str(index)) if workdir else None
  finished = [loop_lib.open_workdir(run.cfg, d) if d else None for run, d in zip(group, dirs)]
  if all(f is not None for f in finished):
    if main:
      print(f"sweep group {index}: every run finished before: nothing to train",
            file=sys.stderr)
    bar.update(max(run.cfg.num_steps for run in group))
    return {run.name: {**f, "finished_before": True} for run, f in zip(group, finished)}
  if gdir and cfg0.overwrite and main and os.path.isdir(gdir):  # the group starts again
    shutil.rmtree(gdir)
  ckpt, resume = loop_lib._open_checkpoints(cfg0, gdir, stack)
  records = [Records(run.cfg, d if main else None, resume, loop_lib.per_step_records(run.cfg),
                     stack, d) for run, d in zip(group, dirs)]
  stepper = loop_lib.Stepper([s for s, _ in parts], [h for _, h in parts])
  runs = stepper.attach(records)
  if resume is not None:
    stepper.state, saved = ckpt.restore(resume, stepper.state)
    stepper.load_state_dict(saved)
  else:
    for run in runs:
      run.host.begin(run)
      run.evaluate(0, None)
  start = bar.n
  save = ckpt and (lambda step: ckpt.save(step, stepper.state, stepper.state_dict()))
  loop_lib.loop(stepper, bar, save, cfg0.checkpoint_every)
  bar.update(start + max(run.cfg.num_steps for run in group) - bar.n)  # the group's share
  out = {}
  for run, r in zip(group, runs):
    summary = loop_lib.summarize(run.cfg, r.s, r, r.rec, r.done, r.stopped,
                                 {"error": str(r.error)} if r.error is not None else {})
    out[run.name] = summary
  return out


__all__ = ["sweep"]
