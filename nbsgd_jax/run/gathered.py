"""Only the work that fires: the event clock's gradients computed for the workers that need
them, not for all n.

On the event clock a device step applies a batch of events, and only some workers use the
gradient the step computes (``Events.compute``: AD-PSGD's workers that start a computation,
asynchronous DiLoCo's inner steps); computing every worker's and keeping a few (the
trainer's plain step) cost 3.5 gradients per gradient applied on the main job at n = 8
(5,672 for 1,601). Here the step gathers the computing workers' parameters, model state and
batches into a bucket of a fixed size ``B`` (:func:`bucket_sizes`: 1, 2, 4, ..., n),
computes ``B`` gradients with one ``jax.vmap`` and scatters them back; the rest of the step
(averages, server updates) runs on every worker, masked as before. The host picks the
bucket of each dispatch (:func:`dispatch_bucket`: its steps' largest count), so a run
compiles at most one program per bucket it meets (a handful), each a plain program: a
``lax.switch`` over the buckets would be one program, but XLA:CPU runs a convolution inside
a conditional's branch about 3x slower than at a program's top level (measured: a CNN
gradient of two workers, 33 ms against 11 ms). Padding slots (``B`` above a step's count)
compute a real gradient of the first computing worker, which is dropped; they are counted in
``grads_computed``, which the host records.

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
  """The bucket sizes of ``n`` workers: the powers of two below n, then n (n = 8:
  ``(1, 2, 4, 8)``; n = 6: ``(1, 2, 4, 6)``); at most twice the count of computing workers
  (a step where none computes takes the bucket of one: one gradient dropped costs less than
  a program more to compile)."""
  sizes, b = [], 1
  while b < n:
    sizes.append(b)
    b *= 2
  return tuple(sizes + [n])


def bucket_of(count: int, n: int) -> int:
  """The smallest bucket of :func:`bucket_sizes` ``(n)`` holding ``count`` computing workers
  (``0 <= count <= n``).

  Raises:
    ValueError: ``count`` outside ``[0, n]``.
  """
  if not 0 <= count <= n:
    raise ValueError(f"{count} computing workers is not allowed: 0 to n = {n}")
  return next(b for b in bucket_sizes(n) if b >= count)


def dispatch_bucket(compute, n: int) -> int:
  """The bucket of a dispatch (:func:`bucket_of` of its most computing workers in one step):
  ``compute`` bool ``[n, k]`` (k steps), or ``[R, n, k]`` with a sweep's runs axis."""
  counts = np.asarray(compute).sum(axis=-2)
  return bucket_of(int(counts.max(initial=0)), n)


def _take(tree, index):
  return jax.tree.map(lambda x: x[index], tree)


def gathered_gradients(source: Callable, size: int, n: int) -> Callable:
  """The gradients of the computing workers only (module docstring), in a bucket of
  ``size`` slots.

  Args:
    source: one worker's ``(params, model_state, batch) -> (loss, grads, model_state)``
      (the whole-batch gradient source).
    size: the bucket B, at least the computing workers of every step it serves
      (:func:`dispatch_bucket`), >= 1 (a step where none computes fills one slot).
    n: the workers.

  Returns:
    ``(params, model_state, batch, compute) -> (loss [n], grads, model_state, computed int32
    [n])`` on stacked ``[n, ...]`` trees, ``compute`` bool ``[n]`` (at most ``size`` true);
    ``grads`` zero and ``loss`` 0 for the workers that do not compute; ``computed`` the
    gradients each worker's slots computed (1 for a computing worker, the padding slots added
    to the first one's: their sum is ``size``).
  """

  def gradients(params, model_state, batch, compute):
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    first = jnp.argmax(compute).astype(jnp.int32)
    rows = jnp.nonzero(compute, size=size, fill_value=first)[0].astype(jnp.int32)
    loss, grads, state = jax.vmap(source)(_take(params, rows), _take(model_state, rows),
                                          _take(batch, rows))
    dest = jnp.where(jnp.arange(size) < jnp.sum(compute), rows, n)  # padding: dropped
    put = lambda full, part: full.at[dest].set(part.astype(full.dtype), mode="drop")
    return (put(jnp.zeros((n,), jnp.float32), loss), jax.tree.map(put, zero_grads, grads),
            jax.tree.map(put, model_state, state), jnp.zeros((n,), jnp.int32).at[rows].add(1))

  return gradients


__all__ = ["bucket_of", "bucket_sizes", "dispatch_bucket", "gathered_gradients"]
