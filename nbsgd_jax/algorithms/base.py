"""The contract between the trainer and an algorithm."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

AXIS = "workers"
"""The named axis every worker program communicates over."""


class StepInputs(NamedTuple):
  """Per-step inputs of one worker, drawn on the host by the simulated cluster.

  They are array inputs of the jitted step (a new value never recompiles).

  Attributes:
    step: int32 scalar, the step number (time-varying topologies).
    count: int32 scalar, mini-batches this worker finished by the deadline (Non-blocking SGD,
      He & Dube 2022); ``M`` for blocking algorithms.
    active: bool ``[K]``, MATCHA's matching activations ``B_j`` of this step (the same on
      every worker); ``K = 1`` and unused for other algorithms.
    target: float32 scalar, the consensus-control target Xi of this step (``inf``: no
      control), or None when the run has no consensus control (Kong et al. 2021).
    alive: bool ``[n]``, the workers up at this step (the same on every worker), or None
      when the run simulates no failures (``cluster.failures``).
  """

  step: jax.Array
  count: jax.Array
  active: jax.Array
  target: Any = None
  alive: Any = None


def masked_update(optimizer, grads, opt_state, params, keep):
  """``optimizer.update``, but no step at all (zero update, unchanged state) where ``keep``
  is False: a worker or group with no finished mini-batch (He & Dube 2022, Sec. 3).

  Returns:
    ``(updates, opt_state)``.
  """
  updates, new_state = optimizer.update(grads, opt_state, params)
  updates = jax.tree.map(lambda u: jnp.where(keep, u, jnp.zeros_like(u)), updates)
  new_state = jax.tree.map(lambda a, b: jnp.where(keep, a, b), new_state, opt_state)
  return updates, new_state


class Algorithm(NamedTuple):
  """One worker's update rule.

  Attributes:
    name: the ``config.algorithm`` value.
    decentralized: whether workers hold different models (consensus distance > 0).
    init: ``params -> opt_state`` for one worker.
    update: ``(grads, opt_state, params, inputs) -> (params, opt_state, bytes_sent)``, the
      program of one worker: it runs inside ``vmap``/``shard_map`` over ``AXIS`` and may use
      collectives on it. ``inputs`` is this worker's :class:`StepInputs`; with non-blocking
      mini-batches ``grads`` is the mean over its ``inputs.count`` finished mini-batches.
      ``bytes_sent`` is a float32 scalar, the bytes this worker sent in this step, from the
      algorithm's communication formula. An update may return a fourth element, a dict of
      float/int scalars (``aux``: e.g. consensus control's ``gossip_steps`` and measured
      ``consensus_distance``), which the trainer logs.
    sync_update: ``None``, or for periodic algorithms (local SGD, DiLoCo) the program of a
      step that ends a communication period (same signature as ``update``); ``update`` is
      then the purely local step. The trainer picks one per step on the host
      (:class:`nbsgd_jax.local_sgd.SyncPlanner`).
  """

  name: str
  decentralized: bool
  init: Callable[[Any], Any]
  update: Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]
  sync_update: Optional[Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]] = None


def tree_bytes(tree) -> int:
  """Bytes of one copy of a pytree (one worker's model or gradient), from leaf dtypes."""
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def varying_like(x: jax.Array, tree: Any) -> jax.Array:
  """``x`` marked as varying over the manual mesh axes the leaves of ``tree`` vary over.

  Inside ``jax.shard_map`` a per-worker value an update returns (a count, a byte total)
  varies over the worker axis; a loop carry or a state that starts as a constant must be
  given the same type (e.g. ``error_feedback``'s ``sent_count``, consensus control's bytes).
  Outside ``shard_map`` (plain, ``jit``, ``vmap``) ``x`` is returned unchanged.
  """
  axes: set = set()
  for leaf in jax.tree_util.tree_leaves(tree):
    aval = jax.typeof(leaf)
    vma = getattr(aval, "vma", None)  # older JAX
    if vma is None:
      vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    axes |= set(vma or ())
  if not axes:
    return x
  return lax.pcast(x, tuple(sorted(axes)), to="varying")
