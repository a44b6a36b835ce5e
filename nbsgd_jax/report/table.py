"""The report's markdown: ``report.md``'s table (one row per run), its notes and figures.

:func:`_markdown` renders the rows that :func:`nbsgd_jax.report.build_report` computes: the
settings the runs share (:func:`shared_settings`, the fleet's included), the table with the
fleet's columns (goodput and time by cause, :data:`FLEET_COLUMNS`; the counterfactual,
:data:`IDEAL_COLUMNS`; the faults, :data:`FAULT_COLUMNS`) and the event clock's
(:data:`ASYNC_COLUMNS`) that some run has, what produced each run (the commit and JAX version,
:data:`PROVENANCE_COLUMNS`: a shared setting when the same in every run, else a column), a
note on what an event-clock run's steps applied (:func:`event_note`), and the figures with
the notes under them. :mod:`nbsgd_jax.report` re-exports these names (the module to import).
"""

from __future__ import annotations

import json
from typing import Any

from nbsgd_jax.report import fleet as fleet_lib

# Shown as "shared settings" in report.md when they do not differ.
KEY_SETTINGS = ("algorithm", "num_workers", "topology", "backend", "model", "dataset",
                "batch_size", "learning_rate", "num_steps")
# The event clock's record keys (nbsgd_jax.host.events: EventTimes.record, ServerEventTimes
# .record): (key, column of report.md, format); a column is shown when some run has its key.
# Staleness: tau is the paper's (every worker's updates between a gradient's read and its
# application; asynchronous DiLoCo: server updates between pull and push), own steps the
# changes to the worker's own model in between (AD-PSGD, SwarmSGD).
ASYNC_COLUMNS = (("events", "events", ".0f"), ("pushes", "pushes", ".0f"),
                 ("staleness_tau", "staleness tau mean", ".3g"),
                 ("staleness_tau_max", "staleness tau max", ".0f"),
                 ("staleness_own_steps", "own-model staleness mean", ".3g"))
# Where the fleet's time went (nbsgd_jax.host.ledger on the lockstep clock, the event
# clock's host parts): goodput (the fraction of n x sim_time whose computation ends in the
# model) and the split of the time by cause, each a fraction of n x sim_time.
FLEET_COLUMNS = (("goodput", "goodput", ".3f"), ("time_compute", "computing", ".3f"),
                 ("time_comm", "communicating", ".3f"), ("time_wait", "waiting", ".3f"),
                 ("time_down", "down", ".3f"))
# The counterfactual (nbsgd_jax.host.ledger, lockstep runs): the same steps with every worker
# up at slowdown 1, without stragglers, episodes or traces; "sim / ideal" (a row's
# ideal_ratio, sim_time / sim_time_ideal) is what the stragglers and failures cost.
IDEAL_COLUMNS = (("sim_time_ideal", "ideal sim time (s)", ".4g"),
                 ("ideal_ratio", "sim / ideal", ".3g"))
# The faults the fleet met (nbsgd_jax.host.faults, nbsgd_jax.host.ledger.Restarts): a run's
# record has a count only when it simulated that process ("-" without it, 0 when it drew none).
FAULT_COLUMNS = (("failures", "failures", ".0f"), ("episodes", "episodes", ".0f"),
                 ("restarts", "restarts", ".0f"))
# shown where some run has the key (ideal_ratio: computed from the row's record fields)
EXTRA_COLUMNS = FLEET_COLUMNS + IDEAL_COLUMNS + FAULT_COLUMNS + ASYNC_COLUMNS
GOODPUT_NOTE = ("goodput: the seconds the workers computed gradients that entered the model, "
                "over n x sim time (Decoupled DiLoCo's \"useful training time as a fraction "
                "of wall-clock\", per worker); computing + communicating + waiting + down = 1 "
                "(docs/clock.md, \"Goodput\").")
IDEAL_NOTE = ("ideal sim time: the same steps and communication rounds on a clock with every "
              "worker up, at slowdown 1, without straggler delays, episodes or traces; sim / "
              "ideal is what the stragglers, episodes and failures cost (docs/clock.md, "
              "\"Where the time went\").")
FAULT_NOTE = ("failures, episodes, restarts: the failures (schedule and rate) and fail-slow "
              "episodes begun over every worker, and the restarts they caused; \"-\": the run "
              "simulated no such process, 0: it did and none began.")
# What produced a run (nbsgd_jax.core.provenance, a row's "commit": 10 hex digits and
# "+dirty", and "jax"): (row key, setting or column title); "-" for a run recorded before
# provenance existed.
PROVENANCE_COLUMNS = (("commit", "commit"), ("jax", "jax"))
EVENT_CLOCK_DOC = "docs/algorithms.md, \"The event clock\""
NO_EVAL = "no evaluation yet"


def _fmt_value(v: Any) -> str:
  if isinstance(v, (list, dict)):
    return json.dumps(v, separators=(",", ":"))
  return str(v)


def _f(x: Any, spec: str = ".4g", none: str = "-") -> str:
  return none if x is None else format(x, spec)


def _md_cell(s: str) -> str:
  return s.replace("|", "\\|")


def provenance_split(rows: list) -> tuple[dict, list]:
  """The :data:`PROVENANCE_COLUMNS` of ``rows``: ``({title: value} the same in every row,
  [(row key, title)] that differ: columns of the table)``."""
  shared, columns = {}, []
  for key, title in PROVENANCE_COLUMNS:
    values = {row.get(key, "-") for row in rows}
    if len(values) == 1:
      shared[title] = values.pop()
    else:
      columns.append((key, title))
  return shared, columns


def _table(rows: list, target: float | None) -> list[str]:
  """The lines of report.md's table: one row per run; the algorithm as run, the differing
  settings it does not state, the event clock's columns (:data:`ASYNC_COLUMNS`) that
  some run has ("-" for the others), and the commit or JAX version where runs differ."""
  extra = [c for c in EXTRA_COLUMNS if any(row[c[0]] is not None for row in rows)]
  _, made_by = provenance_split(rows)
  head = ["run", "algorithm", "settings (differing)", "steps", "final test acc",
          "final train loss", "sim time (s)", "wall time (s)", "MB sent", "sim s to target",
          "wall s to target", "MB to target", "samples/s"] + [title for _, title, _ in extra] \
      + [title for _, title in made_by]
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
             _f(row["samples_per_second"], ".0f")] + [_f(row[k], spec) for k, _, spec in extra] \
        + [str(row.get(k, "-")) for k, _ in made_by]
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
  if any(row.get("goodput") is not None for row in rows):
    notes.append(f"- {GOODPUT_NOTE}")
  if any(row.get("sim_time_ideal") is not None for row in rows):
    notes.append(f"- {IDEAL_NOTE}")
  if any(row.get(k) is not None for row in rows for k, _, _ in FAULT_COLUMNS):
    notes.append(f"- {FAULT_NOTE}")
  for path, reason in skipped:
    notes.append(f"- skipped {path}: {reason}")
  if consensus_note:
    notes.append(f"- {consensus_note}")
  return notes


def shared_settings(runs: list, keys: list) -> dict:
  """``{dotted key: value}`` the runs share: the :data:`KEY_SETTINGS` that do not differ
  (``keys``: the differing ones), then the fleet's settings (the network's levels and
  placement, a trace, failures, episodes: :func:`nbsgd_jax.report.fleet.fleet_settings`)
  that every run has, with the same value."""
  first = runs[0].flat_config
  out = {k: first[k] for k in KEY_SETTINGS if k in first and k not in keys}
  fleets = [fleet_lib.fleet_settings(r.flat_config) for r in runs]
  for k, v in fleets[0].items():
    if k not in keys and all(k in f and f[k] == v for f in fleets[1:]):
      out[k] = v
  return out


def _shared_lines(runs: list, keys: list, rows: list) -> list[str]:
  shared = {**shared_settings(runs, keys), **provenance_split(rows)[0]}
  if not shared:
    return []
  return (["", "Shared settings (the same in every run):", "", "| setting | value |", "|---|---|"]
          + [f"| {k} | {_md_cell(_fmt_value(v))} |" for k, v in shared.items()])


def _markdown(rows: list, runs: list, skipped: list, keys: list, target: float | None,
              target_given: bool, figures: list, consensus_note: str | None,
              figure_notes: dict | None = None) -> str:
  out = ["# Run comparison", ""]
  if target is None:
    out.append("Target training loss: none (no run has a finite final training loss).")
  elif target_given:
    out.append(f"Target training loss: {target:.4g} (`--target_loss`).")
  else:
    out.append(f"Target training loss: {target:.4g} (the highest final training loss among "
               "the runs, so every run reaches it).")
  out.append("Time and MB to target: at the first evaluation with train_loss <= target.")
  out += _shared_lines(runs, keys, rows)
  out += [""] + _table(rows, target)
  notes = _notes(rows, skipped, consensus_note)
  if notes:
    out += ["", "## Notes", ""] + notes
  if figures:
    out += ["", "## Figures", ""]
    for fname, title in figures:
      out += [f"![{title}]({fname})", ""]
      for note in (figure_notes or {}).get(fname, ()):
        out += [f"*{note}*", ""]
  return "\n".join(out).rstrip() + "\n"
