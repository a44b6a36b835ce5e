"""A sweep's report: mean +- std over seeds, per cell of the grid.

    python -m nbsgd_jax.report runs/sweep [--out runs/sweep/report]

A sweep directory is what :func:`nbsgd_jax.train.sweep` writes (``nbsgd_jax/run/sweep.py``):
``sweep.json`` (``{"sweep": the grid, "runs": [{"name", "overrides", "group"}], "groups"}``)
and ``<run>/`` per run with ``metrics.jsonl`` (one evaluation per line; a torn last line is
skipped) and, once the run has finished, ``summary.json``. A *cell* is a point of the grid
without its ``seed`` axis: the runs that differ only in ``seed``. Per cell, the table gives
mean +- sample standard deviation (``ddof=1``) over the cell's finished seeds of the final
and best values of each run (:data:`COLUMNS`); a cell with one finished seed shows its value
alone (no spread is measured: no std is shown). A run that diverged (``"stopped":
"diverged"``) or has no ``summary.json`` (in progress, or crashed) is listed and left out of
the statistics. ``report.md`` also says which code made the runs: the commit and JAX version
of each run's provenance (:mod:`nbsgd_jax.core.provenance`, ``summary.json``'s, else
``config.json``'s), with a count per commit when they differ.

``OUT`` (default ``SWEEP_DIR/report``) receives ``report.md`` and
``loss_accuracy_vs_{sim_time,step}.png``: training loss (log scale) and test accuracy, one
band per cell (its mean over seeds as a line, +- one std as a shaded band; a line alone with
one seed). The seeds of a cell are matched by evaluation step (the steps every finished seed
evaluated); against simulated time a step is drawn at its mean over the seeds. Files are
written atomically, as :mod:`nbsgd_jax.report` writes them; this module reads files only (no
jax), like it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib

INDEX = "sweep.json"
SEED = "seed"  # the axis averaged over
DEFAULT_OUT = "report"  # OUT under the sweep directory
ALL_RUNS = "(all runs)"  # the cell of a grid whose only axis is the seed
NO_PROVENANCE = "no provenance (recorded before it existed)"
MIXED = "mixed: the runs were made by different code"
CURVES = (("train_loss", "training loss (averaged model)"), ("test_accuracy", "test accuracy"))
X_AXES = (("sim_time", "simulated time (s)"), ("step", "step"))


class Column(NamedTuple):
  """A column of the table: ``reduce`` (``"final"``, ``"max"``, ``"min"``) of the metrics key
  ``key`` over a run's evaluations, times ``scale``, shown with ``spec``."""
  name: str
  key: str
  reduce: str
  scale: float
  header: str
  spec: str


COLUMNS = (
    Column("final_test_accuracy", "test_accuracy", "final", 1.0, "final test acc", ".4f"),
    Column("best_test_accuracy", "test_accuracy", "max", 1.0, "best test acc", ".4f"),
    Column("final_test_loss", "test_loss", "final", 1.0, "final test loss", ".4g"),
    Column("min_test_loss", "test_loss", "min", 1.0, "min test loss", ".4g"),
    Column("final_train_loss", "train_loss", "final", 1.0, "final train loss", ".4g"),
    Column("min_train_loss", "train_loss", "min", 1.0, "min train loss", ".4g"),
    Column("sim_time", "sim_time", "final", 1.0, "sim time (s)", ".4g"),
    Column("mb_sent", "bytes_sent", "final", 1e-6, "MB sent / worker", ".4g"),
)


class Stat(NamedTuple):
  """A column's value over a cell's seeds: ``mean``; ``std`` the sample standard deviation
  (``ddof=1``), None with one seed (not measured, never 0); ``n`` the seeds."""
  mean: float
  std: Optional[float]
  n: int


class Curve(NamedTuple):
  """A metric over a cell's seeds, per evaluation step that every seed has (E steps):
  ``step`` [E] int, ``sim_time`` [E] the seeds' mean simulated time at that step (s),
  ``mean`` [E] and ``std`` [E] (``ddof=1``; None with one seed) of the metric."""
  step: np.ndarray
  sim_time: np.ndarray
  mean: np.ndarray
  std: Optional[np.ndarray]


class Cell(NamedTuple):
  """A cell of the grid (its runs differ only in ``seed``).

  Attributes:
    name: its axes but ``seed``, ``key=value, ...`` (:data:`ALL_RUNS` when only seeds vary).
    overrides: ``{dotted key: value}`` of those axes.
    runs: every run of the cell (directory names, grid order).
    used: the finished runs, those in the statistics.
    left_out: ``(run, reason)`` of the others (diverged; no ``summary.json``; no directory).
    stats: ``{Column.name: Stat}``, None where a finished seed lacks the value or none
      finished.
    curves: ``{metrics key: Curve}`` of :data:`CURVES`, for those the seeds have.
    made_by: the provenance (dict, or None: recorded before it existed) of each run that has
      a directory, in grid order (:func:`made_by`).
  """
  name: str
  overrides: dict
  runs: tuple
  used: tuple
  left_out: tuple
  stats: dict
  curves: dict
  made_by: tuple = ()


# ----------------------------------------------------------------------------- reading


def _num(x: Any) -> Optional[float]:
  """A finite float, or None (null, NaN, inf, not a number)."""
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    return None
  return float(x) if math.isfinite(x) else None


class Index(NamedTuple):
  """``SWEEP_DIR/sweep.json``: ``grid`` the sweep's ``config.sweep`` text; ``runs``
  ``[{"name", "overrides", ...}]`` in grid order."""
  grid: str
  runs: list


def load_index(sweep_dir: str) -> Index:
  """Read ``SWEEP_DIR/sweep.json``.

  Raises:
    ValueError: no ``sweep.json``, an unreadable one, one without runs, or one written by
      ``train_runs`` (no grid: its runs are not seeds of cells).
  """
  path = os.path.join(sweep_dir, INDEX)
  try:
    with open(path) as f:
      index = json.load(f)
  except FileNotFoundError:
    raise ValueError(f"{sweep_dir} is not a sweep directory (no {INDEX})") from None
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} is unreadable ({e})") from None
  runs = index.get("runs") if isinstance(index, dict) else None
  if not runs or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                         and isinstance(r.get("overrides"), dict) for r in runs):
    raise ValueError(f"{path} lists no runs: a sweep.json holds runs with a name and overrides")
  if index.get("sweep") is None:
    raise ValueError(f"{path} lists runs trained by train_runs, not a grid: compare them with "
                     f"python -m nbsgd_jax.report {os.path.join(sweep_dir, '<run>')}... --out OUT")
  return Index(str(index["sweep"]), runs)


def read_run(path: str) -> tuple[list, Optional[dict], Optional[str]]:
  """A run directory of a sweep: ``(records, summary, why left out)``; ``records``: the
  evaluations of ``metrics.jsonl`` (JSON objects with an int ``step``; other lines
  skipped), ``summary``: ``summary.json`` or None, ``why``: None for a finished run."""
  if not os.path.isdir(path):
    return [], None, "no directory"
  records, _ = files_lib.read_records(os.path.join(path, "metrics.jsonl"))
  try:
    with open(os.path.join(path, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return records, None, "no summary.json (in progress or crashed)"
  if not isinstance(summary, dict):
    return records, None, "unreadable summary.json"
  if summary.get("stopped") == "diverged":
    return records, summary, f"diverged (last good evaluation at step {summary.get('step')})"
  return records, summary, None


def made_by(path: str, summary: Optional[dict]) -> Optional[dict]:
  """What produced the run directory ``path`` (``summary``: its ``summary.json`` or None):
  ``summary.json``'s provenance (the process that finished it), else ``config.json``'s (the
  one that started it), as :func:`nbsgd_jax.report.load_run`; None for a run recorded before
  provenance existed (or an unreadable ``config.json``)."""
  found = provenance_lib.of(summary)
  if found is not None:
    return found
  try:
    with open(os.path.join(path, "config.json")) as f:
      return provenance_lib.of(json.load(f))
  except (OSError, ValueError):
    return None


# ----------------------------------------------------------------------------- statistics


def stat(values: Sequence[float]) -> Stat:
  """Mean and sample standard deviation (``ddof=1``; None for one value) of ``values``.

  Raises:
    ValueError: ``values`` is empty.
  """
  v = np.asarray(values, np.float64)
  if v.size == 0:
    raise ValueError("stat of no values: a cell needs one finished seed")
  return Stat(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else None, int(v.size))


def run_values(records: Sequence[dict], summary: dict) -> dict:
  """``{Column.name: value or None}`` of one finished run: final from ``summary`` (its last
  evaluation), best over ``records`` and the final value; scaled (MB: 1e6 bytes)."""
  out = {}
  for col in COLUMNS:
    final = _num(summary.get(col.key))
    if col.reduce == "final" or final is None:
      value = final
    else:
      seen = [x for x in (_num(r.get(col.key)) for r in records) if x is not None] + [final]
      value = max(seen) if col.reduce == "max" else min(seen)
    out[col.name] = None if value is None else value * col.scale
  return out


def curve(seeds: Sequence[Sequence[dict]], key: str) -> Optional[Curve]:
  """``key`` over the seeds' evaluations (``seeds``: each seed's records), at the steps where
  every seed has a finite ``key`` and ``sim_time``; None when there is no such step."""
  tables = [{r["step"]: (_num(r.get("sim_time")), _num(r.get(key))) for r in recs}
            for recs in seeds]
  common = set.intersection(*({s for s, (t, y) in tab.items() if t is not None and y is not None}
                              for tab in tables)) if tables else set()
  if not common:
    return None
  steps = sorted(common)
  t = np.array([[tab[s][0] for s in steps] for tab in tables])  # [S, E]
  y = np.array([[tab[s][1] for s in steps] for tab in tables])  # [S, E]
  return Curve(np.array(steps), t.mean(0), y.mean(0),
               y.std(0, ddof=1) if len(tables) > 1 else None)


def _cell_name(overrides: dict) -> str:
  return ", ".join(f"{k}={v}" for k, v in overrides.items()) or ALL_RUNS


def cells(sweep_dir: str, index: Optional[Index] = None) -> list[Cell]:
  """The cells of the sweep in ``sweep_dir`` (``index``: its ``sweep.json``, read if None),
  in the order of their first run.

  Raises:
    ValueError: as :func:`load_index`.
  """
  grouped: dict = {}
  for run in (index or load_index(sweep_dir)).runs:
    over = {k: v for k, v in run["overrides"].items() if k != SEED}
    grouped.setdefault(json.dumps(over, sort_keys=True), (over, []))[1].append(run["name"])
  return [_cell(sweep_dir, over, names) for over, names in grouped.values()]


def _cell(sweep_dir: str, over: dict, names: list) -> Cell:
  used, left_out, values, seeds, provs = [], [], [], [], []
  for name in names:
    path = os.path.join(sweep_dir, name)
    records, summary, why = read_run(path)
    if os.path.isdir(path):  # a run not started yet was made by no code
      provs.append(made_by(path, summary))
    if why is not None:
      left_out.append((name, why))
      continue
    used.append(name)
    values.append(run_values(records, summary))
    seeds.append(records)
  stats = {}
  for col in COLUMNS:
    per_seed = [v[col.name] for v in values]
    stats[col.name] = stat(per_seed) if per_seed and None not in per_seed else None
  curves = {key: c for key, _ in CURVES for c in [curve(seeds, key)] if c is not None}
  return Cell(_cell_name(over), over, tuple(names), tuple(used), tuple(left_out), stats,
              curves, tuple(provs))


# ----------------------------------------------------------------------------- figures


def band_figure(grid: Sequence[Cell], xkey: str, xlabel: str):
  """Training loss (log scale) and test accuracy against ``xkey`` (``"sim_time"``, s, or
  ``"step"``): per cell with a curve, its mean as a line and, with two seeds or more, mean
  +- std as a band (one ``fill_between`` per cell and panel). Returns the matplotlib
  ``Figure`` (no pyplot)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(11, 4.2), layout="constrained")
  FigureCanvasAgg(fig)
  axes = dict(zip((k for k, _ in CURVES), fig.subplots(1, len(CURVES))))
  for i, cell in enumerate(grid):
    for key, ax in axes.items():
      c = cell.curves.get(key)
      if c is None:
        continue
      x = c.sim_time if xkey == "sim_time" else c.step
      ax.plot(x, c.mean, color=f"C{i % 10}", marker="o", markersize=3, linewidth=1.5,
              label=f"{cell.name} ({len(cell.used)} seed{'s' * (len(cell.used) != 1)})")
      if c.std is not None:
        ax.fill_between(x, c.mean - c.std, c.mean + c.std, color=f"C{i % 10}", alpha=0.2)
  for (key, ylabel), ax in zip(CURVES, axes.values()):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel} vs {xlabel}, mean +- std over seeds")
    ax.grid(True, which="both", alpha=0.3)
  axes["train_loss"].set_yscale("log")
  axes["test_accuracy"].legend(fontsize="small", loc="lower right")
  return fig


# ----------------------------------------------------------------------------- markdown


def _show(s: Optional[Stat], spec: str) -> str:
  if s is None:
    return "-"
  return format(s.mean, spec) + ("" if s.std is None else f" +- {format(s.std, spec)}")


def _seeds(cell: Cell) -> str:
  out = f"{len(cell.used)} of {len(cell.runs)}"
  notes = [f"{len(cell.left_out)} left out"] if cell.left_out else []
  if len(cell.used) == 1:
    notes.append("no std")
  return out + (f" ({'; '.join(notes)})" if notes else "")


def _code(prov: Optional[dict]) -> str:
  if prov is None:
    return NO_PROVENANCE
  commit = provenance_lib.short(prov)
  made = f"commit {commit}" if commit != "-" else "no commit (not a git checkout)"
  return f"{made} (jax {prov.get('jax') or '-'})"


def provenance_line(grid: Sequence[Cell]) -> Optional[str]:
  """Which code made the sweep's runs (:attr:`Cell.made_by`): ``"Provenance: the runs were
  made by commit C (jax V) (N runs)"``; several commits or JAX versions: :data:`MIXED`, then
  each with its count (most runs first); runs without provenance counted as
  :data:`NO_PROVENANCE`. None when no run has a directory yet."""
  counts: dict = {}
  for code in (_code(p) for c in grid for p in c.made_by):
    counts[code] = counts.get(code, 0) + 1
  if not counts:
    return None
  parts = [f"{code} ({n} run{'s' * (n != 1)})"
           for code, n in sorted(counts.items(), key=lambda kv: -kv[1])]
  mixed = len([code for code in counts if code != NO_PROVENANCE]) > 1
  return "Provenance: " + (f"{MIXED}: " if mixed else "the runs were made by ") \
      + "; ".join(parts)


def markdown(grid: Sequence[Cell], sweep_dir: str, text: str, figures: Sequence[str]) -> str:
  """``report.md``: which code made the runs (:func:`provenance_line`), the table (one row per
  cell; columns of :data:`COLUMNS` that some cell has), the runs left out, the figures (file
  names under OUT)."""
  cols = [col for col in COLUMNS if any(c.stats[col.name] is not None for c in grid)]
  runs = sum(len(c.runs) for c in grid)
  left = [(run, why) for c in grid for run, why in c.left_out]
  made = provenance_line(grid)
  out = ["# Sweep report", "",
         f"Sweep `{text}` in `{sweep_dir}`: {runs} runs in {len(grid)} cells (the grid without "
         f"its `{SEED}` axis); {len(left)} left out of the statistics (listed below).",
         "Each value: mean +- sample standard deviation (ddof 1) over the cell's finished "
         "seeds; with one finished seed, its value alone (no std). Final: at the last "
         "evaluation; best / min: over the evaluations. MB: 1e6 bytes sent per worker.", "",
         *([made, ""] if made else []),
         "| cell | seeds | " + " | ".join(col.header for col in cols) + " |",
         "|---|---|" + "---|" * len(cols)]
  for c in grid:
    row = [c.name, _seeds(c)] + [_show(c.stats[col.name], col.spec) for col in cols]
    out.append("| " + " | ".join(s.replace("|", "\\|") for s in row) + " |")
  if left:
    out += ["", f"## Left out ({len(left)} runs)", ""]
    out += [f"- {run}: {why}" for run, why in left]
  if figures:
    out += ["", "## Figures", "",
            "One band per cell: the mean over its finished seeds, +- one std shaded; seeds "
            "matched by evaluation step, drawn at their mean simulated time.", ""]
    out += [f"![{f[:-4].replace('_', ' ')}]({f})\n" for f in figures]
  return "\n".join(out).rstrip() + "\n"


# ----------------------------------------------------------------------------- entry points


def build(sweep_dir: str, out: Optional[str] = None) -> dict:
  """Write the sweep's report to ``out`` (default ``SWEEP_DIR/report``; created).

  Returns:
    ``{"cells": [Cell], "report": path of report.md, "figures": paths of the PNGs}``.

  Raises:
    ValueError: as :func:`load_index` (before anything is written).
    OSError: ``out`` cannot be written.
  """
  index = load_index(sweep_dir)
  grid = cells(sweep_dir, index)
  out = os.path.join(sweep_dir, DEFAULT_OUT) if out is None else out
  os.makedirs(out, exist_ok=True)
  figures = []
  for xkey, xlabel in X_AXES:
    name = f"loss_accuracy_vs_{xkey}.png"
    if not any(c.curves for c in grid):  # no evaluation: none, not an earlier report's
      if os.path.exists(os.path.join(out, name)):
        os.remove(os.path.join(out, name))
      continue
    fig = band_figure(grid, xkey, xlabel)
    files_lib.atomic_save(os.path.join(out, name),
                          lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    figures.append(name)
  report = os.path.join(out, "report.md")
  files_lib.atomic_write(report, markdown(grid, sweep_dir, index.grid, figures))
  return {"cells": grid, "report": report, "figures": [os.path.join(out, f) for f in figures]}


def sweep_dir_of(argv: Sequence[str]) -> Optional[str]:
  """The directory of a report command line ``SWEEP_DIR [--out OUT]`` when it is the only one
  and holds ``sweep.json``, else None (``nbsgd_jax.report``'s run directories)."""
  dirs, value = [], False
  for arg in argv:
    if value:
      value = False
    elif arg in ("--out", "--target_loss"):
      value = True
    elif not arg.startswith("-"):
      dirs.append(arg)
  return dirs[0] if len(dirs) == 1 and os.path.isfile(os.path.join(dirs[0], INDEX)) else None


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit status 2 (as nbsgd_jax.report's)
    self.exit(2, f"error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m nbsgd_jax.report SWEEP_DIR [--out OUT]``; returns the exit status (0; 2 for
  bad arguments or a bad sweep directory; 1 when the report cannot be written)."""
  p = _Parser(prog="python -m nbsgd_jax.report",
              description="A sweep's report: mean +- std over seeds per cell of its grid.")
  p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a sweep's workdir (holds sweep.json)")
  p.add_argument("--out", default=None, help="output directory for report.md and the PNGs "
                 f"(default: SWEEP_DIR/{DEFAULT_OUT})")
  args = p.parse_args(argv)
  out = os.path.join(args.sweep_dir, DEFAULT_OUT) if args.out is None else args.out
  try:
    result = build(args.sweep_dir, out)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"error: cannot write the report to {out!r}: {e}", file=sys.stderr)
    return 1
  left = sum(len(c.left_out) for c in result["cells"])
  print(f"wrote {result['report']} ({len(result['cells'])} cell(s), {left} run(s) left out, "
        f"{len(result['figures'])} figure(s))")
  return 0


__all__ = ["Cell", "Curve", "COLUMNS", "Index", "Stat", "build", "cells", "curve", "load_index",
           "made_by", "main", "provenance_line", "read_run", "run_values", "stat", "sweep_dir_of"]
