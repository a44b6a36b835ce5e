"""The run's records: ``config.json``, ``metrics.jsonl`` (one line per evaluation),
``steps.jsonl`` (one line per step), TensorBoard event files and ``summary.json``.

Every line is flushed and fsynced as it is written, whole files are written atomically
(:mod:`nbsgd_jax.files`), and a resumed run first truncates the line files to the checkpoint's
step (a torn last line included), so a crash never leaves a corrupt or inconsistent record.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Optional

import ml_collections

from nbsgd_jax import checkpoint as checkpoint_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax import files as files_lib

STALE = ("summary.json", "steps.jsonl")  # removed when a new run starts in a used workdir


class MetricsWriter:
  """Writes one JSON object per line (``metrics.jsonl``), flushed and fsynced each line;
  ``append=True`` continues an existing file (resume)."""

  def __init__(self, path: str, append: bool = False):
    self._f = open(path, "a" if append else "w")

  def write(self, record: dict) -> None:
    self._f.write(json.dumps(record) + "\n")
    self._f.flush()
    os.fsync(self._f.fileno())

  def close(self) -> None:
    self._f.close()


def check_same_run(cfg: ml_collections.ConfigDict, workdir: str) -> None:
  """Resuming needs the config of the checkpointed run (``workdir/config.json``).

  Raises:
    ConfigError: naming the keys that differ.
  """
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError):
    return  # no readable record of the old config: trust the checkpoint
  new = json.loads(cfg.to_json_best_effort())
  a, b = config_lib.flatten_dict(old), config_lib.flatten_dict(new)
  diff = sorted(k for k in set(a) | set(b)
                if a.get(k) != b.get(k) and k not in ("progress", "tensorboard"))  # outputs only
  if diff:
    raise config_lib.ConfigError([
        f"config.{k}={b.get(k)!r} is not allowed: workdir {workdir!r} holds checkpoints of a "
        f"run with {k}={a.get(k)!r}; use a new workdir to start another run"
        for k in diff])


def check_tensorboard() -> None:
  """Raises ConfigError when ``config.tensorboard=True`` cannot write (no tensorboardX)."""
  try:
    import tensorboardX  # noqa: F401  (the writer's dependency)
  except ImportError:
    raise config_lib.ConfigError([
        "config.tensorboard=True needs the tensorboardX package: pip install tensorboardX"
    ]) from None


class Records:
  """The run's record files (module docstring); ``workdir`` None writes nothing (another
  process of a multihost run, or ``train(cfg)`` without a workdir).

  Args:
    cfg: the run's config.
    workdir: where to write, or None.
    resume_step: the checkpoint's step when resuming, else None.
    per_step: also write ``steps.jsonl``.
    stack: closes the files on any exit.
    checkpoint_dir: the workdir of the checkpoints (to read the record history of a resumed
      run on processes that write nothing).

  Attributes:
    history: the evaluation records so far (those kept on resume included).
  """

  def __init__(self, cfg, workdir: Optional[str], resume_step: Optional[int], per_step: bool,
               stack: contextlib.ExitStack, checkpoint_dir: Optional[str] = None):
    self.workdir, self.history = workdir, []
    self.metrics = self.steps = self.tb = None
    resumed = resume_step is not None
    if resumed and not workdir and checkpoint_dir:
      self.history = checkpoint_lib.read_records(
          os.path.join(checkpoint_dir, "metrics.jsonl"), resume_step)
    if not workdir:
      return
    os.makedirs(workdir, exist_ok=True)
    files_lib.atomic_write(os.path.join(workdir, "config.json"), cfg.to_json_best_effort(indent=2))
    path = os.path.join(workdir, "metrics.jsonl")
    if resumed:  # drop the records after the checkpoint (and a torn line)
      self.history = checkpoint_lib.truncate_records(path, resume_step)
      checkpoint_lib.truncate_records(os.path.join(workdir, "steps.jsonl"), resume_step)
    else:
      for stale in STALE:
        if os.path.exists(os.path.join(workdir, stale)):
          os.remove(os.path.join(workdir, stale))
    self.metrics = stack.enter_context(contextlib.closing(MetricsWriter(path, append=resumed)))
    if cfg.tensorboard:
      from nbsgd_jax import tensorboard as tensorboard_lib
      self.tb = stack.enter_context(contextlib.closing(tensorboard_lib.TensorBoardWriter(
          os.path.join(workdir, "tensorboard"),
          purge_step=None if resume_step is None else resume_step + 1)))
    if per_step:
      self.steps = stack.enter_context(contextlib.closing(MetricsWriter(
          os.path.join(workdir, "steps.jsonl"), append=resumed)))

  def evaluation(self, rec: dict) -> None:
    """One evaluation record: kept in :attr:`history`, written to metrics.jsonl and
    TensorBoard."""
    self.history.append(rec)
    if self.metrics:
      self.metrics.write(rec)
    if self.tb:
      self.tb.write(rec)

  def step(self, rec: dict) -> None:
    """One step's record (``steps.jsonl``)."""
    if self.steps:
      self.steps.write(rec)

  def summary(self, summary: dict) -> None:
    """``summary.json``, atomically."""
    if self.workdir:
      files_lib.atomic_write(os.path.join(self.workdir, "summary.json"),
                             json.dumps(summary, indent=2))
