"""The package's MLP, LeNet CNN and ResNet-20 (``nbsgd_jax.models``) written in PyTorch for
``benchmarks/peer_pytorch.py``, with the flax parameter names as module names, and the
conversions of weights between the two layouts (flax ``Dense`` kernel ``[in, out]`` =
torch ``weight.T``; flax ``Conv`` kernel HWIO = torch OIHW permuted; BatchNorm ``scale`` =
``weight``). Inputs are NCHW; flattening goes through NHWC as flax's does. Imports torch:
an optional extra (``pip install -e ".[peers]"``), never imported by the package or tests."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
  """784-256-10 ReLU (``models.MLP``)."""

  def __init__(self, d_in: int = 784, hidden: int = 256, classes: int = 10):
    super().__init__()
    self.Dense_0, self.Dense_1 = nn.Linear(d_in, hidden), nn.Linear(hidden, classes)

  def forward(self, x):
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    return self.Dense_1(F.relu(self.Dense_0(x)))


class CNN(nn.Module):
  """LeNet-5 layout (``models.CNN``): 5x5 convolutions (SAME, VALID), ReLU, 2x2 max-pools,
  dense 120, 84, 10."""

  def __init__(self, c_in: int = 1, channels=(6, 16), classes: int = 10):
    super().__init__()
    c1, c2 = channels
    self.Conv_0, self.Conv_1 = nn.Conv2d(c_in, c1, 5, padding=2), nn.Conv2d(c1, c2, 5)
    self.Dense_0, self.Dense_1 = nn.Linear(c2 * 25, 120), nn.Linear(120, 84)
    self.Dense_2 = nn.Linear(84, classes)

  def forward(self, x):
    x = F.max_pool2d(F.relu(self.Conv_0(x)), 2)
    x = F.max_pool2d(F.relu(self.Conv_1(x)), 2)
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    return self.Dense_2(F.relu(self.Dense_1(F.relu(self.Dense_0(x)))))


class Block(nn.Module):
  """``models.BasicBlock``: two 3x3 convolutions with BatchNorm, option-A shortcut."""

  def __init__(self, c_in: int, c: int, stride: int):
    super().__init__()
    self.Conv_0 = nn.Conv2d(c_in, c, 3, stride, 1, bias=False)
    self.BatchNorm_0 = nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)
    self.Conv_1 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
    self.BatchNorm_1 = nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)
    self.stride, self.extra = stride, c - c_in

  def forward(self, x):
    y = F.relu(self.BatchNorm_0(self.Conv_0(x)))
    y = self.BatchNorm_1(self.Conv_1(y))
    if self.stride != 1 or self.extra:
      x = x[:, :, ::self.stride, ::self.stride]
      x = F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))
    return F.relu(x + y)


class ResNet20(nn.Module):
  """``models.ResNetCifar`` with 3 blocks per stage (ResNet-20), BatchNorm."""

  def __init__(self, classes: int = 10, widths=(16, 32, 64), blocks: int = 3):
    super().__init__()
    self.Conv_0 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
    self.BatchNorm_0 = nn.BatchNorm2d(widths[0], eps=1e-5, momentum=0.1)
    c_in, k = widths[0], 0
    for stage, w in enumerate(widths):
      for b in range(blocks):
        setattr(self, f"BasicBlock_{k}", Block(c_in, w, 2 if stage and not b else 1))
        c_in, k = w, k + 1
    self.blocks = k
    self.Dense_0 = nn.Linear(widths[-1], classes)

  def forward(self, x):
    x = F.relu(self.BatchNorm_0(self.Conv_0(x)))
    for k in range(self.blocks):
      x = getattr(self, f"BasicBlock_{k}")(x)
    return self.Dense_0(x.mean((2, 3)))


def build(model: str) -> nn.Module:
  """The torch module of ``model`` (``mlp``, ``cnn``, ``resnet``)."""
  return {"mlp": MLP, "cnn": CNN, "resnet": ResNet20}[model]()


def _to_torch(path: tuple, a: np.ndarray) -> np.ndarray:
  """One flax leaf (unstacked) in torch's layout."""
  if path[-1] == "kernel":
    return a.T if a.ndim == 2 else np.transpose(a, (3, 2, 0, 1))
  return a


def _torch_name(path: tuple) -> str:
  leaf = {"kernel": "weight", "scale": "weight", "bias": "bias"}[path[-1]]
  return ".".join(path[:-1] + (leaf,))


def _leaves(tree: dict, prefix: tuple = ()):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _leaves(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def load(model: str, module: nn.Module, params: dict) -> None:
  """Copy one worker's flax ``params`` into ``module``.

  Raises:
    KeyError: a flax parameter without a torch counterpart; ValueError: a shape mismatch.
  """
  named = dict(module.named_parameters())
  seen = set()
  with torch.no_grad():
    for path, a in _leaves(params):
      name = _torch_name(path)
      t = torch.from_numpy(np.ascontiguousarray(_to_torch(path, np.asarray(a))))
      if named[name].shape != t.shape:
        raise ValueError(f"{model}: {name} is {tuple(named[name].shape)}, flax gives "
                         f"{tuple(t.shape)}")
      named[name].copy_(t)
      seen.add(name)
  if seen != set(named):
    raise KeyError(f"{model}: torch parameters without flax values: {set(named) - seen}")


def to_flax(model: str, stacked: dict) -> dict:
  """Worker-stacked torch parameters ``{name: [n, ...]}`` as the flax tree ``[n, ...]``."""
  out: dict = {}
  for name, a in stacked.items():
    *mods, leaf = name.split(".")
    node = out
    for m in mods:
      node = node.setdefault(m, {})
    if leaf == "weight" and a.ndim == 3:  # Dense
      node["kernel"] = np.swapaxes(a, 1, 2)
    elif leaf == "weight" and a.ndim == 5:  # Conv: [n, O, I, H, W] -> [n, H, W, I, O]
      node["kernel"] = np.transpose(a, (0, 3, 4, 2, 1))
    elif leaf == "weight":  # BatchNorm
      node["scale"] = a
    else:
      node["bias"] = a
  return out
