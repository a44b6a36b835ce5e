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
    update: ``(grads, opt_state, params) -> (params, opt_state)``, the program of one worker:
      it runs inside ``vmap``/``shard_map`` over ``AXIS`` and may use collectives on it.
    bytes_per_step: ``model_bytes -> bytes`` one worker sends per step (mean over workers),
      from the algorithm's communication formula.
  """

  name: str
  decentralized: bool
  init: Callable[[Any], Any]
  update: Callable[[Any, Any, Any], tuple[Any, Any]]
  bytes_per_step: Callable[[float], float]
