"""The device side of asynchronous training on the event clock (:mod:`nbsgd_jax.host.events`).

A device step applies one batch of events. Its per-worker masks (``ctx.per_worker``, drawn on
the host by :class:`nbsgd_jax.host.events.EventTimes`):

* ``start``: bool, the worker started a new computation since the last step (its event was in
  the last batch; every worker at step 0). Its read of the model is its current parameters,
  which no event changed since (a batch's events touch no worker twice), so the gradient the
  trainer computes at the current parameters *is* the gradient of its read: it is held, in
  flight, until the worker's next event;
* ``fire``: bool, the worker's own event is in this batch: it applies its in-flight gradient,
  computed on a read that other workers' events may have changed since (the staleness);
* ``peer``: int32, the worker its event averages with (itself: none); a worker touched by a
  peer's event averages too, without firing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params)


class InFlightState(NamedTuple):
  """A worker's state between its read and its event.

  Attributes:
    grads: the gradient computed on the worker's last read, waiting for its event (the
      parameters' shapes).
    inner: the local optimizer's state (advanced only at the worker's own events).
  """

  grads: Any
  inner: Any


def _where(cond, new, old):
  return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


ORDERS = ("average_first", "gradient_first")


def pairwise_events(inner, pairwise, order: str = "average_first") -> WorkerTransform:
  """A batch of events that each apply a worker's in-flight gradient and may average it with
  a peer (module docstring): the device half of AD-PSGD and SwarmSGD.

  ``order="average_first"`` (AD-PSGD, Lian, Zhang, Zhang, Liu, ICML 2018, Algorithm 1): at
  worker i's event, average with the peer, ``x_i, x_j <- (x_i + x_j) / 2`` (line 3), then
  apply the gradient computed on the stale read, ``x_i <- x_i - gamma g(x_hat_i)`` (line 4;
  ``inner`` is the local optimizer, e.g. SGD with momentum and weight decay as the reference's
  gossip process applies it, facebookresearch/stochastic_gradient_push ``gossip/ad_psgd.py``,
  commit ac9af237e195c812ebad08fc4697e3de1fa96ff8). ``"gradient_first"`` (SwarmSGD, Nadiradze
  et al., NeurIPS 2021, Sec. 3: local SGD steps, and after the last of them an average with a
  neighbour drawn uniformly): the local step first, then the average. A worker touched by a
  peer's event averages without stepping. The worker's next read is its model after the
  event.

  Args:
    inner: the local optimizer (a worker transform or an optax transformation): gradient in,
      parameter change out.
    pairwise: a :class:`~nbsgd_jax.communications.pairwise.PairwiseAverage`.
    order: one of :data:`ORDERS`.

  Returns:
    A :class:`~nbsgd_jax.transforms.WorkerTransform` with state :class:`InFlightState`; it
    reads ``ctx.per_worker`` ``start``, ``fire`` and ``peer`` (KeyError without them: the
    recipe's event clock writes them).

  Raises:
    ValueError: an unknown ``order``.
  """
  if order not in ORDERS:
    raise ValueError(f"order={order!r} is not allowed: use one of {list(ORDERS)}")
  inner = as_worker_transform(inner)

  def init(params):
    return InFlightState(jax.tree.map(jnp.zeros_like, params), inner.init(params))

  def local_step(held, state, params, ctx):
    step, new_inner, report = inner.update(held, state.inner, params, ctx)
    fire = ctx.per_worker["fire"]
    moved = _where(fire, jax.tree.map(lambda p, u: p + u, params, step), params)
    return moved, _where(fire, new_inner, state.inner), report

  def update(grads, state, params, ctx):
    events = ctx.per_worker
    held = _where(events["start"], grads, state.grads)
    if order == "average_first":
      x, report = pairwise.average(params, events["peer"], ctx)
      x, new_inner, inner_report = local_step(held, state, x, ctx)
    else:
      x, new_inner, inner_report = local_step(held, state, params, ctx)
      x, report = pairwise.average(x, events["peer"], ctx)
    state = InFlightState(held, new_inner)
    return replace_params(params, x), state, merge_reports(report, inner_report)

  return WorkerTransform(init, update, (pairwise,) + inner.communications)


__all__ = ["InFlightState", "ORDERS", "pairwise_events"]
