"""TensorBoard event files with the scalars of ``metrics.jsonl`` (``config.tensorboard``).

Written with tensorboardX, which needs neither TensorFlow nor the ``tensorboard`` package; view
them with ``tensorboard --logdir WORKDIR/tensorboard`` (TensorBoard is the user's own install).
Every numeric field of a record becomes a scalar tagged by its key at ``global_step =
record["step"]``; nested dicts (``consensus_distance_layers``) are flattened to
``key/sub/key`` tags; ``None`` (a value not measured at that evaluation) and non-numeric
fields are skipped.
"""

from __future__ import annotations

import numbers
from typing import Iterator, Optional


def scalars(record: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
  """``(tag, value)`` for every numeric field of ``record`` (but ``step``), nested dicts
  flattened with ``/``."""
  for key, value in record.items():
    if not prefix and key == "step":
      continue
    tag = f"{prefix}{key}"
    if isinstance(value, dict):
      yield from scalars(value, f"{tag}/")
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
      yield tag, float(value)


class TensorBoardWriter:
  """The scalars of each ``metrics.jsonl`` record as TensorBoard events in ``logdir``.

  Args:
    logdir: the directory of the event files (created).
    purge_step: on a resumed run, the first step written again: TensorBoard hides the
      events of the interrupted run from this step on.

  Raises:
    ImportError: tensorboardX is not installed (with the command that installs it).
  """

  def __init__(self, logdir: str, purge_step: Optional[int] = None):
    try:
      from tensorboardX import SummaryWriter
    except ImportError as e:
      raise ImportError("config.tensorboard=True needs tensorboardX (no TensorFlow): "
                        "pip install 'tensorboardX>=2.6,<2.7'") from e
    self._w = SummaryWriter(logdir, purge_step=purge_step)

  def write(self, record: dict) -> None:
    """One evaluation: every numeric field at ``record["step"]``, flushed to disk."""
    step = int(record["step"])
    for tag, value in scalars(record):
      self._w.add_scalar(tag, value, global_step=step)
    self._w.flush()

  def close(self) -> None:
    self._w.close()
