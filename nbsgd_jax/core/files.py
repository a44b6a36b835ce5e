"""Crash-safe file writes (a reader sees the old file or the new one, never half of one) and
the lock that keeps one process per directory."""

from __future__ import annotations

import json
import os
from typing import Callable


def read_records(path: str) -> tuple[list, int]:
  """The evaluation records of a ``metrics.jsonl`` at ``path``: ``(records, skipped)``,
  the JSON objects with an int ``step`` in file order, and the count of other non-blank
  lines (a torn last line). A missing file reads as no record."""
  try:
    with open(path) as f:
      lines = f.read().splitlines()
  except FileNotFoundError:
    return [], 0
  records, skipped = [], 0
  for line in filter(str.strip, lines):
    try:
      rec = json.loads(line)
    except ValueError:
      rec = None
    if isinstance(rec, dict) and isinstance(rec.get("step"), int):
      records.append(rec)
    else:
      skipped += 1
  return records, skipped


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


class Locked(OSError):
  """Another process holds the lock (:func:`lock`); ``holder`` is its PID (None: unknown)."""

  def __init__(self, path: str, holder):
    super().__init__(f"{path} is locked by process {holder}")
    self.path, self.holder = path, holder


def lock(path: str):
  """Take an exclusive OS lock (``fcntl.flock``) on the file ``path`` (created), without
  waiting, and write this process's PID into it. The lock lives as long as the returned file
  object is open, and the OS releases it when the process dies however it dies (no stale
  lock to clean up after a kill). POSIX only.

  Returns:
    the open lock file: close it to release the lock.

  Raises:
    Locked: another open file (another process, or this one) holds the lock; its
      ``holder`` is the PID written in the file.
    OSError: ``path`` cannot be created.
  """
  import fcntl
  f = open(path, "a+")
  try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    text = f.read().strip()
    f.close()
    raise Locked(path, int(text) if text.isdigit() else None) from None
  f.seek(0)
  f.truncate()
  f.write(str(os.getpid()))
  f.flush()
  return f
