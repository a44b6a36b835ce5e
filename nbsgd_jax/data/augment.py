"""On-device image augmentation for CIFAR-style training: random crop, flip, normalisation.

Everything here is pure JAX on a batch ``[B, H, W, C]`` and a PRNG key, so it runs inside
``jax.jit``, ``jax.vmap`` over a worker axis (one key per worker) and ``jax.shard_map``.
Images are in pixel units, ``[0, 255]``: uint8 as loaded by :func:`nbsgd_jax.data.load_dataset`,
or any real dtype holding the same values.

The standard CIFAR training pipeline (He et al. 2016, "Deep residual learning for image
recognition", Sec. 4.2; torchvision ``RandomCrop(32, padding=4)``,
``RandomHorizontalFlip()``, ``Normalize(mean, std)``):

1. :func:`random_crop`: zero-pad ``p`` pixels on each side of ``H`` and ``W`` and crop back
   ``H x W`` at an offset ``(dy, dx)`` drawn uniformly from ``{0, ..., 2p}^2``, independently
   per example (``p = 0``: the identity).
2. :func:`random_flip`: mirror the width axis with probability 0.5, independently per example.
3. :func:`normalize`: ``(x / 255 - mean_c) / std_c`` per channel ``c``, float32.

The random draws are exposed as :func:`draw_crop_flip` so that a test or a host-side
reference can reproduce a batch exactly. :func:`make_augment` composes the three steps into
``(key, images) -> float32 images``; ``make_augment(0, False, mean, std)`` is plain
normalisation (the evaluation transform).

Channel statistics (:data:`CHANNEL_STATS`) are the ones used by EPFL's LocalSGD code (Lin,
Stich, Patel & Jaggi 2020, "Don't use large mini-batches, use local SGD", public code
``epfml/LocalSGD-Code``, ``distributed_code/pcode/datasets/prepare_data.py``, ``_get_cifar``,
commit 3d4811d), which are also those of the widely used ``kuangliu/pytorch-cifar`` recipe:

* CIFAR-10: mean ``(0.4914, 0.4822, 0.4465)``, std ``(0.2023, 0.1994, 0.2010)``.
* CIFAR-100: mean ``(0.5071, 0.4867, 0.4408)``, std ``(0.2675, 0.2565, 0.2761)``.

The CIFAR-10 "std" of that recipe is not the per-channel standard deviation of the training
pixels (which is about ``(0.2470, 0.2435, 0.2616)``); it is kept for parity with the baselines
that use it. Order of the RGB channels: as stored by TFDS (R, G, B).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from jax import lax

from nbsgd_jax.core import checks

Array = jax.Array
Augment = Callable[[Array, Array], Array]

CIFAR_CROP_PADDING = 4


class ChannelStats(NamedTuple):
  """Per-channel normalisation statistics, in units of ``pixel / 255`` (i.e. in ``[0, 1]``).

  Attributes:
    mean: ``C`` channel means.
    std: ``C`` channel standard deviations, each ``> 0``.
  """

  mean: tuple[float, ...]
  std: tuple[float, ...]


CIFAR10_STATS = ChannelStats(mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010))
CIFAR100_STATS = ChannelStats(mean=(0.5071, 0.4867, 0.4408), std=(0.2675, 0.2565, 0.2761))

# Keyed by the data set name given to nbsgd_jax.data.load_dataset.
# Source: epfml/LocalSGD-Code, distributed_code/pcode/datasets/prepare_data.py (_get_cifar).
CHANNEL_STATS: dict[str, ChannelStats] = {
    "cifar10": CIFAR10_STATS,
    "cifar100": CIFAR100_STATS,
    "tfds:cifar10": CIFAR10_STATS,
    "tfds:cifar100": CIFAR100_STATS,
}
STATS_CHOICES = ("auto", "data", "cifar10", "cifar100")  # config.augment.stats


class CropFlip(NamedTuple):
  """One batch's random augmentation draws.

  Attributes:
    offsets: int32 ``[B, 2]``, ``(dy, dx)`` in ``[0, 2 * crop_padding]``: the top-left corner
      of the ``H x W`` crop in the zero-padded ``[H + 2p, W + 2p]`` image. ``dy = dx = p`` is
      the un-shifted image.
    flips: bool ``[B]``: ``True`` where the example's width axis is reversed.
  """

  offsets: Array
  flips: Array


# ------------------------------------------------------------------------------ checks


_check_int = checks.index_at_least


def _check_bool(name: str, value: Any) -> bool:
  if not isinstance(value, bool):
    raise ValueError(f"{name}={value!r} is not allowed: it must be True or False")
  return value


def _check_stats(mean: Any, std: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
  out = []
  for field, values, positive in (("mean", mean, False), ("std", std, True)):
    try:
      floats = tuple(float(v) for v in values)
    except (TypeError, ValueError):
      floats = ()
    ok = bool(floats) and all(math.isfinite(v) and (v > 0 or not positive) for v in floats)
    if not ok:
      allowed = "finite numbers > 0" if positive else "finite numbers"
      raise ValueError(
          f"{field}={values!r} is not allowed: it must be a non-empty sequence of {allowed}, "
          f"one per channel"
      )
    out.append(floats)
  if len(out[0]) != len(out[1]):
    raise ValueError(
        f"mean={mean!r} and std={std!r} are not allowed together: they must have the same "
        f"length (one entry per channel)"
    )
  return out[0], out[1]


def _check_images(images: Any) -> Array:
  x = jnp.asarray(images)
  if x.ndim != 4:
    raise ValueError(
        f"images with shape {x.shape} is not allowed: images must be a batch [B, H, W, C]"
    )
  if not (jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating)):
    raise ValueError(
        f"images with dtype {x.dtype} is not allowed: images must be an integer (e.g. uint8) "
        f"or floating array in pixel units [0, 255]"
    )
  return x


def data_stats(images) -> ChannelStats:
  """The per-channel mean and standard deviation of ``images`` (uint8 ``[N, H, W, C]``, pixel
  units), in ``[0, 1]`` units: ``config.augment.stats="data"``, and ``"auto"`` for a data set
  without published statistics (an image folder).

  Raises:
    ValueError: ``images`` is not ``[N, H, W, C]`` with ``N >= 1``.

  Source: none (the mean and population standard deviation over every pixel of a channel).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  x = np.asarray(images)
  if x.ndim != 4 or x.shape[0] == 0:
    raise ValueError(f"images with shape {x.shape} is not allowed: they must be [N, H, W, C] "
                     f"with N >= 1")
  flat = x.reshape(-1, x.shape[-1])
  mean = np.zeros(x.shape[-1])
  sq = np.zeros(x.shape[-1])
  for start in range(0, flat.shape[0], 1 << 20):  # float64 sums, a chunk at a time
    chunk = flat[start:start + (1 << 20)].astype(np.float64) / 255.0
    mean += chunk.sum(0)
    sq += (chunk * chunk).sum(0)
  mean /= flat.shape[0]
  std = np.sqrt(np.maximum(sq / flat.shape[0] - mean * mean, 0.0))
  std = np.where(std > 0, std, 1.0)  # a constant channel is only centred
  return ChannelStats(tuple(float(m) for m in mean), tuple(float(s) for s in std))


def channel_stats(name: str) -> ChannelStats:
  """The normalisation statistics of a data set.

  Args:
    name: a key of :data:`CHANNEL_STATS`: ``"cifar10"``, ``"cifar100"``, ``"tfds:cifar10"``
      or ``"tfds:cifar100"``.

  Returns:
    The :class:`ChannelStats` (RGB means and stds in ``[0, 1]`` units).

  Raises:
    ValueError: ``name`` has no statistics here.

  Source: epfml/LocalSGD-Code, ``distributed_code/pcode/datasets/prepare_data.py``.
  """
  try:
    return CHANNEL_STATS[name]
  except (KeyError, TypeError):
    raise ValueError(
        f"dataset={name!r} has no channel statistics: use one of {sorted(CHANNEL_STATS)} or "
        f"pass mean and std explicitly"
    ) from None


# ------------------------------------------------------------------------------ draws


def draw_crop_flip(key: Array, batch_size: int, crop_padding: int, flip: bool) -> CropFlip:
  """Draws the per-example crop offsets and flips of one batch.

  Args:
    key: a PRNG key (``jax.random.key`` or the raw uint32 ``[2]`` form); it is split in two,
      one half for the offsets and one for the flips.
    batch_size: ``B >= 0`` (static).
    crop_padding: ``p >= 0`` (static): offsets are uniform on ``{0, ..., 2p}``, independently
      per example and per axis; ``p = 0`` gives all-zero offsets.
    flip: (static) ``True``: each example is flipped with probability 0.5, independently;
      ``False``: no flips.

  Returns:
    A :class:`CropFlip`: ``offsets`` int32 ``[B, 2]`` (``(dy, dx)``), ``flips`` bool ``[B]``.

  Raises:
    ValueError: ``batch_size`` or ``crop_padding`` is not an integer ``>= 0``; ``flip`` is
      not a bool.

  Source: the draws of torchvision ``RandomCrop(size, padding=p)`` and
  ``RandomHorizontalFlip(0.5)``, batched.
  """
  b = _check_int("batch_size", batch_size, 0)
  p = _check_int("crop_padding", crop_padding, 0)
  flip = _check_bool("flip", flip)
  key_crop, key_flip = jax.random.split(key)
  if p > 0:
    offsets = jax.random.randint(key_crop, (b, 2), 0, 2 * p + 1, dtype=jnp.int32)
  else:
    offsets = jnp.zeros((b, 2), jnp.int32)
  if flip:
    flips = jax.random.bernoulli(key_flip, 0.5, (b,))
  else:
    flips = jnp.zeros((b,), jnp.bool_)
  return CropFlip(offsets=offsets, flips=flips)


# ------------------------------------------------------------------------------ ops


def random_crop(images: Array, offsets: Array, crop_padding: int) -> Array:
  """Zero-pads each image by ``p`` pixels and crops it back at its own offset.

  Args:
    images: ``[B, H, W, C]``, any dtype (kept).
    offsets: integer ``[B, 2]``, ``(dy, dx)`` in ``[0, 2p]`` (e.g. from
      :func:`draw_crop_flip`); values outside are clamped into range by
      ``lax.dynamic_slice``.
    crop_padding: ``p >= 0`` (static).

  Returns:
    ``[B, H, W, C]`` of the input dtype: ``out[b, i, j] = padded[b, dy_b + i, dx_b + j]`` with
    ``padded[b, i, j] = images[b, i - p, j - p]`` inside the image and 0 outside.

  Raises:
    ValueError: ``images`` is not ``[B, H, W, C]``; ``offsets`` is not ``[B, 2]`` integer;
      ``crop_padding`` is not an integer ``>= 0``.

  Source: torchvision ``RandomCrop(size, padding=p)`` (constant fill 0); one batched gather
  (``jax.vmap`` of ``lax.dynamic_slice``), no per-example Python loop.
  """
  x = _check_images(images)
  p = _check_int("crop_padding", crop_padding, 0)
  off = jnp.asarray(offsets)
  if off.shape != (x.shape[0], 2) or not jnp.issubdtype(off.dtype, jnp.integer):
    raise ValueError(
        f"offsets with shape {off.shape} and dtype {off.dtype} is not allowed: offsets must be "
        f"integer [B, 2] = [{x.shape[0]}, 2]"
    )
  if p == 0:
    return x
  _, h, w, c = x.shape
  padded = jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
  zero = jnp.zeros((), off.dtype)

  def crop_one(image: Array, o: Array) -> Array:
    return lax.dynamic_slice(image, (o[0], o[1], zero), (h, w, c))

  return jax.vmap(crop_one)(padded, off)


def random_flip(images: Array, flips: Array) -> Array:
  """Mirrors the width axis of the examples whose flag is set.

  Args:
    images: ``[B, H, W, C]``, any dtype (kept).
    flips: bool ``[B]``.

  Returns:
    ``[B, H, W, C]``: ``images[b, :, ::-1]`` where ``flips[b]``, else ``images[b]``.

  Raises:
    ValueError: ``images`` is not ``[B, H, W, C]`` or ``flips`` is not bool ``[B]``.

  Source: torchvision ``RandomHorizontalFlip``.
  """
  x = _check_images(images)
  f = jnp.asarray(flips)
  if f.shape != (x.shape[0],) or f.dtype != jnp.bool_:
    raise ValueError(
        f"flips with shape {f.shape} and dtype {f.dtype} is not allowed: flips must be bool "
        f"[B] = [{x.shape[0]}]"
    )
  return jnp.where(f[:, None, None, None], x[:, :, ::-1, :], x)


def normalize(images: Array, mean: Sequence[float], std: Sequence[float]) -> Array:
  """Scales pixels to ``[0, 1]`` and standardises each channel.

  Args:
    images: ``[B, H, W, C]`` in pixel units ``[0, 255]`` (uint8 or any real dtype).
    mean: ``C`` channel means in ``[0, 1]`` units (e.g. ``CHANNEL_STATS[name].mean``).
    std: ``C`` channel stds in ``[0, 1]`` units, each ``> 0``.

  Returns:
    float32 ``[B, H, W, C]``: ``(images / 255 - mean[c]) / std[c]``.

  Raises:
    ValueError: ``images`` is not ``[B, H, W, C]``; ``mean`` / ``std`` are not non-empty
      finite sequences of equal length ``C`` (``std > 0``).

  Source: torchvision ``ToTensor()`` followed by ``Normalize(mean, std)``.
  """
  x = _check_images(images)
  m, s = _check_stats(mean, std)
  if x.shape[-1] != len(m):
    raise ValueError(
        f"images with {x.shape[-1]} channels (shape {x.shape}) is not allowed with mean/std of "
        f"length {len(m)}: they must have one entry per channel"
    )
  m_arr = jnp.asarray(m, jnp.float32)
  s_arr = jnp.asarray(s, jnp.float32)
  return (x.astype(jnp.float32) / 255.0 - m_arr) / s_arr


# ------------------------------------------------------------------------------ factory


def make_augment(
    crop_padding: int = CIFAR_CROP_PADDING,
    flip: bool = True,
    mean: Sequence[float] = CIFAR10_STATS.mean,
    std: Sequence[float] = CIFAR10_STATS.std,
) -> Augment:
  """Builds ``augment(key, images) -> float32 images``: crop, then flip, then normalise.

  Args:
    crop_padding: ``p >= 0``: zero padding before the random ``H x W`` crop (4 for CIFAR;
      0 disables cropping).
    flip: random horizontal flips with probability 0.5 per example.
    mean: ``C`` channel means in ``[0, 1]`` units (default: CIFAR-10).
    std: ``C`` channel stds in ``[0, 1]`` units, each ``> 0`` (default: CIFAR-10).

  Returns:
    ``augment(key, images)``: ``key`` a PRNG key, ``images`` ``[B, H, W, C]`` in pixel units
    (uint8 or real); returns float32 ``[B, H, W, C]`` equal to
    ``normalize(random_flip(random_crop(images, o, p), f), mean, std)`` with
    ``o, f = draw_crop_flip(key, B, p, flip)``. Pure and jit-able; map it over workers with
    ``jax.vmap(augment)(keys [n, ...], images [n, B, H, W, C])`` or call it per shard inside
    ``shard_map``. ``make_augment(0, False, mean, std)`` ignores ``key`` and is exactly
    :func:`normalize` (the evaluation transform).

  Raises:
    ValueError: at construction, a bad ``crop_padding``, ``flip``, ``mean`` or ``std``; at
      call time, ``images`` not ``[B, H, W, C]`` with ``C = len(mean)``.

  Source: the CIFAR training transform of epfml/LocalSGD-Code (``_get_cifar``: flip, crop
  with padding 4, normalise); the order of crop and flip does not change the distribution.
  """
  p = _check_int("crop_padding", crop_padding, 0)
  flip = _check_bool("flip", flip)
  m, s = _check_stats(mean, std)

  def augment(key: Array, images: Array) -> Array:
    x = _check_images(images)
    if x.shape[-1] != len(m):
      raise ValueError(
          f"images with {x.shape[-1]} channels (shape {x.shape}) is not allowed with "
          f"mean/std of length {len(m)}: they must have one entry per channel"
      )
    if p > 0 or flip:
      draws = draw_crop_flip(key, x.shape[0], p, flip)
      if p > 0:
        x = random_crop(x, draws.offsets, p)
      if flip:
        x = random_flip(x, draws.flips)
    return normalize(x, m, s)

  return augment


# ----------------------------------------------------------------------------- config


def augment_defaults() -> ml_collections.ConfigDict:
  """``config.augment.*`` with their defaults: on-device input augmentation of image batches."""
  s = ml_collections.ConfigDict()
  s.crop_padding = 0             # pixels of zero padding before a random crop back to H x W
                                 # (CIFAR recipes: 4; 0: off)
  s.flip = False                 # random horizontal flip (p = 0.5 per example)
  s.normalize = False            # per-channel (x - mean_c) / std_c with augment.stats
  s.stats = "auto"               # channel statistics of normalize: auto (the data set's
                                 # published ones for cifar10 / cifar100, else computed from
                                 # the training images) | data (computed) | cifar10 | cifar100
  return s


def check_config(cfg, errs: list) -> None:
  """augment.*: crop padding, flip, normalisation (channel statistics known for the data
  set)."""
  checks.integer(cfg, errs, "augment.crop_padding", 0, note="0: no random crop")
  checks.boolean(cfg, errs, "augment.flip")
  checks.boolean(cfg, errs, "augment.normalize")
  checks.choice(cfg, errs, "augment.stats", STATS_CHOICES)
