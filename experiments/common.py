"""Helpers shared by the reproduction scripts: atomic result files (a study's
``results.json`` with the provenance of what produced it: :func:`results_json`) and
matplotlib output."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nbsgd_jax.core import files  # noqa: E402  (the repository's package, installed or not)
from nbsgd_jax.core import provenance as provenance_lib  # noqa: E402


def pyplot():
  """``matplotlib.pyplot`` on the non-interactive Agg backend."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save_figure(fig, path: str, dpi: int = 120) -> None:
  """Write ``fig`` to ``path`` through a temporary file (a crash never leaves half a PNG)."""
  files.atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
  import matplotlib.pyplot as plt
  plt.close(fig)


write_atomic = files.atomic_write


def repo_relative(value, root: str = ROOT):
  """``value`` (a record's command line, arguments or settings: a string, or a dict, list or
  tuple of them, nested) with each absolute path in its strings made relative to the
  repository ``root`` (``/x/repo/docs/frontier`` -> ``docs/frontier``, ``/x/shared/data`` ->
  ``../shared/data``), so a committed record names no machine's directories; other values
  as they are (:func:`nbsgd_jax.core.provenance.repo_relative`)."""
  return provenance_lib.repo_relative(value, root)


EARLIER = "provenance_earlier"  # results.json: what wrote the results before this process


def results_json(results: dict, indent=None) -> str:
  """The text of a study's ``results.json``: ``results`` with, under ``provenance``, what
  produces it now (:func:`nbsgd_jax.core.provenance.provenance`: the package's version and
  git commit, the JAX, jaxlib, flax and optax versions, the machine, the command). A
  provenance ``results`` carried that differs in more than its command (read back from an
  earlier ``results.json``: a resumed, merged or redrawn study) joins ``provenance_earlier``
  (a list, oldest first). ``results`` is not changed."""
  now = provenance_lib.provenance()
  earlier = list(results.get(EARLIER) or [])
  was = provenance_lib.of(results)

  def same(a, b):
    return {k: v for k, v in a.items() if k != "command"} == {
        k: v for k, v in b.items() if k != "command"}
  if was is not None and not same(was, now) and was not in earlier:
    earlier.append(was)
  out = {**results, provenance_lib.KEY: now}
  if earlier:
    out[EARLIER] = earlier
  return json.dumps(out, indent=indent)


def write_results_json(path: str, results: dict, indent=None) -> None:
  """``path`` (a study's ``results.json``), atomically: :func:`results_json`."""
  write_atomic(path, results_json(results, indent))


def time_to(history: list, target: float, key: str = "train_loss"):
  """Simulated seconds until ``history``'s ``key`` is at or below ``target``: linear
  interpolation between the evaluations around the first that reaches it (its own time
  when it is the first evaluation or the loss did not fall), or None if none does."""
  prev = None
  for h in history:
    if h[key] <= target:
      if prev is None:
        return h["sim_time"]
      t0, l0, t1, l1 = prev["sim_time"], prev[key], h["sim_time"], h[key]
      return t0 + (t1 - t0) * (l0 - target) / (l0 - l1) if l0 > l1 else t1
    prev = h
  return None


def run_histories(cfgs: list, keep, hooks=None) -> list[dict]:
  """Each config's ``{"history": its evaluation records with the keys ``keep``, "seconds",
  "summary"}``, trained as one call of ``nbsgd_jax.train.train_runs`` (one compiled program
  per structure: a study's seeds and rates compile their step once); ``"seconds"`` is each
  run's share of the call's wall time. A diverged run gives one record of NaNs at
  ``num_steps``, its message under ``"diverged"`` and ``"summary": None``, instead of
  stopping a study. ``hooks``: per config, a tuple of ``train`` hooks (or None)."""
  from nbsgd_jax import train
  t = time.time()
  summaries = train.train_runs(cfgs, hooks=hooks)
  share = (time.time() - t) / max(len(cfgs), 1)
  out = []
  for cfg, s in zip(cfgs, summaries):
    if s.get("stopped") == "diverged":
      nan = float("nan")
      out.append({"history": [{k: (cfg.num_steps if k == "step" else nan) for k in keep}],
                  "seconds": share, "diverged": s.get("error", "diverged"), "summary": None})
    else:
      out.append({"history": [{k: h[k] for k in keep if k in h} for h in s["history"]],
                  "seconds": share, "summary": s})
  return out


def cache_key(config: dict) -> str:
  """A run's cache key (16 hex digits): a hash of its config (a dict, as JSON) without the
  keys of sections that are off, so that keys added to an unused section later do not
  invalidate a cache."""
  import ml_collections
  from nbsgd_jax import config as config_lib
  off = config_lib.inactive_keys(ml_collections.ConfigDict(config))
  flat = {k: v for k, v in config_lib.flatten_dict(config).items() if k not in off}
  return hashlib.sha1(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:16]


def cached_histories(cfgs: list, keep, runs_dir: str) -> list[dict]:
  """:func:`run_histories` of ``cfgs`` through a run cache: each run is read from
  ``runs_dir/<cache_key>.json`` when there, the others trained as one call and each written
  (atomically) as soon as the call returns, so a study stopped at any point resumes where it
  stopped. Each entry is :func:`run_histories`'s without ``"summary"``, plus ``"config"``."""
  os.makedirs(runs_dir, exist_ok=True)
  texts = [c.to_json_best_effort(sort_keys=True) for c in cfgs]
  paths = [os.path.join(runs_dir, cache_key(json.loads(t)) + ".json") for t in texts]
  todo = {p: i for i, p in enumerate(paths) if not os.path.exists(p)}  # one per key
  if todo:
    for i, r in zip(todo.values(), run_histories([cfgs[i] for i in todo.values()], keep)):
      r.pop("summary", None)
      write_atomic(paths[i], json.dumps({**r, "config": json.loads(texts[i])}))
  out = []
  for p in paths:
    with open(p) as f:
      out.append(json.load(f))
  return out


def write_results(out: str, results: dict, markdown: str) -> None:
  """``out/results.json`` (with its provenance: :func:`results_json`) and ``out/results.md``,
  each written atomically; prints the table."""
  write_results_json(os.path.join(out, "results.json"), results)
  write_atomic(os.path.join(out, "results.md"), markdown)
  print(markdown)
