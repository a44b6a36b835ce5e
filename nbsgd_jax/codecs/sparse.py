"""Gradient sparsifiers: Top-k, Gaussian-k and Random-k.

Source: Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed
Deep Learning" (2019), public code hclhkbu/GaussianK-SGD (``GaussianCompressor``).

Every compressor maps a flat float vector ``x`` of shape [d] to a sparse message
``(values, indices)`` with ``values`` of x's dtype and ``indices`` int32, both of a
static length.  Indices equal to ``d`` are padding (value 0) and are dropped by
``densify`` (scatter-add with ``mode="drop"``); duplicate indices accumulate.

Signature: ``compressor(x, key=None, *, density, ...)``, so
``functools.partial(top_k, density=0.01)`` is a compressor ``(x, key) -> (values, indices)``
(:func:`nbsgd_jax.transforms.error_feedback`). All functions are pure and jit-able in ``x``
and ``key``; ``density`` and the other options are keyword-only Python numbers (static under
``jax.jit``).
"""

from __future__ import annotations

import functools
import inspect
import math
import statistics
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import ndtri

from nbsgd_jax.codecs.base import Codec
from nbsgd_jax.communications.collectives import densify

Array = jax.Array
Message = tuple[Array, Array]
Compressor = Callable[[Array, Optional[Array]], Message]


def _check_density(density: float) -> float:
  try:
    ok = 0.0 < float(density) <= 1.0
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"density={density!r} is not allowed: it must be in (0, 1]")
  return float(density)


def _check_x(x: Array) -> Array:
  x = jnp.asarray(x)
  if x.ndim != 1:
    raise ValueError(
        f"x must be a flat vector (ndim 1); got x with shape {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x must have a floating dtype; got x.dtype={x.dtype}")
  if x.shape[0] == 0:
    raise ValueError("x must be non-empty; got x with shape (0,)")
  return x


def num_selected(d: int, density: float) -> int:
  """Number of entries kept: k = ceil(density * d), at least 1 (and at most d).

  Raises:
    ValueError: if density is not in (0, 1] or d < 1.
  """
  density = _check_density(density)
  if int(d) < 1:
    raise ValueError(f"d={d!r} is not allowed: it must be >= 1")
  # Round away float noise first so that e.g. 0.07 * 100 gives 7, not 8.
  k = math.ceil(round(density * int(d), 6))
  return int(min(max(k, 1), int(d)))


def _identity(x: Array) -> Message:
  return x, jnp.arange(x.shape[0], dtype=jnp.int32)


def top_k(x: Array, key: Optional[Array] = None, *, density: float) -> Message:
  """Exact Top-k by magnitude: ``lax.top_k(|x|, k)``, k = num_selected(d, density).

  Args:
    x: [d] float vector.
    density: fraction in (0, 1].
    key: unused (uniform compressor signature).
  Returns:
    values [k] (signed entries of x, by decreasing |x|) and indices int32 [k].
  Raises:
    ValueError: x not a non-empty floating 1-D array; density not in (0, 1].
  """
  del key
  x = _check_x(x)
  density = _check_density(density)
  d = x.shape[0]
  if density == 1.0:
    return _identity(x)
  k = num_selected(d, density)
  _, idx = lax.top_k(jnp.abs(x), k)
  idx = idx.astype(jnp.int32)
  return x[idx], idx


def random_k(x: Array, key: Optional[Array] = None, *, density: float) -> Message:
  """Random-k: k distinct indices, uniform over all k-subsets of [0, d).

  Instead of ``jax.random.choice(replace=False)`` (a full permutation of d, slow
  for large d) we draw k indices with replacement, sort them, and redraw the
  duplicate slots until none remain (``lax.while_loop``; about k^2 / (2d)
  duplicates in the first round, so few rounds).  This is sequential rejection
  sampling, hence exactly uniform without replacement; cost O(k log k) per round.

  Args:
    x: [d] float vector.
    density: fraction in (0, 1].
    key: PRNG key (required).
  Returns:
    values [k] = x[indices] and indices int32 [k] (distinct; sorted up to the
    slots refilled in the last round).
  Raises:
    ValueError: bad x or density, or key is None.
  """
  x = _check_x(x)
  density = _check_density(density)
  if key is None:
    raise ValueError("key is required for random_k (got key=None)")
  d = x.shape[0]
  if density == 1.0:
    return _identity(x)
  k = num_selected(d, density)

  def draw(kk: Array) -> Array:
    return jax.random.randint(kk, (k,), 0, d, dtype=jnp.int32)

  key, sub = jax.random.split(key)
  idx0 = jnp.sort(draw(sub))

  def dups(idx: Array) -> Array:  # idx sorted
    return jnp.concatenate([jnp.zeros((1,), bool), idx[1:] == idx[:-1]])

  def cond(state):
    return jnp.any(dups(state[0]))

  def body(state):
    idx, kk = state
    kk, sub = jax.random.split(kk)
    idx = jnp.sort(jnp.where(dups(idx), draw(sub), idx))
    return idx, kk

  idx, _ = lax.while_loop(cond, body, (idx0, key))
  return x[idx], idx


CORRECTIONS = ("bracket", "paper")
# Default ``rounds`` of each correction (``rounds=None``): bracket, corrections after the
# initial threshold; paper, thresholds evaluated, GaussianK-SGD's ``while loops < 3`` in
# ``GaussianCompressor.compress`` (``GaussianCompressor2`` uses 5).
DEFAULT_ROUNDS = {"bracket": 8, "paper": 3}


def default_rounds(correction: str) -> int:
  """``rounds`` used for ``rounds=None``: 8 corrections (bracket), 3 evaluated thresholds
  (paper, GaussianK-SGD's ``GaussianCompressor``).

  Raises:
    ValueError: unknown correction.
  """
  if correction not in CORRECTIONS:
    raise ValueError(f"correction={correction!r} is not allowed: choose one of {CORRECTIONS}")
  return DEFAULT_ROUNDS[correction]


def gaussian_threshold(x: Array, density: float, rounds: Optional[int] = None,
                       block_size: Optional[int] = None,
                       correction: str = "bracket") -> tuple[Array, Array]:
  """Gaussian-k threshold, corrected toward k.

  An entry is selected iff ``|x_i| > thr``; the returned count always matches the
  returned thr (one counting pass over x per evaluated threshold).

  * ``"paper"``: exactly the reference loop, hclhkbu/GaussianK-SGD ``compression.py``,
    ``GaussianCompressor.compress`` (Shi et al. 2019)::

      k = max(int(d * density), 1)                      # floor, not num_selected's ceil
      thr = mean(x) + |Phi^-1(density / 2)| * std(x)    # std unbiased (d - 1), as torch.std
      loops = 0
      while loops < rounds:                             # the reference's bound: 3
        count = #{i : |x_i| > thr}
        if count < 2k/3: thr *= 0.5
        elif count > 4k/3: thr *= 1.5
        else: break
        loops += 1

    The selection is the last *evaluated* threshold's: at most ``rounds`` thresholds are
    evaluated and the threshold multiplied in the last iteration is never used; this
    returns that last evaluated threshold and its count. ``rounds`` >= 1 (default 3;
    ``GaussianCompressor2`` uses 5). Mean and std are computed in x's precision (float32
    for float32 x, so thr agrees with the reference's float64 statistics to ~1e-6
    relative; float64 x under ``jax_enable_x64`` agrees to rounding). On heavy-tailed
    vectors (the error-fed p = g + e) the fixed steps can jump over [2k/3, 4k/3] back and
    forth (measured in ``docs/sparsification``). For d = 1 the std is taken as 0 (torch
    gives nan there and selects nothing).
  * ``"bracket"`` (default): thr = mean(x) + |Phi^-1(density/2)| * std(x) with the
    population std, k = ``num_selected(d, density)``; then, at most ``rounds`` times
    while the count is outside [2k/3, 4k/3], a correction: the paper's x0.5 / x1.5 steps
    until the band is bracketed by a threshold that selects too many (lo) and one that
    selects too few (hi), then bisection in log-threshold, thr = sqrt(lo * hi) (hi / 2 if
    lo <= 0). ``rounds`` corrections (default 8) evaluate up to rounds + 1 thresholds.

  Args:
    x: [d] float vector.
    density: fraction in (0, 1].
    rounds: bracket: maximum number of corrections (>= 0); paper: maximum number of
      evaluated thresholds, the reference's loop bound (>= 1). None: the correction's
      default (:data:`DEFAULT_ROUNDS`: bracket 8, paper 3).
    block_size: block length of the counting pass (performance only; None: by
      density, 32 for density <= 0.002 else 8).
    correction: ``"bracket"`` or ``"paper"``.
  Returns:
    thr (scalar, x.dtype) and count (int32 scalar) = #{i : |x_i| > thr}.
  Raises:
    ValueError: bad x, density, rounds (paper: < 1), block_size or correction.
  """
  thr, count, _ = _threshold_and_block_counts(x, density, rounds, block_size, correction)
  return thr, count


def _default_block_size(density: float) -> int:
  """Block length measured fastest on XLA:CPU at d = 25.6M (benchmarks/selection.py)."""
  return 32 if density <= 0.002 else 8


def _block_counts(x: Array, thr: Array, s: int) -> Array:
  """Per-block counts of |x| > thr; x is [d], blocks of s (last one partial)."""
  a = jnp.abs(x)
  d = a.shape[0]
  b0 = d // s
  main = jnp.sum((a[:b0 * s] > thr).reshape(b0, s), axis=1, dtype=jnp.int32)
  if d % s:
    tail = jnp.sum(a[b0 * s:] > thr, dtype=jnp.int32)[None]
    main = jnp.concatenate([main, tail])
  return main


def _check_rounds(rounds, correction: str) -> int:
  """``rounds`` resolved (None: the correction's default) and checked."""
  if correction not in CORRECTIONS:
    raise ValueError(f"correction={correction!r} is not allowed: choose one of {CORRECTIONS}")
  if rounds is None:
    return DEFAULT_ROUNDS[correction]
  if isinstance(rounds, bool) or int(rounds) != rounds:
    raise ValueError(f"rounds={rounds!r} is not allowed: it must be an int")
  if correction == "paper" and rounds < 1:
    raise ValueError(
        f"rounds={rounds!r} is not allowed with correction='paper': it is the reference loop's "
        "bound on evaluated thresholds (GaussianCompressor: 3), an int >= 1")
  if rounds < 0:
    raise ValueError(f"rounds={rounds!r} is not allowed: it must be an int >= 0")
  return int(rounds)


def _initial_threshold(x: Array, d: int, density: float, paper: bool) -> Array:
  """mean + |z| std, z = Phi^-1(density / 2), in x's dtype (statistics in float32 at least).

  paper: z in float64 from ``(1 - (1 - density)) / 2`` as the reference's
  ``gen_threshold_from_normal_distribution(1 - ratio, ...)`` and the unbiased std (two
  passes); bracket: z from float32 ``ndtri`` and the population std (one pass), unchanged.
  """
  xf = x.astype(jnp.float32) if x.dtype != jnp.float64 else x
  mean = jnp.mean(xf)
  if paper:
    z = abs(statistics.NormalDist().inv_cdf((1.0 - (1.0 - density)) / 2.0))
    var = jnp.sum(jnp.square(xf - mean)) / max(d - 1, 1)
    std = jnp.sqrt(var)
  else:
    with jax.ensure_compile_time_eval():
      z = abs(float(ndtri(jnp.float32(density / 2.0))))
    std = jnp.sqrt(jnp.maximum(jnp.mean(jnp.square(xf)) - mean * mean, 0.0))
  return (mean + z * std).astype(x.dtype)


def _threshold_and_block_counts(x, density, rounds, block_size, correction="bracket"):
  x = _check_x(x)
  density = _check_density(density)
  rounds = _check_rounds(rounds, correction)
  if block_size is None:
    block_size = _default_block_size(density)
  if int(block_size) != block_size or block_size < 1:
    raise ValueError(
        f"block_size={block_size!r} is not allowed: it must be an int >= 1")
  d = x.shape[0]
  bracket = correction == "bracket"
  if bracket:
    k, corrections = num_selected(d, density), rounds
  else:  # the reference's k and loop: `rounds` evaluated thresholds, so rounds - 1 steps
    k, corrections = max(int(d * density), 1), rounds - 1
  thr = _initial_threshold(x, d, density, paper=not bracket)

  def counts_at(t):
    # The barrier keeps XLA:CPU from fusing the total into the per-block
    # reduction, which makes that pass several times slower.
    c = lax.optimization_barrier(_block_counts(x, t, block_size))
    return c, jnp.sum(c)

  def out_of_range(count):
    return (3 * count < 2 * k) | (3 * count > 4 * k)

  c0, n0 = counts_at(thr)

  def cond(state):
    i, _, _, n, _, _ = state
    return (i < corrections) & out_of_range(n)

  def body(state):
    i, t, _, n, lo, hi = state
    few = 3 * n < 2 * k
    step = jnp.where(few, t * 0.5, t * 1.5)
    if bracket:
      # lo: largest threshold seen selecting too many; hi: smallest selecting too few.
      lo = jnp.where(few, lo, jnp.maximum(lo, t))
      hi = jnp.where(few, jnp.minimum(hi, t), hi)
      both = (lo > -jnp.inf) & (hi < jnp.inf)
      mid = jnp.where(lo > 0, jnp.sqrt(jnp.maximum(lo, 0) * hi), 0.5 * hi)
      step = jnp.where(both, mid, step)
    t = step.astype(t.dtype)
    c, n = counts_at(t)
    return i + 1, t, c, n, lo, hi

  inf = jnp.asarray(jnp.inf, thr.dtype)
  _, thr, counts, count, _, _ = lax.while_loop(cond, body, (0, thr, c0, n0, -inf, inf))
  return thr, count, counts


def gaussian_k_with_count(x: Array, key: Optional[Array] = None, *, density: float,
                          capacity_factor: float = 4 / 3, rounds: Optional[int] = None,
                          block_size: Optional[int] = None,
                          correction: str = "bracket") -> tuple[Array, Array, Array]:
  """Gaussian-k with a fixed-capacity output and the number actually selected.

  Selection is ``|x_i| > thr`` with thr from ``gaussian_threshold``.

  * ``correction="bracket"``: the selected entries are compacted, in increasing index
    order, into cap = min(d, ceil(capacity_factor * k)) slots, k = ``num_selected(d,
    density)`` (the default 4/3 covers the band [2k/3, 4k/3] the bisection ends in); if
    count > cap the selected entries with the largest indices are dropped. Unused slots
    hold index d and value 0.
  * ``correction="paper"``: everything the reference loop selects is sent, as the
    reference does (hclhkbu/GaussianK-SGD ``GaussianCompressor.compress`` returns every
    index above the last threshold). The loop's fixed x0.5 / x1.5 steps can end far
    outside the band (5.3k and 26k measured on error-fed vectors), so no capacity below d
    is safe: the message is d long, slot i holds ``(x_i, i)`` when selected and ``(0, d)``
    otherwise (``capacity_factor`` is not used); the bytes counted are those of the
    selected entries, and the sparse all-gather of a d-long message is a ``psum`` of the
    densified vectors (:func:`nbsgd_jax.communications.collectives.sparse_all_gather`).

  Compaction avoids a d-long cumsum/nonzero/top_k (slow on XLA:CPU): per-block
  counts over blocks of ``block_size`` (fused with the counting pass), a cumsum
  over the ceil(d / block_size) block counts to list the non-empty blocks (at most
  count of them, so cap slots suffice whenever count <= cap), a gather of those
  [cap, block_size] candidates, in-block ranks by a small triangular matmul and a
  scatter into the output.  It is exact: no per-block capacity, nothing dropped
  unless count > cap.

  Args:
    x: [d] float vector.
    density: fraction in (0, 1].
    key: unused.
    capacity_factor: >= 1 (default 4/3, the top of the correction band).
    rounds: bracket: maximum number of threshold corrections; paper: maximum number of
      evaluated thresholds (the reference's loop bound, >= 1); None: the correction's
      default (8 / 3), see ``gaussian_threshold``.
    block_size: block length for counting/compaction (performance only; None:
      32 for density <= 0.002 else 8).
    correction: ``"bracket"`` (default) or ``"paper"``, see ``gaussian_threshold``.
  Returns:
    values [cap], indices int32 [cap] (cap = d for ``"paper"``), count (int32 scalar,
    selected before truncation).  With density 1: (x, arange(d), d).
  Raises:
    ValueError: bad x, density, capacity_factor, rounds, block_size or correction.
  """
  del key
  x = _check_x(x)
  density = _check_density(density)
  rounds = _check_rounds(rounds, correction)
  if not capacity_factor >= 1.0:
    raise ValueError(
        f"capacity_factor={capacity_factor!r} is not allowed: it must be >= 1")
  d = x.shape[0]
  if density == 1.0:
    v, i = _identity(x)
    return v, i, jnp.asarray(d, jnp.int32)
  k = num_selected(d, density)
  cap = int(min(d, math.ceil(round(capacity_factor * k, 6))))
  s = int(block_size or _default_block_size(density))
  thr, count, counts = _threshold_and_block_counts(x, density, rounds, s, correction)
  if correction == "paper":  # the reference's whole selection, in place (docstring)
    mask = jnp.abs(x) > thr
    return (jnp.where(mask, x, jnp.zeros_like(x)),
            jnp.where(mask, jnp.arange(d, dtype=jnp.int32), jnp.int32(d)), count)
  nb = counts.shape[0]

  # 1. List the non-empty blocks (in order) in cap slots; padding block id nb.
  hit = counts > 0
  slot = jnp.cumsum(hit.astype(jnp.int32)) - 1
  slot = jnp.where(hit, slot, cap)
  blk = jnp.full((cap,), nb, jnp.int32).at[slot].set(
      jnp.arange(nb, dtype=jnp.int32), mode="drop")
  # Output offset of each listed block: exclusive cumsum of its count.
  bc = counts.at[blk].get(mode="fill", fill_value=0)
  offs = jnp.cumsum(bc) - bc

  # 2. Gather the candidates [cap, s]; out-of-range positions read 0.
  idx = blk[:, None] * s + jnp.arange(s, dtype=jnp.int32)[None, :]
  vals = x.at[idx].get(mode="fill", fill_value=0)
  mask = (jnp.abs(vals) > thr) & (idx < d)

  # 3. Rank inside the block (inclusive prefix count) by a triangular matmul.
  tri = jnp.triu(jnp.ones((s, s), jnp.float32))
  rank = jnp.dot(mask.astype(jnp.float32), tri,
                 precision=lax.Precision.HIGHEST).astype(jnp.int32)
  pos = jnp.where(mask, offs[:, None] + rank - 1, cap)

  # 4. Scatter into the fixed-capacity message (positions >= cap dropped).
  pos = pos.reshape(-1)
  out_v = jnp.zeros((cap,), x.dtype).at[pos].set(vals.reshape(-1), mode="drop")
  out_i = jnp.full((cap,), d, jnp.int32).at[pos].set(idx.reshape(-1), mode="drop")
  return out_v, out_i, count


def gaussian_k(x: Array, key: Optional[Array] = None, *, density: float,
               capacity_factor: float = 4 / 3, rounds: Optional[int] = None,
               block_size: Optional[int] = None, correction: str = "bracket") -> Message:
  """Gaussian-k (Shi et al. 2019): ``gaussian_k_with_count`` without the count.

  Returns values [cap] and indices int32 [cap] (padding index d, value 0).
  """
  v, i, _ = gaussian_k_with_count(x, key, density=density, capacity_factor=capacity_factor,
                                  rounds=rounds, block_size=block_size,
                                  correction=correction)
  return v, i


COMPRESSORS: dict[str, Callable[..., Message]] = {
    "top_k": top_k,
    "gaussian_k": gaussian_k,
    "random_k": random_k,
}
for _fn in COMPRESSORS.values():  # indices in [0, d] by construction (check_message)
  _fn.indices_in_range = True


def make_compressor(name: str, density: float, **options) -> Compressor:
  """Return ``fn(x, key) -> (values, indices)`` for a compressor in COMPRESSORS.

  Args:
    name: a key of COMPRESSORS.
    density: k / d in (0, 1].
    **options: keyword options of that compressor (e.g. ``rounds``, ``correction`` of
      ``gaussian_k``).
  Raises:
    ValueError: unknown name, density not in (0, 1], or an option the compressor lacks.
  """
  if name not in COMPRESSORS:
    raise ValueError(
        f"name={name!r} is not a known compressor; choose one of "
        f"{sorted(COMPRESSORS)}")
  density = _check_density(density)
  fn = COMPRESSORS[name]
  allowed = set(inspect.signature(fn).parameters) - {"x", "density", "key"}
  bad = sorted(set(options) - allowed)
  if bad:
    raise ValueError(f"options {bad} are not allowed for compressor {name!r}: it takes "
                     f"{sorted(allowed) or 'none'}")

  def compress(x: Array, key: Optional[Array] = None) -> Message:
    return fn(x, key, density=density, **options)

  compress.__name__ = f"{name}_{density:g}"
  compress.indices_in_range = True
  return compress


def message_bytes(num_values: int, value_bytes: int = 4,
                  index_bytes: int = 4) -> float:
  """Bytes of a sparse message of num_values (value, index) pairs."""
  return float(num_values) * float(value_bytes + index_bytes)


# ----------------------------------------------------------------------------- config


def check_message(out, d: int, trusted: bool = False) -> tuple[Array, Array]:
  """A compressor's output ``(values [cap], indices [cap])`` for ``x [d]``, checked once at
  trace time: two 1-D arrays of one length, integer indices, and, when the indices are known
  then (concrete, not traced), each in ``[0, d]``. Traced indices of a compressor that is not
  ``trusted`` (:func:`indices_in_range`: the built-in ones are) are checked at run time too,
  by a host callback (``jax.debug.callback``) each time it runs: an index outside ``[0, d]``
  raises there, and the run stops with that line (through XLA: ``jax.errors.
  JaxRuntimeError``, which the command line prints as one ``error:`` line).

  Raises:
    ValueError: not a pair of 1-D arrays of one length, or an index out of range.
    TypeError: indices that are not integers.
  """
  if not (isinstance(out, (tuple, list)) and len(out) == 2):
    got = (f"one array of shape {tuple(out.shape)}" if hasattr(out, "shape") else
           f"{type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else
           type(out).__name__)
    raise ValueError(f"the compressor must return (values [cap], indices [cap]); it "
                     f"returned {got}")
  values, indices = jnp.asarray(out[0]), jnp.asarray(out[1])
  if values.ndim != 1 or indices.shape != values.shape:
    raise ValueError(f"the compressor must return (values [cap], indices [cap]); got shapes "
                     f"{values.shape} and {indices.shape}")
  if not jnp.issubdtype(indices.dtype, jnp.integer):
    raise TypeError(f"the compressor returned indices of dtype {indices.dtype}: expected "
                    "an integer dtype")
  if not isinstance(indices, jax.core.Tracer):
    _check_range(np.asarray(indices), d)
  elif not trusted:
    jax.debug.callback(functools.partial(_check_range, d=d), indices)
  return values, indices


def _check_range(indices: np.ndarray, d: int) -> None:
  bad = np.asarray(indices)[(np.asarray(indices) < 0) | (np.asarray(indices) > d)]
  if bad.size:
    raise ValueError(f"the compressor returned index {int(bad.flat[0])} for a vector of {d} "
                     f"entries: indices are in [0, {d}) ({d}: padding, no entry)")


def indices_in_range(fn) -> bool:
  """Whether the compressor ``fn`` (or the function of a ``functools.partial``) is one whose
  indices are in ``[0, d]`` by construction (Top-k, Random-k, Gaussian-k, their
  :func:`make_compressor` forms): :func:`check_message` skips its run-time check."""
  fn = getattr(fn, "func", fn)
  return bool(getattr(fn, "indices_in_range", False))


def sparse_codec(name: str, fn: Callable) -> Codec:
  """The :class:`Codec` of a sparse compressor ``fn: (x [d], key) -> (values [cap], indices
  [cap])`` (padding index ``d``; output checked by :func:`check_message`): ``C(x) =
  dense(values, indices)``, ``valid (value_bytes + 4)`` bytes for the ``valid`` indices in
  ``[0, d)``."""

  def compress(x, key=None):
    d = x.shape[0]
    values, indices = check_message(fn(x, key), d, indices_in_range(fn))
    valid = jnp.sum((indices >= 0) & (indices < d)).astype(jnp.float32)
    return (densify(values, indices, d).astype(x.dtype),
            valid * (jnp.dtype(values.dtype).itemsize + 4))
  return Codec(name, compress, fn)


def top_k_codec(density: float = 0.01) -> Codec:
  """Top-k of ``density`` d entries (:func:`top_k`), a :class:`~nbsgd_jax.codecs.Codec`."""
  return sparse_codec("top_k", make_compressor("top_k", density))


def random_k_codec(density: float = 0.01) -> Codec:
  """Random-k of ``density`` d entries (:func:`random_k`)."""
  return sparse_codec("random_k", make_compressor("random_k", density))


def gaussian_k_codec(density: float = 0.01, gaussian_rounds: int = 0,
                     gaussian_correction: str = "bracket") -> Codec:
  """Gaussian-k (:func:`gaussian_k`) with ``gaussian_rounds`` corrections (0: the
  correction's default, :data:`DEFAULT_ROUNDS`) of kind ``gaussian_correction``."""
  return sparse_codec("gaussian_k", make_compressor(
      "gaussian_k", density, rounds=gaussian_rounds or None, correction=gaussian_correction))
