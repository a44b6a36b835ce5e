"""Tests for nbsgd_jax.codecs.sparse (Top-k, Gaussian-k, Random-k)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from nbsgd_jax import codecs
from nbsgd_jax.codecs import sparse as C


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
      C.COMPRESSORS[name](_normal(10), jax.random.key(0), density=density)


def test_bad_inputs_raise():
  for fn in C.COMPRESSORS.values():
    with pytest.raises(ValueError, match="x must"):
      fn(jnp.ones((3, 4)), jax.random.key(0), density=0.5)
    with pytest.raises(ValueError, match="x must"):
      fn(jnp.arange(10), jax.random.key(0), density=0.5)
  with pytest.raises(ValueError, match="key"):
    C.random_k(_normal(10), density=0.5)
  with pytest.raises(ValueError, match="capacity_factor"):
    C.gaussian_k(_normal(10), density=0.5, capacity_factor=0.5)
  with pytest.raises(ValueError, match="rounds"):
    C.gaussian_k(_normal(10), density=0.5, rounds=-1)
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
  f = jax.jit(lambda x, key: C.random_k(x, key, density=density))
  for seed in range(3):
    vals, idx = f(x, jax.random.key(seed))
    idx = np.asarray(idx)
    assert idx.shape == (k,) and idx.dtype == np.int32
    assert len(np.unique(idx)) == k
    assert idx.min() >= 0 and idx.max() < d
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(x)[idx])


@pytest.mark.slow
def test_random_k_roughly_uniform():
  d, density = 20, 0.25
  f = jax.jit(jax.vmap(lambda key: C.random_k(jnp.zeros(d), key, density=density)[1]))
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


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [7, 64])
def test_gaussian_k_block_sizes_agree(block_size):
  x = _normal(10007, 3)
  ref = jax.jit(functools.partial(C.gaussian_k, density=0.01))(x)
  out = jax.jit(functools.partial(C.gaussian_k, density=0.01,
                                  block_size=block_size))(x)
  chex.assert_trees_all_equal(ref, out)


@pytest.mark.slow
def test_gaussian_k_truncation_keeps_lowest_indices():
  d = 1000
  x = _normal(d, 4)
  # rounds=0 and a capacity of 1 x k: the first `cap` selected (by index) remain.
  vals, idx, count = C.gaussian_k_with_count(x, density=0.05, rounds=0,
                                             capacity_factor=1.0)
  thr, _ = C.gaussian_threshold(x, 0.05, rounds=0)
  selected = np.nonzero(np.abs(np.asarray(x)) > float(thr))[0]
  k = C.num_selected(d, 0.05)
  assert int(count) == len(selected)
  n = min(k, len(selected))
  np.testing.assert_array_equal(np.asarray(idx)[:n], selected[:n])


@pytest.mark.slow
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


@pytest.mark.slow
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


def _threshold_reference(x, density, rounds):
  """numpy: the bracket correction loop (the project's own design) from gaussian_threshold's
  initial (rounds=0) estimate, checked against the formula in test_gaussian_bracket_initial_."""
  d = x.shape[0]
  k = C.num_selected(d, density)
  t, _ = C.gaussian_threshold(jnp.asarray(x), density, rounds=0)
  t = np.float32(t)
  a = np.abs(x)
  lo, hi = -np.inf, np.inf
  count = lambda t: int(np.sum(a > t))
  n = count(t)
  for _ in range(rounds):
    if 2 * k <= 3 * n <= 4 * k:
      break
    few = 3 * n < 2 * k
    nxt = np.float32(t * (0.5 if few else 1.5))
    if few:
      hi = min(hi, t)
    else:
      lo = max(lo, t)
    if lo > -np.inf and hi < np.inf:
      nxt = np.float32(np.sqrt(np.float32(lo) * np.float32(hi))) if lo > 0 else np.float32(0.5 * hi)
    t = nxt
    n = count(t)
  return t, n


def _gaussian_compressor_reference(tensor, ratio, loop_bound=3):
  """hclhkbu/GaussianK-SGD compression.py, ``GaussianCompressor.compress`` (``loops < 3``;
  ``GaussianCompressor2``: 5) in numpy: statistics as python floats in float64 (torch.std is
  unbiased), utils.gen_threshold_from_normal_distribution(1 - ratio, mean, std)'s right
  threshold, and the selection of the last threshold evaluated in the loop.

  Returns (indexes, that threshold, k).
  """
  numel = tensor.size
  k = max(int(numel * ratio), 1)
  t64 = np.asarray(tensor, np.float64)
  std = float(np.std(t64, ddof=1))
  mean = float(np.mean(t64))
  p_value = 1 - ratio
  zvalue = scipy.stats.norm.ppf((1 - p_value) / 2)
  left_thres, right_thres = mean + zvalue * std, mean - zvalue * std
  del left_thres
  abs_tensor = np.abs(t64)
  loops = 0
  while loops < loop_bound:
    evaluated = right_thres
    indexes = np.nonzero(abs_tensor > right_thres)[0]
    if indexes.size < 2 * k / 3:
      right_thres *= 0.5
    elif indexes.size > 4 * k / 3:
      right_thres *= 1.5
    else:
      break
    loops += 1
  return indexes, evaluated, k


def _reference_vectors(n=48, seed=17):
  """n heavy-tailed float32 vectors with d in [2000, 1e5], density in [0.001, 0.05] and
  d * density >= 10: Student-t (df 1.5 .. 3), lognormal x random sign, error-fed-like
  p = g + e (small normal g plus a Student-t residual on 30% of the coordinates), and a
  Student-t shifted off zero mean, in turn."""
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < n:
    d = int(rng.choice([2000, 5000, 10007, 30000, 100000]))
    density = float(rng.choice([0.001, 0.002, 0.005, 0.01, 0.02, 0.05]))
    if d * density < 10:
      continue
    kind = len(out) % 4
    if kind == 0:
      x = rng.standard_t(rng.uniform(1.5, 3.0), d)
    elif kind == 1:
      x = rng.lognormal(0.0, rng.uniform(1.0, 2.5), d) * rng.choice([-1.0, 1.0], d)
    elif kind == 2:
      g = rng.standard_normal(d) * 0.01
      e = rng.standard_t(2.0, d) * 0.05 * (rng.random(d) < 0.3)
      x = g + e
    else:
      x = rng.standard_t(2.5, d) + rng.uniform(-1.0, 1.0)
    out.append((x.astype(np.float32), density))
  return out


_THRESHOLD = jax.jit(C.gaussian_threshold, static_argnames=("density", "rounds", "correction"))


@pytest.mark.long  # 14 s; the paper's selection: test_gaussian_k_paper_selects_the_reference_...
def test_gaussian_paper_is_the_reference_loop():
  # float32 as in training: the same count on every vector, thr to float32 rounding (the
  # statistics in float32; measured max relative difference 1.5e-7 on these vectors).
  in_band = {"paper": 0, "bracket": 0}
  vectors = _reference_vectors()
  for i, (x, density) in enumerate(vectors):
    ref_idx, ref_thr, k_ref = _gaussian_compressor_reference(x, density)
    thr, count = _THRESHOLD(jnp.asarray(x), density=density, rounds=3, correction="paper")
    assert int(count) == ref_idx.size, (i, int(count), ref_idx.size)
    np.testing.assert_allclose(float(thr), ref_thr, rtol=1e-6)
    in_band["paper"] += 2 * k_ref <= 3 * ref_idx.size <= 4 * k_ref
    k = C.num_selected(x.size, density)
    _, n_bracket = _THRESHOLD(jnp.asarray(x), density=density, rounds=8, correction="bracket")
    in_band["bracket"] += 2 * k <= 3 * int(n_bracket) <= 4 * k
  # The reference's fixed steps miss [2k/3, 4k/3] on some of these; bisection does not.
  assert in_band == {"paper": 37, "bracket": len(vectors)}, in_band


@pytest.mark.long
def test_gaussian_paper_is_the_reference_loop_in_float64():
  with jax.enable_x64(True):
    for i, (x, density) in enumerate(_reference_vectors(n=16, seed=3)):
      for bound in (1, 3, 5):  # 5: GaussianCompressor2
        ref_idx, ref_thr, _ = _gaussian_compressor_reference(x, density, bound)
        thr, count = _THRESHOLD(jnp.asarray(x, jnp.float64), density=density, rounds=bound,
                                correction="paper")
        assert thr.dtype == jnp.float64
        assert int(count) == ref_idx.size, (i, bound)
        np.testing.assert_allclose(float(thr), ref_thr, rtol=1e-12)


@pytest.mark.slow
def test_gaussian_k_paper_selects_the_reference_indexes():
  """The paper mode sends exactly the reference loop's index set, also where the loop ends
  above 4k/3 (a fixed ceil(4k/3) capacity used to drop the largest indices there)."""
  f = jax.jit(C.gaussian_k_with_count, static_argnames=("density", "rounds", "correction"))
  above = 0
  for x, density in _reference_vectors():
    ref_idx, _, k_ref = _gaussian_compressor_reference(x, density)
    vals, idx, count = f(jnp.asarray(x), density=density, rounds=3, correction="paper")
    assert int(count) == ref_idx.size
    idx, vals = np.asarray(idx), np.asarray(vals)
    sent = idx < x.size
    np.testing.assert_array_equal(idx[sent], ref_idx)
    np.testing.assert_array_equal(vals[sent], x[ref_idx])
    assert np.all(vals[~sent] == 0)
    above += 3 * ref_idx.size > 4 * k_ref
  assert above == 10, above  # of the 11 that end outside the band, 10 above it


@pytest.mark.slow
def test_gaussian_k_paper_on_a_t15_vector_sends_the_whole_selection():
  x = np.random.default_rng(8).standard_t(1.5, 30000).astype(np.float32)  # 61 for k = 30
  ref_idx, _, k_ref = _gaussian_compressor_reference(x, 0.001)
  assert 3 * ref_idx.size > 4 * k_ref  # the loop ends above the band: more than ceil(4k/3)
  codec = codecs.make_codec("gaussian_k", density=0.001, gaussian_correction="paper",
                           gaussian_rounds=3)
  dense, nbytes = codec.compress(jnp.asarray(x), None)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(dense)), ref_idx)
  assert float(nbytes) == ref_idx.size * 8  # (float32 value, int32 index) per sent entry


def test_gaussian_rounds_defaults_and_paper_bounds():
  """A user who leaves ``rounds`` unset gets the released code's loop (paper: ``loops < 3``
  in hclhkbu/GaussianK-SGD compression.py) and the bracket's 8 rounds: the default call
  against the numpy references, not against ``default_rounds`` (the function that sets the
  default). On this vector the paper loop selects 98, 66, 41 entries after 2, 3, 4 rounds, so
  a default off by one fails."""
  y = _heavy_tailed(1)
  ref_idx, ref_thr, _ = _gaussian_compressor_reference(y, 0.001)  # loops < 3
  assert ref_idx.size == 66 and {_gaussian_compressor_reference(y, 0.001, n)[0].size
                                 for n in (2, 4)} == {98, 41}
  thr, count = C.gaussian_threshold(jnp.asarray(y), 0.001, correction="paper")
  assert int(count) == ref_idx.size
  np.testing.assert_allclose(float(thr), ref_thr, rtol=1e-6)
  ref_t, ref_n = _threshold_reference(y, 0.001, 8)
  thr, count = C.gaussian_threshold(jnp.asarray(y), 0.001, correction="bracket")
  assert int(count) == ref_n
  np.testing.assert_allclose(float(thr), ref_t, rtol=1e-6)
  x = jnp.asarray(_heavy_tailed(2))
  with pytest.raises(ValueError, match="rounds=0 is not allowed with correction='paper'"):
    C.gaussian_threshold(x, 0.01, rounds=0, correction="paper")
  with pytest.raises(ValueError, match="rounds=0 is not allowed with correction='paper'"):
    C.gaussian_k(x, density=1.0, rounds=0, correction="paper")
  # paper rounds=1 evaluates only the initial threshold: the reference with `loops < 1`
  ref_idx, ref_thr, _ = _gaussian_compressor_reference(np.asarray(x), 0.01, 1)
  thr, count = C.gaussian_threshold(x, 0.01, rounds=1, correction="paper")
  assert int(count) == ref_idx.size
  np.testing.assert_allclose(float(thr), ref_thr, rtol=1e-6)


def _heavy_tailed(seed, d=20000):
  """Student-t (df 1.2 .. 3) scaled, with a sprinkle of large outliers: error-fed-like."""
  rng = np.random.default_rng(seed)
  x = rng.standard_t(1.2 + 0.6 * (seed % 4), d).astype(np.float32)
  x[rng.integers(0, d, d // 200)] *= 30
  return x


def test_gaussian_bracket_initial_threshold_is_the_gaussian_formula():
  # bracket starts from mean + |Phi^-1(density / 2)| * (population) std
  for seed in range(4):
    x = _heavy_tailed(seed)
    thr, _ = C.gaussian_threshold(jnp.asarray(x), 0.01, rounds=0)
    x64 = x.astype(np.float64)
    expected = x64.mean() + abs(scipy.stats.norm.ppf(0.005)) * x64.std()
    np.testing.assert_allclose(float(thr), expected, rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_gaussian_bracket_matches_numpy_loop(seed):
  x = _heavy_tailed(seed)
  for rounds in (1, 3, 8):
    thr, count = _THRESHOLD(jnp.asarray(x), density=0.01, rounds=rounds, correction="bracket")
    ref_t, ref_n = _threshold_reference(x, 0.01, rounds)
    assert int(count) == ref_n, (rounds, int(count), ref_n)
    np.testing.assert_allclose(float(thr), float(ref_t), rtol=1e-6)


def test_gaussian_bracket_lands_in_band_on_heavy_tails():
  for seed in range(8):
    x = jnp.asarray(_heavy_tailed(seed))
    for density in (0.001, 0.01):
      k = C.num_selected(x.shape[0], density)
      _, n = _THRESHOLD(x, density=density, rounds=8, correction="bracket")
      assert 2 * k <= 3 * int(n) <= 4 * k, (seed, density, int(n), k)


def test_gaussian_bad_correction_and_make_compressor_options():
  with pytest.raises(ValueError, match="correction='newton'"):
    C.gaussian_threshold(_normal(100), 0.1, correction="newton")
  fn = C.make_compressor("gaussian_k", 0.01, rounds=1, correction="paper")
  x = jnp.asarray(_heavy_tailed(1))
  np.testing.assert_array_equal(
      np.asarray(fn(x)[1]),
      np.asarray(C.gaussian_k(x, density=0.01, rounds=1, correction="paper")[1]))
  with pytest.raises(ValueError, match="rounds"):
    C.make_compressor("top_k", 0.01, rounds=3)


def _spiky(seed, d=20000):
  """Small normal noise plus a few dozen spikes: the count jumps as the threshold moves."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(d).astype(np.float32) * np.float32(0.01)
  m = rng.integers(5, 400)
  x[rng.choice(d, m, replace=False)] = (rng.choice([-1, 1], m) * rng.uniform(0.5, 1.5, m).astype(
      np.float32) * np.float32(rng.uniform(0.05, 0.3)))
  return jnp.asarray(x)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 17, 18])
def test_gaussian_paper_steps_miss_the_band_where_bracket_lands(seed):
  # The reference's fixed x0.5 / x1.5 steps (3 evaluated thresholds) end outside
  # [2k/3, 4k/3] on these vectors (found by a search over seeds 0..199 of _spiky: 25 of
  # 200); bisection between bracketing thresholds (8 corrections) lands.
  x = _spiky(seed)
  k = C.num_selected(x.shape[0], 0.01)
  ref_idx, _, k_ref = _gaussian_compressor_reference(np.asarray(x), 0.01)
  _, n_paper = _THRESHOLD(x, density=0.01, correction="paper")
  _, n_bracket = _THRESHOLD(x, density=0.01, correction="bracket")
  assert int(n_paper) == ref_idx.size
  assert not 2 * k_ref <= 3 * int(n_paper) <= 4 * k_ref
  assert 2 * k <= 3 * int(n_bracket) <= 4 * k
  assert _threshold_reference(np.asarray(x), 0.01, 8)[1] == int(n_bracket)


@pytest.mark.slow
def test_gaussian_k_paper_sends_the_reference_index_set_on_the_audits_vectors():
  """The audit's set: 40 vectors, Laplace, t(3) and t(1.5), d 10^4 to 10^6, density 0.001 to
  0.05; the paper mode sends exactly the indices the reference loop selects (9 of them end
  above 4k/3, where a capacity of ceil(4k/3) dropped entries)."""
  f = jax.jit(C.gaussian_k_with_count, static_argnames=("density", "rounds", "correction"))
  rng = np.random.default_rng(40)
  draws = (rng.laplace, lambda size: rng.standard_t(3.0, size),
           lambda size: rng.standard_t(1.5, size))
  above = 0
  for i in range(40):
    d, density = (10**4, 10**5, 10**6)[i % 3], (0.001, 0.01, 0.05)[(i // 3) % 3]
    x = draws[(i // 9) % 3](size=d).astype(np.float32)
    ref_idx, _, k = _gaussian_compressor_reference(x, density)
    _, idx, count = f(jnp.asarray(x), density=density, rounds=3, correction="paper")
    idx = np.asarray(idx)
    assert int(count) == ref_idx.size, i
    np.testing.assert_array_equal(idx[idx < d], ref_idx)
    above += 3 * ref_idx.size > 4 * k
  assert above == 9, above
