"""Character-level text data sets for language modelling and their partition across workers.

Everything here is host-side numpy; :mod:`nbsgd_jax.data` re-exports every public name, so
``nbsgd_jax.data.load_text_dataset`` and the others are the names the package uses.

Corpora (:func:`load_text_dataset`, :class:`TextDataset`):

* ``"tiny_shakespeare"`` (embedded, ``nbsgd_jax/assets/tiny_shakespeare.txt.gz``) and
  ``"text_file"`` (a UTF-8 text file at ``data_path``), split as nanoGPT's
  ``shakespeare_char`` (:func:`split_text`);
* ``"tfds:<name>"``: a TFDS text set with a ``text`` feature and ``train``/``test`` splits
  (e.g. ``"tfds:tiny_shakespeare"``), read through :mod:`nbsgd_jax.data.tfds` the same way as
  the image sets, with a vocabulary built from the train split.

Tokenisation: characters to ids and back (:func:`encode_text`, :func:`decode_text`), with a
reserved unknown id (``unknown_id=False``: none, nanoGPT's exact ``stoi``). Partition:
:func:`partition_text` gives every worker the whole train stream (``"iid"``: i.i.d. windows)
or cuts it into ``n`` equal contiguous chunks (``"contiguous"``), ``[n, L]``.
"""

from __future__ import annotations

import importlib.resources
from typing import NamedTuple

import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.data import disk as disk_data
from nbsgd_jax.data import tfds as tfds_data
from nbsgd_jax.data.tfds import TEXT_FEATURE  # noqa: F401  (re-exported)

TEXT_DATASETS = ("tiny_shakespeare", "text_file")  # besides "tfds:<name>"
TEXT_TRAIN_FRACTION = 0.9  # nanoGPT's shakespeare_char split: first 90 % train, rest validation
TEXT_DATASETS_HELP = ("use 'tiny_shakespeare' (embedded), 'text_file' (with data_path) or "
                      "'tfds:<name>' for a TFDS text data set (e.g. 'tfds:tiny_shakespeare')")
TEXT_SCHEMES = ("iid", "contiguous")
UNKNOWN_CHAR = "\ufffd"  # what decode_text writes for the reserved unknown id

_check_int = checks.index_at_least


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
      the reserved unknown id (never present in ``train_tokens``); ``len(vocab)`` when loaded
      with ``unknown_id=False`` (no reserved id: every id is a character).
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
                      data_path: str | None = None, unknown_id: bool = True) -> TextDataset:
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
    unknown_id: reserve the unknown id ``len(vocab)`` (``vocab_size = len(vocab) + 1``);
      False: ``vocab_size = len(vocab)``, the ids exactly nanoGPT's ``stoi`` (``config.
      text_unknown_id``).

  Returns:
    A :class:`TextDataset`. For ``"tfds:*"``: each split's examples are concatenated in record order, with no
    separator, and decoded as UTF-8. ``vocab`` is the sorted set of characters of the
    train split; ``train_tokens`` / ``test_tokens`` are int32 ids (see :func:`encode_text`);
    test characters absent from train map to the reserved unknown id
    ``vocab_size - 1 == len(vocab)`` rather than raising, so ``vocab_size`` depends on the
    train split only. The ``validation`` split is not read.

  Raises:
    ValueError: ``name`` is none of these; the ``"text_file"`` at ``data_path`` is missing,
      unreadable, not UTF-8 or empty (:func:`nbsgd_jax.data.disk.read_text`); a split of
      :func:`split_text` would hold fewer than 2 characters; a ``"tfds:*"`` data set is
      unknown, not prepared locally in ``data_dir`` or unreadable (nothing is downloaded at
      run time: prepare it beforehand, e.g. ``tfds build tiny_shakespeare
      --file_format=array_record``); a record has no ``text`` string or is not valid UTF-8; a
      split is empty (no characters); ``unknown_id=False`` and a test character is absent
      from a ``"tfds:*"`` train split.
      Preparing ``tiny_shakespeare`` runs its TFDS builder, which reads the download with
      ``tf.io.gfile`` and so needs TensorFlow where it is prepared; reading it here does not.

  Source: TFDS ``tiny_shakespeare`` (Karpathy 2015, char-rnn, "The Unreasonable
  Effectiveness of Recurrent Neural Networks"), read through ``tfds.data_source``
  (ArrayRecord random access, no TensorFlow needed).
  """
  if name == "tiny_shakespeare":
    resource = importlib.resources.files("nbsgd_jax") / "assets" / "tiny_shakespeare.txt.gz"
    with importlib.resources.as_file(resource) as path:
      return split_text(disk_data.read_text(str(path)), name, unknown_id=unknown_id)
  if name == "text_file":
    return split_text(disk_data.read_text(data_path), name, unknown_id=unknown_id)
  if not (isinstance(name, str) and name.startswith("tfds:") and name[len("tfds:"):].strip()):
    raise ValueError(f"dataset={name!r} is not allowed: {TEXT_DATASETS_HELP}")
  train_text, test_text = tfds_data.read_text_splits(name, name[len("tfds:"):].strip(), data_dir)
  train_cps = _code_points(train_text)
  vocab = "".join(map(chr, np.unique(train_cps).tolist()))
  test_tokens = encode_text(test_text, vocab)
  if not unknown_id and np.any(test_tokens == len(vocab)):
    unknown = sorted(set(test_text) - set(vocab))
    raise ValueError(f"unknown_id=False is not allowed with dataset={name!r}: its test split "
                     f"holds {len(unknown)} characters absent from its train split (e.g. "
                     f"{unknown[:5]!r}), which need the reserved unknown id")
  return TextDataset(
      name=name,
      train_tokens=encode_text(train_text, vocab),
      test_tokens=test_tokens,
      vocab=vocab,
      vocab_size=len(vocab) + int(unknown_id),
  )


def split_text(text: str, name: str, train_fraction: float = TEXT_TRAIN_FRACTION,
               unknown_id: bool = True) -> TextDataset:
  """A character corpus split as nanoGPT's ``shakespeare_char``.

  Args:
    text: the whole corpus.
    name: the data set's name (kept in the result).
    train_fraction: the leading fraction of the characters that trains, in ``(0, 1)``.
    unknown_id: keep the reserved (never used) unknown id; False: ``vocab_size =
      len(vocab)``, nanoGPT's ``vocab_size`` and ``stoi`` exactly.

  Returns:
    A :class:`TextDataset` whose ``train_tokens`` are the first ``int(len(text) *
    train_fraction)`` characters and ``test_tokens`` the rest (the validation split), with
    ``vocab`` every distinct character of the whole text sorted by code point (so no
    validation character is unknown); ``vocab_size = len(vocab) + 1`` keeps the reserved
    unknown id of :func:`encode_text` (``len(vocab)`` with ``unknown_id=False``).

  Raises:
    ValueError: a split would hold fewer than 2 characters (one input and its target).

  Source: karpathy/nanoGPT, ``data/shakespeare_char/prepare.py`` (``chars =
  sorted(list(set(data)))``; ``train_data = data[:int(n*0.9)]``, ``val_data =
  data[int(n*0.9):]``; ``stoi = { ch:i for i,ch in enumerate(chars) }``, ``vocab_size =
  len(chars)``).
  """
  cut = int(len(text) * train_fraction)
  if cut < 2 or len(text) - cut < 2:
    raise ValueError(f"dataset={name!r}: the text holds {len(text)} characters: its "
                     f"{train_fraction:.0%} / {1 - train_fraction:.0%} split needs >= 2 in each")
  vocab = "".join(map(chr, np.unique(_code_points(text)).tolist()))
  return TextDataset(name=name, train_tokens=encode_text(text[:cut], vocab),
                     test_tokens=encode_text(text[cut:], vocab), vocab=vocab,
                     vocab_size=len(vocab) + int(unknown_id))


def partition_text(
    tokens: np.ndarray, num_workers: int, scheme: str = "iid", min_length: int = 1
) -> np.ndarray:
  """The workers' token streams: the whole stream for each, or equal contiguous shards.

  Args:
    tokens: integer ``[N]`` (e.g. ``TextDataset.train_tokens``).
    num_workers: ``n >= 1``.
    scheme: ``"iid"``: every worker holds the whole stream and draws its windows from all of
      it with its own random stream (i.i.d. data: the i.i.d. shards of DiLoCo, Douillard et al.
      2023, Sec. 3; ``n x N`` tokens held); ``"contiguous"``: ``n`` equal contiguous chunks in
      stream order (each worker's windows from its own part of the text: non-i.i.d. for a
      text whose parts differ). ``"dirichlet"`` is rejected: Dirichlet label skew
      (:func:`nbsgd_jax.data.partition`) needs per-example class labels, which a token stream
      does not have.
    min_length: every chunk must hold at least this many tokens, ``>= 1`` (e.g.
      ``seq_len + 1`` so that one input/target window fits).

  Returns:
    int32 ``[n, L]``: ``"iid"``: ``L = N``, every row ``tokens``; ``"contiguous"``:
    ``L = N // n``, row ``i`` is ``tokens[i * L:(i + 1) * L]`` (the last ``N % n`` tokens
    dropped, so every row is fully valid: no padding and no ``sizes``, unlike
    :func:`nbsgd_jax.data.stack_shards`). Deterministic: no seed.

  Raises:
    ValueError: ``tokens`` is not a non-empty 1-D integer array; ``num_workers`` is not an
      integer ``>= 1``; ``scheme`` is not in :data:`TEXT_SCHEMES` (``"dirichlet"`` with its
      own message); ``min_length`` is not an integer ``>= 1`` or a row would be shorter.

  Source: none (per-worker rows of a character stream).
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
        "class labels and a token stream has none; use scheme='iid' (the whole stream for "
        "every worker) or 'contiguous' (equal contiguous chunks)"
    )
  if scheme not in TEXT_SCHEMES:
    raise ValueError(f"scheme={scheme!r} is not allowed for text: use one of {TEXT_SCHEMES}")
  min_length = _check_int("min_length", min_length, 1)
  length = t.shape[0] if scheme == "iid" else t.shape[0] // n
  if length < min_length:
    raise ValueError(
        f"num_workers={n} is not allowed with {t.shape[0]} tokens and min_length={min_length}: "
        f"each worker's chunk would hold {length} tokens; it needs >= min_length"
    )
  if scheme == "iid":
    return np.broadcast_to(t.astype(np.int32), (n, length)).copy()
  return t[: n * length].reshape(n, length).astype(np.int32)
