"""A worker's own accumulator, of which it sends the largest chunked components: DeMo's
decoupled momentum (Peng, Quesnelle, Kingma 2024, arXiv 2411.19870, Algorithm 1;
bloc97/DeMo ``demo.py``, ``DeMo.step``, commit 0e48145d702b25f83055e11d9585a9c11bcfe154) and
SparseLoCo's error feedback (arXiv 2508.15706; tplr-ai/SparseLoCo ``src/tplr/sparseloco.py``,
``SparseLoCo.step``, commit 276fa59977f84a601fb81f3a7e9379b204b4e91c) are one transform.

Each worker keeps its own accumulator ``delta`` (never averaged) and sends only its largest
components: per parameter array,

1. ``delta <- beta delta + lr_t g`` (``beta`` = ``error_decay``; the learning rate
   enters here and again in the optimizer's step);
2. the chunked DCT of ``delta`` (:mod:`nbsgd_jax.codecs.dct`), the top-k coefficients per
   chunk ``(idx, val)``;
3. ``delta <- delta - decode(idx, val)``: the momentum keeps what was not sent;
4. ``(idx, val)`` all-gathered; each coefficient the mean over the workers that sent it
   (:class:`~nbsgd_jax.communications.ContributorAllGather`), decoded;
5. the update direction is its sign, which the optimizer (the reference: SGD, momentum 0,
   with the weight decay ``p <- (1 - lr wd) p`` before) turns into a step.

SparseLoCo is the same on DiLoCo's pseudo-gradient at each outer step: ``beta`` =
``error_decay``, the outer learning rate in place of ``lr_t``, chunks without the DCT,
``round(chunk_len top_k / chunk_size^2)`` entries per chunk, quantised to ``bins`` levels
per tensor (:func:`~nbsgd_jax.codecs.dct.quantize`; the accumulator keeps the residual after
quantisation), no sign; the outer SGD steps on the decoded mean.
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


class Chunking(NamedTuple):
  """What a worker sends of its accumulator: chunks of ``chunk`` per axis
  (:func:`~nbsgd_jax.codecs.dct.chunk_size`), DCT'd when ``dct``, ``k(chunk_len)`` entries
  per chunk, quantised to ``bins`` levels over ``sigmas`` standard deviations when ``bins``
  > 0 (else float32), the decoded mean's sign when ``sign``."""

  chunk: int
  k: Callable[[int], int]
  dct: bool = True
  bins: int = 0
  sigmas: float = 6.0
  sign: bool = True


def demo_chunking(topk: int, chunk: int) -> Chunking:
  """DeMo's message: DCT chunks, ``topk`` coefficients each, float32, signed mean."""
  return Chunking(chunk, lambda length: topk)


def sparseloco_chunking(top_k: int, chunk_size: int, bins: int, sigmas: float) -> Chunking:
  """SparseLoCo's message: plain chunks, :func:`~nbsgd_jax.codecs.dct.sparseloco_k` entries
  each, quantised to ``bins`` levels (0: float32), the mean itself."""
  return Chunking(chunk_size, lambda length: dct.sparseloco_k(length, top_k, chunk_size),
                  dct=False, bins=bins, sigmas=sigmas, sign=False)


def _send(d, how: Chunking):
  """``(idx, values as decoded, coefficient shape)`` of one array's message."""
  coef = dct.encode(d, how.chunk, how.dct)
  idx, val = dct.chunk_top_k(coef, how.k(coef.shape[-1]))
  if how.bins:
    val = dct.quantize(val, how.bins, how.sigmas)[1]
  return idx, val, coef.shape


def decoupled_momentum(exchange, schedule: Callable, decay, how: Chunking) -> WorkerTransform:
  """The accumulator's exchange (module docstring): ``x`` in (gradients, or pseudo-
  gradients), the decoded mean over the contributors of the workers' messages out (its sign
  when ``how.sign``).

  Args:
    exchange: a :class:`~nbsgd_jax.communications.ContributorAllGather` (its bytes per entry
      the message's: 8 + 4, or 8 + 1 for a quantised code).
    schedule: the rate ``lr_t`` of step ``ctx.step`` that scales ``x`` into the accumulator.
    decay: ``beta`` in [0, 1] (may be traced).
    how: the message (:class:`Chunking`).
  """

  def init(params):
    return DecoupledMomentumState(jax.tree.map(
        lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params))

  def update(x, state, params, ctx):
    del params
    lr = schedule(ctx.step)
    deltas, treedef = jax.tree.flatten(jax.tree.map(
        lambda d, g: decay * d + lr * g, state.delta, x))
    messages, kept = [], []
    for d in deltas:
      idx, val, shape = _send(d, how)
      messages.append((idx, val, shape))
      sent = scatter_last(idx, val, jnp.zeros(shape, jnp.float32))
      kept.append(d - dct.decode(sent, d.shape, how.chunk, how.dct))
    extra = 4.0 * (1 + how.bins) * len(deltas) if how.bins else 0.0  # shift and lookup
    means, report = exchange.contributor_mean(messages, ctx, extra)
    out = [dct.decode(m, d.shape, how.chunk, how.dct) for m, d in zip(means, deltas)]
    out = [jnp.sign(o) for o in out] if how.sign else out
    return (jax.tree.unflatten(treedef, out),
            DecoupledMomentumState(jax.tree.unflatten(treedef, kept)), report)

  return WorkerTransform(init, update, (exchange,))


__all__ = ["Chunking", "DecoupledMomentumState", "decoupled_momentum", "demo_chunking",
           "sparseloco_chunking"]
