"""Where Overlap-SGP's speed-up on equal workers comes from: its graph, its messages or its
overlap (docs/nonblocking.md, "Against asynchrony: the straggler grid").

    python experiments/overlap_sgp_ablation.py --out docs/nonblocking/overlap_ablation   # ~5 min

In the straggler grid's homogeneous cell (``experiments/reproduce_nonblocking.py
--asynchronous``: 16 workers, the MLP on mnist10k, batch 32, momentum 0.9, T_b = 40 ms, no
delays) Overlap-SGP reaches blocking D-PSGD's target 1.20x sooner. Overlap-SGP differs from
D-PSGD on the ring in three ways at once: the graph (the time-varying one-peer exponential
graph of Assran et al. 2019, one in-neighbour a step, against the ring's two), the messages
(one model sent a step against two) and the overlap (a worker computes while its round is in
flight, so the model it receives is its neighbour's from before that step's gradient). Four runs per seed separate them, each blocking on the
lockstep clock at the grid's blocking rate (``--lr``, 0.4: the rate every one of them got in
that cell), ``--steps`` steps:

* ``dpsgd, ring``: the grid's baseline (its time to target is checked against the grid's
  record);
* ``dpsgd, one_peer_exponential``: D-PSGD on Overlap-SGP's graph, waiting for its one
  in-neighbour (each W_t is doubly stochastic, so this is SGP without the overlap);
* ``sgp``: SGP (push-sum) on that graph without the overlap;
* ``sgp, overlap``: Overlap-SGP as in the grid.

Per run and seed: the simulated seconds and the steps to the grid's D-PSGD target (its
``targets``, linear interpolation between evaluations: ``experiments/common.py::time_to``),
the simulated seconds per step and the MB sent per worker to the target. The time to target is
(steps to target) x (seconds per step): the graph changes the first factor, the messages and
the overlap the second. Writes ``OUT/results.json`` (every run's evaluations) and
``OUT/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (puts the repository on sys.path; time_to)
import reproduce_nonblocking as nb  # noqa: E402

CELL = "homogeneous"
GRID = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "nonblocking", "asynchronous", "results.json")
VARIANTS = {"dpsgd, ring": {},
            "dpsgd, one_peer_exponential": {"topology": "one_peer_exponential"},
            "sgp": {"as_algorithm": "sgp", "topology": "one_peer_exponential"},
            "sgp, overlap": {"as_algorithm": "sgp", "sgp.overlap": True,
                             "topology": "one_peer_exponential"}}
KEEP = ("step", "sim_time", "train_loss", "bytes_sent", "wall_time")


def configs(a, seed: int) -> list:
  """The four runs of one seed (module docstring), in ``VARIANTS``' order."""
  ns = argparse.Namespace(workers=16, model="mlp", topology="ring",
                          matcha_topology="erdos_renyi", steps=a.steps, eval_every=a.eval_every,
                          nb_step_factor=1, event_step_factor=1)
  return [nb.make_config(ns, "dpsgd", a.lr, seed, CELL, **kw) for kw in VARIANTS.values()]


def steps_to(history: list, target: float):
  """Steps until ``train_loss <= target``, interpolated as :func:`common.time_to`."""
  return common.time_to([{**h, "sim_time": h["step"]} for h in history], target)


def facts(history: list, target: float) -> dict:
  """One run's time and steps to ``target``, seconds per step and MB per worker to it."""
  t = common.time_to(history, target)
  last = history[-1]
  mb = None if t is None else float(np.interp(t, [h["sim_time"] for h in history],
                                              [h["bytes_sent"] for h in history])) / 1e6 / 16
  return {"time_to_target": t, "steps_to_target": steps_to(history, target),
          "seconds_per_step": last["sim_time"] / last["step"], "mb_to_target": mb,
          "wall_s": last.get("wall_time")}


def markdown(res: dict) -> str:
  """The table of ``results.json``: per variant, each seed's figures and their mean."""
  lines = [f"`{res['command']}`", "",
           f"The straggler grid's homogeneous cell (16 workers, the MLP, T_b = 40 ms, no "
           f"delays), every run blocking at learning rate {res['lr']:g}, {res['steps']} steps, "
           f"seeds {res['seeds']}; target: the grid's D-PSGD target of each seed "
           "(docs/nonblocking/asynchronous/results.json `targets`); times and steps to it "
           "interpolated between evaluations. Speed-up: the ring's time over this time, per "
           "seed. Per seed 0 / 1 / 2, then the mean.", "",
           "| run | s to target | steps to target | s per step | MB per worker to target "
           "| speed-up over the ring |", "|---|---|---|---:|---|---|"]
  f = lambda vals, d: " / ".join("-" if v is None else f"{v:.{d}f}" for v in vals) + (  # noqa
      f" (mean {np.mean(vals):.{d}f})" if all(v is not None for v in vals) else "")
  ring = [r["time_to_target"] for r in res["runs"]["dpsgd, ring"]]
  for name, runs in res["runs"].items():
    sp = [None if r["time_to_target"] is None else t / r["time_to_target"]
          for t, r in zip(ring, runs)]
    lines.append(f"| {name} | {f([r['time_to_target'] for r in runs], 3)} | "
                 f"{f([r['steps_to_target'] for r in runs], 1)} | "
                 f"{runs[0]['seconds_per_step'] * 1e3:.2f} ms | "
                 f"{f([r['mb_to_target'] for r in runs], 1)} | {f(sp, 3)} |")
  lines += ["", f"The grid's record, blocking D-PSGD on the ring: "
            f"{' / '.join(f'{t:.3f}' for t in res['grid_ring_time'])} s to target.", ""]
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  ap.add_argument("--steps", type=int, default=200)
  ap.add_argument("--eval_every", type=int, default=20)
  ap.add_argument("--lr", type=float, default=0.4)
  a = ap.parse_args()
  with open(GRID) as fh:
    grid = json.load(fh)
  targets = grid["scenarios"]["main"]["targets"]
  ring_row = [r for r in grid["cells"] if r["cell"] == CELL and r["algorithm"] == "dpsgd"][0]
  start = time.time()
  cfgs = [c for seed in a.seeds for c in configs(a, seed)]
  runs = common.run_histories(cfgs, KEEP)
  out = {name: [] for name in VARIANTS}
  for i, seed in enumerate(a.seeds):
    for j, name in enumerate(VARIANTS):
      h = runs[i * len(VARIANTS) + j]["history"]
      out[name].append({"seed": seed, **facts(h, targets[f"dpsgd/seed{seed}"]), "history": h})
  res = {"command": common.repo_relative("python experiments/overlap_sgp_ablation.py "
                                         + " ".join(sys.argv[1:])),
         "lr": a.lr, "steps": a.steps, "seeds": a.seeds, "cell": CELL,
         "targets": {str(s): targets[f"dpsgd/seed{s}"] for s in a.seeds},
         "grid_ring_time": [ring_row["time_blocking"]["per_seed"][ring_row["seeds"].index(s)]
                            for s in a.seeds],
         "runs": out, "seconds": time.time() - start}
  os.makedirs(a.out, exist_ok=True)
  common.write_results(a.out, res, markdown(res))


if __name__ == "__main__":
  main()
