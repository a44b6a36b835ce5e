"""The simulated clock on a hierarchical network with a fail-slow episode, against real
processes (issue 58, item 8): ``validate_clock.py``'s scenario with per-level link delays and
an injected episode, each run next to the simulator's prediction for the same config and seed.

    python experiments/validate_fleet_clock.py --out docs/validate_clock/fleet

Scenario: ``validate_clock.py``'s (4 processes on loopback, one worker each, the MLP on
mnist10k, batch 32 in M = 4 mini-batches, 1.5 ms an example, slowdowns 1, 1.25, 1.5, 3,
Bernoulli(0.2) x Exp(40 ms) straggler delays), plus:

* a two-level network: nodes of 2 workers (2 ms a message, 1 GB/s) behind an 8 ms, 1 GB/s
  link; the wall clock sleeps each step's rounds' modelled time after the real collective
  (``cluster.emulate``), the simulated clock charges the same rounds;
* a fail-slow episode from a trace (``cluster.trace``): worker 3, already the slowest (3 x 48
  ms), computes twice slower again (0.288 s a step) for steps 15-29.

Runs: blocking all-reduce (flat ring), the hierarchical all-reduce (groups of 2), Non-blocking
all-reduce (adaptive deadline) and blocking D-PSGD on the ring. The loopback's own cost of a
step (the update, the real collective, the host) is calibrated first as
``validate_clock.py`` does (blocking all-reduce and D-PSGD without stragglers or links:
``step_overhead + messages x latency``) and enters each prediction as a fixed step overhead
for the run's real messages (a flat psum's 6 for every all-reduce, 2 for D-PSGD); the modelled
links replace ``cluster.latency``. Measured and
predicted seconds per step from step 2 on, and over the episode's steps alone.

Writes ``OUT/results.json`` and ``OUT/results.md``. About 4 minutes on 2 CPU cores (nothing
else running: the measurement is of the wall clock).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import validate_clock as vc  # noqa: E402

EPISODE = (15, 30)  # steps [15, 30): worker 3 (slowdown 3) twice slower again
NETWORK = {"cluster.levels": ("2:2e-3:1e9",), "cluster.latency": 8e-3,
           "cluster.bandwidth": 1e9}
# name, algorithm, non-blocking, extra keys, loopback messages a step (the calibration's unit:
# the real program's, a flat psum for the hierarchical all-reduce too)
RUNS = [("allreduce_blocking", "allreduce", False, {}, 6),
        ("allreduce_hierarchical", "allreduce", False, {"cluster.allreduce_group_size": 2}, 6),
        ("allreduce_nonblocking", "allreduce", True, {}, 6),
        ("dpsgd_blocking", "dpsgd", False, {}, 2)]


def trace_file(work: str) -> str:
  """The episode as a trace: worker 3 at 6 x 48 ms from step 15, back to 3 x 48 ms at 30."""
  step_s = vc.SCENARIO["cluster.time_per_example"] * vc.SCENARIO["batch_size"] * 3.0
  path = os.path.join(work, "episode.csv")
  with open(path, "w") as f:
    f.write(f"step,worker,seconds\n{EPISODE[0]},3,{2 * step_s:g}\n{EPISODE[1]},3,{step_s:g}\n")
  return path


def per_step(curve_steps: list, lo: int, hi: int) -> float:
  """Mean seconds per step over steps [lo, hi) of ``[(step, seconds of that step)]``."""
  xs = [s for k, s in curve_steps if lo <= k < hi]
  return sum(xs) / len(xs)


def real_steps(name: str, ov: dict, work: str) -> list:
  """[(step, wall seconds)] of the real run."""
  vc.real_run(name, ov, work)
  rows = vc._read(os.path.join(work, name, "steps.jsonl"))
  return [(r["step"], r["wall_step_s"]) for r in rows if "wall_step_s" in r]


def simulated_steps(ov: dict) -> list:
  """[(step, simulated seconds)] of the same config on the simulate backend."""
  from nbsgd_jax import config as config_lib
  from nbsgd_jax import train
  cfg = config_lib.override(config_lib.default_config(), {**ov, "eval_every": 1})
  hist = train.train(cfg)["history"]
  return [(b["step"], b["sim_time"] - a["sim_time"]) for a, b in zip(hist, hist[1:])]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--steps", type=int, default=45)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  start, runs = time.time(), []
  with tempfile.TemporaryDirectory() as work:
    overhead, latency = vc.calibrate(work, 15)
    print(f"calibrated step_overhead {overhead:.4f} s, latency {latency:.4f} s", flush=True)
    trace = trace_file(work)
    for name, algorithm, nb, extra, msgs in RUNS:
      ov = vc.overrides(algorithm, nb, a.steps, {
          **NETWORK, **extra, "cluster.trace": trace,
          "cluster.step_overhead": overhead + msgs * latency})
      pred, real = simulated_steps(ov), real_steps(name, ov, work)
      row = {"name": name, "measured_s_per_step": per_step(real, 2, a.steps + 1),
             "predicted_s_per_step": per_step(pred, 2, a.steps + 1),
             "measured_episode_s_per_step": per_step(real, EPISODE[0] + 1, EPISODE[1] + 1),
             "predicted_episode_s_per_step": per_step(pred, EPISODE[0] + 1, EPISODE[1] + 1)}
      row["ratio_per_step"] = row["predicted_s_per_step"] / row["measured_s_per_step"]
      row["ratio_episode"] = (row["predicted_episode_s_per_step"]
                              / row["measured_episode_s_per_step"])
      runs.append(row)
      print(json.dumps(row), flush=True)
  out = {"scenario": {"base": "validate_clock.SCENARIO", "network": NETWORK,
                      "episode_steps": list(EPISODE), "steps": a.steps,
                      "calibrated_step_overhead_s": overhead,
                      "calibrated_latency_s": latency},
         "runs": runs, "seconds": time.time() - start,
         "command": common.repo_relative(
             "python experiments/validate_fleet_clock.py "
             + " ".join(argv if argv is not None else sys.argv[1:]))}
  common.write_results(a.out, out, markdown(out))
  return 0


def markdown(out: dict) -> str:
  lines = [f"`{out['command']}`", "",
           "| run | measured s/step | predicted | predicted / measured | measured s/step in "
           "the episode | predicted | predicted / measured |", "|---|---|---|---|---|---|---|"]
  for r in out["runs"]:
    lines.append(f"| {r['name']} | {r['measured_s_per_step']:.4f} | "
                 f"{r['predicted_s_per_step']:.4f} | {r['ratio_per_step']:.3f} | "
                 f"{r['measured_episode_s_per_step']:.4f} | "
                 f"{r['predicted_episode_s_per_step']:.4f} | {r['ratio_episode']:.3f} |")
  sc = out["scenario"]
  lines.append(f"\nsteps {sc['steps']}, episode steps {sc['episode_steps']}; calibrated "
               f"step overhead {sc['calibrated_step_overhead_s']:.4f} s, latency "
               f"{sc['calibrated_latency_s']:.4f} s; {out['seconds']:.0f} s in all")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.exit(main())
