"""Local SGD with periodic averaging (LUPA-SGD), ADA-LUPA-SGD, post-local SGD and DiLoCo.

Haddadpour, Kamani, Mahdavi and Cadambe, "Local SGD with Periodic Averaging: Tighter
Analysis and Adaptive Synchronization" (NeurIPS 2019; code mmkamani7/LUPA-SGD). Claims: under
the PL condition, with tau = T^(2/3) / p^(1/3) local steps per period, local SGD reaches
E[F(x_T)] - F* = O(1 / (p T)) (linear speed-up in the workers p) with only
T / tau = (p T)^(1/3) communication rounds; ADA-LUPA's growing period
tau_i = ceil((F(x_0) / F(x_{s_i}))^(1/3)) tau_0 saves more rounds.

    python experiments/reproduce_local_sgd.py --out docs/local_sgd

(a) Linear speed-up, least squares (:func:`nbsgd_jax.models.problems.least_squares`, 16 shards
regrouped for p in {1, 2, 4, 8, 16}, batch 1 per worker, lr 2 / (mu (t + a)), a = 8 L / mu,
T local steps, ``--seeds`` seeds): F(mean x_T) - F* and the rounds used; log-log slopes of
the error against p and of the rounds against p T (``speedup.png``).
(b) Communication: p = 8, non-iid shards (``--heterogeneity``), the same lr; rounds until
F - F* first falls below a target (``--target_factor`` x the final error of synchronous SGD)
for synchronous SGD (tau = 1), LUPA(tau) over a sweep of tau, the code's linear ramp, and
ADA-LUPA (with F as in the paper, and with the oracle F - F*) (``rounds_to_target.png``).
(c) mnist10k CNN, 8 workers: local SGD tau in {1, 4, 16}, post-local SGD (tau = 1, then 16)
and DiLoCo (H = 16, outer Nesterov 0.7 / 0.9): test accuracy against communication rounds
(``mnist_accuracy_vs_rounds.png``).

Outputs in ``OUT``: ``results.json``, ``results.md`` and the PNGs.

    python experiments/reproduce_local_sgd.py --out docs/local_sgd --mnist_only "DiLoCo H=16"

retrains only the named runs of (c) and merges them into ``OUT/results.json`` (the other
runs, (a) and (b) kept as recorded), then rewrites the plots and ``results.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (experiments/common.py)

import numpy as np  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import train  # noqa: E402
from nbsgd_jax.models import problems


def make_problem(a, heterogeneity: float = 0.0) -> problems.SyntheticProblem:
  return problems.least_squares(16, a.examples, a.dim, noise=a.noise, condition=a.condition,
                                heterogeneity=heterogeneity, seed=a.seed)


def pl_config(a, base, algorithm: str, p: int, seed: int, heterogeneity: float = 0.0,
              eval_every: int = 0, **kw):
  """The least-squares task of :func:`make_problem` on p workers through the training loop:
  plain SGD, batch 1, eta_t = 2 / (mu (t + a)) with a = 8 L / mu (the decaying step of the PL
  analysis, ``lr_schedule='inverse_time'``)."""
  mu, lip = problems.pl_constants(base)
  t0 = 8.0 * lip / mu
  c = config_lib.default_config()
  over = {"dataset": "least_squares", "algorithm": algorithm, "num_workers": p,
          "batch_size": 1, "num_steps": a.steps, "eval_every": eval_every or a.steps,
          "momentum": 0.0, "seed": seed, "progress": False, "lr_schedule": "inverse_time",
          "learning_rate": 2.0 / (mu * t0), "lr_time_scale": t0, "problem.shards": 16,
          "problem.examples_per_worker": a.examples, "problem.dim": a.dim,
          "problem.noise": a.noise, "problem.condition": a.condition, "problem.l2": 0.0,
          "problem.heterogeneity": heterogeneity, "problem.seed": a.seed, **kw}
  return config_lib.override(c, over)


def slope(x, y) -> float:
  """Least-squares slope of log y against log x."""
  return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


# ----------------------------------------------------------------------------- (a)


def speedup(a) -> dict:
  base = make_problem(a)
  taus = {p: max(1, round(a.steps ** (2 / 3) / p ** (1 / 3))) for p in a.workers}
  done = iter(train.train_runs([  # every run at once: one compilation per structure
      pl_config(a, base, "local_sgd", p, seed, **{"local_sgd.local_steps": taus[p]})
      for p in a.workers for seed in range(a.seeds)]))
  rows = []
  for p in a.workers:
    tau = taus[p]
    gaps, rounds = [], None
    for seed in range(a.seeds):
      r = next(done)
      gaps.append(r["gap"])
      rounds = r["rounds"]
    rows.append({"p": p, "tau": tau, "rounds": rounds, "gap_mean": float(np.mean(gaps)),
                 "gap_sem": float(np.std(gaps, ddof=1) / math.sqrt(len(gaps))) if len(gaps) > 1
                 else 0.0, "gaps": gaps})
    print(f"  (a) p={p:2d} tau={tau:3d} rounds={rounds:3d} F-F*={np.mean(gaps):.3e}", flush=True)
  ps = [r["p"] for r in rows]
  return {"rows": rows, "steps": a.steps,
          "error_slope_vs_p": slope(ps, [r["gap_mean"] for r in rows]),
          "rounds_slope_vs_pT": slope([p * a.steps for p in ps], [r["rounds"] for r in rows]),
          "ratio_p16_over_p1": rows[-1]["gap_mean"] / rows[0]["gap_mean"]}


# ----------------------------------------------------------------------------- (b)


def rounds_to(history: list, target: float):
  for h in history:
    if h["gap"] <= target:
      return h["rounds"]
  return None


def communication(a) -> dict:
  base = make_problem(a, a.heterogeneity)
  p = a.comm_workers
  runs = {"sync SGD (tau=1)": ("allreduce", {})}
  for tau in a.taus:
    runs[f"LUPA tau={tau}"] = ("local_sgd", {"local_sgd.local_steps": tau})
  for tau0 in a.ada_taus:
    ada = {"local_sgd.schedule": "ada_lupa", "local_sgd.local_steps": tau0}
    runs[f"ADA-LUPA tau0={tau0}"] = ("local_sgd", ada)
    runs[f"ADA-LUPA tau0={tau0}, F-F*"] = ("local_sgd", {**ada, "local_sgd.offset_optimum": True})
  runs[f"linear ramp tau0={a.ada_taus[0]}, alpha=0.1"] = (
      "local_sgd", {"local_sgd.schedule": "linear", "local_sgd.local_steps": a.ada_taus[0],
                    "local_sgd.alpha": 0.1})
  out = {}
  done = iter(train.train_runs([  # an evaluation after every step: rounds to the target
      pl_config(a, base, algorithm, p, seed, a.heterogeneity, eval_every=1, **kw)
      for algorithm, kw in runs.values() for seed in range(a.seeds)]))
  for name, (algorithm, kw) in runs.items():
    histories, periods = [], None
    for seed in range(a.seeds):
      r = next(done)
      histories.append([{"step": h["step"], "rounds": h["rounds"], "gap": h["gap"]}
                        for h in r["history"]])
      periods = r.get("periods")
    out[name] = {"histories": histories, "periods": periods,
                 "final_gap": float(np.mean([h[-1]["gap"] for h in histories]))}
    print(f"  (b) {name:28s} final F-F*={out[name]['final_gap']:.3e} "
          f"rounds={histories[0][-1]['rounds']}", flush=True)
  target = out["sync SGD (tau=1)"]["final_gap"] * a.target_factor
  for v in out.values():
    rt = [rounds_to(h, target) for h in v["histories"]]
    v["rounds_to_target"] = rt
    v["rounds_to_target_mean"] = (float(np.mean(rt)) if all(x is not None for x in rt)
                                  else None)
    v["total_rounds"] = v["histories"][0][-1]["rounds"]
  for v in out.values():  # keep seed 0's curve (thinned to ~300 points) in results.json
    h = v.pop("histories")[0]
    keep = sorted(set(np.unique(np.geomspace(1, len(h), 300).astype(int) - 1)) | {0})
    v["history_seed0"] = [h[i] for i in keep]
  fixed = {k: v["rounds_to_target_mean"] for k, v in out.items()
           if (k.startswith("LUPA") or k.startswith("sync")) and v["rounds_to_target_mean"]}
  best_fixed = min(fixed, key=fixed.get) if fixed else None
  return {"workers": p, "target_gap": target, "runs": out, "best_fixed": best_fixed}


# ----------------------------------------------------------------------------- (c)


def mnist_config(a, algorithm, lr: float = 0.05, **kw):
  """The mnist10k CNN run of (c): 8 workers, batch 32, ``lr`` cosine, momentum 0.9."""
  c = config_lib.default_config()
  c.algorithm = algorithm
  c.num_workers = 8
  c.model = "cnn"
  c.batch_size = 32
  c.learning_rate = lr
  c.lr_schedule = "cosine"
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.num_steps = a.mnist_steps
  c.eval_every = a.mnist_eval_every
  c.eval_train_examples = 1000
  c.seed = a.seed
  c.progress = False
  return config_lib.override(c, kw)


def mnist_runs(steps: int) -> dict:
  """(c)'s runs: name -> (algorithm, overrides) for :func:`mnist_config`."""
  return {
      "local SGD tau=1": ("local_sgd", {"local_sgd.local_steps": 1}),
      "local SGD tau=4": ("local_sgd", {"local_sgd.local_steps": 4}),
      "local SGD tau=16": ("local_sgd", {"local_sgd.local_steps": 16}),
      "post-local SGD (tau 1 -> 16)": (
          "local_sgd", {"local_sgd.local_steps": 16, "local_sgd.schedule": "post_local",
                        "local_sgd.switch_step": steps // 4}),
      "DiLoCo H=16": ("diloco", {"diloco.local_steps": 16}),
  }


def mnist(a) -> dict:
  runs = {name: mnist_config(a, algo, **kw)
          for name, (algo, kw) in mnist_runs(a.mnist_steps).items()
          if not a.mnist_only or name in a.mnist_only}
  out = {}
  t = time.time()
  done = dict(zip(runs, train.train_runs(list(runs.values()))))
  for name, cfg in runs.items():
    s = done[name]
    out[name] = {"test_accuracy": s["test_accuracy"], "train_loss": s["train_loss"],
                 "rounds": s["rounds"], "bytes_sent": s["bytes_sent"],
                 "sim_time": s["sim_time"], "history": s["history"]}
    print(f"  (c) {name:30s} acc {s['test_accuracy']:.4f} rounds {s['rounds']:4d}",
          flush=True)
  print(f"  (c) {len(runs)} runs in {time.time() - t:.0f} s real", flush=True)
  return out


# ----------------------------------------------------------------------------- plots


def plot_speedup(res, path):
  plt = common.pyplot()
  rows = res["rows"]
  ps = np.array([r["p"] for r in rows])
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
  g = np.array([r["gap_mean"] for r in rows])
  ax0.errorbar(ps, g, yerr=[r["gap_sem"] for r in rows], marker="o", label="measured")
  ax0.plot(ps, g[0] / ps, "k--", lw=1, label="linear speed-up (1/p)")
  ax0.set_xscale("log", base=2)
  ax0.set_yscale("log")
  ax0.set_xlabel("workers p")
  ax0.set_ylabel("F(mean x_T) - F*")
  ax0.set_title(f"T = {res['steps']} local steps, slope {res['error_slope_vs_p']:.2f}")
  ax0.legend()
  pt = ps * res["steps"]
  r = np.array([x["rounds"] for x in rows])
  ax1.plot(pt, r, "o-", label="rounds used")
  ax1.plot(pt, r[0] * (pt / pt[0]) ** (1 / 3), "k--", lw=1, label="(pT)^(1/3)")
  ax1.set_xscale("log")
  ax1.set_yscale("log")
  ax1.set_xlabel("p T")
  ax1.set_ylabel("communication rounds")
  ax1.set_title(f"tau = T^(2/3)/p^(1/3), slope {res['rounds_slope_vs_pT']:.2f}")
  ax1.legend()
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_rounds(res, path):
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(8, 4.5))
  for i, (name, v) in enumerate(res["runs"].items()):
    h = v["history_seed0"]
    ax.plot([x["rounds"] for x in h], [x["gap"] for x in h], color=f"C{i % 10}",
            ls="-" if "ADA" not in name else "--", label=name)
  ax.axhline(res["target_gap"], color="gray", ls=":", label="target")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("communication rounds")
  ax.set_ylabel("F(mean x) - F*  (seed 0)")
  ax.set_title(f"least squares, p = {res['workers']}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_mnist(res, path):
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, v in res.items():
    h = v["history"]
    ax.plot([max(x["rounds"], 1) for x in h], [100 * x["test_accuracy"] for x in h], "o-",
            label=name)
  ax.set_xscale("log")
  ax.set_xlabel("communication rounds")
  ax.set_ylabel("test accuracy (%), averaged model (DiLoCo: outer)")
  ax.set_ylim(bottom=80)
  ax.set_title("mnist10k CNN, 8 workers")
  ax.legend(fontsize=8)
  fig.tight_layout()
  common.save_figure(fig, path)


# ----------------------------------------------------------------------------- report


def markdown(res, a) -> str:
  sp, cm = res["speedup"], res["communication"]
  lines = [f"(a) Least squares (16 x {a.examples} examples, d = {a.dim}, noise {a.noise}, "
           f"condition {a.condition}), T = {a.steps}, batch 1, {a.seeds} seeds, "
           "lr 2 / (mu (t + 8 L / mu)), tau = round(T^(2/3) / p^(1/3)):", "",
           "| p | tau | rounds | F - F* (mean +- s.e.) | vs p = 1 |", "|---:|---:|---:|---:|---:|"]
  g1 = sp["rows"][0]["gap_mean"]
  for r in sp["rows"]:
    lines.append(f"| {r['p']} | {r['tau']} | {r['rounds']} | {r['gap_mean']:.3e} +- "
                 f"{r['gap_sem']:.1e} | 1/{g1 / r['gap_mean']:.1f} |")
  lines += ["", f"Slope of log(F - F*) against log p: {sp['error_slope_vs_p']:.2f} (linear "
            f"speed-up: -1). Slope of log(rounds) against log(pT): "
            f"{sp['rounds_slope_vs_pT']:.2f} (theory: 1/3).", "",
            f"(b) Rounds until F - F* <= {cm['target_gap']:.3e} (p = {cm['workers']}, non-iid "
            f"shards with heterogeneity {a.heterogeneity}, T = "
            f"{a.steps}; mean over {a.seeds} seeds; target = {a.target_factor} x the final error of "
            "synchronous SGD; None: not reached by every seed):", "",
            "| schedule | rounds to target | rounds in T steps | final F - F* | periods (seed 0, "
            "first 8) |", "|---|---:|---:|---:|---|"]
  for name, v in cm["runs"].items():
    rt = v["rounds_to_target_mean"]
    per = v["periods"][:8] if v["periods"] else "1 every step"
    lines.append(f"| {name} | {rt if rt is None else f'{rt:.1f}'} | {v['total_rounds']} | "
                 f"{v['final_gap']:.3e} | {per} |")
  lines += ["", f"Best fixed schedule: {cm['best_fixed']}.", ""]
  if res.get("mnist"):
    lines += ["(c) mnist10k CNN, 8 workers, batch 32, lr 0.05 cosine, momentum 0.9 (local), "
              f"weight decay 5e-4, {a.mnist_steps} steps, seed {a.seed} (one run each; "
              "3 seeds with tuned rates: experiments/tune_seeds.py local_sgd):", "",
              "| run | test acc. | rounds | MB sent / worker | sim time (s) |",
              "|---|---:|---:|---:|---:|"]
    for name, v in res["mnist"].items():
      lines.append(f"| {name} | {100 * v['test_accuracy']:.2f}% | {v['rounds']} | "
                   f"{v['bytes_sent'] / 1e6:.1f} | {v['sim_time']:.2f} |")
    if res.get("retrained"):
      lines += ["", "(c) trained again alone (`--mnist_only`; (a) and (b) as recorded): "
                + ", ".join(res["retrained"]) + "; DiLoCo's row evaluates its outer model."]
  return "\n".join(lines) + "\n"


def merge_mnist(a, start: float) -> None:
  """Retrain the (c) runs ``a.mnist_only`` and merge them into ``a.out``'s results.json, whose
  recorded arguments the run's must equal (but for ``mnist_only``)."""
  import json
  with open(os.path.join(a.out, "results.json")) as f:
    res = json.load(f)
  was = {k: v for k, v in res["args"].items() if k not in ("out", "mnist_only")}
  now = {k: v for k, v in vars(a).items() if k not in ("out", "mnist_only")}
  if was != now:
    raise SystemExit(f"{a.out}/results.json was made with {was}, not {now}")
  new = mnist(a)
  res["mnist"] = {name: new.get(name, v) for name, v in res["mnist"].items()}
  res.setdefault("retrained", {}).update({name: round(time.time() - start, 1) for name in new})
  plot_mnist(res["mnist"], os.path.join(a.out, "mnist_accuracy_vs_rounds.png"))
  ns = argparse.Namespace(**{**res["args"], **{k: v for k, v in vars(a).items()
                                                if k not in res["args"]}})
  common.write_results(a.out, res, markdown(res, ns))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--steps", type=int, default=4000, help="T, local steps per worker")
  ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--examples", type=int, default=512, help="examples per shard (16 shards)")
  ap.add_argument("--dim", type=int, default=20)
  ap.add_argument("--noise", type=float, default=1.0)
  ap.add_argument("--condition", type=float, default=10.0)
  ap.add_argument("--comm_workers", type=int, default=8)
  ap.add_argument("--taus", type=int, nargs="+", default=[2, 5, 10, 20, 50, 100, 200])
  ap.add_argument("--ada_taus", type=int, nargs="+", default=[2, 5])
  ap.add_argument("--target_factor", type=float, default=1.5,
                  help="(b) target = this x the final F - F* of synchronous SGD")
  ap.add_argument("--heterogeneity", type=float, default=1.0,
                  help="non-iid shards in (b) (problems.least_squares heterogeneity)")
  ap.add_argument("--mnist_steps", type=int, default=600)
  ap.add_argument("--mnist_eval_every", type=int, default=100)
  ap.add_argument("--skip_mnist", action="store_true")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--mnist_only", nargs="+", default=None, choices=list(mnist_runs(600)),
                  help="retrain only these runs of (c), merged into OUT/results.json")
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  start = time.time()
  if a.mnist_only:
    merge_mnist(a, start)
    return
  res = {"args": common.repo_relative(vars(a)), "speedup": speedup(a),
         "communication": communication(a)}
  plot_speedup(res["speedup"], os.path.join(a.out, "speedup.png"))
  plot_rounds(res["communication"], os.path.join(a.out, "rounds_to_target.png"))
  if not a.skip_mnist:
    res["mnist"] = mnist(a)
    plot_mnist(res["mnist"], os.path.join(a.out, "mnist_accuracy_vs_rounds.png"))
  res["real_seconds"] = time.time() - start
  common.write_results(a.out, res, markdown(res, a))
  print(f"wrote {a.out}/results.json, results.md and plots in {time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
