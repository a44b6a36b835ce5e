"""Gossip: ``x_i <- sum_j W_ij x_j`` over a static or time-varying mixing matrix, and MATCHA's
random matchings.

* :class:`Gossip`: D-PSGD's averaging step (Lian et al., NeurIPS 2017, Eq. (2)) over
  ``W_{t mod P}`` (``P = 1``: a static W) by ``ppermute`` rounds
  (:func:`nbsgd_jax.communications.collectives.gossip`). Bytes of worker i: the model size times its number
  of live neighbours in ``W_t``; it waits for them.
* :class:`Matchings`: MATCHA (Wang et al. 2019, Sec. 3),
  ``x_i <- x_i - alpha sum_j B_j (x_i - x_{partner_j(i)})`` with ``B_j ~ Bernoulli(p_j)``
  drawn on the host from a seed shared by all workers (:meth:`Matchings.host_inputs`,
  ``ctx.active``). Bytes of worker i: the model size times the active matchings that pair it
  with a live partner.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.communications import adjacency as adjacency_lib
from nbsgd_jax.communications import collectives
from nbsgd_jax.topology import matchings as matchings_lib
from nbsgd_jax.core.axis import AXIS, tree_bytes
from nbsgd_jax.communications.base import Communication, Pattern


def _neighbours(w: np.ndarray) -> np.ndarray:
  """bool ``[n, n]``: ``W_ij != 0`` for ``j != i``."""
  off = np.asarray(w) != 0
  np.fill_diagonal(off, False)
  return off


def _neighbour_table(masks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Index lists of bool ``[n, n]`` neighbourhoods, one per phase: ``(index, valid)``, int32
  and bool ``[P, n, D]`` with ``D`` the largest degree; row ``i`` lists i's neighbours in
  increasing order, padded with ``i`` (``valid`` False)."""
  n = masks[0].shape[0]
  tables = []
  for m in masks:
    rows, cols = np.nonzero(m)  # row-major: grouped by row, columns increasing
    deg = np.bincount(rows, minlength=n)
    tables.append((rows, cols, deg))
  width = max([int(t[2].max(initial=0)) for t in tables] + [0])
  index = np.repeat(np.broadcast_to(np.arange(n, dtype=np.int32)[:, None], (n, width))[None],
                    len(masks), axis=0).copy()
  valid = np.zeros((len(masks), n, width), bool)
  for p, (rows, cols, deg) in enumerate(tables):
    start = np.concatenate([[0], np.cumsum(deg)[:-1]])
    pos = np.arange(len(rows)) - start[rows]
    index[p, rows, pos] = cols
    valid[p, rows, pos] = True
  return index, valid


class Gossip(Communication):
  """One gossip round over ``phases[t mod P]`` (see module docstring).

  Everything a step needs is built once here, O(n) per round and phase (no ``[n, n]`` array
  reaches the device or a step's host work): the ``ppermute`` rounds of each phase
  (:func:`nbsgd_jax.communications.collectives.gossip_plan`), each worker's neighbour count (float ``[P, n]``)
  and neighbour lists (int ``[P, n, D]``, D the largest degree: the live-neighbour count under
  failures and the clock's :class:`~nbsgd_jax.communications.adjacency.Neighbours`). With ``P > 1`` the phase is
  read as one value (:func:`nbsgd_jax.communications.collectives.shared`), so ``lax.switch`` runs the phase's
  rounds only, also under ``vmap``.

  Args:
    phases: the mixing matrices ``[n, n]`` of one period (one for a static W).
    n, axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.
  """

  def __init__(self, phases: Sequence[np.ndarray], axis_name: Any = AXIS,
               key: str = "gossip"):
    ws = [np.asarray(w, np.float64) for w in phases]
    if not ws:
      raise ValueError("Gossip needs at least one mixing matrix")
    super().__init__(len(ws[0]), axis_name, key)
    self.phases = ws
    self.plans = [collectives.gossip_plan(w) for w in ws]
    self._index, self._valid = _neighbour_table(self._masks(ws))  # [P, n, D]
    self._degree = self._valid.sum(axis=2).astype(np.float32)  # [P, n]
    own = np.arange(self.n)[:, None]
    self._patterns = [Pattern(adjacency_lib.Neighbours(np.concatenate([own, idx], axis=1)),
                              deg.astype(np.float64))
                      for idx, deg in zip(self._index, self._degree)]

  def _masks(self, ws: Sequence[np.ndarray]) -> list:
    """bool ``[n, n]`` per phase: whom worker i receives from (pattern and bytes)."""
    return [_neighbours(w) for w in ws]

  @classmethod
  def of_topology(cls, topology, axis_name: Any = AXIS, key: str = "gossip") -> "Gossip":
    """Gossip over a :class:`~nbsgd_jax.topology.Topology` (its period of W_t)."""
    phases = ([topology.mixing_matrix_at(t) for t in range(topology.period)]
              if topology.is_time_varying else [topology.mixing_matrix])
    return cls(phases, axis_name, key)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del active
    return self._patterns[step % len(self.phases)]

  def neighbours(self, phase, ctx) -> jnp.ndarray:
    """float32 scalar: this worker's neighbours in ``W_phase`` (live ones under failures),
    read from the ``[P, n]`` counts, or ``[P, n, D]`` lists and ``ctx.alive`` (D lookups)."""
    i = self.index()
    if ctx is None or ctx.alive is None:
      return jnp.asarray(self._degree)[phase, i]
    idx = jnp.asarray(self._index)[phase, i]  # [D]
    up = jnp.asarray(self._valid)[phase, i] & ctx.alive[idx]
    return jnp.sum(up.astype(jnp.float32))

  def mix(self, tree, ctx, message_bytes=None, difference: bool = False):
    """``(sum_j W_tij tree_j, report)``; under failures a failed neighbour's weight goes to
    the worker itself and a failed worker keeps its model. ``message_bytes`` (float32
    scalar): the bytes of the message sent to each neighbour, when it is not ``tree`` itself
    (CHOCO-SGD sends a compressed difference from which the receivers update ``tree``).
    ``difference``: ``sum_j W_tij (tree_i - tree_j)`` instead (:func:`~nbsgd_jax.communications.collectives.
    gossip`)."""
    alive = None if ctx is None else ctx.alive

    def run(plan):
      return lambda p: collectives.gossip(p, plan, self.axis_name, alive, difference)

    if len(self.plans) == 1:
      mixed = run(self.plans[0])(tree)
    else:
      mixed = lax.switch(self.phase(ctx), [run(plan) for plan in self.plans], tree)
    per = jnp.float32(tree_bytes(tree)) if message_bytes is None else message_bytes
    return mixed, self.message_report(per, ctx)

  def phase(self, ctx):
    """The step's phase of ``W_t`` (0 for a static W; one value over the axis)."""
    if len(self.plans) == 1:
      return 0
    return collectives.shared(ctx.step, self.axis_name) % len(self.plans)

  def message_report(self, message_bytes, ctx) -> dict:
    """The report of sending ``message_bytes`` (float32 scalar) to each neighbour of this
    step's phase (live ones under failures)."""
    sent = message_bytes * self.neighbours(self.phase(ctx), ctx)
    return self.report(self.charge(sent, ctx))


class CompressedGossip(Gossip):
  """CHOCO-SGD's exchange (Koloskova, Stich, Jaggi, ICML 2019, Algorithm 2): every worker
  sends its compressed difference ``q_i`` to each neighbour, who adds it to its copy of the
  public model ``x_hat_i``; :meth:`mix` then returns ``sum_j W_tij x_hat_j``. With a
  time-varying W_t a worker keeps a copy of every neighbour it ever mixes with, so ``q_i``
  goes to the neighbours of the union of the period's graphs at every step (pattern and
  bytes); for a static W that is W's neighbours."""

  def __init__(self, phases: Sequence[np.ndarray], axis_name: Any = AXIS, key: str = "choco"):
    super().__init__(phases, axis_name, key)

  def _masks(self, ws):
    union = np.logical_or.reduce([_neighbours(w) for w in ws])
    return [union] * len(ws)


class Matchings(Communication):
  """MATCHA's mixing over randomly activated matchings (see module docstring).

  Host constants O(K n) for K matchings: each matching's partner of every worker (``[K, n]``).
  Under ``vmap`` the activations are per-worker inputs, so ``lax.cond`` becomes a select: every
  matching's exchange is computed (K ``ppermute`` s, O(K n) model copies; no host constant in
  the branches, so nothing is broadcast to ``[n, n]``) and the inactive ones are dropped. A real
  branch on the shared activations (:func:`nbsgd_jax.communications.collectives.shared`) measured about 4x
  slower on the CPU (n = 512, MLP 784-16-10: each branch's result is a buffer of its own).

  Args:
    plan: a :class:`nbsgd_jax.topology.matchings.MatchaPlan` (matchings, probabilities, alpha).
    seed: seed of the shared activations.
    axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.
  """

  def __init__(self, plan, n: int, seed: int = 0, axis_name: Any = AXIS,
               key: str = "matchings"):
    super().__init__(n, axis_name, key)
    self.plan, self.seed = plan, int(seed)
    self.perms = [matchings_lib.matching_permutation(n, m) for m in plan.matchings]
    self._partner = np.asarray(self.perms, np.int32).reshape(len(self.perms), n)  # [K, n]
    self._matched = (self._partner != np.arange(n)).astype(np.float32)  # [K, n]

  def host_inputs(self, step: int) -> dict:
    active = matchings_lib.sample_activations(self.plan, self.seed, step)
    return {"active": active if len(active) else np.zeros((1,), bool)}

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del step
    on = [j for j in range(len(self.perms)) if j < len(active) and active[j]]
    partners = self._partner[on]  # [A, n]
    index = np.concatenate([np.arange(self.n)[None], partners], axis=0).T  # [n, 1 + A]
    return Pattern(adjacency_lib.Neighbours(index), self._matched[on].sum(axis=0, dtype=np.float64))

  def mix(self, tree, ctx):
    """``(x_i - alpha sum_j B_j (x_i - x_partner), report)``; matching j communicates (one
    ``ppermute``) only when active (``lax.cond``); a pair with a failed worker does not mix."""
    if not self.perms:
      return tree, self.report(self.charge(0.0, ctx))
    alive, i, active = ctx.alive, self.index(), ctx.active
    out, pair_up = tree, []
    for j, perm in enumerate(self.perms):
      pairs = [(a, perm[a]) for a in range(self.n)]

      def exchange(p, pairs=pairs):
        recv = collectives.permute(p, self.axis_name, pairs)
        return jax.tree.map(lambda a, r: a - r, p, recv)

      diff = lax.cond(active[j], exchange, lambda p: jax.tree.map(jnp.zeros_like, p), tree)
      up = jnp.float32(1.0)
      if alive is not None:
        up = (alive[i] & alive[jnp.asarray(self._partner[j])[i]]).astype(jnp.float32)
      pair_up.append(up)
      out = jax.tree.map(lambda o, d, up=up: o - jnp.asarray(self.plan.alpha, d.dtype) * up * d,
                         out, diff)
    sent = tree_bytes(tree) * jnp.sum(active.astype(jnp.float32)
                                      * jnp.asarray(self._matched)[:, i] * jnp.stack(pair_up))
    return out, self.report(self.charge(sent, ctx))
