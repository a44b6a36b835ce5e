"""The codec type: a compressor with the bytes of its encoding (:mod:`nbsgd_jax.codecs`)."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax

Array = jax.Array


class Codec(NamedTuple):
  """A compressor and the bytes of its encoding.

  Attributes:
    name: the config name (``compression.name``).
    compress: ``(x [d], key) -> (C(x) [d], num_bytes)``: what the receivers decode (dtype of
      ``x``) and the float32 bytes of the encoded message.
    sparse: the ``(x [d], key) -> (values [cap], indices [cap])`` form of a sparse codec (the
      sparse all-gather sends it), else None.
  """

  name: str
  compress: Callable[[Array, Optional[Array]], tuple[Array, Array]]
  sparse: Optional[Callable] = None
