"""The wall-clock stopwatch of the training steps: evaluation, hooks and host-side
measurements are off the clock."""

from __future__ import annotations

import time
from typing import Any, Callable

import jax


class Stopwatch:
  """Seconds of training steps (compilation included).

  ``pause(state)`` waits for the in-flight steps (``jax.block_until_ready``) and stops the
  watch; ``resume()`` starts it again; :meth:`off_clock` runs a function between the two.

  Attributes:
    seconds: the time counted so far.
  """

  def __init__(self, seconds: float = 0.0):
    self.seconds = float(seconds)
    self._start = None

  def resume(self) -> None:
    self._start = time.perf_counter()

  def pause(self, state: Any = None) -> None:
    if state is not None:
      jax.block_until_ready(state)
    if self._start is not None:
      self.seconds += time.perf_counter() - self._start
      self._start = None

  def off_clock(self, state: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` with the watch paused (after the steps that produced ``state``)."""
    running = self._start is not None
    self.pause(state)
    try:
      return fn()
    finally:
      if running:
        self.resume()
