"""DiLoCo's descendants on one clock: the character LM under the DiLoCo paper's protocol,
compared at equal bytes and equal simulated time on two networks (issue 57's study).

Protocol (Douillard et al. 2023, Sec. 3, as ``diloco_paper.py``): per seed, a synchronous
all-reduce prefix (8 workers, i.i.d. shards) checkpointed once; every method continues from it
for ``--steps`` steps (its optimizer state fresh; warm-up, then cosine to a tenth):

* ``allreduce``, ``diloco`` (H inner AdamW steps, outer Nesterov 0.7 / 0.9), ``diloco_eager``
  (DiLoCo whose all-reduce overlaps the next H steps, eager outer steps), ``streaming_diloco``
  (P = 2 fragments, overlap tau = H / 4, alpha 0.5), ``muloco`` (DiLoCo with Muon inside),
  ``demo`` (sign SGD on the decoupled momentum's top-32 DCT coefficients per 64-chunk),
  ``sparseloco`` (DiLoCo with error feedback, top-k and 2-bit codes, outer lr 1, its paper's
  run), ``noloco`` (groups of 2, outer lr 0.7, momentum 0.5, its paper's runs), ``sparta``
  (AdamW, then the mean of p = 0.005 of the coordinates every step).

Each method's inner learning rate is tuned on ``--tune_seed`` (never reported) by the final
training loss over its own grid (``--grids``), extended x2 or / 2 while the pick is at an edge
(``--extend`` times; a pick still at an edge is marked); the outer rates are the papers'
(not tuned: named in the table). The reported seeds run on both networks: ``datacenter``
(100 Gbit/s, 10 us a message) and ``wan`` (1 Gbit/s, 50 ms); the training is the same on both,
only the simulated clock differs. ``OUT/results.json`` is rewritten after every group and read
back on a restart: the study resumes where it stopped.

    python experiments/frontier_lm.py --out docs/frontier
    python experiments/frontier_lm.py --out /tmp/frontier --quick   # a minute-long smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
import time

import numpy as np

import common  # noqa: E402  (experiments/common.py)
import diloco_paper  # noqa: E402  (the prefix and the results file)
import reproduce_diloco  # noqa: E402  (the LM's base config)

from nbsgd_jax import config as config_lib

KEEP = ("step", "sim_time", "wall_time", "bytes_sent", "rounds", "test_loss", "train_loss",
        "consensus_distance")
NETWORKS = {"datacenter": {"cluster.bandwidth": 100e9 / 8, "cluster.latency": 1e-5},
            "wan": {"cluster.bandwidth": 1e9 / 8, "cluster.latency": 0.05}}
GRIDS = {"adamw": [1e-3, 2e-3, 4e-3], "sign": [3e-4, 1e-3, 3e-3], "muon": [3e-3, 1e-2, 3e-2]}


def methods(a) -> dict:
  """name -> (config overrides, learning-rate grid name, description)."""
  h = a.h
  diloco = {"algorithm": "diloco", "diloco.local_steps": h}
  out = {
      "allreduce": ({"algorithm": "allreduce"}, "adamw", "all-reduce every step"),
      "diloco": (diloco, "adamw", f"DiLoCo, H = {h}"),
      "diloco_eager": ({**diloco, "diloco.overlap": "eager"}, "adamw",
                       f"DiLoCo, H = {h}, all-reduce overlapping the next H steps, eager"),
      "streaming_diloco": ({"algorithm": "streaming_diloco", "diloco.local_steps": h,
                            "streaming_diloco.fragments": 2,
                            "streaming_diloco.delay": max(h // 4, 1),
                            "streaming_diloco.alpha": 0.5}, "adamw",
                           f"Streaming DiLoCo, H = {h}, P = 2, tau = {max(h // 4, 1)}"),
      "muloco": ({**diloco, "optimizer": "muon"}, "muon", f"MuLoCo: DiLoCo, Muon inside"),
      "demo": ({"algorithm": "demo", "optimizer": "sgd", "momentum": 0.0}, "sign",
               "DeMo, top-32 of 64-chunks, beta 0.999"),
      "sparseloco": ({"algorithm": "sparseloco", "sparseloco.local_steps": h}, "adamw",
                     f"SparseLoCo, H = {h}, top-128 / 64^2, 2 bits"),
      "noloco": ({"algorithm": "noloco", "noloco.local_steps": h}, "adamw",
                 f"NoLoCo, H = {h}, groups of 2"),
      "sparta": ({"algorithm": "sparta", "sparta.density": 0.005}, "adamw", "SPARTA, p = 0.005"),
  }
  if a.methods:
    out = {k: out[k] for k in a.methods}
  return out


def _key(rate: float) -> str:
  return f"learning_rate={rate:g}"


def continuation(a, seed: int, name: str, rate: float, network: str):
  over, _, _ = methods(a)[name]
  return config_lib.override(reproduce_diloco.base_config(a, seed), {
      **over, "learning_rate": rate, "lr_min": rate * a.lr_min_ratio,
      "init_from": diloco_paper.prefix(a, reproduce_diloco.base_config, seed),
      "partition": "iid", "checkpoint_every": 0, **NETWORKS[network]})


def tune(a, res: dict) -> dict:
  """Each method's rate grid on the tuning seed (extended at an edge); name -> its pick."""
  picks = {}
  for name, (_, grid, _) in methods(a).items():
    where, rates = res["tuning"].setdefault(name, {}), sorted(GRIDS[grid])
    for extension in range(a.extend + 1):
      diloco_paper._run_group(a, res, where, {
          _key(r): functools.partial(continuation, a, a.tune_seed, name, r, "datacenter")
          for r in rates})
      best = min(rates, key=lambda r: diloco_paper._final(where[_key(r)], "train_loss"))
      edge = best in (rates[0], rates[-1])
      if not edge or extension == a.extend:
        break
      rates = sorted(rates + [best * 2 if best == rates[-1] else best / 2])
    picks[name] = {"rate": best, "edge": edge, "grid": rates,
                   "train_loss": diloco_paper._final(where[_key(best)], "train_loss")}
    print(f"  {name}: lr {best:g}" + (" (at the grid's edge)" if edge else ""), flush=True)
  res.setdefault("picks", {}).update(picks)
  diloco_paper.save(a, res)
  return picks


def report(a, res: dict, picks: dict) -> None:
  """Every method at its pick on every reported seed and network: one call a method (its
  seeds on both networks train as one program; only the simulated clock differs)."""
  for name in methods(a):
    where, make = {}, {}
    for network in NETWORKS:
      rec = res["methods"].setdefault(f"{name}@{network}", {
          "method": name, "network": network, "rate": picks[name]["rate"], "seeds": {}})
      for seed in a.seeds:
        where[f"{network}/{seed}"] = rec["seeds"].get(str(seed))
        make[f"{network}/{seed}"] = functools.partial(continuation, a, seed, name,
                                                      picks[name]["rate"], network)
    done = {k: v for k, v in where.items() if v is not None}
    diloco_paper._run_group(a, res, done, make, KEEP)
    for key, r in done.items():
      network, seed = key.split("/")
      res["methods"][f"{name}@{network}"]["seeds"][seed] = r
    diloco_paper.save(a, res)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true", help="a minute-long smoke run")
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  p.add_argument("--tune_seed", type=int, default=3)
  p.add_argument("--methods", nargs="+", default=None)
  p.add_argument("--prefix_steps", type=int, default=200)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--h", type=int, default=20, help="inner steps H of the periodic methods")
  p.add_argument("--extend", type=int, default=1)
  p.add_argument("--workers", type=int, default=8)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--d_model", type=int, default=96)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--context", type=int, default=64)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--eval_every", type=int, default=40)
  p.add_argument("--eval_train_examples", type=int, default=128)
  p.add_argument("--lr", type=float, default=2e-3, help="the prefix's AdamW rate")
  p.add_argument("--lr_min_ratio", type=float, default=0.1)
  p.add_argument("--warmup", type=int, default=30)
  p.add_argument("--grad_clip", type=float, default=1.0)
  a = p.parse_args()
  a.outer_lr, a.outer_momentum, a.partition, a.bandwidth, a.latency = 0.7, 0.9, "iid", 0.0, None
  if a.quick:
    a.layers, a.d_model, a.heads, a.context, a.batch = 1, 32, 2, 32, 4
    a.prefix_steps, a.steps, a.eval_every, a.warmup, a.h = 10, 24, 12, 2, 6
    a.eval_train_examples, a.seeds, a.tune_seed, a.extend = 32, a.seeds[:1], 9, 0
  os.makedirs(a.out, exist_ok=True)
  settings = common.repo_relative(vars(a))  # paths relative to the repository
  settings["networks"] = NETWORKS
  command = common.repo_relative("python experiments/frontier_lm.py " + " ".join(
      shlex.quote(x) for x in sys.argv[1:]))
  path = os.path.join(a.out, "results.json")
  res = {"command": command, "settings": settings, "tuning": {}, "methods": {}}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    free = ("out", "methods")  # a subset of the methods resumes the same study
    if {k: v for k, v in old.get("settings", {}).items() if k not in free} == {
        k: v for k, v in settings.items() if k not in free}:
      res.update(old)
      print(f"resuming {path}", flush=True)
  res["seconds_before"], res["_start"] = res.get("seconds", 0.0), time.time()
  a.prefixes_done = {}
  picks = tune(a, res)
  report(a, res, picks)
  res.setdefault("prefix_test_loss", {}).update(
      {str(k): v for k, v in a.prefixes_done.items()})
  diloco_paper.save(a, res)
  import frontier_report  # noqa: E402  (experiments/frontier_report.py)
  frontier_report.write(res, a.out)


if __name__ == "__main__":
  main()
