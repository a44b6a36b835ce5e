"""A study's runs: each cached under ``OUT/runs/<key>/run.json`` (``key``: a hash of the run's
whole config as JSON; a run cached under another key whose stored config is this run's by the
resume rule, :func:`nbsgd_jax.run.records.config_diff`, is this run: one made before a key
existed, at its default, or under a key's old name), the missing ones trained by the sweep's machinery
(:func:`nbsgd_jax.run.sweep.train_runs`: runs of one structure, differing in hyperparameters
and seeds only, share one program) with one progress bar over the study's runs.

Each record carries the provenance of the code that trained it
(:func:`nbsgd_jax.core.provenance.provenance`). The store refuses to train into a cache whose
runs were made by another commit (:meth:`Store.check_commits`; a record without provenance
counts as commit None) unless ``allow_mixed``; reading never needs it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Optional

import ml_collections
from tqdm.auto import tqdm

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.run import grid as grid_lib
from nbsgd_jax.run import records as records_lib
from nbsgd_jax.run import sweep as sweep_lib


def commit_of(record: Optional[dict]) -> Optional[str]:
  """The commit that trained a cached run (its provenance's ``"commit"``), or None: a record
  made before provenance, or by code outside a git checkout."""
  return (provenance_lib.of(record) or {}).get("commit")


def run_key(cfg: ml_collections.ConfigDict) -> str:
  """The run's cache key: 16 hex digits of the SHA-1 of its config as sorted JSON."""
  text = cfg.to_json_best_effort(sort_keys=True)
  return hashlib.sha1(text.encode()).hexdigest()[:16]


def make_record(key: str, cfg: ml_collections.ConfigDict, label: str, summary: dict,
                seconds: float) -> dict:
  """A cached run's record (:meth:`Store.get`'s), from its :func:`~nbsgd_jax.run.loop.train`
  summary (``history`` taken out of it)."""
  history = summary.pop("history", [])
  diverged = summary.get("error", "diverged") if summary.get("stopped") == "diverged" else None
  return {"key": key, "label": label, "config": json.loads(cfg.to_json_best_effort()),
          "summary": summary, "history": history, "diverged": diverged,
          "seconds": seconds, provenance_lib.KEY: provenance_lib.provenance()}


class Store:
  """The run cache of a study (``root``: ``OUT/runs``) and its progress bar.

  Attributes:
    root: the cache's directory.
    bar: the tqdm bar over the study's runs (its total grows as the study adds runs).
    trained: the keys trained by this process (``--redo`` retrains a run once).
    allow_mixed: train into a cache of another commit's runs (``--allow_mixed``).
    mixed: whether this process trained into a cache holding another commit's runs.
    used: ``{key: commit}`` of every run read for the study (:func:`commit_of`).
    prepare: ``configs -> configs``, called on the configs about to train (after
      :meth:`check_commits`): the configs trained, their records keeping the given ones (a
      study's prefix trains there and resolves ``init_from``: :mod:`nbsgd_jax.study.stages`).
  """

  def __init__(self, root: str, progress: bool = True, allow_mixed: bool = False,
               prepare=None):
    self.root = root
    self.prepare = prepare or (lambda cfgs: cfgs)
    self.bar = tqdm(total=0, disable=not progress, desc="study", unit="run",
                    dynamic_ncols=True, mininterval=1.0)
    self.trained: set = set()
    self.allow_mixed, self.mixed, self.used = allow_mixed, False, {}
    self._checked = False
    self.aliases: dict = {}  # key -> the key its run is cached under (:meth:`find`)
    self._stored: Optional[list] = None

  def path(self, key: str) -> str:
    return os.path.join(self.root, self.aliases.get(key, key), "run.json")

  def read(self, key: str) -> Optional[dict]:
    """The cached run ``key``, or None."""
    try:
      with open(self.path(key)) as f:
        return json.load(f)
    except FileNotFoundError:
      return None

  def find(self, key: str, cfg: ml_collections.ConfigDict) -> None:
    """Where run ``key`` is not cached under its key, look for a cached run whose stored
    config is ``cfg`` by the resume rule (:func:`nbsgd_jax.run.records.config_diff`: a key
    added since, at its default, or renamed, is the same) and read ``key`` from it."""
    if key in self.aliases or os.path.isfile(self.path(key)):
      return
    if self._stored is None:
      names = sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []
      self._stored = [(n, r["config"]) for n in names for r in [self.read(n)] if r]
    cheap = ("algorithm", "seed", "learning_rate", "num_steps")  # most candidates fail here
    for name, stored in self._stored:
      if all(stored.get(k) == cfg.get(k) for k in cheap) and not records_lib.config_diff(
          stored, cfg):
        self.aliases[key] = name
        return

  def get(self, jobs: list) -> list[Optional[dict]]:
    """The runs of ``jobs``, each ``(cfg, label, mode)``: ``mode`` "train" (read from the
    cache or trained), "redo" (trained again, once per process) or "cached" (read, or None:
    an unfinished run, for ``--only``). Runs with the same key are one run.

    Returns:
      per job its record: ``{"key", "label", "config", "summary" (without the history),
      "history", "diverged" (the error, or None), "seconds", "provenance" (the code that
      trained it: :func:`nbsgd_jax.core.provenance.provenance`)}``, or None.

    Raises:
      ConfigError: a run must train into a cache of another commit's runs and not
        ``allow_mixed`` (:meth:`check_commits`), before anything trains.
    """
    keys = [run_key(cfg) for cfg, _, _ in jobs]
    todo: dict = {}
    for key, (cfg, label, mode) in zip(keys, jobs):
      self.find(key, cfg)
      fresh = mode == "redo" and key not in self.trained
      if mode != "cached" and key not in todo and (fresh or self.read(key) is None):
        todo[key] = (cfg, label)
    self.bar.total += len(set(keys))
    self.bar.update(len(set(keys)) - len(todo))
    if todo:
      self.check_commits()
    self._train(todo)
    records = [self.read(key) for key in keys]
    self.used.update((k, commit_of(r)) for k, r in zip(keys, records) if r)
    return records

  def cached_commits(self) -> dict:
    """``{commit: number of runs}`` over every run in the cache (None: no provenance)."""
    names = sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []
    out: dict = {}
    for key in names:
      if os.path.isfile(self.path(key)):
        commit = commit_of(self.read(key))
        out[commit] = out.get(commit, 0) + 1
    return out

  def check_commits(self) -> None:
    """Before this process first trains: the cache's runs all made by this commit
    (:func:`nbsgd_jax.core.provenance.git_commit`; a dirty tree at the same commit counts as
    the same), or ``allow_mixed`` (then :attr:`mixed`).

    Raises:
      ConfigError: the cache holds runs of another commit and not ``allow_mixed`` (one line:
        the cache, the commits found, ``--allow_mixed``).
    """
    if self._checked:
      return
    mine = provenance_lib.git_commit()
    found = self.cached_commits()
    others = [c for c in found if c != mine]
    if others and not self.allow_mixed:
      here = provenance_lib.short({"commit": mine, "dirty": provenance_lib.git_dirty()})
      raise config_lib.ConfigError([
          f"--allow_mixed=False is not allowed: the run cache {self.root} holds runs made by "
          f"commit {', '.join(f'{_short(c)} ({_runs(found[c])})' for c in found)} and this code "
          f"is commit {here if mine else None}; pass --allow_mixed to train new runs into it "
          "anyway (results.json then says mixed), or use another --out"])
    self.mixed, self._checked = bool(others), True

  def _train(self, todo: dict) -> None:
    """Train the runs ``todo`` (``{key: (cfg, label)}``), grouped by structure
    (:func:`nbsgd_jax.run.grid.groups`): a group as one :func:`~nbsgd_jax.run.sweep.
    train_runs` call where its runs stack (a GPU, ``sweep_runs="stacked"``), else run by run
    (the compiled program reused, :data:`nbsgd_jax.run.step.PROGRAMS`); each record written
    as its call returns, so a stopped study resumes there. :attr:`prepare` first."""
    keys = list(todo)
    cfgs = self.prepare([todo[k][0] for k in keys])  # the records keep todo's configs
    runs = [grid_lib.Run(k, {}, c) for k, c in zip(keys, cfgs)]
    for group in grid_lib.groups(runs):
      chunks = [group] if sweep_lib.stacks(runs[group[0]].cfg) else [[i] for i in group]
      for chunk in chunks:
        self.bar.set_description(f"study: {todo[keys[chunk[0]]][1]}")
        start = time.time()
        summaries = sweep_lib.train_runs([runs[i].cfg for i in chunk])
        share = (time.time() - start) / len(chunk)
        for i, summary in zip(chunk, summaries):
          self._write(keys[i], todo[keys[i]], summary, share)
        self.bar.update(len(chunk))

  def _write(self, key: str, job: tuple, summary: dict, seconds: float) -> None:
    record = make_record(key, job[0], job[1], summary, seconds)
    os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
    files_lib.atomic_write(self.path(key), json.dumps(record, default=str))
    self.trained.add(key)

  def close(self) -> None:
    self.bar.close()


def _short(commit: Optional[str]) -> str:
  return commit[:10] if commit else "None"


def _runs(n: int) -> str:
  return f"{n} run{'s' if n != 1 else ''}"
