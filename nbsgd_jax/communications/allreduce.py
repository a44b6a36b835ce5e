"""All-reduce: XLA's ``psum`` or the explicit ring of :mod:`nbsgd_jax.communications.collectives`.

Bytes per worker for a message of ``S`` bytes: ``2 (n - 1) / n * S`` (a bandwidth-optimal ring,
Patarasuk & Yuan 2009, also charged for ``psum``); the clock charges ``2 (n - 1)`` messages
and everyone waits for everyone. With ``tree`` (``cluster.allreduce_algorithm='tree'``, NCCL's
double binary tree: Sanders, Speck, Traeff, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan", Parallel Computing 35(12), 2009): ``2 ceil(log2 n)`` messages (up the
trees and down) and ``2 S`` bytes per worker (each worker is interior in one of the two trees
and a leaf in the other: ``S / 2`` up in each, ``S / 2`` to each of two children in one).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.communications import adjacency as adjacency_lib
from nbsgd_jax.communications import collectives
from nbsgd_jax.core.axis import AXIS, tree_bytes
from nbsgd_jax.communications.base import Communication, Pattern, Round


def messages(n: int, tree: bool = False) -> float:
  """Messages one worker sends in an all-reduce over ``n``: ``2 (n - 1)`` (ring) or
  ``2 ceil(log2 n)`` (double binary tree)."""
  return 2.0 * math.ceil(math.log2(n)) if tree else 2.0 * (n - 1)


def fraction(n: int, tree: bool = False) -> float:
  """Bytes one worker sends per byte of the message: ``2 (n - 1) / n`` (ring) or 2 (tree;
  0 for one worker)."""
  if n <= 1:
    return 0.0
  return 2.0 if tree else collectives.ring_all_reduce_bytes(1.0, n)


class AllReduce(Communication):
  """Mean of a tree over the workers.

  Args:
    n, axis_name, key, weighted: as :class:`~nbsgd_jax.communications.Communication`.
    ring: use the explicit ring all-reduce (``2 (n - 1)`` ``ppermute`` rounds) instead of
      ``lax.psum``.
    parts: all-reduces per use (e.g. 2 for a vector and a scalar): the clock charges
      ``parts * 2 (n - 1)`` messages.
    tree: charge the double binary tree (module docstring) instead of the ring.
  """

  def __init__(self, n: int, axis_name: Any = AXIS, key: str = "allreduce",
               weighted: bool = False, ring: bool = False, parts: int = 1, tree: bool = False):
    super().__init__(n, axis_name, key, weighted)
    self.ring, self.parts, self.tree = bool(ring), int(parts), bool(tree)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del step, active
    return Pattern(None, np.full(self.n, self.parts * messages(self.n, self.tree)),
                   collective=True)

  def reduce_sum(self, tree):
    """``sum_i tree_i`` on every worker (device half, no report)."""
    if self.ring:
      return collectives.ring_all_reduce(tree, self.axis_name)
    return lax.psum(tree, self.axis_name)

  def num_bytes(self, tree) -> float:
    """Bytes one worker sends to all-reduce ``tree`` (static, from shapes and dtypes)."""
    return fraction(self.n, self.tree) * tree_bytes(tree)

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


class HierarchicalAllReduce(AllReduce):
  """The same mean, run in three phases over a two-level layout (NCCL's 2-D ring as the
  model): a ring reduce-scatter inside each group of ``group_size`` consecutive workers (a
  node), a ring all-reduce of each worker's ``1 / g`` share across the ``m = n / g`` groups
  (among the workers of the same rank in their group), and a ring all-gather inside the group.

  Bytes per worker for a message of ``S`` bytes: ``2 (g - 1) / g S + 2 (m - 1) / m S / g``
  (with ``tree`` the across phase is the double binary tree: ``2 S / g``, ``2 ceil(log2 m)``
  messages);
  the clock charges the three rounds apart, each with its own who-waits-for-whom, so a
  hierarchical network (``cluster.levels``) charges each at the link it crosses.

  Args:
    n, axis_name, key, weighted, ring, parts: as :class:`AllReduce`.
    group_size: ``g``, dividing ``n``, >= 2.

  Raises:
    ValueError: ``group_size`` < 2 or not dividing ``n``.
  """

  def __init__(self, n: int, group_size: int, axis_name: Any = AXIS, key: str = "allreduce",
               weighted: bool = False, ring: bool = False, parts: int = 1, tree: bool = False):
    if group_size < 2 or n % group_size:
      raise ValueError(f"cluster.allreduce_group={group_size} is not allowed with {n} "
                       "workers: it must be >= 2 and divide the workers")
    super().__init__(n, axis_name, key, weighted, ring, parts, tree)
    self.g, self.m = int(group_size), n // int(group_size)

  def _fractions(self) -> tuple[float, float]:
    """Bytes of the inside phases (both) and of the across phase (a ring, or with ``tree``
    the double binary tree), per byte of the message."""
    g, m = self.g, self.m
    return 2.0 * (g - 1) / g, fraction(m, self.tree) / g

  def num_bytes(self, tree) -> float:
    return float(sum(self._fractions())) * tree_bytes(tree)

  def clock_rounds(self, step, active, alive, report) -> list:
    if f"bytes/{self.key}" not in report:
      return []
    inside, across = self._fractions()
    per = np.asarray(report[f"bytes/{self.key}"], np.float64) / (inside + across)
    i = np.arange(self.n)
    node = adjacency_lib.Neighbours(np.stack([i // self.g * self.g + r
                                              for r in range(self.g)], 1))
    rank = adjacency_lib.Neighbours(np.stack([i % self.g + k * self.g
                                              for k in range(self.m)], 1))
    up = np.ones(self.n) if alive is None else np.asarray(alive, np.float64)
    live = lambda a: a if alive is None else adjacency_lib.live_adjacency(a, alive)  # noqa
    half = self.parts * (self.g - 1.0) * up
    flags = (True, self.overlap, self.delay)
    return [Round(live(node), half, per * inside / 2, *flags),
            Round(live(rank), self.parts * messages(self.m, self.tree) * up, per * across,
                  *flags),
            Round(live(node), half, per * inside / 2, *flags)]
