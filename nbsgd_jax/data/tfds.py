"""Reading prepared TensorFlow Datasets sets into host numpy arrays and strings.

Shared by the ``"tfds:<name>"`` sets of :mod:`nbsgd_jax.data` (images,
:func:`read_image_splits`) and of :mod:`nbsgd_jax.data.text` (text, :func:`read_text_splits`).
Each ``train``/``test`` split is read through ``tfds.data_source`` (ArrayRecord random access,
no TensorFlow needed), ``_TFDS_CHUNK`` records at a time. Nothing is downloaded at run time:
the data set must already be prepared in ``data_dir`` in ``array_record`` format; a data set
that cannot be opened or read is a ``ValueError`` naming it, the data directory and the
``tfds build`` command that prepares it.

``tensorflow_datasets`` is an optional dependency, imported only when a split is opened.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_TFDS_CHUNK = 1024
TEXT_FEATURE = "text"  # the string feature a text data set's records hold


def _open_split(name: str, tfds_name: str, data_dir: str | None, split: str) -> Any:
  """``tfds.data_source`` of one split, never downloading; ValueError when it cannot open."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    return tfds.data_source(tfds_name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise _tfds_error(name, data_dir, f"split {split!r} could not be opened", e) from e


def read_image_splits(
    name: str, tfds_name: str, data_dir: str | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
  """Reads the train and test splits of a prepared TFDS image classification data set.

  Args:
    name: the data set's name as given, ``"tfds:<tfds_name>"`` (used in messages).
    tfds_name: the TFDS name, e.g. ``"mnist"``.
    data_dir: TFDS data directory (``None``: the TFDS default).

  Returns:
    ``(train_images, train_labels, test_images, test_labels, num_classes)``: images uint8
    ``[N, H, W, C]`` (a channel axis is added to ``[N, H, W]``), labels int32 ``[N]``;
    ``num_classes`` from the ``label`` feature's metadata, else ``max(label) + 1``.

  Raises:
    ValueError: a split cannot be opened or read (see the module docstring); its records
      lack ``image`` / ``label``, its images are not uint8 ``[H, W]`` / ``[H, W, C]`` of one
      fixed shape shared by both splits, or its labels are not non-negative integers in
      ``[0, num_classes)``; a split is empty.
  """
  splits = {}
  num_classes = None
  for split in ("train", "test"):
    source = _open_split(name, tfds_name, data_dir, split)
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
  return train_images, train_labels, test_images, test_labels, int(num_classes)


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


def read_text_splits(name: str, tfds_name: str, data_dir: str | None) -> tuple[str, str]:
  """Reads the train and test splits of a prepared TFDS text data set.

  Args:
    name: the data set's name as given, ``"tfds:<tfds_name>"`` (used in messages).
    tfds_name: the TFDS name, e.g. ``"tiny_shakespeare"``.
    data_dir: TFDS data directory (``None``: the TFDS default).

  Returns:
    ``(train_text, test_text)``: each split's ``text`` feature (a string, UTF-8 bytes on
    disk) concatenated in record order, with no separator.

  Raises:
    ValueError: a split cannot be opened or read (see the module docstring); a record has no
      ``text`` string or is not valid UTF-8; a split holds no characters.
  """
  texts = {}
  for split in ("train", "test"):
    source = _open_split(name, tfds_name, data_dir, split)
    texts[split] = _read_text_source(source, name=name, data_dir=data_dir, split=split)
  return texts["train"], texts["test"]
