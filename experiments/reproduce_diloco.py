"""DiLoCo on real text: validation loss against bytes and simulated time, 8 workers.

Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models"
(arXiv:2311.08105). Claim: 8 workers, H = 500 inner AdamW steps per round, an outer Nesterov
SGD step (lr 0.7, momentum 0.9) on the averaged pseudo-gradient, C4, a 150M-parameter
transformer: DiLoCo matches or beats the fully synchronous (data-parallel) baseline's
perplexity while communicating 500x less. Streaming DiLoCo (Douillard et al. 2025,
arXiv:2501.18512): the same quality with P fragments synchronised in turn (a peak bandwidth
1/P of DiLoCo's), also with the all-reduce overlapped with tau inner steps.

    python experiments/reproduce_diloco.py --out docs/diloco                 # the study
    python experiments/reproduce_diloco.py --quick --out /tmp/diloco_quick   # seconds

The language model of ``experiments/configs/lm_diloco.py`` (decoder-only transformer,
character-level, AdamW b2 0.95, weight decay 0.1 on the matrices, warm-up then cosine to
lr / 10, gradients clipped to norm 1) scaled down to this 2-core CPU, on the embedded
``tiny_shakespeare`` text (nanoGPT's split: the first 90 % trains, each worker drawing windows
from its own contiguous eighth; ``test_loss`` is the loss on the whole last 10 %, nats per
character). Every method sees the same tokens: ``--steps`` steps of ``--batch`` windows of
``--context`` characters per worker. Methods (``--methods``):

* ``allreduce``: the synchronous baseline, gradients averaged every step, the same AdamW.
* ``diloco_h{H}`` for H in ``--h`` (DiLoCo, ``diloco.local_steps`` = H).
* ``streaming_p{P}``: Streaming DiLoCo, H = the largest of ``--h``, P = ``--fragments``.
* ``streaming_p{P}_overlap``: the same with ``streaming_diloco.delay`` = ``--delay`` and
  ``streaming_diloco.alpha`` = ``--alpha``.
* ``local_sgd``: local AdamW, plain model averaging every H steps (``local_sgd.local_steps`` = H).
* ``diloco_{codec}``: DiLoCo (H = the largest) whose pseudo-gradient goes through
  ``--compression`` (``compression.*``, with error feedback).

Defaults: 2 layers, d_model 96, 4 heads, context 64 (242,754 parameters), batch 8 per
worker, 800 steps (H = 50: 16 rounds), an evaluation every 100 steps, AdamW lr 2e-3 with 50
warm-up steps; on this shared 2-core CPU about 0.16 s a step (measured with the load of other
jobs), so about 2.5-3 min a run and 35-45 min for the 14 runs of the study.

Each over ``--seeds``; mean +- sample standard deviation (ddof = 1) over the seeds. Outputs in
``OUT``: ``results.json`` (settings, every run's history, per-method aggregates, wall
seconds; rewritten after every run), ``results.md`` and ``loss_vs_bytes.png``,
``loss_vs_time.png``. ``--quick``: a one-layer model, 40 steps, H in {2, 10}, one seed.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs"))

import common  # noqa: E402  (experiments/common.py)

from nbsgd_jax import config as config_lib  # noqa: E402

KEEP = ("step", "sim_time", "wall_time", "bytes_sent", "rounds", "test_loss", "test_accuracy",
        "train_loss")
PAPER = ("Douillard et al. 2023 (arXiv:2311.08105): 8 workers, H = 500 inner AdamW steps, "
         "outer Nesterov SGD (lr 0.7, momentum 0.9), C4, a 150M-parameter transformer: DiLoCo "
         "matches or beats the fully synchronous baseline's perplexity while communicating "
         "500x less.")


def methods(a) -> dict:
  """name -> (config overrides, description), in the order they run."""
  big = max(a.h)
  out = {"allreduce": ({"algorithm": "allreduce"},
                       "all-reduce of the gradients every step (synchronous baseline)")}
  for h in sorted(a.h):
    out[f"diloco_h{h}"] = ({"algorithm": "diloco", "diloco.local_steps": h},
                           f"DiLoCo, H = {h}")
  stream = {"algorithm": "streaming_diloco", "diloco.local_steps": big,
            "streaming_diloco.fragments": a.fragments}
  out[f"streaming_p{a.fragments}"] = (
      stream, f"Streaming DiLoCo, H = {big}, P = {a.fragments}, no overlap")
  out[f"streaming_p{a.fragments}_overlap"] = (
      {**stream, "streaming_diloco.delay": a.delay, "streaming_diloco.alpha": a.alpha},
      f"Streaming DiLoCo, H = {big}, P = {a.fragments}, overlap tau = {a.delay}, "
      f"alpha = {a.alpha}")
  out["local_sgd"] = ({"algorithm": "local_sgd", "local_sgd.local_steps": big},
                      f"local SGD (local AdamW, model averaging every tau = {big} steps)")
  comp = {"compression.name": a.compression}
  what = a.compression
  if a.compression in ("top_k", "gaussian_k", "random_k"):
    comp["compression.density"] = a.density
    what = f"{a.compression} density {a.density}"
  elif a.compression == "qsgd":
    comp["compression.levels"] = a.levels
    what = f"qsgd s = {a.levels}"
  out[f"diloco_{a.compression}"] = (
      {"algorithm": "diloco", "diloco.local_steps": big, **comp},
      f"DiLoCo, H = {big}, pseudo-gradient compressed ({what}, error feedback)")
  if a.methods:
    unknown = [m for m in a.methods if m not in out]
    if unknown:
      raise SystemExit(f"--methods {unknown} unknown: use some of {list(out)}")
    out = {k: out[k] for k in a.methods}
  return out


def base_config(a, seed: int):
  """``experiments/configs/lm_diloco.py`` on the embedded text, scaled by the arguments."""
  import lm_diloco  # noqa: E402  (experiments/configs/lm_diloco.py)
  c = lm_diloco.get_config()
  over = {"dataset": "tiny_shakespeare", "num_workers": a.workers,
          "lm.num_layers": a.layers, "lm.d_model": a.d_model, "lm.num_heads": a.heads,
          "lm.context": a.context, "batch_size": a.batch, "num_steps": a.steps,
          "eval_every": a.eval_every, "eval_train_examples": a.eval_train_examples,
          "learning_rate": a.lr, "lr_min": a.lr * a.lr_min_ratio, "warmup_steps": a.warmup,
          "grad_clip": a.grad_clip, "weight_decay_on": "matrices",
          "diloco.outer_lr": a.outer_lr, "diloco.outer_momentum": a.outer_momentum,
          "diloco.outer_nesterov": True, "seed": seed, "progress": False,
          "partition": a.partition}
  if a.bandwidth:
    over["cluster.bandwidth"] = a.bandwidth
  if a.latency is not None:
    over["cluster.latency"] = a.latency
  return config_lib.override(c, over)


def run_all(cfgs: list) -> list[dict]:
  """The training runs of ``cfgs`` as one call (``common.run_histories``: one compiled
  program per structure): each run's evaluation history (a diverged run: one record of
  NaNs), ``model_params`` and ``periods``."""
  out = common.run_histories(cfgs, KEEP)
  for r in out:
    s = r.pop("summary") or {}
    r["model_params"], r["periods"] = s.get("model_params"), s.get("periods")
  return out


def _stat(values) -> dict:
  v = np.asarray(values, np.float64)
  std = float(v.std(ddof=1)) if v.size > 1 else float("nan")
  return {"mean": float(v.mean()), "std": std, "values": [float(x) for x in v]}


def aggregate(seeds: dict) -> dict:
  """Per method: final values (mean, ddof = 1 std, per seed) and the mean curve over seeds
  (the evaluations every seed has, in step order)."""
  runs = list(seeds.values())
  final = {k: _stat([r["history"][-1].get(k, float("nan")) for r in runs])
           for k in ("test_loss", "test_accuracy", "train_loss", "bytes_sent", "rounds",
                     "sim_time")}
  steps = sorted(set.intersection(*[{h["step"] for h in r["history"]} for r in runs]))
  curve = []
  for st in steps:
    pts = [next(h for h in r["history"] if h["step"] == st) for r in runs]
    curve.append({"step": st, **{k: float(np.mean([p.get(k, float("nan")) for p in pts]))
                                 for k in ("test_loss", "bytes_sent", "sim_time", "rounds")}})
  return {"final": final, "curve": curve,
          "seconds": _stat([r["seconds"] for r in runs]),
          "diverged": sum("diverged" in r for r in runs)}


def study(a, res: dict) -> None:
  """Every method on each seed, a seed's methods trained as one call; ``results.json``
  rewritten after each seed."""
  todo = methods(a)
  for name, (over, desc) in todo.items():
    res["methods"].setdefault(name, {"overrides": over, "description": desc, "seeds": {}})
  for seed in a.seeds:
    done = run_all([config_lib.override(base_config(a, seed), over)
                    for over, _ in todo.values()])
    for name, r in zip(todo, done):
      res["methods"][name]["seeds"][str(seed)] = r
      if r.get("model_params"):
        res["model_params"] = r["model_params"]
      last = r["history"][-1]
      print(f"  {name:24s} seed {seed}: val loss {last['test_loss']:.4f}  "
            f"MB/worker {last['bytes_sent'] / 1e6:9.2f}  rounds {last['rounds']:>5}  "
            f"({r['seconds']:.0f} s)" + ("  DIVERGED" if "diverged" in r else ""), flush=True)
    res["seconds"] = time.time() - res["_start"]
    common.write_results_json(os.path.join(a.out, "results.json"),
                              {k: v for k, v in res.items() if not k.startswith("_")})
  for name in todo:
    res["methods"][name]["summary"] = aggregate(res["methods"][name]["seeds"])


# ----------------------------------------------------------------------------- plots


def plots(res: dict, out: str) -> None:
  plt = common.pyplot()
  for x, fname, label, log in (
      ("bytes_sent", "loss_vs_bytes.png", "MB sent per worker (log)", True),
      ("sim_time", "loss_vs_time.png", "simulated time (s)", False)):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, m) in enumerate(res["methods"].items()):
      c = [p for p in m["summary"]["curve"] if np.isfinite(p["test_loss"])
           and (p[x] > 0 or not log)]
      if not c:
        continue
      scale = 1e6 if x == "bytes_sent" else 1.0
      ax.plot([p[x] / scale for p in c], [p["test_loss"] for p in c], "o-", ms=3,
              color=f"C{i % 10}", label=name)
    if log:
      ax.set_xscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("validation loss (nats/char), mean over seeds")
    s = res["settings"]
    ax.set_title(f"tiny_shakespeare, {s['workers']} workers, {res.get('model_params', '?'):,} "
                 f"params, {s['steps']} steps" if res.get("model_params") else
                 "tiny_shakespeare", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    common.save_figure(fig, os.path.join(out, fname))


# ----------------------------------------------------------------------------- report


def _pm(st: dict, fmt: str = ".4f") -> str:
  if not np.isfinite(st["mean"]):
    return "nan (diverged)"
  if not np.isfinite(st["std"]):
    return f"{st['mean']:{fmt}}"
  return f"{st['mean']:{fmt}} +- {st['std']:{fmt}}"


def markdown(res: dict) -> str:
  s = res["settings"]
  ms = res["methods"]
  seeds = ", ".join(map(str, s["seeds"]))
  tokens = s["steps"] * s["batch"] * s["context"]
  n_params = res.get("model_params")
  size = f"{n_params:,} parameters" if n_params else "size unknown (every run diverged)"
  lines = [
      f"`{res['command']}`", "",
      f"tiny_shakespeare (embedded; nanoGPT split: {s['train_chars']:,} training characters, "
      f"the validation loss on all {s['val_chars']:,} validation characters, nats/char), "
      f"{s['workers']} workers each sampling from its own contiguous 1/{s['workers']} of the "
      f"training text. Model: decoder-only transformer, {s['layers']} layers, d_model "
      f"{s['d_model']}, {s['heads']} heads, context {s['context']}: **{size}** per worker. "
      f"Every run: {s['steps']} steps x {s['batch']} windows x {s['context']} characters = "
      f"{tokens:,} tokens per worker ({s['workers'] * tokens:,} in all, "
      f"{s['workers'] * tokens / s['train_chars']:.1f} passes over the training text). Inner "
      f"optimizer AdamW (lr {s['lr']:g}, b1 0.9, b2 0.95, weight decay 0.1 on the matrices, "
      f"{s['warmup']} warm-up steps then cosine to {s['lr'] * s['lr_min_ratio']:g}, gradient "
      f"norm clipped to {s['grad_clip']:g}); DiLoCo's outer step: Nesterov SGD, lr "
      f"{s['outer_lr']:g}, momentum {s['outer_momentum']:g}. Simulated cluster: "
      f"homogeneous workers, {s['time_per_example']:g} s per window, latency "
      f"{s['latency']:g} s, bandwidth {s['bandwidth']:g} B/s.", "",
      f"Seeds {seeds}: mean +- sample standard deviation (ddof = 1) over the seeds"
      + (" (one seed: no standard deviation)" if len(s["seeds"]) < 2 else "")
      + "; bytes are sent per worker; rounds: communication rounds (for streaming DiLoCo, "
      "each fragment's all-reduce counts as one); x fewer bytes: all-reduce's bytes / the "
      "method's; wall: seconds of one run on this machine (mean over seeds).", "",
      "| method | final val. loss | MB sent / worker | x fewer bytes | rounds | sim. time (s) "
      "| wall (s) | description |",
      "|---|---:|---:|---:|---:|---:|---:|---|"]
  ar = ms.get("allreduce", {}).get("summary", {}).get("final", {}).get("bytes_sent", {})
  ar_bytes = ar.get("mean", float("nan"))
  for name, m in ms.items():
    f = m["summary"]["final"]
    b = f["bytes_sent"]["mean"]
    ratio = f"{ar_bytes / b:,.0f}" if b > 0 and np.isfinite(ar_bytes) else "-"
    lines.append(f"| {name} | {_pm(f['test_loss'])} | {b / 1e6:,.2f} | {ratio} | "
                 f"{f['rounds']['mean']:.0f} | {f['sim_time']['mean']:.2f} | "
                 f"{m['summary']['seconds']['mean']:.0f} | {m['description']} |")
  lines += ["", "Final validation loss per seed: " + "; ".join(
      f"{name} " + ", ".join(f"{v:.4f}" for v in m["summary"]["final"]["test_loss"]["values"])
      for name, m in ms.items()) + ".", ""]
  lines += claims(res)
  lines += ["", f"Total wall time of the study: {res['seconds']:.0f} s "
            f"({res['seconds'] / 60:.1f} min).", ""]
  return "\n".join(lines)


def claims(res: dict) -> list:
  """The paper's claim beside what these runs measured (every number from ``res``)."""
  s = res["settings"]
  ms = res["methods"]
  big = max(s["h"])
  lines = ["## The paper's claim beside ours", "", PAPER, ""]
  fin = lambda k: ms[k]["summary"]["final"] if k in ms else None  # noqa: E731
  base = fin("allreduce")
  rows = []
  for name in ms:
    if name == "allreduce" or base is None:
      continue
    f = fin(name)
    d = f["test_loss"]["mean"] - base["test_loss"]["mean"]
    b = f["bytes_sent"]["mean"]
    ratio = base["bytes_sent"]["mean"] / b if b > 0 else float("nan")
    verdict = ("diverged" if not np.isfinite(d) else
               "lower (better) than all-reduce" if d < 0 else "higher (worse) than all-reduce")
    ppl = math.exp(d) if np.isfinite(d) else float("nan")
    rows.append(f"| {name} | {_pm(f['test_loss'])} vs {_pm(base['test_loss'])}: "
                f"{d:+.4f} nats/char, perplexity x{ppl:.3f} ({verdict}) | {ratio:,.0f}x |")
  if rows:
    lines += ["| run | ours: final val. loss vs all-reduce's (difference, perplexity ratio) | "
              "ours: fewer bytes than all-reduce |", "|---|---|---:|"] + rows + [""]
  n_params = res.get("model_params")
  tokens = s["workers"] * s["steps"] * s["batch"] * s["context"]
  lines += [
      "Why ours differs from the paper's setting (the settings, not a result):", "",
      f"* Model: {n_params:,} parameters here against 150M; a character-level model on a "
      "CPU." if n_params else "* Model: far smaller than the paper's 150M.",
      f"* Data: {s['train_chars']:,} training characters of one play collection, "
      f"{tokens / s['train_chars']:.1f} passes over it in a run ({tokens:,} tokens), against "
      "C4 seen once; each worker here draws from its own contiguous part of the text (not "
      "i.i.d. shards).",
      f"* Rounds: H = {big} gives {s['steps'] // big} outer rounds in {s['steps']} steps "
      f"(H = {min(s['h'])}: {s['steps'] // min(s['h'])}); the paper's H = 500 sits inside a "
      "much longer run, so its outer optimizer takes many more steps.",
      "* Start: DiLoCo starts here from a random model with the warm-up inside the first "
      "round; the paper's runs start from a synchronously pre-trained checkpoint.",
      "* Bytes: the all-reduce baseline here sends 2 (n - 1) / n x the model every step and "
      f"DiLoCo every H steps, so the byte ratio is about H (= {big}), as the paper's 500x is "
      "its H.", "",
      "Measured on this project's shared 2-core CPU; wall seconds are noisy."]
  return lines


# ----------------------------------------------------------------------------- main


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true", help="seconds-long smoke run")
  p.add_argument("--protocol", choices=["paper", "scratch"], default="paper",
                 help="paper: the paper's protocol (diloco_paper.py, the main result); "
                 "scratch: every method from a random model (the earlier study)")
  p.add_argument("--seeds", type=int, nargs="+", default=None,
                 help="reported seeds (paper: 0 1 2; scratch: 0 1)")
  p.add_argument("--tune_seed", type=int, default=3, help="paper: the seed rates are tuned on")
  p.add_argument("--partition", choices=["iid", "contiguous"], default=None,
                 help="the workers' text (paper: iid; scratch: contiguous)")
  p.add_argument("--prefix_steps", type=int, default=500, help="paper: all-reduce steps first")
  p.add_argument("--inner_lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3],
                 help="paper: the inner AdamW rates tuned over")
  p.add_argument("--outer_lrs", type=float, nargs="+", default=[0.3, 0.5, 0.7, 1.0],
                 help="paper: DiLoCo's outer rates tuned over")
  p.add_argument("--extend", type=int, default=2,
                 help="paper: times the inner-rate grid is extended while its pick is at an edge")
  p.add_argument("--no_ablation", dest="ablation", action="store_false",
                 help="paper: skip the contiguous-shard ablation")
  p.add_argument("--methods", nargs="+", default=None, help="a subset of the method names")
  p.add_argument("--workers", type=int, default=8)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--d_model", type=int, default=96)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--context", type=int, default=64)
  p.add_argument("--batch", type=int, default=None,
                 help="windows per worker per step (paper: 16; scratch: 8)")
  p.add_argument("--steps", type=int, default=None,
                 help="steps of every run (paper: after the prefix, 1000; scratch: 800)")
  p.add_argument("--eval_every", type=int, default=100)
  p.add_argument("--eval_train_examples", type=int, default=128)
  p.add_argument("--lr", type=float, default=2e-3, help="peak inner AdamW learning rate")
  p.add_argument("--lr_min_ratio", type=float, default=0.1, help="cosine ends at lr x this")
  p.add_argument("--warmup", type=int, default=50)
  p.add_argument("--grad_clip", type=float, default=1.0)
  p.add_argument("--outer_lr", type=float, default=0.7)
  p.add_argument("--outer_momentum", type=float, default=0.9)
  p.add_argument("--h", type=int, nargs="+", default=[10, 50], help="DiLoCo inner steps H")
  p.add_argument("--fragments", type=int, default=2, help="streaming DiLoCo P")
  p.add_argument("--delay", type=int, default=5, help="streaming overlap tau (inner steps)")
  p.add_argument("--alpha", type=float, default=0.5, help="streaming overlap mixing alpha")
  p.add_argument("--compression", default="sign",
                 choices=["sign", "top_k", "random_k", "gaussian_k", "qsgd", "bf16"])
  p.add_argument("--density", type=float, default=0.01)
  p.add_argument("--levels", type=int, default=16)
  p.add_argument("--bandwidth", type=float, default=0.0,
                 help="simulated bytes/s per link (cluster.bandwidth; 0: the package default)")
  p.add_argument("--latency", type=float, default=None,
                 help="simulated s per message (cluster.latency; default: the package's)")
  a = p.parse_args()
  paper = a.protocol == "paper"
  for k, v_paper, v_scratch in (("seeds", [0, 1, 2], [0, 1]), ("batch", 16, 8),
                                ("steps", 1000, 800), ("partition", "iid", "contiguous")):
    if getattr(a, k) is None:
      setattr(a, k, v_paper if paper else v_scratch)
  if a.quick and paper:
    a.layers, a.d_model, a.heads, a.context, a.batch = 1, 32, 2, 32, 4
    a.prefix_steps, a.steps, a.eval_every, a.warmup, a.h = 20, 20, 10, 4, [2, 5]
    a.eval_train_examples, a.seeds, a.tune_seed = 32, a.seeds[:1], 9
    a.inner_lrs, a.outer_lrs = a.inner_lrs[:2], a.outer_lrs[:2]
  elif a.quick:
    a.layers, a.d_model, a.heads, a.context, a.batch = 1, 32, 2, 32, 4
    a.steps, a.eval_every, a.warmup, a.h, a.delay = 40, 20, 4, [2, 10], 1
    a.eval_train_examples, a.seeds = 32, a.seeds[:1]
  os.makedirs(a.out, exist_ok=True)
  from nbsgd_jax import data as data_lib
  text = data_lib.load_text_dataset("tiny_shakespeare")
  probe = base_config(a, 0)
  settings = {**vars(a), "train_chars": int(len(text.train_tokens)),
              "val_chars": int(len(text.test_tokens)), "vocab_size": int(text.vocab_size),
              "time_per_example": probe.cluster.time_per_example,
              "latency": probe.cluster.latency, "bandwidth": probe.cluster.bandwidth,
              "std": "sample standard deviation over seeds, ddof = 1"}
  command = "python experiments/reproduce_diloco.py " + " ".join(
      shlex.quote(x) for x in sys.argv[1:])
  if paper:
    import diloco_paper  # noqa: E402  (experiments/diloco_paper.py)
    res = diloco_paper.run(a, base_config, settings, command)
    diloco_paper.plots(res, a.out)
    common.write_results(a.out, res, diloco_paper.markdown(res))
    return
  res = {"paper": PAPER, "command": common.repo_relative(command),
         "settings": common.repo_relative(settings), "methods": {},
         "_start": time.time()}
  study(a, res)
  res["seconds"] = time.time() - res.pop("_start")
  plots(res, a.out)
  common.write_results(a.out, res, markdown(res))
  print(f"total {res['seconds']:.0f} s")


if __name__ == "__main__":
  main()
