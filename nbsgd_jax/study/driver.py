"""The study's protocol: tune each method on the tuning seed(s) over its grid (with
``tune.overrides``; up to ``tune.extend`` steps beyond an edge pick), pick by the score, run
the reported seeds of every variant at the pick (with a prefix, each run starting from its
seed's prefix: :mod:`nbsgd_jax.study.stages`), then the columns over seeds
(:mod:`nbsgd_jax.study.stats`), the trend (:mod:`nbsgd_jax.study.trend`) and the provenance
of the runs used."""

from __future__ import annotations

import os
from typing import Optional

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.study import runs as runs_lib
from nbsgd_jax.study import schema
from nbsgd_jax.study import stages
from nbsgd_jax.study import stats
from nbsgd_jax.study import trend as trend_lib


def _mode(name: str, only: Optional[list], redo: list) -> str:
  if name in redo:
    return "redo"
  return "train" if only is None or name in only else "cached"


def _tried(study, base, store, name: str, pts: list, mode: str, variant: str) -> list[dict]:
  """The tuning runs of ``pts`` on the tuning seeds and ``variant`` (their configs with
  ``tune.overrides``): ``[{"point", "score", "runs"}]``, the score the mean over the tuning
  seeds of each run's :func:`stats.score` (inf: a seed diverged or has not run)."""
  where = "" if variant == study.tune_variant else f" {variant}"
  jobs = [(schema.compose(study, base, name, variant, p, s, tuning=True),
           f"{name}{where} tune {_label(p)} seed {s}", mode) for p in pts for s in study.tune_seeds]
  got = store.get(jobs)
  out, n = [], len(study.tune_seeds)
  for i, p in enumerate(pts):
    recs = got[i * n:(i + 1) * n]
    scores = [stats.score(None if r is None or r["diverged"] else
                          stats.final(r["history"], study.metric), study.mode) for r in recs]
    out.append({"point": p, "score": sum(scores) / n,
                "runs": [r["key"] if r else None for r in recs],
                "diverged": [s for s, r in zip(study.tune_seeds, recs) if r and r["diverged"]],
                "unfinished": [s for s, r in zip(study.tune_seeds, recs) if r is None]})
  return out


def _label(point: dict) -> str:
  return ", ".join(f"{k}={v}" for k, v in point.items())


def tune(study, base, store, name: str, mode: str, variant: str) -> dict:
  """Method ``name`` tuned on ``variant`` (module docstring): ``{"pick": point or None,
  "edge": the pick is at an edge of the (extended) grid, "grid": the tried points with their
  scores, "extended": the points added beyond an edge, in order}``. While the pick is at an
  edge, up to ``study.extend`` times: the points one step beyond it
  (:func:`stats.extensions` of the grid extended so far; those whose config is refused
  dropped) are tried, the grid grows by them and the pick is made again."""
  method = study.methods[name]
  tried = _tried(study, base, store, name, schema.points(method.grid), mode, variant)
  best = stats.pick([t["score"] for t in tried])
  grid, extended = method.grid, []
  for _ in range(study.extend):
    if best < 0:
      break
    new = [p for p in stats.extensions(grid, tried[best]["point"]) if _valid(
        study, base, name, p, variant)]
    if not new:
      break
    tried += _tried(study, base, store, name, new, mode, variant)
    grid, extended = stats.widen(grid, new), extended + new
    best = stats.pick([t["score"] for t in tried])
  pick = tried[best]["point"] if best >= 0 else None
  for t in tried:
    t["score"] = t["score"] if t["score"] != float("inf") else None
  return {"pick": pick, "edge": bool(pick) and stats.at_edge(grid, pick), "grid": tried,
          "extended": extended}


def _valid(study, base, name: str, point: dict, variant: str) -> bool:
  """Whether the config at ``point`` is accepted (an extension past a key's range is
  dropped: ``easgd.beta`` beyond 1)."""
  try:
    config_lib.validate(schema.compose(study, base, name, variant, point,
                                       study.tune_seeds[0], tuning=True))
    return True
  except config_lib.ConfigError:
    return False


def report(study, base, store, name: str, picks: dict, mode: str) -> dict:
  """The reported runs of method ``name``, each variant ``v`` at ``picks[v]``: ``{variant:
  {seed: record or None}}`` (None: not run; every seed None without a pick)."""
  cells = [(v, s) for v in picks for s in study.seeds if picks[v] is not None]
  got = store.get([(schema.compose(study, base, name, v, picks[v], s),
                    f"{name} {v} seed {s}", mode) for v, s in cells])
  out: dict = {v: {s: None for s in study.seeds} for v in picks}
  for (v, s), r in zip(cells, got):
    out[v][s] = r
  return out


def tune_and_report(study, base, store, name: str, mode: str) -> tuple[dict, dict]:
  """Method ``name`` tuned (on ``tune.variant``, or on each variant) and reported: its entry
  (:func:`tune`'s, or ``{"variants": {v: tune's}}``) and :func:`report`'s runs."""
  if study.tune_variant != schema.EACH:
    entry = tune(study, base, store, name, mode, study.tune_variant)
    return entry, report(study, base, store, name, {v: entry["pick"] for v in study.variants},
                         mode)
  entry = {"variants": {v: tune(study, base, store, name, mode, v) for v in study.variants}}
  picks = {v: e["pick"] for v, e in entry["variants"].items()}
  return entry, report(study, base, store, name, picks, mode)


def columns(study, reported: dict) -> dict:
  """``{variant: {"equal": {x: the common x}, "targets": {column: the target from its
  reference method, or None: no target}, "cells": {method: {column: summary}}}}``
  (:func:`stats.summarize`), ``reported``: ``{method: {variant: {seed: record}}}``. A "gap"
  column pairs each seed with the reference method's run of the same seed
  (:func:`stats.relative`); a "to" column with a reference method reads to that method's mean
  final metric over its finished seeds (:func:`stats.mean_of`)."""
  out = {}
  for v in study.variants:
    fine = {m: {s: r for s, r in reported[m][v].items() if r and not r["diverged"]}
            for m in reported}
    hists = [r["history"] for m in fine for r in fine[m].values()]
    equal = {c.x: stats.common_x(hists, c.x) for c in study.columns if c.kind == "equal"}
    targets = {c.text: stats.mean_of(_finals(fine[c.ref], c.metric).values())
               for c in study.columns if c.kind == "to" and c.ref}
    cells = {}
    for m, runs in reported.items():
      div = [s for s, r in runs[v].items() if r and r["diverged"]]
      unf = [s for s, r in runs[v].items() if r is None]
      cells[m] = {c.text: _cell(c, fine, m, equal, targets, div, unf) for c in study.columns}
    out[v] = {"equal": equal, "targets": targets, "cells": cells}
  return out


def _finals(runs: dict, metric: str) -> dict:
  return {s: stats.final(r["history"], metric) for s, r in runs.items()}


def _cell(c, fine: dict, m: str, equal: dict, targets: dict, div: list, unf: list) -> dict:
  """Method ``m``'s summary of column ``c`` on a variant (``fine``: ``{method: {seed: its
  finished run}}``)."""
  if c.kind == "gap":
    values, unpaired = stats.relative(_finals(fine[m], c.metric), _finals(fine[c.ref], c.metric))
    return stats.summarize(values, div, unf, unpaired)
  if c.kind == "to" and c.ref and targets[c.text] is None:
    return stats.no_target(div, unf)
  target = targets[c.text] if c.ref else c.target
  return stats.summarize({s: _value(c, r["history"], equal, target)
                          for s, r in fine[m].items()}, div, unf)


def _value(c, history: list, equal: dict, target: Optional[float]) -> Optional[float]:
  if c.kind == "final":
    return stats.final(history, c.metric)
  if c.kind == "equal":
    return None if equal[c.x] is None else stats.at_equal(history, c.x, c.metric, equal[c.x])
  return stats.time_to(history, c.x, c.metric, c.op, target)


def run(study, out: str, only: Optional[list] = None, redo: tuple = (),
        progress: bool = True, allow_mixed: bool = False) -> dict:
  """The whole study (module docstring), its runs cached under ``out/runs``.

  Args:
    study: a checked study (:func:`nbsgd_jax.study.schema.check`).
    out: the study's directory.
    only: train these methods only (the others: read from the cache, their missing runs
      named unfinished); None: all.
    redo: retrain these methods' runs (their cached runs replaced).
    progress: show the progress bar.
    allow_mixed: train new runs into a cache holding runs of another commit
      (:meth:`nbsgd_jax.study.runs.Store.check_commits`); reading never needs it.

  Returns:
    the results (:func:`nbsgd_jax.study.output.write` writes them): ``{"study", "quick",
    "methods": {name: {"pick", "edge", "grid", "extended", "runs": {variant: {seed: {"key",
    "status", "final"}}}}}, "variants": :func:`columns`' value, "claims": the study's,
    "provenance": this process's (:func:`nbsgd_jax.core.provenance.provenance`),
    "run_commits": {commit or None: number of runs} over the runs used (tuning and reported),
    "mixed": whether those runs come from more than one commit or this process trained into a
    cache of another commit's runs}``, with a trend (:mod:`nbsgd_jax.study.trend`) ``"trend":
    {method: [[x, mean, std, n] per variant]}`` and ``"trend_spec": {"column", "x", "log_x"
    (decided)}``; with a prefix (:mod:`nbsgd_jax.study.stages`), ``"prefix": {seed: {"key",
    "status", "final": its final metric, "steps"}}`` and ``"prefix_spec": {"overrides",
    "budget"}`` (the prefixes' commits count in ``run_commits``).

  Raises:
    ConfigError: ``only`` or ``redo`` names an unknown method, a composed config is refused
      (:func:`nbsgd_jax.study.schema.validate`), or a run would train into a cache of another
      commit's runs without ``allow_mixed``.
  """
  bad = [m for m in list(only or ()) + list(redo) if m not in study.methods]
  if bad:
    raise config_lib.ConfigError([f"--only/--redo {m!r} is not allowed: the study's methods "
                                  f"are {', '.join(study.methods)}" for m in bad])
  base = schema.base_config(study)
  schema.validate(study, base)
  store = runs_lib.Store(os.path.join(out, "runs"), progress, allow_mixed)
  prefixes = None
  if study.prefix:  # each seed's prefix: under its key, or one cached before by the resume rule
    study = stages.resolve(study, base, out)
    prefixes = stages.Prefixes(study, base, out, store)
    store.prepare = prefixes.prepare  # a run's prefix trains first; its init_from made absolute
  try:
    methods, reported = {}, {}
    for name in study.methods:
      mode = _mode(name, only, list(redo))
      methods[name], reported[name] = tune_and_report(study, base, store, name, mode)
  finally:
    store.close()
  for name, entry in methods.items():
    entry["runs"] = {v: {s: _status(r, study.metric) for s, r in seeds.items()}
                     for v, seeds in reported[name].items()}
  tables = columns(study, reported)
  prefix = prefixes.results(study.metric) if prefixes else None
  commits = _commits(store.used)
  results = {"study": study.path, "quick": study.quick, "metric": study.metric,
             "mode": study.mode, "tune_seeds": list(study.tune_seeds),
             "seeds": list(study.seeds), "tune_variant": study.tune_variant,
             "budget": dict([study.budget]), "columns": [c.text for c in study.columns],
             "methods": methods, "variants": tables, "claims": list(study.claims),
             provenance_lib.KEY: provenance_lib.provenance(), "run_commits": commits,
             "mixed": store.mixed or len(commits) > 1,
             "histories": _histories(reported, study)}
  if study.tune_overrides:  # a study without them: the results of before
    results["tune_overrides"] = dict(study.tune_overrides)
  if prefixes:
    results["prefix"], results["prefix_spec"] = prefix, stages.spec(study)
  if study.trend:
    results["trend"] = trend_lib.points(study.trend, reported, tables)
    results["trend_spec"] = {**study.trend,
                             "log_x": trend_lib.log_axis(study.trend, results["trend"])}
  return results


def _commits(used: dict) -> dict:
  """``{commit: number of runs}``, the most runs first, from ``{key: commit}``."""
  counts: dict = {}
  for commit in used.values():
    counts[commit] = counts.get(commit, 0) + 1
  return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _status(r: Optional[dict], metric: str) -> dict:
  if r is None:
    return {"key": None, "status": "unfinished", "final": None}
  return {"key": r["key"], "status": "diverged" if r["diverged"] else "finished",
          "error": r["diverged"], "final": stats.final(r["history"], metric),
          "seconds": r["seconds"]}


def _histories(reported: dict, study) -> dict:
  """``{variant: {method: [[sim_time, bytes_sent, metric] per evaluation] per seed}}``: the
  curves the plot draws."""
  keys = ("sim_time", "bytes_sent", study.metric)
  return {v: {m: [[[h.get(k) for k in keys] for h in r["history"]]
                  for r in reported[m][v].values() if r]
              for m in reported} for v in study.variants}
