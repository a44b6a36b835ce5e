"""Non-blocking SGD against its blocking baselines over a grid of cluster heterogeneity.

He & Dube, "Accelerating Parallel Stochastic Gradient Descent via Non-blocking Mini-batches"
(arXiv 2211.00889). Claim: up to 2x less time to the same training loss than D-PSGD and
MATCHA on heterogeneous workers.

    python experiments/reproduce_nonblocking.py --quick --out docs/nonblocking/quick   # < 10 min
    python experiments/reproduce_nonblocking.py --out docs/nonblocking         # the study
    python experiments/reproduce_nonblocking.py --asynchronous --out docs/nonblocking/asynchronous \
        --seeds 0 1 2 --tune_seed 3                                           # against asynchrony

The study (docs/nonblocking.md has the set-up, the rule and the numbers):

* **Cells** (``CELLS``): worker speeds lognormal(sigma) normalised to the fastest, and
  straggler delays Bernoulli(p) x Exponential(mean) per worker per step (mean in units of a
  full batch's compute time T_b = B x time_per_example), from homogeneous and delay-free to
  heavy stragglers.
* **Algorithms** ``allreduce_ring``, ``dpsgd`` (ring), ``matcha`` (Erdos-Renyi base graph,
  budget 0.5), each blocking (M = 1: the whole batch at once) and non-blocking (M = 4
  mini-batches, deadline ``fastest``).
* **Learning rates** from ``--lrs`` with momentum 0.9, chosen on ``--tune_seed``: blocking on the
  steps-to-target (a blocking run's trajectory does not depend on the cluster, so this choice
  holds in every cell); non-blocking separately in every cell on the time to target.
* **Target** (per algorithm and seed): the lowest training loss (averaged model, 1000
  examples) the blocking run at its chosen learning rate reaches within 80 % of its step
  budget. Every other run (non-blocking and the baselines) is given the same simulated time
  budget: ``--time_factor`` x the blocking run's (same algorithm, seed and cell), capped at
  ``--nb_step_factor`` x its steps, and stops at the target (``stop_train_loss``,
  ``stop_sim_time``); a run that never reaches the target counts as not reached (no
  speed-up is made up for it).
* **Baselines** (``allreduce_ring``, every heterogeneous cell): backup workers (Chen et al.
  2016: wait for the fastest K = n - n/8 workers and drop the rest, i.e. M = 1 with deadline
  ``kth:K``) and a fixed deadline of ``--fixed_deadline`` x T_b seconds with M = 4; each at
  the better of the blocking and non-blocking learning rates on ``--tune_seed``.
* **Seeds** ``--seeds``: a seed sets the initialisation, the data order and the cluster draw.
  The learning rates are chosen on ``--tune_seed`` (default 3, a seed not reported).
* ``--asynchronous``: the four cells without the heavy one, All-Reduce and D-PSGD, and beside
  D-PSGD's non-blocking variant AD-PSGD and SwarmSGD (H = 2) on the event clock and
  Overlap-SGP on the one-peer exponential graph (``ASYNCHRONOUS``), each with its own rate per
  cell; rows add the bytes sent per worker to the target and the staleness of the run's
  applied gradients (its last record: the mean over every event it applied;
  :mod:`nbsgd_jax.host.events`): tau, the paper's (every worker's events between a
  gradient's read and its application, Lian et al. 2018), with its largest value; the
  own-model count (the changes to the worker's own model in between); and seconds from the
  read.
* ``--replay_staleness`` (with ``--out`` of an ``--asynchronous`` study): the staleness of
  its event-clock rows recomputed without training, by replaying each run's event clock (the
  events depend on the cluster and the seeds alone, not on the model) to the evaluation at
  which it stopped (the first whose simulated time reaches its time to target), then
  ``results.json`` and ``results.md`` written again (:func:`replay_staleness`).
* Full study only: the update order of the gossip algorithms (``atc``, the default, against
  ``parallel``) in the heterogeneous reference cell, and a row in the paper's likely setting
  (MATCHA's 8-node graph 0, 8 workers, the CNN).

Every run's history is cached in ``--runs_dir`` (default ``OUT/runs``) under a hash of its
config, so a crashed study resumes. Writes ``OUT/results.json`` (``time_to_target`` of the
reference cell, mean over seeds, keys allreduce / nb_allreduce / dpsgd / nb_dpsgd / matcha /
nb_matcha; ``cells``: every cell's speed-ups with mean, std, per seed, learning rates and the
fraction of mini-batches used), ``OUT/results.md``, ``OUT/speedup.png`` (speed-up per cell) and
``OUT/loss_vs_time.png`` (the reference cell's curves).
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

import numpy as np  # noqa: E402

import common  # noqa: E402  (experiments/common.py)
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import train  # noqa: E402

ALGORITHMS = ("allreduce_ring", "dpsgd", "matcha")
KEYS = {"allreduce_ring": "allreduce", "dpsgd": "dpsgd", "matcha": "matcha"}
BATCH, M, TIME_PER_EXAMPLE = 32, 4, 1.25e-3
T_B = BATCH * TIME_PER_EXAMPLE  # seconds: a full batch at the fastest speed, no delay

# name -> (lognormal sigma of the speeds, delay probability, delay mean in units of T_B)
CELLS = {
    "homogeneous": (0.0, 0.0, 0.0),
    "speeds 0.3": (0.3, 0.0, 0.0),
    "stragglers": (0.0, 0.1, 1.0),
    "speeds 0.3 + stragglers": (0.3, 0.1, 1.0),
    "speeds 0.6 + heavy stragglers": (0.6, 0.2, 2.0),
}
REFERENCE_CELL = "speeds 0.3 + stragglers"
TARGET_FRACTION = 0.8
# a blocking run whose target is above this fraction of its initial training loss did not
# train (a dead network, a divergence): its seed has no target and no speed-up
TRAINED_FRACTION = 0.5


# ----------------------------------------------------------------------------- runs


def make_config(a, algorithm: str, lr: float, seed: int, cell: str, nb: bool = False,
                deadline="fastest", minibatches: int = M, budget=None, events=False,
                as_algorithm=None, **extra):
  """One run's config; ``budget``: ``(target loss, seconds)`` at which a non-blocking run
  stops (it runs ``--nb_step_factor`` x ``--steps`` steps at most; ``events``: a run on the
  event clock, whose steps are batches of events, ``--event_step_factor`` x ``--steps``;
  ``as_algorithm``: a variant of ``algorithm`` that is another registration, on its graph)."""
  spread, prob, mean = CELLS[cell]
  c = config_lib.default_config()
  c.algorithm = algorithm
  c.num_workers = a.workers
  c.model = a.model
  c.topology = a.topology if algorithm != "allreduce_ring" else "ring"
  if algorithm == "matcha":
    c.topology = a.matcha_topology
    c.matcha.budget = 0.5
  c.batch_size = BATCH
  c.learning_rate = lr
  c.momentum = 0.9
  factor = a.event_step_factor if events else (a.nb_step_factor if nb else 1)
  c.num_steps = int(round(a.steps * factor))
  c.eval_every = a.eval_every
  c.eval_train_examples = 1000
  c.seed = seed
  c.progress = False
  c.cluster.seed = seed
  c.cluster.time_per_example = TIME_PER_EXAMPLE
  if spread > 0:
    c.cluster.scenario, c.cluster.spread = "lognormal", spread
  if prob > 0:
    c.cluster.delay = "bernoulli_exponential"
    c.cluster.delay_prob, c.cluster.delay_mean = prob, mean * T_B
  if budget is not None:
    c.stop_train_loss, c.stop_sim_time = budget
  if nb:
    c.nonblocking.enabled = True
    c.nonblocking.num_minibatches = minibatches
    c.nonblocking.deadline = deadline
  if as_algorithm is not None:
    c.algorithm = as_algorithm
  return config_lib.override(c, extra)


def cache_index(runs_dir: str) -> dict:
  """key -> path of every cached run in ``runs_dir``."""
  index = {}
  for name in sorted(os.listdir(runs_dir)):
    if name.endswith(".json"):
      with open(os.path.join(runs_dir, name)) as f:
        index[common.cache_key(json.load(f)["config"])] = os.path.join(runs_dir, name)
  return index


def run(a, cfg) -> dict:
  """The run's ``{"history", "minibatch_fraction", "diverged"}``, from the cache or trained
  (:func:`run_many` of this one config, when no stage prefetched it)."""
  text = cfg.to_json_best_effort(sort_keys=True)
  key = common.cache_key(json.loads(text))
  path = a.cache.get(key, os.path.join(a.runs_dir, key + ".json"))
  if not os.path.exists(path):
    run_many(a, [cfg])
  with open(path) as f:
    out = json.load(f)
  a.seconds[key] = out["real_seconds"]
  return out


def _result(s: dict) -> dict:
  """What the cache keeps of a run's summary."""
  if s.get("stopped") == "diverged":
    return {"history": [], "minibatch_fraction": float("nan"), "diverged": True}
  keys = ("step", "sim_time", "train_loss", "bytes_sent") + STALENESS
  return {"history": [{k: h[k] for k in keys if k in h} for h in s["history"]],
          "minibatch_fraction": s["history"][-1].get("minibatch_fraction", 1.0),
          "steps": s["steps"], "stopped": s["stopped"], "diverged": False}


def run_many(a, cfgs: list) -> None:
  """Train the configs the cache lacks as one call (``nbsgd_jax.train.train_runs``: one
  program per structure, the runs stacked) and cache each run as :func:`run` does; a run's
  ``real_seconds`` is its share of the call's."""
  todo, seen = [], set()
  for cfg in cfgs:
    text = cfg.to_json_best_effort(sort_keys=True)
    key = common.cache_key(json.loads(text))
    path = a.cache.get(key, os.path.join(a.runs_dir, key + ".json"))
    if key not in seen and not os.path.exists(path):
      seen.add(key)
      todo.append((cfg, text, key, path))
  if not todo:
    return
  t = time.time()
  summaries = train.train_runs([c for c, *_ in todo])
  share = (time.time() - t) / len(todo)
  for (cfg, text, key, path), s in zip(todo, summaries):
    out = {**_result(s), "config": json.loads(text), "real_seconds": share}
    common.write_atomic(path, json.dumps(out))
    a.seconds[key] = share
    a.trained += 1
  print(f"    trained {len(todo)} runs as sweeps ({time.time() - t:.0f} s)", flush=True)


def lowest_loss(history: list, last_step: float) -> float:
  """The lowest training loss evaluated at steps <= ``last_step`` (inf if none)."""
  losses = [h["train_loss"] for h in history if h["step"] <= last_step]
  return min(losses) if losses else math.inf


def untrained(history: list, target: float) -> bool:
  """Whether the blocking run of ``history`` did not train: its target (the lowest loss within
  its first ``TARGET_FRACTION`` of steps) is above ``TRAINED_FRACTION`` x its initial loss. A
  speed-up to such a target (e.g. 2.28 from 2.31 for a CNN that died at step 20) measures
  nothing."""
  return not target <= TRAINED_FRACTION * history[0]["train_loss"]


def time_to_target(history: list, target: float):
  """Simulated seconds until ``train_loss <= target`` (linear interpolation between
  evaluations), or None if never."""
  return common.time_to(history, target, "train_loss")


def _best(runs: dict, score) -> float:
  """The key of ``runs`` with the lowest ``score(run)`` (ties: the first)."""
  return min(runs, key=lambda k: score(runs[k]))


# ----------------------------------------------------------------------------- study


def blocking_lrs(a, cell0: str) -> dict:
  """Per algorithm, the learning rate whose blocking run on the tuning seed reaches the lowest
  loss within 80 % of its budget."""
  out = {}
  for algo in a.algorithms:
    runs = {lr: run(a, make_config(a, algo, lr, a.tune_seed, cell0)) for lr in a.lrs}
    out[algo] = _best(runs, lambda r: lowest_loss(r["history"], TARGET_FRACTION * a.steps))
  return out


def _end_time(r) -> float:
  """A run's simulated seconds at its last evaluation (0: diverged, no time budget)."""
  return r["history"][-1]["sim_time"] if r["history"] else 0.0


def _ttt_or_inf(r, target):
  t = time_to_target(r["history"], target)
  return math.inf if t is None else t


def _stats(values: list) -> dict:
  """Mean and sample standard deviation (ddof = 1; None below two values) over the seeds that
  reached the target (None in ``values``: not reached)."""
  got = [v for v in values if v is not None]
  return {"mean": float(np.mean(got)) if got else None,
          "std": float(np.std(got, ddof=1)) if len(got) > 1 else None,
          "per_seed": values, "reached": len(got)}


def restat(obj):
  """``obj`` (a results.json tree) with every statistic recomputed from its ``per_seed``
  values by :func:`_stats` (``--from_results``: the tables again without training)."""
  if isinstance(obj, dict):
    if {"mean", "std", "per_seed", "reached"} <= set(obj):
      return _stats(obj["per_seed"])
    return {k: restat(v) for k, v in obj.items()}
  if isinstance(obj, list):
    return [restat(v) for v in obj]
  return obj


# name -> (config keys, on the event clock): the asynchronous variants of D-PSGD (ring; SGP on
# the time-varying exponential graph of its paper), ``--asynchronous``
ASYNCHRONOUS = {
    "AD-PSGD": ({"as_algorithm": "ad_psgd"}, True),
    "SwarmSGD (H = 2)": ({"as_algorithm": "swarm_sgd"}, True),
    "Overlap-SGP": ({"as_algorithm": "sgp", "sgp.overlap": True,
                     "topology": "one_peer_exponential"}, False),
}


def _budgets(a, algo: str, cell: str, lr_b: dict, targets: dict) -> dict:
  """seed -> ``(target loss, seconds)``: where a run that is not the blocking one stops."""
  blocking = {seed: run(a, make_config(a, algo, lr_b[algo], seed, cell))
              for seed in all_seeds(a)}
  return {seed: (targets[algo, seed], a.time_factor * _end_time(blocking[seed]))
          for seed in all_seeds(a)}


def all_seeds(a) -> list:
  """The tuning seed (``--tune_seed``), then the reported seeds."""
  return list(dict.fromkeys([a.tune_seed, *a.seeds]))


def _grid(a, algo: str, cell: str, kw: dict, budget: dict) -> list:
  """A tuned variant's runs of the learning-rate grid on the tuning seed."""
  return [make_config(a, algo, lr, a.tune_seed, cell, budget=budget[a.tune_seed], **kw)
          for lr in a.lrs]


def _lr_tuned(a, algo: str, cell: str, kw: dict, budget: dict, targets: dict) -> float:
  """A tuned variant's learning rate: the best time to target on the tuning seed."""
  grid = {cfg.learning_rate: run(a, cfg) for cfg in _grid(a, algo, cell, kw, budget)}
  return _best(grid, lambda r: (_ttt_or_inf(r, targets[algo, a.tune_seed]),
                                lowest_loss(r["history"], math.inf)))


def _variants(a, algo: str, cell: str) -> list:
  """``(name, make_config keywords, "tuned" or "baseline")``: a tuned variant's learning rate
  comes from its own grid, a baseline's is the better of the blocking and non-blocking ones."""
  variants = [("non-blocking", dict(nb=True), "tuned")]
  if algo == "allreduce_ring" and cell != "homogeneous" and a.baselines:
    k = a.workers - max(1, a.workers // 8)
    variants += [(f"backup workers (kth:{k})", dict(nb=True, deadline=f"kth:{k}",
                                                    minibatches=1), "baseline"),
                 (f"fixed deadline {a.fixed_deadline:g} T_b",
                  dict(nb=True, deadline=f"{a.fixed_deadline * T_B:g}"), "baseline")]
  if algo == "dpsgd" and a.asynchronous:
    variants += [(name, dict(keys, events=events), "tuned")
                 for name, (keys, events) in ASYNCHRONOUS.items()]
  return variants


def _candidates(a, algo, cell, kw, lr_b, lr_nb, budget) -> list:
  """A baseline's runs on the tuning seed at the two tuned rates."""
  return [make_config(a, algo, x, a.tune_seed, cell, budget=budget[a.tune_seed], **kw)
          for x in {lr_b[algo], lr_nb}]


def _baseline_lr(a, algo, cell, kw, lr_b, lr_nb, budget, targets) -> float:
  """A baseline's rate: the better of the two tuned rates on the tuning seed."""
  cand = {c.learning_rate: run(a, c)
          for c in _candidates(a, algo, cell, kw, lr_b, lr_nb, budget)}
  return _best(cand, lambda r: (_ttt_or_inf(r, targets[algo, a.tune_seed]),
                                lowest_loss(r["history"], math.inf)))


def _rates(a, algo, cell, lr_b, budget, targets) -> dict:
  """variant name -> its learning rate (the tuned grids and the baselines' candidates must
  have been trained)."""
  nb_kw = dict(nb=True)
  lr_nb = _lr_tuned(a, algo, cell, nb_kw, budget, targets)
  return {name: (_lr_tuned(a, algo, cell, kw, budget, targets) if rule == "tuned" else
                 _baseline_lr(a, algo, cell, kw, lr_b, lr_nb, budget, targets))
          for name, kw, rule in _variants(a, algo, cell)}


def prefetch(a, cells: list, lr_b: dict, targets: dict) -> None:
  """Every run :func:`study_cell` reads, trained stage by stage as sweeps (each stage's
  runs need the stage before's results): the tuned variants' grids, then their seeds and the
  baselines' candidates, then the baselines' seeds."""
  plan = [(cell, algo, _budgets(a, algo, cell, lr_b, targets))
          for cell in cells for algo in a.algorithms]
  run_many(a, [c for cell, algo, budget in plan
               for name, kw, rule in _variants(a, algo, cell) if rule == "tuned"
               for c in _grid(a, algo, cell, kw, budget)])
  stage, later = [], []
  for cell, algo, budget in plan:
    lr_nb = _lr_tuned(a, algo, cell, dict(nb=True), budget, targets)
    for name, kw, rule in _variants(a, algo, cell):
      if rule == "baseline":
        stage += _candidates(a, algo, cell, kw, lr_b, lr_nb, budget)
        later.append((cell, algo, kw, lr_nb, budget))
      else:
        lr = _lr_tuned(a, algo, cell, kw, budget, targets)
        stage += [make_config(a, algo, lr, seed, cell, budget=budget[seed], **kw)
                  for seed in a.seeds]
  run_many(a, stage)
  run_many(a, [make_config(a, algo, _baseline_lr(a, algo, cell, kw, lr_b, lr_nb, budget,
                                                  targets), seed, cell, budget=budget[seed],
                           **kw)
               for cell, algo, kw, lr_nb, budget in later for seed in a.seeds])


def at_target(history: list, target: float, key: str):
  """``key`` (e.g. ``bytes_sent``) linearly interpolated at the time the run reaches
  ``target`` (None if never or not recorded)."""
  t = time_to_target(history, target)
  if t is None or not history or key not in history[0]:
    return None
  times = [h["sim_time"] for h in history]
  return float(np.interp(t, times, [h[key] for h in history]))


# the event clock's staleness records (nbsgd_jax.host.events.EventTimes.record)
STALENESS = ("staleness_tau", "staleness_tau_max", "staleness_own_steps", "staleness_s")


def staleness_of(history: list, key: str):
  """A run's staleness ``key`` at its last record: the mean (or, ``_max``, the largest) over
  every event it applied; None if not recorded. (Rows recorded before the paper's tau took the
  mean over the evaluation records instead, the step-0 record's 0 included.)"""
  vals = [h[key] for h in history if h.get(key) is not None]
  return float(vals[-1]) if vals else None


def replay_staleness(a, res: dict) -> dict:
  """``res`` (an ``--asynchronous`` study's results) with its event-clock rows' staleness
  (:data:`STALENESS`) recomputed by replaying each run's event clock, training nothing: the
  run's config (:func:`make_config`; the events depend on the cluster and the seeds alone),
  its clock stepped batch by batch with a record at every evaluation, to the first evaluation
  whose simulated time reaches the seed's time to target, where the run stopped. A seed that
  did not reach the target gets None. The replay's check: its own-model count, averaged over
  the evaluation records as rows recorded before the rename averaged it, must equal their
  ``staleness_steps`` (ValueError otherwise)."""
  for r in res["scenarios"]["main"]["cells"]:
    keys, events = ASYNCHRONOUS.get(r["variant"], ({}, False))
    if not events:
      continue
    per_seed, check = {key: [] for key in STALENESS}, []
    for seed, end in zip(r["seeds"], r["time"]["per_seed"]):
      history = None if end is None else _replay(
          make_config(a, r["algorithm"], r["lr"], seed, r["cell"], events=True, **keys), end)
      for key in STALENESS:
        per_seed[key].append(None if history is None else staleness_of(history, key))
      check.append(None if history is None else mean_of(history, "staleness_own_steps"))
    old = r.pop("staleness_steps", None)
    if old is not None and not np.allclose(
        [np.nan if v is None else v for v in old["per_seed"]],
        [np.nan if v is None else v for v in check], rtol=1e-9, equal_nan=True):
      raise ValueError(f"{r['cell']}, {r['variant']}: the replayed own-model staleness "
                       f"{check} is not the recorded {old['per_seed']}")
    r.update({key: _stats(v) for key, v in per_seed.items()}, staleness_replayed=True)
    print(f"  {r['cell']:30s} {r['variant']:18s} tau {_fmt(r['staleness_tau'], 2, '')}, "
          f"own {_fmt(r['staleness_own_steps'], 2, '')}", flush=True)
  return res


def _replay(cfg, end_time: float) -> list:
  """The clock's records of ``cfg``'s run at step 0 and every ``eval_every`` steps, to the
  first whose ``sim_time`` reaches ``end_time``."""
  import types  # noqa: PLC0415
  from nbsgd_jax import train  # noqa: PLC0415
  clock = train.Stepper.of(train.setup(cfg)).runs[0].host.part("clock")
  history, step = [clock.record()], 0
  while history[-1]["sim_time"] < end_time and step < cfg.num_steps:
    clock.inputs(step, types.SimpleNamespace(per_worker={}), None)
    step += 1
    if step % cfg.eval_every == 0:
      history.append(clock.record())
  return history


def mean_of(history: list, key: str):
  """The mean of ``key`` over a run's evaluations (None if not recorded)."""
  vals = [h[key] for h in history if h.get(key) is not None]
  return float(np.mean(vals)) if vals else None


def study_cell(a, cell: str, lr_b: dict, targets: dict) -> list:
  """Every algorithm's blocking and non-blocking runs in one cell, and the baselines."""
  rows = []
  for algo in a.algorithms:
    blocking = {seed: run(a, make_config(a, algo, lr_b[algo], seed, cell)) for seed in a.seeds}
    budget = _budgets(a, algo, cell, lr_b, targets)
    rates = _rates(a, algo, cell, lr_b, budget, targets)
    for name, kw, _ in _variants(a, algo, cell):
      lr = rates[name]
      speedups, fracs, tb, tn, mb, curves = [], [], [], [], [], None
      stale = {key: [] for key in STALENESS}
      dead = [seed for seed in a.seeds if untrained(blocking[seed]["history"],
                                                    targets[algo, seed])]
      for seed in a.seeds:
        b = blocking[seed]
        r = run(a, make_config(a, algo, lr, seed, cell, budget=budget[seed], **kw))
        if curves is None:  # the first seed's curves, for the plot
          curves = {"blocking": b["history"], "this": r["history"]}
        target = None if seed in dead else targets[algo, seed]
        t_b = None if target is None else time_to_target(b["history"], target)
        t_n = None if target is None else time_to_target(r["history"], target)
        tb.append(t_b)
        tn.append(t_n)
        speedups.append(t_b / t_n if (t_b and t_n) else None)
        fracs.append(r["minibatch_fraction"])
        bytes_at = None if target is None else at_target(r["history"], target, "bytes_sent")
        mb.append(None if bytes_at is None else bytes_at / 1e6 / a.workers)
        for key in STALENESS:
          stale[key].append(staleness_of(r["history"], key))
      rows.append({"cell": cell, "algorithm": algo, "variant": name,
                   "slowdown_sigma": CELLS[cell][0], "delay_prob": CELLS[cell][1],
                   "delay_mean_T_b": CELLS[cell][2], "lr_blocking": lr_b[algo],
                   "lr": lr, "seeds": list(a.seeds), "tune_seed": a.tune_seed,
                   "blocking_untrained": dead,
                   "speedup": _stats(speedups), "time_blocking": _stats(tb),
                   "time": _stats(tn), "mb_per_worker_to_target": _stats(mb),
                   **{key: _stats(v) for key, v in stale.items()},
                   "minibatch_fraction": float(np.nanmean(fracs)),
                   "target_seed0": targets[algo, a.seeds[0]], "curves_seed0": curves})
      sp = rows[-1]["speedup"]
      print(f"  {cell:30s} {algo:14s} {name:26s} speed-up " + _fmt(sp)
            + f" ({sp['reached']}/{len(a.seeds)} seeds), mini-batches used "
            f"{rows[-1]['minibatch_fraction']:.0%}"
            + (f"; blocking did not train on seeds {dead}" if dead else ""), flush=True)
  return rows


def study_order(a, cell: str, lr_b: dict, targets: dict) -> list:
  """Blocking gossip algorithms in the ``parallel`` order against the default ``atc``."""
  rows = []
  for algo in [x for x in a.algorithms if x != "allreduce_ring"]:
    ratios = []
    for seed in a.seeds:
      atc = run(a, make_config(a, algo, lr_b[algo], seed, cell))
      par = run(a, make_config(a, algo, lr_b[algo], seed, cell, **{"dpsgd.order": "parallel"}))
      if untrained(atc["history"], targets[algo, seed]):
        ratios.append(None)
        continue
      t_a = time_to_target(atc["history"], targets[algo, seed])
      t_p = time_to_target(par["history"], targets[algo, seed])
      ratios.append(t_a / t_p if (t_a and t_p) else None)
    rows.append({"cell": cell, "algorithm": algo, "lr": lr_b[algo],
                 "atc_over_parallel_time": _stats(ratios)})
  return rows


def run_scenario(a) -> dict:
  cells = list(a.cells)
  run_many(a, [make_config(a, algo, lr, a.tune_seed, cells[0])
               for algo in a.algorithms for lr in a.lrs])
  lr_b = blocking_lrs(a, cells[0])
  run_many(a, [make_config(a, algo, lr_b[algo], seed, cell)
               for cell in cells for algo in a.algorithms for seed in all_seeds(a)])
  targets = {}
  for algo in a.algorithms:
    for seed in all_seeds(a):
      h = run(a, make_config(a, algo, lr_b[algo], seed, cells[0]))["history"]
      targets[algo, seed] = lowest_loss(h, TARGET_FRACTION * a.steps)
  prefetch(a, cells, lr_b, targets)
  rows = []
  for cell in cells:
    rows += study_cell(a, cell, lr_b, targets)
  out = {"cells": rows, "lr_blocking": lr_b,
         "targets": {f"{k[0]}/seed{k[1]}": v for k, v in targets.items()}}
  if a.order:
    run_many(a, [make_config(a, algo, lr_b[algo], seed, a.reference_cell, **over)
                 for algo in a.algorithms if algo != "allreduce_ring" for seed in a.seeds
                 for over in ({}, {"dpsgd.order": "parallel"})])
    out["order"] = study_order(a, a.reference_cell, lr_b, targets)
  return out


# ----------------------------------------------------------------------------- output


def _fmt(s: dict, digits=2, unit="x") -> str:
  if s["mean"] is None:
    return "not reached"
  extra = "" if s["reached"] == len(s["per_seed"]) else f" ({s['reached']}/{len(s['per_seed'])})"
  spread = "" if s["std"] is None else f" +- {s['std']:.{digits}f}"
  return f"{s['mean']:.{digits}f}{spread}{unit}{extra}"


def _tau(r: dict, na: dict) -> str:
  """The tau cell: mean +- std over the seeds, and the largest over them."""
  tau, top = r.get("staleness_tau", na), r.get("staleness_tau_max", na)
  if tau["mean"] is None:
    return "-"
  return _fmt(tau, 2, "") + f" ({max(v for v in top['per_seed'] if v is not None):.0f})"


def markdown(res: dict) -> str:
  lines = []
  for name, sc in res["scenarios"].items():
    lines += [f"### {name}", "", sc["setting"], "",
              "| cell | algorithm | variant | speed-up (mean +- std, ddof = 1) | mini-batches used | "
              "blocking time to target (s) | MB sent per worker to target | staleness tau "
              "(max) | own-model staleness | staleness from the read, ms | lr (blocking / this) |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sc["cells"]:
      na = {"mean": None, "std": None, "per_seed": [], "reached": 0}
      stale_ms = dict(r.get("staleness_s", na))
      if stale_ms["mean"] is not None:
        stale_ms.update(mean=stale_ms["mean"] * 1e3,
                        std=None if stale_ms["std"] is None else stale_ms["std"] * 1e3)
      lines.append(f"| {r['cell']} | {r['algorithm']} | {r['variant']} | {_fmt(r['speedup'])} "
                   f"| {r['minibatch_fraction']:.0%} | {_fmt(r['time_blocking'], 2, '')} | "
                   f"{_fmt(r.get('mb_per_worker_to_target', na), 1, '')} | "
                   f"{_tau(r, na)} | "
                   f"{_fmt(r.get('staleness_own_steps', na), 2, '').replace('not reached', '-')} | "
                   f"{_fmt(stale_ms, 1, '').replace('not reached', '-')} | "
                   f"{r['lr_blocking']:g} / {r['lr']:g} |")
    dead = [f"{r['cell']}, {r['algorithm']}: seed {', '.join(map(str, r['blocking_untrained']))}"
            for r in sc["cells"] if r.get("blocking_untrained") and r["variant"] == "non-blocking"]
    if dead:
      lines += ["", "Seeds whose blocking run did not train (its target above "
                f"{TRAINED_FRACTION:g} x its initial loss), left out of every row of that cell "
                "and algorithm like a seed that does not reach the target: " + "; ".join(dead)
                + "."]
    if sc.get("order"):
      lines += ["", "Update order (blocking, same learning rate and target): time to target "
                "with `atc` / with `parallel`", "", "| algorithm | atc / parallel |",
                "|---|---:|"]
      for r in sc["order"]:
        lines.append(f"| {r['algorithm']} | {_fmt(r['atc_over_parallel_time'], 3)} |")
    lines.append("")
  lines.append(f"{res['runs']} runs, {res['train_seconds']:.0f} s of training on this machine "
               f"(the sum over runs, cached ones included); this invocation trained "
               f"{res['runs_trained']} and took {res['real_seconds']:.0f} s.")
  return "\n".join(lines) + "\n"


def plot(res: dict, path: str) -> None:
  """Speed-up to the target per cell: a bar for each non-blocking algorithm (and, in
  ``--asynchronous`` studies, each variant of D-PSGD and All-Reduce)."""
  plt = common.pyplot()
  sc = res["scenarios"]["main"]
  several = any(r["variant"] in ASYNCHRONOUS for r in sc["cells"])
  rows = sc["cells"] if several else [r for r in sc["cells"] if r["variant"] == "non-blocking"]
  label = (lambda r: f"{r['algorithm']}, {r['variant']}") if several else \
      (lambda r: r["algorithm"])
  cells = list(dict.fromkeys(r["cell"] for r in rows))
  bars = list(dict.fromkeys(label(r) for r in rows))
  fig, ax = plt.subplots(figsize=(11 if several else 8, 4.6))
  width = 0.8 / len(bars)
  for j, name in enumerate(bars):
    xs, ys, es = [], [], []
    for i, cell in enumerate(cells):
      r = next((r for r in rows if r["cell"] == cell and label(r) == name), None)
      if r is None:
        continue
      xs.append(i + (j - (len(bars) - 1) / 2) * width)
      ys.append(r["speedup"]["mean"] or 0.0)
      es.append(r["speedup"]["std"] or 0.0)
      sp = r["speedup"]
      if sp["reached"] < len(sp["per_seed"]):  # the mean is over the seeds that reached it
        ax.annotate(f"{sp['reached']}/{len(sp['per_seed'])}", (xs[-1], ys[-1] + es[-1]),
                    ha="center", va="bottom", fontsize=7)
    ax.bar(xs, ys, width, yerr=es, capsize=2, label=name)
  ax.axhline(1.0, color="gray", lw=0.8, ls=":")
  ax.set_xticks(range(len(cells)), [c.replace(" + ", "\n+ ") for c in cells], fontsize=8)
  ax.set_ylabel("speed-up to target (blocking / this)")
  ax.set_title("Speed-up over the blocking algorithm, mean +- std over seeds "
               "(k/n: seeds that reached the target)", fontsize=9)
  ax.legend(fontsize=7, ncol=2 if several else 1)
  fig.tight_layout()
  common.save_figure(fig, path)


def plot_curves(res: dict, path: str) -> None:
  """Training loss against simulated time in the reference cell (first seed), blocking
  dashed, non-blocking solid, with each algorithm's target."""
  plt = common.pyplot()
  rows = [r for r in res["scenarios"]["main"]["cells"]
          if r["cell"] == res["reference_cell"] and r["variant"] == "non-blocking"]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for j, r in enumerate(rows):
    for key, ls, label in (("blocking", "--", ""), ("this", "-", "non-blocking ")):
      h = r["curves_seed0"][key]
      ax.plot([x["sim_time"] for x in h], [x["train_loss"] for x in h], ls=ls, color=f"C{j}",
              label=f"{label}{r['algorithm']}")
    ax.axhline(r["target_seed0"], color=f"C{j}", lw=0.8, ls=":")
  ax.set_xlabel("simulated time (s)")
  ax.set_ylabel("training loss (averaged model)")
  ax.set_yscale("log")
  ax.set_title(f"{res['reference_cell']}, seed {rows[0]['seeds'][0]} (dotted: targets)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  common.save_figure(fig, path)


def scenario_args(a, quick: bool) -> dict:
  """name -> the argparse namespace of each scenario."""
  base = dict(vars(a))
  base.update(algorithms=ALGORITHMS, trained=0, reference_cell=REFERENCE_CELL,
              seconds={})  # one dict for every scenario: run key -> seconds it took to train
  if a.asynchronous:  # the grid's four cells, the asynchronous variants beside the others
    cells = [c for c in CELLS if c != "speeds 0.6 + heavy stragglers"]
    return {"main": dict(base, algorithms=("allreduce_ring", "dpsgd"), cells=cells,
                         lrs=a.lrs or [0.1, 0.2, 0.4, 0.8], order=False)}
  if quick:
    main = dict(base, workers=8, steps=150, eval_every=15, cells=["homogeneous", REFERENCE_CELL],
                lrs=a.lrs or [0.2, 0.4], order=False)
    return {"main": main}
  main = dict(base, cells=list(CELLS), lrs=a.lrs or [0.1, 0.2, 0.4, 0.8], order=True)
  out = {"main": main}
  if not a.skip_paper:
    out["paper setting"] = dict(base, workers=8, model="cnn", topology="matcha_graph0",
                                matcha_topology="matcha_graph0", cells=[REFERENCE_CELL],
                                lrs=a.lrs or [0.025, 0.05, 0.1, 0.2], order=False,
                                baselines=False)
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--quick", action="store_true",
                  help="8 workers, 150 steps, 2 cells, 2 learning rates (< 10 min)")
  ap.add_argument("--runs_dir", default=None, help="run cache (default OUT/runs)")
  ap.add_argument("--workers", type=int, default=16)
  ap.add_argument("--steps", type=int, default=200)
  ap.add_argument("--eval_every", type=int, default=20)
  ap.add_argument("--time_factor", type=float, default=1.5,
                  help="non-blocking runs' simulated time budget / the blocking run's")
  ap.add_argument("--nb_step_factor", type=float, default=5.0,
                  help="non-blocking runs' step cap / the blocking run's steps")
  ap.add_argument("--lrs", type=float, nargs="*", default=None)
  ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
  ap.add_argument("--tune_seed", type=int, default=3,
                  help="the seed the learning rates are chosen on (default 3, not among the "
                       "reported --seeds; a seed in --seeds puts the tuning into the report)")
  ap.add_argument("--asynchronous", action="store_true",
                  help="the grid's four cells with AD-PSGD, SwarmSGD and Overlap-SGP beside "
                       "D-PSGD, Non-blocking SGD, All-Reduce and its two baselines")
  ap.add_argument("--event_step_factor", type=float, default=20.0,
                  help="event-clock runs' cap on batches of events / --steps")
  ap.add_argument("--fixed_deadline", type=float, default=1.5,
                  help="the fixed-deadline baseline's deadline, in units of T_b")
  ap.add_argument("--model", default="mlp")
  ap.add_argument("--topology", default="ring", help="dpsgd's graph")
  ap.add_argument("--matcha_topology", default="erdos_renyi")
  ap.add_argument("--no_baselines", dest="baselines", action="store_false")
  ap.add_argument("--skip_paper", action="store_true")
  ap.add_argument("--from_results", action="store_true",
                  help="write results.md and the plots again from OUT/results.json (the "
                       "statistics recomputed from the per-seed values), training nothing")
  ap.add_argument("--replay_staleness", action="store_true",
                  help="recompute an --asynchronous study's staleness from OUT/results.json by "
                       "replaying each run's event clock, training nothing")
  a = ap.parse_args()
  if a.replay_staleness:
    start = time.time()
    with open(os.path.join(a.out, "results.json")) as f:
      results = restat(json.load(f))
    sa = argparse.Namespace(**scenario_args(argparse.Namespace(**dict(
        vars(a), asynchronous=True)), False)["main"])
    results = replay_staleness(sa, results)
    results["cells"] = results["scenarios"]["main"]["cells"]
    common.write_results(a.out, results, markdown(results))
    print(f"wrote {a.out}/results.json and results.md again ({time.time() - start:.0f} s)")
    return
  if a.from_results:
    with open(os.path.join(a.out, "results.json")) as f:
      results = restat(json.load(f))
    common.write_results(a.out, results, markdown(results))
    plot(results, os.path.join(a.out, "speedup.png"))
    plot_curves(results, os.path.join(a.out, "loss_vs_time.png"))
    print(f"wrote {a.out}/results.json, results.md, speedup.png, loss_vs_time.png again")
    return
  a.runs_dir = a.runs_dir or os.path.join(a.out, "runs")
  os.makedirs(a.runs_dir, exist_ok=True)
  a.cache = cache_index(a.runs_dir)
  start = time.time()
  scenarios, trained, seconds = {}, 0, {}
  for name, ns in scenario_args(a, a.quick).items():
    sa = argparse.Namespace(**ns)
    print(f"scenario {name}: {sa.workers} workers, {sa.model}, {sa.steps} steps, "
          f"lrs {sa.lrs}, seeds {sa.seeds}", flush=True)
    res = run_scenario(sa)
    res["setting"] = (f"{sa.workers} workers, {sa.model} on mnist10k, batch {BATCH} "
                      f"(M = {M} for non-blocking, deadline fastest), {sa.steps} steps "
                      f"blocking; the others stop at the target or at {sa.time_factor:g} x "
                      f"the blocking run's simulated time (at most "
                      f"{int(sa.steps * sa.nb_step_factor)} steps), "
                      f"T_b = {T_B * 1e3:g} ms, dpsgd on {sa.topology}, matcha on "
                      f"{sa.matcha_topology} (budget 0.5), momentum 0.9, seeds {sa.seeds} "
                      f"(rates tuned on seed {sa.tune_seed}"
                      + ("" if sa.tune_seed in sa.seeds else ", not reported") + "); "
                      f"target: the lowest loss of the tuned blocking run within "
                      f"{TARGET_FRACTION:.0%} of its steps")
    scenarios[name] = res
    trained += sa.trained
    seconds.update(sa.seconds)
  ref = [r for r in scenarios["main"]["cells"] if r["cell"] == REFERENCE_CELL]
  ttt = {}
  for r in ref:
    if r["variant"] == "non-blocking":
      ttt[KEYS[r["algorithm"]]] = r["time_blocking"]["mean"]
      ttt["nb_" + KEYS[r["algorithm"]]] = r["time"]["mean"]
  results = {"time_to_target": ttt, "reference_cell": REFERENCE_CELL,
             "cells": scenarios["main"]["cells"], "scenarios": scenarios,
             "quick": a.quick, "runs_trained": trained, "runs": len(seconds),
             "train_seconds": sum(seconds.values()), "real_seconds": time.time() - start}
  os.makedirs(a.out, exist_ok=True)
  common.write_results(a.out, results, markdown(results))
  plot(results, os.path.join(a.out, "speedup.png"))
  plot_curves(results, os.path.join(a.out, "loss_vs_time.png"))
  print(f"wrote {a.out}/results.json, results.md, speedup.png, loss_vs_time.png in "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
