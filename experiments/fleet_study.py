"""Clusters like real fleets (issue 58, item 7): what each algorithm keeps of its throughput on
a geo-distributed fleet with fail-slow episodes and failures at published rates.

    python experiments/fleet_study.py --out docs/fleet
    python experiments/fleet_study.py --out /tmp/fleet --quick    # a minute-long smoke run

The fleet (``fleet()``): n workers in R regions (``--regions``), 8 to a node; an NVLink-class
link in a node (1 us, 300 GB/s), a datacenter link in a region (10 us, 25 GB/s) and a
wide-area link between regions (PCCL's measured transatlantic 25 Gbit/s, 30 ms). Each message
takes the time the modelled model's would (``--model_params``, 1B float32 parameters: the
bandwidths are scaled by the workload's model bytes over the modelled model's), and a step
computes for ``--step_s`` s at full speed. The workload is linear least squares on
heterogeneous shards (``gap`` = F - F*), small enough for 1,024 simulated workers on a CPU.

Fleet events (``--kappa``-fold time-compressed: rates x kappa, durations / kappa, so the same
fraction of time is slow or down, in events short enough for a short run): fail-slow episodes
at Greyhound's (ATC '25) 0.03 per node-hour, median 21 min, sigma 1.5, 1.5x slower
(``docs/clock.md``), and failures at Llama 3's 50,700 h per GPU with 10-minute repairs
(``docs/clock.md``), elastic (a joiner fetches the model). The event-clock methods (AD-PSGD,
asynchronous DiLoCo, HALoS) run without failures (the event clock refuses them): episodes
only, said in the table.

Methods: all-reduce flat and hierarchical (reduce-scatter in a region, all-reduce across),
Non-blocking SGD (4 mini-batches, the fastest worker's deadline), backup workers (a quorum of
n - n / 16, one mini-batch), AD-PSGD (exponential graph), DiLoCo (H), asynchronous DiLoCo,
elastic DiLoCo (a quorum of 90 % with a 10 % step grace, joiners fetch), HALoS (an LPS per
region). Each method's learning rate is tuned on ``--tune_seed`` (fleet, not reported) by the
final gap; the reported seeds run on the fleet and on a clean cluster (no episodes, no
failures, the same draws otherwise). Reported per method and scale: the time to the target
(the gap all-reduce reaches on the clean cluster at a quarter of its budget), clean time to
target / fleet time to target, and the throughput it keeps: its gradients per simulated second
on the fleet over those on the clean cluster (the same budget). Runs are cached under ``OUT/runs``
(each method's as it ends): the study resumes where it stopped; a scale already in
``OUT/results.json`` with the same settings is kept, so adding a scale runs only that scale.
``--methods`` trains a subset into the cache only (two processes can share a scale's methods).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import common  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402

# besides the inner rate: HALoS's regional rate around the reference's 3.2 (run_halos.sh: lr
# 0.2 x its buffer 16). The delayed Nesterov step divides the buffer's pushes by its size, so
# the rate acts on their mean whatever the buffer: a grid scaled with the workers of a region
# (0.05, 0.2 and 0.8 x the buffer) put every point of the 1,024-worker scale past divergence
TUNED = {"halos": {"halos.lps_lr": lambda a, n: [0.8, 3.2, 12.8]}}
KEEP = ("step", "grads_per_worker", "sim_time", "bytes_sent", "gap", "train_loss")
GREYHOUND = {"rate": 0.03, "median": 1260.0, "sigma": 1.5, "factor": 1.5}
LLAMA3 = {"mtbf_h": 50_700.0, "repair_s": 600.0}


def workload_bytes(a) -> float:
  return 4.0 * a.dim  # least squares: one weight per dimension, float32


def fleet(a, n: int, events: bool, failures: bool) -> dict:
  """The cluster's config keys (module docstring)."""
  scale = workload_bytes(a) / (4.0 * a.model_params)
  per = n // a.regions
  node = min(8, per)  # a level's size counts the groups of the level inside it
  levels = (f"{node}:1e-6:{300e9 * scale:g}",) + (
      (f"{per // node}:1e-5:{25e9 * scale:g}",) if per // node > 1 else ())
  out = {"cluster.levels": levels, "cluster.latency": 0.03,
         "cluster.bandwidth": 25e9 / 8 * scale, "cluster.time_per_example": a.step_s / a.batch}
  if events:
    out.update({"cluster.episode_rate": GREYHOUND["rate"] / 8 * a.kappa,  # per worker
                "cluster.episode_median": GREYHOUND["median"] / a.kappa,
                "cluster.episode_sigma": GREYHOUND["sigma"],
                "cluster.episode_factor": GREYHOUND["factor"]})
  if failures:
    out.update({"cluster.failure_mtbf": LLAMA3["mtbf_h"] / a.kappa,
                "cluster.failure_repair": LLAMA3["repair_s"] / a.kappa,
                "cluster.rejoin_fetch": True})
  return out


def methods(a, n: int) -> dict:
  """name -> (config overrides, runs on the event clock). HALoS keeps the reference's ratios
  to the workers a regional server holds (4 in run_halos.sh: a buffer of 16, K = 32); its
  regional rate is tuned with the inner one (:data:`TUNED`): the reference's fixed values
  (3.2 with a buffer of 16, K = 32) made its servers sum far more pushes per momentum step
  with 16 or 64 workers a region, and it diverged."""
  per, h = n // a.regions, a.h
  quorum = int(np.ceil(0.9 * n))
  return {
      "allreduce": ({"algorithm": "allreduce"}, False),
      "allreduce_hier": ({"algorithm": "allreduce", "cluster.allreduce_group_size": per}, False),
      "nonblocking": ({"algorithm": "allreduce", "nonblocking.enabled": True,
                       "nonblocking.num_minibatches": 4}, False),
      "backup": ({"algorithm": "allreduce", "nonblocking.enabled": True,
                  "nonblocking.num_minibatches": 1,
                  "nonblocking.deadline": f"kth:{n - max(n // 16, 1)}"}, False),
      "ad_psgd": ({"algorithm": "ad_psgd", "topology": "exponential"}, True),
      "diloco": ({"algorithm": "diloco", "diloco.local_steps": h}, False),
      "async_diloco": ({"algorithm": "async_diloco", "diloco.local_steps": h}, True),
      "elastic_diloco": ({"algorithm": "diloco", "diloco.local_steps": h,
                          "nonblocking.enabled": True, "nonblocking.num_minibatches": 1,
                          "nonblocking.deadline": f"kth:{quorum}:{0.1 * a.step_s:g}"}, False),
      # the reference's ratios (4 workers a region): a buffer of 4 and K of 8 pushes a worker
      "halos": ({"algorithm": "halos", "halos.regions": a.regions, "halos.local_steps": h,
                 "halos.lps_buffer": 4 * per, "halos.accumulation": 8 * per}, True),
  }


def candidates(a, name: str, n: int) -> list[dict]:
  """The tuning grid of a method: the inner rates, times :data:`TUNED`'s values."""
  out = [{"learning_rate": lr} for lr in a.lrs]
  for key, values in TUNED.get(name, {}).items():
    out = [{**c, key: v} for c in out for v in values(a, n)]
  return out


def _label(point: dict) -> str:
  return ",".join(f"{k.split('.')[-1]}={v:g}" for k, v in point.items())


def config(a, n: int, name: str, seed: int, point: dict, clean: bool):
  over, event = methods(a, n)[name]
  c = config_lib.default_config()
  base = {"dataset": "least_squares", "problem.shards": n, "problem.examples_per_worker": 64,
          "problem.dim": a.dim, "problem.noise": 0.5, "problem.heterogeneity": 1.0,
          "problem.l2": 0.0, "problem.seed": 0, "num_workers": n, "batch_size": a.batch,
          "momentum": 0.0, "seed": seed, "cluster.seed": seed, "progress": False,
          "budget_unit": "grads_per_worker", "num_steps": a.steps, "eval_every": a.eval_every}
  return config_lib.override(c, {**base, **fleet(a, n, not clean, not clean and not event),
                                 **over, **point})


def _runs(a, cfgs: dict) -> dict:
  keys = list(cfgs)
  got = common.cached_histories([cfgs[k] for k in keys], KEEP, os.path.join(a.out, "runs"))
  return dict(zip(keys, got))


def _final_gap(r) -> float:
  v = r["history"][-1].get("gap", float("nan"))
  return v if np.isfinite(v) else float("inf")


def _same_study(a, old: dict) -> bool:
  """Whether ``old`` (a results.json) ran the settings of ``a`` except its scales."""
  skip = ("out", "quick", "report", "workers", "redo", "tune_only")
  mine = {k: v for k, v in vars(a).items() if k not in skip}
  return all(old.get("settings", {}).get(k) == v for k, v in mine.items())


def previous(a) -> dict:
  """The scales ``OUT/results.json`` already holds for these settings (scale -> its entry), so
  that a study extended by a scale does not rerun the others: the run cache (``OUT/runs``)
  is not committed, the results are."""
  path = os.path.join(a.out, "results.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    old = json.load(f)
  return dict(old.get("scales", {})) if _same_study(a, old) else {}


def _per_method(a, cfgs: dict) -> dict:
  """:func:`_runs` one method at a time (keys start with the method's name): each method's
  runs are one call, cached as it ends, so a long scale resumes at the method it stopped in."""
  out = {}
  for m in dict.fromkeys(k[0] for k in cfgs):
    out.update(_runs(a, {k: c for k, c in cfgs.items() if k[0] == m}))
    print(f"  {m}: {sum(k[0] == m for k in cfgs)} runs", flush=True)
  return out


def study(a) -> dict:
  res = {"command": common.repo_relative("python experiments/fleet_study.py "
                                         + " ".join(sys.argv[1:])),
         "settings": common.repo_relative(vars(a)), "scales": {}}
  done = previous(a)
  for n in a.workers:
    if str(n) in done and not a.methods:
      res["scales"][str(n)] = scale = done[str(n)]
      print(f"n = {n}: from {a.out}/results.json" + (f", {a.redo} again" if a.redo else ""),
            flush=True)
      if a.redo:
        new = _scale(a, n, a.redo)
        scale["picks"].update(new["picks"])
        scale["runs"] = {**{k: r for k, r in scale["runs"].items()
                            if k.split("/")[0] not in a.redo}, **new["runs"]}
        save(a, res)
      continue
    names = [m for m in methods(a, n) if not a.methods or m in a.methods]
    res["scales"][str(n)] = _scale(a, n, names)
    if not a.methods:  # a subset only fills the run cache: results.json keeps every method
      save(a, res)  # each scale as it ends
  return res


def _scale(a, n: int, names: list) -> dict:
  """One scale's tuning and reported runs of the methods ``names``."""
  grid = {m: candidates(a, m, n) for m in names}
  tune = _per_method(a, {(m, _label(p)): config(a, n, m, a.tune_seed, p, False)
                         for m in names for p in grid[m]})
  if a.tune_only:
    return {"picks": {}, "runs": {}}
  picks = {m: min(grid[m], key=lambda p: _final_gap(tune[(m, _label(p))])) for m in names}
  runs = _per_method(a, {(m, s, clean): config(a, n, m, s, picks[m], clean)
                         for m in names for s in a.seeds for clean in (False, True)})
  edge = lambda m: any(  # noqa: E731
      picks[m][k] in (min(v), max(v)) for k, v in
      [("learning_rate", a.lrs)] + [(k, f(a, n)) for k, f in TUNED.get(m, {}).items()])
  scale = {"picks": {m: {"point": picks[m], "edge": edge(m),
                         "tuning": {_label(p): _final_gap(tune[(m, _label(p))])
                                    for p in grid[m]}}
                     for m in names},
           "runs": {f"{m}/{s}/{'clean' if c else 'fleet'}": r
                    for (m, s, c), r in runs.items()}}
  print(f"n = {n}: {len(tune) + len(runs)} runs", flush=True)
  return scale


def save(a, res: dict) -> None:
  common.write_results_json(os.path.join(a.out, "results.json"), res)
  common.write_atomic(os.path.join(a.out, "results.md"), markdown(res))


def targets(res: dict, n: str) -> dict:
  """seed -> the gap clean all-reduce reaches at a quarter of its budget (the local and
  asynchronous methods' floor on heterogeneous shards lies above what it reaches later)."""
  out = {}
  for key, r in res["scales"][n]["runs"].items():
    m, s, kind = key.split("/")
    if m == "allreduce" and kind == "clean":
      h = r["history"]
      mid = h[-1]["grads_per_worker"] / 4
      out[s] = min(x["gap"] for x in h if x["grads_per_worker"] <= mid)
  return out


def table(res: dict, n: str) -> list[str]:
  runs, tgt = res["scales"][n]["runs"], targets(res, n)
  events = {m for m, (_, e) in methods(argparse.Namespace(**res["settings"]), int(n)).items()
            if e}
  lines = [f"### {n} workers", "",
           "| method | tuned | time to target, fleet (s) | clean (s) | clean / fleet | "
           "gradients / s kept | final gap, fleet | MB per worker |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for m, pick in res["scales"][n]["picks"].items():
    fl, cl, kept, rate, gaps, mb = [], [], [], [], [], []
    for s in res["settings"]["seeds"]:
      f, c = runs.get(f"{m}/{s}/fleet"), runs.get(f"{m}/{s}/clean")
      if f is None or c is None or str(s) not in tgt:
        continue
      tf, tc = (common.time_to(f["history"], tgt[str(s)], "gap"),
                common.time_to(c["history"], tgt[str(s)], "gap"))
      fl.append(np.nan if tf is None else tf)
      cl.append(np.nan if tc is None else tc)
      kept.append(np.nan if tf is None or tc is None else tc / tf)
      end_f, end_c = f["history"][-1], c["history"][-1]
      rate.append((end_f["grads_per_worker"] / end_f["sim_time"])
                  / (end_c["grads_per_worker"] / end_c["sim_time"]))
      gaps.append(end_f["gap"])
      mb.append(f["history"][-1]["bytes_sent"] / 1e6)
    if not fl:
      continue
    st = lambda v: (f"{np.nanmean(v):.3g} +- {np.nanstd(v, ddof=1):.2g}" if  # noqa: E731
                    np.isfinite(v).sum() > 1 else f"{np.nanmean(v):.3g}")
    name = m + (" (episodes only)" if m in events else "")
    lines.append(f"| {name} | {_label(pick['point'])}{' (edge)' if pick['edge'] else ''} | "
                 f"{st(fl)} | "
                 f"{st(cl)} | {st(kept)} | {st(rate)} | {st(gaps)} | {np.mean(mb):.4g} |")
  return lines + [""]


def markdown(res: dict) -> str:
  s = res["settings"]
  lines = [f"`{res['command']}`", "", __doc__.split("\n\n", 2)[2].split("\n\n")[0], "",
           f"Settings: R = {s['regions']} regions, H = {s['h']}, {s['steps']} gradients per "
           f"worker, batch {s['batch']}, a step {s['step_s']} s, modelled model "
           f"{s['model_params']:g} parameters, kappa = {s['kappa']:g}; learning rates "
           f"{s['lrs']} tuned on seed {s['tune_seed']}; seeds {s['seeds']} reported "
           "(mean +- std, ddof = 1; nan: not reached).", ""]
  for n in res["scales"]:
    lines += table(res, n)
  lines += [f"![gap against simulated time, {n} workers](gap_vs_time_{n}.png)"
            for n in res["scales"]]
  lines += ["", f"Wall time: {res.get('seconds', 0):.0f} s.", ""]
  return "\n".join(lines)


def plots(res: dict, out: str) -> None:
  """The gap against simulated time per method (mean over the reported seeds, fleet solid,
  clean dashed), one figure per scale: ``OUT/gap_vs_time_<n>.png``."""
  plt = common.pyplot()
  for n, sc in res["scales"].items():
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, m in enumerate(sc["picks"]):
      for kind, style in (("fleet", "-"), ("clean", "--")):
        runs = [sc["runs"].get(f"{m}/{s}/{kind}") for s in res["settings"]["seeds"]]
        runs = [r for r in runs if r is not None]
        if not runs:
          continue
        k = min(len(r["history"]) for r in runs)
        t = np.mean([[h["sim_time"] for h in r["history"][:k]] for r in runs], axis=0)
        g = np.mean([[h["gap"] for h in r["history"][:k]] for r in runs], axis=0)
        ax.plot(t, g, style, color=f"C{i % 10}", label=m if kind == "fleet" else None)
    ax.set_yscale("log")
    ax.set_xlabel("simulated s")
    ax.set_ylabel("gap F - F*, mean over seeds")
    ax.set_title(f"{n} workers in {res['settings']['regions']} regions: fleet (solid), "
                 "clean (dashed)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    common.save_figure(fig, os.path.join(out, f"gap_vs_time_{n}.png"))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--report", action="store_true", help="rewrite results.md and the plots "
                 "from OUT/results.json")
  p.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1024])
  p.add_argument("--regions", type=int, default=4)
  p.add_argument("--methods", nargs="+", default=None, help="train these methods into the "
                 "run cache only (results.json is written by a run of every method)")
  p.add_argument("--redo", nargs="+", default=[], help="these methods again in the scales "
                 "results.json holds (e.g. after a change to their tuning grid)")
  p.add_argument("--tune_only", action="store_true", help="with --methods: the tuning runs "
                 "only (split a scale's tuning between processes by --lrs)")
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  p.add_argument("--tune_seed", type=int, default=3)
  p.add_argument("--lrs", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4])
  p.add_argument("--steps", type=int, default=200, help="gradients per worker")
  p.add_argument("--eval_every", type=int, default=10)
  p.add_argument("--h", type=int, default=10)
  p.add_argument("--dim", type=int, default=32)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--step_s", type=float, default=0.5)
  p.add_argument("--model_params", type=float, default=1e9)
  p.add_argument("--kappa", type=float, default=3000.0)
  a = p.parse_args()
  if a.quick:
    a.workers, a.steps, a.eval_every, a.seeds, a.lrs = [16], 20, 5, [0], [0.05]
  os.makedirs(a.out, exist_ok=True)
  if a.report:
    with open(os.path.join(a.out, "results.json")) as f:
      res = json.load(f)
  else:
    t = time.time()
    res = study(a)
    res["seconds"] = time.time() - t
    if a.methods:
      print(f"--methods: {a.methods} trained into {a.out}/runs; results.json is written by "
            "a run of every method", flush=True)
      return
    save(a, res)
  common.write_atomic(os.path.join(a.out, "results.md"), markdown(res))
  plots(res, a.out)
  print(markdown(res))


if __name__ == "__main__":
  main()
