"""Only the work that fires: the event clock's gradients computed for the workers that need
them, not for all n.

On the event clock a device step applies a batch of events, and only some workers use the
gradient the step computes (``Events.compute``: AD-PSGD's workers that start a computation,
asynchronous DiLoCo's inner steps); computing every worker's and keeping a few (the
trainer's plain step) costs about 6.5 gradients per gradient applied on the main job at
n = 8. Here the step gathers the computing workers' parameters, model state and batches into
a bucket of a fixed size ``B`` (:func:`bucket_sizes`: 0, 1, 2, 4, ..., n), computes ``B``
gradients with one ``jax.vmap``, and scatters them back; the rest of the step (averages,
server updates) runs on every worker, masked as before. The bucket is a branch of one
``lax.switch`` picked on the device from the step's count (:func:`bucket_index`), so one
compiled program serves every step, and a block of steps in one dispatch picks each step's
own bucket. Padding slots (``B`` above the count) compute a real gradient of the first
computing worker, which is dropped; they are counted in ``grads_computed``, which the host
records.

The gradients, losses and model states of the computing workers are those of the plain step
(the same parameters and batch); the workers that do not compute keep their model state (the
plain step advanced BatchNorm statistics with a gradient it then dropped) and report a loss
of 0 (the host averages the step's loss over the computing workers).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def bucket_sizes(n: int) -> tuple:
  """The bucket sizes of ``n`` workers: 0, then the powers of two below n, then n (n = 8:
  ``(0, 1, 2, 4, 8)``; n = 6: ``(0, 1, 2, 4, 6)``); at most twice the count of computing
  workers, about 1.3x on average over uniform counts."""
  sizes, b = [0], 1
  while b < n:
    sizes.append(b)
    b *= 2
  return tuple(sizes + [n])


def bucket_index(counts, sizes: tuple):
  """int32 index into ``sizes`` of the smallest bucket holding ``counts`` (int array of any
  shape, each in ``[0, sizes[-1]]``)."""
  return jnp.searchsorted(jnp.asarray(sizes, jnp.int32), counts.astype(jnp.int32),
                          side="left").astype(jnp.int32)


def _take(tree, index):
  return jax.tree.map(lambda x: x[index], tree)


def gathered_gradients(source: Callable, sizes: tuple) -> Callable:
  """The gradients of the computing workers only (module docstring).

  Args:
    source: one worker's ``(params, model_state, batch) -> (loss, grads, model_state)``
      (the whole-batch gradient source).
    sizes: the buckets (:func:`bucket_sizes`), ``sizes[-1] = n``.

  Returns:
    ``(index, params, model_state, batch, compute) -> (loss [n], grads, model_state,
    computed int32 [n])`` on stacked ``[n, ...]`` trees, ``compute`` bool ``[n]`` (at most
    ``sizes[index]`` true), ``index`` an int32 scalar (:func:`bucket_index` of the count);
    ``grads`` zero and ``loss`` 0 for the workers that do not compute; ``computed`` the
    gradients each worker's slots computed (1 for a computing worker, padding added to the
    first one's).
  """
  n = sizes[-1]

  def branch(size: int) -> Callable:
    def compute_some(params, model_state, batch, compute):
      zero_grads = jax.tree.map(jnp.zeros_like, params)
      if size == 0:
        return jnp.zeros((n,), jnp.float32), zero_grads, model_state, jnp.zeros((n,), jnp.int32)
      first = jnp.argmax(compute).astype(jnp.int32)
      rows = jnp.nonzero(compute, size=size, fill_value=first)[0].astype(jnp.int32)
      loss, grads, state = jax.vmap(source)(_take(params, rows), _take(model_state, rows),
                                            _take(batch, rows))
      dest = jnp.where(jnp.arange(size) < jnp.sum(compute), rows, n)  # padding: dropped
      put = lambda full, part: full.at[dest].set(part.astype(full.dtype), mode="drop")
      return (put(jnp.zeros((n,), jnp.float32), loss), jax.tree.map(put, zero_grads, grads),
              jax.tree.map(put, model_state, state),
              jnp.zeros((n,), jnp.int32).at[rows].add(1))
    return compute_some

  branches = [branch(size) for size in sizes]

  def gradients(index, params, model_state, batch, compute):
    return lax.switch(index, branches, params, model_state, batch, compute)

  return gradients


def counts_of(compute) -> np.ndarray:
  """int ``[...]``: computing workers per step of a stacked mask ``[..., n, k]``."""
  return np.asarray(compute).sum(axis=-2)


__all__ = ["bucket_index", "bucket_sizes", "counts_of", "gathered_gradients"]
