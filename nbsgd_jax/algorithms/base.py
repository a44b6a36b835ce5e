"""The contract between the trainer and an algorithm."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

AXIS = "workers"
"""The named axis every worker program communicates over."""


class Algorithm(NamedTuple):
  """One worker's update rule.

  Attributes:
    name: the ``config.algorithm`` value.
    decentralized: whether workers hold different models (consensus distance > 0).
    init: ``params -> opt_state`` for one worker.
    update: ``(grads, opt_state, params, step) -> (params, opt_state, bytes_sent)``, the
      program of one worker: it runs inside ``vmap``/``shard_map`` over ``AXIS`` and may use
      collectives on it. ``step`` is the int32 step number (for time-varying communication);
      ``bytes_sent`` is a float32 scalar, the bytes this worker sent in this step, from the
      algorithm's communication formula.
  """

  name: str
  decentralized: bool
  init: Callable[[Any], Any]
  update: Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]


def tree_bytes(tree) -> int:
  """Bytes of one copy of a pytree (one worker's model or gradient), from leaf dtypes."""
  import jax
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))
