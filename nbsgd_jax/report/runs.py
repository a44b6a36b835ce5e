"""Run directories as the report reads them: :func:`load_run` -> :class:`Run`.

A run directory is what :func:`nbsgd_jax.train.train` writes: ``config.json``,
``metrics.jsonl`` (one evaluation per line; the last line may be torn while the run is in
progress) and, once the run has finished, ``summary.json``. Also :func:`_num`, the finite
number of a record's value, which the table and the figures share. :mod:`nbsgd_jax.report`
re-exports these names (the module to import).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.config import renamed as renamed_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib
from nbsgd_jax.run import naming


class NotARunError(ValueError):
  """A directory that is not a run directory (no readable ``config.json``)."""


@dataclasses.dataclass
class Run:
  """One run directory as read from disk.

  Attributes:
    path: the directory, as given.
    name: its base name (the ``run`` column of the table).
    config: ``config.json`` (nested dict) without its ``provenance``.
    flat_config: ``config`` flattened with dotted keys (``"nonblocking.enabled"``).
    records: the complete evaluations of ``metrics.jsonl`` in file order; ``step``,
      ``sim_time`` (s), ``wall_time`` (s), ``bytes_sent`` (bytes per worker, cumulative),
      ``train_loss``, ``test_accuracy``, ... Empty when the run has no evaluation yet.
    skipped_lines: lines of ``metrics.jsonl`` that are not a JSON object with a ``step``
      (a torn last line of a run in progress or crashed).
    summary: ``summary.json``, or None while the run is in progress (or if it crashed).
    unused: the dotted config keys the run does not read (a section that is off, another
      algorithm's section: :func:`nbsgd_jax.config.inactive_keys`).
    as_run: the algorithm as run (:func:`nbsgd_jax.run.naming.algorithm_as_run`), e.g.
      ``"dpsgd + non-blocking (M = 4)"``.
    named: the dotted config keys whose values ``as_run`` states.
    provenance: what produced the run (:func:`nbsgd_jax.core.provenance.provenance`):
      ``summary.json``'s (the process that finished it), else ``config.json``'s (the one that
      started it); None for a run recorded before provenance existed.
  """
  path: str
  name: str
  config: dict
  flat_config: dict
  records: list
  skipped_lines: int
  summary: dict | None
  unused: frozenset = frozenset()
  as_run: str = ""
  named: frozenset = frozenset()
  provenance: dict | None = None

  @property
  def finished(self) -> bool:
    return self.summary is not None


flatten = config_lib.flatten_dict


def load_run(path: str) -> Run:
  """Read a run directory.

  Unparsable lines of ``metrics.jsonl`` (a torn last line) are skipped and counted; a missing
  ``metrics.jsonl`` reads as no evaluation; an unreadable ``summary.json`` as a run in
  progress.

  Args:
    path: a directory written by :func:`nbsgd_jax.train.train`.

  Returns:
    the :class:`Run`.

  Raises:
    NotARunError: ``path`` is not a directory, has no ``config.json`` or an unreadable one.
  """
  if not os.path.isdir(path):
    raise NotARunError("no such directory")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise NotARunError("not a run directory (no config.json)")
  try:
    with open(cfg_path) as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise NotARunError(f"unreadable config.json ({e})") from None
  if not isinstance(config, dict):
    raise NotARunError("unreadable config.json (not a JSON object)")
  started_by = provenance_lib.of(config)
  config = provenance_lib.config_of(config)  # what made the run, not what it is
  config = renamed_lib.upgrade(config)  # a run made before a key's rename reads as today's

  records, skipped = files_lib.read_records(os.path.join(path, "metrics.jsonl"))
  summary = None
  try:
    with open(os.path.join(path, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    summary = None
  name = os.path.basename(os.path.normpath(path))
  cfg = ml_collections.ConfigDict(config)
  return Run(path=path, name=name, config=config, flat_config=flatten(config),
             records=records, skipped_lines=skipped, summary=summary,
             unused=frozenset(config_lib.inactive_keys(cfg)),
             as_run=naming.algorithm_as_run(cfg), named=frozenset(naming.named_keys(cfg)),
             provenance=provenance_lib.of(summary) or started_by)


def _num(x: Any) -> float | None:
  """A finite float, or None (null, NaN, inf, not a number)."""
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    return None
  x = float(x)
  return x if math.isfinite(x) else None
