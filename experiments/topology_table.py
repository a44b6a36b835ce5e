"""Spectra and communication of every topology at n = 16, and of MATCHA under a budget.

    python experiments/topology_table.py --out docs/topologies.md

Writes a markdown table: for each topology (Metropolis-Hastings weights) the number of edges,
the SLEM rho = ||W - J||_2 (for the time-varying one-peer exponential graph: of one phase and
of the product over a period), the ppermute rounds of one gossip, and the messages / bytes a
worker sends per iteration; then MATCHA (Wang et al. 2019) on a 16-node Erdos-Renyi graph at
budgets 0.1-1.0: matchings M, alpha, expected rho = ||E[W^T W] - J||_2 and expected bytes.
Bytes are for the default LeNet-style CNN in float32.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbsgd_jax import topology  # noqa: E402
from nbsgd_jax.communications import collectives
from nbsgd_jax.topology import matcha  # noqa: E402


def cnn_bytes() -> int:
  import jax
  import jax.numpy as jnp
  from nbsgd_jax import models
  params = models.make_model("cnn", 10).init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
  return 4 * models.num_params(params)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=16)
  ap.add_argument("--p", type=float, default=0.3, help="Erdos-Renyi edge probability")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", default=None)
  a = ap.parse_args()
  n, s = a.n, cnn_bytes()
  lines = [f"### Topologies at n = {n} (Metropolis-Hastings weights; model = CNN, {s:,} bytes)",
           "", "| topology | edges | mean degree | SLEM rho | spectral gap | ppermute rounds "
           "| messages / worker / iter | MB / worker / iter |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for name in ["ring", "torus", "exponential", "one_peer_exponential", "complete", "star",
               "erdos_renyi"]:
    t = topology.make(name, n, p=a.p, seed=a.seed)
    if t.is_time_varying:
      phases = [t.mixing_matrix_at(k) for k in range(t.period)]
      rho = topology.slem(phases[0])
      prod = np.linalg.multi_dot(phases[::-1]) if len(phases) > 1 else phases[0]
      rho_s = f"{rho:.4f} (period product: {topology.slem(prod):.4f})"
      rounds = len(collectives.gossip_rounds(phases[0]))
      msgs = collectives.gossip_bytes(1.0, phases[0])
      gap = 1 - rho
    else:
      rho = topology.slem(t.mixing_matrix)
      rho_s, gap = f"{rho:.4f}", 1 - rho
      rounds = len(collectives.gossip_rounds(t.mixing_matrix))
      msgs = collectives.gossip_bytes(1.0, t.mixing_matrix)
    label = name + (f" (p={a.p}, seed {a.seed})" if name == "erdos_renyi" else "")
    label += f" ({t.n // topology.torus_shape(n)[1]}x{topology.torus_shape(n)[1]})" \
        if name == "torus" else ""
    lines.append(f"| {label} | {len(t.edges)} | {t.mean_degree:.3f} | {rho_s} | {gap:.4f} | "
                 f"{rounds} | {msgs:.3f} | {msgs * s / 1e6:.3f} |")
  er = topology.erdos_renyi(n, a.p, seed=a.seed)
  lines += ["", f"### MATCHA on the {n}-node Erdos-Renyi graph (p={a.p}, seed {a.seed}, "
            f"{len(er.edges)} edges, max degree {int(er.degrees.max())})", "",
            "| budget C_b | matchings M | sum p | alpha | expected rho | "
            "expected messages / worker / iter | expected MB / worker / iter |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
  for b in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]:
    pl = matcha.plan(n, er.edges, b)
    msgs = matcha.expected_bytes_per_step(pl, 1.0)
    lines.append(f"| {b:.1f} | {len(pl.matchings)} | {pl.probs.sum():.3f} | {pl.alpha:.4f} | "
                 f"{pl.rho:.4f} | {msgs:.3f} | {msgs * s / 1e6:.3f} |")
  d = topology.make("erdos_renyi", n, p=a.p, seed=a.seed)
  lines += ["", f"D-PSGD on the same graph: SLEM {topology.slem(d.mixing_matrix):.4f} (MH), "
            f"{topology.slem(topology.make('erdos_renyi', n, weights='best_constant', p=a.p, seed=a.seed).mixing_matrix):.4f} "
            f"(best constant; its square is MATCHA's rho at budget 1)."]
  text = "\n".join(lines) + "\n"
  print(text)
  if a.out:
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, a.out)


if __name__ == "__main__":
  main()
