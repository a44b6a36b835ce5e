"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
from typing import Callable


def atomic_write(path: str, text: str) -> None:
  """Write ``text`` to ``path`` through a temporary file in the same directory (flushed and
  fsynced, then renamed over ``path``); the temporary file is removed on any error.

  Raises:
    OSError: the directory cannot be written.
  """
  atomic_save(path, lambda tmp: _write_text(tmp, text))


def atomic_save(path: str, save: Callable[[str], None]) -> None:
  """``save(tmp)`` writes the content to the temporary path ``tmp`` (e.g. ``fig.savefig``);
  then ``tmp`` is renamed over ``path``, or removed if ``save`` fails.

  Raises:
    whatever ``save`` raises; OSError from the rename.
  """
  tmp = f"{path}.tmp.{os.getpid()}"
  try:
    save(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _write_text(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
