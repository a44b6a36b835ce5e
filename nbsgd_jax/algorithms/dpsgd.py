"""Gossip-based decentralized SGD: D-PSGD and MATCHA.

D-PSGD (Lian et al., NeurIPS 2017, Algorithm 1): worker i computes ``u_i`` from its own
gradient ``g_i(x_i)`` with its own optax state (momentum buffers are local) and mixes with its
neighbours over a mixing matrix W:

* ``order="parallel"`` (Lian et al. Eq. (2)): ``x_i <- sum_j W_ij x_j + u_i``; the gossip of
  ``x`` does not depend on the gradient, so communication overlaps computation.
* ``order="atc"`` (adapt-then-combine, as in BlueFog): ``x_i <- sum_j W_ij (x_j + u_j)``.

A *mixer* ``(params, inputs) -> (mixed, bytes_sent)`` is the communication step
(``inputs``: :class:`~nbsgd_jax.algorithms.base.StepInputs`); this module builds one for a
static W, for a time-varying topology (W_t, e.g. one-peer exponential) and for MATCHA's random
matchings (Wang et al. 2019: ``W(t) = I - alpha sum_j B_j L_j``, ``B_j ~ Bernoulli(p_j)``
drawn on the host from a seed shared by all workers and passed in as ``inputs.active``).

Non-blocking SGD (He & Dube 2022, decentralized form): each worker steps with the mean of
its own finished mini-batch gradients; a worker that finished none takes no gradient step
(zero update, optimizer state unchanged) but still gossips.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from nbsgd_jax import collectives
from nbsgd_jax.algorithms.base import AXIS, Algorithm, masked_update, tree_bytes

ORDERS = ("parallel", "atc")
Mixer = Callable[[Any, jax.Array], tuple[Any, jax.Array]]


def static_mixer(mixing_matrix: np.ndarray, axis_name: str = AXIS) -> Mixer:
  """``x <- W x`` by ``ppermute`` rounds (:func:`nbsgd_jax.collectives.gossip`).

  Bytes: the mean degree of W's graph times the model size.
  """
  w = np.asarray(mixing_matrix, dtype=np.float64)

  def mix(params, inputs):
    alive = getattr(inputs, "alive", None)
    sent = jnp.float32(collectives.gossip_bytes(tree_bytes(params), w))
    if alive is not None:  # simulated failures: a live worker sends to its live neighbours
      i = lax.axis_index(axis_name)
      nbrs = jnp.asarray((w != 0) & ~np.eye(len(w), dtype=bool))[i]
      sent = jnp.float32(tree_bytes(params)) * jnp.sum(nbrs & alive).astype(jnp.float32)
      sent = jnp.where(alive[i], sent, 0.0)
    return collectives.gossip(params, w, axis_name, alive), sent

  return mix


def time_varying_mixer(phases: list[np.ndarray], axis_name: str = AXIS) -> Mixer:
  """``x <- W_{t mod P} x`` for a periodic list of mixing matrices (``lax.switch`` on step)."""
  ws = [np.asarray(w, dtype=np.float64) for w in phases]
  if len(ws) == 1:
    return static_mixer(ws[0], axis_name)

  def mix(params, inputs):
    phase = inputs.step % len(ws)
    alive = getattr(inputs, "alive", None)
    mixed = lax.switch(phase, [lambda p, w=w: collectives.gossip(p, w, axis_name, alive)
                               for w in ws], params)
    per_phase = [collectives.gossip_bytes(tree_bytes(params), w) for w in ws]
    sent = jnp.asarray(per_phase, jnp.float32)[phase]
    if alive is not None:  # as static_mixer: a live worker sends to its live neighbours
      i = lax.axis_index(axis_name)
      nbrs = jnp.asarray(np.stack([(w != 0) & ~np.eye(len(w), dtype=bool) for w in ws]))
      sent = jnp.float32(tree_bytes(params)) * jnp.sum(
          nbrs[phase, i] & alive).astype(jnp.float32)
      sent = jnp.where(alive[i], sent, 0.0)
    return mixed, sent

  return mix


def matcha_mixer(matchings: list[list[tuple[int, int]]], alpha: float, n: int,
                 axis_name: str = AXIS) -> Mixer:
  """MATCHA's random mixing ``x_i <- x_i - alpha sum_j B_j (x_i - x_{partner_j(i)})``.

  ``B_j`` is ``inputs.active[j]`` (bool ``[K]``, drawn on the host by
  :func:`nbsgd_jax.matcha.sample_activations`, the same on every worker); matching j
  communicates (one ``ppermute`` of its involution) only when active (``lax.cond``). Bytes of
  worker i: the model size times the number of active matchings that pair i with someone.
  Wang et al. 2019, Sec. 3.
  """
  from nbsgd_jax import matcha as matcha_lib

  perms = [matcha_lib.matching_permutation(n, m) for m in matchings]
  matched = np.array([[p[i] != i for i in range(n)] for p in perms], dtype=np.float32)

  def mix(params, inputs):
    if not perms:
      return params, jnp.float32(0.0)
    active = inputs.active
    alive = getattr(inputs, "alive", None)
    i = lax.axis_index(axis_name)
    out = params
    pair_up = []
    for j, perm in enumerate(perms):
      pairs = [(a, perm[a]) for a in range(n)]

      def exchange(p, pairs=pairs):
        recv = collectives.permute(p, axis_name, pairs)
        return jax.tree.map(lambda a, r: a - r, p, recv)

      diff = lax.cond(active[j], exchange, lambda p: jax.tree.map(jnp.zeros_like, p), params)
      up = jnp.float32(1.0)
      if alive is not None:  # a pair with a failed worker does not mix
        up = (alive[i] & alive[jnp.asarray(perm)[i]]).astype(jnp.float32)
      pair_up.append(up)
      out = jax.tree.map(lambda o, d, up=up: o - jnp.asarray(alpha, d.dtype) * up * d, out, diff)
    sent = tree_bytes(params) * jnp.sum(active.astype(jnp.float32) * jnp.asarray(matched)[:, i]
                                        * jnp.stack(pair_up))
    return out, sent.astype(jnp.float32)

  return mix


def gossip_sgd(name: str, optimizer: optax.GradientTransformation, mixer: Mixer,
               order: str = "parallel", nonblocking: bool = False, control=None,
               num_workers: int = 0, log_consensus: bool = False,
               control_mixer: Mixer | None = None, axis_name: str = AXIS) -> Algorithm:
  """Decentralized SGD with any mixer (see module docstring for the orders and the
  non-blocking rule).

  Args:
    name, optimizer, mixer, order, nonblocking: as above.
    control: a :class:`nbsgd_jax.consensus.Control` to add consensus control (Kong et al.
      2021): after the step, gossip again while the measured Xi exceeds ``inputs.target``
      (at most ``control.max_gossip_steps`` times); needs ``num_workers`` and
      ``inputs.target``. The update then returns ``aux`` with ``gossip_steps``,
      ``measurements`` and ``measured_consensus_distance`` (the last measured Xi; 0 where
      control is off); with ``control.gradient_stats`` also ``grad_sq`` and ``grad_noise``
      (:func:`nbsgd_jax.consensus.gradient_stats`, charged in bytes) for the critical
      target.
    num_workers: n (bytes of a measurement), with ``control``.
    control_mixer: the mixer of the extra gossip steps (default ``mixer``). MATCHA needs the
      base graph's static W here: one sampled W(t) = I - alpha sum_j B_j L_j is contractive
      only in expectation, and repeating one realization can diverge.
    log_consensus: also return the exact Xi after every step in ``aux``
      (``consensus_distance``, a diagnostic of the simulation, not charged in bytes).

  Raises:
    ValueError: unknown ``order``, or ``control`` without ``num_workers``.
  """
  if order not in ORDERS:
    raise ValueError(f"dpsgd.order={order!r} is not allowed: use one of {list(ORDERS)}")
  if control is not None:
    from nbsgd_jax import consensus
    consensus.check_control(control)
    if num_workers < 1:
      raise ValueError("gossip_sgd with consensus control needs num_workers >= 1")

  def step(grads, opt_state, params, inputs):
    if nonblocking:
      updates, opt_state = masked_update(optimizer, grads, opt_state, params, inputs.count > 0)
    else:
      updates, opt_state = optimizer.update(grads, opt_state, params)
    if order == "parallel":
      mixed, sent = mixer(params, inputs)
      return optax.apply_updates(mixed, updates), opt_state, sent
    mixed, sent = mixer(optax.apply_updates(params, updates), inputs)
    return mixed, opt_state, sent

  def grad_stats(grads, inputs):
    """(grad_sq, noise, bytes) of this step for the critical target; zeros where control is
    off (``inputs.target`` = inf)."""
    from nbsgd_jax import consensus
    key = jax.random.fold_in(jax.random.PRNGKey(control.seed + 1), inputs.step)
    cost = consensus.gradient_stats_bytes(num_workers, control)

    def on(g):
      gs, noise = consensus.gradient_stats(g, control, key, num_workers, axis_name)
      return gs, noise, jnp.float32(cost)

    def off(g):
      del g
      return jnp.float32(0.0), jnp.float32(0.0), jnp.float32(0.0)

    return lax.cond(jnp.isfinite(inputs.target), on, off, grads)

  def update(grads, opt_state, params, inputs):
    stats = None
    if control is not None and control.gradient_stats:
      stats = grad_stats(grads, inputs)
    params, opt_state, sent = step(grads, opt_state, params, inputs)
    if control is not None:
      from nbsgd_jax import consensus
      params, more, aux = consensus.control(params, control_mixer or mixer, inputs,
                                            num_workers, control, axis_name)
      aux["measured_consensus_distance"] = aux.pop("consensus_distance")
      if stats is not None:
        aux["grad_sq"], aux["grad_noise"] = stats[0], stats[1]
        more = more + stats[2]
      if log_consensus:  # exact, every step (also where control is off), not charged
        aux["consensus_distance"] = jnp.sqrt(
            consensus.measure_sq(params, consensus.Control(), None, axis_name))
      return params, opt_state, sent + more, aux
    if log_consensus:
      from nbsgd_jax import consensus
      xi2 = consensus.measure_sq(params, consensus.Control(), None, axis_name)
      return params, opt_state, sent, {"consensus_distance": jnp.sqrt(xi2)}
    return params, opt_state, sent

  return Algorithm(name=name, decentralized=True, init=optimizer.init, update=update)


def dpsgd(optimizer: optax.GradientTransformation, mixing_matrix: np.ndarray,
          order: str = "parallel", axis_name: str = AXIS) -> Algorithm:
  """D-PSGD over a fixed mixing matrix ``[n, n]`` (symmetric, doubly stochastic).

  Bytes per worker per step: the mean degree times the model size.

  Raises:
    ValueError: unknown ``order``.
  """
  return gossip_sgd("dpsgd", optimizer, static_mixer(mixing_matrix, axis_name), order)
