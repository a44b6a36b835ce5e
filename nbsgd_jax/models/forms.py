"""How the model's step is computed on this platform: the forms the framework picks per
platform, model and workers per device (``config.conv_impl``, ``config.pool_impl``,
``config.residuals``; each ``"auto"`` by default, each can be forced). The rules are
measured, side by side with the other forms, in ``docs/simulated_workers.md`` ("Against
PyTorch") with ``benchmarks/peer_pytorch.py`` and ``benchmarks/simulated_workers.py``;
every form computes the same function (tests: ``tests/models/test_forms.py``,
``tests/models/test_per_worker.py``).

* ``conv_impl``: ``"per_worker"`` (n ordinary convolutions, :mod:`nbsgd_jax.models.per_worker`) on
  a CPU with 2 to :data:`MAX_UNROLLED` workers per device, else ``"batched"`` (one grouped
  convolution under ``vmap``). XLA:CPU's grouped convolution runs at about half the speed of
  the same arithmetic as ordinary convolutions; the unrolled program's compile time grows
  with n (21 s at n = 64), and on a GPU the choice is not measured.
* ``pool_impl``: ``"reshape"`` (reshape + max) wherever the pooled sizes are even, else
  ``"window"`` (``flax.linen.max_pool``): the same values; ``reduce_window``'s gradient
  (a ``select_and_scatter``) was half of the CNN's step on a CPU.
* ``residuals``: ``"materialized"`` on a CPU: the ResNet's residual stream is stored once
  per block (:func:`materialize`) instead of being recomputed, through every earlier
  block's BatchNorm, inside each transposing copy that XLA:CPU makes for a weight
  gradient; ``"fused"`` (XLA's own choice) elsewhere.

* steps per dispatch (``config.steps_per_dispatch = 0``, :func:`blocks_pay`): one step per
  dispatch on a CPU, blocks of k steps (a ``lax.scan``) elsewhere. XLA:CPU runs a
  convolution inside a loop's body on a slower path than at the top of a program (the main
  job's CNN: 145 ms a step in blocks of 4 against 47 ms at k = 1; ResNet-20: 10.8x; a bare
  two-layer convolution's gradient 13x slower in a 4-step scan, unrolled as fast), and the
  MLP, whose step is dense layers, measured no faster in blocks (8.8 ms at k = 16 against
  8.6 ms at k = 1), side by side: ``benchmarks/steps_per_dispatch.py``,
  ``docs/steps_per_dispatch.md``. On a GPU a dispatch has a fixed launch and synchronisation
  cost that blocks save (not measured here).

Not a form: XLA:CPU's own (Eigen) convolution kernels instead of YNNPACK's (the compiler
option ``xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``) made the
ResNet-20 step 15-20 % faster, but its gradients of ResNet-8 differed from float64's by up to
1.7e-3 (YNNPACK's: 7e-8; ``docs/simulated_workers.md``), so it is not offered.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from nbsgd_jax.models import per_worker

AUTO = "auto"
MAX_UNROLLED = 64  # the most workers per device measured with conv_impl="per_worker"
CONV_CHOICES = (AUTO,) + per_worker.CONV_IMPLS  # config.conv_impl
POOL_CHOICES = (AUTO,) + per_worker.POOL_IMPLS  # config.pool_impl
RESIDUALS = ("fused", "materialized")
RESIDUAL_CHOICES = (AUTO,) + RESIDUALS  # config.residuals


class Forms(NamedTuple):
  """The forms of one run (``conv_impl`` and ``residuals`` resolved; ``pool_impl`` may stay
  ``"auto"``, which the model decides per pool).

  Attributes:
    conv_impl: ``"batched"`` or ``"per_worker"``.
    pool_impl: ``"window"``, ``"reshape"`` or ``"auto"`` (decided per pool by its sizes).
    residuals: ``"fused"`` or ``"materialized"``.
  """

  conv_impl: str = "batched"
  pool_impl: str = AUTO
  residuals: str = "fused"


def resolve(cfg: Any, platform: str, local_workers: int) -> Forms:
  """The run's :class:`Forms` from ``cfg``'s three keys (module docstring's rules).

  Args:
    cfg: a config with ``conv_impl``, ``pool_impl`` and ``residuals`` (validated).
    platform: ``jax.default_backend()`` (``"cpu"``, ``"gpu"``, ``"tpu"``).
    local_workers: workers per device k (the simulate backend: n; :func:`device_workers`).
  """
  cpu = platform == "cpu"
  conv = cfg.conv_impl
  if conv == AUTO:
    conv = "per_worker" if cpu and 2 <= local_workers <= MAX_UNROLLED else "batched"
  residuals = cfg.residuals
  if residuals == AUTO:
    residuals = "materialized" if cpu else "fused"
  return Forms(conv, cfg.pool_impl, residuals)


def blocks_pay(platform: str) -> bool:
  """Whether blocks of steps in one program (a ``lax.scan``) are the default on
  ``platform`` (``jax.default_backend()``): not on a CPU (module docstring, "steps per
  dispatch")."""
  return platform != "cpu"


def device_workers(backend) -> int:
  """Workers per device of a :class:`~nbsgd_jax.core.backends.Backend` (simulate: all n)."""
  if backend.mesh is None:
    return backend.num_workers
  return backend.num_workers // backend.mesh.devices.size


def _stored(x: jax.Array) -> jax.Array:
  """``x``, returned by a ``lax.cond`` whose branches XLA cannot fuse across (its
  predicate, ``x``'s first entry equal to itself, is read at run time; both branches give
  ``x``, NaN included)."""
  first = x.reshape(-1)[0]
  return lax.cond(first == first, lambda a: a, lambda a: a + jnp.zeros((), a.dtype), x)


_stored_once = jax.custom_batching.custom_vmap(_stored)


@_stored_once.def_vmap
def _stored_vmap(axis_size, in_batched, x):
  del axis_size  # one predicate for the whole batched array: a cond, not a select
  return _stored_once(x), in_batched[0]


@jax.custom_jvp
def materialize(x: jax.Array) -> jax.Array:
  """``x`` (any shape), computed once and kept in memory: an XLA fusion that reads it
  reads the stored array instead of recomputing its producers (``residuals=
  "materialized"``). Its derivative is the identity (forward and reverse mode). Under
  ``jax.vmap`` it stays one conditional (a custom batching rule), not a select that XLA
  would fuse away.
  ``lax.optimization_barrier`` does not do this on XLA:CPU (measured: no change).

  Do not use it on a GPU: the conditional's predicate is read by the host.
  """
  return _stored_once(x)


@materialize.defjvp
def _materialize_jvp(primals, tangents):
  return materialize(primals[0]), tangents[0]
