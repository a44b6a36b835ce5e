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
