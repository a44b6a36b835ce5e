"""A hierarchical network: levels of groups (devices in a node, nodes in a region, ...), each
with its alpha-beta link, and a message charged by the link it crosses.

``cluster.levels`` lists the levels innermost first as ``"size:latency:bandwidth"`` strings
(``size`` workers, or groups of the level below, per group; seconds per message; bytes per
second): ``("8:1e-6:3e11", "4:1e-5:1.25e10")`` is 8 workers a node over NVLink-like links, 4
nodes a region over a datacenter network. Beyond the last level the cluster's own
``latency`` and ``bandwidth`` are the link (the wide-area one). Worker ``i`` sits at place
``p_i`` (``cluster.placement``, a permutation; by default ``p_i = i``), in node ``p_i // 8``
and region ``p_i // 32`` (a placement without levels is refused: it would change nothing;
so are levels whose groups do not tile the workers, :func:`parse_levels`).
A message from ``i`` to ``j`` crosses the innermost level whose group holds both.

A round of a communication (:class:`~nbsgd_jax.communications.Round`: who waits for whom,
messages and bytes per worker) costs, per worker (:meth:`Network.round_time`):

* a collective (an all-reduce over a group): a flat ring over the slowest link the group
  spans, ``comm_i = latency_L messages_i + bytes_i / bandwidth_L`` with ``L`` the outermost
  level any two members cross (``docs/clock.md``, "A hierarchical network": a flat ring runs
  at its slowest link);
  with each worker in its own group (the phases of a hierarchical all-reduce), ``L`` is the
  outermost level between the worker and its group;
* point to point (gossip, a pairwise exchange): worker ``i``'s messages go to the workers it
  exchanges with (its neighbourhood), each at its own link: ``comm_i = messages_i mean_j
  latency_(i,j) + bytes_i mean_j 1 / bandwidth_(i,j)`` over its neighbours ``j`` (exact when
  it sends each of them the same message).

Without levels, every link is the cluster's, the alpha-beta model of
:func:`nbsgd_jax.host.clock.comm_time`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.communications.adjacency import Group, Neighbours


def parse_levels(levels: Sequence[str], n: int | None = None) -> list[tuple[int, float, float]]:
  """``[(size, latency, bandwidth)]`` of ``cluster.levels``; with ``n`` (workers), checked to
  tile them.

  A level's group holds its size times the workers of a group of the level inside it (the
  product of the sizes up to it), so each level's group size divides the next one's by
  construction; the levels tile ``n`` workers when the outermost group size divides ``n``
  (``n`` over it is the number of top-level groups, joined by the cluster's own link). A group
  size that does not divide ``n`` (``"3:..."`` with 8 workers: uneven groups) or exceeds it
  (``"16:..."`` with 8: a group bigger than the cluster) is refused: :meth:`Network.level`
  would charge links between groups that do not exist.

  Raises:
    ValueError: a malformed entry, a size < 2, a latency < 0 or a bandwidth <= 0; with ``n``,
      a level whose group size does not divide ``n`` (named as ``cluster.levels``, with the
      level and ``num_workers``).
  """
  out = []
  for item in levels:
    try:
      size, lat, bw = str(item).split(":")
      size, lat, bw = int(size), float(lat), float(bw)
    except ValueError:
      raise checks.not_allowed("cluster.levels", tuple(levels), f"entry {item!r} must be "
                               "'size:latency:bandwidth', e.g. '8:1e-6:3e11'") from None
    if size < 2 or lat < 0 or bw <= 0 or not (math.isfinite(lat) and math.isfinite(bw)):
      raise checks.not_allowed("cluster.levels", tuple(levels), f"entry {item!r} needs size "
                               ">= 2, latency >= 0 and bandwidth > 0")
    out.append((size, lat, bw))
  span = 1
  for j, (size, _, _) in enumerate(out):
    span *= size
    if n is not None and (span > n or n % span):
      how = "exceeds" if span > n else "does not divide"
      raise ValueError(
          f"cluster.levels={tuple(levels)!r} is not allowed with config.num_workers={n}: level "
          f"{j} ({levels[j]!r}) makes groups of {span} workers, which {how} {n}; each level's "
          "group (its size times the sizes inside it) must divide num_workers")
  return out


class Network:
  """The levels of ``cluster.levels`` over ``n`` workers (module docstring).

  Args:
    n: workers.
    levels: ``[(size, latency, bandwidth)]``, innermost first.
    latency, bandwidth: the outermost link (the cluster's own).
  """

  def __init__(self, n: int, levels: Sequence[tuple], latency: float, bandwidth: float,
               placement: Sequence[int] = ()):
    self.n = n
    self.pos = np.arange(n) if not len(placement) else np.asarray(placement, np.int64)
    if sorted(self.pos.tolist()) != list(range(n)):
      raise checks.not_allowed("cluster.placement", tuple(placement),
                               f"it must be a permutation of 0..{n - 1} (worker i's place)")
    spans = np.cumprod([1] + [int(s) for s, _, _ in levels])  # workers per group, by level
    self.spans = spans[1:]
    self.latency = np.array([lat for _, lat, _ in levels] + [latency], np.float64)
    self.bandwidth = np.array([bw for _, _, bw in levels] + [bandwidth], np.float64)

  def level(self, i, j) -> np.ndarray:
    """The level of the link between workers ``i`` and ``j`` (arrays broadcast): the
    innermost level whose group holds both, ``len(levels)`` for the outermost link."""
    i, j = self.pos[np.asarray(i)], self.pos[np.asarray(j)]
    same = np.stack([i // s == j // s for s in self.spans] + [np.ones(np.broadcast(i, j).shape,
                                                                      bool)])
    return np.argmax(same, axis=0)

  def _group_level(self, members: np.ndarray) -> int:
    """The outermost level two of ``members`` cross: that of the first and the last place
    (a group is a contiguous range of places, so theirs holds every member in between)."""
    idx = np.flatnonzero(members)
    if idx.size < 2:
      return 0
    first, last = idx[np.argmin(self.pos[idx])], idx[np.argmax(self.pos[idx])]
    return int(self.level(first, last))

  def round_time(self, messages, num_bytes, adjacency, collective: bool) -> np.ndarray:
    """float64 ``[n]``: each worker's seconds in the round (module docstring)."""
    messages = np.broadcast_to(np.asarray(messages, np.float64), (self.n,))
    num_bytes = np.broadcast_to(np.asarray(num_bytes, np.float64), (self.n,))
    if collective and (adjacency is None or isinstance(adjacency, Group)):
      members = (np.ones(self.n, bool) if adjacency is None else
                 np.asarray(adjacency.members, bool))
      lv = self._group_level(members)
      return self.latency[lv] * messages + num_bytes / self.bandwidth[lv]
    if collective:  # a collective in each worker's own group (a phase of a 2-D all-reduce)
      lv = np.array([int(self.level(i, p).max()) if len(p) else 0
                     for i, p in enumerate(_peers(adjacency, self.n))])
      return self.latency[lv] * messages + num_bytes / self.bandwidth[lv]
    lat, inv = np.empty(self.n), np.empty(self.n)
    for i, peers in enumerate(_peers(adjacency, self.n)):
      lv = self.level(i, peers) if len(peers) else np.array([len(self.spans)])
      lat[i], inv[i] = self.latency[lv].mean(), (1.0 / self.bandwidth[lv]).mean()
    return lat * messages + num_bytes * inv


def _dense(adjacency) -> np.ndarray:
  return adjacency.dense() if hasattr(adjacency, "dense") else np.asarray(adjacency, bool)


def _peers(adjacency, n: int) -> list:
  """Each worker's neighbours (itself excluded) in a round's adjacency."""
  if adjacency is None:
    return [np.array([j for j in range(n) if j != i]) for i in range(n)]
  if isinstance(adjacency, Neighbours):
    return [np.array(sorted(set(row.tolist()) - {i})) for i, row in enumerate(adjacency.index)]
  d = _dense(adjacency)
  return [np.array([j for j in np.flatnonzero(d[i]) if j != i]) for i in range(n)]


__all__ = ["Network", "parse_levels"]
