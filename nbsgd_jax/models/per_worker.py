"""Per-worker convolutions for simulated workers (``config.conv_impl``, ``config.pool_impl``).

The ``simulate`` backend runs n workers as ``jax.vmap`` over per-worker parameters. A vmapped
convolution whose kernel is batched too becomes one grouped convolution
(``feature_group_count = n``), which XLA's CPU and GPU emitters run well below the speed of
n ordinary convolutions (``docs/simulated_workers.md``: 1.33-1.44x one worker on the same
examples for the CNN on a CPU). :func:`conv_general_dilated` is ``lax.conv_general_dilated``
with a vmap rule of its own: when the images and the kernel are both batched, n ordinary
convolutions, one per worker (unrolled in the program), forward and backward. It is a
drop-in for ``flax.linen.Conv(conv_general_dilated=...)``.

Limits (why it is an option, off by default): the program holds n convolutions per layer, so
compile time grows with n (measured up to n = 64); forward-mode autodiff of the model alone
(``jax.jvp``) is not defined (a ``custom_vjp`` function), forward-over-reverse (a
Hessian-vector product of one model) is, ``jax.vmap`` of it is not.

:func:`max_pool` is a 2x2 / stride 2 max-pool as a reshape and a max (even sizes), the same
values as ``flax.linen.max_pool``; its gradient is elementwise where ``reduce_window``'s is a
``select_and_scatter``, which under ``vmap`` is a large share of the CNN's step on a CPU.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ("batched", "per_worker")  # config.conv_impl
POOL_IMPLS = ("window", "reshape")  # config.pool_impl


def per_worker(fn: Callable) -> Callable:
  """``fn`` whose ``jax.vmap`` with every argument batched runs ``fn`` once per batch entry
  (unrolled) and stacks the results, instead of batching ``fn``'s operations; with some
  arguments unbatched, ``jax.vmap`` of ``fn`` as usual.

  Args:
    fn: a function of arrays returning a pytree of arrays.

  Returns:
    A function with ``fn``'s signature and results (``jax.custom_batching.custom_vmap``).
  """
  f = jax.custom_batching.custom_vmap(fn)

  @f.def_vmap
  def rule(axis_size, in_batched, *args):
    if all(in_batched):
      outs = [fn(*[a[i] for a in args]) for i in range(axis_size)]
      return (jax.tree.map(lambda *o: jnp.stack(o), *outs),
              jax.tree.map(lambda _: True, outs[0]))
    if not any(in_batched):
      out = fn(*args)
      return out, jax.tree.map(lambda _: False, out)
    out = jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))(*args)
    return out, jax.tree.map(lambda _: True, out)

  return f


def _hashable(v):
  """Lists (flax's padding pairs) as tuples; namedtuples (ConvDimensionNumbers) kept."""
  if isinstance(v, list) or type(v) is tuple:
    return tuple(_hashable(u) for u in v)
  return v


@functools.lru_cache(maxsize=None)
def _per_worker_conv(static: tuple) -> Callable:
  """The differentiable per-worker convolution for the static arguments ``static`` (sorted
  ``(name, value)`` pairs), built once so that a program's traces share it."""
  kw = dict(static)
  conv = lambda x, k: lax.conv_general_dilated(x, k, **kw)
  fwd = per_worker(conv)
  bwd = per_worker(lambda x, k, g: jax.vjp(conv, x, k)[1](g))
  f = jax.custom_vjp(fwd)  # custom_vmap has no reverse mode of its own
  f.defvjp(lambda x, k: (fwd(x, k), (x, k)), lambda res, g: bwd(*res, g))
  return f


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         precision=None, **kwargs):
  """``lax.conv_general_dilated`` (same arguments, same result) whose ``jax.vmap`` over
  per-worker images ``[n, B, ...]`` and kernels ``[n, ...]`` is n ordinary convolutions
  (module docstring), in the forward and the backward pass.

  Raises:
    TypeError: ``jax.jvp`` of it (forward mode; reverse mode and forward-over-reverse work).
  """
  static = dict(window_strides=_hashable(window_strides), padding=_hashable(padding),
                lhs_dilation=_hashable(lhs_dilation), rhs_dilation=_hashable(rhs_dilation),
                dimension_numbers=_hashable(dimension_numbers),
                feature_group_count=feature_group_count, precision=precision, **kwargs)
  return _per_worker_conv(tuple(sorted(static.items())))(lhs, rhs)


def max_pool(x: jax.Array) -> jax.Array:
  """2x2 max-pool with stride 2 of ``x`` ``[..., H, W, C]`` (H, W even) as reshape + max:
  ``[..., H / 2, W / 2, C]``, the values of ``flax.linen.max_pool(x, (2, 2), (2, 2))``.

  Raises:
    ValueError: H or W odd.
  """
  *lead, h, w, c = x.shape
  if h % 2 or w % 2:
    raise ValueError(f"pool_impl='reshape' needs even image sizes, got {h}x{w}: use "
                     "pool_impl='window'")
  return x.reshape(*lead, h // 2, 2, w // 2, 2, c).max(axis=(-4, -2))
