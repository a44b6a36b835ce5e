"""Checkpoint and resume of a training run, with orbax.

A checkpoint holds everything a run needs to continue bit for bit as if never stopped:

* the device state (:class:`nbsgd_jax.train.TrainState`: every worker's parameters, optimizer
  state, error-feedback residuals and their PRNG keys, the step), saved with
  ``orbax.checkpoint`` (``StandardSave``; sharded arrays are restored with their sharding);
* the host state (a JSON object): simulated clocks, bytes and rounds so far, wall time, the
  local-SGD planner and the consensus-control estimator.

Data order, straggler delays, MATCHA activations and sketch coordinates are functions of
``(seed, step)`` and need no state. ``metrics.jsonl`` and ``steps.jsonl`` are cut back to the
checkpoint's step on resume (a torn last line from a kill is dropped), so the resumed run
appends exactly the records an uninterrupted run would write.

Orbax writes a checkpoint to a temporary directory and renames it when complete
(``commit_success.txt``), so a kill at any moment leaves the previous checkpoint intact and
never a half-written one.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import jax

CHECKPOINT_DIR = "checkpoints"


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

  def close(self) -> None:
    self._mngr.close()


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
