"""Each run's learning rate tuned on a small grid, then several seeds: the multi-seed tables.

    python experiments/tune_seeds.py sparsification --out docs/sparsification/seeds
    python experiments/tune_seeds.py local_sgd --out docs/local_sgd/seeds

A study is the list of runs of a reproduction script (``sparsification``: the 13 runs of
``reproduce_sparsification.py``, dense and {Top-k, Gaussian-k, Random-k} x {with, without
error feedback} x {density 0.01, 0.001}; ``local_sgd``: the 5 mnist10k runs of
``reproduce_local_sgd.py`` (c), local SGD tau 1 / 4 / 16, post-local SGD, DiLoCo with its
outer optimizer fixed). For every run:

1. train with the tuning seed ``--tune_seed`` (default 3, never reported) at each learning
   rate of ``--lrs``, with ``--validation`` training examples held out
   (``config.validation_examples``: the test set plays no part in the choice);
2. pick the rate with the lowest final loss of the averaged model on that validation split
   (a diverged run counts as +inf), extending the grid (x2 or / 2, at most ``--extend``
   times) while the pick is at its edge;
3. train the reported ``--seeds`` at that rate on the whole training split.

The table gives, per run, the picked rate, the test accuracy (all 2,000 held-out digits of
mnist10k) as mean +- sample standard deviation (ddof = 1) over the seeds with each seed's
value, the training loss, the MB sent per worker and the tuning grid's validation losses.
The sparsification study also has Gaussian-k with GaussianK-SGD's own correction loop
(``compression.gaussian_correction="paper"``: everything the loop selects is sent, so its
bytes are its own), beside the default bracketing correction. ``results.json`` is rewritten after
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
    grid = [("none", 1.0, False, "")] + [
        (c, dens, ef, "") for dens in (0.01, 0.001) for c in sp.COMPRESSORS
        for ef in (True, False)] + [("gaussian_k", dens, ef, "paper") for dens in (0.01, 0.001)
                                    for ef in (True, False)]
    return {_sparse_name(*g): (lambda lr, seed, g=g: _sparse_config(
        sp, *g, SimpleNamespace(**base, lr=lr, seed=seed))) for g in grid}
  if study == "local_sgd":
    import reproduce_local_sgd as ls
    a = {"mnist_steps": 600, "mnist_eval_every": 600}
    return {name: (lambda lr, seed, algo=algo, kw=kw: ls.mnist_config(
        SimpleNamespace(**a, seed=seed), algo, lr=lr, **kw))
            for name, (algo, kw) in ls.mnist_runs(600).items()}
  raise ValueError(f"study={study!r} is not allowed: use one of {', '.join(STUDIES)}")


def _sparse_name(name: str, density: float, ef: bool, correction: str) -> str:
  import reproduce_sparsification as sp
  base = sp.run_name(name, density, ef)
  return base.replace("gaussian_k", f"gaussian_k({correction})") if correction else base


def _sparse_config(sp, name: str, density: float, ef: bool, correction: str, a):
  c = sp.make_config(name, density, ef, a)
  if correction:
    c.compression.gaussian_correction = correction
  return c


def key(name: str, lr: float, seed: int) -> str:
  return f"{name} | lr={lr:g} | seed={seed}"


def tried_lrs(records: dict, name: str, seed: int) -> list:
  """The learning rates run ``name`` was trained with at ``seed``, ascending."""
  prefix = f"{name} | lr="
  return sorted(float(k[len(prefix):].split(" |")[0]) for k in records
                if k.startswith(prefix) and k.endswith(f" | seed={seed}"))


def pick_lr(records: dict, name: str, lrs: list, seed: int):
  """The rate with the lowest final validation loss of run ``name`` at the tuning ``seed``
  among those tried (``records[key(name, lr, seed)]["test_loss"]``: these runs' test split
  is the validation split; None = diverged = +inf); None while a rate of the grid ``lrs``
  has not been trained."""
  if any(key(name, lr, seed) not in records for lr in lrs):
    return None
  grid = tried_lrs(records, name, seed)
  losses = [records[key(name, lr, seed)]["test_loss"] for lr in grid]
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


def table(records: dict, runs: list, lrs: list, seeds: list, tune_seed: int) -> list:
  """Per run: the rate picked on ``tune_seed``, the reported ``seeds``' test accuracies,
  mean/std, losses and MB."""
  rows = []
  for name in runs:
    lr = pick_lr(records, name, lrs, tune_seed)
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
                 "tuning": {f"{x:g}": records[key(name, x, tune_seed)]["test_loss"]
                            for x in tried_lrs(records, name, tune_seed)},
                 "edge": lr in (min(tried_lrs(records, name, tune_seed)),
                                max(tried_lrs(records, name, tune_seed)))})
  return rows


def _pct(x):
  return "diverged" if x is None else f"{100 * x:.2f}"


def markdown(rows: list, a) -> str:
  lines = [f"Study `{a.study}`: each run's learning rate picked on tuning seed {a.tune_seed} "
           f"(not reported) by the final loss on {a.validation:,} training examples held out "
           f"of its training (`validation_examples`; the test set plays no part), from "
           f"{a.lrs}, extended (x2 or /2, at most {a.extend} more) while the best was at an "
           "edge (a pick still at the edge is marked *edge*); then the reported seeds at that "
           "rate on the whole training split. Test accuracy on all 2,000 test digits of "
           "mnist10k: mean +- sample std (ddof = 1) over the seeds named, then each seed's "
           "value (%).", "",
           "| run | lr | seeds | test acc. (%) | per seed | train loss | MB / worker | "
           "tuning: lr -> validation loss |",
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
    lr = f"{r['lr']:g}" + (" *edge*" if r.get("edge") else "")
    lines.append(f"| {r['run']} | {lr} | {', '.join(map(str, r['seeds']))} | {mean} | "
                 f"{', '.join(_pct(x) for x in r['test_accuracy'])} | {loss} | {mb} | {tl} |")
  return "\n".join(lines) + "\n"


def save(a, records: dict, runs: list) -> None:
  rows = table(records, runs, a.lrs, a.seeds, a.tune_seed)
  results = {"args": common.repo_relative(
                 {k: v for k, v in vars(a).items() if k not in ("report", "retrain")}),
             "table": rows,
             "records": records}
  common.write_results_json(os.path.join(a.out, "results.json"), results)
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
  for c, (_, _, seed) in zip(cfgs, todo):
    c.eval_worker_accuracy = False
    c.validation_examples = a.validation if seed == a.tune_seed else 0
  t = time.time()
  summaries = train.train_runs(cfgs)
  share = (time.time() - t) / len(todo)
  for item, s in zip(todo, summaries):
    if s.get("stopped") == "diverged":
      r = {"test_accuracy": None, "test_loss": None, "train_loss": None, "bytes_sent": None,
           "seconds": share, "diverged": s.get("error", "diverged")}
    else:
      r = {"test_accuracy": float(s["test_accuracy"]), "test_loss": float(s["test_loss"]),
           "train_loss": float(s["train_loss"]), "bytes_sent": float(s["bytes_sent"]),
           "seconds": share}
    r["validation"] = item[2] == a.tune_seed  # test_* measured on the validation split
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
  s0 = a.tune_seed
  train_batch(a, runs, records, [(name, lr, s0) for name in names for lr in a.lrs])
  while True:
    more = [(name, lr, s0) for name in names
            for lr in [next_lr(records, name, a.lrs, s0, a.extend)] if lr is not None]
    if not more:
      break
    train_batch(a, runs, records, more)
  train_batch(a, runs, records, [(name, pick_lr(records, name, a.lrs, s0), seed)
                                 for name in names for seed in a.seeds])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("study", choices=STUDIES)
  ap.add_argument("--out", required=True)
  ap.add_argument("--lrs", type=float, nargs="+", default=[0.02, 0.05, 0.1])
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="reported seeds")
  ap.add_argument("--tune_seed", type=int, default=3,
                  help="the seed the rates are picked on (not among --seeds)")
  ap.add_argument("--validation", type=int, default=1000,
                  help="training examples held out of the tuning runs to pick the rate on")
  ap.add_argument("--extend", type=int, default=2,
                  help="rates tried beyond --lrs, x2 or /2, while the best is at an edge")
  ap.add_argument("--only", nargs="*", default=None, help="run names to train (default: all)")
  ap.add_argument("--retrain", action="store_true",
                  help="drop the records of the --only runs first, so they are trained anew "
                       "(tuning included: after a change to what they record)")
  ap.add_argument("--report", action="store_true", help="rewrite results.md, no training")
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "results.json")
  records = {}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    was = {k: old["args"].get(k) for k in ("lrs", "tune_seed", "validation")}
    if was != {k: getattr(a, k) for k in was}:
      raise SystemExit(f"{path} was tuned with {was}; give those (more seeds may follow) "
                       "or another --out")
    records = old["records"]
  if a.retrain:
    if not a.only:
      raise SystemExit("--retrain needs --only (the runs to train anew)")
    records = {k: v for k, v in records.items() if k.split(" | ")[0] not in a.only}
  if not a.report:
    run_study(a, records)
  save(a, records, list(study_runs(a.study)))
  print(markdown(table(records, list(study_runs(a.study)), a.lrs, a.seeds, a.tune_seed), a))


if __name__ == "__main__":
  main()
