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
* ``consensus_distance.png``: consensus distance Xi against step, for the runs that have it;
* ``report.md``: one row per run (the algorithm as run, final accuracy and loss, steps, times,
  MB sent, time and MB to a target training loss, samples/s; for the asynchronous runs on the
  event clock their events or pushes and staleness, with a note on what their steps applied)
  with the figures embedded.

Runs are labelled by the algorithm as run where it differs (:mod:`nbsgd_jax.run.naming`, e.g.
``dpsgd + non-blocking (M = 4)``), then by the other configuration keys that differ between
them (nested keys flattened with dots, e.g. ``learning_rate=0.1``; a key counts only among
the runs that read it: ``diloco.inner_steps`` not for ``dpsgd``; logging-only keys such as
``progress`` are ignored), or by their directory name when nothing differs. Every file is
written to a temporary name and then renamed, so a crash never leaves a half-written report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Any, Sequence

import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax.run import naming
from nbsgd_jax.report import sweep as sweep_report

# Keys that change logging or bookkeeping, not training: never used to tell runs apart.
NOISE_KEYS = ("progress", "tensorboard", "data_dir", "checkpoint_every", "eval_every",
              "consensus.log_every_step", "consensus.per_layer")
# Shown as "shared settings" in report.md when they do not differ.
KEY_SETTINGS = ("algorithm", "num_workers", "topology", "backend", "model", "dataset",
                "batch_size", "learning_rate", "num_steps")
# x axes of the loss / accuracy figures: (metrics key, axis label, scale applied to values).
X_AXES = (("sim_time", "simulated time (s)", 1.0),
          ("wall_time", "wall time of training steps (s)", 1.0),
          ("bytes_sent", "MB sent per worker", 1e-6),
          ("step", "step", 1.0))
# The event clock's record keys (nbsgd_jax.host.events: EventTimes.record, ServerEventTimes
# .record): (key, column of report.md, format); a column is shown when some run has its key.
# Staleness: tau is the paper's (every worker's updates between a gradient's read and its
# application; asynchronous DiLoCo: server updates between pull and push), own steps the
# changes to the worker's own model in between (AD-PSGD, SwarmSGD).
ASYNC_COLUMNS = (("events", "events", ".0f"), ("pushes", "pushes", ".0f"),
                 ("staleness_tau", "staleness tau mean", ".3g"),
                 ("staleness_tau_max", "staleness tau max", ".0f"),
                 ("staleness_own_steps", "own-model staleness mean", ".3g"))
EVENT_CLOCK_DOC = "docs/algorithms.md, \"The event clock\""
CONSENSUS_FIGURE = "consensus_distance.png"
NO_EVAL = "no evaluation yet"
_ABSENT = "(absent)"
_LABEL_FIELDS = 4  # at most this many differing fields in a legend label (all in the table)


class NotARunError(ValueError):
  """A directory that is not a run directory (no readable ``config.json``)."""


@dataclasses.dataclass
class Run:
  """One run directory as read from disk.

  Attributes:
    path: the directory, as given.
    name: its base name (the ``run`` column of the table).
    config: ``config.json`` (nested dict).
    flat_config: ``config`` flattened with dotted keys (``"nonblocking.enabled"``).
    records: the complete evaluations of ``metrics.jsonl`` in file order; ``step``,
      ``sim_time`` (s), ``wall_time`` (s), ``bytes_sent`` (bytes per worker, cumulative),
      ``train_loss``, ``test_accuracy``, ... Empty when the run has no evaluation yet.
    skipped_lines: lines of ``metrics.jsonl`` that are not a JSON object with a ``step``
      (a torn last line of a run in progress or crashed).
    summary: ``summary.json``, or None while the run is in progress (or if it crashed).
    unused: the dotted config keys the run does not read (a section that is off, another
      algorithm's section: :func:`nbsgd_jax.config.inactive_keys`).
    as_run: the algorithm as run (:func:`nbsgd_jax.run.naming.algorithm_as_run`), e.g.
      ``"dpsgd + non-blocking (M = 4)"``.
    named: the dotted config keys whose values ``as_run`` states.
  """
  path: str
  name: str
  config: dict
  flat_config: dict
  records: list
  skipped_lines: int
  summary: dict | None
  unused: frozenset = frozenset()
  as_run: str = ""
  named: frozenset = frozenset()

  @property
  def finished(self) -> bool:
    return self.summary is not None


flatten = config_lib.flatten_dict


def load_run(path: str) -> Run:
  """Read a run directory.

  Unparsable lines of ``metrics.jsonl`` (a torn last line) are skipped and counted; a missing
  ``metrics.jsonl`` reads as no evaluation; an unreadable ``summary.json`` as a run in
  progress.

  Args:
    path: a directory written by :func:`nbsgd_jax.train.train`.

  Returns:
    the :class:`Run`.

  Raises:
    NotARunError: ``path`` is not a directory, has no ``config.json`` or an unreadable one.
  """
  if not os.path.isdir(path):
    raise NotARunError("no such directory")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise NotARunError("not a run directory (no config.json)")
  try:
    with open(cfg_path) as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise NotARunError(f"unreadable config.json ({e})") from None
  if not isinstance(config, dict):
    raise NotARunError("unreadable config.json (not a JSON object)")

  records, skipped = files_lib.read_records(os.path.join(path, "metrics.jsonl"))
  summary = None
  try:
    with open(os.path.join(path, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    summary = None
  name = os.path.basename(os.path.normpath(path))
  cfg = ml_collections.ConfigDict(config)
  return Run(path=path, name=name, config=config, flat_config=flatten(config),
             records=records, skipped_lines=skipped, summary=summary,
             unused=frozenset(config_lib.inactive_keys(cfg)),
             as_run=naming.algorithm_as_run(cfg), named=frozenset(naming.named_keys(cfg)))


# ----------------------------------------------------------------------------- table


def _num(x: Any) -> float | None:
  """A finite float, or None (null, NaN, inf, not a number)."""
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def _fmt_value(v: Any) -> str:
  if isinstance(v, (list, dict)):
    return json.dumps(v, separators=(",", ":"))
  return str(v)


def differing_keys(runs: Sequence[Run]) -> list[str]:
  """Flattened config keys whose values are not the same in every run that reads them
  (:attr:`Run.unused`: ``diloco.inner_steps`` counts only among the runs of a recipe that
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
         "skipped_lines": run.skipped_lines, "target_loss": target}
  if not run.records:
    row.update(status=NO_EVAL, step=None, grads_per_worker=None, final_test_accuracy=None,
               final_train_loss=None, sim_time=None, wall_time=None, bytes_sent=None, mb_sent=None,
               samples_per_second=None, target_step=None, target_sim_time=None,
               target_wall_time=None, target_bytes_sent=None, target_mb_sent=None,
               **{key: None for key, _, _ in ASYNC_COLUMNS})
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
      **{key: _num(last.get(key)) for key, _, _ in ASYNC_COLUMNS})
  return row


def _labels(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
  """Legend labels: the algorithm as run (:attr:`Run.as_run`) where it is not the same in
  every run, then the differing keys the run reads that it does not state (at most
  ``_LABEL_FIELDS`` parts), or the directory name when nothing differs; runs with the same
  label (same config) get their directory name added."""
  names = [r.name for r in runs]
  ident = [r.path if names.count(r.name) > 1 else r.name for r in runs]
  by_name = len({r.as_run for r in runs}) > 1
  labels = []
  for r, idn in zip(runs, ident):
    parts = [r.as_run] if by_name else []
    parts += [f"{k}={_fmt_value(v)}" for k, v in settings_of(r, keys).items()
              if not (by_name and k in r.named)]
    if len(parts) > _LABEL_FIELDS:
      parts = parts[:_LABEL_FIELDS] + ["..."]
    labels.append(", ".join(parts) if parts else idn)
  if not keys and not by_name:
    return labels
  return [f"{lab} ({idn})" if labels.count(lab) > 1 else lab for lab, idn in zip(labels, ident)]


# ----------------------------------------------------------------------------- figures


def _atomic_savefig(fig, path: str) -> None:
  files_lib.atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))


_atomic_write = files_lib.atomic_write


def _style(i: int) -> dict:
  return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":", "-.")[(i // 10) % 4],
          "marker": "o", "markersize": 3, "linewidth": 1.5}


def _series(records: Sequence[dict], xkey: str, ykey: str, xscale: float = 1.0,
            positive: bool = False) -> tuple[list, list]:
  xs, ys = [], []
  for rec in records:
    x, y = _num(rec.get(xkey)), _num(rec.get(ykey))
    if x is None or y is None or (positive and y <= 0):
      continue
    xs.append(x * xscale)
    ys.append(y)
  return xs, ys


def _new_figure(size):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=size, layout="constrained")  # no pyplot: no global backend state
  FigureCanvasAgg(fig)
  return fig


def plot_loss_accuracy(runs: Sequence[Run], labels: Sequence[str], xkey: str, xlabel: str,
                       xscale: float, path: str) -> None:
  """One figure, two panels: ``train_loss`` (log scale) and ``test_accuracy`` against
  ``xkey`` (values times ``xscale``); one line per run, written atomically to ``path``."""
  fig = _new_figure((11, 4.2))
  ax_loss, ax_acc = fig.subplots(1, 2)
  for i, (run, label) in enumerate(zip(runs, labels)):
    ax_loss.plot(*_series(run.records, xkey, "train_loss", xscale, positive=True),
                 label=label, **_style(i))
    ax_acc.plot(*_series(run.records, xkey, "test_accuracy", xscale), label=label,
                **_style(i))
  ax_loss.set_yscale("log")
  ax_loss.set_ylabel("training loss (averaged model)")
  ax_acc.set_ylabel("test accuracy")
  for ax in (ax_loss, ax_acc):
    ax.set_xlabel(xlabel)
    ax.grid(True, which="both", alpha=0.3)
  ax_loss.set_title(f"training loss vs {xlabel}")
  ax_acc.set_title(f"test accuracy vs {xlabel}")
  ax_acc.legend(fontsize="small", loc="lower right")
  _atomic_savefig(fig, path)


def plot_consensus(runs: Sequence[Run], labels: Sequence[str], path: str,
                   colors: Sequence[int] | None = None) -> None:
  """Consensus distance Xi against step (log scale), one line per run, written atomically;
  ``colors``: each run's style index (its colour in the loss / accuracy figures)."""
  fig = _new_figure((6.5, 4.2))
  ax = fig.subplots()
  colors = range(len(runs)) if colors is None else colors
  for i, run, label in zip(colors, runs, labels):
    ax.plot(*_series(run.records, "step", "consensus_distance", positive=True), label=label,
            **_style(i))
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("consensus distance Xi")
  ax.set_title("consensus distance vs step")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize="small")
  _atomic_savefig(fig, path)


def has_consensus(run: Run) -> bool:
  """Whether any evaluation has a positive, finite ``consensus_distance`` (decentralized)."""
  return any((_num(r.get("consensus_distance")) or 0.0) > 0 for r in run.records)


# ----------------------------------------------------------------------------- markdown


def _f(x: Any, spec: str = ".4g", none: str = "-") -> str:
  return none if x is None else format(x, spec)


def _md_cell(s: str) -> str:
  return s.replace("|", "\\|")


def _table(rows: list, target: float | None) -> list[str]:
  """The lines of report.md's table: one row per run; the algorithm as run, the differing
  settings it does not state, and the event clock's columns (:data:`ASYNC_COLUMNS`) that
  some run has ("-" for the others)."""
  extra = [c for c in ASYNC_COLUMNS if any(row[c[0]] is not None for row in rows)]
  head = ["run", "algorithm", "settings (differing)", "steps", "final test acc",
          "final train loss", "sim time (s)", "wall time (s)", "MB sent", "sim s to target",
          "wall s to target", "MB to target", "samples/s"] + [title for _, title, _ in extra]
  out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for row in rows:
    settings = ", ".join(f"{k}={_fmt_value(v)}" for k, v in row["settings"].items()
                         if k not in row["named"]) or "-"  # the algorithm column states them
    if row["status"] == NO_EVAL:
      steps = f"0 / {row['num_steps']} ({NO_EVAL})"
    else:
      steps = f"{row['step']} / {row['num_steps']}"
      if row["budget_unit"] == "grads_per_worker" and row["grads_per_worker"] is not None:
        steps = (f"{row['grads_per_worker']:.0f} / {row['num_steps']} gradients per worker "
                 f"({row['step']} steps)")
      if not row["finished"]:
        steps += " (in progress)"
    reached = row["status"] != NO_EVAL and row["target_step"] is not None
    nr = "not reached" if row["status"] != NO_EVAL and target is not None else "-"
    cells = [row["run"], str(row["algorithm_as_run"]), settings, steps,
             _f(row["final_test_accuracy"], ".4f"), _f(row["final_train_loss"]),
             _f(row["sim_time"]), _f(row["wall_time"]), _f(row["mb_sent"], ".4g"),
             _f(row["target_sim_time"]) if reached else nr,
             _f(row["target_wall_time"]) if reached else nr,
             _f(row["target_mb_sent"]) if reached else nr,
             _f(row["samples_per_second"], ".0f")] + [_f(row[k], spec) for k, _, spec in extra]
    out.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
  return out


def event_note(row: dict) -> str | None:
  """What the device steps of an event-clock run applied (its ``events`` or ``pushes``), or
  None for a run without them: a step is one batch of events, not one step of every worker
  (``docs/algorithms.md``, "The event clock")."""
  steps, events, pushes, n = row["step"], row["events"], row["pushes"], row["num_workers"]
  if not steps or (events is None and pushes is None):
    return None
  if events is not None:
    per = events / steps
    what = f"{events:.0f} events ({per:.3g} a step"
    if isinstance(n, int) and n > 0:  # an event is one worker's gradient step
      what += f": {per / n:.2g} of a gradient step per worker a step"
    what += ")"
  else:
    what = f"{pushes:.0f} pushes to the server ({pushes / steps:.3g} a step)"
  return (f"{row['run']}: its {steps} steps applied {what}; on the event clock a step applies "
          f"one batch of events that commute ({EVENT_CLOCK_DOC}).")


def _notes(rows: list, skipped: list, consensus_note: str | None) -> list[str]:
  """The lines of report.md's notes: runs in progress or without evaluations, torn lines,
  skipped directories, the event clock's steps, the consensus distance."""
  notes = []
  for row in rows:
    if row["status"] == NO_EVAL:
      notes.append(f"- {row['run']} ({row['dir']}): {NO_EVAL}; not plotted.")
    elif not row["finished"]:
      notes.append(f"- {row['run']} ({row['dir']}): in progress (no summary.json), "
                   f"{row['step']} of {row['num_steps']} steps.")
    if row["skipped_lines"]:
      notes.append(f"- {row['run']}: skipped {row['skipped_lines']} unparsable line(s) of "
                   "metrics.jsonl (torn last line?).")
    if event_note(row):
      notes.append(f"- {event_note(row)}")
  for path, reason in skipped:
    notes.append(f"- skipped {path}: {reason}")
  if consensus_note:
    notes.append(f"- {consensus_note}")
  return notes


def _markdown(rows: list, runs: list, skipped: list, keys: list, target: float | None,
              target_given: bool, figures: list, consensus_note: str | None) -> str:
  out = ["# Run comparison", ""]
  if target is None:
    out.append("Target training loss: none (no run has a finite final training loss).")
  elif target_given:
    out.append(f"Target training loss: {target:.4g} (`--target_loss`).")
  else:
    out.append(f"Target training loss: {target:.4g} (the highest final training loss among "
               "the runs, so every run reaches it).")
  out.append("Time and MB to target: at the first evaluation with train_loss <= target.")
  shared = [f"{k}={_fmt_value(runs[0].flat_config[k])}" for k in KEY_SETTINGS
            if k in runs[0].flat_config and k not in keys]
  if shared:
    out.append(f"Shared settings: {_md_cell(', '.join(shared))}.")
  out += [""] + _table(rows, target)
  notes = _notes(rows, skipped, consensus_note)
  if notes:
    out += ["", "## Notes", ""] + notes
  if figures:
    out += ["", "## Figures", ""]
    for fname, title in figures:
      out += [f"![{title}]({fname})", ""]
  return "\n".join(out).rstrip() + "\n"


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
    last evaluation, None for a run without them), ``skipped`` (``(dir, reason)``
    pairs), ``target_loss``, ``report`` (path of ``report.md``) and ``figures`` (paths of
    the PNGs written).

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
  figures = []
  if evaluated:
    eruns, elabels = [r for r, _ in evaluated], [lab for _, lab in evaluated]
    for xkey, xlabel, xscale in X_AXES:
      fname = f"loss_accuracy_vs_{xkey}.png"
      plot_loss_accuracy(eruns, elabels, xkey, xlabel, xscale, os.path.join(out, fname))
      figures.append((fname, f"training loss and test accuracy vs {xlabel}"))
  cons = [(i, r, lab) for i, (r, lab) in enumerate(evaluated) if has_consensus(r)]
  consensus_note = None
  cpath = os.path.join(out, CONSENSUS_FIGURE)
  if cons:
    plot_consensus([r for _, r, _ in cons], [lab for _, _, lab in cons], cpath,
                   [i for i, _, _ in cons])
    figures.append((CONSENSUS_FIGURE, "consensus distance vs step"))
    without = [r.name for r, _ in evaluated if not has_consensus(r)]
    if without:
      consensus_note = ("no consensus distance (all-reduce or not measured), not in "
                        f"{CONSENSUS_FIGURE}: {', '.join(without)}.")
  else:
    consensus_note = "no run has consensus distance data: no consensus plot."
    if os.path.exists(cpath):  # from an earlier report in the same directory
      os.remove(cpath)
  if not evaluated:
    consensus_note = (consensus_note or "") + " No run has an evaluation yet: no figures."
  report = os.path.join(out, "report.md")
  _atomic_write(report, _markdown(rows, runs, skipped, keys, target, target_loss is not None,
                                  figures, consensus_note))
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
