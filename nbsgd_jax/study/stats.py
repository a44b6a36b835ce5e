"""A study's numbers: the statistics over seeds, the tuning pick and the grid's extension at
an edge, a value at equal bytes or time, the time to a target, and the percentage gap to a
reference method paired by seed (pure functions of numbers and evaluation histories; no
training here)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def summarize(values: dict, diverged=(), unfinished=(), unpaired=()) -> dict:
  """Mean and sample standard deviation (ddof 1) over seeds.

  Args:
    values: ``{seed: value}`` of the finished runs; a value None is a target not reached.
    diverged, unfinished: the seeds whose runs diverged or have not run (named, left out).
    unpaired: the seeds of a gap to a reference (:func:`relative`) whose reference run has
      no value on that seed (named, left out).

  Returns:
    ``{"mean", "std", "n", "values", "not_reached", "diverged", "unfinished", "unpaired"}``:
    ``std`` None with one seed (never 0), ``mean`` None with none; ``not_reached`` the seeds
    whose value is None (then ``mean`` and ``std`` are None: a time to a target that a seed
    misses has no mean).
  """
  missed = [s for s, v in values.items() if v is None]
  got = np.array([v for v in values.values() if v is not None], np.float64)
  ok = not missed and got.size > 0
  return {"mean": float(got.mean()) if ok else None,
          "std": float(got.std(ddof=1)) if ok and got.size > 1 else None,
          "n": int(got.size), "values": dict(values), "not_reached": missed,
          "diverged": list(diverged), "unfinished": list(unfinished),
          "unpaired": list(unpaired)}


def no_target(diverged=(), unfinished=()) -> dict:
  """The summary of a time-to-target cell whose target (a reference method's mean final
  value) does not exist, the reference having no finished run: :func:`summarize`'s fields
  with no value and ``"no_target": True`` (shown "no target", never a number)."""
  return {**summarize({}, diverged, unfinished), "no_target": True}


def show(s: dict, fmt: str = "{:.4g}") -> str:
  """A summary as a table cell: ``0.1234 ± 0.0056 (3 seeds)``, ``0.1234 (1 seed)``, ``not
  reached (2 of 3 seeds)``, ``no target`` (:func:`no_target`), ``—`` (no finished seed);
  diverged, unfinished and unpaired seeds named."""
  finished = len(s["values"])
  if s.get("no_target"):
    cell = "no target"
  elif s["not_reached"]:
    cell = f"not reached ({len(s['not_reached'])} of {finished} seeds)"
  elif s["mean"] is None:
    cell = "—"
  elif s["std"] is None:
    cell = f"{fmt.format(s['mean'])} (1 seed)"
  else:
    cell = f"{fmt.format(s['mean'])} ± {fmt.format(s['std'])} ({s['n']} seeds)"
  for word in ("diverged", "unfinished"):
    if s[word]:
      cell += f"; {word}: seed {', '.join(map(str, s[word]))}"
  if s.get("unpaired"):
    cell += f"; no reference: seed {', '.join(map(str, s['unpaired']))}"
  return cell


def score(value: Optional[float], mode: str) -> float:
  """A tuning run's score, lower is better: ``value`` (``mode`` "min") or ``-value``
  ("max"); a diverged run, a missing or non-finite value: +inf (never picked)."""
  if value is None or not math.isfinite(value):
    return math.inf
  return value if mode == "min" else -value


def pick(scores: list) -> int:
  """The index of the best (lowest) score, the first of equals; -1 when every score is inf
  (every run diverged)."""
  best = int(np.argmin(scores)) if scores else -1
  return best if best >= 0 and math.isfinite(scores[best]) else -1


def beyond(values: list, value) -> Optional[object]:
  """The next value of a tuning axis beyond ``value`` when it is the smallest or the largest
  of ``values``: one step at the grid's spacing at that edge, geometric for positive numbers
  (``[0.01, 0.1]``, 0.1 -> 1.0), arithmetic otherwise, rounded for integers (to 3 significant
  digits otherwise); None inside the
  grid, for one value, or for booleans and strings (no next value)."""
  nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
  if len(nums) != len(values) or len(values) < 2 or value not in (min(nums), max(nums)):
    return None
  ordered = sorted(nums)
  edge, near = (ordered[0], ordered[1]) if value == ordered[0] else (ordered[-1], ordered[-2])
  out = edge * (edge / near) if min(nums) > 0 else edge + (edge - near)
  if all(isinstance(v, int) for v in values):
    out = int(round(out))
  else:
    out = float(f"{out:.3g}")  # 0.1 * (0.1 / 0.03) -> 0.333, not 0.33333333333333337
  return None if out in values else out


def extensions(grid: list, point: dict) -> list[dict]:
  """The points one step beyond ``point`` (a grid point picked at an edge): per axis of
  ``grid`` (``[(key, values)]``) where ``point`` sits at an edge, ``point`` with that axis'
  :func:`beyond` value."""
  out = []
  for key, values in grid:
    nxt = beyond(values, point[key])
    if nxt is not None:
      out.append({**point, key: nxt})
  return out


def widen(grid: list, added: list) -> list:
  """``grid`` (``[(key, values)]``) with each axis' values of the ``added`` points (the
  extensions beyond an edge, :func:`extensions`), sorted: the grid whose edges the next
  extension and :func:`at_edge` read."""
  return [(k, sorted(set(v) | {p[k] for p in added})) for k, v in grid]


def at_edge(grid: list, point: dict) -> bool:
  """Whether ``point`` is at the smallest or largest value of a numeric axis of ``grid``
  with two values or more (a pick there may be limited by the grid)."""
  return any(beyond(values, point[key]) is not None for key, values in grid)


def final(history: list, metric: str) -> Optional[float]:
  """``metric`` at the last evaluation of ``history`` that records it, or None."""
  for h in reversed(history):
    if h.get(metric) is not None:
      return float(h[metric])
  return None


def at_equal(history: list, x: str, metric: str, at: float) -> Optional[float]:
  """``metric`` at ``x == at`` (linear interpolation between the evaluations, ``np.interp``;
  ``x`` nondecreasing over the history, e.g. ``bytes_sent``, ``sim_time``); None when
  ``at`` is past the history's last ``x`` or the history has no ``metric``."""
  pts = [(h[x], h[metric]) for h in history if h.get(x) is not None and h.get(metric) is not None]
  if not pts or at > pts[-1][0] * (1 + 1e-12):
    return None
  xs, ys = np.array(pts, np.float64).T
  return float(np.interp(at, xs, ys))


def time_to(history: list, x: str, metric: str, op: str, target: float) -> Optional[float]:
  """``x`` when ``metric`` first reaches ``target`` (``op`` "<=": at or below it; ">=": at or
  above): linear interpolation between the evaluation before and the first that reaches it
  (that one's ``x`` when it is the first evaluation); None when none does ("not reached")."""
  prev = None
  for h in history:
    y = h.get(metric)
    if y is None or h.get(x) is None:
      continue
    if (y <= target) if op == "<=" else (y >= target):
      if prev is None or prev[1] == y:
        return float(h[x])
      (x0, y0), x1 = prev, h[x]
      return float(x0 + (x1 - x0) * (y0 - target) / (y0 - y))
    prev = (h[x], y)
  return None


def common_x(histories: list, x: str) -> Optional[float]:
  """The ``x`` every history reaches: the smallest of their last values (equal bytes or
  time: compare each run there); None with no history."""
  ends = [h[-1][x] for h in histories if h and h[-1].get(x) is not None]
  return float(min(ends)) if ends else None


def relative(values: dict, reference: dict) -> tuple[dict, list]:
  """The percentage gap of a method to a reference method, paired by seed (Charles et al.
  2025, arXiv 2503.09799: "percentage difference in evaluation loss relative to
  data-parallel").

  Args:
    values: ``{seed: the method's final value}`` of its finished runs (None: no value).
    reference: ``{seed: the reference's final value}`` of its finished runs.

  Returns:
    ``({seed: 100 * (value / reference - 1)}`` (percent) over the seeds where both have a
    finite value and the reference's is not 0, ``[the method's other seeds]`` (unpaired)).
  """
  out, unpaired = {}, []
  for seed, v in values.items():
    r = reference.get(seed)
    if v is None or r is None or r == 0 or not (math.isfinite(v) and math.isfinite(r)):
      unpaired.append(seed)
    else:
      out[seed] = 100.0 * (v / r - 1.0)
  return out, unpaired


def mean_of(values) -> Optional[float]:
  """The mean of the values that are not None, or None when there is none (a reference
  target: the reference method's mean final value over its finished seeds)."""
  got = [v for v in values if v is not None]
  return float(np.mean(got)) if got else None
