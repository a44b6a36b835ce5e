"""All-gathers of compressed messages: the mean of what every worker's codec sent.

* :class:`MessageAllGather`: any :class:`~nbsgd_jax.codecs.Codec` (QSGD, scaled sign). Every
  worker sends its encoded message to the ``n - 1`` others, who decode and average; the device
  computes the same mean by summing the decoded messages over the axis, and charges
  ``(n - 1)`` times the encoding's bytes.
* :class:`SparseAllGather`: a sparse message (Top-k / Gaussian-k / Random-k SGD, Shi et al.
  2019; code hclhkbu/GaussianK-SGD), all-gathered as ``(values, indices)``.

Every worker all-gathers the ``(values, indices)`` messages of all ``n`` workers and
scatter-adds them (:func:`nbsgd_jax.communications.collectives.sparse_all_gather`). Bytes of worker i:
``(n - 1) * sent_i * (value_bytes + index_bytes)`` for the ``sent_i`` valid entries of its
message, forwarded to the ``n - 1`` others; the clock charges ``n - 1`` messages and everyone
waits for everyone.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.communications import collectives
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.communications.base import Communication, Pattern


class MessageAllGather(Communication):
  """Mean of every worker's decoded message (see module docstring).

  Args:
    n: workers, or None when only the device half is used (then taken from the axis).
    axis_name, key, weighted: as :class:`~nbsgd_jax.communications.Communication`.
  """

  default_key = "allgather"

  def __init__(self, n: Optional[int] = None, axis_name: Any = AXIS,
               key: Optional[str] = None, weighted: bool = False):
    super().__init__(n or 0, axis_name, key or self.default_key, weighted)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    del step, active
    if self.n < 1:
      raise ValueError(f"{type(self).__name__}(n=None) has no host pattern: give n")
    return Pattern(None, np.full(self.n, float(self.n - 1)), collective=True)

  def mean_decoded(self, decoded, num_bytes, ctx, send=True):
    """``((1/n) sum_j decoded_j, report)`` for a tree ``decoded`` (what the receivers decode
    from worker j's message) of ``num_bytes`` bytes (float32 scalar); a worker with ``send``
    False contributes nothing and is charged nothing."""
    n = collectives.axis_size(self.axis_name)
    send = jnp.asarray(send, bool)
    out = jax.tree.map(lambda x: lax.psum(jnp.where(send, x, jnp.zeros_like(x)),
                                          self.axis_name) / n, decoded)
    sent = jnp.where(send, jnp.float32(n - 1) * num_bytes, jnp.float32(0.0))
    return out, self.report(self.charge(sent, ctx))


class SparseAllGather(MessageAllGather):
  """Mean of every worker's densified sparse message (see module docstring); arguments as
  :class:`MessageAllGather` (default key ``"sparse_allgather"``)."""

  default_key = "sparse_allgather"

  def mean(self, values, indices, d: int, ctx, send=True):
    """``((1/n) sum_j dense(values_j, indices_j), report)``, a dense ``[d]`` vector; a worker
    with ``send`` False contributes nothing and is charged nothing. Weighted means scale the
    message before compression (:func:`~nbsgd_jax.transforms.error_feedback`), so that error
    feedback keeps what was not sent in the same units.

    Args:
      values: ``[cap]`` message values; indices: ``[cap]`` int positions (``d``: padding).
      d: dense length (static).
      ctx: the step's :class:`~nbsgd_jax.transforms.StepContext`, or None.
      send: bool scalar.
    """
    n = collectives.axis_size(self.axis_name)
    send = jnp.asarray(send, bool)
    out = collectives.sparse_all_gather(jnp.where(send, values, jnp.zeros_like(values)),
                                        indices, d, self.axis_name) / n
    valid = jnp.sum((indices >= 0) & (indices < d)).astype(jnp.float32)
    per_entry = values.dtype.itemsize + 4  # value + int32 index
    sent = jnp.where(send, jnp.float32(n - 1) * valid * per_entry, jnp.float32(0.0))
    return out, self.report(self.charge(sent, ctx))


class ContributorAllGather(MessageAllGather):
  """All-gather of chunked sparse messages decoded as the mean over the workers that sent
  each coefficient (DeMo: bloc97/DeMo ``demo.py``, ``CompressDCT.batch_decompress``:
  ``scatter_reduce_(reduce="mean", include_self=False)`` over the concatenated messages;
  SparseLoCo likewise), not a sum divided by ``n``.

  Args:
    n, axis_name, key, weighted: as :class:`MessageAllGather` (default key
      ``"contributor_allgather"``).
    index_bytes: bytes of one index in the reference's message (8: torch.topk's int64).
    value_bits: bits of one value in the reference's message (32: float32).
  """

  default_key = "contributor_allgather"

  def __init__(self, n=None, axis_name: Any = AXIS, key: Optional[str] = None,
               weighted: bool = False, index_bytes: float = 8, value_bits: float = 32):
    super().__init__(n, axis_name, key, weighted)
    self.index_bytes, self.value_bits = float(index_bytes), float(value_bits)

  def contributor_mean(self, messages: list, ctx, extra_bytes=0.0):
    """``(means, report)``: for each ``(indices, values, shape)`` of ``messages`` (indices
    and values ``[..., k]`` into the last axis of a ``shape`` array), the dense array whose
    entry is the mean of the values the live workers sent for it (0 where none sent).
    Bytes: ``(n - 1)`` times this worker's message, ``k (index_bytes + value_bits / 8)`` per
    chunk plus ``extra_bytes`` (e.g. per-chunk scales)."""
    n = collectives.axis_size(self.axis_name)
    up = self.live(ctx).astype(jnp.float32)
    out, entries = [], 0
    for idx, val, shape in messages:
      like = jnp.zeros(shape, jnp.float32)
      total = lax.psum(up * collectives.scatter_last(idx, val.astype(jnp.float32), like), self.axis_name)
      count = lax.psum(up * collectives.scatter_last(idx, jnp.ones(val.shape, jnp.float32),
                                                            like),
                       self.axis_name)
      out.append(jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0))
      entries += int(np.prod(idx.shape))
    per_worker = entries * (self.index_bytes + self.value_bits / 8.0) + extra_bytes
    sent = jnp.float32(n - 1) * jnp.asarray(per_worker, jnp.float32)
    return out, self.report(self.charge(sent, ctx))
