"""A study's prefix (``study.prefix``, issue 71 "stages"): per seed, one run whose end state
starts every other run of that seed (``config.init_from``), the protocol of Douillard et al.
2023 (DiLoCo, arXiv:2311.08105, Sec. 3: every method continues from one model pre-trained
synchronously; ``experiments/diloco_paper.py`` by hand).

The prefix of seed S is the study's base config, then ``prefix.overrides``, ``--quick``'s
overrides (the runs have them: the model's shapes must agree), ``prefix.budget``, ``seed`` S
and a checkpoint at its end (``checkpoint_every``: the first multiple of ``eval_every`` at or
past its last step). It is cached in ``OUT/prefix/<key>/`` (:data:`PREFIX_DIR`; ``key``:
:func:`nbsgd_jax.study.runs.run_key` of its config): the run's workdir (``checkpoints/``,
``metrics.jsonl``, ...) and ``run.json``, the study's record with ``"prefix": true``.

What a run starts from is what ``init_from`` loads (:func:`nbsgd_jax.core.checkpoint.
read_models`): the prefix's newest checkpoint's parameters and model state, averaged over
the workers; the optimizer's state and the step count start fresh, the data order from the
run's seed. Every other run of seed S gets ``init_from = "prefix/<key>"``, a path relative to
the study's directory, in its config and so in its cache key: the key names the prefix by
its own key (a changed prefix changes every run's key) and never by where OUT lies, so a
study directory copied elsewhere, or committed, finds its runs; a prefix cached before a
config key existed is found by the resume rule (:func:`resolve`), and its runs keep their
keys too. The path is made absolute only in the config a run trains with
(:meth:`Prefixes.prepare`, the run cache's ``prepare``); its record keeps the relative one.
One prefix serves every method and variant of its seed: the variants must keep the model's
shapes (a run that does not fit is refused by ``init_from``'s check, the leaf named).

A prefix trains when a run that starts from it must train and its record or its checkpoint
is missing (a committed study holds no checkpoints: reading it trains nothing, a new run
trains the prefix again first); ``--redo`` does not retrain it (delete ``OUT/prefix``).
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Optional

import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax.run import loop as loop_lib
from nbsgd_jax.run import records as records_lib
from nbsgd_jax.study import runs as runs_lib
from nbsgd_jax.study import stats

PREFIX_DIR = "prefix"  # OUT/prefix/<key>/: a prefix's workdir and record


def config(study, base: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """The prefix's config for ``seed`` (module docstring): ``base``, ``prefix.overrides``, the
  study's late (``--quick``) overrides, ``prefix.budget``, ``seed``, ``progress`` off and
  ``checkpoint_every`` the first multiple of ``eval_every`` at or past the budget.

  Raises:
    ConfigError: an unknown key or a value of the wrong type (one line).
  """
  cfg = copy.deepcopy(base)
  unit, amount = study.prefix["budget"]
  budget = {"num_steps": amount, "budget_unit": "steps" if unit == "num_steps" else unit}
  for over in (study.prefix["overrides"], study.late, budget, {"seed": seed, "progress": False}):
    config_lib.override(cfg, over)
  every = cfg.get("eval_every")
  good = isinstance(every, int) and not isinstance(every, bool) and every >= 1
  config_lib.override(cfg, {"checkpoint_every": -(-amount // every) * every if good else amount})
  return cfg


def key(study, base: ml_collections.ConfigDict, seed: int) -> str:
  """The prefix's cache key for ``seed``: :func:`~nbsgd_jax.study.runs.run_key` of
  :func:`config`."""
  return runs_lib.run_key(config(study, base, seed))


def source(study, base: ml_collections.ConfigDict, seed: int) -> str:
  """``init_from`` of seed ``seed``'s runs: ``"prefix/<key>"``, relative to the study's
  directory (``/``-separated on every system: it is part of the runs' keys); the key found by
  :func:`resolve` where the study was resolved, else the prefix's own key."""
  found = (study.prefix.get("sources") or {}).get(seed)
  return found or f"{PREFIX_DIR}/{key(study, base, seed)}"


def resolve(study, base: ml_collections.ConfigDict, out: str):
  """``study`` with ``prefix["sources"]``: per seed (tuning and reported), its runs'
  ``init_from``, ``"prefix/<key>"`` of the prefix cached in ``OUT/prefix`` under its own key,
  else of one whose stored config is this seed's prefix by the resume rule
  (:func:`nbsgd_jax.run.records.config_diff`: a prefix cached before a config key existed, at
  its default, keeps its key, and so its runs keep theirs), else its own key."""
  root = os.path.join(out, PREFIX_DIR)
  names = sorted(os.listdir(root)) if os.path.isdir(root) else []
  stored = [(n, r["config"]) for n in names for r in [_read(os.path.join(root, n))] if r]
  sources = {}
  for seed in dict.fromkeys(study.tune_seeds + study.seeds):
    cfg = config(study, base, seed)
    k = runs_lib.run_key(cfg)
    if _read(os.path.join(root, k)) is None:
      k = next((n for n, c in stored if not records_lib.config_diff(c, cfg)), k)
    sources[seed] = f"{PREFIX_DIR}/{k}"
  return study._replace(prefix={**study.prefix, "sources": sources})


def _read(workdir: str) -> Optional[dict]:
  """The prefix record ``workdir/run.json``, or None."""
  try:
    with open(os.path.join(workdir, "run.json")) as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def has_checkpoint(workdir: str) -> bool:
  """Whether ``workdir`` holds a checkpoint (a step's folder in ``checkpoints/``)."""
  path = os.path.join(workdir, checkpoint_lib.CHECKPOINT_DIR)
  return os.path.isdir(path) and any(n.isdigit() for n in os.listdir(path))


class Prefixes:
  """The prefixes of a study's seeds (tuning and reported) in ``out``, trained on demand.

  Attributes:
    study, base, out: the study (resolved in ``out``: :func:`resolve`), its base config, its
      directory.
    store: the study's run cache (:class:`~nbsgd_jax.study.runs.Store`): its progress bar,
      its ``used`` commits.
    sources: ``{init_from: seed}`` (:func:`source`).
    ready: the seeds whose prefix this process found or trained with its checkpoint.
  """

  def __init__(self, study, base: ml_collections.ConfigDict, out: str, store):
    self.study, self.base, self.out, self.store = study, base, out, store
    seeds = tuple(dict.fromkeys(study.tune_seeds + study.seeds))
    self.sources = {source(study, base, s): s for s in seeds}
    self.ready: set = set()

  def workdir(self, seed: int) -> str:
    """``OUT/prefix/<key>``: the prefix's workdir (its record: ``run.json`` in it)."""
    src = next(src for src, s in self.sources.items() if s == seed)
    return os.path.join(self.out, *src.split("/"))

  def read(self, seed: int) -> Optional[dict]:
    """The prefix's record, or None: not trained."""
    return _read(self.workdir(seed))

  def prepare(self, cfgs: list) -> list:
    """The configs about to train, each that starts from a prefix of this study with its
    ``init_from`` made absolute (its prefix trained first where :meth:`need` says)."""
    out = []
    for cfg in cfgs:
      seed = self.sources.get(cfg.get("init_from"))
      if seed is not None:
        cfg = config_lib.override(copy.deepcopy(cfg), {"init_from": self.need(seed)})
      out.append(cfg)
    return out

  def need(self, seed: int) -> str:
    """The absolute workdir of seed ``seed``'s prefix, trained if its record or its
    checkpoint is missing.

    Raises:
      ConfigError: the prefix diverged (nothing can start from it; one line).
    """
    wd = os.path.abspath(self.workdir(seed))
    if seed not in self.ready:
      if self.read(seed) is None or not has_checkpoint(wd):
        self._train(seed, wd)
      rec = self.read(seed)
      if rec["diverged"]:
        raise config_lib.ConfigError([
            f"study.prefix={_spec(self.study)} is not allowed: its run of seed {seed} diverged "
            f"({rec['diverged']}); nothing can start from it"])
      self.ready.add(seed)
    return wd

  def _train(self, seed: int, wd: str) -> None:
    """Train seed ``seed``'s prefix in ``wd`` (again from step 0 where no checkpoint is left:
    a record copied without its checkpoints) and write its record."""
    cfg = config(self.study, self.base, seed)
    run = config_lib.override(copy.deepcopy(cfg), {"overwrite": not has_checkpoint(wd)})
    self.store.bar.total += 1
    self.store.bar.set_description(f"study: prefix seed {seed}")
    start = time.time()
    summary = loop_lib.train(run, workdir=wd)
    record = runs_lib.make_record(os.path.basename(wd), cfg, f"prefix seed {seed}", summary,
                                  time.time() - start)
    record["prefix"] = True
    files_lib.atomic_write(os.path.join(wd, "run.json"), json.dumps(record, default=str))
    self.store.bar.update(1)

  def results(self, metric: str) -> dict:
    """``{seed: {"key", "status" ("finished", "diverged", "unfinished"), "final": the final
    ``metric``, "steps"}}`` of every seed's prefix; the records read are added to the run
    cache's ``used`` (their commits count in ``run_commits``)."""
    out = {}
    for src, seed in self.sources.items():
      rec = self.read(seed)
      k = src.split("/")[-1]
      if rec is None:
        out[seed] = {"key": k, "status": "unfinished", "final": None, "steps": None}
        continue
      self.store.used[k] = runs_lib.commit_of(rec)
      out[seed] = {"key": k, "status": "diverged" if rec["diverged"] else "finished",
                   "final": stats.final(rec["history"], metric),
                   "steps": rec["summary"].get("step")}
    return out


def spec(study) -> dict:
  """``results.json``'s ``"prefix_spec"``: ``{"overrides", "budget": {unit: amount}}``."""
  return {"overrides": dict(study.prefix["overrides"]), "budget": dict([study.prefix["budget"]])}


def _spec(study) -> str:
  return repr(spec(study))
