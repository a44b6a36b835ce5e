"""Wall time per training step with k steps per dispatch (``config.steps_per_dispatch``):
the default (0: ``nbsgd_jax.run.stepper.dispatch_size`` picks k) against k = 1 and blocks of
k steps, side by side.

    python benchmarks/steps_per_dispatch.py --out docs/steps_per_dispatch.md

The main job (``experiments/configs/mnist.py``: 8 simulated workers, D-PSGD on a ring, batch
32 per worker, mnist10k) with three models: the MLP (784-256-10), the main job's CNN and
ResNet-20 (batch 8 per worker: its CPU step is long). Each cell: the median over ``--reps``
timed runs of ``--steps`` steps (the host parts' inputs, the compiled programs, the reports
read once at the end as the training loop reads them between evaluations, no evaluation),
after one untimed warm-up run (compilation). The repetitions go round the cells in turn, so
the ratios of one model's cells are measured side by side under the same load; absolute
times depend on the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax.core import files  # noqa: E402
from nbsgd_jax import train  # noqa: E402
from nbsgd_jax.run import stepper as stepper_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {  # the main job's config with these keys
    "mlp": {"model": "mlp"},
    "cnn": {},
    "resnet20": {"model": "resnet", "resnet_depth": 20, "batch_size": 8},
}


def main_job_config():
  """``experiments/configs/mnist.py``'s config."""
  spec = importlib.util.spec_from_file_location(
      "mnist_config", os.path.join(ROOT, "experiments", "configs", "mnist.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def cfg_for(model: str, k: int, steps: int):
  """The main job with ``model`` (:data:`MODELS`), ``k`` steps per dispatch (0: the
  default's pick) and ``steps`` steps, one evaluation at the end."""
  over = {**MODELS[model], "num_steps": steps, "eval_every": steps, "steps_per_dispatch": k,
          "progress": False, "checkpoint_every": 0}
  return config_lib.override(main_job_config(), over)


def time_steps(s, steps: int) -> float:
  """Seconds per step of one timed run of ``steps`` steps of set-up ``s``
  (``Stepper.steps``, the reports read once at the end)."""
  stepper = train.Stepper.of(s)
  jax.block_until_ready(stepper.state)
  t0 = time.perf_counter()
  stepper.steps(steps, read_each_dispatch=False)
  jax.block_until_ready(stepper.state)
  return (time.perf_counter() - t0) / steps


def seconds_per_step(cfg, reps: int) -> float:
  """Median seconds per step of ``cfg``'s ``num_steps`` steps over ``reps`` timed runs after
  one untimed warm-up run (:func:`time_steps`)."""
  s = train.setup(cfg)
  return float(np.median([time_steps(s, cfg.num_steps) for _ in range(reps + 1)][1:]))


def measure(model: str, ks: list, steps: int, reps: int) -> dict:
  """``{k: median seconds per step}`` of ``model`` for each k of ``ks`` (0: the default),
  the cells taken in turn in each repetition, after one warm-up run each; and ``"auto"``:
  the k the default picked."""
  setups = {k: train.setup(cfg_for(model, k, steps)) for k in ks}
  times = {k: [] for k in ks}
  for r in range(reps + 1):
    for k in ks:
      t = time_steps(setups[k], steps)
      if r:  # the first run of each cell compiles
        times[k].append(t)
  out = {k: float(np.median(v)) for k, v in times.items()}
  out["auto"] = stepper_lib.dispatch_size([setups[0]]) if 0 in ks else None
  return out


def table(results: dict, ks: list) -> list:
  """Markdown rows: per model, ms per step of each k, the default's k and its time over
  k = 1's, and the fastest k."""
  head = ["model", "default: k"] + [("default" if k == 0 else f"k = {k}") + " (ms/step)"
                                    for k in ks] + ["default / k = 1", "fastest k"]
  rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
  for model, t in results.items():
    fastest = min((k for k in ks if k), key=lambda k: t[k])
    rows.append(f"| {model} | {t['auto']} | " + " | ".join(f"{1e3 * t[k]:.2f}" for k in ks)
                + f" | {t[0] / t[1]:.3f} | {fastest} |")
  return rows


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=32)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16],
                  help="k > 0 to time beside the default (k = 1 is always timed)")
  ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  ap.add_argument("--device", default=f"{platform.processor() or 'CPU'}, {os.cpu_count()} "
                  "cores", help="a note on the device, written into the table")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  ks = [0] + sorted({1, *args.ks})
  bad = [k for k in ks if k and args.steps % k]
  if bad:
    ap.error(f"--ks {bad} do not divide --steps={args.steps}")
  results = {}
  for model in args.models:
    results[model] = measure(model, ks, args.steps, args.reps)
    print(table({model: results[model]}, ks)[-1], flush=True)
  command = (f"python benchmarks/steps_per_dispatch.py --steps {args.steps} --reps {args.reps}"
             f" --ks {' '.join(map(str, args.ks))} --models {' '.join(args.models)}")
  emit(table(results, ks), f"{args.device}, {jax.default_backend()}", command, args.out)


def emit(rows: list, device: str, command: str, out: str) -> None:
  """Print the table ``rows`` under a device and command line; write it to ``out`` (crash
  safe) when given."""
  text = "\n".join([f"Device: {device}. Command: `{command}`.", "", *rows, ""])
  if out:
    files.atomic_write(out, text)
  print(text)


if __name__ == "__main__":
  main()
