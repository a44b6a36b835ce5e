"""The partition of a data set's examples across workers, and their stacking.

:func:`partition` splits example indices (``"iid"``, or the ``"dirichlet"`` label skew of
Hsu, Qi & Brown 2019); :func:`stack_shards` pads the shards to one size so that they stack
into ``[n, max_size, ...]`` arrays; :func:`label_histogram` counts each worker's labels. Plain
numpy on the host; :mod:`nbsgd_jax.data` re-exports these names (the module to import).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from nbsgd_jax.core import checks

SCHEMES = ("iid", "dirichlet")
MAX_DIRICHLET_TRIES = 1000


_check_int = checks.index_at_least


def _check_labels(labels: Any) -> np.ndarray:
  y = np.asarray(labels)
  if y.ndim != 1 or y.size == 0 or not np.issubdtype(y.dtype, np.integer):
    raise ValueError(
        f"labels with shape {y.shape} and dtype {y.dtype} is not allowed: labels must be a "
        f"non-empty 1-D integer array"
    )
  return y


def partition(
    labels: np.ndarray,
    num_workers: int,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
) -> list[np.ndarray]:
  """Splits example indices across workers.

  Args:
    labels: integer ``[N]`` class labels (any non-negative or negative integers; only
      equality matters).
    num_workers: ``n``, with ``1 <= n <= N``.
    scheme: ``"iid"`` or ``"dirichlet"``.
    alpha: Dirichlet concentration, ``> 0`` (checked for both schemes, used by
      ``"dirichlet"``): small values (e.g. 0.05) give strong label skew, large values
      (e.g. 100) are close to iid.
    seed: seed of ``np.random.default_rng``; the result is a deterministic function of
      ``(labels, num_workers, scheme, alpha, seed, min_size)``.
    min_size: every worker gets at least this many examples, ``>= 0``.

  Returns:
    A list of ``n`` int64 index arrays, each sorted ascending; they are disjoint and their
    union is ``range(N)``.

    * ``"iid"``: a seeded random permutation cut into ``n`` contiguous parts whose sizes
      differ by at most one (the first ``N % n`` workers get one more).
    * ``"dirichlet"``: for each class ``c`` (in sorted order), proportions
      ``p ~ Dirichlet(alpha * 1_n)`` are drawn and the shuffled indices of class ``c`` are
      cut at ``floor(cumsum(p) * N_c)``. The whole draw is repeated (fresh draws from the
      same generator) until every worker has ``>= min_size`` examples, at most
      ``MAX_DIRICHLET_TRIES`` times.

  Raises:
    ValueError: ``labels`` is not a non-empty 1-D integer array; ``num_workers`` is not an
      integer in ``[1, N]``; ``scheme`` is unknown; ``alpha`` is not a finite number
      ``> 0``; ``seed`` is not an integer ``>= 0``; ``min_size`` is not an integer
      ``>= 0`` or ``min_size * num_workers > N`` (or ``> N // n`` for ``"iid"``); no
      Dirichlet draw met ``min_size`` within ``MAX_DIRICHLET_TRIES`` tries.

  Source: Hsu, Qi & Brown (2019), "Measuring the effects of non-identical data
  distribution for federated visual classification", arXiv:1909.06335, Sec. 3.
  """
  y = _check_labels(labels)
  num = y.shape[0]
  n = _check_int("num_workers", num_workers, 1)
  if n > num:
    raise ValueError(
        f"num_workers={num_workers!r} is not allowed: it must be <= the number of examples "
        f"({num})"
    )
  if scheme not in SCHEMES:
    raise ValueError(f"scheme={scheme!r} is not allowed: use one of {SCHEMES}")
  try:
    a = float(alpha)
  except (TypeError, ValueError):
    a = float("nan")
  if isinstance(alpha, (bool, np.bool_)) or not (math.isfinite(a) and a > 0):
    raise ValueError(f"alpha={alpha!r} is not allowed: it must be a finite number > 0")
  seed = _check_int("seed", seed, 0)
  min_size = _check_int("min_size", min_size, 0)
  if min_size * n > num:
    raise ValueError(
        f"min_size={min_size!r} is not allowed with num_workers={n} and {num} examples: "
        f"min_size * num_workers must be <= {num}"
    )
  rng = np.random.default_rng(seed)

  if scheme == "iid":
    if num // n < min_size:
      raise ValueError(
          f"min_size={min_size!r} is not allowed with scheme='iid', num_workers={n} and "
          f"{num} examples: the smallest iid shard has {num // n}"
      )
    return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(num), n)]

  classes = np.unique(y)
  by_class = [np.flatnonzero(y == c) for c in classes]
  for _ in range(MAX_DIRICHLET_TRIES):
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for idx in by_class:
      idx = rng.permutation(idx)
      p = rng.dirichlet(np.full(n, a))
      cuts = (np.cumsum(p) * idx.shape[0]).astype(np.int64)[:-1]
      for w, piece in enumerate(np.split(idx, cuts)):
        parts[w].append(piece)
    shards = [np.sort(np.concatenate(pw)).astype(np.int64) for pw in parts]
    if min(s.shape[0] for s in shards) >= min_size:
      return shards
  raise ValueError(
      f"alpha={alpha!r}, num_workers={n}, min_size={min_size}: no Dirichlet partition gave "
      f"every worker >= min_size examples in {MAX_DIRICHLET_TRIES} tries: raise alpha, "
      f"lower num_workers or lower min_size"
  )


def stack_shards(
    images: np.ndarray, labels: np.ndarray, shards: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Gathers each worker's shard and pads them to one size so that they stack.

  Args:
    images: ``[N, ...]`` (e.g. uint8 ``[N, H, W, C]``), any dtype.
    labels: integer ``[N]``.
    shards: ``n`` non-empty integer index arrays into ``[0, N)`` (e.g. from
      :func:`partition`).

  Returns:
    ``(images, labels, sizes)``: ``images`` ``[n, max_size, ...]`` with the input dtype,
    ``labels`` int32 ``[n, max_size]``, ``sizes`` int32 ``[n]`` (the shard lengths).
    Row ``k`` of worker ``i`` is example ``shards[i][k]`` for ``k < sizes[i]``; padded rows
    ``k >= sizes[i]`` repeat example ``shards[i][0]`` and must not be sampled (draw
    ``k`` in ``[0, sizes[i])``).

  Raises:
    ValueError: ``images`` and ``labels`` differ in length or ``labels`` is not 1-D
      integer; ``shards`` is empty; a shard is empty, not 1-D integer, or out of range.

  Source: none (bookkeeping for a fixed-shape per-worker data layout).
  """
  x = np.asarray(images)
  y = _check_labels(labels)
  if x.ndim < 1 or x.shape[0] != y.shape[0]:
    raise ValueError(
        f"images with shape {x.shape} is not allowed with labels of shape {y.shape}: their "
        f"leading dimensions must be equal"
    )
  if len(shards) == 0:
    raise ValueError("shards=[] is not allowed: it must hold >= 1 index array")
  num = y.shape[0]
  checked = []
  for i, s in enumerate(shards):
    s = np.asarray(s)
    if s.ndim != 1 or s.size == 0 or not np.issubdtype(s.dtype, np.integer):
      raise ValueError(
          f"shards[{i}] with shape {s.shape} and dtype {s.dtype} is not allowed: each shard "
          f"must be a non-empty 1-D integer index array"
      )
    if s.min() < 0 or s.max() >= num:
      raise ValueError(
          f"shards[{i}] has indices in [{s.min()}, {s.max()}]: indices must lie in "
          f"[0, {num - 1}]"
      )
    checked.append(s.astype(np.int64))
  sizes = np.asarray([s.shape[0] for s in checked], dtype=np.int32)
  max_size = int(sizes.max())
  index = np.stack(
      [np.concatenate([s, np.full(max_size - s.shape[0], s[0], np.int64)]) for s in checked]
  )
  return x[index], y[index].astype(np.int32), sizes


def label_histogram(
    labels: np.ndarray, shards: Sequence[np.ndarray], num_classes: int
) -> np.ndarray:
  """Counts the labels held by each worker.

  Args:
    labels: integer ``[N]`` with values in ``[0, num_classes)``.
    shards: ``n`` integer index arrays into ``[0, N)``.
    num_classes: number of classes, ``>= 1``.

  Returns:
    int64 ``[n, num_classes]``: entry ``[i, c]`` is the number of examples of class ``c``
    in ``shards[i]``.

  Raises:
    ValueError: ``labels`` is not a non-empty 1-D integer array or has values outside
      ``[0, num_classes)``; ``num_classes < 1``; a shard is not a 1-D integer array of
      indices in ``[0, N)``.

  Source: none (the per-worker class histogram of Hsu, Qi & Brown 2019, Fig. 1).
  """
  y = _check_labels(labels)
  k = _check_int("num_classes", num_classes, 1)
  if y.min() < 0 or y.max() >= k:
    raise ValueError(
        f"labels in [{y.min()}, {y.max()}] is not allowed with num_classes={k}: labels must "
        f"lie in [0, {k - 1}]"
    )
  rows = []
  for i, s in enumerate(shards):
    s = np.asarray(s)
    if s.ndim != 1 or not (s.size == 0 or np.issubdtype(s.dtype, np.integer)):
      raise ValueError(
          f"shards[{i}] with shape {s.shape} and dtype {s.dtype} is not allowed: each shard "
          f"must be a 1-D integer index array"
      )
    if s.size and (s.min() < 0 or s.max() >= y.shape[0]):
      raise ValueError(
          f"shards[{i}] has indices in [{s.min()}, {s.max()}]: indices must lie in "
          f"[0, {y.shape[0] - 1}]"
      )
    rows.append(np.bincount(y[s.astype(np.int64)], minlength=k).astype(np.int64))
  return np.stack(rows) if rows else np.zeros((0, k), np.int64)
