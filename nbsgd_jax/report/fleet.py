"""The simulated fleet in the report: its settings (the network's levels and placement, a
compute trace, failures and fail-slow episodes: :func:`fleet_settings`, :func:`fleet_words`)
and where each run's time went (:func:`cause_seconds`, :func:`plot_time_by_cause`).

Everything here reads a run's ``config.json`` and its records as written: the time by cause
(``time_compute``, ``time_comm``, ``time_wait``, ``time_down``: fractions of ``sim_time``, the
mean over the workers, :mod:`nbsgd_jax.host.ledger` and :class:`nbsgd_jax.host.outages.
FleetTime`), the counterfactual ``sim_time_ideal`` and the counts ``failures``, ``episodes``
(:mod:`nbsgd_jax.host.faults`) and ``restarts`` (:class:`nbsgd_jax.host.ledger.Restarts`).
:mod:`nbsgd_jax.report` re-exports these names.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

from nbsgd_jax.report.plots import _atomic_savefig, _new_figure

# (record key, segment of the bar, colour): the time by cause, in the ledger's order
CAUSES = (("time_compute", "computing", "C2"), ("time_comm", "communicating", "C0"),
          ("time_wait", "waiting", "C7"), ("time_down", "down", "C3"))
TIME_FIGURE = "time_by_cause.png"


def _on(x: Any) -> bool:
  """A setting that is set: a non-empty string or list, a number > 0, True."""
  if isinstance(x, bool):
    return x
  if isinstance(x, (int, float)):
    return x > 0
  return bool(x)


def _failures_on(cfg: dict) -> bool:
  return _on(str(cfg.get("cluster.failures") or "").strip()) or _on(
      cfg.get("cluster.failure_mtbf"))


def _restart(cfg: dict) -> bool:
  return _failures_on(cfg) and cfg.get("cluster.failure_policy") == "restart"


# The fleet's setting groups: (name, whether a run has it, its keys in order). A group's keys
# are a run's fleet settings when the test holds for its flattened config (``cluster.levels``
# set: the network; failures by schedule or rate; ``cluster.episode_rate`` > 0: episodes).
FLEET_GROUPS: tuple[tuple[str, Callable[[dict], bool], tuple], ...] = (
    ("network", lambda c: _on(c.get("cluster.levels")),
     ("cluster.levels", "cluster.placement")),
    ("trace", lambda c: _on(c.get("cluster.trace")), ("cluster.trace",)),
    ("failures", _failures_on,
     ("cluster.failures", "cluster.failure_mtbf", "cluster.failure_repair",
      "cluster.failure_shape", "cluster.failure_policy", "cluster.quorum_policy",
      "cluster.rejoin_fetch")),
    ("restarts", _restart, ("cluster.restart_every", "cluster.restart_seconds")),
    ("episodes", lambda c: _on(c.get("cluster.episode_rate")),
     ("cluster.episode_rate", "cluster.episode_median", "cluster.episode_sigma",
      "cluster.episode_factor")),
)
# keys of a group shown only when set (a placement is none by default, like a schedule)
_WHEN_SET = ("cluster.placement", "cluster.failures", "cluster.failure_mtbf")


def fleet_settings(cfg: dict) -> dict:
  """``{dotted key: value}`` of the fleet settings a run has (:data:`FLEET_GROUPS`), from its
  flattened config, in group order; empty for a flat network without trace, failures or
  episodes."""
  out = {}
  for _, has, keys in FLEET_GROUPS:
    if has(cfg):
      out.update({k: cfg.get(k) for k in keys if k in cfg and (k not in _WHEN_SET
                                                              or _on(cfg.get(k)))})
  return out


def fleet_keys(runs: Sequence[Any]) -> list[str]:
  """Every fleet setting key some run of ``runs`` (:class:`~nbsgd_jax.report.runs.Run`) has,
  in group order."""
  keys: list[str] = []
  for r in runs:
    keys += [k for k in fleet_settings(r.flat_config) if k not in keys]
  return keys


def _g(x: Any) -> str:
  return format(x, "g") if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _words(name: str, cfg: dict, diff: Sequence[str]) -> str:
  """One fleet group of a run in words (its label's part); ``diff``: the group's keys that
  differ between the runs (what a group without words of its own states)."""
  if name == "network":
    levels = ",".join(str(v) for v in cfg.get("cluster.levels") or ())
    place = cfg.get("cluster.placement")
    return f"levels {levels}" + (f", placement {_g(list(place))}" if _on(place) else "")
  if name == "trace":
    return f"trace {os.path.basename(str(cfg.get('cluster.trace')))}"
  if name == "episodes":
    return (f"episodes ({_g(cfg.get('cluster.episode_rate'))}/h, median "
            f"{_g(cfg.get('cluster.episode_median'))} s, x{_g(cfg.get('cluster.episode_factor'))})")
  return ", ".join(f"{k}={_g(cfg.get(k))}" for k in diff)


_OFF = {"network": "flat network", "trace": "no trace", "failures": "no failures",
        "restarts": "no restarts", "episodes": "no episodes"}


def fleet_words(cfg: dict, differing: Sequence[str], named: Sequence[str] = ()) -> tuple:
  """The fleet groups whose keys differ between the runs, in words for a run's label:
  ``(words, keys they state)``; e.g. ``["levels 2:1e-05:1e9", "episodes (0.03/h, median
  1260 s, x1.5)"]``; a group the run does not have reads ``"no episodes"``. Groups whose
  differing keys are all in ``named`` (the algorithm as run states the failures) are left
  to it."""
  words, keys = [], []
  for name, has, group in FLEET_GROUPS:
    diff = [k for k in group if k in differing]
    if not diff or all(k in named for k in diff):
      continue
    own = [k for k in diff if k not in named]
    words.append(_words(name, cfg, own) if has(cfg) else _OFF[name])
    keys += list(group)
  return words, keys


def cause_seconds(row: dict) -> Optional[dict]:
  """``{record key: seconds}`` of a report row's time by cause (each fraction times its
  ``sim_time``: the mean seconds per worker, adding up to ``sim_time``), or None when the
  row lacks one of them."""
  total = row.get("sim_time")
  if total is None or any(row.get(k) is None for k, _, _ in CAUSES):
    return None
  return {k: row[k] * total for k, _, _ in CAUSES}


def plot_time_by_cause(rows: Sequence[dict], path: str) -> bool:
  """One horizontal stacked bar per row with its time by cause (:func:`cause_seconds`, s),
  a tick at its ``sim_time_ideal`` where it has one, named by ``row["run"]`` (the table's
  first column: a label is too long beside a bar); written
  atomically to ``path``. Returns False (nothing written) when no row has the split."""
  bars = [(row, cause_seconds(row)) for row in rows]
  bars = [(row, secs) for row, secs in bars if secs is not None]
  if not bars:
    return False
  fig = _new_figure((8.0, 2.2 + 0.45 * len(bars)))
  ax = fig.subplots()
  ys = list(range(len(bars)))[::-1]  # the first run on top
  left = [0.0] * len(bars)
  for key, name, color in CAUSES:
    widths = [secs[key] for _, secs in bars]
    ax.barh(ys, widths, left=left, color=color, label=name, height=0.6)
    left = [a + b for a, b in zip(left, widths)]
  ideal = [(y, row["sim_time_ideal"]) for y, (row, _) in zip(ys, bars)
           if row.get("sim_time_ideal") is not None]
  if ideal:
    ax.scatter([x for _, x in ideal], [y for y, _ in ideal], marker="|", s=400, color="k",
               label="ideal sim time", zorder=3)
  ax.set_yticks(ys, [row["run"] for row, _ in bars], fontsize="small")  # the table's run
  ax.set_xlabel("simulated seconds per worker, the mean over the workers (a bar: sim time)")
  ax.set_title("where the time went")
  ax.grid(True, axis="x", alpha=0.3)
  ax.legend(fontsize="small", ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))
  _atomic_savefig(fig, path)
  return True


__all__ = ["CAUSES", "FLEET_GROUPS", "TIME_FIGURE", "cause_seconds", "fleet_keys",
           "fleet_settings", "fleet_words", "plot_time_by_cause"]
