"""SPARTA's exchange: the mean over the workers of the coordinates a shared random mask
selects (exo-explore/gym ``exogym/strategy/sparta.py``, ``SparseCommunicator`` and
``RandomIndexSelector``, commit 9fa323c).

Per parameter array of ``d`` coordinates, a mask ``m ~ Bernoulli(p)`` per coordinate, the same
on every worker; the ``k = |m|`` selected values are all-reduced (a sum, divided by the
workers) and written back; the others keep each worker's own values. The reference draws the
mask on rank 0 and broadcasts it (``mask="broadcast"``: ``d`` bytes, ``torch.bool``, to each of
the ``n - 1`` others, charged to worker 0); ``mask="seeded"`` draws it on every worker from a
shared seed and sends none (not the reference's: named as such).

Bytes per worker: ``2 (n - 1) / n * 4 k`` (a ring all-reduce of the ``k`` float32 values),
plus worker 0's ``(n - 1) d`` with ``mask="broadcast"``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nbsgd_jax.communications import collectives
from nbsgd_jax.communications.allreduce import AllReduce
from nbsgd_jax.communications.base import Pattern
from nbsgd_jax.core.axis import AXIS

MASKS = ("broadcast", "seeded")


def sparta_masks(key: jax.Array, shapes: list, p) -> list:
  """bool masks of ``shapes`` (one per parameter array), each coordinate ``Bernoulli(p)``,
  from ``key`` folded with the array's index: the same on every worker (the draw, as a seed
  is, is an input of the reference test)."""
  return [jax.random.bernoulli(jax.random.fold_in(key, i), p, shape)
          for i, shape in enumerate(shapes)]


class MaskedAllReduce(AllReduce):
  """The mean over the workers of the masked coordinates (module docstring).

  Args:
    n, axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.
    mask: one of :data:`MASKS`.

  Raises:
    ValueError: an unknown ``mask``.
  """

  def __init__(self, n: int, axis_name: Any = AXIS, key: str = "sparta",
               mask: str = "broadcast"):
    if mask not in MASKS:
      raise ValueError(f"sparta.mask={mask!r} is not allowed: use one of {list(MASKS)}")
    super().__init__(n, axis_name, key)
    self.mask = mask

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    messages = np.full(self.n, 2.0 * (self.n - 1))
    if self.mask == "broadcast":
      messages[0] += self.n - 1
    return Pattern(None, messages, collective=True)

  def masked_mean(self, leaves: list, masks: list, ctx, by: str = "alive"):
    """``(leaves with the masked coordinates replaced by their mean, report)``."""
    w = self.weight(ctx, by)
    scaled = [jnp.where(m, x if w is None else x * w.astype(x.dtype), 0)
              for x, m in zip(leaves, masks)]
    summed = self.reduce_sum(scaled)
    out = [jnp.where(m, s / self.n if w is None else s, x)
           for x, m, s in zip(leaves, masks, summed)]
    k = sum(jnp.sum(m, dtype=jnp.float32) for m in masks)
    sent = collectives.ring_all_reduce_bytes(4.0, self.n) * k  # k float32 values
    if self.mask == "broadcast":
      d = float(sum(np.prod(m.shape) for m in masks))
      sent = sent + jnp.where(self.index() == 0, (self.n - 1) * d, 0.0)
    return out, self.report(self.charge(sent, ctx))


__all__ = ["MASKS", "MaskedAllReduce", "sparta_masks"]
