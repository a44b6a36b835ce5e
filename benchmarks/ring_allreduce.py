"""Benchmark: explicit ring all-reduce (nbsgd_jax.communications.collectives) vs ``lax.psum``.

Both run under ``jax.shard_map`` on a 1-D mesh (axis ``"workers"``, one worker per device;
``--backend vmap``: under ``jax.vmap`` on one device),
measured side by side in one process (interleaved repetitions, median wall time, jit,
warm-up, ``block_until_ready``). On CPU the mesh is made of simulated host devices:
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` is set before jax is imported unless
``XLA_FLAGS`` is already set.

Usage::

  python benchmarks/ring_allreduce.py [--sizes 1e4 1e5 1e6] [--reps 20] [--backend mesh]
                                     [--out FILE]

``--out FILE`` writes the table: JSON if FILE ends in ``.json``, markdown otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from nbsgd_jax.communications.collectives import ring_all_reduce  # noqa: E402

AXIS = "workers"


def _build(fn, mesh, backend: str):
  if backend == "vmap":
    return jax.jit(jax.vmap(fn, axis_name=AXIS))

  def per_device(xb):  # xb: [1, L], one worker's vector
    return fn(xb[0])[None]

  return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))


def _rounds_floor(v: jax.Array) -> jax.Array:
  """2 (n - 1) chained ppermutes of one chunk and nothing else: the cost of the ring's
  sequential rounds alone (timing reference only; the result is not a sum)."""
  n = lax.axis_size(AXIS)
  right = [(j, (j + 1) % n) for j in range(n)]
  m = -(-v.shape[0] // n)
  piece = v[:m]
  for _ in range(2 * (n - 1)):
    piece = lax.ppermute(piece, AXIS, right)
  return jnp.concatenate([piece] * n)[: v.shape[0]]


def _time_once(f, x) -> float:
  t0 = time.perf_counter()
  f(x).block_until_ready()
  return time.perf_counter() - t0


def run(sizes: list[int], n: int, reps: int, warmup: int, backend: str = "mesh") -> list[dict]:
  """Median seconds of ring_all_reduce, psum and the rounds floor per length in ``sizes``."""
  mesh = None
  if backend == "mesh":
    devices = jax.devices()[:n]
    if len(devices) < n:
      raise SystemExit(f"need {n} devices, have {len(jax.devices())}; set XLA_FLAGS")
    mesh = jax.make_mesh((n,), (AXIS,), devices=devices)
  ring_f = _build(lambda v: ring_all_reduce(v, AXIS), mesh, backend)
  psum_f = _build(lambda v: lax.psum(v, AXIS), mesh, backend)
  floor_f = _build(_rounds_floor, mesh, backend)
  rows = []
  for size in sizes:
    x = np.random.default_rng(0).standard_normal((n, size)).astype(np.float32)
    if backend == "mesh":
      x = jax.device_put(x, NamedSharding(mesh, P(AXIS)))
    else:
      x = jnp.asarray(x)
    want = psum_f(x)
    got = ring_f(x)
    err = float(jnp.max(jnp.abs(got - want)))
    fns = {"ring": ring_f, "psum": psum_f, "floor": floor_f}
    for _ in range(warmup):
      for f in fns.values():
        _time_once(f, x)
    times = {k: [] for k in fns}
    for _ in range(reps):  # interleaved: all see the same machine state
      for k, f in fns.items():
        times[k].append(_time_once(f, x))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows.append({"backend": backend, "floats": size, "bytes": 4 * size, "n": n,
                 "psum_ms": 1e3 * med["psum"], "ring_ms": 1e3 * med["ring"],
                 "ratio": med["ring"] / med["psum"], "rounds_floor_ms": 1e3 * med["floor"],
                 "max_abs_err": err})
  return rows


def to_markdown(rows: list[dict], device: str) -> str:
  backend = {"mesh": "shard_map", "vmap": "vmap"}[rows[0]["backend"]]
  lines = [f"ring_all_reduce vs lax.psum, {backend}, n={rows[0]['n']} workers, {device}, "
           "median wall time. 'rounds floor': 2(n-1) chained ppermutes of one chunk, "
           "no arithmetic or indexing.", "",
           "| floats | MB | psum ms | ring ms | ring/psum | rounds floor ms | max abs err |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in rows:
    lines.append(f"| {r['floats']:.0e} | {r['bytes'] / 1e6:.2f} | {r['psum_ms']:.3f} | "
                 f"{r['ring_ms']:.3f} | {r['ratio']:.2f} | {r['rounds_floor_ms']:.3f} | "
                 f"{r['max_abs_err']:.1e} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e5, 1e6],
                 help="vector lengths in float32 elements")
  p.add_argument("--n", type=int, default=8, help="number of workers (devices)")
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--backend", choices=["mesh", "vmap"], default="mesh",
                 help="mesh: shard_map, one worker per device; vmap: all workers on one device")
  p.add_argument("--out", default=None, help="write the table (.json: JSON, else markdown)")
  args = p.parse_args(argv)
  rows = run([int(s) for s in args.sizes], args.n, args.reps, args.warmup, args.backend)
  d = jax.devices()[0]
  device = f"{d.platform} ({d.device_kind}), {os.cpu_count()} host cores"
  md = to_markdown(rows, device)
  print(md)
  if args.out:
    with open(args.out, "w") as f:
      if args.out.endswith(".json"):
        json.dump({"device": device, "rows": rows}, f, indent=2)
      else:
        f.write(md + "\n")


if __name__ == "__main__":
  main()
