"""Only the work that fires: the main job's whole command with ``ad_psgd`` (gathered
gradients, ``config.gather_gradients``, the default; and without them) against ``dpsgd``, at
equal work (``--budget`` gradient computations per worker, ``budget_unit=grads_per_worker``,
the main job's unit), side by side.

    python benchmarks/event_work.py --out docs/event_work.md

Each repetition runs the three commands in turn (``python -m nbsgd_jax.main
--config=experiments/configs/mnist.py --workdir=TMP --config.num_steps=B
--config.algorithm=...``, no progress bar, no checkpoints), so their ratios are measured under
the same load. ``--cache warm`` (the default): JAX's persistent compilation cache in a fresh
directory, filled by one untimed run of each command first, as a user's second run finds it;
``--cache cold``: no cache, every command compiles (a gathered run compiles one program per
bucket it meets, 1, 2, 4 and 8 gradients at n = 8); the table gives each command's median wall seconds over ``--reps``, the ratio of the
medians to ``dpsgd``'s, the median of the pairwise ratios, and from the runs' ``summary.json``
the gradients computed per gradient applied (``grads_computed / grads_per_worker``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "dpsgd": ["--config.algorithm=dpsgd"],
    "ad_psgd": ["--config.algorithm=ad_psgd"],
    "ad_psgd, every worker's gradient": ["--config.algorithm=ad_psgd",
                                         "--config.gather_gradients=False"],
}


def run(extra: list, budget: int, cache: str) -> tuple:
  """``(wall s, summary)`` of the main job's command with ``extra`` flags, JAX's compilation
  cache in directory ``cache`` (``none``: off)."""
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, "-m", "nbsgd_jax.main", "--config=experiments/configs/mnist.py",
           f"--workdir={tmp}/run", f"--config.num_steps={budget}", "--config.progress=False",
           "--config.checkpoint_every=0", f"--config.compilation_cache={cache}", *extra]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - start
    with open(os.path.join(tmp, "run", "summary.json")) as f:
      return wall, json.load(f)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--budget", type=int, default=200, help="gradients per worker")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--cache", choices=("warm", "cold"), default="warm")
  ap.add_argument("--out", default="", help="markdown file to write (else stdout only)")
  args = ap.parse_args(argv)
  walls = {k: [] for k in COMMANDS}
  summaries = {}
  cache_dir = tempfile.mkdtemp() if args.cache == "warm" else "none"
  if args.cache == "warm":
    for extra in COMMANDS.values():
      run(extra, args.budget, cache_dir)
  for rep in range(args.reps):
    for name, extra in COMMANDS.items():
      wall, summaries[name] = run(extra, args.budget, cache_dir)
      walls[name].append(wall)
      print(f"rep {rep}: {name}: {wall:.1f} s", flush=True)
  med = {k: sorted(v)[len(v) // 2] for k, v in walls.items()}
  base = walls["dpsgd"]
  lines = [f"`python benchmarks/event_work.py --budget {args.budget} --reps {args.reps} "
           f"--cache {args.cache}` on "
           f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
           f"{time.strftime('%Y-%m-%d')}", "",
           "| command | wall s (median) | / dpsgd (medians) | / dpsgd (pairwise median) | "
           "steps | gradients computed per gradient applied | test accuracy |",
           "|---|---|---|---|---|---|---|"]
  for name in COMMANDS:
    pair = sorted(w / b for w, b in zip(walls[name], base))[len(base) // 2]
    s = summaries[name]
    per = s.get("grads_computed", s["grads_per_worker"]) / s["grads_per_worker"]
    lines.append(f"| {name} | {med[name]:.1f} | {med[name] / med['dpsgd']:.2f}x | {pair:.2f}x "
                 f"| {s['steps']} | {per:.2f} | {s['test_accuracy']:.4f} |")
  text = "\n".join(lines) + "\n"
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)


if __name__ == "__main__":
  main()
