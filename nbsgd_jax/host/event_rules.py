"""The event clock's touch rules (:class:`~nbsgd_jax.host.event_clock.EventClock`'s
``touch``): what an event of worker i touches, drawn from ``(seed, i, k)`` alone
(:func:`random_peer`, by :func:`draw_index`) or by a rule with state that the clock runs in
order (:class:`RandomWalkToken`)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np


_MASK = (1 << 64) - 1


def draw_index(seed: int, i: int, k: int, m: int) -> int:
  """A uniform index in ``[0, m)`` from ``(seed, i, k)`` alone: splitmix64 (Steele, Lea,
  Flood, OOPSLA 2014) of the three, 0.3 us in Python against 20 us for a seeded numpy
  generator (the event clock draws one per event it meets)."""
  z = (seed * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9 + k * 0x94D049BB133111EB + 1) & _MASK
  for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
    z = ((z ^ (z >> shift)) * mult) & _MASK
  return ((z ^ (z >> 31)) * m) >> 64


def random_peer(neighbours: Callable[[int], Sequence[int]], seed: int,
                active: Optional[np.ndarray] = None, every: int = 1) -> Callable[[int, int], tuple]:
  """A random pairing as an event clock's ``touch``: worker i's event k averages with a
  neighbour drawn uniformly (AD-PSGD, Lian et al. 2018, Algorithm 1, line 2) by
  :func:`draw_index` of ``(seed, i, k)`` (the same draw however events are batched).

  Args:
    neighbours: ``i -> its neighbours``.
    seed: the draws' seed.
    active: bool ``[n]`` or None: only active workers initiate (the reference's bipartite
      active / passive roles, stochastic_gradient_push ``gossip/ad_psgd.py``); a passive
      worker's event touches itself alone.
    every: only every ``every``-th event of a worker pairs (events ``k`` with ``(k + 1) %
      every == 0``: SwarmSGD's H local steps between interactions); >= 1.
  """
  table, last = {}, {}  # worker -> its neighbours; worker -> (k, its last draw)

  def touch(i: int, k: int) -> tuple:
    if i not in table:
      table[i] = tuple(int(j) for j in neighbours(i))
    if last.get(i, (None,))[0] == k:
      return last[i][1]
    nb = table[i]
    if not nb or (active is not None and not active[i]) or (k + 1) % every:
      out = (i,)
    else:
      out = (i, nb[draw_index(seed, i, k, len(nb))])
    last[i] = (k, out)
    return out

  return touch


class RandomWalkToken:
  """An event rule with state: a token walks the graph. The holder's event touches
  ``(i, j)``, ``j`` a neighbour drawn uniformly by :func:`draw_index` of ``(seed, i, k)``, and
  hands the token to ``j``; any other worker's event touches itself alone. Where the token is
  depends on the events before, so the clock runs it in order (``in_order``). The pattern of
  random-walk methods, where one model or message travels a random walk over the workers
  (e.g. Walkman, Mao, Yu, Yin et al., IEEE Trans. Signal Process. 2020).

  Args:
    neighbours: ``i -> its neighbours``.
    seed: the draws' seed.
    holder: the worker that holds the token first.
  """

  in_order = True

  def __init__(self, neighbours: Callable[[int], Sequence[int]], seed: int, holder: int = 0):
    self.neighbours, self.seed, self.holder = neighbours, int(seed), int(holder)
    self._last: dict = {}  # worker -> (k, its last draw): a repeated (i, k) is not a new draw

  def __call__(self, i: int, k: int) -> tuple:
    if self._last.get(i, (None,))[0] == k:
      return self._last[i][1]
    nb = tuple(int(j) for j in self.neighbours(i))
    out = (i,)
    if i == self.holder and nb:
      out = (i, nb[draw_index(self.seed, i, k, len(nb))])
      self.holder = out[1]
    self._last[i] = (k, out)
    return out

  def state_dict(self) -> dict:
    return {"holder": self.holder, "last": [[i, k, list(t)] for i, (k, t) in self._last.items()]}

  def load_state_dict(self, d: dict) -> None:
    self.holder = int(d["holder"])
    self._last = {int(i): (int(k), tuple(t)) for i, k, t in d["last"]}


__all__ = ["RandomWalkToken", "draw_index", "random_peer"]
