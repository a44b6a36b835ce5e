"""Tests for nbsgd_jax.compression (Top-k, Gaussian-k, Random-k)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax import compression as C


def _normal(d, seed=0):
  return jax.random.normal(jax.random.key(seed), (d,), jnp.float32)


@pytest.mark.parametrize("d,density,k", [(1000, 0.001, 1), (1000, 0.01, 10),
                                         (10007, 0.01, 101), (5, 1.0, 5),
                                         (3, 1e-9, 1)])
def test_num_selected(d, density, k):
  assert C.num_selected(d, density) == k


@pytest.mark.parametrize("density", [0.0, -0.1, 1.5, float("nan"), "a"])
def test_bad_density_raises(density):
  with pytest.raises(ValueError, match="density"):
    C.num_selected(10, density)
  for name in C.COMPRESSORS:
    with pytest.raises(ValueError, match="density"):
      C.COMPRESSORS[name](_normal(10), density, jax.random.key(0))


def test_bad_inputs_raise():
  for fn in C.COMPRESSORS.values():
    with pytest.raises(ValueError, match="x must"):
      fn(jnp.ones((3, 4)), 0.5, jax.random.key(0))
    with pytest.raises(ValueError, match="x must"):
      fn(jnp.arange(10), 0.5, jax.random.key(0))
  with pytest.raises(ValueError, match="key"):
    C.random_k(_normal(10), 0.5)
  with pytest.raises(ValueError, match="capacity_factor"):
    C.gaussian_k(_normal(10), 0.5, capacity_factor=0.5)
  with pytest.raises(ValueError, match="rounds"):
    C.gaussian_k(_normal(10), 0.5, rounds=-1)
  with pytest.raises(ValueError, match="name"):
    C.make_compressor("bogus", 0.1)


@pytest.mark.parametrize("d,density", [(1000, 0.01), (10007, 0.001),
                                       (10007, 0.1)])
def test_top_k_exact(d, density):
  x = _normal(d, 1)
  k = C.num_selected(d, density)
  vals, idx = jax.jit(functools.partial(C.top_k, density=density))(x)
  chex.assert_shape((vals, idx), (k,))
  assert idx.dtype == jnp.int32
  xn = np.asarray(x)
  expected = np.argpartition(-np.abs(xn), k - 1)[:k]
  assert set(np.asarray(idx).tolist()) == set(expected.tolist())
  np.testing.assert_array_equal(np.asarray(vals), xn[np.asarray(idx)])


@pytest.mark.parametrize("d,density", [(1000, 0.01), (10007, 0.1), (50, 0.9)])
def test_random_k_distinct(d, density):
  x = _normal(d, 2)
  k = C.num_selected(d, density)
  f = jax.jit(lambda x, key: C.random_k(x, density, key))
  for seed in range(3):
    vals, idx = f(x, jax.random.key(seed))
    idx = np.asarray(idx)
    assert idx.shape == (k,) and idx.dtype == np.int32
    assert len(np.unique(idx)) == k
    assert idx.min() >= 0 and idx.max() < d
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(x)[idx])


def test_random_k_roughly_uniform():
  d, density = 20, 0.25
  f = jax.jit(jax.vmap(lambda key: C.random_k(jnp.zeros(d), density, key)[1]))
  idx = np.asarray(f(jax.random.split(jax.random.key(0), 2000)))
  freq = np.bincount(idx.ravel(), minlength=d) / idx.shape[0]
  np.testing.assert_allclose(freq, density, atol=0.05)


# every (d, density) of {1000, 10007, 100000} x {0.001, 0.01, 0.1} with k >= 3 (for k < 3 the
# band [2k/3, 4k/3] holds one integer at most, which no threshold rule can promise)
@pytest.mark.parametrize("d,density", [(d, r) for d in (1000, 10007, 100000)
                                       for r in (0.001, 0.01, 0.1)
                                       if C.num_selected(d, r) >= 3])
def test_gaussian_k_count_and_selection(d, density):
  k = C.num_selected(d, density)
  x = _normal(d, d)
  f = jax.jit(functools.partial(C.gaussian_k_with_count, density=density))
  vals, idx, count = f(x)
  cap = int(np.ceil(4 / 3 * k))
  chex.assert_shape((vals, idx), (cap,))
  count = int(count)
  assert 2 * k / 3 <= count <= 4 * k / 3
  thr, count2 = jax.jit(functools.partial(C.gaussian_threshold,
                                          density=density))(x)
  assert int(count2) == count
  xn = np.asarray(x)
  selected = np.nonzero(np.abs(xn) > float(thr))[0]
  assert len(selected) == count
  idx = np.asarray(idx)
  # Selected entries in index order, then padding d with value 0.
  np.testing.assert_array_equal(idx[:count], selected)
  np.testing.assert_array_equal(np.asarray(vals)[:count], xn[selected])
  assert np.all(idx[count:] == d) and np.all(np.asarray(vals)[count:] == 0)
  # A threshold set: it is exactly the top-`count` entries by magnitude.
  top = np.argpartition(-np.abs(xn), count - 1)[:count]
  assert set(top.tolist()) == set(selected.tolist())
  dense = C.densify(*f(x)[:2], d)
  expected = np.zeros(d, np.float32)
  expected[selected] = xn[selected]
  np.testing.assert_array_equal(np.asarray(dense), expected)


@pytest.mark.parametrize("block_size", [7, 64])
def test_gaussian_k_block_sizes_agree(block_size):
  x = _normal(10007, 3)
  ref = jax.jit(functools.partial(C.gaussian_k, density=0.01))(x)
  out = jax.jit(functools.partial(C.gaussian_k, density=0.01,
                                  block_size=block_size))(x)
  chex.assert_trees_all_equal(ref, out)


def test_gaussian_k_truncation_keeps_lowest_indices():
  d = 1000
  x = _normal(d, 4)
  # rounds=0 and a capacity of 1 x k: the first `cap` selected (by index) remain.
  vals, idx, count = C.gaussian_k_with_count(x, 0.05, rounds=0,
                                             capacity_factor=1.0)
  thr, _ = C.gaussian_threshold(x, 0.05, rounds=0)
  selected = np.nonzero(np.abs(np.asarray(x)) > float(thr))[0]
  k = C.num_selected(d, 0.05)
  assert int(count) == len(selected)
  n = min(k, len(selected))
  np.testing.assert_array_equal(np.asarray(idx)[:n], selected[:n])


def test_gaussian_k_correction_loop():
  # Heavy-tailed data: the Gaussian estimate is off, the loop corrects toward k.
  x = jax.random.t(jax.random.key(5), 1.5, (20000,))
  k = C.num_selected(20000, 0.01)
  f = jax.jit(C.gaussian_threshold, static_argnames=("density", "rounds"))
  _, c0 = f(x, density=0.01, rounds=0)
  _, c3 = f(x, density=0.01, rounds=3)
  assert abs(int(c3) - k) <= abs(int(c0) - k)


@pytest.mark.parametrize("name", sorted(C.COMPRESSORS))
def test_density_one_identity(name):
  x = _normal(257, 6)
  f = jax.jit(C.make_compressor(name, 1.0))
  vals, idx = f(x, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(C.densify(vals, idx, 257)),
                                np.asarray(x))


def test_densify_padding_and_duplicates():
  vals = jnp.array([1.0, 2.0, 3.0, 4.0])
  idx = jnp.array([0, 2, 2, 5], jnp.int32)
  np.testing.assert_array_equal(np.asarray(C.densify(vals, idx, 5)),
                                [1.0, 0.0, 5.0, 0.0, 0.0])


@pytest.mark.parametrize("name", sorted(C.COMPRESSORS))
def test_jit_and_vmap(name):
  density = 0.05
  fn = C.make_compressor(name, density)
  xs = jax.random.normal(jax.random.key(7), (3, 1000))
  keys = jax.random.split(jax.random.key(8), 3)
  vals, idx = jax.jit(jax.vmap(fn))(xs, keys)
  for i in [0, 2]:
    v1, i1 = jax.jit(fn)(xs[i], keys[i])
    np.testing.assert_array_equal(np.asarray(idx[i]), np.asarray(i1))
    np.testing.assert_allclose(np.asarray(vals[i]), np.asarray(v1))


def test_message_bytes():
  assert C.message_bytes(10) == 80.0
  assert C.message_bytes(3, value_bytes=2, index_bytes=4) == 18.0
