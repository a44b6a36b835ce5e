"""Consensus distance and consensus control: the centralized-decentralized gap.

Kong, Lin, Koloskova, Jaggi and Stich, "Consensus Control for Decentralized Deep Learning"
(ICML 2021). Claims: decentralized training loses quality against centralized training; the
consensus distance Xi_t^2 = (1/n) sum_i ||x_i - x_bar||^2 explains the gap; keeping Xi below a
critical value, mostly in the first phase of training, closes it.

    python experiments/reproduce_consensus.py --out docs/consensus

For every setting (``--workers`` x ``--partitions``: iid and Dirichlet(``--alpha``) over
labels), the LeNet-style CNN on mnist10k, ring topology, trains: centralized SGD
(``allreduce``), D-PSGD (``dpsgd``, logging Xi every step: the reference run) and D-PSGD with
consensus control, target = ratio x the reference run's Xi at each step (``--ratios``) or
c x the critical consensus distance Gamma_t estimated on the fly (``--critical_scales``,
:class:`nbsgd_jax.host.consensus.CriticalTarget`, constants ``--critical_form``), always and only in
the first phase. Phases are Kong et al.'s: the intervals between the decays of a step
learning-rate schedule (``--schedule step --milestones 0.5 0.75``, optional ``--warmup``), so
phase 1 ends at the first decay; ``--schedule cosine`` takes the first ``--phase`` of the
steps instead. ``--model`` picks the CNN (default) or the MLP. Every extra gossip and every Xi
measurement (an all-reduce of the model) is charged in bytes and simulated time.

Outputs in ``OUT``: ``results.json``, ``results.md`` (table: final test accuracy, MB sent,
simulated time, extra gossip steps, mean Xi over the first phase, share of the
allreduce-dpsgd gap closed), ``xi_and_accuracy.png`` (Xi_t and accuracy over steps) and
``accuracy_vs_xi.png`` (final accuracy against mean Xi in the first phase); every run's
workdir (metrics.jsonl, steps.jsonl) under ``--runs_dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (experiments/common.py)
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax.host import consensus  # noqa: E402
from nbsgd_jax import train  # noqa: E402


def make_config(a, n: int, partition: str, algorithm: str, **kw):
  c = config_lib.default_config()
  c.algorithm = algorithm
  c.num_workers = n
  c.topology = "ring"
  c.model = a.model
  c.batch_size = a.batch_total // n
  c.learning_rate = a.lr
  c.lr_schedule = a.schedule
  if a.schedule == "step":  # Kong et al.: phases are the intervals between step decays
    c.lr_milestones = tuple(a.milestones)
  c.warmup_steps = a.warmup
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.num_steps = a.steps
  c.eval_every = a.eval_every
  c.eval_train_examples = 1000
  c.partition = partition
  c.dirichlet_alpha = a.alpha
  c.seed = a.seed
  c.progress = False
  c.consensus.log_every_step = True
  return config_lib.override(c, kw)


def first_phase_end(a) -> int:
  """The first step after the first phase: the first decay of the step schedule (Kong et al.
  2021, Sec. 4: phases are the intervals between learning-rate decays), else ``--phase`` of
  the steps."""
  if a.schedule == "step":
    return int(round(a.milestones[0] * a.steps))  # nbsgd_jax.recipes.optim.milestone_step
  return int(a.phase * a.steps)


def phase_label(a) -> str:
  return "phase 1" if a.schedule == "step" else f"first {a.phase:g}"


def read_steps(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "steps.jsonl")) as f:
    return [json.loads(l) for l in f if l.strip()]


# A key added after a run was stored takes its default (new keys keep the old behaviour by
# default), except these consensus.* keys, whose default changed what critical-target runs do.
LATER_CRITICAL_KEYS = ("critical_ema",)


def finished_run(workdir: str, cfg) -> dict | None:
  """The summary (with ``history``) of a finished run in ``workdir`` with exactly this
  config, or None."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      old = json.load(f)
    new = json.loads(cfg.to_json_best_effort())
    defaults = json.loads(config_lib.default_config().to_json_best_effort())
    if new["consensus"]["critical"]:  # a later key that changed what critical runs do
      for key in LATER_CRITICAL_KEYS:
        defaults["consensus"].pop(key)

    def fill(stored, default):  # keys added since the run was stored: their defaults
      for k, v in default.items():
        if isinstance(v, dict) and isinstance(stored.get(k), dict):
          fill(stored[k], v)
        else:
          stored.setdefault(k, v)

    fill(old, defaults)
    for c in (old, new):
      c.pop("overwrite", None)  # how the run was started, not what it is
      c.pop("provenance", None)  # what made the run (nbsgd_jax.core.provenance), not what it is
    same = old == new
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    same = same and summary.get("step") == cfg.num_steps
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      summary["history"] = [json.loads(l) for l in f if l.strip()]
  except (OSError, ValueError):
    return None
  return summary if same else None


def train_stage(a, n: int, partition: str, base: str, plan: list) -> dict:
  """``{name: (workdir, summary, real seconds)}`` of the runs ``plan`` (``[(name, algorithm,
  overrides)]``): those finished before (``--reuse``) read back, the others trained as one
  call (``nbsgd_jax.train.train_runs``: one compiled program per structure) into
  ``base/<name>/``; a run's seconds are its share of the call's."""
  out, todo = {}, []
  for name, algo, kw in plan:
    dirname = "".join(ch for ch in name.replace(" ", "_") if ch not in "(),")
    wd = os.path.join(base, dirname)
    s = finished_run(wd, make_config(a, n, partition, algo, **kw)) if a.reuse else None
    if s is not None:
      out[name] = (wd, s, 0.0)
      continue
    cfg = make_config(a, n, partition, algo, **kw)
    cfg.overwrite = True  # replace what an earlier invocation left in the workdir
    todo.append((name, dirname, cfg))
  t = time.time()
  summaries = train.train_runs([c for *_, c in todo], base, [d for _, d, _ in todo])
  for (name, dirname, _), s in zip(todo, summaries):
    out[name] = (os.path.join(base, dirname), s, (time.time() - t) / len(todo))
  return out


def run_setting(a, n: int, partition: str) -> dict:
  tag = f"n{n}_{partition}"
  base = os.path.join(a.runs_dir or os.path.join(a.out, "runs"), tag)
  phase_end = first_phase_end(a)
  plan = [("allreduce", "allreduce", {}), ("dpsgd", "dpsgd", {})]
  for measure in a.measures:
    for r in a.ratios:
      ctl = {"consensus.control": True, "consensus.target_ratio": r,
             "consensus.reference_workdir": os.path.join(base, "dpsgd"),
             "consensus.max_gossip_steps": a.max_gossip_steps, "consensus.measure": measure,
             "consensus.sketch_size": a.sketch_size}
      tag_m = "" if measure == "exact" else ", sketch"
      if "always" in a.control_phases:
        plan.append((f"control {r:g}x (always{tag_m})", "dpsgd", ctl))
      if "first" in a.control_phases:
        plan.append((f"control {r:g}x ({phase_label(a)}{tag_m})", "dpsgd",
                     {**ctl, "consensus.until_step": phase_end}))
    for c in a.critical_scales:
      ctl = {"consensus.control": True, "consensus.critical": True,
             "consensus.critical_scale": c, "consensus.max_gossip_steps": a.max_gossip_steps,
             "consensus.measure": measure, "consensus.sketch_size": a.sketch_size,
             "consensus.smoothness_every": a.smoothness_every,
             "consensus.critical_form": a.critical_form}
      tag_m = "" if measure == "exact" else ", sketch"
      if a.smoothness_every != 100:  # its own workdir beside the default's
        tag_m += f", L every {a.smoothness_every}"
      if "always" in a.control_phases:
        plan.append((f"control {c:g} Gamma (always{tag_m})", "dpsgd", ctl))
      if "first" in a.control_phases:
        plan.append((f"control {c:g} Gamma ({phase_label(a)}{tag_m})", "dpsgd",
                     {**ctl, "consensus.until_step": phase_end}))
  done = {}  # the baselines first: the controlled runs read D-PSGD's records
  for stage in (plan[:2], plan[2:]):
    done.update(train_stage(a, n, partition, base, stage))
  runs = {}
  for name, algo, kw in plan:
    wd, s, seconds = done[name]
    steps = read_steps(wd) if algo != "allreduce" else []
    xi = [r["consensus_distance"] for r in steps]
    targets = [r["target"] for r in steps[:phase_end] if r.get("target") is not None]
    runs[name] = {
        "workdir": wd, "test_accuracy": s["test_accuracy"], "train_loss": s["train_loss"],
        "bytes_sent": s["bytes_sent"], "sim_time": s["sim_time"],
        "extra_gossip_steps": s.get("extra_gossip_steps", 0),
        "mean_xi_first_phase": float(np.mean(xi[:phase_end])) if xi else 0.0,
        "mean_target_first_phase": float(np.mean(targets)) if targets else None,
        "xi": xi, "history": s["history"]}
    print(f"  {tag:12s} {name:26s} acc {s['test_accuracy']:.4f}  "
          f"{s['bytes_sent'] / 1e6:8.1f} MB  sim {s['sim_time']:7.2f} s  "
          f"Xi(first phase) {runs[name]['mean_xi_first_phase']:.4f}  "
          f"({seconds:.0f} s real)", flush=True)
  gap = runs["allreduce"]["test_accuracy"] - runs["dpsgd"]["test_accuracy"]
  for v in runs.values():
    v["gap_closed"] = ((v["test_accuracy"] - runs["dpsgd"]["test_accuracy"]) / gap
                       if gap > 0 else None)
  return {"num_workers": n, "partition": partition, "gap_pp": 100 * gap,
          "phase_end_step": phase_end, "runs": runs}


def plot_curves(settings: list, path: str) -> None:
  plt = common.pyplot()
  fig, axes = plt.subplots(2, len(settings), figsize=(5.5 * len(settings), 8), squeeze=False)
  colors = plt.get_cmap("tab20")  # distinct colours for up to 20 runs
  for j, st in enumerate(settings):
    ax0, ax1 = axes[0][j], axes[1][j]
    for i, (name, r) in enumerate(st["runs"].items()):
      if r["xi"]:  # zeros: steps where nothing was measured (results of older versions)
        xi = np.array([np.nan if not v else v for v in r["xi"]], float)
        ax0.plot(np.arange(1, len(xi) + 1), xi, color=colors(i), lw=0.8, label=name)
      h = r["history"]
      ax1.plot([x["step"] for x in h], [100 * x["test_accuracy"] for x in h], "o-",
               color=colors(i), ms=3, label=name)
    ax0.axvline(st["phase_end_step"], color="gray", ls=":", lw=1)
    ax0.set_yscale("log")
    ax0.set_title(f"n = {st['num_workers']}, {st['partition']}: consensus distance Xi_t")
    ax0.set_xlabel("step")
    ax1.set_title("test accuracy (averaged model)")
    ax1.set_xlabel("step")
    ax1.set_ylim(bottom=max(0, min(100 * x["test_accuracy"] for r in st["runs"].values()
                                   for x in r["history"][1:]) - 2))
    ax0.legend(fontsize=7)
    ax1.legend(fontsize=7)
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_scatter(settings: list, path: str) -> None:
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for j, st in enumerate(settings):
    xs = [r["mean_xi_first_phase"] for k, r in st["runs"].items() if k != "allreduce"]
    ys = [100 * r["test_accuracy"] for k, r in st["runs"].items() if k != "allreduce"]
    ax.scatter(xs, ys, color=f"C{j}", label=f"n = {st['num_workers']}, {st['partition']}")
    ax.axhline(100 * st["runs"]["allreduce"]["test_accuracy"], color=f"C{j}", ls=":", lw=1)
  ax.set_xlabel("mean Xi over the first phase")
  ax.set_ylabel("final test accuracy (%)")
  ax.set_title("accuracy vs consensus distance (dotted: allreduce)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  common.save_figure(fig, path)


def markdown(settings: list, a) -> str:
  schedule = getattr(a, "schedule", "cosine")
  if schedule == "step":
    sched = (f"step decays x0.1 at {', '.join(f'{m:g}' for m in a.milestones)} of the steps"
             + (f" after {a.warmup} warm-up steps" if getattr(a, "warmup", 0) else ""))
    phase = f"phase 1 = the steps before the first decay (step {first_phase_end(a)})"
  else:
    sched, phase = "cosine", f"first phase = first {a.phase:g} of the steps"
  lines = [f"{getattr(a, 'model', 'cnn')} on mnist10k, ring, {a.steps} steps, total batch "
           f"{a.batch_total} (per worker {a.batch_total} / n), lr {a.lr} {sched}, momentum 0.9, "
           f"weight decay 5e-4, seed {a.seed}; control: K = {a.max_gossip_steps} extra gossip "
           f"steps at most, exact Xi measurement (an all-reduce of the model, charged); "
           f"{phase}."]
  if getattr(a, "critical_scales", None):
    # runs stored before --critical_form existed used the config's default then, "paper"
    form = getattr(a, "critical_form", "paper")
    gamma = {"paper": "eta sigma^2 / (L n) + ||grad f||^2 / (8 L^2) (Kong et al. 2021, "
                      "Prop. 3.1; consensus.critical_form = paper)",
             "derived": "||grad f||^2 / (2 L^2) + eta sigma^2 / (L n) (the descent-lemma "
                        "form, consensus.critical_form = derived)"}[form]
    lines += ["", "`control c Gamma`: target c x Gamma_t, the critical consensus distance "
              f"Gamma_t^2 = {gamma} (nbsgd_jax.host.consensus), "
              f"with ||grad f||^2 and sigma^2 from a sketch all-reduce of the gradients "
              f"(r = {a.sketch_size} coordinates, charged) of every controlled step, averaged "
              "over steps (moving average, decay consensus.critical_ema = 0.9), and L from 20 "
              "Hessian-vector power iterations on the averaged model every "
              f"{getattr(a, 'smoothness_every', 100)} steps (host compute, not charged)."]
  lines.append("")
  for st in settings:
    lines += [f"n = {st['num_workers']}, {st['partition']} (allreduce - dpsgd gap "
              f"{st['gap_pp']:.2f} points):", "",
              "| run | test acc. | MB / worker | sim time (s) | extra gossip | mean Xi, first "
              "phase | gap closed |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in st["runs"].items():
      gc = "-" if r["gap_closed"] is None else f"{100 * r['gap_closed']:.0f}%"
      lines.append(f"| {name} | {100 * r['test_accuracy']:.2f}% | {r['bytes_sent'] / 1e6:.1f} | "
                   f"{r['sim_time']:.2f} | {r['extra_gossip_steps']} | "
                   f"{r['mean_xi_first_phase']:.4f} | {gc} |")
    crit = [(k, r["mean_target_first_phase"]) for k, r in st["runs"].items()
            if "Gamma" in k and r.get("mean_target_first_phase") is not None]
    if crit:
      lines += ["", "Mean target over the first phase (estimated c x Gamma_t): " + ", ".join(
          f"{k}: {v:.4f}" for k, v in crit) + "."]
    lines.append("")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--workers", type=int, nargs="+", default=[16, 32])
  ap.add_argument("--partitions", nargs="+", default=["dirichlet", "iid"])
  ap.add_argument("--alpha", type=float, default=0.1)
  ap.add_argument("--steps", type=int, default=400)
  ap.add_argument("--eval_every", type=int, default=50)
  ap.add_argument("--batch_total", type=int, default=256)
  ap.add_argument("--lr", type=float, default=0.05)
  ap.add_argument("--ratios", type=float, nargs="*", default=[0.5])
  ap.add_argument("--critical_scales", type=float, nargs="*", default=[],
                  help="c of the runs with target c x Gamma_t (critical consensus distance)")
  ap.add_argument("--critical_form", default=config_lib.default_config().consensus.critical_form,
                  choices=list(consensus.CRITICAL_FORMS),
                  help="Gamma_t's constants (consensus.critical_form)")
  ap.add_argument("--smoothness_every", type=int, default=100,
                  help="critical runs: re-estimate L every this many steps")
  ap.add_argument("--schedule", default="step", choices=["step", "cosine"],
                  help="step: decays x0.1 at --milestones, phase 1 ends at the first")
  ap.add_argument("--milestones", type=float, nargs="+", default=[0.5, 0.75])
  ap.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
  ap.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
  ap.add_argument("--phase", type=float, default=0.25,
                  help="cosine schedule only: the first phase as a fraction of the steps")
  ap.add_argument("--control_phases", nargs="+", default=["always", "first"],
                  choices=["always", "first"],
                  help="controlled runs: at every step and/or in the first phase only")
  ap.add_argument("--max_gossip_steps", type=int, default=10)
  ap.add_argument("--measures", nargs="+", default=["exact"], choices=["exact", "sketch"],
                  help="Xi measurement of the controlled runs (each adds its runs)")
  ap.add_argument("--sketch_size", type=int, default=1024)
  ap.add_argument("--seed", type=int, default=0, help="init, data order, partition and delays")
  ap.add_argument("--runs_dir", default="runs/consensus",
                  help="where the runs' workdirs go (default runs/consensus, not versioned)")
  ap.add_argument("--reuse", action="store_true",
                  help="take a run whose workdir holds a finished run of the same config")
  ap.add_argument("--replot", action="store_true",
                  help="redraw the plots and tables from OUT/results.json, no training")
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  start = time.time()
  if a.replot:
    with open(os.path.join(a.out, "results.json")) as f:
      results = json.load(f)
    settings = results["settings"]
    old = argparse.Namespace(**{**results["args"], "out": a.out})
    plot_curves(settings, os.path.join(a.out, "xi_and_accuracy.png"))
    plot_scatter(settings, os.path.join(a.out, "accuracy_vs_xi.png"))
    common.write_results(a.out, results, markdown(settings, old))
    return
  settings = []
  for n in a.workers:
    for part in a.partitions:
      settings.append(run_setting(a, n, part))
      plot_curves(settings, os.path.join(a.out, "xi_and_accuracy.png"))
      plot_scatter(settings, os.path.join(a.out, "accuracy_vs_xi.png"))
      results = {"args": common.repo_relative(vars(a)), "settings": settings,
                 "real_seconds": time.time() - start}
      common.write_results(a.out, results, markdown(settings, a))
  print(f"wrote {a.out}/results.json, results.md and plots in {time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
