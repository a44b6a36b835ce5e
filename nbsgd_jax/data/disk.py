"""Data sets read from files a user has on disk: no TensorFlow, no network.

Image classification (:func:`load_image_folder`, :func:`load_cifar_pickle`), decoded with
Pillow / numpy into the arrays of :class:`nbsgd_jax.data.Dataset`:

* an **image folder** laid out ``train/<class>/<image>`` and ``test/<class>/<image>``, as a
  directory or a ``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz`` or ``.zip``
  archive (the layout torchvision's ``ImageFolder`` reads; one wrapping folder is allowed).
  Classes sorted by name are labels ``0..C-1``; an image is any file whose extension Pillow
  reads (``PIL.Image.registered_extensions``); other files and hidden files are skipped.
  Decoded once and cached as ``.npz`` in a cache directory, keyed by the source's path, size
  and modification time (a directory: every file's). It lives in
  :mod:`nbsgd_jax.data.image_folder`, with :class:`Arrays` and the cache; re-exported here.
* the **CIFAR-10 / CIFAR-100 python release** (Krizhevsky 2009): ``cifar-10-python.tar.gz`` /
  ``cifar-100-python.tar.gz``, their extracted ``cifar-10-batches-py/`` /
  ``cifar-100-python/`` directories, or a directory holding either. The pickles are read by
  an unpickler that builds numpy arrays and nothing else.

Text (:func:`read_text`): a UTF-8 text file (plain or ``.gz``).
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
from typing import NamedTuple

import numpy as np

# Image folders, the arrays every reader returns and their cache
# (nbsgd_jax.data.image_folder), re-exported: the package names them from here.
from nbsgd_jax.data.image_folder import (  # noqa: F401
    _DECODE_THREADS,
    ARCHIVE_SUFFIXES,
    CACHE_FORMAT,
    CACHE_OFF,
    SPLITS,
    Arrays,
    _cache_path,
    _decode_all,
    _decode_folder,
    _Entry,
    _hwc,
    _image_suffixes,
    _layout_root,
    _list_directory,
    _list_source,
    _list_tar,
    _list_zip,
    _read_cache,
    _read_file,
    _relative,
    _source_key,
    _tagged,
    _warn,
    _with_parents,
    _write_cache,
    default_cache_dir,
    load_image_folder,
)


# ----------------------------------------------------------------------------- CIFAR pickles


class CifarLayout(NamedTuple):
  """Where one CIFAR release keeps its pickles."""

  folder: str                 # the extracted folder's name
  train: tuple[str, ...]      # the train pickles, in order
  test: str
  meta: str
  labels_key: bytes           # the label list in each pickle
  names_key: bytes            # the class names in the meta pickle


CIFAR_LAYOUTS = {
    "cifar10": CifarLayout("cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
                           "test_batch", "batches.meta", b"labels", b"label_names"),
    "cifar100": CifarLayout("cifar-100-python", ("train",), "test", "meta", b"fine_labels",
                            b"fine_label_names"),
}


class _ArraysOnly(pickle.Unpickler):
  """Unpickles dicts, lists, strings, numbers and numpy arrays; refuses any other class (a
  pickle can run code: only what the CIFAR release holds is built)."""

  _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray",
                                                         "_reconstruct"),
              ("numpy", "ndarray"), ("numpy", "dtype"), ("copy_reg", "_reconstructor"),
              ("copyreg", "_reconstructor"), ("__builtin__", "object"), ("builtins", "object"),
              ("_codecs", "encode")}  # how Python 3 writes bytes in a protocol-2 pickle

  def find_class(self, module, name):
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR pickle")
    if name == "_reconstruct":
      return np.zeros(0).__reduce__()[0]  # numpy's own reconstructor, whatever its module
    if module == "numpy":
      return getattr(np, name)
    return super().find_class(module, name)


def load_cifar_pickle(name: str, path: str) -> Arrays:
  """Reads the CIFAR-10 or CIFAR-100 python release.

  Args:
    name: ``"cifar10"`` or ``"cifar100"`` (fine labels, 100 classes).
    path: ``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz`` (or any tar archive holding
      the folder below), the extracted ``cifar-10-batches-py`` / ``cifar-100-python`` folder,
      or a directory that holds that folder.

  Returns:
    :class:`Arrays`: images uint8 ``[N, 32, 32, 3]`` (the release's rows of 3,072 bytes,
    1,024 red then green then blue in row-major order), int32 labels: 50,000 / 10,000.

  Raises:
    ValueError: ``path`` is missing or holds no such release; a pickle is missing, unreadable,
      or holds something other than the release's dicts.

  Source: A. Krizhevsky, "Learning multiple layers of features from tiny images" (2009); the
  layout described on the authors' page (www.cs.toronto.edu/~kriz/cifar.html).
  """
  layout = CIFAR_LAYOUTS[name]
  if not isinstance(path, str) or not path:
    raise ValueError(f"data_path={path!r} is not allowed: give {layout.folder}/ or its "
                     f"{layout.folder.split('-batches')[0].replace('-python', '')}-python.tar.gz")
  if not os.path.exists(path):
    raise ValueError(f"data_path={path!r} does not exist")
  blobs = _cifar_blobs(path, layout)
  meta = _unpickle(blobs, layout.meta, path)
  try:
    classes = tuple(c.decode() if isinstance(c, bytes) else str(c)
                    for c in meta[layout.names_key])
  except (KeyError, TypeError, AttributeError):
    raise ValueError(f"data_path={path!r}: {layout.meta} has no {layout.names_key.decode()!r} "
                     f"list") from None
  splits = []
  for parts in (layout.train, (layout.test,)):
    xs, ys = [], []
    for part in parts:
      d = _unpickle(blobs, part, path)
      try:
        x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        y = np.asarray(d[layout.labels_key], np.int32)
      except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"data_path={path!r}: {part} is not a CIFAR batch ({e}): it needs "
                         f"b'data' [N, 3072] uint8 and {layout.labels_key!r}") from None
      if x.shape[0] != y.shape[0] or (y.size and (y.min() < 0 or y.max() >= len(classes))):
        raise ValueError(f"data_path={path!r}: {part} holds {x.shape[0]} images and "
                         f"{y.shape[0]} labels in [{y.min(initial=0)}, {y.max(initial=0)}]: "
                         f"one label in [0, {len(classes)}) per image is needed")
      xs.append(np.ascontiguousarray(x))
      ys.append(y)
    splits.append((np.concatenate(xs), np.concatenate(ys)))
  return Arrays(*splits[0], *splits[1], classes)


def _cifar_blobs(path: str, layout: CifarLayout) -> dict[str, bytes] | str:
  """The release's files: a dict of name -> bytes from an archive, or the folder's path."""
  if os.path.isdir(path):
    inner = os.path.join(path, layout.folder)
    if os.path.isdir(inner):
      return inner
    if os.path.exists(os.path.join(path, layout.meta)):
      return path
    raise ValueError(f"data_path={path!r} holds neither {layout.folder}/ nor its files "
                     f"({layout.meta}, {layout.test}, ...)")
  wanted = set(layout.train) | {layout.test, layout.meta}
  blobs = {}
  try:
    with tarfile.open(path, mode="r|*") as tar:
      for m in tar:
        base = os.path.basename(m.name)
        if m.isfile() and base in wanted:
          blobs[base] = tar.extractfile(m).read()
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ValueError(f"data_path={path!r} could not be read as a tar archive "
                     f"({type(e).__name__}: {e})") from None
  return blobs


def _unpickle(blobs: dict[str, bytes] | str, part: str, path: str) -> dict:
  try:
    if isinstance(blobs, str):
      with open(os.path.join(blobs, part), "rb") as f:
        raw = f.read()
    else:
      raw = blobs[part]
  except (KeyError, FileNotFoundError):
    raise ValueError(f"data_path={path!r} has no {part}: the CIFAR release needs it") from None
  try:
    d = _ArraysOnly(io.BytesIO(raw), encoding="bytes").load()
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"data_path={path!r}: {part} could not be unpickled "
                     f"({type(e).__name__}: {e})") from None
  if not isinstance(d, dict):
    raise ValueError(f"data_path={path!r}: {part} holds a {type(d).__name__}, not a dict")
  return d


# ----------------------------------------------------------------------------- text


def read_text(path: str) -> str:
  """A UTF-8 text file's content (``.gz``: decompressed first).

  Raises:
    ValueError: ``path`` is missing, unreadable, not UTF-8 or empty (naming the path).
  """
  if not isinstance(path, str) or not path:
    raise ValueError(f"data_path={path!r} is not allowed: give a UTF-8 text file")
  if not os.path.isfile(path):
    raise ValueError(f"data_path={path!r} is not a file")
  try:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
      raw = f.read()
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"data_path={path!r} is not UTF-8 text ({e})") from None
  except (OSError, EOFError) as e:
    raise ValueError(f"data_path={path!r} could not be read ({type(e).__name__}: {e})") from None
  if not text:
    raise ValueError(f"data_path={path!r} is empty: a text data set needs characters")
  return text

