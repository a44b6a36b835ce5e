"""Pairwise averaging with a peer chosen per event: AD-PSGD's atomic ``x_i, x_j <- (x_i + x_j) /
2`` (Lian et al., ICML 2018, Algorithm 1, line 3) and SwarmSGD's interaction (Nadiradze et al.,
NeurIPS 2021, Algorithm 1).

The peers of a step are a per-worker input (``ctx.events.peer``: each worker's partner,
or itself), drawn on the host by the event clock (:mod:`nbsgd_jax.host.events`). The device
cannot address an arbitrary peer cheaply, so the graph's edges are split once into matchings
(:func:`nbsgd_jax.topology.matchings.matching_decomposition`, at most max degree + 1) and each matching
is one ``ppermute``: worker i keeps the model received in matching m where its peer is its
partner in m. A step costs one model copy per matching (a ring: 2 or 3), never ``[n, n]``.
:meth:`PairwiseAverage.read` is the one-sided form (SwarmSGD as ICLR-PopSGD/PopSGD releases
it): the initiator averages with its peer's published copy, the peer unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from nbsgd_jax.communications import collectives
from nbsgd_jax.topology import matchings as matchings_lib
from nbsgd_jax.core.axis import AXIS, tree_bytes
from nbsgd_jax.communications import adjacency as adjacency_lib
from nbsgd_jax.communications.base import Communication, Pattern


class PairwiseAverage(Communication):
  """``x_i <- (x_i + x_peer(i)) / 2`` for the workers with a peer (see module docstring).

  Args:
    n: workers.
    edges: the graph's undirected edges ``(i, j)``; a worker's peer must be one of its
      neighbours (or itself: no exchange).
    axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.

  Raises:
    ValueError: bad edges (as :func:`nbsgd_jax.topology.matchings.matching_decomposition`).
  """

  def __init__(self, n: int, edges: Sequence, axis_name: Any = AXIS, key: str = "pairwise"):
    super().__init__(n, axis_name, key)
    self.matchings = matchings_lib.matching_decomposition(n, edges)
    self.perms = [matchings_lib.matching_permutation(n, m) for m in self.matchings]
    self._partner = np.asarray(self.perms, np.int32).reshape(len(self.perms), n)  # [K, n]
    adj = [[i] for i in range(n)]
    for i, j in (e for m in self.matchings for e in m):
      adj[i].append(j)
      adj[j].append(i)
    width = max(len(a) for a in adj)
    self._neighbours = np.asarray([a + [a[0]] * (width - len(a)) for a in adj], np.int64)

  def neighbours(self, i: int) -> tuple:
    """Worker i's neighbours in the graph (host half: the peers it may draw)."""
    return tuple(sorted({int(j) for j in self._neighbours[i]} - {i}))

  def message_bytes(self, params) -> float:
    """Bytes of one message: one model (arrays or ``jax.ShapeDtypeStruct`` s). The host's event
    clock charges this, the device half reports it: one number."""
    return float(tree_bytes(params))

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    """Every worker with all its neighbours, one message each (an upper bound: the event
    clock charges each event's own exchange, :class:`nbsgd_jax.host.events.EventTimes`)."""
    del step, active
    return Pattern(adjacency_lib.Neighbours(self._neighbours), np.ones(self.n))

  def average(self, tree, peer, ctx):
    """``((tree + tree_peer) / 2 where peer != i, else tree; report)``.

    Args:
      tree: this worker's model.
      peer: int32 scalar, this worker's peer (itself: no exchange); a peer that is not a
        neighbour leaves the model unchanged.
      ctx: the step's context (failures are not supported by the asynchronous recipes).

    Returns:
      The averaged tree and the report: the model's bytes sent when it has a peer, else 0.
    """
    i = self.index()
    out = tree
    paired = jnp.asarray(False)
    for k, perm in enumerate(self.perms):
      pairs = [(a, perm[a]) for a in range(self.n)]
      recv = collectives.permute(tree, self.axis_name, pairs)
      use = (peer == jnp.asarray(self._partner[k])[i]) & (peer != i)
      paired = paired | use
      out = jax.tree.map(lambda o, a, r, use=use: jnp.where(use, (a + r) / 2, o), out, tree,
                         recv)
    sent = jnp.where(paired, jnp.float32(tree_bytes(tree)), jnp.float32(0.0))
    return out, self.report(self.charge(sent, ctx))

  def read(self, tree, published, peer, reads, ctx):
    """One-sided: ``((tree + published_peer) / 2 where reads and peer != i, else tree;
    report)``, the peer unchanged (ICLR-PopSGD/PopSGD ``worker.py``, commit 4f0c6f0: the
    initiator ``win.Get`` s its partner's published copy and averages it into its own model).

    Args:
      tree: this worker's model.
      published: this worker's published copy (what a worker that draws it reads).
      peer: int32 scalar, this worker's peer (itself: no exchange).
      reads: bool scalar, this worker initiates (reads its peer's copy); a worker with a peer
        that does not read is the one read from.
      ctx: the step's context.

    Returns:
      The tree and the report: the published copy's bytes sent by a worker read from, else 0
      (one message per pair, from the partner to the initiator).
    """
    i = self.index()
    out = tree
    paired = jnp.asarray(False)
    for k, perm in enumerate(self.perms):
      pairs = [(a, perm[a]) for a in range(self.n)]
      recv = collectives.permute(published, self.axis_name, pairs)
      mine = (peer == jnp.asarray(self._partner[k])[i]) & (peer != i)
      paired = paired | mine
      out = jax.tree.map(lambda o, a, r, use=mine & reads: jnp.where(use, (a + r) / 2, o), out,
                         tree, recv)
    sent = jnp.where(paired & ~reads, jnp.float32(tree_bytes(published)), jnp.float32(0.0))
    return out, self.report(self.charge(sent, ctx))


__all__ = ["PairwiseAverage"]
