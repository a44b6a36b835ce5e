"""Wall time per training step with bfloat16 compute (``config.compute_dtype``) against
float32, parameters and messages float32 in both.

    python benchmarks/compute_dtype.py --out docs/compute_dtype.md

The main job's CNN (8 workers x 32 examples) and ResNet-8 on CIFAR-shaped random images
(8 workers x 32 examples; ``--resnet_depth``), D-PSGD on a ring, simulate backend. Each cell:
the median over ``--reps`` timed runs of ``--steps`` steps after one untimed warm-up run
(compilation), both dtypes side by side in one process.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from benchmarks.steps_per_dispatch import emit, seconds_per_step  # noqa: E402
from nbsgd_jax import config as config_lib  # noqa: E402


def cfg_for(model: str, dtype: str, steps: int, depth: int):
  c = config_lib.default_config()
  over = {"model": model, "compute_dtype": dtype, "num_workers": 8, "batch_size": 32,
          "num_steps": steps, "eval_every": steps, "progress": False}
  if model == "resnet":
    over.update({"dataset": "tfds:cifar10", "resnet_depth": depth})
  return config_lib.override(c, over)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--resnet_depth", type=int, default=8)
  ap.add_argument("--device", default=f"{jax.devices()[0].device_kind} "
                  f"({platform.processor() or 'CPU'}, {os.cpu_count()} cores)")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  rows = ["| model | float32 (ms/step) | bfloat16 (ms/step) | speed-up |", "|---|---|---|---|"]
  with tfds.testing.mock_data(num_examples=512):  # CIFAR-shaped random images
    for model in ("cnn", "resnet"):
      t = [seconds_per_step(cfg_for(model, d, args.steps, args.resnet_depth), args.reps)
           for d in ("float32", "bfloat16")]
      name = model if model == "cnn" else f"resnet-{args.resnet_depth}"
      rows.append(f"| {name} | {1e3 * t[0]:.2f} | {1e3 * t[1]:.2f} | {t[0] / t[1]:.2f}x |")
      print(rows[-1], flush=True)
  emit(rows, args.device, f"python benchmarks/compute_dtype.py --steps {args.steps} "
       f"--reps {args.reps}", args.out)


if __name__ == "__main__":
  main()
