"""The asynchronous family against D-PSGD and Non-blocking D-PSGD on the main job's CNN, one
heterogeneous cluster: simulated time to 97 % test accuracy and the accuracy at equal time.

    python experiments/asynchronous_cnn.py --out docs/asynchronous          # about 15 min
    python experiments/asynchronous_cnn.py --out runs/async --seeds 0 1 2

The main job (``experiments/configs/mnist.py``: 8 workers, the LeNet-style CNN on mnist10k,
batch 32, SGD with momentum 0.9, weight decay 5e-4, a ring), with a constant learning rate
(``--lr``: a worker's schedule would count its own steps) on the non-blocking study's
reference cluster (``experiments/reproduce_nonblocking.py``, "speeds 0.3 + stragglers":
lognormal speeds, sigma 0.3; a straggler delay with probability 0.1, mean one batch time).
Runs, each with the same cluster seed as its training seed:

* ``dpsgd``: D-PSGD, ``--steps`` steps;
* ``dpsgd, non-blocking``: Non-blocking D-PSGD (He & Dube 2022, M = 4, deadline ``fastest``),
  ``--steps`` steps;
* ``ad_psgd``, ``swarm_sgd`` (H = 2), ``async_diloco`` (H = 10, outer lr 0.7, momentum 0.9,
  delayed Nesterov with N = 8): on the event clock, until D-PSGD's simulated time
  (``stop_sim_time``; ``num_steps`` counts batches of events; asynchronous DiLoCo's
  evaluations read the server's model);
* ``sgp, overlap``: Overlap-SGP on the one-peer exponential graph, ``--steps`` steps.

Each run writes ``OUT/runs/<name>_s<seed>/`` (``config.json``, ``metrics.jsonl``,
``summary.json``); ``OUT/results.json`` and ``OUT/table.md`` hold, per algorithm, the mean and
spread over seeds (ddof = 1) of: the simulated seconds to 97 % test accuracy (linear
interpolation between the evaluations around the first at or above it,
``experiments/common.py::time_to``, as the other studies read their times to target), the
final test accuracy, the final simulated time, the gradients computed per worker and the mean
staleness of an applied gradient (changes to the worker's own model, the paper's tau
``staleness_tau`` where the run records it, and seconds); ``results.json`` also holds each
run's evaluations (``runs[name][i]["history"]``: step, simulated time, test accuracy), so a
figure can be recomputed from the record. Runs already finished are read back (the study
resumes). ``--time_factor 2 --algorithms async_diloco``: asynchronous
DiLoCo again with twice D-PSGD's time (``OUT/table_t2.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (puts the repository on sys.path; time_to)
import reproduce_nonblocking as nb  # noqa: E402
from nbsgd_jax import recipes  # noqa: E402
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax.core import files  # noqa: E402
from nbsgd_jax import train  # noqa: E402

TARGET = 0.97
RUNS = {"dpsgd": ("dpsgd", {}),
        "dpsgd, non-blocking": ("dpsgd", {"nonblocking.enabled": True,
                                          "nonblocking.num_minibatches": 4}),
        "ad_psgd": ("ad_psgd", {}),
        "swarm_sgd": ("swarm_sgd", {"swarm_sgd.local_steps": 2}),
        "async_diloco": ("async_diloco", {"diloco.local_steps": 10}),
        "sgp, overlap": ("sgp", {"topology": "one_peer_exponential", "sgp.overlap": True})}


def make_config(a, name: str, seed: int, stop_sim_time: float = 0.0):
  """One run's config (module docstring)."""
  algorithm, extra = RUNS[name]
  spread, prob, mean = nb.CELLS[nb.REFERENCE_CELL]
  asynchronous = stop_sim_time > 0
  over = {"algorithm": algorithm, "num_workers": 8, "model": "cnn", "dataset": "mnist10k",
          "topology": "ring", "batch_size": nb.BATCH, "learning_rate": a.lr,
          "lr_schedule": "constant", "momentum": 0.9, "weight_decay": 5e-4, "seed": seed,
          "num_steps": a.steps * (8 if asynchronous else 1),
          "eval_every": a.eval_every * (2 if asynchronous else 1), "stop_sim_time": stop_sim_time,
          "eval_train_examples": 1000, "progress": False, "cluster.seed": seed,
          "cluster.time_per_example": nb.TIME_PER_EXAMPLE, "cluster.scenario": "lognormal",
          "cluster.spread": spread, "cluster.delay": "bernoulli_exponential",
          "cluster.delay_prob": prob, "cluster.delay_mean": mean * nb.T_B, **extra}
  return config_lib.override(config_lib.default_config(), over)


def history(workdir: str) -> list:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def run(a, name: str, seed: int, stop: float = 0.0) -> dict:
  """The run's facts, trained unless its summary exists."""
  tail = "" if not stop or a.time_factor == 1 else f"_t{a.time_factor:g}"
  wd = os.path.join(a.out, "runs", f"{name.replace(', ', '_').replace('-', '_')}_s{seed}{tail}")
  if not os.path.exists(os.path.join(wd, "summary.json")):
    train.train(make_config(a, name, seed, stop), wd)
  h = history(wd)
  last = h[-1]
  cfg = make_config(a, name, seed, stop)
  if not stop:
    steps = last["step"]
  elif "pushes" in last:  # asynchronous DiLoCo: H inner steps a push
    steps = last["pushes"] * cfg.diloco.local_steps / 8
  else:
    steps = last["events"] / 8
  own = last.get("staleness_own_steps", last.get("staleness_steps", 0.0))
  return {"time_to_target": time_to_accuracy(h, TARGET),
          "test_accuracy": last["test_accuracy"], "sim_time": last["sim_time"],
          "steps_per_worker": steps, "staleness_steps": own,
          "staleness_tau": last.get("staleness_tau", None if stop else 0.0),
          "staleness_s": last.get("staleness_s", 0.0),
          "history": [{k: r[k] for k in ("step", "sim_time", "test_accuracy")} for r in h]}


def time_to_accuracy(history: list, target: float):
  """Simulated seconds until ``test_accuracy >= target``: ``common.time_to`` (linear between
  the evaluations around the first that reaches it) on the negated accuracy; None if never."""
  neg = [{"sim_time": r["sim_time"], "error": -r["test_accuracy"]} for r in history]
  return common.time_to(neg, -target, "error")


def spread(values: list) -> dict:
  v = [x for x in values if x is not None]
  return {"mean": float(np.mean(v)) if v else None,
          "std": float(np.std(v, ddof=1)) if len(v) > 1 else None,
          "reached": len(v), "runs": len(values)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--seeds", type=int, nargs="+", default=[0])
  ap.add_argument("--steps", type=int, default=600)
  ap.add_argument("--eval_every", type=int, default=50)
  ap.add_argument("--lr", type=float, default=0.05)
  ap.add_argument("--algorithms", nargs="+", default=list(RUNS), choices=list(RUNS),
                  help="a subset (D-PSGD always runs: it sets the time budget)")
  ap.add_argument("--time_factor", type=float, default=1.0,
                  help="event-clock runs stop at this x D-PSGD's simulated time (not 1: "
                       "their run folders and the outputs get the suffix _t<factor>)")
  a = ap.parse_args()
  names = ["dpsgd", *[n for n in a.algorithms if n != "dpsgd"]]
  facts = {name: [] for name in names}
  for seed in a.seeds:
    base = run(a, "dpsgd", seed)
    facts["dpsgd"].append(base)
    for name in names:
      if name != "dpsgd":
        on_events = recipes.is_asynchronous(RUNS[name][0])  # until D-PSGD's time
        stop = base["sim_time"] * a.time_factor if on_events else 0.0
        facts[name].append(run(a, name, seed, stop))
      shown = {k: v for k, v in facts[name][-1].items() if k != "history"}
      print(f"seed {seed} {name:22s} {shown}", flush=True)
  results = {"args": common.repo_relative(vars(a)), "target": TARGET,
             "time_to_target": "interpolated", "runs": facts,
             "summary": {name: {k: spread([f[k] for f in fs]) for k in fs[0] if k != "history"}
                         for name, fs in facts.items()}}
  tail = "" if a.time_factor == 1 else f"_t{a.time_factor:g}"
  common.write_results_json(os.path.join(a.out, f"results{tail}.json"), results, indent=1)
  files.atomic_write(os.path.join(a.out, f"table{tail}.md"), markdown(results))
  print(markdown(results))


def markdown(results: dict) -> str:
  """``table.md`` of a ``results.json`` (records written before the times were interpolated,
  without ``"time_to_target"``, read them at the first evaluation at or above the target)."""
  a = results["args"]
  tau = "staleness_tau" in next(iter(results["summary"].values()))  # recorded since issue 54
  own, tau_head, tau_rule = ("own-model ", "staleness, tau | ", "---|") if tau else ("", "", "")
  rule = ("97 % test accuracy, linear between the evaluations around the first at >= 97 %"
          if results.get("time_to_target") == "interpolated" else
          "the first evaluation at >= 97 % test accuracy")
  lines = [f"Seeds {a['seeds']}; mean (std, ddof = 1) over seeds; 'to 97 %': simulated seconds "
           f"to {rule} (runs that reached it / runs); event-clock runs stop at "
           f"{a['time_factor']:g} x D-PSGD's simulated time.\n",
           "| algorithm | s to 97 % | test accuracy | sim time, s | steps per worker | "
           f"staleness, {own}steps | {tau_head}staleness, s |", "|---|---|---|---|---|---|---|"
           + tau_rule]
  fmt = lambda d, p: ("-" if d["mean"] is None else f"{d['mean']:.{p}f}" if d["std"] is None  # noqa
                      else f"{d['mean']:.{p}f} ({d['std']:.{p}f})")
  for name, sm in results["summary"].items():
    t = sm["time_to_target"]
    lines.append(f"| {name} | {fmt(t, 1)} [{t['reached']}/{t['runs']}] | "
                 f"{fmt(sm['test_accuracy'], 4)} | {fmt(sm['sim_time'], 1)} | "
                 f"{fmt(sm['steps_per_worker'], 0)} | {fmt(sm['staleness_steps'], 2)} | "
                 + (f"{fmt(sm['staleness_tau'], 2)} | " if tau else "")
                 + f"{fmt(sm['staleness_s'], 3)} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
