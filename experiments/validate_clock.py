"""The simulated clock against real runs: blocking and non-blocking all-reduce and D-PSGD on 4
processes with emulated stragglers, each next to the simulator's prediction for the same
config and seed.

    python experiments/validate_clock.py --out results/validate_clock

Scenario (docs/clock.md, "Validation"): 4 processes on loopback (gloo), one worker each, an
MLP on mnist10k, batch 32 in M = 4 mini-batches. Emulated cluster: ``time_per_example``
1.5 ms (48 ms a batch at slowdown 1), slowdowns (1, 1.25, 1.5, 3), and a straggler delay per
worker per iteration: Bernoulli(0.2) x Exp(mean 40 ms). Non-blocking runs use the adaptive
deadline (median + 1 MAD of the last 10 steps' finishing times) on both clocks. The real run
measures each step on the wall clock (``steps.jsonl``: ``wall_step_s``, from the first
mini-batch to the end of the collective step); the simulated run of the same config on the
simulate backend predicts it (``sim_time``). Both are read from step 2 on (the first real step
opens gloo's connections). Two calibration runs first (blocking all-reduce and D-PSGD, no
stragglers) measure the seconds a real step spends after its computation; solved for a fixed
``cluster.step_overhead`` plus ``cluster.latency`` per message, they enter every prediction.
D-PSGD runs in the ``atc`` order: on the wall clock the gossip runs in the collective step,
after the mini-batches (it does not overlap them), which is the ``atc`` clock rule.

Writes ``DIR/results.json``::

    {"scenario": {...}, "runs": [{"name", "measured_s_per_step", "predicted_s_per_step",
      "measured_time_to_target_s", "predicted_time_to_target_s", ...}], "speedups": {...}}

plus ``DIR/results.md`` and ``DIR/validate_clock.png``. About 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import launch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCENARIO = {
    "num_workers": 4, "batch_size": 32, "model": "mlp", "mlp_hidden": (64,),
    "learning_rate": 0.05, "momentum": 0.9, "lr_schedule": "constant", "eval_every": 4,
    "eval_train_examples": 1000, "progress": False,
    "nonblocking.num_minibatches": 4, "nonblocking.deadline": "adaptive",
    "nonblocking.adaptive_k": 1.0, "nonblocking.window": 10,
    "cluster.time_per_example": 1.5e-3, "cluster.slowdown": (1.0, 1.25, 1.5, 3.0),
    "cluster.delay": "bernoulli_exponential", "cluster.delay_per": "iteration",
    "cluster.delay_prob": 0.2, "cluster.delay_mean": 0.04, "cluster.seed": 1,
    "topology": "ring", "dpsgd.order": "atc",
}
RUNS = [("allreduce", False), ("allreduce", True), ("dpsgd", False), ("dpsgd", True)]


def overrides(algorithm: str, nonblocking: bool, steps: int, extra: dict) -> dict:
  return {**SCENARIO, "algorithm": algorithm, "num_steps": steps,
          "nonblocking.enabled": nonblocking, **extra}


def _read(path: str) -> list:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def real_run(name: str, ov: dict, workdir: str) -> dict:
  """The run on 4 processes (wall clock, emulated stragglers): seconds per step and the
  evaluation curve on the wall clock, both from step 2 on (step 1 runs the collective
  program for the first time: gloo's connections, buffers)."""
  cfg_file = os.path.join(workdir, f"{name}_config.py")
  with open(cfg_file, "w") as f:
    f.write(textwrap.dedent(f"""
        from nbsgd_jax import config as config_lib
        def get_config():
          return config_lib.override(config_lib.default_config(), {ov!r})
        """))
  out = os.path.join(workdir, name)
  status = launch.launch(4, 1, [f"--config={cfg_file}", f"--workdir={out}",
                                "--config.cluster.clock=wall"], timeout=600)
  if status:
    raise SystemExit(f"the real run {name} failed with status {status}")
  steps, metrics = _read(os.path.join(out, "steps.jsonl")), _read(os.path.join(out, "metrics.jsonl"))
  wall = [r["wall_step_s"] for r in steps]
  elapsed = {1: 0.0}
  for i, w in enumerate(wall[1:], start=1):
    elapsed[i + 1] = elapsed[i] + w
  after = [max(r["wall_step_s"] - max(r["busy_s"]), 0.0) for r in steps[1:]]
  return {"s_per_step": sum(wall[1:]) / len(wall[1:]),
          "after_compute_s": sum(after) / len(after),
          "curve": [(elapsed[r["step"]], r["train_loss"]) for r in metrics if r["step"] >= 1],
          "counts": [r["counts"] for r in steps]}


def simulated_run(ov: dict) -> dict:
  """The simulator's prediction of the same config and seed (simulate backend), from step 2
  on like :func:`real_run` (evaluated every step to read the clock after step 1)."""
  from nbsgd_jax import train
  cfg = config_lib.override(config_lib.default_config(), {**ov, "eval_every": 1})
  hist = train.train(cfg)["history"]
  t1, steps = hist[1]["sim_time"], ov["num_steps"]
  return {"s_per_step": (hist[-1]["sim_time"] - t1) / (steps - 1),
          "curve": [(r["sim_time"] - t1, r["train_loss"]) for r in hist[1:]
                    if r["step"] % ov["eval_every"] == 0 or r["step"] == 1]}


def calibrate(workdir: str, steps: int) -> tuple:
  """``(step_overhead, latency)`` of this machine: the seconds a real step spends after its
  computation (the update, the collectives and the host's dispatch) in two blocking runs
  without stragglers, all-reduce (``2 (n - 1) = 6`` messages a step) and ring D-PSGD (2),
  solved for ``after = step_overhead + messages * latency`` (like measuring alpha with a
  ping-pong, once, before the experiment; bytes / bandwidth is below 1 ms here)."""
  plain = {"cluster.slowdown": (), "cluster.delay": "none"}
  after = {alg: real_run(f"calibration_{alg}", overrides(alg, False, steps, plain),
                         workdir)["after_compute_s"] for alg in ("allreduce", "dpsgd")}
  latency = max((after["allreduce"] - after["dpsgd"]) / 4.0, 0.0)
  return max(after["dpsgd"] - 2 * latency, 0.0), latency


def time_to_target(curve: list, target: float) -> float:
  """Seconds of the first evaluation at or below ``target`` (inf if never), interpolated
  linearly between the evaluations around the crossing."""
  for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
    if l1 <= target:
      return t0 + (t1 - t0) * (l0 - target) / (l0 - l1) if l0 > target else t0
  return float("inf")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="output directory")
  ap.add_argument("--steps", type=int, default=60, help="steps per run")
  ap.add_argument("--target", type=float, default=0.0,
                  help="train-loss target (0: the blocking all-reduce prediction's loss at "
                       "two thirds of the steps)")
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  start = time.time()
  results = []
  with tempfile.TemporaryDirectory() as work:
    overhead, latency = calibrate(work, max(a.steps // 3, 10))
    print(f"calibrated step_overhead {overhead:.4f} s, latency {latency:.4f} s", flush=True)
    for algorithm, nb in RUNS:
      name = f"{algorithm}_{'nonblocking' if nb else 'blocking'}"
      ov = overrides(algorithm, nb, a.steps, {"cluster.step_overhead": overhead,
                                              "cluster.latency": latency})
      pred = simulated_run(ov)
      real = real_run(name, ov, work)
      results.append({"name": name, "pred": pred, "real": real})
      print(f"{name}: measured {real['s_per_step']:.4f} s/step, predicted "
            f"{pred['s_per_step']:.4f} s/step", flush=True)
  target = a.target or _default_target(results)
  runs = []
  for r in results:
    m_tt, p_tt = (time_to_target(r[k]["curve"], target) for k in ("real", "pred"))
    runs.append({"name": r["name"], "measured_s_per_step": r["real"]["s_per_step"],
                 "predicted_s_per_step": r["pred"]["s_per_step"],
                 "measured_time_to_target_s": m_tt, "predicted_time_to_target_s": p_tt,
                 "ratio_per_step": r["pred"]["s_per_step"] / r["real"]["s_per_step"],
                 "measured_curve": r["real"]["curve"], "predicted_curve": r["pred"]["curve"]})
  speedups = {}
  for algorithm in ("allreduce", "dpsgd"):
    b, n = (next(x for x in runs if x["name"] == f"{algorithm}_{k}")
            for k in ("blocking", "nonblocking"))
    speedups[algorithm] = {
        "measured": b["measured_time_to_target_s"] / n["measured_time_to_target_s"],
        "predicted": b["predicted_time_to_target_s"] / n["predicted_time_to_target_s"],
        "measured_per_step": b["measured_s_per_step"] / n["measured_s_per_step"],
        "predicted_per_step": b["predicted_s_per_step"] / n["predicted_s_per_step"]}
  out = {"scenario": {k: list(v) if isinstance(v, tuple) else v for k, v in SCENARIO.items()}
         | {"steps": a.steps, "processes": 4, "target_train_loss": target,
            "calibrated_step_overhead_s": overhead, "calibrated_latency_s": latency},
         "runs": runs, "speedups": speedups, "seconds": time.time() - start}
  common.write_results(a.out, out, markdown(out))
  plot(out, os.path.join(a.out, "validate_clock.png"))
  return 0


def _default_target(results: list) -> float:
  curve = results[0]["pred"]["curve"]  # blocking all-reduce, simulated
  return round(curve[(2 * len(curve)) // 3][1], 3)


def markdown(out: dict) -> str:
  lines = ["| run | measured s/step | predicted s/step | predicted / measured | measured "
           "time to target (s) | predicted time to target (s) |", "|---|---|---|---|---|---|"]
  for r in out["runs"]:
    lines.append(f"| {r['name']} | {r['measured_s_per_step']:.4f} | "
                 f"{r['predicted_s_per_step']:.4f} | {r['ratio_per_step']:.3f} | "
                 f"{r['measured_time_to_target_s']:.2f} | {r['predicted_time_to_target_s']:.2f} |")
  lines += ["", "| algorithm | measured speed-up (time to target) | predicted | measured "
            "(per step) | predicted (per step) |", "|---|---|---|---|---|"]
  for k, v in out["speedups"].items():
    lines.append(f"| {k} | {v['measured']:.3f} | {v['predicted']:.3f} | "
                 f"{v['measured_per_step']:.3f} | {v['predicted_per_step']:.3f} |")
  lines.append(f"\ntarget train loss {out['scenario']['target_train_loss']}; "
               f"{out['scenario']['steps']} steps per run; {out['seconds']:.0f} s in all")
  return "\n".join(lines) + "\n"


def plot(out: dict, path: str) -> None:
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  names = [r["name"] for r in out["runs"]]
  x = range(len(names))
  axes[0].bar([i - 0.2 for i in x], [r["measured_s_per_step"] for r in out["runs"]], 0.4,
              label="measured (4 processes)")
  axes[0].bar([i + 0.2 for i in x], [r["predicted_s_per_step"] for r in out["runs"]], 0.4,
              label="predicted (simulated clock)")
  axes[0].set_xticks(list(x), names, rotation=15)
  axes[0].set_ylabel("seconds per step")
  axes[0].legend()
  for r, color in zip(out["runs"], ["C0", "C1", "C2", "C3"]):
    t, l = zip(*r["measured_curve"])
    axes[1].plot(t, l, color=color, label=f"{r['name']} measured")
    t, l = zip(*r["predicted_curve"])
    axes[1].plot(t, l, color=color, linestyle="--", label=f"{r['name']} predicted")
  axes[1].axhline(out["scenario"]["target_train_loss"], color="gray", linewidth=0.8)
  axes[1].set_xlabel("seconds (wall clock / simulated clock)")
  axes[1].set_ylabel("train loss")
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  common.save_figure(fig, path)


if __name__ == "__main__":
  sys.exit(main())
