"""The field's algorithms side by side: accuracy / loss against bytes and simulated time.

    python experiments/compare_algorithms.py --out docs/compare            # full
    python experiments/compare_algorithms.py --quick --out /tmp/compare    # a few minutes
    python experiments/compare_algorithms.py --seeds 0 1 2 --runs dpsgd choco_top_k --out DIR

(a) mnist10k, 16 workers on a ring, Dirichlet(0.1) partition, the CNN (``--model``), batch 32,
SGD with momentum 0.9, cosine learning rate 0.05, on the simulated cluster of
``experiments/configs/quickstart.py``: D-PSGD, CHOCO-SGD (top_k at density 0.01, sign, qsgd;
its consensus step gamma picked from ``--gammas`` by the final training loss), gradient
tracking, D^2, Gossip-PGA (H = 8), All-Reduce SGD dense, with PowerSGD (rank 1, 2, 4) and with
top_k (0.01, error feedback), DiLoCo (H = 8) and Streaming DiLoCo (H = 8, P = 2; and with
tau = 2, alpha = 0.5 overlap). Every run over ``--seeds`` (CHOCO's gamma tuned on the first
seed, then kept): the table gives the mean and standard deviation of the final test accuracy
and training loss, the plots the first seed. (b) the
heterogeneous least-squares task of ``experiments/configs/heterogeneous_lsq.py`` (exact local
gradients, constant step) for the gossip algorithms: F - F* against bytes.

``--quick``: the MLP, 8 workers, 200 steps, one gamma. Outputs in ``OUT``: ``results.json``,
``results.md``, ``accuracy_vs_bytes.png``, ``accuracy_vs_time.png``, ``lsq_gap.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (experiments/common.py)

from nbsgd_jax import config as config_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (overrides, what the paper claims)
MNIST_RUNS = {
    "dpsgd": ({"algorithm": "dpsgd"}, "baseline (Lian et al. 2017)"),
    "choco_top_k": ({"algorithm": "choco_sgd", "compression.name": "top_k",
                     "compression.density": 0.01},
                    "ResNet-20/CIFAR-10, ring of 8: top-1% within ~1 point of exact "
                    "communication (Koloskova et al. 2020, Table 3)"),
    "choco_sign": ({"algorithm": "choco_sgd", "compression.name": "sign"},
                   "sign: ~32x fewer bits at the same accuracy (Koloskova et al. 2020)"),
    "choco_qsgd": ({"algorithm": "choco_sgd", "compression.name": "qsgd",
                    "compression.levels": 16},
                   "qsgd 4-bit: close to exact (Koloskova et al. 2019, 2020)"),
    "gradient_tracking": ({"algorithm": "gradient_tracking"},
                          "exact convergence under heterogeneity (Nedic et al. 2017)"),
    "d2": ({"algorithm": "d2"}, "beats D-PSGD on non-iid data (Tang et al. 2018, Fig. 2)"),
    "gossip_pga": ({"algorithm": "gossip_pga", "gossip_pga.period": 8},
                   "between D-PSGD and All-Reduce at a fraction of its bytes (Chen et al. 2021)"),
    "allreduce": ({"algorithm": "allreduce"}, "synchronous SGD"),
    "powersgd_r1": ({"algorithm": "allreduce", "compression.name": "powersgd",
                     "compression.rank": 1}, "rank 1-4: SGD's accuracy at 100-250x less "
                    "(Vogels et al. 2019, Table 3)"),
    "powersgd_r2": ({"algorithm": "allreduce", "compression.name": "powersgd",
                     "compression.rank": 2}, ""),
    "powersgd_r4": ({"algorithm": "allreduce", "compression.name": "powersgd",
                     "compression.rank": 4}, ""),
    "allreduce_top_k": ({"algorithm": "allreduce", "compression.name": "top_k",
                         "compression.density": 0.01}, "Top-k with EF (Shi et al. 2019)"),
    "diloco": ({"algorithm": "diloco", "diloco.inner_steps": 8}, "Douillard et al. 2023"),
    "streaming_diloco": ({"algorithm": "streaming_diloco", "diloco.inner_steps": 8,
                          "streaming_diloco.fragments": 2},
                         "DiLoCo's quality, peak bandwidth / P (Douillard et al. 2025)"),
    "streaming_overlap": ({"algorithm": "streaming_diloco", "diloco.inner_steps": 8,
                           "streaming_diloco.fragments": 2, "streaming_diloco.delay": 2,
                           "streaming_diloco.alpha": 0.5},
                          "overlap tau = 2, alpha = 0.5: no loss of quality (Douillard et al. "
                          "2025, Sec. 2.3)"),
}
LSQ_RUNS = ("dpsgd", "choco_top_k", "gradient_tracking", "d2", "gossip_pga")


def mnist_config(a, overrides: dict, gamma: float | None = None, seed: int = 0):
  c = config_lib.default_config()
  base = {"num_workers": a.workers, "topology": "ring", "model": a.model,
          "dataset": "mnist10k", "partition": "dirichlet", "dirichlet_alpha": 0.1,
          "batch_size": 32, "learning_rate": a.lr, "lr_schedule": "cosine", "momentum": 0.9,
          "weight_decay": 5e-4, "num_steps": a.steps, "eval_every": a.eval_every,
          "eval_train_examples": 1000, "seed": seed, "progress": False,
          "cluster.scenario": "lognormal", "cluster.spread": 0.3,
          "cluster.time_per_example": 1.25e-3}
  if gamma is not None:
    base["choco.gamma"] = gamma
  return config_lib.override(c, {**base, **overrides})


def lsq_config(overrides: dict, gamma: float | None = None):
  """``experiments/configs/heterogeneous_lsq.py`` with ``overrides``."""
  sys.path.insert(0, os.path.join(ROOT, "experiments", "configs"))
  import heterogeneous_lsq  # noqa: E402
  over = dict(overrides)
  if gamma is not None:
    over["choco.gamma"] = gamma
  return config_lib.override(heterogeneous_lsq.get_config(), over)


KEEP = ("step", "sim_time", "bytes_sent", "test_accuracy", "train_loss", "gap")


def run_all(cfgs: list) -> list[dict]:
  """The training runs of ``cfgs`` as one call (``common.run_histories``: one compiled
  program per structure): each run's evaluation history (a diverged run: one record of
  NaNs)."""
  out = common.run_histories(cfgs, KEEP)
  for r in out:
    del r["summary"]
  return out


def pick_gamma(name: str, tried: dict) -> tuple[float, dict, dict]:
  """CHOCO's gamma among the runs ``tried`` (``{gamma: run}``) by the lowest final training
  loss."""
  for g, r in tried.items():
    print(f"    {name} gamma={g}: train_loss {r['history'][-1]['train_loss']:.4f}", flush=True)
  loss = lambda k: tried[k]["history"][-1].get("train_loss", float("nan"))
  g = min(tried, key=lambda k: loss(k) if np.isfinite(loss(k)) else np.inf)
  return g, tried[g], {str(k): loss(k) for k in tried}


def _summary(runs: dict) -> dict:
  """Mean and standard deviation over seeds of the final test accuracy and training loss."""
  out = {}
  for key in ("test_accuracy", "train_loss", "bytes_sent", "sim_time"):
    v = np.array([r["history"][-1][key] for r in runs.values()], np.float64)
    out[key] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0}
  return out


def _first_seed(a, name: str, make) -> list:
  """``[(gamma, config)]`` of run ``name``'s first stage: each of ``a.gammas`` for CHOCO,
  else one config (gamma None)."""
  over = MNIST_RUNS[name][0]
  gammas = a.gammas if name.startswith("choco") else [None]
  return [(g, make(over, g)) for g in gammas]


def compare(a) -> dict:
  """(a) every run of ``a.runs`` on MNIST over ``a.seeds`` (CHOCO's gamma picked on the first
  seed), (b) the least-squares runs; each stage's runs trained as one call."""
  out = {"mnist": {}, "lsq": {}}
  first, rest = a.seeds[0], a.seeds[1:]
  stage = {name: _first_seed(a, name, lambda o, g: mnist_config(a, o, g, first))
           for name in a.runs}
  done = iter(run_all([c for cfgs in stage.values() for _, c in cfgs]))
  for name, cfgs in stage.items():
    entry = {"claim": MNIST_RUNS[name][1], "seeds": {}}
    tried = {g: next(done) for g, _ in cfgs}
    if name.startswith("choco"):
      g, r, grid = pick_gamma(name, tried)
      entry.update(gamma=g, gamma_grid=grid)
    else:
      (g, r), = tried.items()
    entry["seeds"][str(first)] = r
    out["mnist"][name] = entry
  names = list(stage)
  later = iter(run_all([mnist_config(a, MNIST_RUNS[name][0], out["mnist"][name].get("gamma"),
                                     seed) for name in names for seed in rest]))
  for name in names:
    entry = out["mnist"][name]
    for seed in rest:
      entry["seeds"][str(seed)] = next(later)
    entry["summary"] = _summary(entry["seeds"])
    r = entry["history"] = entry["seeds"][str(first)]["history"]  # the first seed's
    acc = entry["summary"]["test_accuracy"]
    print(f"  {name:18s} acc {acc['mean']:.4f} +- {acc['std']:.4f}  "
          f"MB {r[-1]['bytes_sent'] / 1e6:8.2f}  "
          f"({entry['seeds'][str(first)]['seconds']:.0f} s a seed)", flush=True)
  lsq = {name: _first_seed(a, name, lsq_config) for name in (LSQ_RUNS if a.lsq else ())}
  done = iter(run_all([c for cfgs in lsq.values() for _, c in cfgs]))
  for name, cfgs in lsq.items():
    tried = {g: next(done) for g, _ in cfgs}
    if name.startswith("choco"):
      g, r, _ = pick_gamma(name, tried)
      r["gamma"] = g
    else:
      (r,) = tried.values()
    out["lsq"][name] = r
  return out


def plots(res: dict, out: str) -> None:
  plt = common.pyplot()
  for x, fname, label in (("bytes_sent", "accuracy_vs_bytes.png", "MB sent per worker"),
                          ("sim_time", "accuracy_vs_time.png", "simulated time (s)")):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors[:len(res["mnist"])])
    for name, r in res["mnist"].items():
      h = r["history"]
      scale = 1e6 if x == "bytes_sent" else 1.0
      ax.plot([p[x] / scale for p in h], [p["test_accuracy"] for p in h], label=name)
    ax.set_xscale("symlog" if x == "bytes_sent" else "linear")
    ax.set_xlabel(label)
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7, ncol=2)
    common.save_figure(fig, os.path.join(out, fname))
  if not res["lsq"]:
    return
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, r in res["lsq"].items():
    h = r["history"]
    ax.semilogy([p["bytes_sent"] / 1e3 for p in h], [max(p["gap"], 1e-16) for p in h],
                label=name)
  ax.set_xlabel("kB sent per worker")
  ax.set_ylabel("F(x_bar) - F*")
  ax.legend(fontsize=8)
  common.save_figure(fig, os.path.join(out, "lsq_gap.png"))


def markdown(res: dict, a) -> str:
  base = res["mnist"].get("dpsgd", next(iter(res["mnist"].values())))
  dense = base["summary"]["bytes_sent"]["mean"]
  seeds = ", ".join(map(str, a.seeds))
  lines = [f"mnist10k, {a.model}, {a.workers} workers, ring, Dirichlet(0.1), {a.steps} steps, "
           f"seeds {seeds} (mean +- standard deviation); bytes per worker; x D-PSGD = bytes / "
           "D-PSGD's.", "",
           "| run | test acc | train loss | MB sent | x D-PSGD | sim s | gamma | claim |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, r in res["mnist"].items():
    m = r["summary"]
    acc, loss = m["test_accuracy"], m["train_loss"]
    b = m["bytes_sent"]["mean"]
    lines.append(f"| {name} | {acc['mean']:.4f} +- {acc['std']:.4f} | {loss['mean']:.4f} +- "
                 f"{loss['std']:.4f} | {b / 1e6:.2f} | {b / dense:.3f} | "
                 f"{m['sim_time']['mean']:.1f} | {r.get('gamma', '')} | {r['claim']} |")
  if res["lsq"]:
    lines += ["", "Heterogeneous least squares (exact gradients, constant step): final F - F*.",
              "", "| run | F - F* | kB sent | gamma |", "| --- | --- | --- | --- |"]
  for name, r in res["lsq"].items():
    h = r["history"][-1]
    lines.append(f"| {name} | {h['gap']:.3g} | {h['bytes_sent'] / 1e3:.1f} | "
                 f"{r.get('gamma', '')} |")
  grids = {n: r["gamma_grid"] for n, r in res["mnist"].items() if "gamma_grid" in r}
  if grids:
    lines += ["", "CHOCO's gamma grid (final training loss, first seed; nan: diverged):", ""]
    lines += [f"- {n}: " + ", ".join(f"{g}: {v:.4f}" for g, v in grid.items())
              for n, grid in grids.items()]
  return "\n".join(lines) + "\n"


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--workers", type=int, default=16)
  p.add_argument("--model", default="cnn")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--eval_every", type=int, default=100)
  p.add_argument("--lr", type=float, default=0.05)
  p.add_argument("--seeds", type=int, nargs="+", default=[0])
  p.add_argument("--runs", nargs="+", default=list(MNIST_RUNS), choices=list(MNIST_RUNS))
  p.add_argument("--no_lsq", dest="lsq", action="store_false",
                 help="skip (b), the least-squares runs")
  p.add_argument("--gammas", type=float, nargs="+", default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5])
  a = p.parse_args()
  if a.quick:
    a.workers, a.model, a.steps, a.eval_every, a.gammas = 8, "mlp", 200, 50, [0.2]
  os.makedirs(a.out, exist_ok=True)
  t = time.time()
  res = compare(a)
  res["seconds"] = time.time() - t
  res["args"] = vars(a)
  plots(res, a.out)
  common.write_results(a.out, res, markdown(res, a))
  print(f"total {res['seconds']:.0f} s")


if __name__ == "__main__":
  main()
