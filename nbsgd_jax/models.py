"""Flax (linen) models for image classification.

Every model maps images ``[B, H, W, C]`` (float32, scaled to [0, 1]) to logits
``[B, num_classes]``. Parameters are a plain pytree, so a stack of per-worker models is the
same pytree with a leading worker axis ``[n, ...]`` on every leaf.

* ``"logreg"``: multinomial logistic regression (one dense layer).
* ``"mlp"``: ReLU multi-layer perceptron, hidden sizes ``(256,)`` by default.
* ``"cnn"``: LeNet-style CNN (LeCun et al. 1998, "Gradient-based learning applied to document
  recognition", LeNet-5): 5x5 conv (6) - max-pool - 5x5 conv (16) - max-pool - dense 120 -
  dense 84 - logits. Channel counts are configurable.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp


class LogisticRegression(nn.Module):
  """Multinomial logistic regression: ``logits = W vec(x) + b``."""

  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class MLP(nn.Module):
  """Fully connected ReLU network with the given hidden sizes."""

  num_classes: int = 10
  hidden: Sequence[int] = (256,)

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
  """LeNet-style convolutional network (LeNet-5 layout with ReLU and max-pooling)."""

  num_classes: int = 10
  channels: Sequence[int] = (6, 16)
  hidden: Sequence[int] = (120, 84)

  @nn.compact
  def __call__(self, x):
    c1, c2 = self.channels
    x = nn.relu(nn.Conv(c1, (5, 5), padding="SAME")(x))
    x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = nn.relu(nn.Conv(c2, (5, 5), padding="VALID")(x))
    x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


MODELS = ("logreg", "mlp", "cnn")


def make_model(name: str, num_classes: int, mlp_hidden: Sequence[int] = (256,),
               cnn_channels: Sequence[int] = (6, 16)) -> nn.Module:
  """Build a model by name (``config.model``).

  Args:
    name: one of ``MODELS``.
    num_classes: number of output logits.
    mlp_hidden: hidden layer sizes of ``"mlp"``.
    cnn_channels: the two convolution widths of ``"cnn"``.

  Raises:
    ValueError: unknown name.
  """
  if name == "logreg":
    return LogisticRegression(num_classes=num_classes)
  if name == "mlp":
    return MLP(num_classes=num_classes, hidden=tuple(mlp_hidden))
  if name == "cnn":
    if len(cnn_channels) != 2:
      raise ValueError(f"cnn_channels={tuple(cnn_channels)!r} is not allowed: give two widths")
    return CNN(num_classes=num_classes, channels=tuple(cnn_channels))
  raise ValueError(f"model={name!r} is not allowed: use one of {list(MODELS)}")


def num_params(params) -> int:
  """Number of scalars in a parameter pytree (one worker's model)."""
  import jax
  return int(sum(jnp.size(x) for x in jax.tree.leaves(params)))
