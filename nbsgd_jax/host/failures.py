"""Simulated worker failures (``config.cluster.failures``): a worker down for a run of steps
(:class:`Failure`), parsed from ``"worker:start:duration,..."`` (:func:`parse_failures`),
and the workers up at a step (:func:`alive_mask`; read by
:class:`nbsgd_jax.host.parts.Failures`). :mod:`nbsgd_jax.host.cluster` re-exports them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from nbsgd_jax.core import checks


class Failure(NamedTuple):
  """Worker ``worker`` is down for the (0-based) steps ``start .. start + duration - 1``."""

  worker: int
  start: int
  duration: int


def parse_failures(spec: str, n: int) -> list[Failure]:
  """``"W:S:D,W:S:D,..."`` (worker, first step, number of steps) as :class:`Failure` s.

  Raises:
    ValueError: a malformed entry, a worker outside ``[0, n)``, ``S < 0`` or ``D < 1``
      (the message names ``cluster.failures``).
  """
  out = []
  for item in (spec or "").replace(" ", "").split(","):
    if not item:
      continue
    parts = item.split(":")
    try:
      w, s, d = (int(p) for p in parts)
    except ValueError:
      raise checks.not_allowed("cluster.failures", spec, "write worker:start:duration entries separated "
                 "by commas, e.g. '3:100:50,5:200:20'") from None
    if not 0 <= w < n or s < 0 or d < 1:
      raise checks.not_allowed("cluster.failures", spec, f"entry {item!r} needs 0 <= worker < {n}, "
                 "start >= 0 and duration >= 1")
    out.append(Failure(w, s, d))
  return out


def alive_mask(failures: list[Failure], step: int, n: int) -> np.ndarray:
  """bool ``[n]``: the workers up at (0-based) ``step``."""
  alive = np.ones(n, bool)
  for f in failures:
    if f.start <= step < f.start + f.duration:
      alive[f.worker] = False
  return alive
