"""Wrappers and reducers: the pieces recipes are composed of.

* Reducers (a :class:`~nbsgd_jax.transforms.WorkerTransform` whose ``update`` maps a tree to
  its combination over the workers): :func:`mean_of` (an all-reduce), :func:`gossip_of` (one
  gossip round), :func:`~nbsgd_jax.transforms.error_feedback` (a compressed mean), and
  :func:`via_anchor` (a model average sent as the difference to the last synchronised model,
  so that a compressor can act on it).
* :func:`gossip_step`: decentralized SGD, D-PSGD (Lian et al., NeurIPS 2017, Algorithm 1) with
  any gossip communication: ``order="parallel"`` (their Eq. (2)) ``x_i <- sum_j W_ij x_j + u_i``
  (the exchange of x does not depend on the gradient, so it overlaps the computation) or
  ``"atc"`` (adapt-then-combine) ``x_i <- sum_j W_ij (x_j + u_j)``: the local step, then the
  gossip, as the reference codes do (JYWa/MATCHA train_mpi.py: ``optimizer.step()`` then
  ``communicator.communicate(model)``; BlueFog; Koloskova et al. 2020, Algorithm 1), and the
  default (``dpsgd.order``; both measured in ``docs/nonblocking.md``).
* :func:`periodic`: local steps with a synchronisation at the end of every period (the host's
  planner sets ``ctx.period_end``): local SGD / LUPA-SGD (Haddadpour et al., NeurIPS 2019,
  Algorithm 1) with :func:`average_models`, DiLoCo (Douillard et al. 2023, Algorithm 1) with
  :func:`outer_step`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from nbsgd_jax.communications import collectives
from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       no_state, replace_params)

ORDERS = ("parallel", "atc")  # config.dpsgd.order: gossip_step's orders
OPT_STATE_SYNCS = ("keep", "average", "reset")  # config.local_sgd.opt_state: average_models


# ----------------------------------------------------------------------------- reducers


def mean_of(allreduce, by: str = "count") -> WorkerTransform:
  """Reducer: the (weighted) mean over the workers by an
  :class:`~nbsgd_jax.communications.AllReduce` (``by``: see its ``weight``)."""

  def update(tree, state, params, ctx):
    del params
    out, report = allreduce.mean(tree, ctx, by)
    return out, state, report

  return WorkerTransform(no_state, update, (allreduce,))


def gossip_of(gossip) -> WorkerTransform:
  """Reducer: one round of a :class:`~nbsgd_jax.communications.Gossip` or
  :class:`~nbsgd_jax.communications.Matchings`."""

  def update(tree, state, params, ctx):
    del params
    out, report = gossip.mix(tree, ctx)
    return out, state, report

  return WorkerTransform(no_state, update, (gossip,))


def mixing_of(mixing) -> WorkerTransform:
  """Reducer: one round of a :class:`~nbsgd_jax.communications.random_mixing.RandomMixing`
  (Epidemic Learning's, Teleportation's graph of the round)."""

  def update(tree, state, params, ctx):
    del params
    out, report = mixing.mix(tree, ctx)
    return out, state, report

  return WorkerTransform(no_state, update, (mixing,))


class HoldingState(NamedTuple):
  """State of :func:`holding`: the inner transform's, and whether this worker's model is one
  the evaluation reads (bool scalar)."""

  inner: Any
  holds: Any


def holding(inner, holds: Callable) -> WorkerTransform:
  """``inner``, recording ``holds(ctx)`` after every step (Teleportation: the nodes holding
  a slot), which :func:`held_models` reads."""
  inner = as_worker_transform(inner)

  def init(params):
    return HoldingState(inner.init(params), jnp.asarray(True))

  def update(updates, state, params, ctx):
    u, s, report = inner.update(updates, state.inner, params, ctx)
    return u, HoldingState(s, jnp.asarray(holds(ctx), bool)), report

  return WorkerTransform(init, update, inner.communications)


def held_models(opt_state, params):
  """``Recipe.evaluated`` of :func:`holding`: the mean of the models held (the stacked
  ``[n, ...]`` parameters weighted by :attr:`HoldingState.holds`), replicated on every
  worker.

  Raises:
    ValueError: the state holds no or several :class:`HoldingState`.
  """
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=lambda z: isinstance(z, HoldingState))
           if isinstance(x, HoldingState)]
  if len(found) != 1:
    raise ValueError(f"the optimizer state holds {len(found)} HoldingState, not one")
  w = found[0].holds.astype(jnp.float32)
  w = w / jnp.maximum(jnp.sum(w), 1.0)
  return jax.tree.map(lambda x: jnp.broadcast_to(jnp.tensordot(w, x, axes=1).astype(x.dtype),
                                                 x.shape), params)


class AnchorState(NamedTuple):
  """State of :func:`via_anchor`: ``anchor`` (the last synchronised model, the same on every
  worker) and the inner reducer's state."""

  anchor: Any
  inner: Any


def via_anchor(reducer: WorkerTransform) -> WorkerTransform:
  """Reducer of models through their difference to the last synchronised model:
  ``x_avg = anchor - R(anchor - x_i)``, ``anchor <- x_avg``. With a plain mean this is the model
  average; with :func:`~nbsgd_jax.transforms.error_feedback` it sends a compressed model
  difference (compressed local SGD)."""

  def init(params):
    return AnchorState(params, reducer.init(params))

  def update(x, state, params, ctx):
    delta = jax.tree.map(lambda a, b: a - b, state.anchor, x)
    mean_delta, inner, report = reducer.update(delta, state.inner, params, ctx)
    x_avg = jax.tree.map(lambda a, d: a - d, state.anchor, mean_delta)
    return x_avg, AnchorState(x_avg, inner), report

  return WorkerTransform(init, update, reducer.communications)


# ----------------------------------------------------------------------------- gossip


def gossip_step(local, gossip, order: str = "atc") -> WorkerTransform:
  """Decentralized SGD (module docstring): the local transform ``local`` (e.g. an optax
  optimizer; its updates ``u_i`` from this worker's gradient) and one round of ``gossip``.

  Raises:
    ValueError: unknown ``order``.
  """
  if order not in ORDERS:
    raise ValueError(f"dpsgd.order={order!r} is not allowed: use one of {list(ORDERS)}")
  local = as_worker_transform(local)
  if order == "parallel":  # x_t is exchanged while g(x_t) is computed: the clock overlaps them
    gossip = gossip.overlapping()

  def update(grads, state, params, ctx):
    updates, state, report = local.update(grads, state, params, ctx)
    if order == "parallel":
      mixed, comm = gossip.mix(params, ctx)
      new = optax.apply_updates(mixed, updates)
    else:
      new, comm = gossip.mix(optax.apply_updates(params, updates), ctx)
    return replace_params(params, new), state, merge_reports(report, comm)

  return WorkerTransform(local.init, update, local.communications + (gossip,))


# ----------------------------------------------------------------------------- periodic


class Synchronisation(NamedTuple):
  """The end of a communication period.

  Attributes:
    init: ``params -> state``.
    apply: ``(x, local_state, state, ctx) -> (x, local_state, state, report)``: the models
      after the period's last local step in, the synchronised ones out (it may also change
      the local transform's state: optimizer-state averaging or reset).
    communications: as :class:`~nbsgd_jax.transforms.WorkerTransform`.
  """

  init: Callable[[Any], Any]
  apply: Callable
  communications: tuple = ()


class PeriodicState(NamedTuple):
  """State of :func:`periodic`: the local transform's and the synchronisation's."""

  local: Any
  sync: Any


def periodic(local, sync: Synchronisation) -> WorkerTransform:
  """Local steps of ``local``; at the end of a period (``ctx.period_end``, static: the trainer
  compiles one program for local steps and one for synchronising steps, so local steps
  dispatch no collective) the local step is followed by ``sync``."""
  local = as_worker_transform(local)

  def init(params):
    return PeriodicState(local.init(params), sync.init(params))

  def update(grads, state, params, ctx):
    updates, local_state, report = local.update(grads, state.local, params, ctx)
    if not ctx.period_end:
      return updates, state._replace(local=local_state), report
    x = optax.apply_updates(params, updates)
    x, local_state, sync_state, more = sync.apply(x, local_state, state.sync, ctx)
    return (replace_params(params, x), PeriodicState(local_state, sync_state),
            merge_reports(report, more))

  return WorkerTransform(init, update, local.communications + tuple(sync.communications))


def _floats(tree) -> list:
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]


def _replace_floats(tree, new: list):
  it = iter(new)
  return jax.tree.map(lambda x: next(it) if jnp.issubdtype(x.dtype, jnp.inexact) else x, tree)


def average_models(reducer: WorkerTransform, opt_state: str = "keep",
                   local_init: Optional[Callable] = None,
                   opt_reducer: Optional[WorkerTransform] = None) -> Synchronisation:
  """Local SGD's synchronisation (Haddadpour et al. 2019, Algorithm 1): the models are
  replaced by ``reducer`` of them (a mean, one gossip round, or a compressed mean
  :func:`via_anchor`).

  Args:
    reducer: the model reducer.
    opt_state: what happens to the local optimizer state: ``"keep"`` (local momentum buffers
      stay), ``"average"`` (its floating-point leaves go through ``opt_reducer``, default
      ``reducer``) or ``"reset"`` (``local_init`` of the synchronised models).
    local_init: the local transform's ``init`` (for ``"reset"``).
    opt_reducer: the reducer of the optimizer state (``"average"``).

  Raises:
    ValueError: unknown ``opt_state`` or ``"reset"`` without ``local_init``.
  """
  if opt_state not in OPT_STATE_SYNCS:
    raise ValueError(f"local_sgd.opt_state={opt_state!r} is not allowed: use one of "
                     f"{list(OPT_STATE_SYNCS)}")
  if opt_state == "reset" and local_init is None:
    raise ValueError("average_models(opt_state='reset') needs local_init")
  opt_reducer = opt_reducer or reducer
  comms = reducer.communications + (opt_reducer.communications if opt_state == "average"
                                    else ())

  def init(params):
    return reducer.init(params)

  def apply(x, local_state, state, ctx):
    x, state, report = reducer.update(x, state, None, ctx)
    if opt_state == "average" and _floats(local_state):
      mixed, _, more = opt_reducer.update(_floats(local_state), (), None, ctx)
      local_state = _replace_floats(local_state, mixed)
      report = merge_reports(report, more)
    elif opt_state == "reset":
      local_state = local_init(x)
    return x, local_state, state, report

  return Synchronisation(init, apply, tuple(dict.fromkeys(comms)))


class OuterState(NamedTuple):
  """State of :func:`outer_step`: ``anchor`` = ``x_outer`` (the same on every worker), the
  outer optimizer's state and the pseudo-gradient reducer's state."""

  anchor: Any
  outer: Any
  reducer: Any


def outer_step(reducer: WorkerTransform, outer: optax.GradientTransformation) -> Synchronisation:
  """DiLoCo's synchronisation (Douillard et al. 2023, Algorithm 1): the pseudo-gradient
  ``Delta = x_outer - R(x_i)`` where ``R`` averages ``x_outer - x_i`` over the workers
  (``reducer``: a mean or a compressed mean), ``x_outer <- x_outer + outer.update(Delta)``,
  and every worker restarts from ``x_outer``. With outer lr 1 and no momentum this is the
  model average."""

  def init(params):
    return OuterState(params, outer.init(params), reducer.init(params))

  def apply(x, local_state, state, ctx):
    delta = jax.tree.map(lambda a, b: a - b, state.anchor, x)
    delta, red, report = reducer.update(delta, state.reducer, None, ctx)
    updates, outer_state = outer.update(delta, state.outer, state.anchor)
    anchor = optax.apply_updates(state.anchor, updates)
    return anchor, local_state, OuterState(anchor, outer_state, red), report

  return Synchronisation(init, apply, reducer.communications)


class NoLoCoState(NamedTuple):
  """State of :func:`group_outer_step`: the worker's own slow weights and outer momentum."""

  slow: Any
  momentum: Any


def group_outer_step(groups, outer_lr, outer_momentum) -> Synchronisation:
  """NoLoCo's synchronisation (arXiv 2506.10911; jkolehm/noloco ``sparse_optimizer_c.py``,
  ``outer_step``, commit 37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08): with ``mean_G`` the mean
  of the fast weights over the worker's random group (``groups``: a
  :class:`~nbsgd_jax.communications.groups.RandomGroups`), ``m <- beta m + alpha (mean_G -
  slow)``, ``slow <- slow + m``, and the worker restarts from ``slow`` (``alpha`` =
  ``outer_lr``, ``beta`` = ``outer_momentum``, either traced). One group of all workers is
  DiLoCo with heavy-ball outer momentum (outer lr alpha, momentum beta)."""

  def init(params):
    return NoLoCoState(params, jax.tree.map(jnp.zeros_like, params))

  def apply(x, local_state, state, ctx):
    mean, report = groups.group_mean(x, ctx)
    m = jax.tree.map(lambda m, a, s: outer_momentum * m + outer_lr * (a - s),
                     state.momentum, mean, state.slow)
    slow = jax.tree.map(lambda s, d: s + d, state.slow, m)
    return slow, local_state, NoLoCoState(slow, m), report

  return Synchronisation(init, apply, (groups,))


OVERLAPS = ("none", "delayed", "eager")  # config.diloco.overlap: overlapped_outer_step


class OverlapState(NamedTuple):
  """State of :func:`overlapped_outer_step`: the worker's ``anchor`` (x_outer), the outer
  optimizer's and the reducer's states, the mean pseudo-gradient in flight (``pending``, with
  ``landed``: False until the first one), and the worker's own last pseudo-gradient
  (``own``, for eager updates)."""

  anchor: Any
  outer: Any
  reducer: Any
  pending: Any
  own: Any
  landed: Any


def overlapped_outer_step(reducer: WorkerTransform, outer: optax.GradientTransformation,
                          period: int, eager: bool = False) -> Synchronisation:
  """DiLoCo whose outer all-reduce overlaps the next ``period`` inner steps, the outer step
  one outer step late (PrimeIntellect-ai/pccl ``python/examples/nanogpt_diloco/
  async_diloco.py``, commit 7815195c4fe29f9dd4448f67afe8f48e93393428; Kale, Douillard et
  al., "Eager Updates For Overlapped Communication and Computation in DiLoCo", arXiv
  2502.12996, Algorithms 2 and 3). At a period end each worker sends ``Delta_i = anchor -
  x_i`` (``reducer``: its mean lands a period later, the communications :meth:`deferred` by
  ``period`` steps for the clock) and steps its anchor with the outer optimizer on

  * ``eager=False``: the mean that landed, ``Delta(t - H)`` (nothing at the first period
    end), every worker alike;
  * ``eager=True``: ``Delta(t - H) + w_i (Delta_i(t) - Delta_i(t - H))`` (``w_i`` this
    worker's weight in the mean, 1/n): its own fresh share in place of its stale one, so the
    anchors differ between workers.

  Every worker restarts from its anchor.
  """

  def init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return OverlapState(params, outer.init(params), reducer.init(params), zeros, zeros,
                        jnp.asarray(False))

  def apply(x, local_state, state, ctx):
    delta = jax.tree.map(lambda a, b: a - b, state.anchor, x)
    mean, red, report = reducer.update(delta, state.reducer, None, ctx)
    grad = state.pending
    if eager:
      comm = reducer.communications[0]
      w = comm.weight(ctx, "alive")
      w = 1.0 / collectives.axis_size(comm.axis_name) if w is None else w
      grad = jax.tree.map(lambda p, d, o: p + w * (d - o), state.pending, delta, state.own)
    updates, outer_state = outer.update(grad, state.outer, state.anchor)
    stepped = optax.apply_updates(state.anchor, updates)
    on = state.landed | eager  # delayed: no outer step before the first mean lands
    anchor = jax.tree.map(lambda a, b: jnp.where(on, a, b), stepped, state.anchor)
    outer_state = jax.tree.map(lambda a, b: jnp.where(on, a, b), outer_state, state.outer)
    return anchor, local_state, OverlapState(anchor, outer_state, red, mean, delta,
                                             jnp.asarray(True)), report

  comms = tuple(c.deferred(period) for c in reducer.communications if c is not None)
  return Synchronisation(init, apply, comms)


def fragment_leaves(num_leaves: int, fragments: int) -> list[list[int]]:
  """Streaming DiLoCo's fragments: the model's leaves (``jax.tree.leaves`` order) in
  ``fragments`` contiguous groups of nearly equal count (``numpy.array_split``).

  Raises:
    ValueError: more fragments than leaves.
  """
  if not 1 <= fragments <= num_leaves:
    raise ValueError(f"streaming_diloco.fragments={fragments} is not allowed: the model has "
                     f"{num_leaves} parameter arrays and a fragment is a contiguous group of "
                     f"them (1 to {num_leaves} fragments)")
  return [list(map(int, g)) for g in np.array_split(np.arange(num_leaves), fragments)]


class FragmentState(NamedTuple):
  """State of one Streaming DiLoCo fragment: :class:`OuterState`'s fields for the fragment's
  leaves and ``pending``, the reduced pseudo-gradient of an all-reduce launched and not yet
  landed (overlap)."""

  anchor: Any
  outer: Any
  reducer: Any
  pending: Any


def streaming_outer_step(reducer: WorkerTransform, outer: optax.GradientTransformation,
                         fragments: int, delay: int = 0, alpha: float = 0.0) -> Synchronisation:
  """Streaming DiLoCo's synchronisation (Douillard et al. 2025, arXiv 2501.18512, Sec. 2.2-2.3).

  ``ctx.period_end`` is a static :class:`~nbsgd_jax.host.periods.FragmentSync` for fragment
  ``p`` (:func:`fragment_leaves`; the host's :class:`~nbsgd_jax.host.periods.FragmentPlanner`):

  * ``launch``: ``Delta_p = anchor_p - R(x_i[p])`` by ``reducer`` (a mean or a compressed
    mean with error feedback), kept as ``pending``;
  * ``land`` (``delay`` = tau steps later, the all-reduce having run behind tau inner steps):
    ``anchor_p <- anchor_p + outer.update(Delta_p)`` (per-fragment outer state) and the
    workers merge ``x_i[p] <- alpha x_i[p] + (1 - alpha) anchor_p`` (mixing factor alpha:
    0 takes the global fragment, as pytorch/torchft's ``fragment_update_alpha``).

  The other fragments keep training. With one fragment, tau = 0 and alpha = 0 it is
  :func:`outer_step`. The communications are :meth:`deferred` by tau steps for the clock.

  Raises:
    ValueError: ``delay`` < 0 or ``alpha`` outside [0, 1].
  """
  if delay < 0 or not 0.0 <= alpha <= 1.0:
    raise ValueError(f"streaming_outer_step(delay={delay}, alpha={alpha}) is not allowed: "
                     "delay >= 0 and 0 <= alpha <= 1")

  def split(tree):
    leaves = jax.tree.leaves(tree)
    return [[leaves[i] for i in g] for g in fragment_leaves(len(leaves), fragments)]

  def init(params):
    return tuple(FragmentState(f, outer.init(f), reducer.init(f), jax.tree.map(jnp.zeros_like, f))
                 for f in split(params))

  def apply(x, local_state, state, ctx):
    event = ctx.period_end
    leaves, treedef = jax.tree.flatten(x)
    group = fragment_leaves(len(leaves), fragments)[event.fragment]
    mine, report = FragmentState(*state[event.fragment]), {}
    if event.launch:
      delta = [mine.anchor[j] - leaves[i] for j, i in enumerate(group)]
      pending, red, report = reducer.update(delta, mine.reducer, None, ctx)
      mine = mine._replace(reducer=red, pending=pending)
    if event.land:
      updates, outer_state = outer.update(mine.pending, mine.outer, mine.anchor)
      anchor = optax.apply_updates(mine.anchor, updates)
      for j, i in enumerate(group):
        leaves[i] = anchor[j] if alpha == 0 else alpha * leaves[i] + (1 - alpha) * anchor[j]
      mine = mine._replace(anchor=anchor, outer=outer_state)
    new_state = tuple(mine if k == event.fragment else s for k, s in enumerate(state))
    return jax.tree.unflatten(treedef, leaves), local_state, new_state, report

  comms = tuple(c.deferred(delay) for c in reducer.communications)
  return Synchronisation(init, apply, comms)
