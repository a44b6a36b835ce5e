"""Top-k, Gaussian-k and Random-k sparsification with and without error feedback.

Shi, Chu, Cheung and See, "Understanding Top-k Sparsification in Distributed Deep Learning"
(arXiv 1911.08772, 2019; code hclhkbu/GaussianK-SGD). Claims checked here:

* TopK-SGD with error feedback (residual) trains as well as dense SGD while sending
  100-1000x fewer bytes; without error feedback it does worse;
* the error-fed vector p = g + e is bell-shaped, so Top-k's contraction
  ||p - Top_k(p)||^2 / ||p||^2 sits far below the classic bound (1 - k/d) (and, in the
  paper, below (1 - k/d)^2, the tighter bound it motivates);
* a threshold from the normal inverse CDF (Gaussian-k) selects about k entries cheaply.

    python experiments/reproduce_sparsification.py --out docs/sparsification

(a) Trains the LeNet-style CNN on mnist10k with 8 simulated workers, All-Reduce SGD: dense,
and top_k / gaussian_k / random_k at each density (default 0.01 and 0.001), each with and
without error feedback. Writes the accuracy / bytes table and ``accuracy_vs_bytes.png``.
(b) Every ``--probe_every`` steps of every compressed run, a hook
(:func:`nbsgd_jax.train.train`'s ``hooks``) recomputes each worker's error-fed vector
p = g + e exactly as the next step will see it (same batch, same residual) and records
||p - Top_k(p)||^2 / ||p||^2 for both densities next to (1 - k/d) and (1 - k/d)^2
(``topk_bound.png``), the fitted normal (mean, std, excess kurtosis), and histograms of
worker 0's p at a few steps against the fitted normal (``p_histograms.png``).
(c) In the gaussian_k runs, the number of entries Gaussian-k selects on p over training, as a
fraction of k, with the paper's correction steps exactly as GaussianK-SGD's GaussianCompressor
(``paper/3``: at most 3 thresholds evaluated, k = floor(d density), unbiased std) and with the
bracketing correction (``bracket/3``, ``bracket/8``: at most 3 and 8 corrections, i.e. 4 and 9
thresholds) (``gaussian_k_count.png``); the count is against the project's k = ceil(d density).

Outputs in ``OUT``: ``results.json`` (everything), ``results.md`` (tables) and the PNGs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (experiments/common.py)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from nbsgd_jax.codecs import sparse as compression  # noqa: E402
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import transforms as transforms_lib  # noqa: E402
from nbsgd_jax import train  # noqa: E402

COMPRESSORS = ("top_k", "gaussian_k", "random_k")


def make_config(name: str, density: float, ef: bool, a) -> "config_lib.ml_collections.ConfigDict":
  """All-Reduce SGD, CNN, mnist10k; ``name`` "none" is dense SGD."""
  c = config_lib.default_config()
  c.algorithm = "allreduce"
  c.num_workers = a.workers
  c.model = a.model
  c.batch_size = 32
  c.learning_rate = a.lr
  c.lr_schedule = "cosine"
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.num_steps = a.steps
  c.eval_every = a.eval_every
  c.eval_train_examples = 1000
  c.seed = a.seed
  c.progress = False
  c.compression.name = name
  c.compression.density = density
  c.compression.error_feedback = ef
  return c


def run_name(name: str, density: float, ef: bool) -> str:
  return "dense" if name == "none" else f"{name}{'+EF' if ef else ''}@{density:g}"


def topk_residual_ratio(p: np.ndarray, k: int) -> np.ndarray:
  """||p - Top_k(p)||^2 / ||p||^2 per row of p [n, d] (float64, exact, by np.partition)."""
  sq = np.square(p.astype(np.float64))
  d = sq.shape[1]
  top = np.partition(sq, d - k, axis=1)[:, d - k:].sum(axis=1)
  tot = sq.sum(axis=1)
  return np.where(tot > 0, 1.0 - top / np.maximum(tot, 1e-300), 0.0)


def _find_state(tree, kind):
  """The first node of type ``kind`` in a transform state (depth first), or None."""
  if isinstance(tree, kind):
    return tree
  if isinstance(tree, (tuple, list)):
    for sub in tree:
      found = _find_state(sub, kind)
      if found is not None:
        return found
  return None


class GradientProbe:
  """A ``train`` hook measuring the error-fed vector p = g + e of every worker.

  At steps ``0, every, 2 every, ...`` it recomputes each worker's gradient on the batch the
  next step will draw and adds the error-feedback residual held in ``opt_state[0]`` (zero
  for dense runs and runs without error feedback), giving p [n, d] exactly as the
  compressor will see it.
  """

  def __init__(self, every: int, densities: tuple, hist_steps: tuple, run_density: float,
               variants: tuple = (("paper", 3), ("bracket", 3), ("bracket", 8))):
    # (correction, rounds): paper's rounds = thresholds evaluated (the reference's `loops < 3`),
    # bracket's = corrections after the first (compression.gaussian_threshold)
    self.every = every
    self.densities = densities
    self.hist_steps = set(hist_steps)
    self.run_density = run_density
    self.variants = variants
    self.records: list[dict] = []
    self.histograms: list[dict] = []
    self._p_fn = None
    self._count_fns: dict = {}

  def _build(self, s) -> None:
    cfg = s.cfg
    capacity = s.worker_data.labels.shape[1]

    def worker_p(state, data):
      batch = s.task.batch(data, state.step, s.backend.axis_name)
      g = jax.grad(lambda prm: s.task.loss_fn(prm, state.model_state, batch)[0])(state.params)
      p, _ = ravel_pytree(g)
      ef = _find_state(state.opt_state, transforms_lib.ErrorFeedbackState)
      if ef is not None:
        p = p + ravel_pytree(ef.residual)[0]
        return p, ef.sent_count
      return p, jnp.zeros((), jnp.int32)

    self._p_fn = jax.jit(s.backend.spmd(worker_p))
    for corr, r in self.variants:
      self._count_fns[f"{corr}/{r}"] = jax.jit(jax.vmap(
          lambda v, r=r, corr=corr: compression.gaussian_k_with_count(
              v, density=self.run_density, rounds=r, correction=corr)[2]))

  def __call__(self, step: int, state, s) -> None:
    if step % self.every and step not in self.hist_steps:
      return
    if self._p_fn is None:
      self._build(s)
    p, sent = self._p_fn(state, s.worker_data)
    p_dev = p
    p = np.asarray(p, np.float64)
    d = p.shape[1]
    mean = p.mean(axis=1)
    std = p.std(axis=1)
    z = (p - mean[:, None]) / np.maximum(std[:, None], 1e-300)
    rec = {"step": step, "d": d, "mean": float(mean.mean()), "std": float(std.mean()),
           "excess_kurtosis": float((np.power(z, 4).mean(axis=1) - 3.0).mean()),
           "sent_last_step": float(np.asarray(sent).mean()), "topk": {}}
    for dens in self.densities:
      k = compression.num_selected(d, dens)
      ratio = topk_residual_ratio(p, k)
      rec["topk"][f"{dens:g}"] = {
          "k": k, "ratio_mean": float(ratio.mean()), "ratio_max": float(ratio.max()),
          "bound_1": 1.0 - k / d, "bound_2": (1.0 - k / d) ** 2}
    k = compression.num_selected(d, self.run_density)
    counts = {name: np.asarray(fn(p_dev)) for name, fn in self._count_fns.items()}
    rec["gaussian_count_over_k"] = {name: float(c.mean() / k) for name, c in counts.items()}
    rec["gaussian_in_band"] = {  # fraction of workers with 2k/3 <= count <= 4k/3
        name: float(np.mean((3 * c >= 2 * k) & (3 * c <= 4 * k))) for name, c in counts.items()}
    self.records.append(rec)
    if step in self.hist_steps:
      x = p[0]
      lim = float(np.max(np.abs(x - x.mean()))) or 1.0
      hist, edges = np.histogram(x, bins=121, range=(x.mean() - lim, x.mean() + lim),
                                 density=True)
      self.histograms.append({"step": step, "mean": float(x.mean()), "std": float(x.std()),
                              "hist": hist.tolist(), "edges": edges.tolist()})


def run_grid(a) -> dict:
  runs = {}
  grid = [("none", 1.0, False)] + [(c, dens, ef) for dens in a.densities for c in COMPRESSORS
                                   for ef in (True, False)]
  if a.only:
    grid = [g for g in grid if g[0] == "none" or g[0] in a.only]
  hist_steps = tuple(sorted({0, a.steps // 10, a.steps // 2, a.steps}))
  probes = [GradientProbe(a.probe_every, tuple(a.densities), hist_steps, dens)
            if name != "none" else None for name, dens, ef in grid]
  t = time.time()
  summaries = train.train_runs(  # one call: one compiled program per structure
      [make_config(name, dens, ef, a) for name, dens, ef in grid],
      hooks=[(probe,) if probe else () for probe in probes])
  share = (time.time() - t) / len(grid)
  for (name, dens, ef), probe, s in zip(grid, probes, summaries):
    key = run_name(name, dens, ef)
    if s.get("stopped") == "diverged":
      raise train.TrainingDiverged(f"{key}: {s.get('error')}")
    runs[key] = {
        "compressor": name, "density": dens, "error_feedback": ef,
        "test_accuracy": s["test_accuracy"], "train_loss": s["train_loss"],
        "bytes_sent": s["bytes_sent"], "history": s["history"],
        "model_params": s["model_params"], "real_seconds": share,
        "probe": probe.records if probe else None,
        "histograms": probe.histograms if probe else None}
    print(f"  {key:22s} acc {s['test_accuracy']:.4f}  train loss {s['train_loss']:.4f}  "
          f"{s['bytes_sent'] / 1e6:9.2f} MB/worker  ({share:.0f} s real, a share)", flush=True)
  return runs


# ----------------------------------------------------------------------------- plots


COLORS = {"none": "k", "top_k": "C0", "gaussian_k": "C1", "random_k": "C2"}


def plot_accuracy_vs_bytes(runs: dict, path: str) -> None:
  plt = common.pyplot()
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.5))
  markers = {0.01: "o", 0.001: "s"}
  for key, r in runs.items():
    c = COLORS[r["compressor"]]
    mk = "*" if r["compressor"] == "none" else markers.get(r["density"], "D")
    ax0.scatter(r["bytes_sent"] / 1e6, 100 * r["test_accuracy"], color=c, marker=mk, s=70,
                facecolors=c if (r["error_feedback"] or r["compressor"] == "none") else "none",
                label=key)
    if r["compressor"] == "none" or r["error_feedback"]:
      h = r["history"]
      ax1.plot([max(x["bytes_sent"], 1.0) / 1e6 for x in h],
               [100 * x["test_accuracy"] for x in h], color=c,
               ls="-" if r["density"] != 0.001 else "--", marker=".", label=key)
  for ax in (ax0, ax1):
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per worker (cumulative)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
  ax0.set_title("final accuracy vs bytes (hollow: no error feedback)")
  ax1.set_title("accuracy during training (with error feedback)")
  ax0.legend(fontsize=7, ncol=2)
  ax1.legend(fontsize=7)
  ax1.set_ylim(bottom=50)
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_histograms(runs: dict, key: str, path: str) -> None:
  plt = common.pyplot()
  hs = runs[key]["histograms"]
  fig, axes = plt.subplots(1, len(hs), figsize=(4 * len(hs), 3.6), squeeze=False)
  for ax, h in zip(axes[0], hs):
    e = np.asarray(h["edges"])
    mid = 0.5 * (e[1:] + e[:-1])
    ax.bar(mid, h["hist"], width=e[1] - e[0], color="C0", alpha=0.6, label="p (worker 0)")
    pdf = np.exp(-0.5 * ((mid - h["mean"]) / h["std"]) ** 2) / (h["std"] * math.sqrt(2 * math.pi))
    ax.plot(mid, pdf, "r-", lw=1.2, label="fitted normal")
    ax.set_yscale("log")
    hmax = max(h["hist"])
    ax.set_ylim(bottom=max(min(v for v in h["hist"] if v > 0), hmax * 1e-6), top=hmax * 3)
    ax.set_title(f"step {h['step']}")
    ax.set_xlabel("value")
  axes[0][0].set_ylabel("density")
  axes[0][0].legend(fontsize=8)
  fig.suptitle(f"error-fed vector p = g + e, {key}")
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_topk_bound(runs: dict, keys: list, densities: list, path: str) -> None:
  plt = common.pyplot()
  fig, axes = plt.subplots(1, len(densities), figsize=(6 * len(densities), 4), squeeze=False)
  for ax, dens in zip(axes[0], densities):
    dk = f"{dens:g}"
    b1 = b2 = None
    for i, key in enumerate(keys):
      pr = runs[key]["probe"]
      steps = [r["step"] for r in pr]
      ax.plot(steps, [r["topk"][dk]["ratio_mean"] for r in pr], color=f"C{i}", label=key)
      b1, b2 = pr[0]["topk"][dk]["bound_1"], pr[0]["topk"][dk]["bound_2"]
    ax.axhline(b1, color="k", ls="--", lw=1, label=f"1 - k/d = {b1:.4f}")
    ax.axhline(b2, color="gray", ls=":", lw=1, label=f"(1 - k/d)^2 = {b2:.4f}")
    ax.set_title(f"||p - Top_k(p)||^2 / ||p||^2 at k/d = {dk}")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_gaussian_count(runs: dict, path: str) -> None:
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  i = 0
  for key, r in runs.items():
    if r["compressor"] != "gaussian_k":
      continue
    pr = r["probe"]
    steps = [x["step"] for x in pr]
    for j, v in enumerate(pr[0]["gaussian_count_over_k"]):
      ax.plot(steps, [x["gaussian_count_over_k"][v] for x in pr], color=f"C{i}",
              ls=["-", "--", ":"][j % 3], label=f"{key}, {v} rounds")
    i += 1
  ax.axhspan(2 / 3, 4 / 3, color="gray", alpha=0.15, label="[2k/3, 4k/3]")
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("selected / k (mean over workers)")
  ax.set_title("Gaussian-k: entries selected on p, as a fraction of k")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  common.save_figure(fig, path)


# ----------------------------------------------------------------------------- report


def summarize(runs: dict, densities: list) -> dict:
  dense = runs["dense"]
  table = []
  for key, r in runs.items():
    row = {"run": key, "test_accuracy": r["test_accuracy"], "train_loss": r["train_loss"],
           "mb_sent": r["bytes_sent"] / 1e6,
           "traffic_reduction": dense["bytes_sent"] / r["bytes_sent"] if r["bytes_sent"] else None,
           "accuracy_gap_pp": 100 * (r["test_accuracy"] - dense["test_accuracy"])}
    if r["probe"]:
      pr = r["probe"]
      dk = f"{r['density']:g}"
      row["topk_ratio_mean"] = float(np.mean([x["topk"][dk]["ratio_mean"] for x in pr]))
      row["topk_ratio_max"] = float(np.max([x["topk"][dk]["ratio_max"] for x in pr]))
      row["bound_1"] = pr[0]["topk"][dk]["bound_1"]
      row["bound_2"] = pr[0]["topk"][dk]["bound_2"]
      row["excess_kurtosis_median"] = float(np.median([x["excess_kurtosis"] for x in pr]))
      if r["compressor"] == "gaussian_k":
        row["gaussian_count_over_k"] = {
            v: float(np.mean([x["gaussian_count_over_k"][v] for x in pr]))
            for v in pr[0]["gaussian_count_over_k"]}
        row["gaussian_in_band"] = {
            v: float(np.mean([x["gaussian_in_band"][v] for x in pr]))
            for v in pr[0]["gaussian_in_band"]}
    table.append(row)
  return {"table": table}


def markdown(summary: dict, a) -> str:
  lines = [f"CNN (LeNet-5 style) on mnist10k, {a.workers} workers, All-Reduce SGD, batch 32 per "
           f"worker, {a.steps} steps, lr {a.lr} cosine, momentum 0.9, weight decay 5e-4, seed "
           f"{a.seed}. Bytes: per worker, cumulative (values + int32 indices actually sent, "
           "to n - 1 peers).", "",
           "| run | test acc. | vs dense (pp) | train loss | MB sent | traffic / dense |",
           "|---|---:|---:|---:|---:|---:|"]
  for r in summary["table"]:
    red = f"1/{r['traffic_reduction']:.0f}" if r["traffic_reduction"] else "-"
    lines.append(f"| {r['run']} | {100 * r['test_accuracy']:.2f}% | "
                 f"{r['accuracy_gap_pp']:+.2f} | {r['train_loss']:.4f} | {r['mb_sent']:.2f} | "
                 f"{red} |")
  lines += ["", "Top-k contraction on the error-fed vector p of each run (mean over probes and "
            "workers; max over probes and workers), at the run's density:", "",
            "| run | mean ratio | max ratio | 1 - k/d | (1 - k/d)^2 | excess kurtosis of p (median) |",
            "|---|---:|---:|---:|---:|---:|"]
  for r in summary["table"]:
    if "topk_ratio_mean" in r:
      lines.append(f"| {r['run']} | {r['topk_ratio_mean']:.4f} | {r['topk_ratio_max']:.4f} | "
                   f"{r['bound_1']:.4f} | {r['bound_2']:.4f} | "
                   f"{r['excess_kurtosis_median']:.1f} |")
  g = [r for r in summary["table"] if "gaussian_count_over_k" in r]
  if g:
    variants = list(g[0]["gaussian_count_over_k"])
    lines += ["", "Gaussian-k on p, correction/max rounds: entries selected / k (mean over "
              "probes and workers) and, in parentheses, the fraction of (probe, worker) pairs "
              "inside [2k/3, 4k/3]:", "",
              "| run | " + " | ".join(variants) + " |",
              "|---|" + "---:|" * len(variants)]
    for r in g:
      lines.append(f"| {r['run']} | " + " | ".join(
          f"{r['gaussian_count_over_k'][v]:.2f} ({100 * r['gaussian_in_band'][v]:.0f}%)"
          for v in variants) + " |")
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--workers", type=int, default=8)
  ap.add_argument("--model", default="cnn")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--eval_every", type=int, default=50)
  ap.add_argument("--probe_every", type=int, default=10)
  ap.add_argument("--lr", type=float, default=0.05)
  ap.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.001])
  ap.add_argument("--only", nargs="*", default=None, choices=COMPRESSORS,
                  help="compressors to run (dense always runs)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--replot", action="store_true",
                  help="redraw the plots and tables from OUT/results.json, no training")
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  start = time.time()
  if a.replot:
    with open(os.path.join(a.out, "results.json")) as f:
      results = json.load(f)
    runs, summary = results["runs"], results["summary"]
    a = argparse.Namespace(**{**results["args"], "out": a.out})
  else:
    runs = run_grid(a)
    summary = summarize(runs, a.densities)
    results = {"args": common.repo_relative(vars(a)), "summary": summary, "runs": runs,
               "real_seconds": time.time() - start}
  plot_accuracy_vs_bytes(runs, os.path.join(a.out, "accuracy_vs_bytes.png"))
  ef_keys = [k for k, r in runs.items() if r["error_feedback"] and r["histograms"]]
  if ef_keys:
    hist_key = next((k for k in ef_keys if k.startswith("top_k")), ef_keys[0])
    plot_histograms(runs, hist_key, os.path.join(a.out, "p_histograms.png"))
    plot_topk_bound(runs, ef_keys, a.densities, os.path.join(a.out, "topk_bound.png"))
  if any(r["compressor"] == "gaussian_k" for r in runs.values()):
    plot_gaussian_count(runs, os.path.join(a.out, "gaussian_k_count.png"))
  common.write_results(a.out, results, markdown(summary, a))
  print(f"wrote {a.out}/results.json, results.md and plots in {time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
