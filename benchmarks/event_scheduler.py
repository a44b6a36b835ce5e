"""The event clock's host scheduler at fleet scale (issue 69, item 2): one run each of
asynchronous DiLoCo and HALoS at 1,024 workers in the fleet study's setting, its wall time and
where it goes.

    python benchmarks/event_scheduler.py                              # this checkout
    python benchmarks/event_scheduler.py --roots /tmp/before .        # side by side
    python benchmarks/event_scheduler.py --workers 64 --grads 20      # a quick look

The setting is ``experiments/fleet_study.py``'s (``config()`` with its defaults: least squares
of dimension 32 on heterogeneous shards, 4 regions, messages of a 1B-parameter float32 model,
a 0.5 s step, H = 10, 200 gradients per worker, evaluations every 10, fail-slow episodes at
Greyhound's rates compressed 3,000-fold), seed 0 on the fleet (episodes), each method at the
point the study tuned at that scale (``docs/fleet/results.json``'s picks; the learning rates
below if it is absent). One run is ``nbsgd_jax.train.train(cfg)`` with no workdir, timed whole:
set-up, compilation, the budget's replay of the event schedule
(:meth:`~nbsgd_jax.host.events.EventTimes.steps_for`), the steps and the evaluations.

Measured inside the run, by wrapping the classes' methods (no change to the package):

* ``scheduler``: every :meth:`~nbsgd_jax.host.event_clock.EventClock.next_batch` (the budget's
  replay and the training's batches), the host scheduler proper;
* ``host inputs``: every host part's inputs of every step (:meth:`nbsgd_jax.host.parts.Host.
  inputs`: the scheduler's batches of the training, the masks, the other parts);
* ``replay``: the budget's replay (:meth:`~nbsgd_jax.host.events.EventTimes.steps_for`);
* ``device calls``: the calls of the compiled step (:class:`nbsgd_jax.run.step.Program`):
  their dispatch and, where the device is behind, the wait for it; less the compilation
  inside them;
* ``compilation``: jax's tracing, lowering and compiling (``jax.monitoring``'s
  ``/jax/core/compile/`` durations), wherever it happens;
* ``other``: wall less host inputs, replay, device calls and compilation: set-up, the
  stepper's stacking of the inputs, evaluations and records;
* ``inputs: <part>``, printed per run: each host part's inputs (the clock part's hold the
  training's batches).

The scheduler's share bounds what a faster scheduler could still save: ``wall less
scheduler`` is the run's time with a free one.

``--roots`` runs the same measurement on other checkouts of the repository (each in its own
process, one after the other, on this machine), e.g. a tree of the commit before the
scheduler's change (``git archive <commit> | tar -x -C /tmp/before``): the table has a row per
root and method.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("async_diloco", "halos")
SECONDS = {"wall", "scheduler", "host inputs", "replay", "device calls", "compilation"}
FALLBACK = {"async_diloco": {"learning_rate": 0.4},  # docs/fleet/results.json's 1,024 picks
            "halos": {"learning_rate": 0.4, "halos.lps_lr": 3.2}}


def _subclasses(cls) -> list:
  """Every subclass of ``cls``, at any depth, once each."""
  out = []
  for sub in cls.__subclasses__():
    out += [sub] + _subclasses(sub)
  return list(dict.fromkeys(out))


def study_args(n: int):
  """``experiments/fleet_study.py``'s settings (its command line's defaults) at ``n``."""
  return argparse.Namespace(workers=[n], regions=4, h=10, dim=32, batch=16, step_s=0.5,
                            model_params=1e9, kappa=3000.0, steps=200, eval_every=10,
                            lrs=[0.05, 0.1, 0.2, 0.4], seeds=[0, 1, 2], tune_seed=3)


def tuned(root: str, n: int, method: str) -> dict:
  """The study's pick for ``method`` at ``n`` workers, else :data:`FALLBACK`."""
  path = os.path.join(root, "docs", "fleet", "results.json")
  try:
    with open(path) as f:
      return json.load(f)["scales"][str(n)]["picks"][method]["point"]
  except (OSError, KeyError):
    return FALLBACK[method]


def measure(root: str, n: int, method: str, grads: int) -> dict:
  """One run of ``method`` from the checkout ``root`` (imported from there): its seconds."""
  sys.path[:0] = [root, os.path.join(root, "experiments")]
  import fleet_study  # noqa: E402 (the checkout's)
  import jax
  from nbsgd_jax import train
  from nbsgd_jax.host import async_orders, event_clock, events, parts  # noqa: F401
  from nbsgd_jax.host import regional_servers  # noqa: F401 (its part's inputs are timed)
  from nbsgd_jax.run import step as step_lib

  spent = {"scheduler": 0.0, "host inputs": 0.0, "replay": 0.0, "device calls": 0.0,
           "compilation": 0.0}
  calls = {"batches": 0, "steps": 0}

  def compiled(event, seconds, **kwargs):
    if event.startswith("/jax/core/compile/"):
      spent["compilation"] += seconds

  jax.monitoring.register_event_duration_secs_listener(compiled)

  def timed(cls, name, key, count=None):
    inner = getattr(cls, name)

    def wrapper(*args, **kwargs):
      t, before = time.perf_counter(), spent["compilation"]
      try:
        return inner(*args, **kwargs)
      finally:  # the compilation inside a device call is counted apart
        spent[key] += time.perf_counter() - t - (
            spent["compilation"] - before if key == "device calls" else 0.0)
        if count:
          calls[count] += 1
    setattr(cls, name, wrapper)

  timed(event_clock.EventClock, "next_batch", "scheduler", "batches")
  timed(parts.Host, "inputs", "host inputs", "steps")
  timed(events.EventTimes, "steps_for", "replay")
  timed(step_lib.Program, "__call__", "device calls")
  for cls in _subclasses(parts.HostPart):  # each host part's own inputs
    if "inputs" in vars(cls):
      spent[f"inputs: {cls.__name__}"] = 0.0
      timed(cls, "inputs", f"inputs: {cls.__name__}")
  a = study_args(n)
  a.steps = grads
  cfg = fleet_study.config(a, n, method, 0, tuned(root, n, method), False)
  t = time.perf_counter()
  summary = train.train(cfg)
  wall = time.perf_counter() - t
  return {"root": root, "method": method, "workers": n, "grads": grads, "wall": wall,
          **spent, **calls, "device steps": summary.get("steps"),
          "grads_per_worker": summary.get("grads_per_worker"),
          "sim_time": summary.get("sim_time")}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--roots", nargs="+", default=[ROOT], help="checkouts to time, in turn")
  ap.add_argument("--workers", type=int, default=1024)
  ap.add_argument("--grads", type=int, default=200, help="gradients per worker (the study's)")
  ap.add_argument("--methods", nargs="+", default=list(METHODS))
  ap.add_argument("--one", nargs=2, metavar=("ROOT", "METHOD"), help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.one:  # a child: one run, its JSON on the last line
    print(json.dumps(measure(os.path.abspath(a.one[0]), a.workers, a.one[1], a.grads)))
    return
  rows = []
  for root in a.roots:
    for m in a.methods:
      out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", root, m,
                            "--workers", str(a.workers), "--grads", str(a.grads)],
                           check=True, capture_output=True, text=True).stdout
      r = json.loads(out.strip().splitlines()[-1])
      rows.append(r)
      print(f"{root} {m}: " + ", ".join(
          f"{k} {v:.1f} s" if k in SECONDS or k.startswith("inputs: ") else f"{k} {v:g}"
          for k, v in r.items() if k not in ("root", "method") and v), flush=True)
  print(f"\nMeasured by `python benchmarks/event_scheduler.py {' '.join(sys.argv[1:])}` on "
        f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), "
        f"{datetime.date.today()}; n = {a.workers}, {a.grads} gradients per worker.\n")
  print("| checkout | method | device steps | wall (s) | scheduler (s) | share | wall less "
        "scheduler (s) | host inputs (s) | replay (s) | device calls (s) | compilation (s) | "
        "other (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    other = r["wall"] - r["host inputs"] - r["replay"] - r["device calls"] - r["compilation"]
    print(f"| {r['root']} | {r['method']} | {r['device steps']} | {r['wall']:.1f} | "
          f"{r['scheduler']:.1f} | {r['scheduler'] / r['wall']:.0%} | "
          f"{r['wall'] - r['scheduler']:.1f} | {r['host inputs']:.1f} | {r['replay']:.1f} | "
          f"{r['device calls']:.1f} | {r['compilation']:.1f} | {other:.1f} |")

if __name__ == "__main__":
  main()
