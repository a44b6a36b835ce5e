"""A parameter server that workers push to and pull from, one worker at a time: asynchronous
DiLoCo's (Liu, Douillard et al. 2024, arXiv 2401.09135; google-deepmind/asyncdiloco's toy
notebook). The server's model is replicated on every worker (the program stays one SPMD
program): a push reaches every replica by one sum over the worker axis, in which only the
pushing worker's term is non-zero (the event clock puts at most one push or pull in a device
step: both touch the server).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.core.axis import AXIS, tree_bytes
from nbsgd_jax.communications.base import Communication, Pattern


class ParameterServer(Communication):
  """Pushes and pulls of one model (see module docstring).

  Args:
    n, axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.
  """

  def __init__(self, n: int, axis_name: Any = AXIS, key: str = "server"):
    super().__init__(n, axis_name, key)

  def message_bytes(self, params) -> float:
    """Bytes of one push or pull: one model (arrays or ``jax.ShapeDtypeStruct`` s)."""
    return float(tree_bytes(params))

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    """Each worker alone (the event clock charges each push and pull itself)."""
    del step, active
    return Pattern(None, np.ones(self.n), collective=False)

  def push(self, tree, push, pull, ctx):
    """``(the pushed tree on every worker, whether one was pushed, report)``.

    Args:
      tree: this worker's pseudo-gradient (used where ``push``).
      push, pull: bool scalars, this worker pushes / pulls in this step.
      ctx: the step's context.

    Returns:
      ``sum_i [push_i] tree_i`` (the one pusher's tree, or zeros), bool scalar, and the report:
      one model's bytes for a worker that pushes or pulls, else 0.
    """
    mine = jax.tree.map(lambda a: jnp.where(push, a, jnp.zeros_like(a)), tree)
    summed = lax.psum(mine, self.axis_name)
    any_push = lax.psum(push.astype(jnp.float32), self.axis_name) > 0
    sent = jnp.where(push | pull, jnp.float32(tree_bytes(tree)), jnp.float32(0.0))
    return summed, any_push, self.report(self.charge(sent, ctx))


__all__ = ["ParameterServer"]
