"""Compare runs: plots and a markdown table from run directories.

    python -m nbsgd_jax.report runs/ar runs/dpsgd --out reports/ar_vs_dpsgd [--target_loss 0.5]

A run directory is what :func:`nbsgd_jax.train.train` writes: ``config.json``,
``metrics.jsonl`` (one evaluation per line; the last line may be torn while the run is in
progress) and, once the run has finished, ``summary.json``. The report reads only these files
(it trains and evaluates nothing), so it can be run on runs in progress.

``OUT`` receives

* ``loss_accuracy_vs_{sim_time,wall_time,bytes_sent,step}.png``: training loss of the averaged
  model (``train_loss``, log scale) and test accuracy against simulated time (s), wall time of
  the training steps (s), MB sent per worker and step; one line per run;
* ``consensus_distance.png``: consensus distance Xi against step, for the runs that have it
  (a periodic run whose evaluations all fall just after a synchronisation says so in its
  legend entry and a note under the figure: :mod:`nbsgd_jax.report.syncs`);
* ``time_by_cause.png``: where each run's simulated time went, one stacked bar per run
  (computing, communicating, waiting, down; seconds per worker) with a tick at its
  counterfactual ``sim_time_ideal`` (:mod:`nbsgd_jax.report.fleet`);
* ``report.md``: the settings the runs share (the fleet's too: the network's levels and
  placement, a trace, failures, episodes; the commit and JAX version that produced the runs,
  :mod:`nbsgd_jax.core.provenance`, else a column each), then one row per run (the algorithm
  as run, final accuracy and loss, steps, times, MB sent, time and MB to a target training
  loss, samples/s; goodput and the time by cause; the ideal simulated time and sim / ideal;
  the failures, episodes and restarts counted; for the asynchronous runs on the event clock
  their events or pushes and staleness, with a note on what their steps applied) with the
  figures embedded.

Runs are labelled by the algorithm as run where it differs (:mod:`nbsgd_jax.run.naming`, e.g.
``dpsgd + non-blocking (M = 4)``), then by the other configuration keys that differ between
them (the fleet's in words, e.g. ``episodes (0.03/h, median 1260 s, x1.5)``, ``levels
8:1e-6:3e11``; others as nested keys flattened with dots, e.g. ``learning_rate=0.1``; a key
counts only among the runs that read it: ``diloco.local_steps`` not for ``dpsgd``;
logging-only keys such as ``progress`` are ignored), or by their directory name when nothing
differs. Every file is written to a temporary name and then renamed, so a crash never leaves
a half-written report.

The run directories as read live in :mod:`nbsgd_jax.report.runs`, the figures in
:mod:`nbsgd_jax.report.plots`, the fleet's settings and time by cause in
:mod:`nbsgd_jax.report.fleet`, the synchronisation points in :mod:`nbsgd_jax.report.syncs`,
the markdown of ``report.md`` in :mod:`nbsgd_jax.report.table` (their names re-exported
here) and a sweep's report in :mod:`nbsgd_jax.report.sweep`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Sequence

from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.report import sweep as sweep_report
# The figures (nbsgd_jax.report.plots), the markdown (nbsgd_jax.report.table) and the run
# directories as read (nbsgd_jax.report.runs), re-exported: the package names them from here.
from nbsgd_jax.report.plots import (  # noqa: F401
    _atomic_savefig,
    _new_figure,
    _series,
    _style,
    has_consensus,
    plot_consensus,
    plot_loss_accuracy,
)
from nbsgd_jax.report import syncs as syncs_lib
from nbsgd_jax.report.fleet import (  # noqa: F401
    CAUSES,
    TIME_FIGURE,
    cause_seconds,
    fleet_keys,
    fleet_settings,
    fleet_words,
    plot_time_by_cause,
)
from nbsgd_jax.report.runs import NotARunError, Run, _num, flatten, load_run  # noqa: F401
from nbsgd_jax.report.table import (  # noqa: F401
    ASYNC_COLUMNS,
    EXTRA_COLUMNS,
    FAULT_COLUMNS,
    FLEET_COLUMNS,
    EVENT_CLOCK_DOC,
    IDEAL_COLUMNS,
    KEY_SETTINGS,
    NO_EVAL,
    PROVENANCE_COLUMNS,
    _f,
    _fmt_value,
    _markdown,
    _md_cell,
    _notes,
    _table,
    event_note,
    provenance_split,
    shared_settings,
)

# Keys that change logging or bookkeeping, not training: never used to tell runs apart.
NOISE_KEYS = ("progress", "tensorboard", "data_dir", "checkpoint_every", "eval_every",
              "consensus.log_every_step", "consensus.per_layer")
# x axes of the loss / accuracy figures: (metrics key, axis label, scale applied to values).
X_AXES = (("sim_time", "simulated time (s)", 1.0),
          ("wall_time", "wall time of training steps (s)", 1.0),
          ("bytes_sent", "MB sent per worker", 1e-6),
          ("step", "step", 1.0))
CONSENSUS_FIGURE = "consensus_distance.png"
_ABSENT = "(absent)"
_LABEL_FIELDS = 4  # at most this many differing fields in a legend label (all in the table)


# ----------------------------------------------------------------------------- table


def differing_keys(runs: Sequence[Run]) -> list[str]:
  """Flattened config keys whose values are not the same in every run that reads them
  (:attr:`Run.unused`: ``diloco.local_steps`` counts only among the runs of a recipe that
  takes ``diloco``, ``compression.density`` only among those that compress; noise keys left
  out), in config order; empty for a single run."""
  keys: list[str] = []
  for r in runs:
    keys += [k for k in r.flat_config if k not in keys]
  if len(runs) < 2:
    return []
  return [k for k in keys if k not in NOISE_KEYS
          and len({json.dumps(r.flat_config.get(k, _ABSENT), sort_keys=True)
                   for r in runs if k not in r.unused}) > 1]


def settings_of(run: Run, keys: Sequence[str]) -> dict:
  """``{key: run's value}`` of the differing ``keys`` that ``run`` reads."""
  return {k: run.flat_config.get(k, _ABSENT) for k in keys if k not in run.unused}


def first_reaching(records: Sequence[dict], target: float) -> dict | None:
  """The first evaluation with ``train_loss <= target`` (None if there is none)."""
  for rec in records:
    loss = _num(rec.get("train_loss"))
    if loss is not None and loss <= target:
      return rec
  return None


def _row(run: Run, label: str, settings: dict, target: float | None) -> dict:
  cfg = run.flat_config
  row = {"run": run.name, "dir": run.path, "label": label, "settings": settings,
         "algorithm": cfg.get("algorithm"), "algorithm_as_run": run.as_run,
         "named": sorted(run.named), "num_workers": cfg.get("num_workers"),
         "num_steps": cfg.get("num_steps"), "budget_unit": cfg.get("budget_unit", "steps"),
         "finished": run.finished, "evaluations": len(run.records),
         "skipped_lines": run.skipped_lines, "target_loss": target,
         "provenance": run.provenance, "commit": provenance_lib.short(run.provenance),
         "jax": (run.provenance or {}).get("jax") or "-"}
  if not run.records:
    row.update(status=NO_EVAL, step=None, grads_per_worker=None, final_test_accuracy=None,
               final_train_loss=None, sim_time=None, wall_time=None, bytes_sent=None, mb_sent=None,
               samples_per_second=None, target_step=None, target_sim_time=None,
               target_wall_time=None, target_bytes_sent=None, target_mb_sent=None,
               **{key: None for key, _, _ in EXTRA_COLUMNS})
    return row
  last = run.records[-1]
  step, wall = last["step"], _num(last.get("wall_time"))
  bs, nw = _num(cfg.get("batch_size")), _num(cfg.get("num_workers"))
  tput = step * bs * nw / wall if wall and bs is not None and nw is not None else None
  bytes_sent = _num(last.get("bytes_sent"))
  hit = first_reaching(run.records, target) if target is not None else None
  hit_bytes = _num(hit.get("bytes_sent")) if hit else None
  row.update(
      status="finished" if run.finished else "in progress",
      step=step, grads_per_worker=_num(last.get("grads_per_worker")),
      final_test_accuracy=_num(last.get("test_accuracy")),
      final_train_loss=_num(last.get("train_loss")),
      sim_time=_num(last.get("sim_time")),
      wall_time=wall,
      bytes_sent=bytes_sent,
      mb_sent=bytes_sent * 1e-6 if bytes_sent is not None else None,
      samples_per_second=tput,
      target_step=hit["step"] if hit else None,
      target_sim_time=_num(hit.get("sim_time")) if hit else None,
      target_wall_time=_num(hit.get("wall_time")) if hit else None,
      target_bytes_sent=hit_bytes,
      target_mb_sent=hit_bytes * 1e-6 if hit_bytes is not None else None,
      **{key: _num(last.get(key)) for key, _, _ in EXTRA_COLUMNS})
  ideal = row["sim_time_ideal"]  # sim_time / sim_time_ideal: what stragglers and faults cost
  row["ideal_ratio"] = row["sim_time"] / ideal if ideal and row["sim_time"] is not None else None
  return row


def _labels(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
  """Legend labels: the algorithm as run (:attr:`Run.as_run`) where it is not the same in
  every run, then the fleet's settings that differ in words (:func:`fleet_words`: the
  network's levels, a trace, episodes), then the differing keys the run reads that neither
  states (at most ``_LABEL_FIELDS`` parts), or the directory name when nothing differs; runs
  with the same label (same config) get their directory name added."""
  names = [r.name for r in runs]
  ident = [r.path if names.count(r.name) > 1 else r.name for r in runs]
  by_name = len({r.as_run for r in runs}) > 1
  labels = []
  some = fleet_keys(runs)
  fleet = [k for k in keys if k in some]  # the differing fleet settings some run has
  for r, idn in zip(runs, ident):
    named = r.named if by_name else ()
    words, said = fleet_words(r.flat_config, fleet, named)
    parts = ([r.as_run] if by_name else []) + words
    parts += [f"{k}={_fmt_value(v)}" for k, v in settings_of(r, keys).items()
              if k not in named and k not in said]
    if len(parts) > _LABEL_FIELDS:
      parts = parts[:_LABEL_FIELDS] + ["..."]
    labels.append(", ".join(parts) if parts else idn)
  if not keys and not by_name:
    return labels
  return [f"{lab} ({idn})" if labels.count(lab) > 1 else lab for lab, idn in zip(labels, ident)]


_atomic_write = files_lib.atomic_write


def _remove(path: str) -> None:
  if os.path.exists(path):  # from an earlier report in the same directory
    os.remove(path)


def _consensus_figure(out: str, evaluated: list) -> tuple:
  """The consensus figure of the evaluated runs that have the distance: ``(figures, note,
  notes under it)``; a run whose plotted evaluations all come just after a synchronisation
  (:func:`nbsgd_jax.report.syncs.at_syncs`) says so in its legend entry and a note."""
  cons = [(i, r, lab) for i, (r, lab) in enumerate(evaluated) if has_consensus(r)]
  cpath = os.path.join(out, CONSENSUS_FIGURE)
  if not cons:
    _remove(cpath)
    return [], "no run has consensus distance data: no consensus plot.", []
  at = [syncs_lib.at_syncs(r) for _, r, _ in cons]
  plot_consensus([r for _, r, _ in cons],
                 [syncs_lib.sync_label(lab) if a else lab for (_, _, lab), a in zip(cons, at)],
                 cpath, [i for i, _, _ in cons])
  notes = [syncs_lib.sync_note(r, lab, a) for (_, r, lab), a in zip(cons, at) if a]
  without = [r.name for r, _ in evaluated if not has_consensus(r)]
  note = None
  if without:
    note = ("no consensus distance (all-reduce or not measured), not in "
            f"{CONSENSUS_FIGURE}: {', '.join(without)}.")
  return [(CONSENSUS_FIGURE, "consensus distance vs step")], note, notes


def _figures(out: str, evaluated: list, rows: list) -> tuple:
  """Every figure of the report, written to ``out``: ``(figures [(file, title)], the
  consensus note, {file: notes under it})``."""
  figures: list = []
  if evaluated:
    eruns, elabels = [r for r, _ in evaluated], [lab for _, lab in evaluated]
    for xkey, xlabel, xscale in X_AXES:
      fname = f"loss_accuracy_vs_{xkey}.png"
      plot_loss_accuracy(eruns, elabels, xkey, xlabel, xscale, os.path.join(out, fname))
      figures.append((fname, f"training loss and test accuracy vs {xlabel}"))
  cons, consensus_note, notes = _consensus_figure(out, evaluated)
  figures += cons
  if plot_time_by_cause(rows, os.path.join(out, TIME_FIGURE)):
    figures.append((TIME_FIGURE, "time by cause per run (simulated seconds per worker)"))
  else:
    _remove(os.path.join(out, TIME_FIGURE))
  if not evaluated:
    consensus_note = (consensus_note or "") + " No run has an evaluation yet: no figures."
  return figures, consensus_note, {CONSENSUS_FIGURE: notes}


# ----------------------------------------------------------------------------- entry points


def build_report(run_dirs: Sequence[str], out: str, target_loss: float | None = None) -> dict:
  """Write the comparison of ``run_dirs`` to the directory ``out`` (created).

  Args:
    run_dirs: run directories; those that are not runs (no ``config.json``) are skipped with
      a line on stderr and in ``report.md``.
    out: output directory for ``report.md`` and the PNG figures.
    target_loss: target training loss (``train_loss`` of the averaged model) for the time and
      bytes to target; None: the highest final training loss among the runs with an
      evaluation, so every run reaches it.

  Returns:
    a dict with ``rows`` (one dict per run, in the order given: ``run``, ``dir``, ``label``,
    ``settings`` (the differing config keys this run reads, :func:`differing_keys`, and its
    values), ``algorithm`` (``config.algorithm``), ``algorithm_as_run`` (:attr:`Run.as_run`)
    and ``named`` (the keys it states, sorted), ``num_workers``, ``status``
    (``"finished"``, ``"in progress"`` or ``"no evaluation yet"``), ``step`` and
    ``num_steps``, ``final_test_accuracy``, ``final_train_loss``, ``sim_time`` and
    ``wall_time`` (s, at the last evaluation), ``bytes_sent`` (bytes per worker) and
    ``mb_sent`` (1e6 bytes), ``samples_per_second`` (step x batch_size x num_workers /
    wall_time), ``target_loss``, ``target_step``, ``target_sim_time`` (s),
    ``target_wall_time`` (s), ``target_bytes_sent`` (bytes), ``target_mb_sent``: None when
    the target is not reached or there is no evaluation; the event clock's ``events``,
    ``pushes``, ``staleness_tau``, ``staleness_tau_max`` and ``staleness_own_steps`` at the
    last evaluation, None for a run without them; likewise ``goodput``,
    ``time_compute``, ``time_comm``, ``time_wait``, ``time_down`` (fractions of n x
    ``sim_time``), ``sim_time_ideal`` (s) and ``ideal_ratio`` (``sim_time /
    sim_time_ideal``), ``failures``, ``episodes`` and ``restarts`` (counts: None for a run
    that simulated no such process), ``provenance`` (:attr:`Run.provenance`, or None),
    ``commit`` (its commit's first 10 hex digits, ``+dirty`` when its tracked files
    differed, ``"-"`` without one) and ``jax`` (its JAX version, or ``"-"``)), ``skipped``
    (``(dir, reason)`` pairs), ``target_loss``, ``report`` (path of ``report.md``) and
    ``figures`` (paths of the PNGs written).

  Raises:
    ValueError: no directory of ``run_dirs`` is a run directory, or ``target_loss`` is not a
      finite number.
    OSError: ``out`` cannot be written.
  """
  if target_loss is not None and _num(target_loss) is None:
    raise ValueError(f"target_loss={target_loss!r} is not a finite number")
  runs, skipped = [], []
  for d in run_dirs:
    try:
      runs.append(load_run(d))
    except NotARunError as e:
      skipped.append((d, str(e)))
      print(f"skipped {d}: {e}", file=sys.stderr)
  if not runs:
    raise ValueError("no run directory among " + ", ".join(map(str, run_dirs))
                     + " (a run directory holds config.json)")

  keys = differing_keys(runs)
  labels = _labels(runs, keys)
  evaluated = [(r, lab) for r, lab in zip(runs, labels) if r.records]
  target = target_loss
  if target is None:
    finals = [_num(r.records[-1].get("train_loss")) for r, _ in evaluated]
    finals = [x for x in finals if x is not None]
    target = max(finals) if finals else None
  rows = [_row(r, lab, settings_of(r, keys), target) for r, lab in zip(runs, labels)]

  os.makedirs(out, exist_ok=True)
  figures, consensus_note, figure_notes = _figures(out, evaluated, rows)
  report = os.path.join(out, "report.md")
  _atomic_write(report, _markdown(rows, runs, skipped, keys, target, target_loss is not None,
                                  figures, consensus_note, figure_notes))
  paths = [os.path.join(out, f) for f, _ in figures]
  return {"rows": rows, "skipped": skipped, "target_loss": target, "report": report,
          "figures": paths}


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit status 2 (argparse's default prints usage too)
    self.exit(2, f"error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
  """Command line; returns the exit status (0; 2 for bad arguments or no run directory;
  1 when the report cannot be written). One directory holding ``sweep.json``: that sweep's
  report, :func:`nbsgd_jax.report.sweep.main` (``--out`` optional there)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if sweep_report.sweep_dir_of(argv):  # python -m nbsgd_jax.report SWEEP_DIR [--out OUT]
    return sweep_report.main(argv)
  p = _Parser(prog="python -m nbsgd_jax.report",
              description="Compare run directories: PNG plots and OUT/report.md. One sweep "
                          "directory (holding sweep.json; --out default SWEEP_DIR/report): "
                          "mean +- std over seeds per cell of its grid.")
  p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories (workdirs), or one "
                 "sweep directory")
  p.add_argument("--out", required=True, help="output directory for report.md and the PNGs")
  p.add_argument("--target_loss", type=float, default=None,
                 help="target training loss for time / MB to target (default: the highest "
                      "final training loss among the runs)")
  args = p.parse_args(argv)
  if args.target_loss is not None and not math.isfinite(args.target_loss):
    p.error(f"argument --target_loss: {args.target_loss} is not a finite number")
  try:
    result = build_report(args.dirs, args.out, args.target_loss)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"error: cannot write the report to {args.out!r}: {e}", file=sys.stderr)
    return 1
  print(f"wrote {result['report']} ({len(result['rows'])} run(s), "
        f"{len(result['figures'])} figure(s))")
  return 0
