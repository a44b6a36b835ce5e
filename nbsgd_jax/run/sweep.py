"""A sweep: the runs of ``config.sweep`` trained as few programs as their structures allow
(:mod:`nbsgd_jax.run.grid` reads the grid and groups it).

Each group of runs that share a structure is ONE program on the simulate backend
(``config.sweep_runs="stacked"``, the default on a GPU or TPU): the runs stacked on a runs
axis outside the worker axis (``jax.vmap`` over the workers' ``vmap``), each run with its own
hyperparameters, seed, data order, host parts (clock, stragglers, Non-blocking counts,
failures, periods, consensus targets) and records. On a CPU (``"auto"``, ``"in_turn"``), on
the mesh and on the multihost backends the runs of a group go one after another, and from
the second on compile nothing (:data:`nbsgd_jax.run.step.PROGRAMS`): a CPU's step time grows
with the runs stacked, and a mesh's devices already hold the workers.

``WORKDIR/sweep.json`` lists the runs and their groups; ``WORKDIR/<run>/`` holds each run's
``config.json``, ``metrics.jsonl``, ``summary.json`` as :func:`nbsgd_jax.run.loop.train`
writes them; ``WORKDIR/groups/<i>/checkpoints`` a group's checkpoints (its stacked state and
every run's host state), from which the same command resumes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Optional

import jax
import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax.run import grid as sweeps_lib
from nbsgd_jax.run import loop as loop_lib


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
  return _train(sweeps_lib.expand(cfg), workdir, cfg.sweep, model, data)


def train_runs(cfgs: list, workdir: Optional[str] = None, names: Optional[list] = None, *,
               hooks: Optional[list] = None, model=None, data=None) -> list[dict]:
  """Train a list of configs as :func:`sweep` trains a grid's runs: grouped by structure,
  each group one program (a study whose runs are not a product of axes: seeds with their
  own stopping budgets, cells of a grid, the steps of a tuning).

  Args:
    cfgs: the runs' configs (each with ``sweep`` empty).
    workdir: ``WORKDIR/<name>/`` per run (module docstring), or None to write nothing.
    names: the runs' directory names (default ``run0``, ``run1``, ...).
    hooks: per config, a tuple of ``hook(step, state, setup)`` called with that run's state
      (:func:`~nbsgd_jax.run.loop.train`'s ``hooks``; in a stacked group, the run's slice).

  Returns:
    the runs' summaries, in order (as :func:`sweep`'s).

  Raises:
    ConfigError: a refused config (named with its run), before anything is written.
  """
  names = names or [f"run{i}" for i in range(len(cfgs))]
  if len(set(names)) != len(names) or len(names) != len(cfgs):
    raise ValueError(f"names={names!r} is not allowed: one distinct name per config")
  if hooks is not None and len(hooks) != len(cfgs):
    raise ValueError(f"hooks has {len(hooks)} entries for {len(cfgs)} configs: one tuple "
                     "per config is allowed")
  runs = []
  for name, c in zip(names, cfgs):
    try:
      config_lib.validate(c)
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError([f"run {name}: {line}" for line in e.errors]) from None
    runs.append(sweeps_lib.Run(name, {}, c))
  return _train(runs, workdir, None, model, data, dict(zip(names, hooks or ())))


def _train(runs: list, workdir: Optional[str], grid: Optional[str], model, data,
           hooks: Optional[dict] = None) -> list:
  """The runs trained group by group (:func:`sweep`, :func:`train_runs`)."""
  if not runs:
    return []
  cfg = runs[0].cfg
  parts = [loop_lib.prepare(run.cfg, model, data, quiet=i > 0) for i, run in enumerate(runs)]
  stacked = stacks(cfg)
  alone = lambda i: not stacked or runs[i].cfg.backend != "simulate" or parts[i][1].own_plan()
  index = sweeps_lib.groups(runs, model, data, alone=alone)
  groups = [[runs[i] for i in g] for g in index]
  prepared = [[parts[i] for i in g] for g in index]
  if workdir:
    _write_index(grid, workdir, groups)
  total = sum(max(run.cfg.num_steps for run in group) for group in groups)
  done: dict = {}
  with loop_lib.progress_bar(total, 0, f"{cfg.algorithm}: {len(runs)} runs",
                             cfg.progress and jax.process_index() == 0) as bar:
    for i, (group, parts_i) in enumerate(zip(groups, prepared)):
      bar.set_description(progress_text(group[0].cfg.algorithm, sum(map(len, groups[:i])),
                                        len(group), len(runs)))
      with contextlib.ExitStack() as stack:
        done.update(_group(group, parts_i, workdir, i, bar, stack, hooks or {}))
  return [{**done[run.name], "run": run.name, "overrides": run.overrides} for run in runs]


def progress_text(algorithm: str, before: int, size: int, total: int) -> str:
  """The sweep's progress bar text while a group trains, counting runs (``docs/guide.md``,
  "Sweeps": the runs of a group share one program): ``"dpsgd: run 3 of 8"`` for a group of
  one run (the runs one after another, a CPU's way), ``"dpsgd: runs 5-8 of 8 (one program)"``
  for a group of several stacked; ``before`` runs were trained before this group's ``size``,
  of ``total``."""
  if size == 1:
    return f"{algorithm}: run {before + 1} of {total}"
  return f"{algorithm}: runs {before + 1}-{before + size} of {total} (one program)"


def stacks(cfg) -> bool:
  """Whether the runs of a group share one program (``config.sweep_runs``; ``"auto"``: on a
  GPU or TPU, where one run seldom fills the device; on a CPU a step's time grows with the
  runs stacked, so runs in turn, each compiling nothing after the first, are faster:
  ``docs/results.md``, "Sweeps")."""
  mode = cfg.get("sweep_runs", "auto")
  return mode == "stacked" or (mode == "auto" and jax.default_backend() != "cpu")


def _write_index(grid: Optional[str], workdir: str, groups: list) -> None:
  """``WORKDIR/sweep.json``: the grid, its runs and their groups."""
  os.makedirs(workdir, exist_ok=True)
  index = {"sweep": grid, "runs": [
      {"name": run.name, "overrides": run.overrides, "group": i}
      for i, group in enumerate(groups) for run in group], "groups": len(groups)}
  if jax.process_index() == 0:
    files_lib.atomic_write(os.path.join(workdir, "sweep.json"),
                           json.dumps(index, indent=2, default=str))


def _group(group: list, parts: list, workdir: Optional[str], index: int, bar,
           stack: contextlib.ExitStack, hooks: dict) -> dict:
  """Train one group (one program, :func:`~nbsgd_jax.run.loop.drive`); ``{run name:
  summary}``."""
  dirs = [os.path.join(workdir, run.name) if workdir else None for run in group]
  gdir = os.path.join(workdir, "groups", str(index)) if workdir else None
  start = bar.n
  summaries, runs = loop_lib.drive([run.cfg for run in group], parts, dirs, gdir, stack,
                                   [tuple(hooks.get(run.name, ())) for run in group], bar=bar)
  if runs is None and jax.process_index() == 0:
    print(f"sweep group {index}: every run finished before: nothing to train",
          file=sys.stderr)
  bar.update(start + max(run.cfg.num_steps for run in group) - bar.n)  # the group's share
  return {run.name: summary for run, summary in zip(group, summaries)}


__all__ = ["sweep", "train_runs"]
