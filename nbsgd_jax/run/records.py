"""The run's records: ``config.json``, ``metrics.jsonl`` (one line per evaluation),
``steps.jsonl`` (one line per step), TensorBoard event files and ``summary.json``;
``config.json`` and ``summary.json`` carry what produced them under ``provenance``
(:mod:`nbsgd_jax.core.provenance`), which is not configuration (:func:`config_diff`).

One process writes a workdir at a time (:func:`lock_workdir`). Every line is written whole in
one call and fsynced, whole files are written atomically (:mod:`nbsgd_jax.core.files`); each
checkpoint keeps its own copy of the evaluation records, and a resumed run rewrites
``metrics.jsonl`` from it (:func:`heal_records`: lines lost, cut or torn are restored, with a
``warning:`` line) and cuts ``steps.jsonl`` back to the checkpoint's step, so a crash or a
damaged file never leaves a corrupt or inconsistent record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from typing import Any, Optional

import ml_collections

from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax.config import renamed as renamed_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax.core import provenance as provenance_lib

STALE = ("summary.json", "steps.jsonl")  # removed when a new run starts in a used workdir


class MetricsWriter:
  """Writes one JSON object per line (``metrics.jsonl``), each line in one ``write`` call on
  a file opened for appending (whole or absent after a kill: no torn line from this writer),
  then fsynced; ``append=True`` continues an existing file (resume)."""

  def __init__(self, path: str, append: bool = False):
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
    self._fd = os.open(path, flags, 0o644)

  def write(self, record: dict) -> None:
    data = (json.dumps(record) + "\n").encode()
    while data:  # a regular file takes it whole; a short write goes on where it stopped
      data = data[os.write(self._fd, data):]
    os.fsync(self._fd)

  def close(self) -> None:
    os.close(self._fd)


OUTPUT_KEYS = ("progress", "tensorboard", "overwrite")  # change what is shown, not the run
RUN_FILES = ("config.json", "metrics.jsonl", "steps.jsonl", "summary.json", "tensorboard",
             checkpoint_lib.CHECKPOINT_DIR, checkpoint_lib.DAMAGED_DIR)


def config_diff(old: dict, cfg: ml_collections.ConfigDict) -> list[tuple[str, Any, Any]]:
  """``(key, old value, new value)`` for every dotted key where the stored config ``old``
  (``config.json``) and ``cfg`` differ, :data:`OUTPUT_KEYS` and the stored provenance aside
  (another commit or machine runs the same run). A key the stored config lacks (a run made
  before the key existed) is the same when ``cfg`` holds its default: that run ran as the
  default does."""
  old = provenance_lib.config_of(old)  # what made the run, not what it is
  a = config_lib.flatten_dict(renamed_lib.upgrade(old))  # a run made before a key's rename
  b = config_lib.flatten_dict(json.loads(cfg.to_json_best_effort()))
  defaults = config_lib.flatten_dict(json.loads(config_lib.default_config().to_json_best_effort()))
  newer = {k for k in set(b) - set(a) if k in defaults and b[k] == defaults[k]}
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k) and k not in OUTPUT_KEYS and k not in newer]


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


def heal_records(path: str, records: list, step: int) -> None:
  """Make ``path`` (``metrics.jsonl``) hold exactly ``records``, the evaluation records up to
  the checkpoint of ``step`` as the checkpoint keeps them, byte for byte as the run wrote
  them (atomically: :func:`nbsgd_jax.core.files.atomic_write`). When the file did not hold them
  whole (missing, cut short, a line torn or changed), one ``warning:`` line says what was
  restored; the records after ``step`` are dropped (the resumed run writes them again), and
  a torn last line among them is named too."""
  text = "".join(json.dumps(r) + "\n" for r in records)
  try:
    with open(path) as f:
      old = f.read()
  except (OSError, ValueError):
    old = None
  if old is None:
    why = "was missing"
  elif not old.startswith(text):
    why = "was damaged before that step"
  elif old and not old.endswith("\n"):
    why = "ended with a torn line (dropped)"
  else:
    why = None
  if why:
    print(f"warning: {path} {why}: its {len(records)} records up to step {step} were "
          "restored from the checkpoint", file=sys.stderr, flush=True)
  if old != text:
    files_lib.atomic_write(path, text)


LOCK_FILE = ".lock"  # in the workdir: held (fcntl.flock) by the process writing there


def lock_workdir(workdir: str, stack: contextlib.ExitStack) -> None:
  """Make ``workdir`` and take its lock (``workdir/.lock``, an OS file lock the process
  holds until ``stack`` closes or it dies: :func:`nbsgd_jax.core.files.lock`), before anything
  in it is read or written: one process per workdir.

  Raises:
    ConfigError: another process holds the lock (its PID named), or the workdir cannot be
      used (:func:`make_workdir`).
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise config_lib.ConfigError([f"workdir {workdir!r} cannot be used: it is a file"])
  make_workdir(workdir)
  try:
    handle = files_lib.lock(os.path.join(workdir, LOCK_FILE))
  except files_lib.Locked as e:
    raise config_lib.ConfigError([
        f"workdir {workdir!r} is in use by process {e.holder}: another run writes there "
        "(wait for it to end, or use another workdir)"]) from None
  stack.callback(handle.close)


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


def write_config(cfg: ml_collections.ConfigDict, workdir: str, resumed: bool) -> None:
  """``workdir/config.json``, atomically: ``cfg`` and, under ``provenance``, what started the
  run (:func:`nbsgd_jax.core.provenance.provenance` of this process; a resumed run keeps the
  one its ``config.json`` holds, that of the process that started it)."""
  path = os.path.join(workdir, "config.json")
  prov = provenance_lib.of(_read_json(path)) if resumed else None
  stored = {**json.loads(cfg.to_json_best_effort()),
            provenance_lib.KEY: prov or provenance_lib.provenance()}
  files_lib.atomic_write(path, json.dumps(stored, indent=2))


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
               stack: contextlib.ExitStack, checkpoint_dir: Optional[str] = None,
               saved: Optional[list] = None):
    self.workdir, self.history = workdir, []
    self.metrics = self.steps = self.tb = None
    resumed = resume_step is not None
    if resumed and saved is not None:  # the checkpoint's own copy of the records
      self.history = list(saved)
    elif resumed and not workdir and checkpoint_dir:  # a checkpoint from before that copy
      self.history = checkpoint_lib.read_records(
          os.path.join(checkpoint_dir, "metrics.jsonl"), resume_step)
    if not workdir:
      return
    make_workdir(workdir)
    write_config(cfg, workdir, resumed)
    path = os.path.join(workdir, "metrics.jsonl")
    if resumed and saved is not None:
      heal_records(path, self.history, resume_step)
    elif resumed:  # a checkpoint without records: drop the file's after it (and a torn line)
      self.history = checkpoint_lib.truncate_records(path, resume_step)
      if not self.history:
        raise config_lib.ConfigError([
            f"{path} holds no record up to step {resume_step} and the checkpoint, written by "
            "an older version, holds none: the run cannot resume; config.overwrite=True "
            "starts it again"])
    if resumed:
      checkpoint_lib.truncate_records(os.path.join(workdir, "steps.jsonl"), resume_step)
    else:
      for stale in STALE:
        if os.path.exists(os.path.join(workdir, stale)):
          os.remove(os.path.join(workdir, stale))
    self.metrics = stack.enter_context(contextlib.closing(MetricsWriter(path, append=resumed)))
    if cfg.tensorboard:
      from nbsgd_jax.core import tensorboard as tensorboard_lib
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
    """``summary.json``, atomically: ``summary`` and the provenance of this process (the one
    that finished the run: :func:`nbsgd_jax.core.provenance.provenance`) under
    ``provenance``; ``summary`` is not changed."""
    if self.workdir:
      files_lib.atomic_write(
          os.path.join(self.workdir, "summary.json"),
          json.dumps({**summary, provenance_lib.KEY: provenance_lib.provenance()}, indent=2))
