"""A study's outputs: ``OUT/results.json`` (everything :func:`nbsgd_jax.study.driver.run`
returns), ``OUT/results.md`` (the provenance in a line, the prefix in a line, per variant a
table of the columns over the reported seeds, the claims beside our values
(:mod:`nbsgd_jax.study.claims`), then each method's tuning grid), ``OUT/curves_<variant>.png``
(the tuning metric against simulated time and against bytes per worker, one line per method
and seed) and, with a trend, ``OUT/trend.png`` (:mod:`nbsgd_jax.study.trend`)."""

from __future__ import annotations

import json
import os

import numpy as np

from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.study import claims as claims_lib
from nbsgd_jax.study import stats
from nbsgd_jax.study import trend as trend_lib


def write(results: dict, out: str) -> list[str]:
  """Write the outputs (module docstring) atomically; returns their paths."""
  os.makedirs(out, exist_ok=True)
  paths = [os.path.join(out, "results.json"), os.path.join(out, "results.md")]
  files_lib.atomic_write(paths[0], json.dumps(results, indent=1, default=str))
  files_lib.atomic_write(paths[1], markdown(results))
  for variant, curves in results["histories"].items():
    if any(curves.values()):
      paths.append(os.path.join(out, f"curves_{variant}.png"))
      plot(curves, results["metric"], f"{os.path.basename(out)}: {variant}", paths[-1])
  if results.get("trend"):
    paths.append(os.path.join(out, "trend.png"))
    trend_lib.plot(results["trend"], results["trend_spec"], os.path.basename(out), paths[-1])
  return paths


def tuned(entry: dict, variant: str) -> dict:
  """A method's tuning (``{"pick", "edge", "grid", "extended"}``) for ``variant``: its own
  under ``entry["variants"]`` when each variant is tuned (``tune.variant = "each"``), else
  the one tuning."""
  return entry["variants"][variant] if "variants" in entry else entry


def _point(point) -> str:
  return ", ".join(f"{k}={v}" for k, v in point.items()) if point else "none"


def _pick(m: dict) -> str:
  """A tuning's pick, or why there is none: a tuning run not run yet (``--only``, a study
  stopped), else every point diverged."""
  if m["pick"]:
    return _point(m["pick"]) + ("*" if m["edge"] else "")
  return "none (not run)" if any(t["unfinished"] for t in m["grid"]) else "none (all diverged)"


def markdown(results: dict) -> str:
  """``results.md``: the protocol in a sentence, one table per variant, the tuning grids."""
  seeds = ", ".join(map(str, results["seeds"]))
  tune = ", ".join(map(str, results["tune_seeds"]))
  better = "lowest" if results["mode"] == "min" else "highest"
  lines = [f"# {os.path.basename(str(results['study']))}" + (" (--quick)" if results["quick"]
                                                            else ""), "",
           f"Each method tuned on seed {tune} (not reported), "
           + ("each variant on its own" if results["tune_variant"] == "each" else
              f"variant {results['tune_variant']!r}") + f", by the {better} final "
           f"{results['metric']}; "
           f"reported over seeds {seeds} at the pick: mean ± sample standard deviation "
           f"(ddof 1); budget {results['budget']}. *: the pick is at the edge of its grid.", ""]
  if results.get("tune_overrides"):
    lines += ["The tuning runs alone also set " + ", ".join(
        f"{k}={v!r}" for k, v in results["tune_overrides"].items())
        + " (the reported runs do not).", ""]
  if any(" gap to " in c for c in results["columns"]):
    lines += ["A column 'METRIC gap to METHOD' is in percent, 100 (m / ref - 1) per seed, the "
              "final METRIC against METHOD's on the same variant and seed, then over the seeds "
              "both finished.", ""]
  lines += provenance_lines(results) + prefix_lines(results) + trend_lines(results)
  for variant, table in results["variants"].items():
    lines += [f"## {variant}", ""]
    equal = {x: v for x, v in table["equal"].items() if v is not None}
    if equal:
      lines += ["At equal " + ", ".join(f"{x} = {v:.4g}" for x, v in equal.items())
                + " (the least any reported run ends with).", ""]
    if table.get("targets"):
      lines += ["Targets from a reference method (its mean final value): " + "; ".join(
          f"{c}: {'no target (no finished run)' if t is None else f'{t:.4g}'}"
          for c, t in table["targets"].items()) + ".", ""]
    cols = results["columns"]
    lines += ["| method | pick | " + " | ".join(cols) + " |",
              "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for name, cells in table["cells"].items():
      m = tuned(results["methods"][name], variant)
      lines.append(f"| {name} | {_pick(m)} | "
                   + " | ".join(stats.show(cells[c]) for c in cols) + " |")
    lines.append("")
  lines += claims_lib.markdown(results) + ["## Tuning", ""]
  for name, entry in results["methods"].items():
    for where, m in (entry["variants"].items() if "variants" in entry else [("", entry)]):
      tried = "; ".join(f"{_point(t['point'])}: {_score(t, results['mode'])}"
                        for t in m["grid"])
      ext = (f" (extended by {', '.join(_point(p) for p in m['extended'])})" if m["extended"]
             else "")
      lines.append(f"- {name}{' ' + where if where else ''}: {tried}{ext}; pick "
                   f"{_pick(m)}")
  return "\n".join(lines) + "\n"


def provenance_lines(results: dict) -> list[str]:
  """The provenance in one line: this process's commit and jax, the commits of the runs
  used (``run_commits``), and whether they are mixed; none for results without it."""
  prov = results.get(provenance_lib.KEY)
  if prov is None:
    return []
  runs = ", ".join(f"{c[:10] if c else 'none recorded'} ({n} run{'s' if n != 1 else ''})"
                   for c, n in results.get("run_commits", {}).items())
  line = (f"Provenance: written by commit {provenance_lib.short(prov)} (jax {prov.get('jax')});"
          f" the runs used were made by commit {runs or '-'}.")
  if results.get("mixed"):
    line += (" **Mixed**: the runs come from more than one commit (trained with "
             "--allow_mixed, or read from a mixed cache).")
  return [line, ""]


def prefix_lines(results: dict) -> list[str]:
  """A line naming the prefix (its budget and overrides) and its final metric over the seeds
  (mean ± std, the unfinished and diverged seeds named); none without a prefix."""
  spec = results.get("prefix_spec")
  if not spec:
    return []
  seeds = results["prefix"]
  values = {s: p["final"] for s, p in seeds.items() if p["status"] == "finished"}
  summary = stats.summarize(values, [s for s, p in seeds.items() if p["status"] == "diverged"],
                            [s for s, p in seeds.items() if p["status"] == "unfinished"])
  over = ", ".join(f"{k}={v}" for k, v in spec["overrides"].items()) or "none"
  return [f"Prefix (Douillard et al. 2023, Sec. 3): every run starts from its seed's prefix "
          f"(config.init_from: its averaged parameters and model state; the optimizer and the "
          f"step count fresh), {spec['budget']} with overrides {over}; its final "
          f"{results['metric']}: {stats.show(summary)} over the tuning and reported seeds.", ""]


def trend_lines(results: dict) -> list[str]:
  """A line naming ``trend.png`` and what it draws; none without a trend."""
  spec = results.get("trend_spec")
  if not spec:
    return []
  return [f"Trend (trend.png): {spec['column']} against the mean {spec['x']} of each variant's "
          f"runs, one line per method, the sample std as error bars"
          f"{', x on a log axis' if spec['log_x'] else ''}.", ""]


def _score(t: dict, mode: str) -> str:
  """A tuning point's score as the metric's value (its seeds' mean), or why it has none."""
  if t["diverged"] or t["unfinished"]:
    return "; ".join(f"{w} (seed {', '.join(map(str, t[w]))})"
                     for w in ("diverged", "unfinished") if t[w])
  if t["score"] is None:
    return "no value"
  return f"{t['score'] if mode == 'min' else -t['score']:.4g}"


def _log(values, decades: float) -> bool:
  """Log scale where the positive values span more than ``decades`` decades."""
  v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0])
  return v.size > 1 and v.max() / v.min() > 10 ** decades


def plot(curves: dict, metric: str, title: str, path: str) -> None:
  """``metric`` against simulated time (left) and bytes per worker (right), one colour per
  method, one line per seed (``curves``: ``{method: [[[sim_time, bytes, metric], ...] per
  seed]}``); a log axis where a quantity spans decades (y: more than one, x: more than two,
  as its first point, 0, is left out)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for col, (ax, xlabel) in enumerate(zip(axes, ("simulated time (s)", "bytes sent per worker"))):
    xs = [p[col] for runs in curves.values() for r in runs for p in r]
    ys = [p[2] for runs in curves.values() for r in runs for p in r]
    logx, logy = _log(xs, 2), _log(ys, 1)  # x starts at 0: log only past two decades
    for i, (name, runs) in enumerate(curves.items()):
      for j, r in enumerate(runs):
        pts = [(p[col], p[2]) for p in r if p[col] is not None and p[2] is not None
               and (p[col] > 0 or not logx) and (p[2] > 0 or not logy)]
        if pts:
          ax.plot(*zip(*pts), color=f"C{i}", alpha=0.8, lw=1.2, label=name if j == 0 else None)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  files_lib.atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
  plt.close(fig)
