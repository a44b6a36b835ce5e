"""A study's trend: one column against a number of each run's summary, a point per variant
(the study's field ``trend``, :mod:`nbsgd_jax.study`; model sizes: the final loss against
``model_params``).

``trend = {"column": one of the study's columns, "x": a numeric field of each run's summary
(``record["summary"]``, :mod:`nbsgd_jax.study.runs`: ``model_params``, ...), "log_x": a log x
axis (default None: when the x values span more than a decade), "reference": a paper's
prediction drawn beside ours, ``{"label": its source, "points": [[x, y], ...]}`` (optional)}``. Per method and variant the
point is ``[x, mean, std, n]``: x the mean of the field over the variant's reported runs (every
method's, diverged ones included: the same x for every method), then the column's cell (mean,
sample standard deviation or None for one seed, seeds); ``OUT/trend.png`` draws one line per
method with the std as error bars.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.core import files as files_lib

FIELDS = ("column", "x", "log_x", "reference")


def check(raw, columns: list, errs: list) -> Optional[dict]:
  """The study's ``trend`` checked (module docstring).

  Args:
    raw: the field's value (None: no trend).
    columns: the study's column texts.
    errs: each bad field appends one line, ``study.trend.FIELD=VALUE is not allowed: WHAT
      IS``.

  Returns:
    ``{"column", "x", "log_x"}`` (``log_x`` None: decided by the values), or None.
  """
  if raw is None:
    return None
  n = len(errs)
  if not checks.record_fields(raw, FIELDS, "study.trend", "trend", errs):
    return None
  if raw.get("column") not in columns:
    errs.append(f"study.trend.column={raw.get('column')!r} is not allowed: it must be one of "
                f"the study's columns {', '.join(map(repr, columns))}")
  if not isinstance(raw.get("x"), str) or not raw["x"]:
    errs.append(f"study.trend.x={raw.get('x')!r} is not allowed: it must name a numeric field "
                "of each run's summary (model_params, ...)")
  if raw.get("log_x") not in (None, True, False):
    errs.append(f"study.trend.log_x={raw['log_x']!r} is not allowed: it must be True, False or "
                "None (a log axis when x spans more than a decade)")
  ref = _reference(raw.get("reference"), errs)
  return None if len(errs) > n else {"column": raw["column"], "x": raw["x"],
                                     "log_x": raw.get("log_x"), "reference": ref}


def _reference(ref, errs: list) -> Optional[dict]:
  """``trend.reference`` checked: None, or ``{"label": a text, "points": [[x, y], ...]}``
  (at least two finite pairs)."""
  if ref is None:
    return None
  pts = ref.get("points") if isinstance(ref, dict) else None
  good = (isinstance(ref, dict) and set(ref) == {"label", "points"}
          and isinstance(ref["label"], str) and ref["label"].strip()
          and isinstance(pts, (list, tuple)) and len(pts) >= 2
          and all(isinstance(p, (list, tuple)) and len(p) == 2
                  and all(_number(v) is not None for v in p) for p in pts))
  if not good:
    errs.append(f"study.trend.reference={ref!r} is not allowed: it must be {{'label': a text, "
                "'points': [[x, y], ...]} with at least two pairs of finite numbers")
    return None
  return {"label": ref["label"], "points": [[float(x), float(y)] for x, y in pts]}


def _number(value) -> Optional[float]:
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  return float(value) if ok else None


def mean_x(field: str, records: list) -> Optional[float]:
  """The mean of ``record["summary"][field]`` over ``records`` (those with a finite number
  there), or None when none has one."""
  got = [_number((r.get("summary") or {}).get(field)) for r in records if r]
  got = [v for v in got if v is not None]
  return float(np.mean(got)) if got else None


def points(spec: dict, reported: dict, tables: dict) -> dict:
  """The trend's points (module docstring).

  Args:
    spec: the checked ``trend``.
    reported: ``{method: {variant: {seed: record or None}}}`` (the reported runs).
    tables: :func:`nbsgd_jax.study.driver.columns`' value (``{variant: {"cells": ...}}``).

  Returns:
    ``{method: [[x, mean, std, n] per variant, in the study's order]}`` (x None: no run of
    the variant has the field; mean None: no finished seed, or a target not reached).
  """
  xs = {v: mean_x(spec["x"], [r for m in reported for r in reported[m][v].values()])
        for v in tables}
  out = {}
  for m in reported:
    cells = [(v, tables[v]["cells"][m][spec["column"]]) for v in tables]
    out[m] = [[xs[v], c["mean"], c["std"], c["n"]] for v, c in cells]
  return out


def log_axis(spec: dict, pts: dict) -> bool:
  """Whether x is drawn on a log axis: ``spec["log_x"]`` when set, else whether the positive
  x values (ours and the reference's) span more than a decade."""
  if spec.get("log_x") is not None:
    return bool(spec["log_x"])
  xs = [p[0] for line in pts.values() for p in line if p[0] is not None and p[0] > 0]
  xs += [p[0] for p in (spec.get("reference") or {}).get("points", []) if p[0] > 0]
  return bool(xs) and max(xs) / min(xs) > 10


def plot(pts: dict, spec: dict, title: str, path: str) -> None:
  """``OUT/trend.png``: per method, the column's mean against x (a point per variant with a
  mean and an x), with the std as error bars (none for one seed); a log x axis where
  :func:`log_axis` says."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (name, line) in enumerate(pts.items()):
    got = sorted((p for p in line if p[0] is not None and p[1] is not None),
                 key=lambda p: p[0])
    if not got:
      continue
    ax.plot([p[0] for p in got], [p[1] for p in got], "o-", color=f"C{i}", label=name)
    bars = [p for p in got if p[2] is not None]
    if bars:
      ax.errorbar([p[0] for p in bars], [p[1] for p in bars], yerr=[p[2] for p in bars],
                  fmt="none", ecolor=f"C{i}", capsize=3)
  ref = spec.get("reference")
  if ref:
    ax.plot(*zip(*ref["points"]), "k--", lw=1, label=ref["label"])
  ax.set_xscale("log" if log_axis(spec, pts) else "linear")
  ax.set_xlabel(spec["x"])
  ax.set_ylabel(spec["column"])
  ax.grid(alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8)
  ax.set_title(title)
  fig.tight_layout()
  files_lib.atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
  plt.close(fig)
