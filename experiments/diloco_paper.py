"""DiLoCo in its own regime: the paper's protocol, the main result of ``reproduce_diloco.py``.

Douillard et al. 2023 (arXiv:2311.08105), Sec. 3 and Table 2: every method continues from
one model pre-trained synchronously; the workers' data are i.i.d. shards; the baselines are
one worker (1x the compute) and data-parallel all-reduce over the 8 workers (8x the batch:
the synchronous baseline DiLoCo is compared with). Here, for each seed:

1. **Prefix**: all-reduce over the 8 workers, ``--prefix_steps`` steps (warm-up, then the
   constant rate ``--lr``), a checkpoint at its end (``OUT/prefix/seed{S}``).
2. **Continuations** from that checkpoint (``config.init_from``: the same model for every
   method; each method's AdamW state starts fresh), ``--steps`` steps each, warm-up then
   cosine to a tenth: ``allreduce`` (8 workers), ``one_worker`` (1 worker, same batch),
   ``diloco_h{H}`` for H in ``--h`` (outer Nesterov, momentum 0.9).
3. **Tuning** on ``--tune_seed`` only (never reported): the inner rate of every method over
   ``--inner_lrs`` (extended by x2 or / 2 while the pick is at its edge, ``--extend``) and,
   for DiLoCo, the outer rate over ``--outer_lrs`` jointly; the pick is
   the lowest final ``train_loss`` (``eval_train_examples`` training windows: the
   validation text plays no part). Whether a pick sits at its grid's edge is recorded.
4. **Reported seeds** (``--seeds``): each method at its pick; ``--ablation``: all-reduce and
   the smallest-H DiLoCo again with contiguous shards (each worker its own 1/8 of the text).

``OUT/results.json`` is rewritten after every group of runs and read back on a restart, so
the study resumes where it stopped (the prefixes' checkpoints are reused too).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time

import numpy as np

import common  # noqa: E402  (experiments/common.py)

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import checkpoint as checkpoint_lib

KEEP = ("step", "sim_time", "wall_time", "bytes_sent", "rounds", "test_loss", "train_loss")


def _methods(a) -> dict:
  """name -> config overrides of the continuation (before its rates)."""
  out = {"allreduce": {"algorithm": "allreduce"},
         "one_worker": {"algorithm": "allreduce", "num_workers": 1}}
  for h in sorted(a.h):
    out[f"diloco_h{h}"] = {"algorithm": "diloco", "diloco.local_steps": h}
  return out


def _grid(a, name: str, lrs: list) -> list[dict]:
  """The tuning grid of one method over the inner rates ``lrs``: its rate overrides."""
  inner = [{"learning_rate": lr, "lr_min": lr * a.lr_min_ratio} for lr in lrs]
  if not name.startswith("diloco"):
    return inner
  return [{**g, "diloco.outer_lr": o} for g in inner for o in a.outer_lrs]


def _key(over: dict) -> str:
  return ",".join(f"{k}={v:g}" for k, v in sorted(over.items()) if k != "lr_min")


def prefix(a, base, seed: int) -> str:
  """The synchronous prefix of ``seed`` (trained once; a finished one is read back): its
  workdir, for ``config.init_from``."""
  from nbsgd_jax import train
  wd = os.path.join(a.out, "prefix", f"seed{seed}")
  if seed in a.prefixes_done:
    return wd
  # the committed records hold no checkpoint (too large): a clone trains the prefix again
  again = not os.path.isdir(os.path.join(wd, checkpoint_lib.CHECKPOINT_DIR))
  cfg = config_lib.override(base(a, seed), {
      "algorithm": "allreduce", "num_steps": a.prefix_steps, "lr_schedule": "constant",
      "learning_rate": a.lr, "lr_min": 0.0, "checkpoint_every": a.prefix_steps,
      "eval_every": a.prefix_steps, "overwrite": again})
  t = time.time()
  s = train.train(cfg, workdir=wd)
  print(f"  prefix seed {seed}: val loss {s['test_loss']:.4f} after {a.prefix_steps} steps "
        f"({time.time() - t:.0f} s)", flush=True)
  a.prefixes_done[seed] = s["test_loss"]
  return wd


def continuation(a, base, seed: int, name: str, rates: dict, partition: str = "iid"):
  over = {**_methods(a)[name], **rates, "init_from": prefix(a, base, seed),
          "partition": partition, "checkpoint_every": 0}
  return config_lib.override(base(a, seed), over)


def _run_group(a, res: dict, where: dict, make: dict, keep=KEEP) -> None:
  """Train the ``{key: () -> config}`` not yet in ``where`` as one call; store; write
  results (a finished group makes no config: its prefix is not needed)."""
  todo = {k: f() for k, f in make.items() if k not in where}
  if not todo:
    return
  t = time.time()
  for k, r in zip(todo, common.run_histories(list(todo.values()), keep)):
    s = r.pop("summary") or {}
    r["model_params"] = s.get("model_params")
    where[k] = r
  import jax
  res["device"] = jax.devices()[0].device_kind
  print(f"    {len(todo)} runs in {time.time() - t:.0f} s", flush=True)
  save(a, res)


def save(a, res: dict) -> None:
  res["seconds"] = res.get("seconds_before", 0.0) + time.time() - res["_start"]
  common.write_results_json(os.path.join(a.out, "results.json"),
                            {k: v for k, v in res.items() if not k.startswith("_")})


def _final(r: dict, key: str) -> float:
  v = r["history"][-1].get(key, float("nan"))
  return v if np.isfinite(v) else float("inf")


def _pick(a, name: str, where: dict, lrs: list) -> dict:
  """The grid point of ``lrs`` with the lowest final training loss, and its edges."""
  grid = {_key(g): g for g in _grid(a, name, lrs)}
  best = min(grid, key=lambda k: _final(where[k], "train_loss"))
  g = grid[best]
  edge = [k for k, vals in (("learning_rate", lrs), ("diloco.outer_lr", a.outer_lrs))
          if k in g and g[k] in (min(vals), max(vals))]
  return {"rates": g, "key": best, "edge": edge, "inner_lrs": sorted(lrs),
          "train_loss": _final(where[best], "train_loss")}


def tune(a, base, res: dict) -> dict:
  """Every method's grid on the tuning seed, the inner rates extended (x2 or / 2, up to
  ``--extend`` times) while the pick is at their edge; name -> its pick (:func:`_pick`)."""
  picks = {}
  for name in _methods(a):
    where, lrs = res["tuning"].setdefault(name, {}), sorted(a.inner_lrs)
    for extension in range(a.extend + 1):
      _run_group(a, res, where, {
          _key(g): functools.partial(continuation, a, base, a.tune_seed, name, g)
          for g in _grid(a, name, lrs)})
      pick = _pick(a, name, where, lrs)
      lr = pick["rates"]["learning_rate"]
      if "learning_rate" not in pick["edge"] or extension == a.extend:
        break
      lrs = sorted(lrs + [lr * 2 if lr == max(lrs) else lr / 2])
    picks[name] = pick
    print(f"  {name}: picked {pick['key']} (train loss {pick['train_loss']:.4f}"
          + (f"; at the grid's edge in {pick['edge']}" if pick["edge"] else "") + ")",
          flush=True)
  res["picks"] = picks
  save(a, res)
  return picks


def report_seeds(a, base, res: dict, picks: dict) -> None:
  """Each method at its pick on every reported seed (and the contiguous ablation)."""
  rows = [(name, name, "iid") for name in _methods(a)]
  if a.ablation:
    rows += [(f"{name}_contiguous", name, "contiguous")
             for name in ("allreduce", f"diloco_h{min(a.h)}")]
  for label, name, part in rows:
    where = res["methods"].setdefault(label, {"method": name, "partition": part,
                                              "rates": picks[name]["rates"], "seeds": {}})
    _run_group(a, res, where["seeds"], {
        str(seed): functools.partial(continuation, a, base, seed, name, picks[name]["rates"],
                                     part)
        for seed in a.seeds})


def run(a, base, settings: dict, command: str) -> dict:
  """The protocol; ``base(a, seed)``: the LM config of ``reproduce_diloco.py``."""
  path = os.path.join(a.out, "results.json")
  settings, command = common.repo_relative(settings), common.repo_relative(command)
  res = {"protocol": "paper", "command": command, "settings": settings, "tuning": {},
         "methods": {}}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    same = lambda d: {k: v for k, v in d.items() if k != "out"}  # noqa: E731
    if same(old.get("settings", {})) == same(settings):
      res.update(old)
      print(f"resuming {path}", flush=True)
  res["seconds_before"], res["_start"] = res.get("seconds", 0.0), time.time()
  a.prefixes_done = {}
  picks = tune(a, base, res)
  report_seeds(a, base, res, picks)
  res.setdefault("prefix_test_loss", {}).update({str(k): v for k, v in a.prefixes_done.items()})
  save(a, res)
  return res


# ----------------------------------------------------------------------------- report


def _stat(values: list) -> str:
  v = np.asarray(values, np.float64)
  if not np.all(np.isfinite(v)):
    return "diverged on some seed"
  return f"{v.mean():.4f} +- {v.std(ddof=1):.4f}" if v.size > 1 else f"{v.mean():.4f}"


def _rates(r: dict) -> str:
  return ", ".join(f"{'inner' if k == 'learning_rate' else 'outer'} {v:g}"
                   for k, v in sorted(r.items()) if k != "lr_min")


def markdown(res: dict) -> str:
  """The tables of the protocol from ``res`` (every number from the records)."""
  s, ms = res["settings"], res["methods"]
  seeds = [str(x) for x in s["seeds"]]
  n_params = next((r["model_params"] for m in ms.values() for r in m["seeds"].values()
                   if r.get("model_params")), None)
  tok = s["steps"] * s["batch"] * s["context"]
  lines = [f"`{res['command']}`", "",
           f"The paper's protocol: a synchronous all-reduce prefix of {s['prefix_steps']} steps "
           f"(8 workers, AdamW lr {s['lr']:g} after {s['warmup']} warm-up steps; validation "
           "loss at its end, per seed: " + ", ".join(
               f"{k}: {v:.4f}" for k, v in sorted(res.get("prefix_test_loss", {}).items()))
           + f"), then every method {s['steps']} more steps from that checkpoint "
           f"({s['batch']} windows of {s['context']} characters per worker per step: {tok:,} "
           f"tokens per worker), warm-up {s['warmup']} then cosine to a tenth of its rate. "
           f"Model: {n_params:,} parameters ({s['layers']} layers, width {s['d_model']}). "
           f"Rates tuned on seed {s['tune_seed']} (not reported) by the final training loss; "
           f"reported seeds {', '.join(seeds)}: mean +- std (ddof = 1).", "",
           "| method | shards | rates (picked) | final val. loss | per seed | MB / worker | "
           "rounds | sim. s |", "|---|---|---|---:|---|---:|---:|---:|"]
  for label, m in ms.items():
    runs = [m["seeds"][k] for k in seeds if k in m["seeds"]]
    if not runs:
      continue
    last = [r["history"][-1] for r in runs]
    lines.append(f"| {label} | {m['partition']} | {_rates(m['rates'])} | "
                 f"{_stat([h['test_loss'] for h in last])} | "
                 + " / ".join(f"{h['test_loss']:.4f}" for h in last)
                 + f" | {np.mean([h['bytes_sent'] for h in last]) / 1e6:,.2f} | "
                 f"{np.mean([h['rounds'] for h in last]):.0f} | "
                 f"{np.mean([h['sim_time'] for h in last]):.2f} |")
  lines += [""] + claim(res) + ["", f"Tuning grid (seed {s['tune_seed']}): final training loss (validation loss) "
            "per point; the pick in bold.", ""]
  for name, grid in res["tuning"].items():
    pick = res["picks"][name]
    cells = [(f"**{k}**" if k == pick["key"] else k) + f": {_final(r, 'train_loss'):.4f} "
             f"({_final(r, 'test_loss'):.4f})" for k, r in grid.items()]
    edge = f" Pick at the grid's edge in {pick['edge']}." if pick["edge"] else ""
    lines.append(f"* {name}: " + "; ".join(cells) + "." + edge)
  lines += ["", f"Total compute: {res['seconds']:.0f} s of wall time for the study "
            f"({res['seconds'] / 60:.1f} min) on {res.get('device', 'this machine')}.", ""]
  return "\n".join(lines)


def _mean_curve(runs: list, x: str) -> tuple:
  """Mean over the runs of ``x`` and ``test_loss`` at the steps every run evaluated."""
  steps = sorted(set.intersection(*[{h["step"] for h in r["history"]} for r in runs]))
  at = lambda r, st: next(h for h in r["history"] if h["step"] == st)  # noqa: E731
  return ([np.mean([at(r, st)[x] for r in runs]) for st in steps],
          [np.mean([at(r, st)["test_loss"] for r in runs]) for st in steps])


def plots(res: dict, out: str) -> None:
  """``loss_vs_time.png`` and ``loss_vs_bytes.png``: validation loss (mean over the reported
  seeds) of every method from the prefix's end."""
  plt = common.pyplot()
  seeds = [str(x) for x in res["settings"]["seeds"]]
  for x, fname, label, log in (("sim_time", "loss_vs_time.png", "simulated s", False),
                               ("bytes_sent", "loss_vs_bytes.png", "MB sent per worker", True)):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, m) in enumerate(res["methods"].items()):
      runs = [m["seeds"][k] for k in seeds if k in m["seeds"]]
      if not runs or (log and name == "one_worker"):
        continue
      xs, ys = _mean_curve(runs, x)
      scale = 1e6 if x == "bytes_sent" else 1.0
      pts = [(u / scale, v) for u, v in zip(xs, ys) if u > 0 or not log]
      ax.plot(*zip(*pts), "o-" if m["partition"] == "iid" else "x--", ms=3,
              color=f"C{i % 10}", label=f"{name} ({_rates(m['rates'])})")
    if log:
      ax.set_xscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("validation loss (nats/char), mean over seeds")
    ax.set_title("DiLoCo, the paper's protocol: continued from the all-reduce prefix",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    common.save_figure(fig, os.path.join(out, fname))


def claim(res: dict) -> list:
  """The paper's claim beside these runs: each method's final validation loss against
  all-reduce's, per reported seed (every number from ``res``)."""
  seeds = [str(x) for x in res["settings"]["seeds"]]
  ms = res["methods"]
  if "allreduce" not in ms:
    return []
  last = lambda m: [ms[m]["seeds"][k]["history"][-1] for k in seeds]  # noqa: E731
  base = last("allreduce")
  lines = ["The paper's claim (Douillard et al. 2023, Table 2 and Sec. 3): 8 workers, "
           "H = 500, from a pre-trained checkpoint on i.i.d. shards of C4: DiLoCo matches or "
           "beats the synchronous 8-worker baseline's perplexity, communicating H x less. "
           "Here, against all-reduce, per reported seed (difference in nats/char; "
           "perplexity ratio of the mean):", ""]
  for name in ms:
    if name == "allreduce" or ms[name]["partition"] != "iid":
      continue
    d = [h["test_loss"] - b["test_loss"] for h, b in zip(last(name), base)]
    ratio = base[0]["bytes_sent"] / max(last(name)[0]["bytes_sent"], 1.0)
    fewer = "no bytes" if not last(name)[0]["bytes_sent"] else f"{ratio:,.0f}x fewer bytes"
    lines.append(f"* {name}: " + " / ".join(f"{v:+.4f}" for v in d)
                 + f" (perplexity x{math.exp(np.mean(d)):.3f}; {fewer}; "
                 + ("lower on every seed" if max(d) < 0 else "higher on every seed"
                    if min(d) > 0 else "lower on some seeds, higher on others") + ").")
  return lines
