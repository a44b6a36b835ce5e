"""Runs per hour: a grid trained one run at a time against the same grid as one sweep.

    python benchmarks/sweeps.py --out docs/sweeps.md            # (a) and (b), about 15 min
    python benchmarks/sweeps.py --out docs/sweeps.md --only mlp
    python benchmarks/sweeps.py --out runs/sweeps_gpu.md --only mlp64   # the GPU row

(a) The quick non-blocking study's MLP grid (``experiments/reproduce_nonblocking.py
--quick``: 8 workers, the MLP on mnist10k, batch 32, momentum 0.9, 150 steps, evaluations
every 15): 2 learning rates x 3 seeds x its cells (homogeneous; speeds 0.3 + stragglers)
x blocking / non-blocking D-PSGD = 24 runs. (b) The main job's CNN
(``experiments/configs/mnist.py``): 3 learning rates x 3 seeds = 9 runs of ``--cnn_steps``
steps (600 in the main job).

Three ways, side by side in one process, in this order:

* ``each run compiled``: one ``train()`` per run with the program cache cleared before each
  (how every study ran before runs were data: each run traced and compiled its programs);
* ``each run, one process``: one ``train()`` per run, the in-process cache kept (a run that
  differs only in its hyperparameters and host keys compiles nothing);
* ``one sweep, stacked``: ``config.sweep`` over the grid (``nbsgd_jax.train.sweep``) with
  ``sweep_runs="stacked"``: one program per structure, the runs stacked on a runs axis;
* ``one sweep, in turn``: the same with ``sweep_runs="in_turn"`` (the default on a CPU).

Each way starts from an empty in-process cache; the persistent compilation cache is off.
Runs per hour = runs / wall seconds x 3600 (set-up, compilation, training and evaluation
included); compilations = JAX's backend compilations during the way (``jax.monitoring``).
A check that the ways agree: the largest relative difference of the final training losses of
the sweep's runs against the one-at-a-time runs.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "experiments"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import monitoring  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax.core import files  # noqa: E402
from nbsgd_jax.run import grid as sweeps  # noqa: E402
from nbsgd_jax import train  # noqa: E402
from nbsgd_jax.run import step as step_lib  # noqa: E402

COMPILES: list = []
monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: COMPILES.append(secs)
    if name == "/jax/core/compile/backend_compile_duration" else None)


def mlp_grid(steps: int) -> list:
  """(a): the sweep configs of the quick study's grid, one per structure and cell."""
  import reproduce_nonblocking as nb  # experiments/
  a = argparse.Namespace(workers=8, model="mlp", topology="ring", matcha_topology="erdos_renyi",
                         steps=steps, nb_step_factor=1.0, eval_every=15)
  out = []
  for cell, blocking in itertools.product(["homogeneous", nb.REFERENCE_CELL], (True, False)):
    c = nb.make_config(a, "dpsgd", 0.2, 0, cell, nb=not blocking)
    c.compilation_cache = "none"
    c.sweep = "learning_rate=0.2,0.4;seed=0:3"
    c.cluster.seed = 0
    out.append(c)
  return out


def mlp64_grid(steps: int) -> list:
  """The GPU row: 4 learning rates x 16 seeds of (a)'s blocking D-PSGD in its homogeneous
  cell, 64 runs of one structure."""
  c = mlp_grid(steps)[0]
  c.sweep = "learning_rate=0.05,0.1,0.2,0.4;seed=0:16"
  return [c]


def cnn_grid(steps: int) -> list:
  """(b): the main job's CNN, 3 learning rates x 3 seeds."""
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "experiments", "configs", "mnist.py")
  spec = importlib.util.spec_from_file_location("mnist_config", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.num_steps, c.eval_every, c.progress = steps, steps // 4, False
  c.compilation_cache = "none"
  c.sweep = "learning_rate=0.05,0.1,0.2;seed=0:3"
  return [c]


def one_at_a_time(grids: list, keep_cache: bool, sample: int | None = None) -> tuple:
  """``(seconds, compilations, final losses)`` of the runs of ``grids`` (the first
  ``sample`` of them when given), one ``train()`` each."""
  step_lib.PROGRAMS.clear()
  start, t0, losses = len(COMPILES), time.perf_counter(), []
  runs = [r for g in grids for r in sweeps.expand(g)][:sample]
  for run in runs:
    if not keep_cache:
      step_lib.PROGRAMS.clear()
    losses.append(train.train(run.cfg)["train_loss"])
  return time.perf_counter() - t0, len(COMPILES) - start, losses


def as_sweeps(grids: list, mode: str) -> tuple:
  step_lib.PROGRAMS.clear()
  start, t0, losses = len(COMPILES), time.perf_counter(), []
  for g in grids:
    g = copy.deepcopy(g)
    g.sweep_runs = mode
    losses += [s["train_loss"] for s in train.sweep(g)]
  return time.perf_counter() - t0, len(COMPILES) - start, losses


def measure(name: str, grids: list, sample: int | None = None) -> list:
  """The four ways' rows; the one-at-a-time ways train only the first ``sample`` runs when
  given (their runs per hour is then of that sample: every run has the same structure)."""
  total = sum(len(sweeps.expand(g)) for g in grids)
  rows, ref = [], None
  for way, fn in (("each run compiled", lambda: one_at_a_time(grids, False, sample)),
                  ("each run, one process", lambda: one_at_a_time(grids, True, sample)),
                  ("one sweep, stacked", lambda: as_sweeps(grids, "stacked")),
                  ("one sweep, in turn", lambda: as_sweeps(grids, "in_turn"))):
    secs, compiles, losses = fn()
    runs = len(losses) if way.startswith("each") else total
    ref = losses if ref is None else ref
    m = min(len(ref), len(losses))
    diff = float(np.max(np.abs(np.subtract(losses[:m], ref[:m])) / np.abs(ref[:m])))
    rows.append({"grid": name, "way": way, "runs": runs, "seconds": secs,
                 "runs_per_hour": runs / secs * 3600, "compilations": compiles,
                 "max_rel_diff": diff})
    print(f"{name:40s} {way:24s} {runs:3d} runs {secs:8.1f} s {runs / secs * 3600:8.1f} "
          f"runs/h {compiles:5d} compilations, losses within {diff:.1e}", flush=True)
  for r in rows:
    r["speedup"] = r["runs_per_hour"] / rows[0]["runs_per_hour"]
  return rows


def markdown(rows: list, args) -> str:
  lines = [f"# Sweeps: runs per hour\n\nMeasured by `python benchmarks/sweeps.py "
           f"{' '.join(sys.argv[1:])}` on {platform.processor() or platform.machine()} "
           f"({os.cpu_count()} cores), jax {jax.__version__}, backend "
           f"{jax.default_backend()} ({jax.devices()[0].device_kind}); all ways in one "
           "process, side by side.\n",
           "| grid | way | runs | wall s | runs / hour | x first way | compilations | "
           "final losses vs first way |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['grid']} | {r['way']} | {r['runs']} | {r['seconds']:.1f} | "
                 f"{r['runs_per_hour']:.0f} | {r['speedup']:.2f}x | {r['compilations']} | "
                 f"{r['max_rel_diff']:.1e} |")
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="the markdown table")
  ap.add_argument("--only", choices=("mlp", "cnn", "mlp64"), default=None,
                  help="mlp64: the GPU row, a 64-run MLP grid (not in the default set)")
  ap.add_argument("--mlp_steps", type=int, default=150)
  ap.add_argument("--cnn_steps", type=int, default=200)
  ap.add_argument("--sample", type=int, default=None,
                  help="the one-at-a-time ways train only the first SAMPLE runs (a GPU "
                       "session's 15 device minutes hold no 64 runs each compiled)")
  a = ap.parse_args()
  rows = []
  if a.only in (None, "mlp"):
    rows += measure(f"(a) quick study's MLP grid, {a.mlp_steps} steps", mlp_grid(a.mlp_steps))
  if a.only in (None, "cnn"):
    rows += measure(f"(b) main job's CNN, 3 x 3, {a.cnn_steps} steps",
                    cnn_grid(a.cnn_steps))
  if a.only == "mlp64":
    rows += measure(f"(c) MLP grid of 64 runs, {a.mlp_steps} steps", mlp64_grid(a.mlp_steps),
                    a.sample)
  files.atomic_write(a.out, markdown(rows, a))
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
