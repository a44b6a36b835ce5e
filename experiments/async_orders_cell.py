"""The released codes' update orders on one cell of the straggler grid (issue 54, item 3).

    python experiments/async_orders_cell.py --out docs/nonblocking/async_orders \
        --seeds 0 1 2 --released_seeds 0 1 2 --released_sim_time 2.0

The cell and every setting but the order are ``experiments/reproduce_nonblocking.py
--asynchronous``'s (:func:`reproduce_nonblocking.make_config`: 16 workers, the MLP, the ring,
the reference cell ``speeds 0.3 + stragglers``), at the learning rate that study tuned for the
paper's order in this cell (read from its ``results.json``; not tuned again), with its targets
(the seed's lowest loss of blocking D-PSGD within 80 % of its steps) and its time budget
(1.5 x the blocking run's simulated time, recomputed here):

* SwarmSGD (H = 2), ``swarm_sgd.averaging='one_sided'`` (the released PopSGD code) and
  ``'symmetric'`` (the paper, the study's), each to the target: the time to target and the
  speed-up over blocking D-PSGD, per seed;
* AD-PSGD, ``ad_psgd.order='released'`` (the reference code's gossip loop: 80-120 loop
  iterations per gradient on this cell, so 100-130 x the device steps of the paper's order
  per simulated second) and ``'paper'``, each for ``--released_sim_time`` simulated seconds
  only: the training loss at equal simulated times (the released order to the target would
  take half an hour to 1.4 h of this 2-core machine per seed).

Writes ``OUT/results.json`` and ``OUT/results.md`` (a later call adds to them; ``real_seconds``
sums the calls'), with the AD-PSGD event clocks' records over the same simulated time
(replayed, nothing trained; ``--clock_only``: those alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import reproduce_nonblocking as R  # noqa: E402
from nbsgd_jax import train  # noqa: E402

CELL = R.REFERENCE_CELL
STUDY = "docs/nonblocking/asynchronous/results.json"


def _namespace(out: str) -> argparse.Namespace:
  """The ``--asynchronous`` study's arguments (its defaults), with a run cache in ``out``."""
  a = argparse.Namespace(workers=16, model="mlp", topology="ring", matcha_topology="erdos_renyi",
                         steps=200, nb_step_factor=5.0, event_step_factor=20.0, eval_every=20,
                         time_factor=1.5, trained=0, seconds={},
                         runs_dir=os.path.join(out, "runs"))
  os.makedirs(a.runs_dir, exist_ok=True)
  a.cache = R.cache_index(a.runs_dir)
  return a


def _row(study: dict, variant: str) -> dict:
  return next(r for r in study["cells"]
              if r["cell"] == CELL and r["algorithm"] == "dpsgd" and r["variant"] == variant)


def _to_target(a, study, variant, keys, seeds) -> dict:
  """``variant``'s runs with ``keys`` to the target: per seed the time to target and the
  speed-up over blocking D-PSGD."""
  row = _row(study, variant)
  cfgs = []
  for seed in seeds:
    blocking = R.run(a, R.make_config(a, "dpsgd", study["lr_blocking"]["dpsgd"], seed, CELL))
    target = study["targets"][f"dpsgd/seed{seed}"]
    budget = (target, a.time_factor * R._end_time(blocking))
    t_b = R.time_to_target(blocking["history"], target)
    cfgs.append((seed, t_b, R.make_config(a, "dpsgd", row["lr"], seed, CELL, budget=budget,
                                          events=True, **keys)))
  R.run_many(a, [c for *_, c in cfgs])
  out = {"lr": row["lr"], "time": [], "speedup": [], "time_blocking": []}
  for seed, t_b, cfg in cfgs:
    t = R.time_to_target(R.run(a, cfg)["history"], study["targets"][f"dpsgd/seed{seed}"])
    out["time"].append(t)
    out["time_blocking"].append(t_b)
    out["speedup"].append(None if t is None else t_b / t)
  return out


def _curve(cfg) -> list:
  """``[(sim_time, train_loss)]`` of one run (no cache: a truncated run)."""
  (s,) = train.train_runs([cfg])
  return [(h["sim_time"], h["train_loss"]) for h in s["history"] if "train_loss" in h]


def _truncated(a, study, keys, seed, sim_time, eval_every) -> list:
  row = _row(study, "AD-PSGD")
  cfg = R.make_config(a, "dpsgd", row["lr"], seed, CELL, events=True, **keys)
  cfg.num_steps, cfg.eval_every, cfg.stop_sim_time = 10 ** 7, eval_every, sim_time
  return _curve(cfg)


def clock_record(a, study, order: str, seed: int, sim_time: float) -> dict:
  """AD-PSGD's event clock alone (no training: the events depend on the cluster and the seeds
  alone) replayed to ``sim_time``: its record (gradients and loop iterations per worker, the
  staleness) and the device steps (batches) it took."""
  row = _row(study, "AD-PSGD")
  cfg = R.make_config(a, "dpsgd", row["lr"], seed, CELL, events=True, as_algorithm="ad_psgd",
                      **{"ad_psgd.order": order})
  clock = train.Stepper.of(train.setup(cfg)).runs[0].host.part("clock")
  batches = 0
  while clock.clock.now < sim_time:
    clock.inputs(batches, types.SimpleNamespace(per_worker={}), None)
    batches += 1
  return {**clock.record(), "batches": batches, "message_s": clock.message_s,
          "workers": a.workers}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
  ap.add_argument("--released_seeds", type=int, nargs="*", default=[0, 1, 2])
  ap.add_argument("--released_sim_time", type=float, default=2.0)
  ap.add_argument("--skip_swarm", action="store_true")
  ap.add_argument("--clock_only", action="store_true",
                  help="add the AD-PSGD clocks' records to OUT/results.json, training nothing")
  args = ap.parse_args()
  with open(STUDY) as f:
    study = json.load(f)["scenarios"]["main"]  # cells, lr_blocking, targets
  a, res, start = _namespace(args.out), {"cell": CELL}, time.time()
  done = os.path.join(args.out, "results.json")
  if os.path.exists(done):  # a later call adds to it (e.g. more seeds)
    with open(done) as f:
      res = json.load(f)
  if args.clock_only:
    for seed in args.released_seeds:
      for order in ("released", "paper"):
        res[f"ad_psgd/{order}/seed{seed}"]["clock"] = clock_record(
            a, study, order, seed, args.released_sim_time)
    _write(args.out, res)
    return
  if not args.skip_swarm:
    for name, averaging in (("one_sided", "one_sided"), ("symmetric", "symmetric")):
      t = time.time()
      res[f"swarm_sgd/{name}"] = _to_target(
          a, study, "SwarmSGD (H = 2)",
          {"as_algorithm": "swarm_sgd", "swarm_sgd.averaging": averaging}, args.seeds)
      res[f"swarm_sgd/{name}"]["seconds"] = time.time() - t
      print(name, res[f"swarm_sgd/{name}"], flush=True)
    res["swarm_sgd/study_symmetric_speedup"] = _row(study, "SwarmSGD (H = 2)")["speedup"]
  for seed in args.released_seeds:
    for order, every in (("released", 400), ("paper", 2)):
      t = time.time()
      curve = _truncated(a, study, {"as_algorithm": "ad_psgd", "ad_psgd.order": order}, seed,
                         args.released_sim_time, every)
      res[f"ad_psgd/{order}/seed{seed}"] = {"curve": curve, "seconds": time.time() - t}
      print(order, seed, curve[-1], f"{time.time() - t:.0f} s", flush=True)
      res[f"ad_psgd/{order}/seed{seed}"]["clock"] = clock_record(
          a, study, order, seed, args.released_sim_time)
  res["real_seconds"] = res.get("real_seconds", 0.0) + time.time() - start
  _write(args.out, res)


def _write(out: str, res: dict) -> None:
  os.makedirs(out, exist_ok=True)
  R.common.write_results_json(os.path.join(out, "results.json"), res, indent=1)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(markdown(res))
  print(markdown(res))


def _at(curve, t):
  times, losses = zip(*curve)
  return float(np.interp(t, times, losses)) if times[0] <= t <= times[-1] else None


def markdown(res: dict) -> str:
  lines = [f"Cell: {res['cell']} (experiments/async_orders_cell.py).", ""]
  if "swarm_sgd/one_sided" in res:
    lines += ["| SwarmSGD (H = 2) averaging | lr | time to target per seed (s) | speed-up over "
              "blocking D-PSGD per seed |", "|---|---:|---|---|"]
    for name in ("symmetric", "one_sided"):
      r = res[f"swarm_sgd/{name}"]
      fmt = lambda v: ", ".join("not reached" if x is None else f"{x:.2f}" for x in v)
      lines.append(f"| {name} | {r['lr']:g} | {fmt(r['time'])} | {fmt(r['speedup'])} |")
    lines.append("")
  seeds = sorted({k.split("/")[2] for k in res if k.startswith("ad_psgd/")})
  for seed in seeds:
    rel, pap = res[f"ad_psgd/released/{seed}"]["curve"], res[f"ad_psgd/paper/{seed}"]["curve"]
    clocks = [res[f"ad_psgd/{o}/{seed}"].get("clock") for o in ("paper", "released")]
    if all(clocks):
      lines += [f"AD-PSGD, {seed}: the event clocks over the first {clocks[1]['sim_time']:.2f} "
                "simulated s", "", "| order | device steps | events per worker | gradients per "
                "worker | staleness_s (ms) | staleness_tau | staleness_own_steps |",
                "|---|---:|---:|---:|---:|---:|---:|"]
      for o, c in zip(("paper", "released"), clocks):
        lines.append(f"| {o} | {c['batches']} | {c['events'] / c['workers']:.1f} | "
                     f"{c['grads_per_worker']:.2f} | {c['staleness_s'] * 1e3:.1f} | "
                     f"{c['staleness_tau']:.1f} | {c['staleness_own_steps']:.2f} |")
      lines.append("")
    lines += [f"AD-PSGD, {seed}: training loss at equal simulated times", "",
              "| simulated s | paper | released |", "|---:|---:|---:|"]
    for t, loss in rel:
      p = _at(pap, t)
      lines.append(f"| {t:.3f} | {'-' if p is None else f'{p:.4f}'} | {loss:.4f} |")
    lines.append("")
  lines.append(f"{res['real_seconds']:.0f} s on this machine.")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
