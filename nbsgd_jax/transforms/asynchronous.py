"""The device side of asynchronous training on the event clock (:mod:`nbsgd_jax.host.events`).

A device step applies one batch of events. Its per-worker masks (``ctx.events``, an
:class:`Events` drawn on the host by :class:`nbsgd_jax.host.events.EventTimes`):

* ``start``: bool, the worker started a new computation since the last step (its event was in
  the last batch; every worker at step 0). Its read of the model is its current parameters,
  which no event changed since (a batch's events touch no worker twice), so the gradient the
  trainer computes at the current parameters *is* the gradient of its read: it is held, in
  flight, until the worker's next event;
* ``fire``: bool, the worker's own event is in this batch: it applies its in-flight gradient,
  computed on a read that other workers' events may have changed since (the staleness);
* ``peer``: int32, the worker its event averages with (itself: none); a worker touched by a
  peer's event averages too, without firing;
* ``apply``: bool, the events that apply the in-flight gradient (``fire``, except in the
  released AD-PSGD's gossip loop, :class:`nbsgd_jax.host.async_orders.GossipLoopTimes`).

:func:`pairwise_events` is AD-PSGD's and SwarmSGD's device half; :func:`server_rounds`
asynchronous DiLoCo's, whose events are pulls, inner steps and pushes (masks ``pull``,
``push``, ``read`` and the host's ``staleness``); no other worker's event changes a worker's
model while it computes, so its gradient is the current parameters' and nothing is held in
flight.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params, tree_where)
from nbsgd_jax.transforms.wrappers import OuterState, OverlapState


class Events(NamedTuple):
  """One device step's per-worker event masks (``StepContext.events``; on the host
  ``HostInputs.events``, each field an array ``[n]``, worker i reading row i), written by the
  recipe's event clock (module docstring). A field the family does not use is None (a
  different structure compiles its own program; the values never do).

  Attributes:
    fire: bool, the worker's own event is in this batch.
    start: bool, the worker started a new computation since the last step (pairwise).
    peer: int32, the worker its event averages with, itself for none (pairwise).
    apply: bool, the events that apply the in-flight gradient (pairwise).
    pull: bool, the worker's event is a pull of the server's model (server).
    push: bool, the worker's event pushes its pseudo-gradient (server).
    read: bool, the worker reads the server's model after this step's push (server).
    staleness: int32, server updates since the worker's read (server).
    send: bool, the worker's push completes its regional server's K pushes: the server sends
      its update to the global one (HALoS).
    slot_kind: int32 ``[S]``, the servers' messages that land before this step's push, in
      time order: 0 none, 1 the global server receives a region's update, 2 a regional
      server receives the global model (HALoS; the same on every worker).
    slot_region: int32 ``[S]``, each slot's region (HALoS).
    sample: int32, the index of the data draw of the gradient the worker computes in this
      step: the gradients it applied before (its own gradient count, the clock's
      ``computed``), so that a worker's k-th gradient reads the batch (and augmentation key)
      of the lockstep clock's step k whichever clock and algorithm run it (common random
      numbers, ``docs/algorithms.md``, "The event clock"); None: the device step's number.
    compute: bool, the worker's gradient of this step is used (its computation starts:
      ``start``; asynchronous DiLoCo's and HALoS's inner steps: ``fire & ~pull``): with
      ``config.gather_gradients`` only these workers' gradients are computed
      (:mod:`nbsgd_jax.run.gathered`); None: every worker's.
  """

  fire: Any
  start: Any = None
  peer: Any = None
  apply: Any = None
  pull: Any = None
  push: Any = None
  read: Any = None
  staleness: Any = None
  send: Any = None
  slot_kind: Any = None
  slot_region: Any = None
  sample: Any = None
  compute: Any = None


class InFlightState(NamedTuple):
  """A worker's state between its read and its event.

  Attributes:
    grads: the gradient computed on the worker's last read, waiting for its event (the
      parameters' shapes).
    inner: the local optimizer's state (advanced only at the worker's own events).
  """

  grads: Any
  inner: Any


class PublishedState(NamedTuple):
  """:class:`InFlightState` with the copy a worker publishes (one-sided averaging).

  Attributes:
    grads, inner: as :class:`InFlightState`.
    published: the worker's model after its last local step, before its own average (x_0
      before its first): what a worker that draws it reads.
  """

  grads: Any
  inner: Any
  published: Any


ORDERS = ("average_first", "gradient_first")
AVERAGING = ("symmetric", "one_sided")


def pairwise_events(inner, pairwise, order: str = "average_first",
                    averaging: str = "symmetric") -> WorkerTransform:
  """A batch of events that each apply a worker's in-flight gradient and may average it with
  a peer (module docstring): the device half of AD-PSGD and SwarmSGD.

  ``order="average_first"`` (AD-PSGD, Lian, Zhang, Zhang, Liu, ICML 2018, Algorithm 1): at
  worker i's event, average with the peer, ``x_i, x_j <- (x_i + x_j) / 2`` (line 3), then
  apply the gradient computed on the stale read, ``x_i <- x_i - gamma g(x_hat_i)`` (line 4;
  ``inner`` is the local optimizer, e.g. SGD with momentum and weight decay as the reference's
  gossip process applies it, facebookresearch/stochastic_gradient_push ``gossip/ad_psgd.py``,
  commit ac9af237e195c812ebad08fc4697e3de1fa96ff8). ``"gradient_first"`` (SwarmSGD, Nadiradze
  et al., NeurIPS 2021, Sec. 3: local SGD steps, and after the last of them an average with a
  neighbour drawn uniformly; the released AD-PSGD's gossip loop, the same repository at
  e682064, ``_gossip_target``): the local step first, then the average. A worker touched by a
  peer's event averages without stepping. The worker's next read is its model after the
  event.

  ``averaging="symmetric"`` (both papers): both workers of a pair take the average.
  ``"one_sided"`` (SwarmSGD as ICLR-PopSGD/PopSGD releases it, ``worker.py``, commit 4f0c6f0):
  a worker publishes its model after each local step, before its average; the initiator sets
  ``x_i <- (x_i + p_j) / 2`` with the peer's published copy ``p_j`` and the peer is unchanged
  (only with ``"gradient_first"``).

  Args:
    inner: the local optimizer (a worker transform or an optax transformation): gradient in,
      parameter change out.
    pairwise: a :class:`~nbsgd_jax.communications.pairwise.PairwiseAverage`.
    order: one of :data:`ORDERS`.
    averaging: one of :data:`AVERAGING`.
  Returns:
    A :class:`~nbsgd_jax.transforms.WorkerTransform` with state :class:`InFlightState`
    (:class:`PublishedState` one-sided); it reads ``ctx.events`` (:class:`Events`) ``start``,
    ``fire``, ``peer`` and ``apply``, which the recipe's event clock writes.

  Raises:
    ValueError: an unknown ``order`` or ``averaging``, or one-sided averaging first.
  """
  if order not in ORDERS:
    raise ValueError(f"order={order!r} is not allowed: use one of {list(ORDERS)}")
  if averaging not in AVERAGING:
    raise ValueError(f"averaging={averaging!r} is not allowed: use one of {list(AVERAGING)}")
  one_sided = averaging == "one_sided"
  if one_sided and order != "gradient_first":
    raise ValueError("averaging='one_sided' is not allowed with order='average_first': a "
                     "worker publishes its model after its local step")
  inner = as_worker_transform(inner)

  def init(params):
    zero = jax.tree.map(jnp.zeros_like, params)
    if one_sided:
      return PublishedState(zero, inner.init(params), params)
    return InFlightState(zero, inner.init(params))

  def local_step(held, state, params, ctx):
    step, new_inner, report = inner.update(held, state.inner, params, ctx)
    due = ctx.events.apply
    moved = tree_where(due, jax.tree.map(lambda p, u: p + u, params, step), params)
    return moved, tree_where(due, new_inner, state.inner), report

  def update(grads, state, params, ctx):
    events = ctx.events
    held = tree_where(events.start, grads, state.grads)
    if order == "average_first":
      x, report = pairwise.average(params, events.peer, ctx)
      x, new_inner, inner_report = local_step(held, state, x, ctx)
    else:
      x, new_inner, inner_report = local_step(held, state, params, ctx)
      if one_sided:
        published = tree_where(events.apply, x, state.published)
        x, report = pairwise.read(x, published, events.peer, events.fire, ctx)
        state = PublishedState(held, new_inner, published)
        return replace_params(params, x), state, merge_reports(report, inner_report)
      x, report = pairwise.average(x, events.peer, ctx)
    state = InFlightState(held, new_inner)
    return replace_params(params, x), state, merge_reports(report, inner_report)

  return WorkerTransform(init, update, (pairwise,) + inner.communications)


class ServerState(NamedTuple):
  """A worker's state in asynchronous DiLoCo (:func:`server_rounds`).

  Attributes:
    anchor: the server model the worker read last (its round's start).
    inner: the inner optimizer's state.
    server: the server's model (a replica, the same on every worker).
    momentum: the outer momentum m.
    pushed: the pseudo-gradients pushed since the last momentum update (Delta).
    pushes: int32, pushes applied so far (t).
  """

  anchor: Any
  inner: Any
  server: Any
  momentum: Any
  pushed: Any
  pushes: Any


WEIGHTS = ("none", "constant", "polynomial")


def staleness_weight(rule: str, staleness, n: int):
  """A push's weight (google-deepmind/asyncdiloco's toy notebook, ``get_sync_weight``):
  ``"none"`` 1, ``"constant"`` sqrt(n) / n, ``"polynomial"`` sqrt(n) / n / sqrt(1 +
  staleness), staleness in server updates since the worker's pull.

  Raises:
    ValueError: an unknown rule (named).
  """
  if rule not in WEIGHTS:
    raise ValueError(f"async_diloco.staleness_weight={rule!r} is not allowed: use one of "
                     f"{list(WEIGHTS)}")
  if rule == "none":
    return jnp.float32(1.0)
  base = jnp.float32(np.sqrt(n) / n)
  if rule == "constant":
    return base
  return base / jnp.sqrt(1.0 + staleness.astype(jnp.float32))


def outer_models(opt_state, params):
  """The outer model's replicas ``[n, ...]`` (the same on every worker) held in a stacked
  state: asynchronous DiLoCo's server model (:class:`ServerState` ``.server``) or DiLoCo's
  x_outer (:class:`~nbsgd_jax.transforms.wrappers.OuterState` or ``OverlapState`` ``.anchor``, the model its last
  outer step made, which every worker restarted from). ``Recipe.evaluated`` of both, so that
  their records evaluate the same kind of model (``docs/algorithms.md``, ``async_diloco``).

  Raises:
    ValueError: the state holds no or several of them.
  """
  del params
  kinds = (ServerState, OuterState, OverlapState)
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=lambda z: isinstance(z, kinds))
           if isinstance(x, kinds)]
  if len(found) != 1:
    raise ValueError(f"the optimizer state holds {len(found)} ServerState, OuterState or "
                     "OverlapState, not one")
  return found[0].server if isinstance(found[0], ServerState) else found[0].anchor


def delayed_nesterov(x, momentum, pushed, t, g, lr, beta, buffer: int, activation=0.0):
  """One step of the delayed Nesterov optimizer on the pushed ``g`` (utnslab/halos
  ``src/halos/opt.py``, ``DelayedNesterovOptimizer.step``, commit 4b5bf73; Kim et al., ICML
  2025, arXiv 2506.04531): ``D += g``; when ``(t + 1) % N == 0``: ``m <- beta m + D / N``,
  ``x <- x - lr ((1 - cN + c) beta m + g / N)``, ``D <- 0``; else ``x <- x - lr (c beta m +
  g / N)``.

  Args:
    x, momentum, pushed: the model, m and D (trees of one structure).
    t: int32 scalar, pushes applied so far.
    g: the pushed tree.
    lr, beta, activation: lr, beta and c (traced values are fine).
    buffer: N >= 1.

  Returns:
    ``(x, m, D, t + 1)``.
  """
  pushed = jax.tree.map(lambda d, u: d + u, pushed, g)
  boundary = (t + 1) % buffer == 0
  m_new = jax.tree.map(lambda m, d: jnp.where(boundary, beta * m + d / buffer, m),
                       momentum, pushed)
  scale = jnp.where(boundary, (1 - activation * buffer + activation) * beta, activation * beta)
  x = jax.tree.map(lambda p, m, u: p - lr * (scale * m + u / buffer), x, m_new, g)
  clear = jax.tree.map(lambda d: jnp.where(boundary, jnp.zeros_like(d), d), pushed)
  return x, m_new, clear, t + 1


def server_rounds(inner, server, lr, beta, buffer: int, activation: float = 0.0,
                  weight: str = "none", reset_inner: bool = True) -> WorkerTransform:
  """Asynchronous DiLoCo (Liu, Douillard et al. 2024, arXiv 2401.09135) on the event clock:
  a worker pulls the server's model, runs its inner steps (one event each), and with its last
  one pushes its pseudo-gradient ``Delta_i = anchor_i - x_i``, which the server applies at
  once with the delayed Nesterov step (utnslab/halos ``src/halos/opt.py``,
  ``DelayedNesterovOptimizer``, commit 4b5bf73; the t-th push g, buffer N, activation c):
  ``D += g``; every N-th push ``m <- beta m + D / N``, ``x <- x - lr ((1 - cN + c) beta m +
  g / N)``, ``D <- 0``; between, ``x <- x - lr (c beta m + g / N)``. N = 1, c = 0 is Nesterov
  SGD on each push; N = n with equal speeds is DiLoCo's outer step on the mean (the n
  displacements add up to it, ``tests/algorithms/test_async_diloco.py``).

  Reads ``ctx.events`` (:class:`Events`): ``fire`` (the worker's event), ``pull``, ``push``
  (its kind), ``read`` (the worker reads the server's model as it is after this step's push, if any: its
  model and anchor become it, and with ``reset_inner`` its inner optimizer restarts; the host
  says when, :class:`~nbsgd_jax.host.events.ServerEventTimes` ``pull``) and ``staleness``
  (server updates since its read, for the weight).

  Args:
    inner: the inner optimizer.
    server: a :class:`~nbsgd_jax.communications.server.ParameterServer`.
    lr, beta: the outer learning rate and momentum (traced values are fine).
    buffer: N >= 1.
    activation: c.
    weight: the staleness rule of :func:`staleness_weight` (on each push).
    reset_inner: a pull starts a fresh inner optimizer (the notebook's ``inner_loop``);
      False keeps it, as the package's synchronous DiLoCo does.
  """
  inner = as_worker_transform(inner)

  def init(params):
    zero = jax.tree.map(jnp.zeros_like, params)
    return ServerState(params, inner.init(params), params, zero, zero, jnp.int32(0))

  def outer(state, g, any_push):
    srv, m_new, clear, t = delayed_nesterov(state.server, state.momentum, state.pushed,
                                            state.pushes, g, lr, beta, buffer, activation)
    return (tree_where(any_push, srv, state.server), tree_where(any_push, m_new, state.momentum),
            tree_where(any_push, clear, state.pushed), jnp.where(any_push, t, state.pushes))

  def update(grads, state, params, ctx):
    ev = ctx.events
    pull, push, step = ev.fire & ev.pull, ev.fire & ev.push, ev.fire & ~ev.pull
    read = ev.read
    u, new_inner, report = inner.update(grads, state.inner, params, ctx)
    x = tree_where(step, jax.tree.map(lambda p, d: p + d, params, u), params)
    inner_state = tree_where(step, new_inner, state.inner)
    w = staleness_weight(weight, ev.staleness, server.n)
    delta = jax.tree.map(lambda a, b: w * (a - b), state.anchor, x)
    g, any_push, comm = server.push(delta, push, pull, ctx)
    srv, m, pushed, pushes = outer(state, g, any_push)
    x = tree_where(read, srv, x)
    anchor = tree_where(read, srv, state.anchor)
    if reset_inner:
      inner_state = tree_where(read, inner.init(srv), inner_state)
    state = ServerState(anchor, inner_state, srv, m, pushed, pushes)
    return replace_params(params, x), state, merge_reports(comm, report)

  return WorkerTransform(init, update, (server,) + inner.communications)


__all__ = ["AVERAGING", "Events", "delayed_nesterov", "InFlightState", "ORDERS", "PublishedState", "ServerState",
           "WEIGHTS", "outer_models", "pairwise_events", "server_rounds", "staleness_weight"]
