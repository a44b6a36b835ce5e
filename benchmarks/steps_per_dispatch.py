"""Wall time per training step with k steps per dispatch (``config.steps_per_dispatch``).

    python benchmarks/steps_per_dispatch.py --out docs/steps_per_dispatch.md

A small MLP (hidden 32, 2 examples per worker) on 8 simulated workers, where dispatch
overhead, not arithmetic, dominates a step: all-reduce, D-PSGD on a ring and local SGD
(tau = 4). Each cell: the median over ``--reps`` timed runs of ``--steps`` steps (the host
parts' inputs, the compiled programs, no evaluation) after one untimed warm-up run
(compilation). All cells are measured side by side in one process, so their ratios are
comparable; absolute times depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import files  # noqa: E402
from nbsgd_jax import train  # noqa: E402


def cfg_for(algorithm: str, k: int, steps: int):
  c = config_lib.default_config()
  over = {"algorithm": algorithm, "model": "mlp", "mlp_hidden": (32,), "num_workers": 8,
          "batch_size": 2, "num_steps": steps, "eval_every": steps, "steps_per_dispatch": k,
          "eval_train_examples": 64, "progress": False}
  if algorithm == "local_sgd":
    over["local_sgd.tau"] = 4
  return config_lib.override(c, over)


def seconds_per_step(cfg, reps: int) -> float:
  """Median seconds per step of ``num_steps`` steps in blocks of ``steps_per_dispatch``
  (``Stepper.steps``: host inputs, the program, the reports read once at the end, as the
  training loop reads them between evaluations)."""
  s = train.setup(cfg)
  times = []
  for r in range(reps + 1):
    stepper = train.Stepper.of(s)
    jax.block_until_ready(stepper.state)
    t0 = time.perf_counter()
    stepper.steps(cfg.num_steps, read_each_dispatch=False)
    jax.block_until_ready(stepper.state)
    if r:  # the first run compiles
      times.append((time.perf_counter() - t0) / cfg.num_steps)
  return float(np.median(times))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=400)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
  ap.add_argument("--algorithms", nargs="+", default=["allreduce", "dpsgd", "local_sgd"])
  ap.add_argument("--device", default=f"{platform.processor() or 'CPU'}, {os.cpu_count()} "
                  "cores", help="a note on the device, written into the table")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  rows = ["| algorithm | " + " | ".join(f"k = {k} (ms/step)" for k in args.ks)
          + " | speed-up k = %d / k = 1 |" % args.ks[-1],
          "|---|" + "---|" * (len(args.ks) + 1)]
  for algorithm in args.algorithms:
    t = [seconds_per_step(cfg_for(algorithm, k, args.steps), args.reps) for k in args.ks]
    rows.append(f"| {algorithm} | " + " | ".join(f"{1e3 * x:.3f}" for x in t)
                + f" | {t[0] / t[-1]:.2f}x |")
    print(rows[-1], flush=True)
  emit(rows, args.device, f"python benchmarks/steps_per_dispatch.py --steps {args.steps} "
       f"--reps {args.reps}", args.out)


def emit(rows: list, device: str, command: str, out: str) -> None:
  """Print the table ``rows`` under a device and command line; write it to ``out`` (crash
  safe) when given."""
  text = "\n".join([f"Device: {device}. Command: `{command}`.", "", *rows, ""])
  if out:
    files.atomic_write(out, text)
  print(text)


if __name__ == "__main__":
  main()
