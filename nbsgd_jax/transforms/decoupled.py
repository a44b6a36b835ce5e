"""DeMo's decoupled momentum (Peng, Quesnelle, Kingma 2024, arXiv 2411.19870, Algorithm 1;
bloc97/DeMo ``demo.py``, ``DeMo.step``, commit 0e48145d702b25f83055e11d9585a9c11bcfe154).

Each worker keeps its own momentum ``delta`` (never averaged) and sends only its fast
components: per parameter array,

1. ``delta <- beta delta + lr_t g`` (``beta`` = ``compression_decay``; the learning rate
   enters here and again in the optimizer's step);
2. the chunked DCT of ``delta`` (:mod:`nbsgd_jax.codecs.dct`), the top-k coefficients per
   chunk ``(idx, val)``;
3. ``delta <- delta - decode(idx, val)``: the momentum keeps what was not sent;
4. ``(idx, val)`` all-gathered; each coefficient the mean over the workers that sent it
   (:class:`~nbsgd_jax.communications.ContributorAllGather`), decoded;
5. the update direction is its sign, which the optimizer (the reference: SGD, momentum 0,
   with the weight decay ``p <- (1 - lr wd) p`` before) turns into a step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from nbsgd_jax.codecs import dct
from nbsgd_jax.communications.collectives import scatter_last
from nbsgd_jax.transforms.base import WorkerTransform


class DecoupledMomentumState(NamedTuple):
  """State of :func:`decoupled_momentum`: ``delta``, the worker's momentum (a tree like the
  parameters, float32)."""

  delta: Any


def decoupled_momentum(exchange, schedule: Callable, decay, topk: int, chunk: int
                       ) -> WorkerTransform:
  """DeMo's exchange (module docstring): gradients in, ``sign`` of the decoded mean of the
  workers' fast components out.

  Args:
    exchange: a :class:`~nbsgd_jax.communications.ContributorAllGather`.
    schedule: the learning rate ``lr_t`` of step ``ctx.step`` (the optimizer's schedule).
    decay: ``compression_decay`` in [0, 1) (may be traced).
    topk: coefficients kept per chunk (``compression_topk``).
    chunk: the target chunk length per axis (``compression_chunk``).
  """

  def init(params):
    return DecoupledMomentumState(jax.tree.map(
        lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params))

  def update(grads, state, params, ctx):
    del params
    lr = schedule(ctx.step)
    deltas, treedef = jax.tree.flatten(jax.tree.map(
        lambda d, g: decay * d + lr * g, state.delta, grads))
    messages, kept = [], []
    for d in deltas:
      coef = dct.encode(d, chunk)
      idx, val = dct.chunk_top_k(coef, topk)
      messages.append((idx, val, coef.shape))
      sent = scatter_last(idx, val, coef)
      kept.append(d - dct.decode(sent, d.shape, chunk))
    means, report = exchange.contributor_mean(messages, ctx)
    signs = [jnp.sign(dct.decode(m, d.shape, chunk)) for m, d in zip(means, deltas)]
    return (jax.tree.unflatten(treedef, signs),
            DecoupledMomentumState(jax.tree.unflatten(treedef, kept)), report)

  return WorkerTransform(init, update, (exchange,))


__all__ = ["DecoupledMomentumState", "decoupled_momentum"]
