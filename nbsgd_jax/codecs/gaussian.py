"""Gaussian-k: a threshold from a Gaussian fit of the vector, corrected toward k entries.

Source: Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed
Deep Learning" (2019), public code hclhkbu/GaussianK-SGD (``GaussianCompressor``).

:func:`gaussian_threshold` (``thr = mean + |Phi^-1(density / 2)| std``, then the reference's
x0.5 / x1.5 steps, ``correction="paper"``, or those steps followed by a bisection,
``"bracket"``), :func:`gaussian_k_with_count` (the entries above it compacted into a
fixed-capacity message, and how many were selected) and :func:`gaussian_k` (the compressor,
``(x, key) -> (values, indices)`` as in :mod:`nbsgd_jax.codecs.sparse`). Every name is
importable from :mod:`nbsgd_jax.codecs.sparse` too.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import ndtri

from nbsgd_jax.codecs.message import (Array, Message, _check_density, _check_x, _identity,
                                      num_selected)


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
