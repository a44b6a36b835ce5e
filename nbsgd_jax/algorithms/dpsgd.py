"""Decentralized parallel SGD (D-PSGD; Lian et al., NeurIPS 2017, Algorithm 1).

Worker i computes ``u_i`` from its own gradient ``g_i(x_i)`` with its own optax state
(momentum buffers are local) and gossips with its neighbours over the mixing matrix W:

* ``order="parallel"`` (Lian et al. Eq. (2)): ``x_i <- sum_j W_ij x_j + u_i``; the gossip of
  ``x`` does not depend on the gradient, so communication overlaps computation.
* ``order="atc"`` (adapt-then-combine, as in BlueFog): ``x_i <- sum_j W_ij (x_j + u_j)``.

Gossip runs as ``ppermute`` neighbour exchange (:func:`nbsgd_jax.collectives.gossip`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from nbsgd_jax import collectives
from nbsgd_jax.algorithms.base import AXIS, Algorithm, tree_bytes

ORDERS = ("parallel", "atc")


def dpsgd(optimizer: optax.GradientTransformation, mixing_matrix: np.ndarray,
          order: str = "parallel", axis_name: str = AXIS) -> Algorithm:
  """D-PSGD over a fixed mixing matrix.

  Args:
    optimizer: local optax transformation (e.g. ``optax.sgd(lr, momentum)``).
    mixing_matrix: numpy ``[n, n]``, symmetric doubly stochastic.
    order: ``"parallel"`` or ``"atc"``.
    axis_name: the workers axis.

  Bytes per worker per step: the mean degree times the model size (one model to each
  neighbour).

  Raises:
    ValueError: unknown ``order``.
  """
  if order not in ORDERS:
    raise ValueError(f"dpsgd.order={order!r} is not allowed: use one of {list(ORDERS)}")
  w = np.asarray(mixing_matrix, dtype=np.float64)

  def update(grads, opt_state, params, step):
    del step
    sent = jnp.float32(collectives.gossip_bytes(tree_bytes(params), w))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    if order == "parallel":
      mixed = collectives.gossip(params, w, axis_name)
      return optax.apply_updates(mixed, updates), opt_state, sent
    return (collectives.gossip(optax.apply_updates(params, updates), w, axis_name), opt_state,
            sent)

  return Algorithm(name="dpsgd", decentralized=True, init=optimizer.init, update=update)
