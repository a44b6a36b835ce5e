"""Each run's learning rate tuned on a small grid, then several seeds: the multi-seed tables.

    python experiments/tune_seeds.py sparsification --out docs/sparsification/seeds
    python experiments/tune_seeds.py local_sgd --out docs/local_sgd/seeds

A study is the list of runs of a reproduction script (``sparsification``: the 13 runs of
``reproduce_sparsification.py``, dense and {Top-k, Gaussian-k, Random-k} x {with, without
error feedback} x {density 0.01, 0.001}; ``local_sgd``: the 5 mnist10k runs of
``reproduce_local_sgd.py`` (c), local SGD tau 1 / 4 / 16, post-local SGD, DiLoCo with its
outer optimizer fixed). For every run:

1. train with the tuning seed (the first of ``--seeds``) at each learning rate of ``--lrs``;
2. pick the rate with the lowest final training loss of the averaged model (on
   ``eval_train_examples`` training examples: the test set plays no part in the choice;
   a diverged run counts as +inf);
3. train the other seeds at that rate.

The table gives, per run, the picked rate, the test accuracy (all 2,000 held-out digits of
mnist10k) as mean +- sample standard deviation (ddof = 1) over the seeds with each seed's
value, the training loss, and the MB sent per worker. ``results.json`` is rewritten after
every batch of runs (the runs of a stage, trained as one program per structure:
``nbsgd_jax.train.train_runs``), so an interrupted study resumes where it stopped (runs
already in it are not trained again); ``--report`` rewrites results.md from it without
training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (experiments/common.py; puts the repository on sys.path)

import numpy as np  # noqa: E402

STUDIES = ("sparsification", "local_sgd")


def study_runs(study: str) -> dict:
  """``{run name: make(lr, seed) -> config}`` of ``study``, in table order.

  Raises:
    ValueError: ``study`` not in ``STUDIES``.
  """
  if study == "sparsification":
    import reproduce_sparsification as sp
    base = {"workers": 8, "model": "cnn", "steps": 300, "eval_every": 300}
    grid = [("none", 1.0, False)] + [(c, dens, ef) for dens in (0.01, 0.001)
                                     for c in sp.COMPRESSORS for ef in (True, False)]
    return {sp.run_name(*g): (lambda lr, seed, g=g: sp.make_config(
        *g, SimpleNamespace(**base, lr=lr, seed=seed))) for g in grid}
  if study == "local_sgd":
    import reproduce_local_sgd as ls
    a = {"mnist_steps": 600, "mnist_eval_every": 600}
    return {name: (lambda lr, seed, algo=algo, kw=kw: ls.mnist_config(
        SimpleNamespace(**a, seed=seed), algo, lr=lr, **kw))
            for name, (algo, kw) in ls.mnist_runs(600).items()}
  raise ValueError(f"study={study!r} is not allowed: use one of {', '.join(STUDIES)}")


def key(name: str, lr: float, seed: int) -> str:
  return f"{name} | lr={lr:g} | seed={seed}"


def tried_lrs(records: dict, name: str, seed: int) -> list:
  """The learning rates run ``name`` was trained with at ``seed``, ascending."""
  prefix = f"{name} | lr="
  return sorted(float(k[len(prefix):].split(" |")[0]) for k in records
                if k.startswith(prefix) and k.endswith(f" | seed={seed}"))


def pick_lr(records: dict, name: str, lrs: list, seed: int):
  """The rate with the lowest final training loss of run ``name`` at ``seed`` among those
  tried (``records[key(name, lr, seed)]["train_loss"]``, None = diverged = +inf); None while
  a rate of the grid ``lrs`` has not been trained."""
  if any(key(name, lr, seed) not in records for lr in lrs):
    return None
  grid = tried_lrs(records, name, seed)
  losses = [records[key(name, lr, seed)]["train_loss"] for lr in grid]
  losses = [math.inf if x is None or not math.isfinite(x) else x for x in losses]
  return grid[int(np.argmin(losses))]


def next_lr(records: dict, name: str, lrs: list, seed: int, extend: int):
  """The grid's next rate when the best so far is at an edge of what was tried (x2 above the
  largest, /2 below the smallest), at most ``extend`` beyond ``lrs``; else None."""
  best, grid = pick_lr(records, name, lrs, seed), tried_lrs(records, name, seed)
  if best is None or len(grid) >= len(lrs) + extend:
    return None
  if best == grid[-1]:
    return best * 2
  if best == grid[0]:
    return best / 2
  return None


def mean_std(values: list) -> tuple:
  """Mean and sample standard deviation (ddof = 1; None for fewer than two values)."""
  v = [x for x in values if x is not None]
  if not v:
    return None, None
  return float(np.mean(v)), (float(np.std(v, ddof=1)) if len(v) > 1 else None)


def table(records: dict, runs: list, lrs: list, seeds: list) -> list:
  """Per run: the picked rate, per-seed test accuracies, mean/std, losses and MB."""
  rows = []
  for name in runs:
    lr = pick_lr(records, name, lrs, seeds[0])
    if lr is None:
      continue
    rs = [records.get(key(name, lr, s)) for s in seeds]
    done = [r for r in rs if r is not None]  # seeds not trained yet are left out
    acc = [r["test_accuracy"] for r in done]
    m, sd = mean_std(acc)
    rows.append({"run": name, "lr": lr, "seeds": [s for s, r in zip(seeds, rs) if r],
                 "test_accuracy": acc, "mean": m, "std": sd, "diverged": acc.count(None),
                 "train_loss": mean_std([r["train_loss"] for r in done])[0],
                 "mb_sent": mean_std([r["bytes_sent"] / 1e6 if r["bytes_sent"] else None
                                      for r in done])[0],
                 "tuning": {f"{x:g}": records[key(name, x, seeds[0])]["train_loss"]
                            for x in tried_lrs(records, name, seeds[0])}})
  return rows


def _pct(x):
  return "diverged" if x is None else f"{100 * x:.2f}"


def markdown(rows: list, a) -> str:
  lines = [f"Study `{a.study}`: each run's learning rate picked by the final training loss of "
           f"seed {a.seeds[0]} from {a.lrs}, extended (x2 or /2, at most {a.extend} more) "
           "while the best was at an edge; then every seed at that rate. Test accuracy on all "
           "2,000 held-out mnist10k digits: mean +- sample std (ddof = 1) over the seeds "
           "named, then each seed's value (%).", "",
           "| run | lr | seeds | test acc. (%) | per seed | train loss | MB / worker | "
           "tuning: lr -> train loss |",
           "|---|---:|---|---:|---|---:|---:|---|"]
  for r in rows:
    sd = "" if r["std"] is None else f" +- {100 * r['std']:.2f}"
    mean = "diverged" if r["mean"] is None else f"{100 * r['mean']:.2f}{sd}"
    if r["diverged"] and r["mean"] is not None:
      mean += f" ({r['diverged']} diverged)"
    loss = "-" if r["train_loss"] is None else f"{r['train_loss']:.4f}"
    mb = "-" if r["mb_sent"] is None else f"{r['mb_sent']:.2f}"
    tl = ", ".join(f"{lr}: " + ("div." if x is None else f"{x:.3f}")
                   for lr, x in r["tuning"].items())
    lines.append(f"| {r['run']} | {r['lr']:g} | {', '.join(map(str, r['seeds']))} | {mean} | "
                 f"{', '.join(_pct(x) for x in r['test_accuracy'])} | {loss} | {mb} | {tl} |")
  return "\n".join(lines) + "\n"


def save(a, records: dict, runs: list) -> None:
  rows = table(records, runs, a.lrs, a.seeds)
  results = {"args": {k: v for k, v in vars(a).items() if k != "report"}, "table": rows,
             "records": records}
  common.write_atomic(os.path.join(a.out, "results.json"), json.dumps(results))
  common.write_atomic(os.path.join(a.out, "results.md"), markdown(rows, a))


def train_batch(a, runs: dict, records: dict, items: list) -> None:
  """Train the ``(name, lr, seed)`` runs ``records`` lacks in one call
  (``nbsgd_jax.train.train_runs``: one program per structure, the runs of a structure
  stacked), then record them (a diverged run has ``train_loss`` None) and save."""
  from nbsgd_jax import train
  todo = list(dict.fromkeys(i for i in items if key(*i) not in records))
  if not todo:
    return
  cfgs = [runs[name](lr, seed) for name, lr, seed in todo]
  for c in cfgs:
    c.eval_worker_accuracy = False
  t = time.time()
  summaries = train.train_runs(cfgs)
  share = (time.time() - t) / len(todo)
  for item, s in zip(todo, summaries):
    if s.get("stopped") == "diverged":
      r = {"test_accuracy": None, "train_loss": None, "bytes_sent": None, "seconds": share,
           "diverged": s.get("error", "diverged")}
    else:
      r = {"test_accuracy": float(s["test_accuracy"]), "train_loss": float(s["train_loss"]),
           "bytes_sent": float(s["bytes_sent"]), "seconds": share}
    records[key(*item)] = r
    print(f"  {key(*item):45s} acc {_pct(r['test_accuracy'])} loss {r['train_loss']}",
          flush=True)
  print(f"  ({len(todo)} runs in {time.time() - t:.0f} s)", flush=True)
  save(a, records, list(runs))


def run_study(a, records: dict) -> None:
  """Train what ``records`` lacks, in three stages of batched runs: the grid at the tuning
  seed, its extensions (one batch per round, where a run's best rate is at an edge), then
  the other seeds at each run's picked rate."""
  runs = study_runs(a.study)
  names = [n for n in runs if not a.only or n in a.only]
  s0 = a.seeds[0]
  train_batch(a, runs, records, [(name, lr, s0) for name in names for lr in a.lrs])
  while True:
    more = [(name, lr, s0) for name in names
            for lr in [next_lr(records, name, a.lrs, s0, a.extend)] if lr is not None]
    if not more:
      break
    train_batch(a, runs, records, more)
  train_batch(a, runs, records, [(name, pick_lr(records, name, a.lrs, s0), seed)
                                 for name in names for seed in a.seeds[1:]])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("study", choices=STUDIES)
  ap.add_argument("--out", required=True)
  ap.add_argument("--lrs", type=float, nargs="+", default=[0.02, 0.05, 0.1])
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  ap.add_argument("--extend", type=int, default=2,
                  help="rates tried beyond --lrs, x2 or /2, while the best is at an edge")
  ap.add_argument("--only", nargs="*", default=None, help="run names to train (default: all)")
  ap.add_argument("--report", action="store_true", help="rewrite results.md, no training")
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "results.json")
  records = {}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    if old["args"]["lrs"] != a.lrs or old["args"]["seeds"][0] != a.seeds[0]:
      raise SystemExit(f"{path} was tuned with --lrs {old['args']['lrs']} and seed "
                       f"{old['args']['seeds'][0]} first; give those (more seeds may follow) "
                       "or another --out")
    records = old["records"]
  if not a.report:
    run_study(a, records)
  save(a, records, list(study_runs(a.study)))
  print(markdown(table(records, list(study_runs(a.study)), a.lrs, a.seeds), a))


if __name__ == "__main__":
  main()
