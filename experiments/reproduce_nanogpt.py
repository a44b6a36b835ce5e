"""nanoGPT's character-level Shakespeare on a CPU, like for like, with both loss estimators.

karpathy/nanoGPT's CPU setting (``experiments/configs/shakespeare_char.py``: its model
exactly, 804,096 parameters, and its optimizer and schedule), trained once per seed; the
final model's validation loss by two estimators:

* **whole split**: the mean next-character loss over every window of 64 characters of the
  validation text (``test_loss`` in ``metrics.jsonl``);
* **nanoGPT's** ``estimate_loss`` (train.py): the mean over ``eval_iters`` = 20 batches of
  ``batch_size`` = 12 windows at uniformly random offsets (``torch.randint(len(data) -
  block_size)``), each batch's loss the mean over its 12 x 64 positions. One draw is what
  nanoGPT prints; ``--draws`` draws give its spread (the standard deviation of one draw).

    python experiments/reproduce_nanogpt.py --out docs/nanogpt

Each seed's run lives in ``--workdir``/seed{S} (a checkpoint at its last step, so the
estimators read the final model; a finished run is not trained again) and its
``config.json``, ``metrics.jsonl`` and ``summary.json`` are copied to ``OUT/seed{S}``;
``OUT/results.json`` and ``OUT/results.md`` are rewritten after every seed, and
``OUT/loss_vs_step.png`` drawn from the seeds' records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs"))

import common  # noqa: E402  (experiments/common.py; puts the repository on sys.path)

NANOGPT = ("nanoGPT README, CPU setting of shakespeare_char (--block_size=64 --batch_size=12 "
           "--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 "
           "--dropout=0.0): 'val loss ... about 1.88', one run, 0.80M parameters")
OLD = {"model": "Flax defaults: biases, untied output, 66 ids, tanh GELU, LayerNorm eps 1e-6",
       "params": 818498, "test_loss": [1.8318, 1.8388, 1.8211]}  # docs/real_data/shakespeare_char_seed*


def nanogpt_estimates(model, params, tokens: np.ndarray, context: int, batch: int,
                      iters: int, draws: int, seed: int) -> np.ndarray:
  """``draws`` values of nanoGPT's ``estimate_loss`` on ``tokens [N]``: each the mean of
  ``iters`` batch losses, a batch ``batch`` windows at offsets uniform in ``[0, N - context)``
  (float64 ``[draws]``)."""
  import jax
  import jax.numpy as jnp
  import optax

  @jax.jit
  def batch_loss(x, y):
    logits = model.apply(params, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

  rng = np.random.default_rng(seed)
  out = np.empty(draws)
  for d in range(draws):
    starts = rng.integers(0, len(tokens) - context, size=(iters, batch))
    idx = starts[..., None] + np.arange(context)
    out[d] = np.mean([float(batch_loss(tokens[i], tokens[i + 1])) for i in idx])
  return out


def run_seed(a, seed: int) -> dict:
  """Train (or read back) seed ``seed`` and measure its final model both ways."""
  import shakespeare_char  # noqa: E402  (experiments/configs/shakespeare_char.py)
  from nbsgd_jax import config as config_lib, train
  from nbsgd_jax.core import checkpoint
  cfg = config_lib.override(shakespeare_char.get_config(), {
      "seed": seed, "checkpoint_every": a.steps, "num_steps": a.steps, "progress": False,
      "eval_every": a.steps // 8 if a.steps % 8 == 0 else a.steps})
  wd = os.path.join(a.workdir, f"seed{seed}")
  t = time.time()
  summary = train.train(cfg, workdir=wd)
  seconds = time.time() - t
  _, params, _ = checkpoint.read_models(wd, print)
  s = train.setup(cfg)  # the run's own model and validation text
  est = nanogpt_estimates(s.model, params, np.asarray(s.dataset.test_tokens), cfg.lm.context,
                          cfg.batch_size, a.iters, a.draws, seed)
  keep = os.path.join(a.out, f"seed{seed}")
  os.makedirs(keep, exist_ok=True)
  for f in ("config.json", "metrics.jsonl", "summary.json"):
    shutil.copy(os.path.join(wd, f), os.path.join(keep, f))
  return {"whole_split": summary["test_loss"], "nanogpt_first_draw": float(est[0]),
          "nanogpt_mean": float(est.mean()), "nanogpt_std": float(est.std(ddof=1)),
          "train_loss": summary["train_loss"], "params": summary["model_params"],
          "vocab_size": summary["vocab_size"], "wall_time": summary["wall_time"],
          "seconds": seconds}


def markdown(res: dict) -> str:
  s = res["seeds"]
  keys = sorted(s, key=int)
  col = lambda k: [s[x][k] for x in keys]  # noqa: E731
  pm = lambda v: f"{np.mean(v):.4f} +- {np.std(v, ddof=1):.4f}" if len(v) > 1 else f"{v[0]:.4f}"  # noqa: E731
  p = s[keys[0]]
  lines = [f"`{res['command']}`", "",
           f"nanoGPT's model exactly ({p['params']:,} parameters, {p['vocab_size']} "
           "characters), its optimizer and schedule; seeds " + ", ".join(keys)
           + f"; nanoGPT's estimator: {res['iters']} batches of 12 windows at random "
           f"offsets, {res['draws']} draws per seed (spread: the std of one draw).", "",
           "| | validation loss, whole split | nanoGPT's estimator (first draw) | its mean over "
           "draws | its spread (std of one draw) | training loss (240 windows) |",
           "|---|---:|---:|---:|---:|---:|"]
  for k in keys:
    r = s[k]
    lines.append(f"| seed {k} | {r['whole_split']:.4f} | {r['nanogpt_first_draw']:.4f} | "
                 f"{r['nanogpt_mean']:.4f} | {r['nanogpt_std']:.4f} | {r['train_loss']:.4f} |")
  lines += [f"| mean +- std (ddof = 1) | {pm(col('whole_split'))} | "
            f"{pm(col('nanogpt_first_draw'))} | {pm(col('nanogpt_mean'))} | "
            f"{np.mean(col('nanogpt_std')):.4f} | {pm(col('train_loss'))} |", "",
            f"nanoGPT: {NANOGPT}.", "",
            f"Before (the same command's model with {OLD['model']}; {OLD['params']:,} "
            "parameters): whole split " + " / ".join(f"{v:.4f}" for v in OLD["test_loss"])
            + f", {pm(OLD['test_loss'])}.", "",
            "Wall time of the training steps per seed (s): " + ", ".join(
                f"{s[k]['wall_time']:.0f}" for k in keys)
            + f" on {res.get('device', 'this machine')} (the first seed's includes the "
            "compilation).", ""]
  return "\n".join(lines)


def plot(res: dict, out: str) -> None:
  """``out/loss_vs_step.png``: each seed's validation and training loss against the step."""
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for i, k in enumerate(sorted(res["seeds"], key=int)):
    with open(os.path.join(out, f"seed{k}", "metrics.jsonl")) as f:
      h = [json.loads(line) for line in f]
    ax.plot([r["step"] for r in h], [r["test_loss"] for r in h], "o-", ms=3, color=f"C{i}",
            label=f"seed {k}, validation (whole split)")
    ax.plot([r["step"] for r in h], [r["train_loss"] for r in h], "--", color=f"C{i}",
            label=f"seed {k}, training (240 windows)")
  ax.axhline(1.88, color="k", lw=0.8, ls=":", label="nanoGPT README: about 1.88")
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats/char)")
  ax.set_ylim(1.5, 3.0)
  ax.set_title("nanoGPT's model and CPU setting, shakespeare_char", fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  common.save_figure(fig, os.path.join(out, "loss_vs_step.png"))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--workdir", default=os.path.join("runs", "nanogpt"))
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  p.add_argument("--steps", type=int, default=2000, help="nanoGPT's max_iters")
  p.add_argument("--iters", type=int, default=20, help="nanoGPT's eval_iters")
  p.add_argument("--draws", type=int, default=50)
  a = p.parse_args()
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "results.json")
  res = {"command": common.repo_relative("python experiments/reproduce_nanogpt.py "
                                         + " ".join(sys.argv[1:])),
         "iters": a.iters, "draws": a.draws, "seeds": {}}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    res.update({k: old[k] for k in ("seeds", "device") if k in old})
  for seed in a.seeds:
    if str(seed) not in res["seeds"]:
      import jax
      res["seeds"][str(seed)] = run_seed(a, seed)
      res["device"] = jax.devices()[0].device_kind
      common.write_results(a.out, res, markdown(res))
  common.write_results(a.out, res, markdown(res))
  plot(res, a.out)


if __name__ == "__main__":
  main()
