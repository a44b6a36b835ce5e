"""The mean over a random group: NoLoCo's exchange (arXiv 2506.10911; jkolehm/noloco
``src/noloco/sparse_optimizer_c.py``, ``SparseOptimizerC``, commit
37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08).

At an outer step the ``n`` workers are split into ``n / g`` groups of ``g``
(``group_size``) by a random permutation, the reference's strided rule: position ``p``
of the permutation joins group ``p mod (n / g)``, and the group's first member (positions
``0 .. n/g - 1``) is its root. The reference draws the permutation with
``numpy.random.default_rng(t + 1)`` from the step; here it is
``jax.random.permutation(fold_in(key(seed), step), n)``, the same on every worker and on the
host (:meth:`RandomGroups.groups`), so the device needs no host input and the optax face
works alone.

The reference's message: each non-root sends the root its slow weights and their change (two
models), the root sends both group means back to each of the ``g - 1`` others (a star, by
point-to-point sends). Bytes per outer step: ``2 B`` for a non-root, ``2 (g - 1) B`` for a
root, ``B`` the model's bytes (float32 here; the reference's bfloat16 halves them).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.communications import adjacency as adjacency_lib
from nbsgd_jax.communications.base import Communication, Pattern
from nbsgd_jax.core.axis import AXIS, tree_bytes


def group_positions(seed, step, n: int) -> jax.Array:
  """int32 ``[n]``: each worker's position in the permutation of outer step ``step``
  (traceable); worker ``i`` is in group ``position[i] mod (n / g)``, the root when
  ``position[i] < n / g``."""
  perm = jax.random.permutation(jax.random.fold_in(jax.random.key(seed), step), n)
  return jnp.argsort(perm).astype(jnp.int32)


class RandomGroups(Communication):
  """The mean over each worker's random group (module docstring).

  Args:
    n: workers.
    group_size: ``g``, dividing ``n``.
    seed: the permutations' seed (the run's).
    axis_name, key: as :class:`~nbsgd_jax.communications.Communication`.

  Raises:
    ValueError: ``group_size`` < 1 or not dividing ``n``.
  """

  def __init__(self, n: int, group_size: int, seed: int = 0, axis_name: Any = AXIS,
               key: str = "groups"):
    if group_size < 1 or n % group_size:
      raise ValueError(f"noloco.group_size={group_size} is not allowed with {n} "
                       "workers: it must divide the workers")
    super().__init__(n, axis_name, key)
    self.g, self.seed, self.num_groups = int(group_size), int(seed), n // int(group_size)

  @functools.lru_cache(maxsize=64)
  def groups(self, step: int) -> np.ndarray:
    """int ``[n]``: each worker's group at ``step`` (host half, the device's draw)."""
    return np.asarray(group_positions(self.seed, step, self.n)) % self.num_groups

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del active
    group = self.groups(step)
    members = [np.flatnonzero(group == group[i]).tolist() for i in range(self.n)]
    roots = np.asarray(group_positions(self.seed, step, self.n)) < self.num_groups
    messages = np.where(roots, 2.0 * (self.g - 1), 2.0)
    return Pattern(adjacency_lib.Neighbours.of_lists(members), messages)

  def group_mean(self, tree, ctx):
    """``(the mean over this worker's group of tree, report)``: over the live members (this
    worker's own value when none is up); bytes of the reference's star (module docstring)."""
    pos = group_positions(self.seed, ctx.step, self.n)[self.index()]
    mine = jax.nn.one_hot(pos % self.num_groups, self.num_groups, dtype=jnp.float32)
    up = self.live(ctx).astype(jnp.float32)
    count = lax.psum(mine * up, self.axis_name)[pos % self.num_groups]

    def mean(x):
      total = lax.psum(jnp.tensordot(mine * up, x, axes=0), self.axis_name)
      return jnp.where(count > 0, total[pos % self.num_groups] / jnp.maximum(count, 1.0), x)

    out = jax.tree.map(mean, tree)
    size = tree_bytes(tree)
    sent = jnp.where(pos < self.num_groups, 2.0 * (self.g - 1) * size, 2.0 * size)
    return out, self.report(self.charge(sent, ctx))


__all__ = ["RandomGroups", "group_positions"]
