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
import shutil
from typing import Any, Optional

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


OUTPUT_KEYS = ("progress", "tensorboard", "overwrite")  # change what is shown, not the run
RUN_FILES = ("config.json", "metrics.jsonl", "steps.jsonl", "summary.json", "tensorboard",
             checkpoint_lib.CHECKPOINT_DIR)


def config_diff(old: dict, cfg: ml_collections.ConfigDict) -> list[tuple[str, Any, Any]]:
  """``(key, old value, new value)`` for every dotted key where the stored config ``old``
  (``config.json``) and ``cfg`` differ, :data:`OUTPUT_KEYS` aside."""
  a = config_lib.flatten_dict(old)
  b = config_lib.flatten_dict(json.loads(cfg.to_json_best_effort()))
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k) and k not in OUTPUT_KEYS]


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_workdir(cfg: ml_collections.ConfigDict, workdir: str) -> Optional[dict]:
  """What ``workdir`` holds, before anything is written: None to train (a new or empty
  workdir; this run unfinished: resumed from its checkpoint or started again; anything with
  ``cfg.overwrite``), or this run's summary (with ``history``) when it finished
  (``summary.json`` written).

  Raises:
    ConfigError: ``workdir`` is a file, or it holds another run (one line per differing
      key) and ``cfg.overwrite`` is False.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise config_lib.ConfigError([f"workdir {workdir!r} cannot be used: it is a file"])
  old = _read_json(os.path.join(workdir, "config.json"))
  if old is None or cfg.overwrite:
    return None
  diff = config_diff(old, cfg)
  if diff:
    raise config_lib.ConfigError([
        f"config.{k}={new!r} is not allowed: workdir {workdir!r} holds a run with {k}={was!r}; "
        "use another workdir, or config.overwrite=True to replace that run"
        for k, was, new in diff])
  summary = _read_json(os.path.join(workdir, "summary.json"))
  if summary is None:
    return None
  summary["history"] = checkpoint_lib.read_records(os.path.join(workdir, "metrics.jsonl"),
                                                   summary.get("step", cfg.num_steps))
  return summary


def make_workdir(workdir: str) -> None:
  """Create ``workdir`` and its parents.

  Raises:
    ConfigError: one line naming the path and the reason (a part of it is a file, no
      permission, a read-only or virtual file system).
  """
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test.{os.getpid()}")  # one per process
    open(probe, "w").close()
    os.remove(probe)
  except OSError as e:
    why = e.strerror or type(e).__name__
    if isinstance(e, NotADirectoryError):
      why += " (a part of the path is a file)"
    raise config_lib.ConfigError([f"workdir {workdir!r} cannot be used: {why}"]) from None


def clear_workdir(cfg: ml_collections.ConfigDict, workdir: str) -> None:
  """With ``cfg.overwrite``, remove the record files and checkpoints of the run ``workdir``
  holds (:data:`RUN_FILES`), so that this one starts from step 0; nothing else is
  touched."""
  if not cfg.overwrite:
    return
  for name in RUN_FILES:
    path = os.path.join(workdir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


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
    make_workdir(workdir)
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
