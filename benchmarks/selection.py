"""Time the sparsifiers of nbsgd_jax.codecs.sparse side by side.

Times lax.top_k (exact Top-k), gaussian_k, random_k, lax.approx_max_k on |x|
(default recall_target) and the one-pass floor jnp.abs(x).max() on random normal
data: jit, one warm-up call each, then interleaved repetitions, median wall time
with block_until_ready.  Runs unchanged on CPU or GPU.

  python benchmarks/selection.py [--d 25557032] [--densities 0.001 0.01]
                                 [--reps 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from nbsgd_jax.codecs import sparse as C  # noqa: E402


def _methods(density: float, d: int):
  k = C.num_selected(d, density)
  return {
      "top_k (lax.top_k)": jax.jit(functools.partial(C.top_k, density=density)),
      "gaussian_k": jax.jit(functools.partial(C.gaussian_k, density=density)),
      "random_k": jax.jit(lambda x, key: C.random_k(x, key, density=density)),
      "approx_max_k": jax.jit(lambda x: lax.approx_max_k(jnp.abs(x), k)),
      "floor abs(x).max()": jax.jit(lambda x: jnp.abs(x).max()),
  }


def run(d: int, densities: list[float], reps: int) -> str:
  x = jax.random.normal(jax.random.key(0), (d,), jnp.float32)
  key = jax.random.key(1)
  lines = [f"d = {d:,}, device = {jax.devices()[0].device_kind}, "
           f"median of {reps} interleaved reps (ms)", "",
           "| density | method | time (ms) | / top_k | / floor |",
           "|---|---|---|---|---|"]
  for density in densities:
    fns = _methods(density, d)

    def call(name):
      f = fns[name]
      return f(x, key) if name == "random_k" else f(x)

    for name in fns:  # compile + warm up
      jax.block_until_ready(call(name))
    times = {name: [] for name in fns}
    for _ in range(reps):
      for name in fns:
        t0 = time.perf_counter()
        jax.block_until_ready(call(name))
        times[name].append(time.perf_counter() - t0)
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    ref, floor = med["top_k (lax.top_k)"], med["floor abs(x).max()"]
    for name, t in med.items():
      lines.append(f"| {density:g} | {name} | {t:.1f} | {t / ref:.2f} | "
                   f"{t / floor:.1f} |")
  return "\n".join(lines)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--d", type=int, default=25_557_032)
  p.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01])
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--out", type=str, default=None)
  args = p.parse_args()
  table = run(args.d, args.densities, args.reps)
  print(table)
  if args.out:
    with open(args.out, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  main()
