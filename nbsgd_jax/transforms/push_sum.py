"""Stochastic Gradient Push (Assran, Loizou, Ballas, Rabbat, ICML 2019): SGD on push-sum
numerators over a column-stochastic, possibly directed and time-varying mixing P, and its
overlapping form (Overlap-SGP).

Each worker holds a numerator ``x_i`` and a push-sum weight ``w_i`` (1 at the start); its
model, the one the gradient is computed at and the one evaluated, is the de-biased
``z_i = x_i / w_i`` (the worker's parameters). The reference code is
facebookresearch/stochastic_gradient_push ``gossip/distributed.py`` (``GossipDataParallel``
with ``push_sum=True``: forward pre-hook = query the gossip queue, absorb the received
residuals and, with ``overlap``, transfer the parameters; backward hook = back to numerators;
``optimizer.step()`` on the numerators) and ``gossip/gossiper.py`` (``PushSum.mix``), commit
e682064 (``git log`` of the fetched repository).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params, tree_where)


class PushSumState(NamedTuple):
  """A worker's push-sum state.

  Attributes:
    x: the numerator (the parameters' shapes).
    w: float32 scalar, the push-sum weight.
    inbox: ``(x, w)`` received in the round in flight, added when the round lands (Overlap-SGP
      with ``synch_freq > 0``; zeros otherwise).
    inner: the local optimizer's state (on the numerator, as the reference's optimizer).
  """

  x: Any
  w: Any
  inbox: Any
  inner: Any


def _scale(tree, s):
  return jax.tree.map(lambda a: a * s.astype(a.dtype), tree)


def _add(a, b):
  return jax.tree.map(lambda u, v: u + v, a, b)


def stochastic_gradient_push(inner, gossip, overlap: bool = False,
                             synch_freq: int = 0) -> WorkerTransform:
  """SGP, Assran et al. 2019, Algorithm 1 (``overlap=False``): at step k,
  ``x_i <- x_i + u_i(g(z_i))`` (the local optimizer's step on the numerator), then
  ``(x, w) <- P_k (x, w)`` (``gossip``'s ``W_k``: worker i keeps ``W_k[i, i]`` of its own and
  adds ``W_k[i, j]`` of each neighbour's), ``z = x / w``.

  ``overlap=True`` (Overlap-SGP, the reference's ``overlap=True``, ``synch_freq`` = s): a
  round is sent at the start of a step, before its gradient (the worker keeps ``W[i, i]`` of
  ``(x, w)`` and sends the rest), and its messages are added when the worker must wait for
  them; a worker sends a new round only when the last one landed. This is the reference's
  forward pre-hook (``gossip/distributed.py`` ``__make_forward_pre_hook``, lines 574-584 at
  e682064) in the limit of slow communication, where a non-blocking query never finds the
  round arrived: at each iteration it queries, blocking once ``num_updates >= synch_freq``,
  sets ``num_updates`` to 0 when a round landed and adds 1 otherwise, then sends if no round
  is in flight. Iteration 0 finds no round in flight and still adds 1, so the first round lands
  after ``max(s, 1)`` gradient steps and every later one after ``s + 1``: with ``o = 1`` for
  ``s >= 1`` (0 for s = 0), step k sends round ``(k + o) // (s + 1)`` when ``k = 0`` or
  ``(k + o) % (s + 1) = 0``, over ``W_r``, and a round lands at the end of step k when ``(k + o)
  % (s + 1) = s`` (s = 0: every step, at its end, the gossip overlapping the computation).
  The host's clock waits for each round ``s`` steps after it is sent (``deferred(s)``): for
  the first round with ``s >= 1`` that is one step after the device adds it.

  Args:
    inner: the local optimizer (gradient in, change of the numerator out).
    gossip: a :class:`~nbsgd_jax.communications.Gossip` (its phases ``W_k`` column
      stochastic; rows give what a worker receives).
    overlap: Overlap-SGP.
    synch_freq: s >= 0 (only with ``overlap``).

  Raises:
    ValueError: ``synch_freq < 0``, or ``> 0`` without ``overlap``.
  """
  if int(synch_freq) < 0 or (synch_freq and not overlap):
    raise ValueError(f"sgp.delay={synch_freq} is not allowed: it must be an integer >= 0, "
                     "and 0 unless sgp.overlap=True")
  inner, tau = as_worker_transform(inner), int(synch_freq) + 1
  if overlap:
    gossip = gossip.overlapping().deferred(tau - 1)
  diag = np.stack([np.diag(w) for w in gossip.phases]).astype(np.float32)  # [P, n]

  def init(params):
    zero = jax.tree.map(jnp.zeros_like, params)
    return PushSumState(params, jnp.float32(1.0), (zero, jnp.float32(0.0)), inner.init(params))

  def update(grads, state, params, ctx):
    x, w = state.x, state.w
    if not overlap:
      u, new_inner, r_inner = inner.update(grads, state.inner, x, ctx)
      (x, w), comm = gossip.mix((_add(x, u), w), ctx)
      inbox = state.inbox
    else:
      k = ctx.step + (1 if tau > 1 else 0)  # the pre-hook's count is one ahead (docstring)
      send, land = (k % tau == 0) | (ctx.step == 0), k % tau == tau - 1
      round_ctx = ctx._replace(step=k // tau)  # round r over W_r
      keep = jnp.asarray(diag)[gossip.phase(round_ctx), gossip.index()]
      mixed, comm = gossip.mix((x, w), round_ctx)
      recv = jax.tree.map(lambda m, a: m - keep.astype(a.dtype) * a, mixed, (x, w))
      inbox = tree_where(send, recv, state.inbox)
      x, w = tree_where(send, (_scale(x, keep), w * keep), (x, w))
      u, new_inner, r_inner = inner.update(grads, state.inner, x, ctx)
      x = _add(x, u)
      x, w = tree_where(land, (_add(x, inbox[0]), w + inbox[1]), (x, w))
      inbox = tree_where(land, jax.tree.map(jnp.zeros_like, inbox), inbox)
      comm = {k: v * send.astype(v.dtype) for k, v in comm.items()}  # only when a round goes
    z = _scale(x, 1.0 / w)
    state = PushSumState(x, w, inbox, new_inner)
    return replace_params(params, z), state, merge_reports(comm, r_inner, {"ps_weight": w})

  return WorkerTransform(init, update, inner.communications + (gossip,))


__all__ = ["PushSumState", "stochastic_gradient_push"]
