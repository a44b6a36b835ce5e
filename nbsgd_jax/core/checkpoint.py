"""Checkpoint and resume of a training run, with orbax.

A checkpoint holds everything a run needs to continue bit for bit as if never stopped:

* the device state (:class:`nbsgd_jax.train.TrainState`: every worker's parameters, optimizer
  state, error-feedback residuals and their PRNG keys, the step), saved with
  ``orbax.checkpoint`` (``StandardSave``; sharded arrays are restored with their sharding);
* the host state (a JSON object): simulated clocks, bytes and rounds so far, wall time, the
  local-SGD planner and the consensus-control estimator, and the evaluation records up to the
  step (``records``).

Data order, straggler delays, MATCHA activations and sketch coordinates are functions of
``(seed, step)`` and need no state. On resume ``metrics.jsonl`` is rewritten from the
checkpoint's records and ``steps.jsonl`` is cut back to its step
(:mod:`nbsgd_jax.run.records`), so the resumed run appends exactly the records an
uninterrupted run would write.

Orbax writes a checkpoint to a temporary directory and renames it when complete
(``commit_success.txt``), so a kill at any moment leaves the previous checkpoint intact and
never a half-written one. A checkpoint damaged afterwards (files cut short or removed on
disk) is found when resuming: :meth:`Checkpointer.restore_newest` reads the checkpoints
newest first, moves each one that cannot be read whole to ``workdir/damaged_checkpoints``
and resumes from the newest that can (as PyTorch Lightning and t5x resume from the newest
valid checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Optional

import jax

CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged_checkpoints"  # where an unreadable checkpoint is moved, not deleted


class Unreadable(ValueError):
  """Checkpoints exist but none can be read whole (each moved to :data:`DAMAGED_DIR`)."""


class Checkpointer:
  """Synchronous orbax checkpoints in ``workdir/checkpoints``.

  Args:
    workdir: the run's directory.
    max_to_keep: checkpoints kept (the oldest are deleted), >= 1.

  Raises:
    ValueError: max_to_keep < 1.
  """

  def __init__(self, workdir: str, max_to_keep: int = 2):
    import orbax.checkpoint as ocp
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep={max_to_keep!r} is not allowed: it must be >= 1")
    self._ocp = ocp
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    self._mngr = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=False))

  def latest_step(self) -> Optional[int]:
    """Step of the newest complete checkpoint, or None."""
    return self._mngr.latest_step()

  def save(self, step: int, state: Any, host: dict) -> None:
    """Write the checkpoint of ``step`` (blocks until it is committed).

    Args:
      step: training steps done.
      state: the device state (a pytree of arrays).
      host: JSON-serialisable host state.
    """
    ocp = self._ocp
    self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  host=ocp.args.JsonSave(host)))
    self._mngr.wait_until_finished()

  def restore(self, step: int, like: Any) -> tuple[Any, dict]:
    """``(state, host)`` of the checkpoint of ``step``.

    Args:
      step: a step from :meth:`latest_step`.
      like: a state of the same structure, shapes, dtypes and shardings (e.g. a fresh
        initial state); the restored arrays take its shardings.
    """
    ocp = self._ocp
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()))
    # the container types (NamedTuples) come from ``like``
    state = jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(out.state))
    return state, dict(out.host)

  def restore_newest(self, like: Any, warn: Callable[[str], None],
                     move_aside: bool = True) -> tuple[Optional[int], Any, Optional[dict]]:
    """``(step, state, host)`` of the newest checkpoint that can be read whole, trying the
    checkpoints newest first; ``(None, like, None)`` when there is none. Each one that
    cannot be read (files cut short, a folder removed: whatever orbax raises) is reported
    by ``warn(line)`` (its directory and the error) and, with ``move_aside``, moved to
    ``workdir/damaged_checkpoints/<step>`` (kept for inspection; a multi-process run moves
    it on one process only).

    Args:
      like: as :meth:`restore`'s.
      warn: called with one line per unreadable checkpoint.
      move_aside: move unreadable checkpoints out of the checkpoint directory.

    Raises:
      Unreadable: checkpoints exist and none can be read (the message names them).
    """
    steps = sorted(self._mngr.all_steps(), reverse=True)
    for step in steps:
      try:
        state, host = self.restore(step, like)
        return step, state, host
      except Exception as e:  # noqa: BLE001  (orbax / tensorstore raise many types)
        path = os.path.join(self.directory, str(step))
        moved = self._move_aside(step) if move_aside else path
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        warn(f"the checkpoint of step {step} in {path} cannot be read ({reason}); "
             f"moved to {moved}" if move_aside else
             f"the checkpoint of step {step} in {path} cannot be read ({reason})")
    if steps:
      raise Unreadable(f"no checkpoint in {self.directory} can be read (steps {steps}, moved "
                       f"to {os.path.join(os.path.dirname(self.directory), DAMAGED_DIR)}): "
                       "the run cannot resume; config.overwrite=True starts it again")
    return None, like, None

  def _move_aside(self, step: int) -> str:
    """Move the checkpoint of ``step`` to :data:`DAMAGED_DIR` (a fresh name); its path."""
    target = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR, str(step))
    base, i = target, 1
    while os.path.exists(target):
      target, i = f"{base}.{i}", i + 1
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(os.path.join(self.directory, str(step)), target)
    self._mngr.reload()
    return target

  def close(self) -> None:
    self._mngr.close()


def read_models(workdir: str, warn: Callable[[str], None]) -> tuple[int, Any, Any]:
  """``(step, params, model_state)`` of another run's newest readable checkpoint, each leaf
  the mean over its workers axis (``[n, ...] -> [...]``: the averaged model its evaluations
  report; the model itself for all-reduce): what ``config.init_from`` starts a run from.
  Read without a target (any algorithm's state: only ``params`` and ``model_state`` are
  taken), float leaves averaged in float32 and cast back; ``workdir`` is never written.

  Args:
    workdir: the run's directory (holding ``checkpoints/``) or its ``checkpoints/`` itself.
    warn: called with one line per unreadable checkpoint (skipped, not moved).

  Raises:
    FileNotFoundError: ``workdir`` holds no checkpoint.
    Unreadable: checkpoints exist and none can be read.
  """
  import numpy as np
  import orbax.checkpoint as ocp
  path = os.path.abspath(workdir)
  if os.path.basename(path.rstrip(os.sep)) != CHECKPOINT_DIR:
    path = os.path.join(path, CHECKPOINT_DIR)
  mngr = ocp.CheckpointManager(path) if os.path.isdir(path) else None
  steps = sorted(mngr.all_steps(), reverse=True) if mngr else []
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {path} (a run with config.checkpoint_every > 0 "
                            "writes them)")
  mean = lambda x: np.asarray(np.mean(np.asarray(x, np.float32), axis=0), np.asarray(x).dtype)
  for step in steps:
    try:
      state = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore())).state
      return step, jax.tree.map(mean, state["params"]), jax.tree.map(
          mean, state.get("model_state", {}))
    except Exception as e:  # noqa: BLE001  (orbax / tensorstore raise many types)
      warn(f"the checkpoint of step {step} in {os.path.join(path, str(step))} cannot be read "
           f"({' '.join(f'{type(e).__name__}: {e}'.split())[:300]}): trying an older one")
  raise Unreadable(f"no checkpoint in {path} can be read (steps {steps})")


def read_records(path: str, last_step: int) -> list[dict]:
  """The JSON lines of ``path`` with ``step <= last_step``; a line that does not parse (torn
  by a kill) ends the read. Missing file: ``[]``."""
  out = []
  if not os.path.exists(path):
    return out
  with open(path) as f:
    for line in f:
      try:
        rec = json.loads(line)
      except ValueError:
        break
      if not line.endswith("\n"):
        break  # torn last line
      if rec.get("step", 0) <= last_step:
        out.append(rec)
  return out


def truncate_records(path: str, last_step: int) -> list[dict]:
  """Cut ``path`` (JSON lines) back to the records with ``step <= last_step``, atomically
  (temporary file, fsync, rename); returns them."""
  recs = read_records(path, last_step)
  if os.path.exists(path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      for r in recs:
        f.write(json.dumps(r) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  return recs
