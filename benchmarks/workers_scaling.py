"""Wall time per training step of the main job as the number of workers grows.

    python benchmarks/workers_scaling.py --out docs/scaling.md

The main job (``experiments/configs/mnist.py``: D-PSGD on a ring, LeNet-style CNN, 32 examples
per worker) for n = 8, 16, 32, 64 workers on the ``simulate`` backend (``jax.vmap`` on one
device) and on the ``mesh`` backend over 8 host devices (n / 8 workers per device,
``shard_map`` around ``vmap``). Each cell: median over ``--reps`` timed runs of ``--steps``
steps each, after one untimed warm-up run (compilation). All cells are measured in one process,
side by side, so their ratios are comparable; absolute times depend on the machine (the table
records its CPU count).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from nbsgd_jax import train  # noqa: E402
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import files  # noqa: E402


def main_job(n: int, backend: str, algorithm: str):
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "experiments", "configs", "mnist.py")
  spec = importlib.util.spec_from_file_location("mnist_cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return config_lib.override(mod.get_config(), {"num_workers": n, "backend": backend,
                                                "algorithm": algorithm, "progress": False})


def time_per_step(cfg, steps: int, reps: int) -> float:
  """Median seconds per step of ``steps`` steps (the trainer's step function and host parts,
  no evaluation), over ``reps`` runs after a warm-up run."""
  s = train.setup(cfg)
  step = train.make_train_step(s)
  host = train.make_host(s)
  times = []
  for r in range(reps + 1):
    state = train.init_state(s)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for t in range(steps):
      inputs = host.inputs(t)
      state, _ = step(state, s.worker_data, train.device_context(s, inputs),
                      inputs.get("period_end", True))
    jax.block_until_ready(state)
    if r:  # the first run compiles
      times.append((time.perf_counter() - t0) / steps)
  return float(np.median(times))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="")
  ap.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64])
  ap.add_argument("--backends", nargs="+", default=["simulate", "mesh"])
  ap.add_argument("--algorithm", default="dpsgd")
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--reps", type=int, default=3)
  a = ap.parse_args()
  rows = {}
  for n in a.workers:
    for b in a.backends:
      sec = time_per_step(main_job(n, b, a.algorithm), a.steps, a.reps)
      rows[(n, b)] = sec
      print(f"n={n:3d} {b:8s} {1e3 * sec:9.1f} ms/step", flush=True)
  base = {b: rows[(a.workers[0], b)] for b in a.backends}
  lines = [f"Main job (`experiments/configs/mnist.py`, {a.algorithm}, ring, CNN, 32 examples "
           f"per worker), wall time per step (median of {a.reps} runs x {a.steps} steps after "
           f"a compile run), measured side by side by `python benchmarks/workers_scaling.py` "
           f"on a {os.cpu_count()}-core CPU with 8 simulated host devices (mesh: n / 8 workers "
           "per device).", "",
           "| workers n | " + " | ".join(
               f"{b}: ms / step | {b}: x n={a.workers[0]} | {b}: samples / s"
               for b in a.backends) + " |",
           "|---:|" + "---:|---:|---:|" * len(a.backends)]
  for n in a.workers:
    cells = []
    for b in a.backends:
      batch = main_job(n, b, a.algorithm).batch_size * n
      cells += [f"{1e3 * rows[(n, b)]:.1f}", f"{rows[(n, b)] / base[b]:.2f}",
                f"{batch / rows[(n, b)]:.0f}"]
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  text = "\n".join(lines) + "\n"
  print(text)
  if a.out:
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    files.atomic_write(a.out, text)


if __name__ == "__main__":
  main()
