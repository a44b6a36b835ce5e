"""All-reduce: XLA's ``psum`` or the explicit ring of :mod:`nbsgd_jax.communications.collectives`.

Bytes per worker for a message of ``S`` bytes: ``2 (n - 1) / n * S`` (a bandwidth-optimal ring,
Patarasuk & Yuan 2009, also charged for ``psum``); the clock charges ``2 (n - 1)`` messages
and everyone waits for everyone. With ``tree`` (``cluster.allreduce_algorithm='tree'``, NCCL's
double binary tree: Sanders, Speck, Traeff, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan", Parallel Computing 35(12), 2009; the trees of NCCL's
``src/graph/trees.cc``, ``ncclGetDtree``): ``2 ceil(log2 n)`` messages (up the trees and
down: each tree is ``ceil(log2 n)`` deep) and, per worker, ``S / 2`` (its tree's half of the
message) up to its parent and ``S / 2`` down to each child, in each tree. Each tree has
``n - 1`` edges, so the workers send ``2 (n - 1) S`` in all: the mean per worker
(``bytes_sent``) is the ring's ``2 (n - 1) / n S``. The time is the busiest worker's
(:func:`busiest`): for ``n >= 4`` a worker interior with two children in one tree and a leaf
in the other sends ``3 S / 2 + S / 2 = 2 S``; with 2 ranks each is the root of one tree and
the leaf of the other (``S / 2`` down, ``S / 2`` up: ``S``, the ring's own); with 3 ranks
both trees are chains (``0 -> 2 -> 1`` and, shifted by one, ``1 -> 0 -> 2``) and ranks 0
and 2 are the middle of one and an end of the other: ``S + S / 2 = 3 S / 2``. The device
reports the mean; the clock charges the busiest (:meth:`AllReduce.clock_rounds`).

With ``rebuild`` (``cluster.rebuild_collectives``; torchft reconfigures its ProcessGroup over
the live replicas at each new quorum, ``Manager._async_quorum``: ``self._pg.configure(...,
replica_rank, replica_world_size)``) the all-reduce after a failure runs over the ``m`` live
workers: ``2 (m - 1)`` messages (or ``2 ceil(log2 m)``) and ``2 (m - 1) / m S`` bytes each;
without, a live worker is charged the configured ``n``'s.
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
  ``2 ceil(log2 n)`` (double binary tree); 0 for ``n <= 1``."""
  if n <= 1:
    return 0.0
  return 2.0 * math.ceil(math.log2(n)) if tree else 2.0 * (n - 1)


def fraction(n: int, tree: bool = False) -> float:
  """Bytes one worker sends per byte of the message, the mean over the workers: ``2 (n - 1)
  / n`` for the ring and for the double binary tree alike (module docstring); 0 for
  ``n <= 1``."""
  del tree  # the trees' 2 (n - 1) edges carry S / 2 each way: the ring's mean
  return collectives.ring_all_reduce_bytes(1.0, n) if n > 1 else 0.0


def busiest(n: int, tree: bool = False) -> float:
  """Bytes the busiest worker sends per byte of the message (what times the all-reduce):
  the ring's ``2 (n - 1) / n`` (every worker sends as much); NCCL's double binary tree's
  1 for ``n = 2``, ``3 / 2`` for ``n = 3`` and 2 for ``n >= 4`` (module docstring); 0 for
  ``n <= 1``."""
  if not tree or n <= 1:
    return fraction(n)
  return {2: 1.0, 3: 1.5}.get(n, 2.0)


class AllReduce(Communication):
  """Mean of a tree over the workers.

  Args:
    n, axis_name, key, weighted: as :class:`~nbsgd_jax.communications.Communication`.
    ring: use the explicit ring all-reduce (``2 (n - 1)`` ``ppermute`` rounds) instead of
      ``lax.psum``.
    parts: all-reduces per use (e.g. 2 for a vector and a scalar): the clock charges
      ``parts * 2 (n - 1)`` messages.
    tree: charge the double binary tree (module docstring) instead of the ring.
    rebuild: after a failure, charge the all-reduce over the live workers only (module
      docstring; ``cluster.rebuild_collectives``).
  """

  def __init__(self, n: int, axis_name: Any = AXIS, key: str = "allreduce",
               weighted: bool = False, ring: bool = False, parts: int = 1, tree: bool = False,
               rebuild: bool = False):
    super().__init__(n, axis_name, key, weighted)
    self.ring, self.parts, self.tree = bool(ring), int(parts), bool(tree)
    self.rebuild = bool(rebuild)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del step, active
    return Pattern(None, np.full(self.n, self.parts * messages(self.n, self.tree)),
                   collective=True)

  def _size(self, alive) -> int:
    """The workers the all-reduce runs over: the live ones with ``rebuild``, else ``n``."""
    return int(np.sum(alive)) if self.rebuild and alive is not None else self.n

  def live_pattern(self, step, active, alive):
    """:meth:`~nbsgd_jax.communications.Communication.live_pattern`; with ``rebuild`` a live
    worker sends the messages of an all-reduce over the ``m`` live workers."""
    pat = super().live_pattern(step, active, alive)
    if not self.rebuild or alive is None:
      return pat
    m = self._size(alive)
    return pat._replace(messages=self.parts * messages(m, self.tree) * np.asarray(alive, bool))

  def clock_rounds(self, step, active, alive, report) -> list:
    """The reported bytes (the mean per worker) as the rounds' bytes, the tree's scaled to its
    busiest worker's (:func:`busiest`), who times the all-reduce."""
    rounds = super().clock_rounds(step, active, alive, report)
    m = self._size(alive)
    if not self.tree or not rounds or fraction(m) == 0:
      return rounds
    k = busiest(m, True) / fraction(m, True)
    return [r._replace(num_bytes=r.num_bytes * k) for r in rounds]

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
    sent = self.num_bytes([leaves[i] for i in pos])
    if self.rebuild and ctx is not None and ctx.alive is not None:  # over the m live workers
      m = lax.psum(self.live(ctx).astype(jnp.float32), self.axis_name)
      sent = (2.0 * jnp.maximum(m - 1.0, 0.0) / jnp.maximum(m, 1.0)
              * tree_bytes([leaves[i] for i in pos]))
    return jax.tree.unflatten(treedef, leaves), self.report(self.charge(sent, ctx))


class HierarchicalAllReduce(AllReduce):
  """The same mean, run in three phases over a two-level layout (NCCL's 2-D ring as the
  model): a ring reduce-scatter inside each group of ``group_size`` consecutive workers (a
  node), a ring all-reduce of each worker's ``1 / g`` share across the ``m = n / g`` groups
  (among the workers of the same rank in their group), and a ring all-gather inside the group.

  Bytes per worker for a message of ``S`` bytes: ``2 (g - 1) / g S + 2 (m - 1) / m S / g``
  (with ``tree`` the across phase is the double binary tree, ``2 ceil(log2 m)`` messages:
  the same mean, its busiest worker's ``busiest(m) S / g`` charged by the clock, e.g.
  ``S / g`` for 2 groups);
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
      raise ValueError(f"cluster.allreduce_group_size={group_size} is not allowed with {n} "
                       "workers: it must be >= 2 and divide the workers")
    super().__init__(n, axis_name, key, weighted, ring, parts, tree)
    self.g, self.m = int(group_size), n // int(group_size)

  def _fractions(self) -> tuple[float, float]:
    """Bytes of the inside phases (both) and of the across phase (a ring, or with ``tree``
    the double binary tree), per byte of the message: the mean per worker."""
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
            Round(live(rank), self.parts * messages(self.m, self.tree) * up,
                  per * busiest(self.m, self.tree) / self.g, *flags),
            Round(live(node), half, per * inside / 2, *flags)]
