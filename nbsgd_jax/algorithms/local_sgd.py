"""Local SGD with periodic averaging (LUPA-SGD) and DiLoCo.

* Local SGD / LUPA-SGD (Haddadpour, Kamani, Mahdavi and Cadambe, "Local SGD with Periodic
  Averaging: Tighter Analysis and Adaptive Synchronization", NeurIPS 2019, Algorithm 1): every
  worker takes local optax steps on its own data; at the end of each communication period
  (every ``tau`` steps, or as a :mod:`nbsgd_jax.local_sgd` schedule decides) the models are
  replaced by their average ``x <- (1/n) sum_i x_i`` (``averaging="mean"``, ``lax.pmean``) or
  by one gossip step ``x_i <- sum_j W_ij x_j`` (``averaging="gossip"``).
* DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
  Models", 2023, Algorithm 1): ``H`` inner steps with an inner optimizer from the outer
  parameters ``x_outer``; then the averaged pseudo-gradient
  ``Delta = x_outer - (1/n) sum_i x_i`` is fed to an outer optax optimizer (Nesterov SGD,
  lr 0.7, momentum 0.9 in the paper), ``x_outer <- x_outer + outer.update(Delta)``, and every
  worker restarts from ``x_outer``. With outer lr 1 and no momentum this is local SGD with
  ``tau = H`` (``x_outer - Delta = mean_i x_i``).

Periodic algorithms have two programs: ``update`` (a local step, no communication, 0 bytes)
and ``sync_update`` (the local step followed by the synchronisation). The trainer decides on
the host which one a step runs (:class:`nbsgd_jax.local_sgd.SyncPlanner`), so steps that do
not communicate dispatch no collective at all, and ``sim_time`` / ``bytes_sent`` count only
the synchronisations.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from jax import lax

from nbsgd_jax import collectives
from nbsgd_jax.algorithms.base import AXIS, Algorithm, tree_bytes

from nbsgd_jax.local_sgd import AVERAGINGS, OPT_STATE_SYNCS  # noqa: E402


def _local_step(optimizer, grads, opt_state, params):
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


def _pmean_floats(tree, axis_name: str):
  """``lax.pmean`` of the inexact leaves of ``tree``; integer leaves (step counts) unchanged."""
  return jax.tree.map(
      lambda x: lax.pmean(x, axis_name) if jnp.issubdtype(x.dtype, jnp.inexact) else x, tree)


def local_sgd(optimizer: optax.GradientTransformation, num_workers: int,
              averaging: str = "mean", opt_state_sync: str = "keep", mixer=None,
              axis_name: str = AXIS) -> Algorithm:
  """Local SGD with periodic averaging (LUPA-SGD, Haddadpour et al. 2019, Algorithm 1).

  Args:
    optimizer: the local optax optimizer (each worker has its own state).
    num_workers: n.
    averaging: ``"mean"``: exact model average (``lax.pmean``; bytes counted as a ring
      all-reduce, ``2 (n - 1) / n * S``); ``"gossip"``: one step of ``mixer``
      (``(params, inputs) -> (mixed, bytes)``, e.g. :func:`~nbsgd_jax.algorithms.static_mixer`).
    opt_state_sync: what happens to the optimizer state at a synchronisation: ``"keep"``
      (each worker keeps its own, e.g. local momentum buffers), ``"average"`` (floating-point
      leaves averaged like the models; with ``averaging="gossip"`` they are gossiped too) or
      ``"reset"`` (re-initialised from the synchronised params).
    axis_name: the worker axis.

  Returns:
    an :class:`Algorithm` with ``sync_update``. ``update`` is a purely local step (0 bytes).

  Raises:
    ValueError: unknown ``averaging`` / ``opt_state_sync``, or gossip without a mixer.
  """
  if averaging not in AVERAGINGS:
    raise ValueError(f"local_sgd.averaging={averaging!r} is not allowed: use one of "
                     f"{list(AVERAGINGS)}")
  if opt_state_sync not in OPT_STATE_SYNCS:
    raise ValueError(f"local_sgd.opt_state={opt_state_sync!r} is not allowed: use one of "
                     f"{list(OPT_STATE_SYNCS)}")
  if averaging == "gossip" and mixer is None:
    raise ValueError("local_sgd with averaging='gossip' needs a mixer")

  def update(grads, opt_state, params, inputs):
    del inputs
    params, opt_state = _local_step(optimizer, grads, opt_state, params)
    return params, opt_state, jnp.float32(0.0)

  def average(tree, inputs):
    if averaging == "mean":
      sent = collectives.ring_all_reduce_bytes(tree_bytes(tree), num_workers)
      return _pmean_floats(tree, axis_name), jnp.float32(sent)
    return mixer(tree, inputs)

  def sync_update(grads, opt_state, params, inputs):
    params, opt_state = _local_step(optimizer, grads, opt_state, params)
    params, sent = average(params, inputs)
    if opt_state_sync == "average":
      floats = [x for x in jax.tree.leaves(opt_state) if jnp.issubdtype(x.dtype, jnp.inexact)]
      if floats:
        if averaging == "mean":
          opt_state = _pmean_floats(opt_state, axis_name)
          sent = sent + jnp.float32(
              collectives.ring_all_reduce_bytes(tree_bytes(floats), num_workers))
        else:
          mixed, more = mixer(floats, inputs)
          it = iter(mixed)
          opt_state = jax.tree.map(
              lambda x: next(it) if jnp.issubdtype(x.dtype, jnp.inexact) else x, opt_state)
          sent = sent + more
    elif opt_state_sync == "reset":
      opt_state = optimizer.init(params)
    return params, opt_state, sent

  return Algorithm(name="local_sgd", decentralized=True, init=optimizer.init, update=update,
                   sync_update=sync_update)


class DiLoCoState(NamedTuple):
  """Optimizer state of one DiLoCo worker.

  Attributes:
    inner: the inner optimizer's state (local to the worker, kept across rounds).
    outer: the outer optimizer's state (identical on every worker).
    anchor: ``x_outer``, the outer parameters the current round started from.
  """

  inner: Any
  outer: Any
  anchor: Any


def outer_nesterov(learning_rate: float = 0.7, momentum: float = 0.9
                   ) -> optax.GradientTransformation:
  """DiLoCo's default outer optimizer: SGD with Nesterov momentum (lr 0.7, momentum 0.9)."""
  return optax.sgd(learning_rate, momentum=momentum or None, nesterov=bool(momentum))


def diloco(inner: optax.GradientTransformation, num_workers: int,
           outer: Optional[optax.GradientTransformation] = None,
           axis_name: str = AXIS) -> Algorithm:
  """DiLoCo (Douillard et al. 2023, Algorithm 1) on the worker axis.

  ``update``: one inner step. ``sync_update`` (the H-th inner step of a round): the inner
  step, then ``Delta = x_outer - pmean(x_i)`` (the outer gradient, pointing uphill like a
  gradient), ``x_outer <- optax.apply_updates(x_outer, outer.update(Delta))`` and every worker
  restarts from ``x_outer``; the inner state is kept (as in the paper). Bytes: one ring
  all-reduce of the model per round.

  Args:
    inner: the inner optax optimizer (the paper uses AdamW; here anything).
    num_workers: n.
    outer: the outer optax optimizer, default :func:`outer_nesterov` (lr 0.7, momentum 0.9).
    axis_name: the worker axis.
  """
  outer = outer if outer is not None else outer_nesterov()

  def init(params):
    return DiLoCoState(inner.init(params), outer.init(params), params)

  def update(grads, opt_state, params, inputs):
    del inputs
    params, inner_state = _local_step(inner, grads, opt_state.inner, params)
    return params, opt_state._replace(inner=inner_state), jnp.float32(0.0)

  def sync_update(grads, opt_state, params, inputs):
    del inputs
    params, inner_state = _local_step(inner, grads, opt_state.inner, params)
    sent = collectives.ring_all_reduce_bytes(tree_bytes(params), num_workers)
    delta = jax.tree.map(lambda a, x: a - x, opt_state.anchor, lax.pmean(params, axis_name))
    updates, outer_state = outer.update(delta, opt_state.outer, opt_state.anchor)
    anchor = optax.apply_updates(opt_state.anchor, updates)
    return anchor, DiLoCoState(inner_state, outer_state, anchor), jnp.float32(sent)

  return Algorithm(name="diloco", decentralized=True, init=init, update=update,
                   sync_update=sync_update)
