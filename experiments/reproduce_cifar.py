"""ResNet-20 on real CIFAR-10: one worker, then 16 workers on a ring, and the cost of simulating
them.

    python experiments/reproduce_cifar.py --quick --out /tmp/cifar_quick     # about a minute
    python experiments/reproduce_cifar.py --out docs/cifar                    # the study
    python experiments/reproduce_cifar.py --single_epochs 0.5 --epochs 0.5 --seeds 0 --out DIR

Data: ``--dataset image_folder`` with ``--data_path ../shared/data/cifar10_jpeg.tar.xz``
(relative to the repository root or the working directory: the 50,000 / 10,000 CIFAR-10 images
re-encoded as JPEG; decoded once, then cached under ``--data_cache``), or ``--dataset cifar10``
with the python-pickle release. The published CIFAR-10 normalisation (``augment.stats =
cifar10``) whatever the source.

(1) **One worker**: ResNet-20, the standard recipe (He et al. 2016: batch 128, lr 0.1, momentum
0.9 (Nesterov), weight decay 1e-4, x 0.1 at 50 % and 75 % of the run, 4-pixel crop, flip,
normalisation), ``--single_epochs`` epochs: test accuracy, wall time, images/s.

(2) **16 workers on a ring** (``experiments/configs/cifar10_resnet20.py``, the EPFL recipe:
batch 128 per worker, lr 0.1 x 16 with a linear warm-up, the same decay, Nesterov, wd 1e-4,
the same augmentation), ``--epochs`` epochs each: All-Reduce, D-PSGD, CHOCO-SGD with scaled
sign compression (per tensor, as the reference code; ``--choco_gamma``), gradient tracking, and
Non-blocking D-PSGD (He & Dube 2022; M = 4 mini-batches, deadline ``fastest``). All five on the
heterogeneous cluster of ``docs/nonblocking.md``'s reference cell ("speeds 0.3 + stragglers":
lognormal speeds sigma 0.3, a straggler delay with probability 0.1 and mean one full batch's
compute time, drawn per seed), so their simulated times compare. ``--seeds`` seeds: mean and
standard deviation (ddof = 1) of the final test accuracy, bytes sent per worker and simulated
time. A diverged run is recorded as NaN.

(3) **Throughput**: one training step of 16 simulated workers x 128 images (``conv_impl``
``batched``: one grouped convolution per layer; ``per_worker``: 16 ordinary ones) against one
worker on the same 2,048 images: compile time and warm images/s (the timing of
``benchmarks/simulated_workers.py --framework``, with ResNet-20 on CIFAR-10). The faster
``conv_impl`` trains (2) unless ``--conv_impl`` names one.

Evaluations (10,000 test images each) are few: one at step 0 (always made by the training
loop) and ``--evals`` more, evenly spaced. Each run's warm seconds per step come from a hook
timing the steps between evaluations. The per-worker test accuracy of the decentralized runs
(16 more passes over the test set at every evaluation) is skipped unless ``--worker_accuracy``.

The defaults (``--single_epochs 0.25 --epochs 0.25 --seeds 0 1 --evals 1``) are sized for
about 45 minutes on a shared 2-core CPU, where a 16 x 128 ResNet-20 step takes about 20 s
(``per_worker``): they measure the first descent, not the recipe's final accuracy.

``--quick``: 2 workers, ResNet-8, batch 16, a few steps, on a 2,000 / 1,000-image subset of the
same data (written as a CIFAR-10 python release under ``OUT/quick_data``), one seed.

Outputs in ``OUT``: ``results.json`` (histories, aggregates, settings, seconds), ``results.md``
(the three tables, the published figures, the command), ``accuracy_vs_sim_time.png`` and
``accuracy_vs_bytes.png`` (part 2).
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (experiments/common.py)
import reproduce_nonblocking as nb_study  # noqa: E402  (the documented cluster)
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import data as data_lib  # noqa: E402
from nbsgd_jax import train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = "../shared/data/cifar10_jpeg.tar.xz"

# name -> (label, overrides of the 16-worker base config)
RING_RUNS = {
    "allreduce": ("All-Reduce", {"algorithm": "allreduce"}),
    "dpsgd": ("D-PSGD", {"algorithm": "dpsgd"}),
    "choco_sign": ("CHOCO-SGD, sign", {"algorithm": "choco_sgd", "compression.name": "sign",
                                      "compression.flatten": False}),
    "gradient_tracking": ("gradient tracking", {"algorithm": "gradient_tracking"}),
    "nonblocking_dpsgd": ("Non-blocking D-PSGD", {"algorithm": "dpsgd",
                                                  "nonblocking.enabled": True,
                                                  "nonblocking.num_minibatches": nb_study.M,
                                                  "nonblocking.deadline": "fastest"}),
}

# Published figures (on the original CIFAR-10, not our JPEG re-encoding).
PUBLISHED_SINGLE = {"test_accuracy": 0.9125, "source": "He, Zhang, Ren & Sun 2016, \"Deep "
                    "Residual Learning for Image Recognition\", Table 6: ResNet-20, error 8.75 %, "
                    "batch 128, 64k iterations (164 epochs) on 45k/5k train/val, original "
                    "CIFAR-10"}
PUBLISHED_RING = ("looked up (search tool: Kong et al. 2021, \"Consensus Control for "
                  "Decentralized Deep Learning\", ICML; Koloskova et al. 2020, \"Decentralized "
                  "Deep Learning with Arbitrary Communication Compression\", ICLR): the pages "
                  "found held the abstracts only, not the tables, so no 16-worker ring figure is "
                  "quoted here")


# ----------------------------------------------------------------------------- data


def resolve_data_path(a) -> str:
  """``--data_path`` as an absolute path (tried as given, then relative to the repository
  root); exits with one line if it does not exist."""
  p = os.path.expanduser(a.data_path)
  for cand in (p, os.path.join(ROOT, p)):
    if os.path.exists(cand):
      return os.path.abspath(cand)
  sys.exit(f"error: --data_path {a.data_path!r} does not exist (--dataset {a.dataset}; tried "
           f"it from {os.getcwd()} and from {ROOT})")


def write_quick_subset(dataset, out: str, train: int, test: int, seed: int = 0) -> str:
  """A class-balanced random subset of ``dataset`` written as a CIFAR-10 python release
  (``out/cifar-10-batches-py``): ``--quick`` evaluates on ``test`` images, not 10,000. Returns
  the folder."""
  rng = np.random.default_rng(seed)
  folder = os.path.join(out, "cifar-10-batches-py")
  os.makedirs(folder, exist_ok=True)

  def pick(labels, count):
    per = count // dataset.num_classes
    return np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:per]
                                   for c in range(dataset.num_classes)]))

  def batch(images, labels):
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # R, G, B planes
    return {b"data": np.ascontiguousarray(rows, np.uint8),
            b"labels": [int(y) for y in labels]}

  tr, te = pick(dataset.train_labels, train), pick(dataset.test_labels, test)
  parts = np.array_split(rng.permutation(tr), 5)
  blobs = {f"data_batch_{i + 1}": batch(dataset.train_images[p], dataset.train_labels[p])
           for i, p in enumerate(parts)}
  blobs["test_batch"] = batch(dataset.test_images[te], dataset.test_labels[te])
  blobs["batches.meta"] = {b"label_names": [f"class_{c}".encode()
                                            for c in range(dataset.num_classes)]}
  for name, obj in blobs.items():
    with open(os.path.join(folder, name), "wb") as f:
      pickle.dump(obj, f, protocol=2)
  return folder


# ----------------------------------------------------------------------------- configs


def base_config(a, seed: int, workers: int, batch: int, steps: int, evals: int, **over):
  """ResNet on the CIFAR data, SGD with Nesterov momentum 0.9, wd 1e-4, step decay at 50 % /
  75 %, crop + flip + normalisation (CIFAR-10 statistics), on the reference cluster."""
  spread, prob, mean = nb_study.CELLS[nb_study.REFERENCE_CELL]
  c = config_lib.default_config()
  base = {"num_workers": workers, "topology": "ring", "backend": "simulate", "model": "resnet",
          "resnet_depth": a.depth, "norm": "batch", "dataset": a.run_dataset,
          "data_path": a.run_data_path, "partition": "iid", "batch_size": batch,
          "lr_schedule": "step", "lr_milestones": (0.5, 0.75), "lr_decay": 0.1,
          "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4, "num_steps": steps,
          "eval_every": max(1, math.ceil(steps / max(evals, 1))),
          "eval_train_examples": a.eval_train_examples, "seed": seed, "progress": False,
          "augment.crop_padding": 4, "augment.flip": True, "augment.normalize": True,
          "augment.stats": "cifar10", "conv_impl": a.conv_impl_used,
          "eval_worker_accuracy": a.worker_accuracy,
          "cluster.seed": seed, "cluster.time_per_example": a.time_per_example,
          "cluster.scenario": "lognormal", "cluster.spread": spread,
          "cluster.delay": "bernoulli_exponential", "cluster.delay_prob": prob,
          "cluster.delay_mean": mean * batch * a.time_per_example}
  if a.run_dataset == "image_folder" and a.data_cache:
    base["data_cache"] = a.data_cache
  return config_lib.override(c, {**base, **over})


def single_config(a, seed: int):
  steps = max(1, round(a.single_epochs * a.train_examples / a.batch))
  return base_config(a, seed, 1, a.batch, steps, a.evals, algorithm="allreduce",
                     learning_rate=a.lr, warmup_steps=0)


def ring_steps(a) -> int:
  return max(1, round(a.epochs * a.train_examples / (a.workers * a.batch)))


def ring_lr(a) -> float:
  """(2)'s peak learning rate: ``--ring_lr``, else ``--lr`` x workers (Goyal et al. 2017)."""
  return a.ring_lr or a.lr * a.workers


def ring_lr_text(a, workers: int) -> str:
  if a.ring_lr:
    return (f"peak lr {a.ring_lr:g} (not the linear-scaling {a.lr:g} x {workers} = "
            f"{a.lr * workers:g}: the run is too short for that rate's 5-epoch warm-up)")
  return f"lr {a.lr:g} x {workers} = {a.lr * workers:g}"


def ring_config(a, name: str, seed: int):
  steps = ring_steps(a)
  spe = a.train_examples / (a.workers * a.batch)
  warmup = int(round(min(a.warmup_epochs * spe, a.warmup_max_fraction * steps)))
  over = dict(RING_RUNS[name][1])
  if name == "choco_sign":
    over["choco.gamma"] = a.choco_gamma
  return base_config(a, seed, a.workers, a.batch, steps, a.evals, learning_rate=ring_lr(a),
                     warmup_steps=warmup, **over)


# ----------------------------------------------------------------------------- runs

KEEP = ("step", "sim_time", "wall_time", "bytes_sent", "rounds", "test_accuracy", "test_loss",
        "train_loss", "consensus_distance", "minibatch_fraction", "worker_test_accuracy")


class StepTimer:
  """A training hook: the time of every step (the hooks run after ``block_until_ready`` of the
  state, one per dispatch); intervals that hold an evaluation, and the first (compilation),
  are left out of the warm seconds per step."""

  def __init__(self, eval_every: int):
    self.eval_every, self.stamps = eval_every, []

  def __call__(self, step, state, setup):
    self.stamps.append((step, time.perf_counter()))

  def summary(self) -> dict:
    warm, first = [], None
    for (s0, t0), (s1, t1) in zip(self.stamps, self.stamps[1:]):
      if s0 == 0:
        first = t1 - t0
      elif s1 - s0 == 1 and s1 % self.eval_every != 0:
        warm.append(t1 - t0)
    return {"first_step_s": first, "warm_step_s": statistics.median(warm) if warm else None,
            "warm_steps_timed": len(warm)}


def run_all(cfgs: list) -> list[dict]:
  """The training runs of ``cfgs`` as one call (``nbsgd_jax.train.train_runs``: one compiled
  program per structure; on a CPU the runs in turn, so each run's step times are its own):
  each run's evaluation history, final record, seconds (its share of the call's) and step
  times (a diverged run: one record of NaNs)."""
  timers = [StepTimer(cfg.eval_every) for cfg in cfgs]
  t = time.time()
  summaries = train.train_runs(cfgs, hooks=[(timer,) for timer in timers])
  share = (time.time() - t) / max(len(cfgs), 1)
  return [_result(cfg, s, timer, share) for cfg, s, timer in zip(cfgs, summaries, timers)]


def _result(cfg, s: dict, timer: "StepTimer", seconds: float) -> dict:
  """One run's entry of the results (:func:`run_all`)."""
  if s.get("stopped") == "diverged":
    nan = float("nan")
    return {"history": [{"step": cfg.num_steps, **{k: nan for k in KEEP[1:]}}],
            "final": {k: nan for k in KEEP}, "steps": cfg.num_steps,
            "diverged": s.get("error", "diverged"), "seconds": seconds, **timer.summary()}
  hist = [{k: h[k] for k in KEEP if k in h} for h in s["history"]]
  timing = timer.summary()
  images = cfg.num_workers * cfg.batch_size
  return {"history": hist, "final": hist[-1], "steps": s["steps"], "seconds": seconds,
          "train_wall_s": s["wall_time"], "model_params": s["model_params"],
          "images_per_s_with_compile": s["samples_per_second"],
          "images_per_s_warm": (images / timing["warm_step_s"] if timing["warm_step_s"]
                                else None), **timing}


def _line(tag: str, r: dict) -> str:
  f = r["final"]
  warm = f"{r['warm_step_s']:.2f} s/step warm" if r.get("warm_step_s") else "no warm step"
  div = " DIVERGED" if r.get("diverged") else ""
  return (f"  {tag}: acc {f['test_accuracy']:.4f}, loss {f['train_loss']:.4f}, "
          f"{f.get('bytes_sent', 0) / 1e6:.1f} MB/worker, sim {f.get('sim_time', 0):.1f} s, "
          f"{r['steps']} steps, {warm}, {r['seconds']:.0f} s real{div}")


def single(a) -> dict:
  runs = dict(zip(map(str, a.single_seeds),
                  run_all([single_config(a, seed) for seed in a.single_seeds])))
  for seed, r in runs.items():
    print(_line(f"(1) one worker seed {seed}", r), flush=True)
  return {"steps": single_config(a, a.single_seeds[0]).num_steps, "epochs": a.single_epochs,
          "seeds": runs, "summary": summarize(runs)}


def summarize(runs: dict) -> dict:
  """Mean and standard deviation (ddof = 1; 0 with one seed) over seeds of the final figures
  (NaN for a diverged seed stays NaN)."""
  out = {}
  for key in ("test_accuracy", "train_loss", "bytes_sent", "sim_time", "minibatch_fraction",
              "warm_step_s", "seconds"):
    vals = [r.get(key, r["final"].get(key)) for r in runs.values()]
    if any(v is None for v in vals):
      continue
    v = np.asarray(vals, np.float64)
    out[key] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
                "per_seed": [float(x) for x in v]}
  out["diverged"] = sum(bool(r.get("diverged")) for r in runs.values())
  return out


def ring(a) -> dict:
  out = {}
  done = iter(run_all([ring_config(a, name, seed) for name in a.runs for seed in a.seeds]))
  for name in a.runs:
    runs = {str(seed): next(done) for seed in a.seeds}
    for seed, r in runs.items():
      print(_line(f"(2) {name} seed {seed}", r), flush=True)
    cfg = ring_config(a, name, a.seeds[0])
    out[name] = {"label": RING_RUNS[name][0], "seeds": runs, "summary": summarize(runs),
                 "overrides": {k: v for k, v in config_lib.flatten_dict(cfg.to_dict()).items()
                               if k in RING_RUNS[name][1] or k == "choco.gamma" and
                               name == "choco_sign"}}
  return out


# ----------------------------------------------------------------------------- throughput


def time_steps(cfg, steps: int) -> dict:
  """The framework's jitted training step (as ``benchmarks/simulated_workers.py --framework``):
  the first call (compilation and one step), then ``steps`` timed steps; and the final
  parameters (for the check that the two ``conv_impl`` give the same training)."""
  import jax
  stepper = train.Stepper.of(train.setup(cfg))
  jax.block_until_ready(stepper.state)

  def one() -> float:
    t = time.perf_counter()
    stepper.steps(1)  # the step's reports read: the step is done
    return time.perf_counter() - t

  first = one()
  times = [one() for _ in range(steps)]
  return {"first_call_s": first, "step_s": times, "median_step_s": statistics.median(times),
          "params": jax.tree.map(np.asarray, stepper.state.params)}


def throughput(a) -> dict:
  n, b = a.workers, a.batch
  base = lambda workers, batch, impl, algo: base_config(
      a, 0, workers, batch, a.tp_steps + 1, 1, algorithm=algo, learning_rate=a.lr,
      conv_impl=impl)
  variants = {
      f"1 worker x {n * b} images": base(1, n * b, "batched", "allreduce"),
      f"{n} workers x {b}, conv_impl=batched": base(n, b, "batched", "dpsgd"),
      f"{n} workers x {b}, conv_impl=per_worker": base(n, b, "per_worker", "dpsgd"),
  }
  rows, params = {}, {}
  for name, cfg in variants.items():
    r = time_steps(cfg, a.tp_steps)
    params[name] = r.pop("params")
    r["images_per_step"] = cfg.num_workers * cfg.batch_size
    r["images_per_s"] = r["images_per_step"] / r["median_step_s"]
    r["compile_s"] = max(r["first_call_s"] - r["median_step_s"], 0.0)
    rows[name] = r
    print(f"  (3) {name}: first call {r['first_call_s']:.1f} s, "
          f"{r['median_step_s']:.2f} s/step, {r['images_per_s']:.0f} images/s", flush=True)
  one = rows[f"1 worker x {n * b} images"]["images_per_s"]
  for r in rows.values():
    r["x_one_worker"] = r["images_per_s"] / one
  k1, k2 = list(params)[1:]
  diff = max(float(np.max(np.abs(u - v))) for u, v in
             zip(_leaves(params[k1]), _leaves(params[k2])))
  faster = min(("batched", "per_worker"), key=lambda i: rows[
      f"{n} workers x {b}, conv_impl={i}"]["median_step_s"])
  return {"rows": rows, "faster_conv_impl": faster,
          "params_max_abs_diff_batched_vs_per_worker": diff, "timed_steps": a.tp_steps}


def _leaves(tree):
  import jax
  return jax.tree.leaves(tree)


# ----------------------------------------------------------------------------- plots


def plots(res: dict, out: str) -> None:
  plt = common.pyplot()
  for x, fname, label, scale in (("sim_time", "accuracy_vs_sim_time.png",
                                  "simulated time (s)", 1.0),
                                 ("bytes_sent", "accuracy_vs_bytes.png",
                                  "MB sent per worker", 1e6)):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, r) in enumerate(res["ring"].items()):
      for j, h in enumerate(v["history"] for v in r["seeds"].values()):
        ax.plot([p[x] / scale for p in h], [100 * p["test_accuracy"] for p in h], "o-",
                color=f"C{i}", alpha=1.0 if j == 0 else 0.35, lw=1.5 if j == 0 else 1,
                label=r["label"] if j == 0 else None)
    if x == "bytes_sent":
      ax.set_xscale("symlog")
    ax.set_xlabel(label)
    ax.set_ylabel("test accuracy (%), averaged model")
    ax.set_title(f"ResNet-{res['settings']['depth']}, {res['settings']['workers']} workers, "
                 f"ring, {res['settings']['ring_epochs']:g} epochs (faint: seeds > first)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    common.save_figure(fig, os.path.join(out, fname))


# ----------------------------------------------------------------------------- report


def _pm(s: dict | None, key: str, scale=1.0, digits=2, unit="") -> str:
  if not s or key not in s:
    return "-"
  m = s[key]
  if len(m.get("per_seed", ())) < 2:  # one seed: no standard deviation
    return f"{m['mean'] * scale:.{digits}f}{unit}"
  return f"{m['mean'] * scale:.{digits}f} +- {m['std'] * scale:.{digits}f}{unit}"


def markdown(res: dict, a) -> str:
  st, ds = res["settings"], res["dataset"]
  data = (f"{ds['name']} ({ds['source']}): {ds['train']:,} training / {ds['test']:,} test "
          f"images, {ds['classes']} classes")
  lines = [f"Command: `{res['command']}`", "",
           f"Data: {data}. Model: ResNet-{st['depth']} ({res.get('model_params', '?'):,} "
           f"parameters), BatchNorm (running statistics per worker; the averaged model is "
           f"evaluated with the workers' mean statistics). Total {res['seconds']['total']:.0f} s "
           f"on {st['device']}.", "",
           f"### (1) One worker, {res['single']['epochs']:g} epochs "
           f"({res['single']['steps']} steps of {a.batch})", "",
           f"Batch {a.batch}, lr {a.lr:g}, Nesterov 0.9, wd 1e-4, x 0.1 at 50 % and 75 %, crop 4 + "
           f"flip + normalise; seeds {', '.join(map(str, a.single_seeds))}.", "",
           "| run | test acc. | train loss | training s (compile incl.) | warm s / step | images/s "
           "warm | images/s (compile incl.) |", "|---|---:|---:|---:|---:|---:|---:|"]
  for seed, r in res["single"]["seeds"].items():
    f = r["final"]
    lines.append(f"| seed {seed} | {100 * f['test_accuracy']:.2f}% | {f['train_loss']:.3f} | "
                 f"{r.get('train_wall_s', float('nan')):.0f} | "
                 f"{(r.get('warm_step_s') or float('nan')):.3f} | "
                 f"{(r.get('images_per_s_warm') or float('nan')):.0f} | "
                 f"{(r.get('images_per_s_with_compile') or float('nan')):.0f} |")
  lines.append(f"| published | {100 * PUBLISHED_SINGLE['test_accuracy']:.2f}% | | | | | |")
  lines += ["", f"Published: {PUBLISHED_SINGLE['source']}. Ours is a shortened schedule on "
            "JPEG re-encoded images: expect it well below.", "",
            f"### (2) {st['workers']} workers on a ring, {st['ring_epochs']:g} epochs "
            f"({st['ring_steps']} steps of {st['workers']} x {a.batch})", "",
            f"{ring_lr_text(a, st['workers'])}, linear warm-up "
            f"{st['warmup_steps']} steps (min of {a.warmup_epochs:g} epochs and "
            f"{a.warmup_max_fraction:.0%} of the run), x 0.1 at 50 % and 75 %, Nesterov 0.9, wd "
            f"1e-4, crop + flip + normalise, iid shards, conv_impl={st['conv_impl']}. Cluster "
            f"(docs/nonblocking.md, reference cell \"{nb_study.REFERENCE_CELL}\"): "
            f"{st['cluster_text']}. CHOCO-SGD: scaled sign per tensor, gamma {a.choco_gamma:g}. "
            f"Non-blocking: M = {nb_study.M}, deadline fastest. Seeds "
            f"{', '.join(map(str, a.seeds))} (a seed sets the initialisation, the data order and "
            "the cluster draw); mean +- standard deviation (ddof = 1).", "",
            "| run | test acc. (%) | train loss | MB sent / worker | simulated s | mini-batches "
            "used | warm s / step | real s / run |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for name, r in res["ring"].items():
    m = r["summary"]
    div = f" ({m['diverged']} diverged)" if m["diverged"] else ""
    mb = (f"{100 * m['minibatch_fraction']['mean']:.0f}%" if "minibatch_fraction" in m
          else "100%")
    lines.append(f"| {r['label']}{div} | {_pm(m, 'test_accuracy', 100)} | "
                 f"{_pm(m, 'train_loss', 1, 3)} | {_pm(m, 'bytes_sent', 1e-6, 1)} | "
                 f"{_pm(m, 'sim_time', 1, 1)} | {mb} | {_pm(m, 'warm_step_s', 1, 2)} | "
                 f"{_pm(m, 'seconds', 1, 0)} |")
  lines += ["", f"Published 16-worker ring ResNet-20 figures: {PUBLISHED_RING}.", "",
            "Per seed (final test accuracy, %):", ""]
  for name, r in res["ring"].items():
    lines.append(f"- {r['label']}: " + ", ".join(
        f"seed {s} {100 * v['final']['test_accuracy']:.2f}" for s, v in r["seeds"].items()))
  tp = res["throughput"]
  lines += ["", f"### (3) Throughput: {st['workers']} simulated workers x {a.batch} against one "
            f"worker on the same {st['workers'] * a.batch} images per step", "",
            f"One jitted training step (forward, backward, update; D-PSGD's gossip for the "
            f"workers), ResNet-{st['depth']}; first call (compilation + one step), then "
            f"{tp['timed_steps']} timed steps (median).", "",
            "| variant | first call s | compile s (approx.) | s / step | images/s | x one worker |",
            "|---|---:|---:|---:|---:|---:|"]
  for name, r in tp["rows"].items():
    lines.append(f"| {name} | {r['first_call_s']:.1f} | {r['compile_s']:.1f} | "
                 f"{r['median_step_s']:.2f} | {r['images_per_s']:.0f} | "
                 f"{r['x_one_worker']:.2f}x |")
  lines += ["", f"Faster conv_impl: {tp['faster_conv_impl']}. Parameters after the timed steps, "
            "batched against per_worker (same initialisation, data and steps): max abs "
            f"difference {tp['params_max_abs_diff_batched_vs_per_worker']:.1e}.", "",
            "Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in res["seconds"].items()) + "."]
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--quick", action="store_true",
                  help="smoke run: 2 workers, ResNet-8, batch 16, a few steps, a data subset")
  ap.add_argument("--dataset", default="image_folder", choices=["image_folder", "cifar10"])
  ap.add_argument("--data_path", default=DEFAULT_DATA,
                  help="image folder archive / python release (relative: to the working "
                  "directory or the repository root)")
  ap.add_argument("--data_cache", default="", help="image_folder: decoded-array cache directory")
  ap.add_argument("--single_epochs", type=float, default=0.25, help="(1) epochs of one worker")
  ap.add_argument("--single_seeds", type=int, nargs="+", default=[0])
  ap.add_argument("--epochs", type=float, default=0.25, help="(2) epochs of every ring run")
  ap.add_argument("--seeds", type=int, nargs="+", default=None,
                  help="(2) seeds (default: 0 1; --quick: 0)")
  ap.add_argument("--runs", nargs="+", default=list(RING_RUNS), choices=list(RING_RUNS))
  ap.add_argument("--workers", type=int, default=16)
  ap.add_argument("--batch", type=int, default=128, help="examples per worker per step")
  ap.add_argument("--depth", type=int, default=20, help="ResNet depth (6 k + 2)")
  ap.add_argument("--lr", type=float, default=0.1, help="per 128 examples (x workers in (2))")
  ap.add_argument("--ring_lr", type=float, default=0.0,
                  help="(2) peak learning rate (0: --lr x workers, the linear scaling rule)")
  ap.add_argument("--warmup_epochs", type=float, default=5.0,
                  help="(2) linear warm-up (EPFL: 5 of 300 epochs) ...")
  ap.add_argument("--warmup_max_fraction", type=float, default=0.25,
                  help="... capped at this fraction of a shortened run")
  ap.add_argument("--choco_gamma", type=float, default=0.5)
  ap.add_argument("--time_per_example", type=float, default=nb_study.TIME_PER_EXAMPLE,
                  help="s of compute per example on the fastest simulated worker")
  ap.add_argument("--conv_impl", default="auto", choices=["auto", "batched", "per_worker"],
                  help="(1) and (2); auto: the faster in (3)")
  ap.add_argument("--evals", type=int, default=None,
                  help="evaluations per run after the one at step 0, evenly spaced (default: 1; "
                  "--quick: 2)")
  ap.add_argument("--eval_train_examples", type=int, default=1000)
  ap.add_argument("--worker_accuracy", action="store_true",
                  help="also each worker's test accuracy (16 x the evaluation cost)")
  ap.add_argument("--tp_steps", type=int, default=2, help="(3) timed steps after the first")
  a = ap.parse_args()
  t_start = time.time()
  a.data_path_resolved = resolve_data_path(a)
  if a.quick:
    a.workers, a.depth, a.batch, a.tp_steps = 2, 8, 16, 2
    a.single_epochs = 6 * 16 / 2000  # 6 steps of 16 on the 2,000-image subset
    a.epochs = 4 * 2 * 16 / 2000     # 4 steps of 2 x 16
    a.warmup_epochs = 1 * 2 * 16 / 2000
  a.seeds = a.seeds or ([0] if a.quick else [0, 1])
  a.evals = a.evals or (2 if a.quick else 1)
  os.makedirs(a.out, exist_ok=True)

  t = time.time()
  full = data_lib.load_dataset(a.dataset, data_path=a.data_path_resolved,
                               cache_dir=a.data_cache or None)
  source = os.path.relpath(a.data_path_resolved, ROOT)
  a.run_dataset, a.run_data_path = a.dataset, a.data_path_resolved
  if a.quick:
    folder = write_quick_subset(full, os.path.join(a.out, "quick_data"), 2000, 1000)
    a.run_dataset, a.run_data_path = "cifar10", folder
    source = f"class-balanced subset of {source}, as a python release in {folder}"
    a.train_examples, test, classes = 2000, 1000, full.num_classes
  else:
    a.train_examples, test, classes = len(full.train_labels), len(full.test_labels), \
        full.num_classes
  del full
  print(f"data: {a.run_dataset}, {a.train_examples} train / {test} test images "
        f"({time.time() - t:.0f} s)", flush=True)

  print(f"plan: (3) 3 step timings ({a.workers} x {a.batch} images, {a.tp_steps} steps each); "
        f"(1) {max(1, round(a.single_epochs * a.train_examples / a.batch))} "
        f"steps of 1 x {a.batch} x {len(a.single_seeds)} seed(s); (2) {len(a.runs)} runs x "
        f"{len(a.seeds)} seed(s) x {ring_steps(a)} steps of {a.workers} x {a.batch}; "
        f"{a.evals} evaluation(s) per run after step 0", flush=True)
  seconds = {}
  a.conv_impl_used = a.conv_impl if a.conv_impl != "auto" else "batched"
  t = time.time()
  tp = throughput(a)
  seconds["throughput"] = time.time() - t
  if a.conv_impl == "auto":
    a.conv_impl_used = tp["faster_conv_impl"]
  t = time.time()
  sg = single(a)
  seconds["single"] = time.time() - t
  t = time.time()
  rg = ring(a)
  seconds["ring"] = time.time() - t
  seconds["total"] = time.time() - t_start

  from benchmarks.simulated_workers import _cpu_name
  spread, prob, mean = nb_study.CELLS[nb_study.REFERENCE_CELL]
  cfg0 = ring_config(a, a.runs[0], a.seeds[0])
  settings = {
      "workers": a.workers, "batch": a.batch, "depth": a.depth, "conv_impl": a.conv_impl_used,
      "ring_epochs": a.epochs, "ring_steps": ring_steps(a), "warmup_steps": cfg0.warmup_steps,
      "ring_lr": cfg0.learning_rate, "single_lr": a.lr, "choco_gamma": a.choco_gamma,
      "evals_after_step0": a.evals, "eval_train_examples": a.eval_train_examples,
      "worker_accuracy": a.worker_accuracy,
      "cluster": {k: v for k, v in config_lib.flatten_dict(cfg0.to_dict()).items()
                  if k.startswith("cluster.")},
      "cluster_text": (f"lognormal speeds sigma {spread:g}, straggler delay p = {prob:g}, mean "
                       f"{mean:g} T_b = {mean * a.batch * a.time_per_example:g} s (T_b = "
                       f"{a.batch} x {a.time_per_example:g} s), latency "
                       f"{cfg0.cluster.latency:g} s, bandwidth {cfg0.cluster.bandwidth:g} B/s"),
      "device": f"{_cpu_name()}, {os.cpu_count()} cores",
  }
  first = next(iter(next(iter(rg.values()))["seeds"].values()))
  rel = common.repo_relative  # paths in the record relative to the repository
  res = {"command": rel(" ".join(["python experiments/reproduce_cifar.py",
                                  *map(shlex.quote, sys.argv[1:])])),
         "args": rel({k: v for k, v in vars(a).items()}),
         "dataset": rel({"name": a.run_dataset, "source": source, "train": a.train_examples,
                         "test": test, "classes": classes}),
         "model_params": first.get("model_params"),
         "settings": settings, "published": {"single": PUBLISHED_SINGLE, "ring": PUBLISHED_RING},
         "throughput": tp, "single": sg, "ring": rg, "seconds": seconds}
  plots(res, a.out)
  common.write_results(a.out, res, markdown(res, a))
  print(f"wrote {a.out}/results.json, results.md, accuracy_vs_sim_time.png, "
        f"accuracy_vs_bytes.png in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
  main()
