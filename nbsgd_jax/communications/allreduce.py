"""All-reduce: XLA's ``psum`` or the explicit ring of :mod:`nbsgd_jax.communications.collectives`.

Bytes per worker for a message of ``S`` bytes: ``2 (n - 1) / n * S`` (a bandwidth-optimal ring,
Patarasuk & Yuan 2009, also charged for ``psum``); the clock charges ``2 (n - 1)`` messages
and everyone waits for everyone.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.communications import collectives
from nbsgd_jax.core.axis import AXIS, tree_bytes
from nbsgd_jax.communications.base import Communication, Pattern


class AllReduce(Communication):
  """Mean of a tree over the workers.

  Args:
    n, axis_name, key, weighted: as :class:`~nbsgd_jax.communications.Communication`.
    ring: use the explicit ring all-reduce (``2 (n - 1)`` ``ppermute`` rounds) instead of
      ``lax.psum``.
    parts: all-reduces per use (e.g. 2 for a vector and a scalar): the clock charges
      ``parts * 2 (n - 1)`` messages.
  """

  def __init__(self, n: int, axis_name: Any = AXIS, key: str = "allreduce",
               weighted: bool = False, ring: bool = False, parts: int = 1):
    super().__init__(n, axis_name, key, weighted)
    self.ring, self.parts = bool(ring), int(parts)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del step, active
    return Pattern(None, np.full(self.n, self.parts * 2.0 * (self.n - 1)), collective=True)

  def reduce_sum(self, tree):
    """``sum_i tree_i`` on every worker (device half, no report)."""
    if self.ring:
      return collectives.ring_all_reduce(tree, self.axis_name)
    return lax.psum(tree, self.axis_name)

  def num_bytes(self, tree) -> float:
    """Bytes one worker sends to all-reduce ``tree`` (static, from shapes and dtypes)."""
    return collectives.ring_all_reduce_bytes(tree_bytes(tree), self.n)

  def mean(self, tree, ctx, by: str = "count"):
    """``(sum_i w_i tree_i, report)`` with the weights of :meth:`weight` (plain mean
    ``1/n`` when None); integer leaves are left as they are (step counters)."""
    w = self.weight(ctx, by)
    leaves, treedef = jax.tree.flatten(tree)
    pos = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if not pos:
      return tree, {}
    floats = [leaves[i] if w is None else leaves[i] * w.astype(leaves[i].dtype) for i in pos]
    summed = self.reduce_sum(floats)
    for i, s in zip(pos, summed):
      leaves[i] = s / self.n if w is None else s
    sent = self.charge(self.num_bytes([leaves[i] for i in pos]), ctx)
    return jax.tree.unflatten(treedef, leaves), self.report(sent)
