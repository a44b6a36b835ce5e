"""Tests for nbsgd_jax.data.augment against independent numpy references."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax.data import augment

# Values copied from epfml/LocalSGD-Code, distributed_code/pcode/datasets/prepare_data.py.
EPFL_CIFAR10 = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
EPFL_CIFAR100 = ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))


def _images(b=6, h=7, w=5, c=3, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, size=(b, h, w, c), dtype=np.uint8)


def _np_crop(images: np.ndarray, offsets: np.ndarray, p: int) -> np.ndarray:
  """Reference: explicit zero padding and slicing, one example at a time."""
  b, h, w, c = images.shape
  out = np.empty_like(images)
  for i in range(b):
    padded = np.zeros((h + 2 * p, w + 2 * p, c), images.dtype)
    padded[p:p + h, p:p + w] = images[i]
    dy, dx = int(offsets[i, 0]), int(offsets[i, 1])
    out[i] = padded[dy:dy + h, dx:dx + w]
  return out


def _np_normalize(images: np.ndarray, mean, std) -> np.ndarray:
  x = images.astype(np.float64) / 255.0
  return ((x - np.asarray(mean)) / np.asarray(std)).astype(np.float32)


def test_channel_stats_match_the_cited_recipe():
  assert augment.CHANNEL_STATS["tfds:cifar10"] == EPFL_CIFAR10
  assert augment.CHANNEL_STATS["tfds:cifar100"] == EPFL_CIFAR100
  assert augment.channel_stats("tfds:cifar100").std == EPFL_CIFAR100[1]
  with pytest.raises(ValueError, match=r"dataset='tfds:mnist'.*tfds:cifar10"):
    augment.channel_stats("tfds:mnist")


@pytest.mark.parametrize("p", [1, 2, 4])
def test_crop_matches_numpy_padding_and_slicing(p):
  x = _images()
  rng = np.random.default_rng(p)
  offsets = rng.integers(0, 2 * p + 1, size=(x.shape[0], 2)).astype(np.int32)
  offsets[0] = [0, 0]
  offsets[1] = [2 * p, 2 * p]
  offsets[2] = [p, p]  # the un-shifted image
  got = np.asarray(augment.random_crop(x, offsets, p))
  assert got.dtype == np.uint8
  np.testing.assert_array_equal(got, _np_crop(x, offsets, p))
  np.testing.assert_array_equal(got[2], x[2])
  # Corner offsets bring in exactly p rows and p columns of zeros.
  assert np.all(got[0, :p] == 0) and np.all(got[0, :, :p] == 0)
  np.testing.assert_array_equal(got[0, p:, p:], x[0, :-p, :-p])


def test_flip_is_exact_reversal():
  x = _images(seed=1)
  flips = np.array([True, False, True, True, False, False])
  got = np.asarray(augment.random_flip(x, flips))
  for i, f in enumerate(flips):
    np.testing.assert_array_equal(got[i], x[i, :, ::-1] if f else x[i])
  twice = augment.random_flip(augment.random_flip(x, flips), flips)
  np.testing.assert_array_equal(np.asarray(twice), x)


def test_padding_zero_and_no_flip_is_exactly_normalisation():
  x = _images(b=4, h=32, w=32, seed=2)
  mean, std = augment.CHANNEL_STATS["tfds:cifar10"]
  aug = augment.make_augment(0, False, mean, std)
  a = np.asarray(aug(jax.random.key(0), x))
  b = np.asarray(aug(jax.random.key(1), x))
  assert a.dtype == np.float32
  chex.assert_shape(a, x.shape)
  np.testing.assert_array_equal(a, b)  # the key is unused
  np.testing.assert_allclose(a, _np_normalize(x, mean, std), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(a, np.asarray(augment.normalize(x, mean, std)))


def test_normalize_accepts_float_pixels():
  x = _images(seed=3)
  mean, std = augment.CHANNEL_STATS["tfds:cifar100"]
  np.testing.assert_allclose(
      np.asarray(augment.normalize(x.astype(np.float32), mean, std)),
      _np_normalize(x, mean, std), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("p, flip", [(4, True), (2, False), (0, True)])
def test_make_augment_equals_reference_of_exposed_draws(p, flip):
  x = _images(b=8, h=9, w=6, seed=4)
  mean, std = augment.CHANNEL_STATS["tfds:cifar10"]
  key = jax.random.key(7)
  got = np.asarray(jax.jit(augment.make_augment(p, flip, mean, std))(key, x))
  draws = augment.draw_crop_flip(key, x.shape[0], p, flip)
  offsets, flips = np.asarray(draws.offsets), np.asarray(draws.flips)
  chex.assert_shape(offsets, (8, 2))
  chex.assert_shape(flips, (8,))
  assert offsets.dtype == np.int32 and flips.dtype == np.bool_
  ref = _np_crop(x, offsets, p) if p else x
  ref = np.stack([r[:, ::-1] if f else r for r, f in zip(ref, flips)])
  np.testing.assert_allclose(got, _np_normalize(ref, mean, std), rtol=1e-6, atol=1e-6)
  if not flip:
    assert not flips.any()
  if not p:
    assert not offsets.any()


def test_offsets_cover_range_uniformly_and_flips_are_fair():
  p, b = 4, 20000
  draws = augment.draw_crop_flip(jax.random.key(0), b, p, True)
  offsets = np.asarray(draws.offsets)
  assert offsets.min() == 0 and offsets.max() == 2 * p
  expected = b / (2 * p + 1)  # 2222.2, std of a count ~ 44.4
  for axis in range(2):
    counts = np.bincount(offsets[:, axis], minlength=2 * p + 1)
    assert counts.size == 2 * p + 1
    assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected)), counts
  # Independent axes: the correlation of dy and dx is ~ N(0, 1/b); 6 std = 0.042.
  assert abs(np.corrcoef(offsets[:, 0], offsets[:, 1])[0, 1]) < 0.042
  flips = np.asarray(draws.flips)
  assert abs(flips.mean() - 0.5) < 6 * 0.5 / np.sqrt(b)


def test_works_under_vmap_over_workers_with_different_keys():
  n, b = 3, 5
  x = np.stack([_images(b=b, h=8, w=8, seed=10 + i) for i in range(n)])  # [n, B, H, W, C]
  x[:] = x[0]  # same images on every worker: differences come from the keys only
  mean, std = augment.CHANNEL_STATS["tfds:cifar100"]
  aug = augment.make_augment(4, True, mean, std)
  keys = jax.random.split(jax.random.key(3), n)
  got = np.asarray(jax.jit(jax.vmap(aug))(keys, x))
  chex.assert_shape(got, (n, b, 8, 8, 3))
  for i in range(n):
    # jit may fuse the division differently from eager: equal up to float32 rounding.
    np.testing.assert_allclose(got[i], np.asarray(aug(keys[i], x[i])), rtol=1e-6, atol=1e-6)
  assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2])


def test_works_inside_shard_map():
  from jax.sharding import Mesh, PartitionSpec as P
  devices = np.asarray(jax.devices()[:2])
  if devices.size < 2:
    pytest.fail("tests/conftest.py sets 8 host devices; fewer than 2 are visible")
  mesh = Mesh(devices, ("workers",))
  n, b = 4, 3
  x = np.stack([_images(b=b, h=6, w=6, seed=20 + i) for i in range(n)])
  keys = jax.random.split(jax.random.key(5), n)
  aug = augment.make_augment(2, True, *augment.CHANNEL_STATS["tfds:cifar10"])

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("workers"), P("workers")),
                     out_specs=P("workers"))
  def per_shard(k, imgs):
    return jax.vmap(aug)(k, imgs)

  got = np.asarray(jax.jit(per_shard)(keys, x))
  np.testing.assert_allclose(got, np.asarray(jax.jit(jax.vmap(aug))(keys, x)), rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(crop_padding=-1), "crop_padding"),
        (dict(crop_padding=1.5), "crop_padding"),
        (dict(crop_padding=True), "crop_padding"),
        (dict(flip=1), "flip"),
        (dict(mean=()), "mean"),
        (dict(mean=(0.5, float("nan"), 0.5)), "mean"),
        (dict(std=(0.2, 0.0, 0.2)), "std"),
        (dict(std=(0.2, 0.2)), "mean=.*and std"),
    ],
)
def test_make_augment_bad_inputs(kwargs, field):
  with pytest.raises(ValueError, match=rf"{field}=.*not allowed"):
    augment.make_augment(**kwargs)


def test_bad_images_and_draws():
  aug = augment.make_augment()
  with pytest.raises(ValueError, match=r"images with shape \(4, 4, 3\) is not allowed"):
    aug(jax.random.key(0), np.zeros((4, 4, 3), np.uint8))
  with pytest.raises(ValueError, match=r"images with 1 channels.*length 3"):
    aug(jax.random.key(0), np.zeros((2, 4, 4, 1), np.uint8))
  with pytest.raises(ValueError, match=r"offsets with shape \(2,\)"):
    augment.random_crop(np.zeros((2, 4, 4, 1)), np.zeros(2, np.int32), 1)
  with pytest.raises(ValueError, match=r"flips with shape \(2,\) and dtype int32"):
    augment.random_flip(np.zeros((2, 4, 4, 1)), jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match=r"batch_size=-1 is not allowed"):
    augment.draw_crop_flip(jax.random.key(0), -1, 4, True)
