"""The classification task: each worker's data shard, its batches and the loss.

Every leaf of the stacked worker data has a leading worker axis ``[n, ...]``; a worker's batch
at step t is drawn inside the worker program (:func:`worker_batch`), deterministic in
``(seed, worker, step)`` so a resumed run sees the same data order.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax import data as data_lib
from nbsgd_jax.axis import AXIS


class WorkerData(NamedTuple):
  """Each worker's training shard, padded to a common capacity ``m``.

  Attributes:
    images: uint8 ``[n, m, H, W, C]``.
    labels: int32 ``[n, m]``.
    sizes: int32 ``[n]``, valid rows of each shard (rows ``>= size`` are padding).
  """

  images: jax.Array
  labels: jax.Array
  sizes: jax.Array


def sample_batch_indices(key: jax.Array, size: jax.Array, capacity: int, batch_size: int,
                         step: jax.Array) -> jax.Array:
  """Indices of one worker's batch at ``step``: epoch-wise reshuffling without replacement.

  Sample ``t * B + b`` of the worker's stream is element ``(t * B + b) mod size`` of the
  random permutation of epoch ``(t * B + b) // size``; a permutation is the ``argsort`` of
  uniform keys with the padding rows pushed last. Deterministic in ``(key, step)``, so a
  resumed run sees the same data order.

  Args:
    key: the worker's data key.
    size: int32 scalar, valid rows of the shard (``>= batch_size``).
    capacity: padded shard length ``m`` (static).
    batch_size: ``B`` (static).
    step: int32 scalar.

  Returns:
    int32 ``[B]`` row indices in ``[0, size)``.
  """
  pos = step * batch_size + jnp.arange(batch_size, dtype=jnp.int32)
  first_epoch = (step * batch_size) // size
  valid = jnp.arange(capacity) < size

  def permutation(epoch):
    u = jax.random.uniform(jax.random.fold_in(key, epoch), (capacity,))
    return jnp.argsort(jnp.where(valid, u, 2.0)).astype(jnp.int32)

  within = pos % size
  return jnp.where(pos // size == first_epoch, permutation(first_epoch)[within],
                   permutation(first_epoch + 1)[within])


def data_key(seed: int, worker: jax.Array | int) -> jax.Array:
  """The key of worker ``worker``'s data order (independent of the init key ``seed``)."""
  return jax.random.fold_in(jax.random.key(seed + 1), worker)


def worker_batch(data: WorkerData, seed: int, batch_size: int, capacity: int,
                 step: jax.Array, axis_name=AXIS) -> tuple[jax.Array, jax.Array]:
  """This worker's training batch at ``step`` (inside the worker program on ``axis_name``).

  Returns:
    images float32 ``[B, H, W, C]`` scaled to [0, 1] and int labels ``[B]``, rows drawn by
    :func:`sample_batch_indices` with the worker's :func:`data_key`.
  """
  idx = sample_batch_indices(data_key(seed, lax.axis_index(axis_name)), data.sizes, capacity,
                             batch_size, step)
  return data.images[idx].astype(jnp.float32) / 255.0, data.labels[idx]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy (nats) of logits ``[B, C]`` against int labels ``[B]``."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def process_local_data(dataset: data_lib.Dataset, shards: list, backend) -> WorkerData:
  """The stacked worker data of the multihost backend as global arrays, each process
  gathering only the shards of the workers on its own devices."""
  sharding = NamedSharding(backend.mesh, P(backend.mesh.axis_names[0]))
  n, cap = len(shards), max(len(sh) for sh in shards)
  local: dict = {}

  def rows(index) -> tuple:
    key = index[0].indices(n)
    if key not in local:
      images, labels, sizes = data_lib.stack_shards(
          dataset.train_images, dataset.train_labels, shards[index[0]])
      pad = cap - images.shape[1]  # to the global capacity
      local[key] = (np.pad(images, [(0, 0), (0, pad)] + [(0, 0)] * (images.ndim - 2), "edge"),
                    np.pad(labels, [(0, 0), (0, pad)], "edge"), sizes)
    return local[key]

  shapes = ((n, cap) + dataset.train_images.shape[1:], (n, cap), (n,))
  return WorkerData(*(jax.make_array_from_callback(shape, sharding,
                                                   lambda idx, i=i: rows(idx)[i])
                      for i, shape in enumerate(shapes)))
