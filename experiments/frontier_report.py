"""The tables and plots of ``frontier_lm.py``'s study, every number from its records:
``python experiments/frontier_report.py OUT`` rewrites ``OUT/results.md`` and the plots from
``OUT/results.json`` (the study calls it at its end; a partial study reports what it has)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import common  # noqa: E402  (experiments/common.py)

# each paper's headline claim, quoted with where it stands (experiments/frontier_claims.py)
from frontier_claims import CLAIMS  # noqa: E402


def _seeds(res: dict, m: dict) -> list:
  return [m["seeds"][str(s)] for s in res["settings"]["seeds"] if str(s) in m["seeds"]]


def _curve(runs: list, x: str) -> tuple:
  """Mean over ``runs`` of ``x`` and the validation loss at the steps every run has."""
  steps = sorted(set.intersection(*[{h["step"] for h in r["history"]} for r in runs]))
  at = lambda r, st: next(h for h in r["history"] if h["step"] == st)  # noqa: E731
  return (np.array([np.mean([at(r, st)[x] for r in runs]) for st in steps]),
          np.array([np.mean([at(r, st)["test_loss"] for r in runs]) for st in steps]))


def _at(runs: list, x: str, budget: float) -> float:
  """The mean validation loss at ``x`` = ``budget``, linear between evaluations."""
  xs, ys = _curve(runs, x)
  return float(np.interp(budget, xs, ys)) if budget <= xs[-1] else float("nan")


def _stat(v) -> str:
  v = np.asarray(v, np.float64)
  return f"{v.mean():.4f} +- {v.std(ddof=1):.4f}" if v.size > 1 else f"{v.mean():.4f}"


def rows(res: dict, network: str) -> list[dict]:
  """One dict per method on ``network``: its final and equal-budget figures."""
  ms = {m["method"]: m for m in res["methods"].values() if m["network"] == network
        and _seeds(res, m)}
  if not ms:
    return []
  finals = {k: [r["history"][-1] for r in _seeds(res, m)] for k, m in ms.items()}
  mean = lambda k, key: float(np.mean([h[key] for h in finals[k]]))  # noqa: E731
  budget_b = min(mean(k, "bytes_sent") for k in ms if mean(k, "bytes_sent") > 0)
  budget_t = min(mean(k, "sim_time") for k in ms)
  target = float(np.median([mean(k, "test_loss") for k in ms]))
  out = []
  for k, m in ms.items():
    runs = _seeds(res, m)
    reach = [common.time_to(r["history"], target, "test_loss") for r in runs]
    cd = [h.get("consensus_distance") for h in finals[k]]
    pick = res["picks"].get(k, {})
    out.append({
        "method": k, "rate": m["rate"], "edge": pick.get("edge", False),
        "loss": [h["test_loss"] for h in finals[k]], "mb": mean(k, "bytes_sent") / 1e6,
        "at_bytes": _at(runs, "bytes_sent", budget_b), "at_time": _at(runs, "sim_time",
                                                                       budget_t),
        "sim_time": mean(k, "sim_time"),
        "to_target": (float(np.mean(reach)) if all(t is not None for t in reach) else None),
        "consensus": (float(np.mean(cd)) if all(c is not None for c in cd) else None),
        "budget_b": budget_b, "budget_t": budget_t, "target": target})
  return out


def table(res: dict, network: str) -> list[str]:
  r = rows(res, network)
  if not r:
    return []
  head = r[0]
  lines = [f"### {network}: {res['settings']['networks'][network]}", "",
           f"Equal bytes: the loss when each method had sent {head['budget_b'] / 1e6:,.3f} MB "
           f"per worker (the least any method sent in the run); equal time: at "
           f"{head['budget_t']:.3f} simulated s (the shortest run); target: "
           f"{head['target']:.4f} (the median final loss). Consensus distance: of the "
           "workers' own models at the last evaluation, mean over seeds; '-': not recorded "
           "(runs made before the study kept it; the workers of DiLoCo, MuLoCo and SparseLoCo "
           "restart from one outer model at each period end, where the evaluations fall, and "
           "DeMo's apply one update: one model each).", "",
           "| method | lr (tuned) | final val. loss | MB / worker | loss at equal bytes | "
           "loss at equal time | sim. s | s to target | consensus distance |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for x in r:
    lines.append(
        f"| {x['method']} | {x['rate']:g}{' (edge)' if x['edge'] else ''} | "
        f"{_stat(x['loss'])} | {x['mb']:,.3f} | {x['at_bytes']:.4f} | {x['at_time']:.4f} | "
        f"{x['sim_time']:.3f} | "
        + (f"{x['to_target']:.3f}" if x["to_target"] is not None else "not reached")
        + " | " + (f"{x['consensus']:.3g}" if x["consensus"] is not None else "-") + " |")
  return lines + [""]


def versus(res: dict, name: str, base: str, network: str = "datacenter") -> str:
  """``name``'s final loss and bytes against ``base``'s, per reported seed."""
  ms = {m["method"]: m for m in res["methods"].values() if m["network"] == network}
  if name not in ms or base not in ms or not _seeds(res, ms[name]) or not _seeds(res,
                                                                                 ms[base]):
    return "not yet run."
  a = [r["history"][-1] for r in _seeds(res, ms[name])]
  b = [r["history"][-1] for r in _seeds(res, ms[base])]
  d = [x["test_loss"] - y["test_loss"] for x, y in zip(a, b)]
  ratio = np.mean([x["bytes_sent"] for x in a]) / max(np.mean([y["bytes_sent"] for y in b]), 1)
  verdict = ("lower on every seed" if max(d) < 0 else "higher on every seed" if min(d) > 0
             else "lower on some seeds, higher on others")
  return (f"{_stat([x['test_loss'] for x in a])} against {base}'s "
          f"{_stat([y['test_loss'] for y in b])} (" + " / ".join(f"{v:+.4f}" for v in d)
          + f": {verdict}), {ratio:.3g}x its bytes.")


def tuning(res: dict) -> list[str]:
  """The tuning runs: each rate's final training loss (validation loss), the pick in bold."""
  s = res["settings"]
  lines = [f"## Tuning (seed {s['tune_seed']}, not reported)", "",
           "Final training loss (validation loss) per inner learning rate; the pick in bold "
           "(edge: the pick is at its grid's edge after the extensions).", ""]
  for name, grid in res.get("tuning", {}).items():
    pick = res.get("picks", {}).get(name, {})
    cells = []
    for key in sorted(grid, key=lambda k: float(k.split("=")[1])):
      h = grid[key]["history"][-1]
      text = f"{key.split('=')[1]}: {h['train_loss']:.4f} ({h['test_loss']:.4f})"
      cells.append(f"**{text}**" if pick and float(key.split("=")[1]) == pick["rate"]
                   else text)
    lines.append(f"* {name}: " + "; ".join(cells)
                 + (" (edge)" if pick.get("edge") else "") + ("" if pick else " (running)"))
  return lines + [""]


def eager_check(out: str) -> list[str]:
  """The flaw check of DiLoCo's eager outer steps (``frontier_eager_check.py``), if run."""
  path = os.path.join(out, "eager_check.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    chk = json.load(f)
  lines = ["## Flaw check: DiLoCo with eager outer steps", "",
           f"`{chk['command']}`: seed {chk['seed']}, inner rate {chk['rate']:g}, one setting "
           "changed at a time (final training loss, validation loss; the study's own runs, "
           "Nesterov 0.9, are in the tuning list above).", ""]
  for k, v in chk["variants"].items():
    h = v["history"][-1]
    lines.append(f"* {k} ({', '.join(f'{a}={b}' for a, b in v['overrides'].items())}): "
                 f"{h['train_loss']:.3f} ({h['test_loss']:.3f})")
  return lines + [""]


def markdown(res: dict, out: str = "") -> str:
  s = res["settings"]
  lines = [f"`{res['command']}`", "",
           f"The DiLoCo paper's protocol on the character LM: an all-reduce prefix of "
           f"{s['prefix_steps']} steps ({s['workers']} workers, i.i.d. shards), then each "
           f"method {s['steps']} steps from it ({s['batch']} windows of {s['context']} "
           f"characters per worker per step), H = {s['h']} for the periodic methods. Inner "
           f"rates tuned on seed {s['tune_seed']} (not reported) by the final training loss; "
           f"reported seeds {', '.join(map(str, s['seeds']))}: mean +- std (ddof = 1).", ""]
  for network in s["networks"]:
    lines += table(res, network)
  lines += tuning(res)
  lines += eager_check(out) if out else []
  lines += ["## Each paper's claim beside ours", "",
            "Ours: the method's final validation loss against the baseline the paper names "
            "(mean over the reported seeds; the difference per seed), and its bytes per worker "
            "as a multiple of the baseline's, on the datacenter network (the losses are the "
            "same on both networks: only the clock differs).", ""]
  for name, (claim, base, setup) in CLAIMS.items():
    lines.append(f"* **{name}**. Paper: {claim} Ours: {versus(res, name, base)} What the "
                 f"set-up supports: {setup}")
  lines += ["", f"Wall time of the study so far: {res.get('seconds', 0):.0f} s.", ""]
  return "\n".join(lines)


def plots(res: dict, out: str) -> None:
  plt = common.pyplot()
  for network in res["settings"]["networks"]:
    for x, label, log in (("bytes_sent", "MB sent per worker", True),
                          ("sim_time", "simulated s", False)):
      fig, ax = plt.subplots(figsize=(7, 4.5))
      for i, m in enumerate(m for m in res["methods"].values() if m["network"] == network):
        runs = _seeds(res, m)
        if not runs:
          continue
        xs, ys = _curve(runs, x)
        keep = xs > 0 if log else np.ones_like(xs, bool)
        ax.plot(xs[keep] / (1e6 if log else 1), ys[keep], "o-", ms=3, color=f"C{i % 10}",
                label=m["method"])
      if not ax.lines:  # nothing reported yet
        plt.close(fig)
        continue
      ax.set_xscale("log" if log else "linear")
      ax.set_xlabel(label)
      ax.set_ylabel("validation loss (nats/char), mean over seeds")
      ax.set_title(f"DiLoCo's descendants, {network}", fontsize=9)
      ax.legend(fontsize=7)
      fig.tight_layout()
      common.save_figure(fig, os.path.join(out, f"loss_vs_{x}_{network}.png"))


def write(res: dict, out: str) -> None:
  """``results.md`` and the plots of the study's records ``res``."""
  plots(res, out)
  common.write_atomic(os.path.join(out, "results.md"), markdown(res, out))


if __name__ == "__main__":
  with open(os.path.join(sys.argv[1], "results.json")) as f:
    write(json.load(f), sys.argv[1])
