"""Asynchronous DiLoCo against DiLoCo on the character LM with persistent slow workers.

Liu, Douillard et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv
2401.09135). Claim: with heterogeneous workers, asynchronous Local-SGD with delayed Nesterov
(DN) and dynamic local updates (DyLU) matches synchronous DiLoCo's perplexity per update
while finishing in less wall time, because no worker waits for the slowest. Setting of the
google-deepmind/asyncdiloco toy notebook: 4 workers of 0.58, 0.75, 1.51 and 3.33 s per step.

    python experiments/async_diloco_lm.py --out docs/asynchronous/lm            # the study
    python experiments/async_diloco_lm.py --quick --out /tmp/adl                # a minute

The language model and data of ``experiments/reproduce_diloco.py`` (its ``base_config``:
2 layers, d_model 96, context 64, batch 8 windows per worker, AdamW inner optimizer with
gradient clipping), 4 workers each drawing from its own contiguous quarter of
tiny_shakespeare, on a simulated cluster with the slowdowns 1, 0.75/0.58, 1.51/0.58 and
3.33/0.58 (``cluster.slowdown``) and 0.58 s per step on the fastest. The inner learning rate
is constant after ``--warmup`` steps for every method (a schedule indexed by steps is not
comparable when workers run unequal steps), and the inner optimizer keeps its state across
rounds (``async_diloco.reset_inner=False``: DiLoCo's).

Methods (``--methods``):

* ``diloco``: DiLoCo, H = ``--h`` inner steps, then every worker's pseudo-gradient is averaged
  and the outer Nesterov step taken: every round waits for the slowest worker.
* ``async_diloco``: each worker pushes after its own H inner steps; delayed Nesterov with
  N = n pushes per momentum update (``async_diloco.buffer``).
* ``async_diloco_dylu``: the same with dynamic local updates, H_i = max(H t_min / t_i, 5).

DiLoCo runs ``--steps`` steps; the asynchronous methods run until DiLoCo's simulated time
on the same seed (``stop_sim_time``). Outer learning rates: ``--outer_lrs`` for each method,
chosen on ``--tune_seed`` (not reported) by the final validation loss. Reported per seed
(``--seeds``): the validation loss at DiLoCo's final simulated time, the simulated time to
DiLoCo's final loss (linear interpolation between evaluations), the validation loss once the
server has applied as many pseudo-gradients as DiLoCo (n per round: the cost of staleness per
update, the paper's comparison), bytes sent per worker, the staleness of the pushes
(server updates between a worker's pull and its push) and the run's wall time (``train_s``:
its last evaluation's ``wall_time``, i.e. its own training steps with compilation, not the
training call's time shared out over its runs; on a GPU, where ``sweep_runs="auto"`` stacks a
structure's runs into one program, the runs of a group share that program's time).
Resumable: every run is cached under ``OUT/runs`` by its config; ``OUT/results.json`` and
``OUT/results.md`` are rewritten after every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (experiments/common.py)
import reproduce_diloco  # noqa: E402  (experiments/reproduce_diloco.py: the LM's config)

from nbsgd_jax import config as config_lib  # noqa: E402

SECONDS_PER_STEP = (0.58, 0.75, 1.51, 3.33)  # the asyncdiloco notebook's workers
KEEP = ("step", "sim_time", "test_loss", "bytes_sent", "staleness_tau", "staleness_steps",
        "staleness_s", "pushes", "wall_time")
METHODS = {
    "diloco": {"algorithm": "diloco"},
    "async_diloco": {"algorithm": "async_diloco", "async_diloco.reset_inner": False},
    "async_diloco_dylu": {"algorithm": "async_diloco", "async_diloco.reset_inner": False,
                          "async_diloco.dynamic_local_updates": True},
}


def lm_config(a, method: str, seed: int, outer_lr: float, stop_time: float = 0.0):
  """One run: the LM of ``reproduce_diloco.base_config`` on the slow cluster."""
  ns = argparse.Namespace(**{**vars(a), "workers": len(SECONDS_PER_STEP),
                             "outer_lr": outer_lr, "bandwidth": 0.0, "latency": None,
                             "partition": "contiguous"})
  c = reproduce_diloco.base_config(ns, seed)
  fast = min(SECONDS_PER_STEP)
  over = {**METHODS[method], "lr_schedule": "constant", "lr_min": 0.0, "diloco.local_steps": a.h,
          "cluster.slowdown": tuple(t / fast for t in SECONDS_PER_STEP),
          "cluster.time_per_example": fast / a.batch}
  if method != "diloco":  # batches of events: the fastest worker's steps, about
    ratio = max(SECONDS_PER_STEP) / fast
    over.update({"num_steps": int(a.steps * ratio * 1.5), "stop_sim_time": stop_time,
                 "eval_every": int(round(a.eval_every * ratio))})
  return config_lib.override(c, over)


def cached(a, cfgs: list) -> list:
  """Each config's history, trained (as one call) when ``OUT/runs`` lacks it."""
  return common.cached_histories(cfgs, KEEP, os.path.join(a.out, "runs"))


def at_time(history: list, t: float, key: str = "test_loss") -> float:
  """``key`` linearly interpolated at simulated time ``t`` (the last value past the end)."""
  times = [h["sim_time"] for h in history]
  return float(np.interp(t, times, [h[key] for h in history]))


def at_pushes(history: list, pushes: float):
  """The validation loss when the server has applied ``pushes`` pseudo-gradients (linear
  between the evaluations around the first that reaches it; None if the run never does)."""
  prev = None
  for h in history:
    if h.get("pushes", 0) >= pushes:
      if prev is None or h["pushes"] == prev["pushes"]:
        return h["test_loss"]
      w = (pushes - prev["pushes"]) / (h["pushes"] - prev["pushes"])
      return prev["test_loss"] + w * (h["test_loss"] - prev["test_loss"])
    prev = h
  return None


def time_to(history: list, target: float):
  """Simulated seconds to ``test_loss <= target`` (interpolated), or None if never."""
  return common.time_to(history, target, "test_loss")


def _stat(values) -> dict:
  got = [v for v in values if v is not None and np.isfinite(v)]
  return {"mean": float(np.mean(got)) if got else None,
          "std": float(np.std(got, ddof=1)) if len(got) > 1 else None,
          "per_seed": list(values), "reached": len(got)}


def tune(a, res: dict) -> dict:
  """method -> outer learning rate: the lowest final validation loss on the tuning seed
  (the asynchronous runs at DiLoCo's simulated time at its chosen rate)."""
  s = a.tune_seed
  runs = cached(a, [lm_config(a, "diloco", s, lr) for lr in a.outer_lrs])
  final = lambda r: r["history"][-1]["test_loss"]  # noqa: E731
  lrs = {"diloco": a.outer_lrs[int(np.nanargmin([final(r) for r in runs]))]}
  budget = runs[a.outer_lrs.index(lrs["diloco"])]["history"][-1]["sim_time"]
  names = [m for m in a.methods if m != "diloco"]
  runs = cached(a, [lm_config(a, m, s, lr, budget) for m in names for lr in a.outer_lrs])
  for i, m in enumerate(names):
    mine = runs[i * len(a.outer_lrs):(i + 1) * len(a.outer_lrs)]
    lrs[m] = a.outer_lrs[int(np.nanargmin([at_time(r["history"], budget) for r in mine]))]
  res["outer_lrs"] = lrs
  return lrs


def study(a, res: dict) -> None:
  lrs = tune(a, res)
  diloco = dict(zip(a.seeds, cached(a, [lm_config(a, "diloco", s, lrs["diloco"])
                                          for s in a.seeds])))
  ends = {s: r["history"][-1]["sim_time"] for s, r in diloco.items()}
  runs = cached(a, [lm_config(a, m, s, lrs[m], ends[s]) for m in a.methods if m != "diloco"
                    for s in a.seeds])
  by = {"diloco": diloco}
  for i, m in enumerate([m for m in a.methods if m != "diloco"]):
    by[m] = dict(zip(a.seeds, runs[i * len(a.seeds):(i + 1) * len(a.seeds)]))
  rows = {}
  updates = len(SECONDS_PER_STEP) * (a.steps // a.h)  # the pseudo-gradients DiLoCo applies
  for m, seeds in by.items():
    target = {s: diloco[s]["history"][-1]["test_loss"] for s in a.seeds}
    h = {s: seeds[s]["history"] for s in a.seeds}
    rows[m] = {
        "outer_lr": lrs[m],
        "loss_at_diloco_time": _stat([at_time(h[s], ends[s]) for s in a.seeds]),
        "time_to_diloco_loss": _stat([time_to(h[s], target[s]) for s in a.seeds]),
        "speedup": _stat([(ends[s] / t if t else None) for s in a.seeds
                          for t in [time_to(h[s], target[s])]]),
        "loss_at_diloco_updates": _stat([
            at_pushes(h[s], updates) if m != "diloco" else target[s] for s in a.seeds]),
        "mb_per_worker": _stat([at_time(h[s], ends[s], "bytes_sent") / 1e6 for s in a.seeds]),
        "staleness_steps": _stat([np.mean([_tau(x) for x in h[s]])
                                  for s in a.seeds]),
        "staleness_s": _stat([np.mean([x.get("staleness_s", 0.0) for x in h[s]])
                              for s in a.seeds]),
        "train_s": _stat([seeds[s]["history"][-1].get("wall_time") for s in a.seeds]),
        "curves": {str(s): h[s] for s in a.seeds}}
  res["rows"] = rows


def _fmt(s: dict, digits: int = 3, unit: str = "") -> str:
  if s["mean"] is None:
    return "not reached"
  spread = "" if s["std"] is None else f" +- {s['std']:.{digits}f}"
  part = "" if s["reached"] == len(s["per_seed"]) else f" ({s['reached']}/{len(s['per_seed'])})"
  return f"{s['mean']:.{digits}f}{spread}{unit}{part}"


def _tau(record: dict) -> float:
  """A push's staleness in server updates since its pull: ``staleness_tau`` (records before
  the paper's tau called it ``staleness_steps``)."""
  return record.get("staleness_tau", record.get("staleness_steps", 0.0))


def markdown(res: dict) -> str:
  s = res["settings"]
  lines = [f"`{res['command']}`", "",
           f"4 workers of {', '.join(map(str, SECONDS_PER_STEP))} s per step (the asyncdiloco "
           f"notebook's), the character LM of reproduce_diloco.py ({s['layers']} layers, "
           f"d_model {s['d_model']}, context {s['context']}, batch {s['batch']}), H = {s['h']}, "
           f"AdamW lr {s['lr']:g} constant after {s['warmup']} warm-up steps; DiLoCo "
           f"{s['steps']} steps, the asynchronous methods until DiLoCo's simulated time. Outer "
           f"learning rates from {s['outer_lrs']} chosen on seed {s['tune_seed']}; seeds "
           f"{s['seeds']} reported, mean +- std (ddof = 1). Pseudo-gradients: DiLoCo applies "
           f"n x {s['steps'] // s['h']} rounds (averaged); the asynchronous runs' loss is read "
           "when their server has applied as many pushes.", "",
           "| method | outer lr | val. loss at DiLoCo's end time | time to DiLoCo's final loss "
           "(s) | speed-up | val. loss after DiLoCo's pseudo-gradients | MB sent / worker | "
           "staleness, server updates | staleness, s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for m, r in res["rows"].items():
    lines.append(f"| {m} | {r['outer_lr']:g} | {_fmt(r['loss_at_diloco_time'], 4)} | "
                 f"{_fmt(r['time_to_diloco_loss'], 0)} | {_fmt(r['speedup'], 2, 'x')} | "
                 f"{_fmt(r['loss_at_diloco_updates'], 4)} | "
                 f"{_fmt(r['mb_per_worker'], 1)} | {_fmt(r['staleness_steps'], 2)} | "
                 f"{_fmt(r['staleness_s'], 1)} |")
  lines += ["", wall_times(res), "",
            f"Wall time of this invocation: {res['seconds']:.0f} s (runs read back from its "
            "run cache are not trained again).", ""]
  return "\n".join(lines)


def wall_times(res: dict) -> str:
  """Each run's wall time (its last evaluation's ``wall_time``: that run's training steps,
  compilation included, not its evaluations), or that the record does not hold it."""
  rows = res["rows"].values()
  if not all("train_s" in r for r in rows):  # records written before the runs kept it
    return ("Wall time per run: not in this record (its `wall_s` is one training call's "
            "time divided by the runs it trained, the same figure for every seed).")
  seeds = res["settings"]["seeds"]
  per = "; ".join(f"{m} " + " / ".join("-" if v is None else f"{v:.0f}"
                                        for v in r["train_s"]["per_seed"])
                  for m, r in res["rows"].items())
  return (f"Wall time per run, seeds {' / '.join(map(str, seeds))} (s of training steps, "
          f"compilation included): {per}.")


def plot(res: dict, path: str) -> None:
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (m, r) in enumerate(res["rows"].items()):
    for j, (seed, h) in enumerate(r["curves"].items()):
      ax.plot([x["sim_time"] for x in h], [x["test_loss"] for x in h], color=f"C{i}",
              alpha=0.8, label=m if j == 0 else None)
  ax.set_xlabel("simulated time (s)")
  ax.set_ylabel("validation loss (nats/char)")
  ax.set_title("4 workers of 0.58 / 0.75 / 1.51 / 3.33 s per step (each seed a line)",
               fontsize=9)
  ax.legend()
  fig.tight_layout()
  common.save_figure(fig, path)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true", help="a one-layer model, 40 steps")
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  p.add_argument("--tune_seed", type=int, default=3)
  p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
  p.add_argument("--outer_lrs", type=float, nargs="+", default=[0.35, 0.7])
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--d_model", type=int, default=96)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--context", type=int, default=64)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--steps", type=int, default=400, help="DiLoCo's steps")
  p.add_argument("--h", type=int, default=20, help="inner steps H")
  p.add_argument("--eval_every", type=int, default=40, help="DiLoCo's steps between evaluations")
  p.add_argument("--eval_train_examples", type=int, default=64)
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--lr_min_ratio", type=float, default=0.1)
  p.add_argument("--warmup", type=int, default=50)
  p.add_argument("--grad_clip", type=float, default=1.0)
  p.add_argument("--outer_momentum", type=float, default=0.9)
  a = p.parse_args()
  if "diloco" not in a.methods:
    a.methods = ["diloco", *a.methods]
  if a.quick:
    a.layers, a.d_model, a.heads, a.context, a.batch = 1, 32, 2, 32, 4
    a.steps, a.h, a.eval_every, a.warmup, a.seeds = 40, 10, 20, 4, a.seeds[:1]
  os.makedirs(os.path.join(a.out, "runs"), exist_ok=True)
  command = "python experiments/async_diloco_lm.py " + " ".join(
      shlex.quote(x) for x in sys.argv[1:])
  start = time.time()
  res = {"command": common.repo_relative(command), "settings": common.repo_relative(vars(a))}
  study(a, res)
  res["seconds"] = time.time() - start
  common.write_results(a.out, res, markdown(res))
  plot(res, os.path.join(a.out, "loss_vs_time.png"))


if __name__ == "__main__":
  main()
