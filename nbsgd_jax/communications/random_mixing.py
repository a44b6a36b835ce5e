"""A round of mixing over a graph drawn anew each round on the host: Epidemic Learning and
Teleportation.

A rule maps a round ``r`` to a :class:`Draw`: the mixing matrix ``M_r`` (``x_i <- sum_j
M_r[i, j] x_j``), the models each worker sends and whom each worker waits for. The host draws
it once per round (:meth:`RandomMixing.draw`, cached), hands every worker the round's matrix
as ``ctx.shared["<key>/mixing"]`` (and the rule's flags, :meth:`RandomMixing.host_inputs`;
worker ``i`` reads its row) and gives the clock the same draw's pattern, so the host and the device never re-derive who talks to whom. The device
computes ``sum_j M[i, j] x_j`` from an ``all_gather`` (under ``vmap``, XLA turns it into one
``[n, n] x [n, d]`` product; measured: no ``[n, n, d]`` array).

* :func:`epidemic_local` (EL-Local; de Vos et al., NeurIPS 2023; sacs-epfl/decentralizepy
  tag ``epidemic-neurips-2023``, commit ff70eeecf3fd79988ec88dcfcdd0ad7e7d70a44b,
  ``node/EpidemicLearning/EL_Local.py`` and ``sharing/PlainAverageSharing.py``): each node sends
  its model to ``s`` others drawn uniformly without replacement; a node averages its own model
  and those it received uniformly (keeps its own when it received none).
* :func:`epidemic_oracle` (EL-Oracle, ``EL_Oracle_TopologyBuilder.py``): a fresh random
  ``s``-regular graph each round, ``networkx.random_regular_graph(s, n, seed)`` with the
  reference's seed ``seed * 100000 + round``, ring edges added when it is not connected
  (``Graph.connect_graph``); each node averages itself and its neighbours uniformly.
* :func:`teleportation` (Takezawa & Stich, ICLR 2025, arXiv 2501.15259;
  sacs-epfl/decentralized-learning-simulator ``dasklearn/simulation/teleportation``, commit
  bdbc50dbde61ef4894ebee5466d88023d9230461): ``k`` of the ``n`` nodes are active per round,
  holding ``k`` slots; after their local steps the slots average over a fixed random
  ``log2(k)``-regular graph ``G_k`` (drawn once, ``networkx.random_regular_graph(log2 k, k,
  seed)``) and slot ``s``'s average goes to the node that holds slot ``s`` next round.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from nbsgd_jax.communications import adjacency as adjacency_lib
from nbsgd_jax.communications import collectives
from nbsgd_jax.communications.base import Communication, Pattern
from nbsgd_jax.core.axis import AXIS, tree_bytes


class Draw(NamedTuple):
  """One round's mixing.

  Attributes:
    mixing: float64 ``[n, n]``, row ``i``: the weights of the models in worker i's new model.
    sends: float64 ``[n]``, the models worker i sends in the round.
    waits: list of ``n`` lists, the workers whose models worker i waits for.
    active: bool ``[n]``, the workers that train in the NEXT round (all for EL).
  """

  mixing: np.ndarray
  sends: np.ndarray
  waits: list
  active: np.ndarray


class Rule(NamedTuple):
  """A draw rule: ``draw(r)``, round ``r``'s :class:`Draw`, and ``first_active``, bool
  ``[n]``, the workers that train in round 0."""

  draw: Callable[[int], Draw]
  first_active: np.ndarray


def _averaging(n: int, senders: list) -> np.ndarray:
  """``M[i, j] = 1 / (|senders_i| + 1)`` for ``j`` in ``senders_i`` and ``j = i``."""
  m = np.zeros((n, n))
  for i, got in enumerate(senders):
    m[i, [i, *got]] = 1.0 / (len(got) + 1)
  return m


def epidemic_local(n: int, s: int, seed: int) -> Rule:
  """EL-Local's rule (module docstring): round ``r`` draws each node's ``s`` receivers with
  ``numpy.random.default_rng([seed, r])``, indices into the other nodes in increasing order
  (the reference's ``random.sample`` of its neighbour list).

  Raises:
    ValueError: ``s`` not in [1, n - 1].
  """
  if not 1 <= s <= n - 1:
    raise ValueError(f"epidemic.graph_degree={s} is not allowed with {n} workers: it must be "
                     f"in [1, {n - 1}]")

  def rule(r: int) -> Draw:
    rng = np.random.default_rng([seed, r])
    senders = [[] for _ in range(n)]
    for i in range(n):
      others = [j for j in range(n) if j != i]
      for v in rng.choice(n - 1, s, replace=False):
        senders[others[v]].append(i)
    senders = [sorted(x) for x in senders]
    return Draw(_averaging(n, senders), np.full(n, float(s)), senders, np.ones(n, bool))

  return Rule(rule, np.ones(n, bool))


def regular_graph(n: int, degree: int, seed: int) -> list:
  """Neighbour lists of ``networkx.random_regular_graph(degree, n, seed)``, with the ring
  edges ``(i, i + 1 mod n)`` added to every node when it is not connected (decentralizepy's
  ``Graph.connect_graph``)."""
  g = nx.random_regular_graph(degree, n, seed=seed)
  if n > 1 and not nx.is_connected(g):
    g.add_edges_from((i, (i + 1) % n) for i in range(n))
  return [sorted(g.neighbors(i)) for i in range(n)]


def epidemic_oracle(n: int, s: int, seed: int) -> Rule:
  """EL-Oracle's rule (module docstring): round ``r``'s graph is :func:`regular_graph`
  ``(n, s, seed * 100000 + r)``, the reference's seed.

  Raises:
    ValueError: ``s`` not in [1, n - 1] or ``n s`` odd (no ``s``-regular graph).
  """
  if not 1 <= s <= n - 1 or (n * s) % 2:
    raise ValueError(f"epidemic.graph_degree={s} is not allowed with {n} workers: an s-regular "
                     f"graph needs 1 <= s <= {n - 1} and n s even")

  def rule(r: int) -> Draw:
    nbrs = regular_graph(n, s, seed * 100000 + r)
    return Draw(_averaging(n, nbrs), np.asarray([len(x) for x in nbrs], float), nbrs,
                np.ones(n, bool))

  return Rule(rule, np.ones(n, bool))


def teleportation(n: int, k: int, seed: int) -> Rule:
  """Teleportation's rule (module docstring): round ``r``'s ``k`` active nodes are the first
  ``k`` of ``numpy.random.default_rng([seed, r]).permutation(n)``, node ``sample_r[s]``
  holding slot ``s``; the slots' graph is :func:`regular_graph` ``(k, log2 k, seed)``, drawn
  once. The draw of round ``r`` mixes what round ``r``'s nodes trained into round ``r + 1``'s
  nodes; a node that holds no slot next round keeps its model.

  Raises:
    ValueError: ``k`` not a power of two in [2, n] (the reference's check).
  """
  if k < 2 or k > n or k & (k - 1):
    raise ValueError(f"teleportation.sample_size={k} is not allowed with {n} workers: it "
                     f"must be a power of two in [2, {n}]")
  slots = regular_graph(k, int(math.log2(k)), seed)
  sample = lambda r: np.random.default_rng([seed, r]).permutation(n)[:k]

  def rule(r: int) -> Draw:
    now, nxt = sample(r), sample(r + 1)
    m, waits, sends = np.eye(n), [[] for _ in range(n)], np.zeros(n)
    for slot, node in enumerate(nxt):
      group = [now[t] for t in [slot, *slots[slot]]]
      m[node] = 0.0
      m[node, group] = 1.0 / len(group)
      waits[node] = sorted(int(j) for j in group if j != node)
    sends[now] = len(slots[0]) + 1  # to its slot's neighbours, then forward the average
    return Draw(m, sends, waits, _mask(n, nxt))

  return Rule(rule, _mask(n, sample(0)))


def _mask(n: int, members) -> np.ndarray:
  out = np.zeros(n, bool)
  out[np.asarray(members)] = True
  return out


class RandomMixing(Communication):
  """One round of mixing over the rule's graph of the round (module docstring).

  Args:
    n: workers.
    rule: the :class:`Rule`.
    period: steps per round (the round of step t is ``t // period``).
    axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.
  """

  def __init__(self, n: int, rule: Rule, period: int, axis_name: Any = AXIS,
               key: str = "mixing"):
    super().__init__(n, axis_name, key)
    self.rule, self.period = rule, int(period)

  @functools.lru_cache(maxsize=8)
  def draw(self, r: int) -> Draw:
    """Round ``r``'s draw (host half; cached: the inputs and the pattern read the same)."""
    return self.rule.draw(r)

  def host_inputs(self, step: int) -> dict:
    r = step // self.period
    active = self.rule.first_active if r == 0 else self.draw(r - 1).active
    d = self.draw(r)
    holds = d.active if (step + 1) % self.period == 0 else active
    return {"shared": {f"{self.key}/mixing": d.mixing.astype(np.float32),
                       f"{self.key}/sends": d.sends.astype(np.float32),
                       f"{self.key}/active": active, f"{self.key}/holds": holds}}

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del active
    d = self.draw(step // self.period)
    return Pattern(adjacency_lib.Neighbours.of_lists(d.waits), d.sends.copy())

  def training(self, ctx) -> jax.Array:
    """bool scalar: whether this worker trains in the step's round."""
    return ctx.shared[f"{self.key}/active"][self.index()]

  def holds(self, ctx) -> jax.Array:
    """bool scalar: whether this worker's model is one of the round's models after the step
    (Teleportation: it holds a slot; the next round's node after a round's mixing)."""
    return ctx.shared[f"{self.key}/holds"][self.index()]

  def mix(self, tree, ctx):
    """``(sum_j M[i, j] tree_j, report)``: a failed worker's weight goes to the receiver
    itself, and a failed worker keeps its model; bytes: the models it sends."""
    i = self.index()
    row = ctx.shared[f"{self.key}/mixing"][i]
    if ctx.alive is not None:
      up = ctx.alive.astype(row.dtype)
      kept = row * up
      row = jnp.where(ctx.alive[i], kept.at[i].add(jnp.sum(row) - jnp.sum(kept)),
                      jax.nn.one_hot(i, self.n, dtype=row.dtype))
    out = jax.tree.map(lambda x: jnp.tensordot(row, collectives.all_gather(x, self.axis_name),
                                               axes=1).astype(x.dtype), tree)
    sent = ctx.shared[f"{self.key}/sends"][i] * jnp.float32(tree_bytes(tree))
    return out, self.report(self.charge(sent, ctx))


__all__ = ["Draw", "RandomMixing", "Rule", "epidemic_local", "epidemic_oracle", "regular_graph",
           "teleportation"]
