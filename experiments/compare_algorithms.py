"""The field's algorithms side by side: accuracy / loss against bytes and simulated time.

    python experiments/compare_algorithms.py --out docs/compare            # full
    python experiments/compare_algorithms.py --quick --out /tmp/compare    # a few minutes
    python experiments/compare_algorithms.py --seeds 0 1 2 --runs dpsgd choco_top_k --out DIR

(a) mnist10k, 16 workers on a ring, Dirichlet(0.1) partition, the CNN (``--model``), batch 32,
SGD with momentum 0.9, cosine learning rate 0.05, on the simulated cluster of
``experiments/configs/quickstart.py``: D-PSGD, CHOCO-SGD (top_k at density 0.01, sign,
qsgd), gradient tracking, D^2, Gossip-PGA (H = 8), All-Reduce SGD dense, with PowerSGD (rank 1, 2, 4) and with
top_k (0.01, error feedback), DiLoCo (H = 8) and Streaming DiLoCo (H = 8, P = 2; and with
tau = 2, alpha = 0.5 overlap); Epidemic Learning (EL-Local and EL-Oracle, s = 2 every step)
and Teleportation (k = 8 every step), at D-PSGD's bytes on the ring. CHOCO's consensus step gamma is picked from ``--gammas`` by the
final training loss on ``--tune_seed`` (default 3), a seed that is not reported; then every run
over ``--seeds`` (default 0, 1, 2): the table gives the mean and standard deviation of the final
test accuracy and training loss, the plots the first seed. Every run is cached in
``--runs_dir`` (default ``OUT/runs``) as soon as its call returns, so a stopped study resumes.
(b) the heterogeneous least-squares task of ``experiments/configs/heterogeneous_lsq.py`` (exact local
gradients, constant step) for the gossip algorithms: F - F* against bytes.

``--merge``: the runs of ``--runs`` replace theirs in ``OUT/results.json`` or join it (the
others kept as recorded; the study's arguments must be the record's), then the plots and, where every entry
has its seeds' summary, ``results.md`` are rewritten: e.g. DiLoCo alone after a change to what
it evaluates, ``--runs diloco --no_lsq --merge`` with the record's other arguments.

``--quick``: the MLP, 8 workers, 200 steps, one gamma, seed 0. Outputs in ``OUT``:
``results.json``, ``results.md``, ``accuracy_vs_bytes.png``, ``accuracy_vs_time.png``, ``lsq_gap.png``.
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
    "diloco": ({"algorithm": "diloco", "diloco.local_steps": 8}, "Douillard et al. 2023"),
    "streaming_diloco": ({"algorithm": "streaming_diloco", "diloco.local_steps": 8,
                          "streaming_diloco.fragments": 2},
                         "DiLoCo's quality, peak bandwidth / P (Douillard et al. 2025)"),
    "streaming_overlap": ({"algorithm": "streaming_diloco", "diloco.local_steps": 8,
                           "streaming_diloco.fragments": 2, "streaming_diloco.delay": 2,
                           "streaming_diloco.alpha": 0.5},
                          "overlap tau = 2, alpha = 0.5: no loss of quality (Douillard et al. "
                          "2025, Sec. 2.3)"),
    # the sampled line at D-PSGD's bytes on the ring: two models per worker per step
    "epidemic_local": ({"algorithm": "epidemic", "epidemic.variant": "local",
                        "epidemic.graph_degree": 2, "epidemic.rounds": 1},
                       "EL-Local: up to 1.7x quicker, 2.2 % higher accuracy at the same "
                       "communication volume (de Vos et al. 2023, abstract; 96 nodes)"),
    "epidemic_oracle": ({"algorithm": "epidemic", "epidemic.variant": "oracle",
                         "epidemic.graph_degree": 2, "epidemic.rounds": 1},
                        "EL-Oracle: a fresh random s-regular graph a round (de Vos et al. "
                        "2023)"),
    "teleportation": ({"algorithm": "teleportation", "teleportation.sample_size": 8,
                       "teleportation.local_steps": 1},
                      "higher accuracy than Decentralized SGD (Takezawa & Stich 2025, "
                      "abstract); k = 8 of 16 active, log2 k + 1 models each: D-PSGD's total"),
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


def run_all(a, cfgs: list) -> list[dict]:
  """The training runs of ``cfgs`` as one call (``common.run_histories``: one compiled
  program per structure), each read from or written to the run cache ``a.runs_dir``: each
  run's evaluation history (a diverged run: one record of NaNs)."""
  return common.cached_histories(cfgs, KEEP, a.runs_dir)


def pick_gamma(name: str, tried: dict) -> tuple[float, dict, dict]:
  """CHOCO's gamma among the runs ``tried`` (``{gamma: run}``) by the lowest final training
  loss (a diverged run: never)."""
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


def tune_gammas(a) -> dict:
  """``{name: {"gamma", "gamma_grid", "gamma_edge"}}`` for the CHOCO runs of ``a.runs``:
  each codec's runs over ``a.gammas`` on ``a.tune_seed`` (a seed not reported), the pick the
  lowest final training loss; ``gamma_edge`` when it is the grid's smallest or largest."""
  out = {}
  for name in (n for n in a.runs if n.startswith("choco")):
    tried = run_all(a, [mnist_config(a, MNIST_RUNS[name][0], g, a.tune_seed)
                        for g in a.gammas])
    g, _, grid = pick_gamma(name, dict(zip(a.gammas, tried)))
    out[name] = {"gamma": g, "gamma_grid": grid, "gamma_edge": g in (min(a.gammas),
                                                                    max(a.gammas))}
  return out


def compare(a) -> dict:
  """(a) every run of ``a.runs`` on MNIST over ``a.seeds`` (CHOCO's gamma picked on
  ``a.tune_seed`` by :func:`tune_gammas`), each run's seeds trained as one call; (b) the
  least-squares runs (exact gradients, no seed: CHOCO's gamma is the best of the grid on the
  reported run itself).

  Raises:
    ValueError: ``a.tune_seed`` is among ``a.seeds``.
  """
  if a.tune_seed in a.seeds:
    raise ValueError(f"--tune_seed {a.tune_seed} is among --seeds {a.seeds}: the seed that "
                     "picks gamma must not be reported")
  out = {"mnist": {}, "lsq": {}}
  tuned = tune_gammas(a)
  for name in a.runs:
    entry = {"claim": MNIST_RUNS[name][1], **tuned.get(name, {})}
    runs = run_all(a, [mnist_config(a, MNIST_RUNS[name][0], entry.get("gamma"), seed)
                       for seed in a.seeds])
    entry["seeds"] = {str(seed): r for seed, r in zip(a.seeds, runs)}
    entry["summary"] = _summary(entry["seeds"])
    r = entry["history"] = runs[0]["history"]  # the first reported seed's
    acc = entry["summary"]["test_accuracy"]
    print(f"  {name:18s} acc {acc['mean']:.4f} +- {acc['std']:.4f}  "
          f"MB {r[-1]['bytes_sent'] / 1e6:8.2f}  ({runs[0]['seconds']:.0f} s a seed)",
          flush=True)
    out["mnist"][name] = entry
  for name in (LSQ_RUNS if a.lsq else ()):
    gammas = a.gammas if name.startswith("choco") else [None]
    tried = run_all(a, [lsq_config(MNIST_RUNS[name][0], g) for g in gammas])
    if name.startswith("choco"):
      g, r, _ = pick_gamma(name, dict(zip(gammas, tried)))
      r["gamma"] = g
    else:
      (r,) = tried
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
           f"learning rate {a.lr} (not tuned), reported seeds {seeds} (mean +- standard "
           f"deviation); CHOCO's gamma picked on seed {a.tune_seed}, which is not reported "
           "(*: at the grid's edge); bytes per worker; x D-PSGD = bytes / D-PSGD's.", "",
           "| run | test acc | train loss | MB sent | x D-PSGD | sim s | gamma | claim |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, r in res["mnist"].items():
    m = r["summary"]
    acc, loss = m["test_accuracy"], m["train_loss"]
    b = m["bytes_sent"]["mean"]
    lines.append(f"| {name} | {acc['mean']:.4f} +- {acc['std']:.4f} | {loss['mean']:.4f} +- "
                 f"{loss['std']:.4f} | {b / 1e6:.2f} | {b / dense:.3f} | "
                 f"{m['sim_time']['mean']:.1f} | {r.get('gamma', '')}{'*' if r.get('gamma_edge') else ''} "
                 f"| {r['claim']} |")
  if res["lsq"]:
    lines += ["", "Heterogeneous least squares (exact gradients, constant step): final F - F*.",
              "", "| run | F - F* | kB sent | gamma |", "| --- | --- | --- | --- |"]
  for name, r in res["lsq"].items():
    h = r["history"][-1]
    lines.append(f"| {name} | {h['gap']:.3g} | {h['bytes_sent'] / 1e3:.1f} | "
                 f"{r.get('gamma', '')} |")
  grids = {n: r["gamma_grid"] for n, r in res["mnist"].items() if "gamma_grid" in r}
  if grids:
    lines += ["", f"CHOCO's gamma grid (final training loss on the tuning seed {a.tune_seed}; "
              "nan: diverged):", ""]
    lines += [f"- {n}: " + ", ".join(f"{g}: {v:.4f}" for g, v in grid.items())
              for n, grid in grids.items()]
  return "\n".join(lines) + "\n"


SAME = ("workers", "model", "steps", "eval_every", "lr")  # what a merged run must share


def merge(a, new: dict, seconds: float) -> None:
  """``--merge``: ``new``'s MNIST runs replace theirs in ``a.out/results.json`` (an entry of
  an older record with one seed, without a summary, keeps its keys: its history and seconds
  are the new first seed's); the plots rewritten, and ``results.md`` where every entry has a
  summary (an older record's table is left as it is).

  Raises:
    SystemExit: the record was made with other ``SAME`` arguments or other seeds.
  """
  with open(os.path.join(a.out, "results.json")) as f:
    res = json.load(f)
  was = res["args"]
  seeds = was.get("seeds", [was.get("seed", 0)])
  if any(was[k] != getattr(a, k) for k in SAME) or seeds != a.seeds:
    raise SystemExit(f"{a.out}/results.json was made with "
                     f"{ {k: was[k] for k in SAME} } and seeds {seeds}; give those")
  for name, entry in new["mnist"].items():
    old = res["mnist"].get(name)  # a run the record lacks is added
    if old is not None and "summary" not in old:
      entry = {**old, "history": entry["history"],
               "seconds": entry["seeds"][str(a.seeds[0])]["seconds"]}
    res["mnist"][name] = entry
  res.setdefault("merged", {}).update({n: round(seconds, 1) for n in new["mnist"]})
  plots(res, a.out)
  if all("summary" in r for r in res["mnist"].values()):
    common.write_results(a.out, res, markdown(res, argparse.Namespace(**was)))
  else:
    common.write_results_json(os.path.join(a.out, "results.json"), res)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--workers", type=int, default=16)
  p.add_argument("--model", default="cnn")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--eval_every", type=int, default=100)
  p.add_argument("--lr", type=float, default=0.05)
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="reported seeds")
  p.add_argument("--tune_seed", type=int, default=3,
                 help="the seed CHOCO's gamma is picked on (not reported)")
  p.add_argument("--runs_dir", default=None,
                 help="run cache, so a stopped study resumes (default OUT/runs)")
  p.add_argument("--runs", nargs="+", default=list(MNIST_RUNS), choices=list(MNIST_RUNS))
  p.add_argument("--no_lsq", dest="lsq", action="store_false",
                 help="skip (b), the least-squares runs")
  p.add_argument("--gammas", type=float, nargs="+", default=[0.02, 0.05, 0.2, 0.5, 1.0])
  p.add_argument("--merge", action="store_true",
                 help="merge the --runs into OUT/results.json (the others kept)")
  a = p.parse_args()
  if a.quick:
    a.workers, a.model, a.steps, a.eval_every, a.gammas, a.seeds = 8, "mlp", 200, 50, [0.2], [0]
  os.makedirs(a.out, exist_ok=True)
  a.runs_dir = a.runs_dir or os.path.join(a.out, "runs")
  t = time.time()
  res = compare(a)
  if a.merge:
    merge(a, res, time.time() - t)
    return
  res["seconds"] = time.time() - t
  res["args"] = common.repo_relative(vars(a))  # paths relative to the repository
  plots(res, a.out)
  common.write_results(a.out, res, markdown(res, a))
  print(f"total {res['seconds']:.0f} s")


if __name__ == "__main__":
  main()
