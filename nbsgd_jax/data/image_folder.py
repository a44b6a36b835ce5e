"""Image folders read from disk (:func:`load_image_folder`), the :class:`Arrays` every reader of
:mod:`nbsgd_jax.data.disk` returns, and the cache of decoded images: no TensorFlow, no network.

An **image folder** is laid out ``train/<class>/<image>`` and ``test/<class>/<image>``, as a
directory or a ``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz`` or ``.zip`` archive
(the layout torchvision's ``ImageFolder`` reads; one wrapping folder is allowed). Classes
sorted by name are labels ``0..C-1``; an image is any file whose extension Pillow reads
(``PIL.Image.registered_extensions``); other files and hidden files are skipped. The images
are decoded with Pillow once and cached as ``.npz`` in a cache directory, keyed by the
source's path, size and modification time (a directory: every file's).
:mod:`nbsgd_jax.data.disk` re-exports these names (the module to import).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import os
import sys
import tarfile
import zipfile
from typing import Callable, NamedTuple

import numpy as np

from nbsgd_jax.core import files


SPLITS = ("train", "test")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")
CACHE_FORMAT = 1  # bump when the cached arrays change meaning
CACHE_OFF = "none"
_DECODE_THREADS = 8


class Arrays(NamedTuple):
  """One data set's arrays: uint8 images ``[N, H, W, C]`` and int32 labels ``[N]`` per split,
  and the class names (label ``i`` is ``classes[i]``)."""

  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  classes: tuple[str, ...]


def default_cache_dir() -> str:
  """``$XDG_CACHE_HOME/nbsgd_jax`` (default ``~/.cache/nbsgd_jax``)."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "nbsgd_jax")


# ----------------------------------------------------------------------------- image folders


class _Entry(NamedTuple):
  split: str
  label: str  # class folder name
  name: str   # path inside the source, for messages
  read: Callable[[], bytes]  # the file's bytes


def load_image_folder(path: str, cache_dir: str | None = None,
                      progress: bool = False) -> Arrays:
  """Reads an image folder (a directory or an archive) into arrays, through the cache.

  Args:
    path: a directory or an archive (``ARCHIVE_SUFFIXES``) holding ``train/<class>/<image>``
      and ``test/<class>/<image>``, at its top or inside one wrapping folder.
    cache_dir: where the decoded arrays are kept (``None``: :func:`default_cache_dir`;
      ``"none"``: no cache). The cache file's name holds a hash of the path, its size and
      modification time (a directory: of every file's), so a changed source is decoded anew.
    progress: show a tqdm bar while decoding.

  Returns:
    :class:`Arrays`: images uint8 ``[N, H, W, C]`` (``C = 1`` when every image is greyscale,
    else 3: other modes are converted to RGB) in the order (class, file name); labels int32,
    the index of the class folder's name among the train split's sorted class names (as
    torchvision's ``ImageFolder``).

  Raises:
    ValueError: ``path`` is missing or neither a directory nor a known archive; the archive
      cannot be read; ``train/`` or ``test/`` is missing; a class folder holds no image; a
      test class is not a train class; an image cannot be decoded; images differ in size or
      channels (naming the first odd file and the first file's shape).

  Source: the layout of torchvision's ``datasets.ImageFolder`` (classes = sorted folder names).
  """
  key = _source_key(path)
  cache = _cache_path(path, key, cache_dir)
  if cache and os.path.exists(cache):
    try:
      return _read_cache(cache)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # decoded anew, replaced
      _warn(f"the cached arrays {cache} cannot be read ({type(e).__name__}): decoding the "
            "images again and replacing them")
  arrays = _decode_folder(path, progress)
  if cache:
    try:
      os.makedirs(os.path.dirname(cache), exist_ok=True)
      files.atomic_save(cache, lambda tmp: _write_cache(tmp, arrays))
    except OSError as e:  # an unwritable cache only costs the next run the decoding
      _warn(f"config.data_cache: the decoded images cannot be cached in "
            f"{os.path.dirname(cache)!r} ({e.strerror or type(e).__name__}): the next run "
            "decodes them again; give a writable directory, or 'none' for no cache")
  return arrays


def _warn(line: str) -> None:
  print(f"warning: {line}", file=sys.stderr, flush=True)


def _source_key(path: str) -> str:
  """A hash of the source's identity: its absolute path, size and mtime (every file's for a
  directory)."""
  if not isinstance(path, str) or not path:
    raise ValueError(f"data_path={path!r} is not allowed: give the image folder's directory "
                     f"or archive ({', '.join(ARCHIVE_SUFFIXES)})")
  if not os.path.exists(path):
    raise ValueError(f"data_path={path!r} does not exist")
  h = hashlib.sha256(f"{CACHE_FORMAT}:{os.path.abspath(path)}".encode())
  if os.path.isdir(path):
    for root, dirs, names in os.walk(path):
      dirs.sort()
      for name in sorted(names):
        st = os.stat(os.path.join(root, name))
        h.update(f"{os.path.relpath(os.path.join(root, name), path)}:{st.st_size}:"
                 f"{st.st_mtime_ns};".encode())
  else:
    st = os.stat(path)
    h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
  return h.hexdigest()[:16]


def _cache_path(path: str, key: str, cache_dir: str | None) -> str | None:
  if cache_dir == CACHE_OFF:
    return None
  stem = os.path.basename(os.path.normpath(path)).split(".")[0] or "images"
  return os.path.join(cache_dir or default_cache_dir(), f"image_folder-{stem}-{key}.npz")


def _write_cache(tmp: str, a: Arrays) -> None:
  with open(tmp, "wb") as f:
    np.savez(f, train_images=a.train_images, train_labels=a.train_labels,
             test_images=a.test_images, test_labels=a.test_labels,
             classes=np.asarray(a.classes, dtype=str))
    f.flush()
    os.fsync(f.fileno())


def _read_cache(cache: str) -> Arrays:
  with np.load(cache, allow_pickle=False) as z:
    return Arrays(z["train_images"], z["train_labels"], z["test_images"], z["test_labels"],
                  tuple(str(c) for c in z["classes"]))


def _image_suffixes() -> frozenset[str]:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  return frozenset(s.lower() for s in Image.registered_extensions())


def _decode_folder(path: str, progress: bool) -> Arrays:
  """Decodes every image of the source (no cache)."""
  entries, class_dirs = _list_source(path)
  top = _layout_root(path, class_dirs)
  by_split: dict[str, dict[str, list[_Entry]]] = {s: {} for s in SPLITS}
  for d in class_dirs:
    parts = _relative(d, top)
    if len(parts) == 2 and parts[0] in SPLITS:
      by_split[parts[0]].setdefault(parts[1], [])
  for e in entries:
    parts = _relative(e.name, top)
    if len(parts) == 3 and parts[0] in SPLITS:
      by_split[parts[0]].setdefault(parts[1], []).append(e)
  for split in SPLITS:
    if not by_split[split]:
      raise ValueError(f"data_path={path!r} has no {split}/<class>/<image> files: an image "
                       f"folder needs train/<class>/<image> and test/<class>/<image>")
    for label, items in sorted(by_split[split].items()):
      if not items:
        raise ValueError(f"data_path={path!r}: class folder {split}/{label} holds no image "
                         f"(images are files Pillow reads, e.g. .png, .jpg)")
  classes = tuple(sorted(by_split["train"]))
  extra = sorted(set(by_split["test"]) - set(classes))
  if extra:
    raise ValueError(f"data_path={path!r}: test class folder {extra[0]!r} is not a train class "
                     f"({len(classes)} train classes): both splits must use the train classes")
  ordered = [sorted(by_split[s][c], key=lambda e: e.name) for s in SPLITS
             for c in classes if c in by_split[s]]
  flat = [e for items in ordered for e in items]
  images = _decode_all(path, flat, progress)
  index = {c: i for i, c in enumerate(classes)}
  out = {}
  start = 0
  for split in SPLITS:
    split_entries = [e for e in flat if e.split == split]
    x = images[start:start + len(split_entries)]
    start += len(split_entries)
    out[split] = (x, np.asarray([index[e.label] for e in split_entries], np.int32))
  return Arrays(*out["train"], *out["test"], classes)


def _relative(name: str, top: str) -> list[str]:
  name = name.strip("/")
  if top:
    if not name.startswith(top + "/"):
      return []
    name = name[len(top) + 1:]
  return [p for p in name.split("/") if p]


def _layout_root(path: str, dirs: list[str]) -> str:
  """``""`` when ``train/`` and ``test/`` are at the top, else the one wrapping folder that
  holds them."""
  tops = {d.strip("/").split("/")[0] for d in dirs}
  if tops & set(SPLITS):
    return ""
  wrapped = {"/".join(d.strip("/").split("/")[:2]) for d in dirs if d.count("/") >= 1}
  roots = {w.split("/")[0] for w in wrapped if w.split("/")[-1] in SPLITS}
  if len(roots) == 1:
    return roots.pop()
  missing = "train/ and test/" if not roots else f"one folder holding train/ and test/ " \
      f"(found {sorted(roots)})"
  raise ValueError(f"data_path={path!r} has no {missing} at its top: an image folder is laid "
                   f"out train/<class>/<image> and test/<class>/<image>")


def _list_source(path: str) -> tuple[list[_Entry], list[str]]:
  """The source's image files (with a reader each) and its directories, as '/'-separated
  names relative to the source."""
  suffixes = _image_suffixes()
  is_image = lambda n: (not os.path.basename(n).startswith(".")
                        and os.path.splitext(n)[1].lower() in suffixes)
  if os.path.isdir(path):
    return _list_directory(path, is_image)
  lower = path.lower()
  if not lower.endswith(ARCHIVE_SUFFIXES):
    raise ValueError(f"data_path={path!r} is neither a directory nor an archive "
                     f"({', '.join(ARCHIVE_SUFFIXES)})")
  try:
    if lower.endswith(".zip"):
      return _list_zip(path, is_image)
    return _list_tar(path, is_image)
  except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
    if isinstance(e, ValueError) and str(e).startswith("data_path="):
      raise
    raise ValueError(f"data_path={path!r} could not be read as an archive "
                     f"({type(e).__name__}: {e})") from None


def _list_directory(path, is_image):
  entries, dirs = [], []
  for root, subdirs, names in os.walk(path):
    subdirs.sort()
    rel = os.path.relpath(root, path).replace(os.sep, "/")
    if rel != ".":
      dirs.append(rel)
    for n in sorted(names):
      name = n if rel == "." else f"{rel}/{n}"
      full = os.path.join(root, n)
      if is_image(name):
        entries.append(_Entry("", "", name, lambda full=full: _read_file(full)))
  return _tagged(entries), dirs


def _read_file(full: str) -> bytes:
  with open(full, "rb") as f:
    return f.read()


def _list_zip(path, is_image):
  with zipfile.ZipFile(path) as z:
    contents = {i.filename: z.read(i) for i in z.infolist()
                if not i.is_dir() and is_image(i.filename)}
    dirs = {os.path.dirname(i.filename.rstrip("/")) for i in z.infolist()}
    dirs |= {i.filename.rstrip("/") for i in z.infolist() if i.is_dir()}
  entries = [_Entry("", "", n, lambda b=b: b) for n, b in contents.items()]
  return _tagged(entries), _with_parents(dirs)


def _list_tar(path, is_image):
  entries, dirs = [], set()
  with tarfile.open(path, mode="r|*") as tar:  # streamed: one pass over a compressed file
    for m in tar:
      name = m.name[2:] if m.name.startswith("./") else m.name
      if m.isdir():
        dirs.add(name.rstrip("/"))
      elif m.isfile():
        dirs.add(os.path.dirname(name))
        if is_image(name):
          data = tar.extractfile(m).read()
          entries.append(_Entry("", "", name, lambda b=data: b))
  return _tagged(entries), _with_parents(dirs)


def _with_parents(dirs: set[str]) -> list[str]:
  out = set()
  for d in dirs:
    parts = [p for p in d.split("/") if p]
    out |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
  return sorted(out)


def _tagged(entries: list[_Entry]) -> list[_Entry]:
  """Fills in each entry's split and class from its last three path parts."""
  out = []
  for e in entries:
    parts = e.name.strip("/").split("/")
    if len(parts) >= 3:
      out.append(e._replace(split=parts[-3], label=parts[-2]))
  return out


def _decode_all(path: str, entries: list[_Entry], progress: bool) -> np.ndarray:
  """uint8 ``[N, H, W, C]``: every entry decoded (threads: Pillow releases the GIL)."""
  if not entries:
    return np.zeros((0, 1, 1, 1), np.uint8)
  decoded = [None] * len(entries)

  def decode(i):
    e = entries[i]
    try:
      from PIL import Image  # pylint: disable=g-import-not-at-top
      with Image.open(io.BytesIO(e.read())) as im:
        im = im.convert("L") if im.mode in ("L", "1", "I", "I;16", "F") else im.convert("RGB")
        a = np.asarray(im, dtype=np.uint8)
    except Exception as err:  # pylint: disable=broad-except
      raise ValueError(f"data_path={path!r}: image {e.name} could not be decoded "
                       f"({type(err).__name__}: {err})") from None
    decoded[i] = a if a.ndim == 3 else a[..., None]

  bar = None
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=len(entries), desc="decoding images", unit="img", leave=False)
  with concurrent.futures.ThreadPoolExecutor(_DECODE_THREADS) as pool:
    for _ in pool.map(decode, range(len(entries))):
      if bar is not None:
        bar.update(1)
  if bar is not None:
    bar.close()
  shape = decoded[0].shape
  for e, a in zip(entries, decoded):
    if a.shape != shape:
      raise ValueError(
          f"data_path={path!r}: image {e.name} is {_hwc(a.shape)} while {entries[0].name} is "
          f"{_hwc(shape)}: all images of an image folder must have one size and one number of "
          f"channels")
  return np.stack(decoded)


def _hwc(shape) -> str:
  return "x".join(str(s) for s in shape)
