"""Non-blocking mini-batch gradients and a deadline-driven accumulation transform.

Source: X. He and P. Dube, "Accelerating Parallel Stochastic Gradient Descent via
Non-blocking Mini-batches", arXiv 2211.00889 (2022).

Worker ``i`` splits its batch of ``B`` examples into ``M`` mini-batches of ``B / M``
examples. At the deadline it has finished the first ``m_i`` of them (``0 <= m_i <= M``);
unfinished mini-batches are dropped. Two ways to combine the finished gradients ``g_ij``:

* decentralized form (D-PSGD, MATCHA): each worker steps with the mean of its own finished
  gradients ``(1 / m_i) sum_{j < m_i} g_ij`` (:func:`minibatch_mean_gradient`); with
  ``m_i = 0`` the worker takes no gradient step (zero gradient) but still gossips;
* all-reduce form: ``g = sum_i sum_{j < m_i} g_ij / sum_i m_i`` (zero if no worker finished
  anything): the same local means, averaged with the weights ``m_i / sum_j m_j`` by the
  communication (:meth:`nbsgd_jax.communications.Communication.weight`).

Two entry points:

* :func:`minibatch_mean_gradient` computes the combined gradient of one step in one
  call (the count ``m_i`` is a runtime input: no recompilation when it changes);
* :func:`accumulate_minibatches` is an optax transformation in the spirit of
  ``optax.MultiSteps`` that receives ONE mini-batch gradient per call and applies an
  inner optimizer when the deadline comes (``emit``), not after a fixed count.

Everything here is pure and jit/vmap-able.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from jax import lax

from nbsgd_jax.core.axis import varying_like

__all__ = [
    "AccumulateState",
    "accumulate_minibatches",
    "add_minibatch",
    "add_minibatch_with_state",
    "mean_of_sums",
    "zero_sums",
    "minibatch_mean_gradient",
    "stateless",
    "split_minibatches",
]

def split_minibatches(batch: Any, num_minibatches: int) -> Any:
  """Reshapes every leaf of ``batch`` from ``[B, ...]`` to ``[M, B / M, ...]``.

  Mini-batch ``j`` holds examples ``j * B / M`` to ``(j + 1) * B / M - 1`` (contiguous,
  in order), so "the first ``k`` mini-batches" are the first ``k * B / M`` examples.

  Args:
    batch: pytree of arrays sharing the leading dimension ``B``.
    num_minibatches: ``M``, a Python int ``>= 1``.

  Returns:
    The pytree with leaves of shape ``[M, B / M, ...]``.

  Raises:
    ValueError: ``M < 1``; an empty batch pytree, a scalar leaf or leaves whose leading
      dimensions differ; ``B`` not divisible by ``M`` (the message names the config
      fields ``nonblocking.num_minibatches`` and ``batch_size``).
  """
  if isinstance(num_minibatches, bool) or not isinstance(num_minibatches, int):
    raise ValueError(
        f"nonblocking.num_minibatches must be a Python int >= 1, got {num_minibatches!r}")
  if num_minibatches < 1:
    raise ValueError(
        f"nonblocking.num_minibatches must be >= 1, got {num_minibatches}")
  leaves = jax.tree_util.tree_leaves(batch)
  if not leaves:
    raise ValueError("batch has no array leaves")
  sizes = set()
  for leaf in leaves:
    if jnp.ndim(leaf) == 0:
      raise ValueError("every batch leaf needs a leading batch dimension; got a scalar")
    sizes.add(jnp.shape(leaf)[0])
  if len(sizes) != 1:
    raise ValueError(f"batch leaves have different leading dimensions: {sorted(sizes)}")
  batch_size = sizes.pop()
  if batch_size % num_minibatches != 0:
    raise ValueError(
        f"batch_size ({batch_size}) must be divisible by nonblocking.num_minibatches "
        f"({num_minibatches})")
  per = batch_size // num_minibatches
  return jax.tree_util.tree_map(
      lambda x: jnp.reshape(x, (num_minibatches, per) + tuple(jnp.shape(x)[1:])), batch)


def stateless(loss_fn: Callable[[Any, Any], chex.Array]) -> Callable:
  """``loss_fn(params, batch)`` as a loss with model state: ``(params, state, batch) ->
  (loss, state)``, the state passed through."""
  return lambda params, state, batch: (loss_fn(params, batch), state)


def minibatch_mean_gradient(
    loss_fn: Callable[[Any, Any, Any], tuple[chex.Array, Any]],
    params: Any,
    model_state: Any,
    batch: Any,
    num_minibatches: int,
    count: chex.Numeric,
    unroll: bool = False,
) -> tuple[Any, chex.Array, chex.Array, Any]:
  """Gradient of the first ``count`` of ``M`` mini-batches (non-blocking SGD), this worker's
  mean ``(1 / m_i) sum_{j < m_i} g_ij`` (zeros when ``m_i = 0``: no gradient step); the
  all-reduce form is the count-weighted mean of these (:meth:`nbsgd_jax.communications.
  Communication.weight`).

  The batch is split into ``M`` contiguous mini-batches (:func:`split_minibatches`).
  A ``lax.scan`` over them computes ``jax.value_and_grad(loss_fn)`` of one mini-batch
  at a time and adds it to a running sum only if ``j < count`` (``jnp.where``, so a
  NaN/inf in a dropped mini-batch cannot leak in). ``lax.scan`` is used instead of
  ``jax.vmap`` so that only one mini-batch's activations and one gradient buffer are
  live at a time: memory is that of a ``B / M`` batch, not ``B``. All ``M`` gradients
  are still computed (the count is a traced runtime value, so the compiled program is
  the same for every count; no recompilation).

  With ``count == M`` and ``loss_fn`` a mean over examples, the result equals the
  full-batch gradient ``jax.grad(loss_fn)(params, batch)``.

  The model state (BatchNorm's running statistics) goes through the finished mini-batches in
  order (mini-batch ``j`` sees the state left by ``j - 1``); an unfinished mini-batch leaves
  it unchanged, like its gradient.

  Args:
    loss_fn: ``loss_fn(params, model_state, minibatch) -> (loss, model_state)`` where
      ``minibatch`` has leaves of shape ``[B / M, ...]``; normally the mean loss over its
      examples (:func:`stateless` adapts a loss without state).
    params: pytree of parameters.
    model_state: the model's state besides the parameters (``()`` when none).
    batch: pytree of arrays with leading dimension ``B`` (this worker's batch).
    num_minibatches: ``M``, Python int ``>= 1`` (static).
    count: ``m_i``, int scalar (may be traced), the number of mini-batches this worker
      finished before the deadline; clipped to ``[0, M]``.
    unroll: the scan unrolled (the same values; XLA CPU runs convolutions in a rolled loop
      about 20x slower, measured on ResNet-8; a rolled loop keeps one mini-batch's
      activations live).

  Returns:
    ``(grads, loss, count, model_state)``: ``grads`` has the structure and dtypes of
    ``params``; ``loss`` is a float32 scalar, the mean of the finished mini-batch losses (0
    when nothing finished); ``count`` is this worker's clipped int32 count.

  Raises:
    ValueError: ``M < 1``; ``B`` not divisible by ``M`` (names
      ``nonblocking.num_minibatches`` and ``batch_size``).
  """
  minibatches = split_minibatches(batch, num_minibatches)
  count = jnp.clip(jnp.asarray(count, jnp.int32), 0, num_minibatches)

  def body(carry, xs):
    j, minibatch = xs
    new = add_minibatch_with_state(carry, loss_fn, params, minibatch)
    keep = j < count
    return jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, carry), None

  xs = (jnp.arange(num_minibatches, dtype=jnp.int32), minibatches)
  (grad_sum, loss_sum, model_state), _ = lax.scan(
      body, zero_sums(params) + (model_state,), xs, unroll=num_minibatches if unroll else 1)

  grads, loss = mean_of_sums(grad_sum, loss_sum, count)
  return grads, loss, count, model_state


def zero_sums(params: Any) -> tuple:
  """``(grad_sum, loss_sum)`` before any mini-batch: zeros like ``params`` and a float32 0
  (varying over the worker axis like the params, for shard_map's types)."""
  return (jax.tree_util.tree_map(jnp.zeros_like, params),
          varying_like(jnp.zeros((), jnp.float32), params))


def add_minibatch(sums: tuple, loss_fn: Callable, params: Any, minibatch: Any) -> tuple:
  """``sums`` plus one mini-batch's ``(gradient, loss)`` (:func:`minibatch_mean_gradient`'s
  accumulation)."""
  return add_minibatch_with_state(sums + ((),), stateless(loss_fn), params, minibatch)[:2]


def add_minibatch_with_state(carry: tuple, loss_fn: Callable, params: Any,
                             minibatch: Any) -> tuple:
  """``(grad_sum, loss_sum, model_state)`` after one more mini-batch of a loss with model
  state (:func:`minibatch_mean_gradient`'s accumulation, also run one mini-batch
  at a time on the wall clock, :mod:`nbsgd_jax.run.wallclock`)."""
  grad_sum, loss_sum, model_state = carry
  (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, model_state, minibatch)
  grad_sum = jax.tree_util.tree_map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)
  return grad_sum, loss_sum + loss.astype(jnp.float32), model_state


def mean_of_sums(grad_sum: Any, loss_sum: chex.Array, total: chex.Array) -> tuple:
  """``(grad_sum / total, loss_sum / total)``, zeros when ``total = 0`` (nothing finished)."""
  nonzero = total > 0
  denom = jnp.maximum(total, 1)
  grads = jax.tree_util.tree_map(
      lambda s: jnp.where(nonzero, s / denom.astype(s.dtype), jnp.zeros_like(s)), grad_sum)
  loss = jnp.where(nonzero, loss_sum / denom.astype(jnp.float32), 0.0)
  return grads, loss


class AccumulateState(NamedTuple):
  """State of :func:`accumulate_minibatches`.

  Attributes:
    grad_sum: pytree like ``params``, sum of the finished mini-batch gradients since the
      last emit.
    count: int32 scalar, number of finished mini-batches in ``grad_sum``.
    inner_state: the inner optimizer's state.
  """
  grad_sum: Any
  count: chex.Array
  inner_state: optax.OptState


def accumulate_minibatches(
    inner: optax.GradientTransformation,
) -> optax.GradientTransformationExtraArgs:
  """Accumulates finished mini-batch gradients and steps ``inner`` at the deadline.

  Like ``optax.MultiSteps``, but the emit condition is the deadline (He & Dube 2022,
  arXiv 2211.00889), passed in by the caller, instead of a fixed
  count. One call per mini-batch:

  ``update(updates, state, params=None, *, finished, emit, **extra_args)``

  * ``updates``: ONE mini-batch's gradient (pytree like ``params``);
  * ``finished``: bool scalar; the mini-batch finished before the deadline: it is added
    to ``grad_sum`` and ``count`` grows by one; otherwise it is dropped;
  * ``emit``: bool scalar; the deadline has come (checked after adding this call's
    mini-batch). If ``count > 0`` the inner transformation is applied to
    ``grad_sum / count`` and its updates returned; if ``count == 0`` zero updates are
    returned and ``inner_state`` is left unchanged (no gradient step). Either way the
    accumulator is reset. Without ``emit`` the updates are zero.
  * ``extra_args`` are forwarded to ``inner`` (wrapped by
    ``optax.with_extra_args_support``).

  With all ``M`` mini-batches finished and ``emit`` at the ``M``-th call, the emitted
  update equals one ``inner`` step on the mean of the ``M`` mini-batch gradients, i.e.
  the full-batch mean gradient step when the mini-batches partition the batch evenly.

  Branching uses ``lax.cond`` (a real branch under ``jit``; a select under ``vmap``),
  so ``finished``/``emit`` may be traced and per-worker.

  Args:
    inner: the optimizer applied to the mean of the finished gradients.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with state :class:`AccumulateState`.

  Raises:
    TypeError: ``update`` called without ``finished`` or ``emit``.
  """
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return AccumulateState(
        grad_sum=jax.tree_util.tree_map(jnp.zeros_like, params),
        count=jnp.zeros((), jnp.int32),
        inner_state=inner.init(params))

  def update_fn(updates, state, params=None, *, finished, emit, **extra_args):
    finished = jnp.asarray(finished, bool)
    emit = jnp.asarray(emit, bool)
    grad_sum = jax.tree_util.tree_map(
        lambda s, g: jnp.where(finished, s + g.astype(s.dtype), s), state.grad_sum, updates)
    count = state.count + finished.astype(jnp.int32)
    apply = jnp.logical_and(emit, count > 0)

    def do_apply(operands):
      grad_sum, inner_state = operands
      denom = jnp.maximum(count, 1)
      mean = jax.tree_util.tree_map(lambda s: s / denom.astype(s.dtype), grad_sum)
      new_updates, new_inner_state = inner.update(mean, inner_state, params, **extra_args)
      # dtypes, and shard_map's types: an all-reduced update is the same on every worker
      new_updates = jax.tree_util.tree_map(
          lambda u, s: varying_like(u.astype(s.dtype), s), new_updates, grad_sum)
      new_inner_state = jax.tree_util.tree_map(
          lambda n, o: varying_like(jnp.asarray(n, dtype=jnp.result_type(o)), o),
          new_inner_state, inner_state)
      return new_updates, new_inner_state

    def skip(operands):
      grad_sum, inner_state = operands
      return jax.tree_util.tree_map(jnp.zeros_like, grad_sum), inner_state

    out_updates, inner_state = lax.cond(
        apply, do_apply, skip, (grad_sum, state.inner_state))
    grad_sum = jax.tree_util.tree_map(
        lambda s: jnp.where(emit, jnp.zeros_like(s), s), grad_sum)
    count = jnp.where(emit, jnp.zeros_like(count), count)
    return out_updates, AccumulateState(grad_sum, count, inner_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
