"""A study's runs: each cached under ``OUT/runs/<key>/run.json`` (``key``: a hash of the run's
whole config as JSON), the missing ones trained by the sweep's machinery
(:func:`nbsgd_jax.run.sweep.train_runs`: runs of one structure, differing in hyperparameters
and seeds only, share one program) with one progress bar over the study's runs."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Optional

import ml_collections
from tqdm.auto import tqdm

from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.run import grid as grid_lib
from nbsgd_jax.run import sweep as sweep_lib


def run_key(cfg: ml_collections.ConfigDict) -> str:
  """The run's cache key: 16 hex digits of the SHA-1 of its config as sorted JSON."""
  text = cfg.to_json_best_effort(sort_keys=True)
  return hashlib.sha1(text.encode()).hexdigest()[:16]


class Store:
  """The run cache of a study (``root``: ``OUT/runs``) and its progress bar.

  Attributes:
    root: the cache's directory.
    bar: the tqdm bar over the study's runs (its total grows as the study adds runs).
    trained: the keys trained by this process (``--redo`` retrains a run once).
  """

  def __init__(self, root: str, progress: bool = True):
    self.root = root
    self.bar = tqdm(total=0, disable=not progress, desc="study", unit="run",
                    dynamic_ncols=True, mininterval=1.0)
    self.trained: set = set()

  def path(self, key: str) -> str:
    return os.path.join(self.root, key, "run.json")

  def read(self, key: str) -> Optional[dict]:
    """The cached run ``key``, or None."""
    try:
      with open(self.path(key)) as f:
        return json.load(f)
    except FileNotFoundError:
      return None

  def get(self, jobs: list) -> list[Optional[dict]]:
    """The runs of ``jobs``, each ``(cfg, label, mode)``: ``mode`` "train" (read from the
    cache or trained), "redo" (trained again, once per process) or "cached" (read, or None:
    an unfinished run, for ``--only``). Runs with the same key are one run.

    Returns:
      per job its record: ``{"key", "label", "config", "summary" (without the history),
      "history", "diverged" (the error, or None), "seconds", "provenance" (the code that
      trained it: :func:`nbsgd_jax.core.provenance.provenance`)}``, or None.
    """
    keys = [run_key(cfg) for cfg, _, _ in jobs]
    todo: dict = {}
    for key, (cfg, label, mode) in zip(keys, jobs):
      fresh = mode == "redo" and key not in self.trained
      if mode != "cached" and key not in todo and (fresh or self.read(key) is None):
        todo[key] = (cfg, label)
    self.bar.total += len(set(keys))
    self.bar.update(len(set(keys)) - len(todo))
    self._train(todo)
    return [self.read(key) for key in keys]

  def _train(self, todo: dict) -> None:
    """Train the runs ``todo`` (``{key: (cfg, label)}``), grouped by structure
    (:func:`nbsgd_jax.run.grid.groups`): a group as one :func:`~nbsgd_jax.run.sweep.
    train_runs` call where its runs stack (a GPU, ``sweep_runs="stacked"``), else run by run
    (the compiled program reused, :data:`nbsgd_jax.run.step.PROGRAMS`); each record written
    as its call returns, so a stopped study resumes there."""
    keys = list(todo)
    runs = [grid_lib.Run(k, {}, todo[k][0]) for k in keys]
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
    cfg, label = job
    history = summary.pop("history", [])
    diverged = summary.get("error", "diverged") if summary.get("stopped") == "diverged" else None
    record = {"key": key, "label": label, "config": json.loads(cfg.to_json_best_effort()),
              "summary": summary, "history": history, "diverged": diverged,
              "seconds": seconds, provenance_lib.KEY: provenance_lib.provenance()}
    os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
    files_lib.atomic_write(self.path(key), json.dumps(record, default=str))
    self.trained.add(key)

  def close(self) -> None:
    self.bar.close()
