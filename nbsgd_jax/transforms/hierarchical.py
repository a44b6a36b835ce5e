"""HALoS's device half (Kim et al., "HALoS: Hierarchical Asynchronous Local SGD over Slow
Networks for Geo-Distributed LLM Training", ICML 2025, arXiv 2506.04531, Algorithm 1;
utnslab/halos ``src/halos/simulation/exec_halos.py``, ``src/halos/ps.py``, ``src/halos/opt.py``,
commit 4b5bf73768c1e039bd1f64c3a310025119f05e20): workers in L regions, a local parameter
server (LPS) per region and one global one (GPS), on the event clock
(:class:`~nbsgd_jax.host.regional_servers.RegionalServerTimes` draws the masks).

Every worker holds a replica of its region's LPS and of the GPS (the program stays one SPMD
program; a message reaches every replica by one sum over the worker axis in which one
worker's term is non-zero). A device step applies, in this order:

1. the servers' messages that landed before the step's push (``Events.slot_kind`` /
   ``slot_region``, in time order): the GPS receiving region l's update steps with the
   delayed Nesterov optimizer on it and region l keeps the GPS model it sends back
   (``inbox``); region l's LPS receiving that model merges ``x <- (1 - alpha) x + alpha
   x_g`` and restarts its update's base (``merged <- x``);
2. the batch's inner steps (``fire`` and not ``pull``);
3. the push, if any (at most one a step): the worker's ``start - end`` reaches its LPS,
   which steps with the delayed Nesterov optimizer; when this push completes K since the
   LPS's last merge (``Events.send``, counted by the host) the LPS sends ``merged - x``
   (``outbox``); the pusher reads the LPS's model (its next round's start).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from nbsgd_jax.transforms.asynchronous import delayed_nesterov
from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params, tree_where)


class Optimizer(NamedTuple):
  """A server's delayed Nesterov optimizer: lr, momentum beta, buffer N, activation c."""

  lr: Any
  beta: Any
  buffer: int
  activation: Any = 0.0


class DNState(NamedTuple):
  """A server: its model ``x``, momentum ``m``, pushes buffered ``pushed`` (D), count ``t``."""

  x: Any
  m: Any
  pushed: Any
  t: Any


class HalosState(NamedTuple):
  """A worker's state in HALoS.

  Attributes:
    anchor: the LPS model the worker read last (its round's start).
    inner: the inner optimizer's state (kept across rounds, as the reference's worker).
    lps: the worker's region's LPS (:class:`DNState`).
    merged: the LPS's model right after its last merge (its next update's base).
    outbox: the LPS's update in flight to the GPS (``merged - x`` at the send).
    inbox: the GPS model in flight to the region's LPS.
    gps: the GPS (:class:`DNState`).
  """

  anchor: Any
  inner: Any
  lps: DNState
  merged: Any
  outbox: Any
  inbox: Any
  gps: DNState


def _dn(state: DNState, g, opt: Optimizer, on) -> DNState:
  x, m, d, t = delayed_nesterov(state.x, state.m, state.pushed, state.t, g, opt.lr, opt.beta,
                                opt.buffer, opt.activation)
  return tree_where(on, DNState(x, m, d, t), state)


def _dn_init(params) -> DNState:
  return DNState(params, jax.tree.map(jnp.zeros_like, params),
                 jax.tree.map(jnp.zeros_like, params), jnp.int32(0))


def regional_servers(inner, server, regions: int, lps: Optimizer, gps: Optimizer,
                     merge_weight) -> WorkerTransform:
  """HALoS on the event clock (module docstring).

  Args:
    inner: the inner optimizer (kept across rounds).
    server: a :class:`~nbsgd_jax.communications.server.ParameterServer` over the n workers
      (pushes, pulls and the servers' messages; its bytes).
    regions: L; region l holds workers ``[l n / L, (l + 1) n / L)`` (its LPS sits with the
      first of them, the GPS with worker 0).
    lps, gps: the servers' :class:`Optimizer` s.
    merge_weight: alpha, the global model's weight in an LPS's merge (traced is fine).

  Returns:
    A :class:`~nbsgd_jax.transforms.WorkerTransform` with state :class:`HalosState`; it reads
    ``ctx.events`` ``fire``, ``pull``, ``push``, ``send``, ``slot_kind``, ``slot_region``.

  Raises:
    ValueError: n not a multiple of ``regions`` (named).
  """
  if regions < 1 or server.n % regions:
    raise ValueError(f"halos.regions={regions} is not allowed with num_workers={server.n}: "
                     "the regions hold equal contiguous groups of workers (a divisor of n)")
  inner, per = as_worker_transform(inner), server.n // regions

  def init(params):
    zero = jax.tree.map(jnp.zeros_like, params)
    return HalosState(params, inner.init(params), _dn_init(params), params, zero, zero,
                      _dn_init(params))

  def from_region(tree, l):
    """Region l's replica (its first worker's) on every worker."""
    mine = server.index() == l * per
    return lax.psum(jax.tree.map(lambda a: jnp.where(mine, a, jnp.zeros_like(a)), tree),
                    server.axis_name)

  def messages(state, ev, region):
    sent = jnp.float32(0.0)
    for s in range(ev.slot_kind.shape[-1]):
      kind, l = ev.slot_kind[s], ev.slot_region[s]
      gps_recv, lps_recv = kind == 1, (kind == 2) & (region == l)
      g = _dn(state.gps, from_region(state.outbox, l), gps, gps_recv)
      inbox = tree_where(gps_recv & (region == l), g.x, state.inbox)
      x = jax.tree.map(lambda a, b: (1 - merge_weight) * a + merge_weight * b, state.lps.x,
                       inbox)
      lps_new = state.lps._replace(x=tree_where(lps_recv, x, state.lps.x))
      state = state._replace(gps=g, inbox=inbox, lps=lps_new,
                             merged=tree_where(lps_recv, x, state.merged))
      sent = sent + jnp.where(gps_recv & (server.index() == 0), 1.0, 0.0)
    return state, sent

  def update(grads, state, params, ctx):
    ev = ctx.events
    region = server.index() // per
    state, replies = messages(state, ev, region)
    push, step = ev.fire & ev.push, ev.fire & ~ev.pull
    u, new_inner, report = inner.update(grads, state.inner, params, ctx)
    x = tree_where(step, jax.tree.map(lambda p, d: p + d, params, u), params)
    inner_state = tree_where(step, new_inner, state.inner)
    delta = jax.tree.map(lambda a, b: a - b, state.anchor, x)
    g, any_push, comm = server.push(delta, push, ev.fire & ev.pull, ctx)
    at = lax.psum(jnp.where(push, region, 0), server.axis_name)
    lps_new = _dn(state.lps, g, lps, any_push & (region == at))
    sending = (lax.psum(jnp.where(push & ev.send, 1, 0), server.axis_name) > 0) & (region == at)
    outbox = tree_where(sending, jax.tree.map(lambda a, b: a - b, state.merged, lps_new.x),
                        state.outbox)
    x = tree_where(push, lps_new.x, x)
    anchor = tree_where(push, lps_new.x, state.anchor)
    extra = (replies + jnp.where(sending & (server.index() == at * per), 1.0, 0.0)) * (
        server.message_bytes(params))
    comm = {k: (v + server.charge(extra, ctx) if k.startswith("bytes") else v)
            for k, v in comm.items()}
    state = HalosState(anchor, inner_state, lps_new, state.merged, outbox, state.inbox,
                       state.gps)
    return replace_params(params, x), state, merge_reports(comm, report)

  return WorkerTransform(init, update, (server,) + inner.communications)


def global_models(opt_state, params):
  """The GPS's replicas ``[n, ...]`` held in a stacked :class:`HalosState` (``Recipe.
  evaluated`` of HALoS: its records evaluate the global model).

  Raises:
    ValueError: the state holds no or several :class:`HalosState`.
  """
  del params
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=lambda z: isinstance(z, HalosState))
           if isinstance(x, HalosState)]
  if len(found) != 1:
    raise ValueError(f"the optimizer state holds {len(found)} HalosState, not one")
  return found[0].gps.x


__all__ = ["DNState", "HalosState", "Optimizer", "global_models", "regional_servers"]
