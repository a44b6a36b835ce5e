"""Tests for nbsgd_jax.data: loading, partitioning and stacking."""

from __future__ import annotations

import importlib.resources

import chex
import numpy as np
import pytest

from nbsgd_jax import data

# Class counts of the full mnist10k file, from nbsgd_jax/assets/MNIST10K_README.md.
MNIST10K_CLASS_COUNTS = [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]


@pytest.fixture(scope="module")
def mnist10k() -> data.Dataset:
  return data.load_dataset("mnist10k")


@pytest.fixture(scope="module")
def raw_npz() -> dict[str, np.ndarray]:
  resource = importlib.resources.files("nbsgd_jax") / "assets" / "mnist10k.npz"
  with importlib.resources.as_file(resource) as path, np.load(path) as npz:
    return {"images": npz["images"], "labels": npz["labels"]}


def _entropy(hist: np.ndarray) -> np.ndarray:
  p = hist / hist.sum(axis=1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    return -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


# ----------------------------------------------------------------------------- mnist10k


def test_mnist10k_shapes_and_dtypes(mnist10k):
  chex.assert_shape(mnist10k.train_images, (8000, 28, 28, 1))
  chex.assert_shape(mnist10k.test_images, (2000, 28, 28, 1))
  chex.assert_shape(mnist10k.train_labels, (8000,))
  chex.assert_shape(mnist10k.test_labels, (2000,))
  assert mnist10k.train_images.dtype == np.uint8
  assert mnist10k.test_images.dtype == np.uint8
  assert mnist10k.train_labels.dtype == np.int32
  assert mnist10k.test_labels.dtype == np.int32
  assert mnist10k.num_classes == 10
  assert mnist10k.name == "mnist10k"
  assert mnist10k.train_labels.min() >= 0 and mnist10k.train_labels.max() <= 9
  assert mnist10k.train_images.max() > 200  # ink present: real digits, not zeros


def test_mnist10k_class_counts_match_readme(raw_npz, mnist10k):
  np.testing.assert_array_equal(np.bincount(raw_npz["labels"], minlength=10),
                                MNIST10K_CLASS_COUNTS)
  both = np.concatenate([mnist10k.train_labels, mnist10k.test_labels])
  np.testing.assert_array_equal(np.bincount(both, minlength=10), MNIST10K_CLASS_COUNTS)


def test_mnist10k_split_is_fixed_and_disjoint(raw_npz, mnist10k):
  perm = np.random.default_rng(0).permutation(10000)
  train, test = perm[:8000], perm[8000:]
  assert np.intersect1d(train, test).size == 0
  assert np.union1d(train, test).size == 10000
  np.testing.assert_array_equal(mnist10k.train_images[..., 0], raw_npz["images"][train])
  np.testing.assert_array_equal(mnist10k.test_images[..., 0], raw_npz["images"][test])
  np.testing.assert_array_equal(mnist10k.train_labels, raw_npz["labels"][train])
  np.testing.assert_array_equal(mnist10k.test_labels, raw_npz["labels"][test])
  again = data.load_dataset("mnist10k")
  for a, b in zip(mnist10k, again):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["foo", "mnist", "tfds:", "tfds: ", "MNIST10K", 3])
def test_load_dataset_rejects_bad_name(name):
  with pytest.raises(ValueError, match="dataset=.*is not allowed.*mnist10k.*tfds:"):
    data.load_dataset(name)


# ----------------------------------------------------------------------------- tfds


def test_tfds_mnist_with_mock_data():
  import tensorflow_datasets as tfds  # a required dependency: fail, never skip
  with tfds.testing.mock_data(num_examples=37):
    ds = data.load_dataset("tfds:mnist")
  chex.assert_shape(ds.train_images, (37, 28, 28, 1))
  chex.assert_shape(ds.test_images, (37, 28, 28, 1))
  chex.assert_shape(ds.train_labels, (37,))
  chex.assert_shape(ds.test_labels, (37,))
  assert ds.train_images.dtype == np.uint8 and ds.test_images.dtype == np.uint8
  assert ds.train_labels.dtype == np.int32 and ds.test_labels.dtype == np.int32
  assert ds.num_classes == 10
  assert ds.name == "tfds:mnist"
  assert ds.train_labels.min() >= 0 and ds.train_labels.max() < 10


def test_tfds_unknown_name_raises():
  import tensorflow_datasets as tfds  # a required dependency: fail, never skip
  with tfds.testing.mock_data(num_examples=5):
    with pytest.raises(ValueError, match=r"dataset='tfds:no_such_dataset_xyz'.*data_dir"):
      data.load_dataset("tfds:no_such_dataset_xyz")


def test_tfds_missing_data_dir_raises_without_download(tmp_path):
  import tensorflow_datasets  # noqa: F401  (required dependency)
  with pytest.raises(ValueError, match=r"data_dir=.*Nothing is downloaded"):
    data.load_dataset("tfds:mnist", data_dir=str(tmp_path))
  assert not any(p.is_file() for p in tmp_path.rglob("*"))


class _FakeSource:
  """A random-access source with batched access, [H, W] images and no metadata."""

  def __init__(self, n: int, seed: int):
    rng = np.random.default_rng(seed)
    self.images = rng.integers(0, 256, size=(n, 5, 4), dtype=np.uint8)
    self.labels = rng.integers(0, 3, size=n)
    self.labels[0] = 6  # num_classes falls back to max + 1 = 7
    self.batched_calls = 0

  def __len__(self):
    return len(self.labels)

  def __getitem__(self, i):
    return {"image": self.images[i], "label": self.labels[i]}

  def __getitems__(self, keys):
    self.batched_calls += 1
    return [self[k] for k in keys]


def test_tfds_batched_access_channel_axis_and_class_fallback(monkeypatch):
  import tensorflow_datasets as tfds  # a required dependency: fail, never skip
  sources = {"train": _FakeSource(2500, 0), "test": _FakeSource(30, 1)}
  calls = []

  def fake_data_source(name, *, split, data_dir=None, download=True):
    calls.append((name, split, data_dir, download))
    return sources[split]

  monkeypatch.setattr(tfds, "data_source", fake_data_source)
  ds = data.load_dataset("tfds:fake", data_dir="/some/dir")
  assert calls == [("fake", "train", "/some/dir", False), ("fake", "test", "/some/dir", False)]
  assert sources["train"].batched_calls == 3  # 2500 examples in chunks of 1024
  chex.assert_shape(ds.train_images, (2500, 5, 4, 1))
  chex.assert_shape(ds.test_images, (30, 5, 4, 1))
  np.testing.assert_array_equal(ds.train_images[..., 0], sources["train"].images)
  np.testing.assert_array_equal(ds.test_labels, sources["test"].labels)
  assert ds.train_labels.dtype == np.int32
  assert ds.num_classes == 7


# ----------------------------------------------------------------------------- partition


def _assert_disjoint_cover(shards, n):
  for s in shards:
    assert s.dtype == np.int64
    assert np.all(np.diff(s) > 0)  # sorted, no repeats
  allidx = np.concatenate(shards)
  assert allidx.size == n
  np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


@pytest.mark.parametrize("num, n", [(100, 7), (8000, 8), (5, 5), (1, 1)])
def test_iid_partition_disjoint_cover_balanced(num, n):
  labels = np.arange(num) % 10
  shards = data.partition(labels, n, "iid", seed=3)
  assert len(shards) == n
  _assert_disjoint_cover(shards, num)
  sizes = [len(s) for s in shards]
  assert max(sizes) - min(sizes) <= 1


def test_iid_partition_seeded(mnist10k):
  y = mnist10k.train_labels
  a = data.partition(y, 8, "iid", seed=1)
  b = data.partition(y, 8, "iid", seed=1)
  c = data.partition(y, 8, "iid", seed=2)
  for x, z in zip(a, b):
    np.testing.assert_array_equal(x, z)
  assert any(not np.array_equal(x, z) for x, z in zip(a, c))


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
def test_dirichlet_partition_disjoint_cover_min_size(mnist10k, alpha):
  y = mnist10k.train_labels
  shards = data.partition(y, 10, "dirichlet", alpha=alpha, seed=0, min_size=20)
  assert len(shards) == 10
  _assert_disjoint_cover(shards, y.size)
  assert min(len(s) for s in shards) >= 20
  again = data.partition(y, 10, "dirichlet", alpha=alpha, seed=0, min_size=20)
  for x, z in zip(shards, again):
    np.testing.assert_array_equal(x, z)


def test_dirichlet_seed_changes_partition(mnist10k):
  y = mnist10k.train_labels
  a = data.partition(y, 4, "dirichlet", alpha=0.5, seed=0)
  b = data.partition(y, 4, "dirichlet", alpha=0.5, seed=1)
  assert any(not np.array_equal(x, z) for x, z in zip(a, b))


def test_dirichlet_small_alpha_is_more_skewed(mnist10k):
  y = mnist10k.train_labels
  entropies = {}
  for alpha in (0.05, 100.0):
    ent = []
    for seed in range(3):
      shards = data.partition(y, 10, "dirichlet", alpha=alpha, seed=seed)
      ent.append(_entropy(data.label_histogram(y, shards, 10)).mean())
    entropies[alpha] = float(np.mean(ent))
  # log(10) = 2.30 is the entropy of a perfectly balanced worker.
  assert entropies[100.0] > 2.2
  assert entropies[0.05] < 1.2
  assert entropies[0.05] < entropies[100.0]


def test_dirichlet_unreachable_min_size_raises():
  labels = np.repeat(np.arange(2), 50)
  with pytest.raises(ValueError, match=r"alpha=.*num_workers=.*min_size="):
    data.partition(labels, 10, "dirichlet", alpha=1e-4, seed=0, min_size=10)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_workers=0), "num_workers"),
        (dict(num_workers=-2), "num_workers"),
        (dict(num_workers=2.5), "num_workers"),
        (dict(num_workers=True), "num_workers"),
        (dict(num_workers=101), "num_workers"),
        (dict(num_workers=2, scheme="pathological"), "scheme"),
        (dict(num_workers=2, scheme="dirichlet", alpha=0.0), "alpha"),
        (dict(num_workers=2, scheme="dirichlet", alpha=-1.0), "alpha"),
        (dict(num_workers=2, scheme="dirichlet", alpha=float("nan")), "alpha"),
        (dict(num_workers=2, alpha="big"), "alpha"),
        (dict(num_workers=2, seed=-1), "seed"),
        (dict(num_workers=2, min_size=-1), "min_size"),
        (dict(num_workers=4, min_size=26), "min_size"),
        (dict(num_workers=3, scheme="iid", min_size=34), "min_size"),
    ],
)
def test_partition_bad_inputs(kwargs, field):
  labels = np.arange(100) % 10
  with pytest.raises(ValueError, match=rf"{field}=.*not allowed"):
    data.partition(labels, **kwargs)


@pytest.mark.parametrize("labels", [np.zeros((3, 2), np.int32), np.array([], np.int32),
                                    np.array([0.5, 1.0])])
def test_partition_bad_labels(labels):
  with pytest.raises(ValueError, match="labels"):
    data.partition(labels, 1)


# ----------------------------------------------------------------------------- stacking


def test_stack_shards_shapes_padding_sizes():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(20, 4, 3, 2), dtype=np.uint8)
  labels = (np.arange(20) % 5).astype(np.int64)
  shards = [np.array([3, 1, 7]), np.array([0, 2, 4, 5, 6, 8]), np.array([19])]
  x, y, sizes = data.stack_shards(images, labels, shards)
  chex.assert_shape(x, (3, 6, 4, 3, 2))
  chex.assert_shape(y, (3, 6))
  chex.assert_shape(sizes, (3,))
  assert x.dtype == np.uint8
  assert y.dtype == np.int32
  assert sizes.dtype == np.int32
  np.testing.assert_array_equal(sizes, [3, 6, 1])
  for i, s in enumerate(shards):
    np.testing.assert_array_equal(x[i, :len(s)], images[s])
    np.testing.assert_array_equal(y[i, :len(s)], labels[s])
    for k in range(len(s), 6):  # padding repeats the shard's first row
      np.testing.assert_array_equal(x[i, k], images[s[0]])
      assert y[i, k] == labels[s[0]]


def test_stack_shards_from_partition(mnist10k):
  shards = data.partition(mnist10k.train_labels, 3, "iid", seed=0)
  x, y, sizes = data.stack_shards(mnist10k.train_images, mnist10k.train_labels, shards)
  chex.assert_shape(x, (3, 2667, 28, 28, 1))
  np.testing.assert_array_equal(sizes, [2667, 2667, 2666])
  assert int(sizes.sum()) == 8000


@pytest.mark.parametrize(
    "shards, match",
    [
        ([], "shards"),
        ([np.array([0, 1]), np.array([], np.int64)], r"shards\[1\]"),
        ([np.array([0, 10])], r"shards\[0\]"),
        ([np.array([-1])], r"shards\[0\]"),
        ([np.array([0.0, 1.0])], r"shards\[0\]"),
    ],
)
def test_stack_shards_bad_inputs(shards, match):
  images = np.zeros((10, 2, 2, 1), np.uint8)
  labels = np.zeros(10, np.int32)
  with pytest.raises(ValueError, match=match):
    data.stack_shards(images, labels, shards)


def test_stack_shards_length_mismatch():
  with pytest.raises(ValueError, match="images"):
    data.stack_shards(np.zeros((5, 2)), np.zeros(4, np.int32), [np.array([0])])


# ----------------------------------------------------------------------------- histogram


def test_label_histogram():
  labels = np.array([0, 1, 1, 2, 2, 2])
  hist = data.label_histogram(labels, [np.array([0, 1]), np.array([2, 3, 4, 5])], 4)
  np.testing.assert_array_equal(hist, [[1, 1, 0, 0], [0, 1, 3, 0]])
  with pytest.raises(ValueError, match="num_classes"):
    data.label_histogram(labels, [np.array([0])], 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_train_loss_examples_are_spread_over_every_iid_shard(seed):
  """``train_loss`` is measured on a uniform sample of the training set, not on the shards the
  partition's first draws make (workers 0 and 1 would hold all 1,000 of them). Reference: a
  uniform sample of 1,000 of 8,000 puts Hypergeometric(8000, 500, 1000) examples in each
  shard of 500, mean 62.5, std 7.4: within [25, 100] (5 std) with probability > 1 - 1e-5."""
  from nbsgd_jax.run import task
  shards = data.partition(np.zeros(8000, np.int64), 16, scheme="iid", seed=seed)
  sub = task.train_loss_examples(8000, 1000, seed)
  assert len(set(sub.tolist())) == 1000
  counts = [np.isin(s, sub).sum() for s in shards]
  assert 25 <= min(counts) and max(counts) <= 100, counts
  assert len(task.train_loss_examples(300, 1000, seed)) == 300


# ----------------------------------------------------------------------------- cifar (tfds)


@pytest.mark.parametrize("name, num_classes", [("tfds:cifar10", 10), ("tfds:cifar100", 100)])
def test_tfds_cifar_with_mock_data(name, num_classes):
  import tensorflow_datasets as tfds  # a required dependency: fail, never skip
  with tfds.testing.mock_data(num_examples=23):
    ds = data.load_dataset(name)
  chex.assert_shape(ds.train_images, (23, 32, 32, 3))
  chex.assert_shape(ds.test_images, (23, 32, 32, 3))
  chex.assert_shape(ds.train_labels, (23,))
  assert ds.train_images.dtype == np.uint8 and ds.test_images.dtype == np.uint8
  assert ds.train_labels.dtype == np.int32 and ds.test_labels.dtype == np.int32
  assert ds.num_classes == num_classes  # from the 'label' feature (not cifar100's coarse_label)
  assert ds.name == name
  assert 0 <= ds.train_labels.min() and ds.train_labels.max() < num_classes


# ----------------------------------------------------------------------------- text


def test_tfds_tiny_shakespeare_with_mock_data():
  import tensorflow_datasets as tfds  # a required dependency: fail, never skip
  with tfds.testing.mock_data(num_examples=3):
    ds = data.load_text_dataset("tfds:tiny_shakespeare")
    # Independent reference: the mocked records, read directly and tokenised in plain Python.
    raw = {}
    for split in ("train", "test"):
      source = tfds.data_source("tiny_shakespeare", split=split, download=False)
      raw[split] = "".join(source[i]["text"] for i in range(len(source)))
  vocab = "".join(sorted(set(raw["train"])))
  assert ds.name == "tfds:tiny_shakespeare"
  assert ds.vocab == vocab
  assert ds.vocab_size == len(vocab) + 1
  chex.assert_shape(ds.train_tokens, (len(raw["train"]),))
  chex.assert_shape(ds.test_tokens, (len(raw["test"]),))
  assert ds.train_tokens.dtype == np.int32 and ds.test_tokens.dtype == np.int32
  np.testing.assert_array_equal(ds.train_tokens, [vocab.index(c) for c in raw["train"]])
  np.testing.assert_array_equal(
      ds.test_tokens, [vocab.index(c) if c in vocab else len(vocab) for c in raw["test"]])
  assert data.decode_text(ds.train_tokens, ds.vocab) == raw["train"]


class _FakeTextSource:
  """A random-access text source with batched access and UTF-8 bytes records."""

  def __init__(self, texts):
    self.records = [{"text": t} for t in texts]
    self.batched_calls = 0

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    return self.records[i]

  def __getitems__(self, keys):
    self.batched_calls += 1
    return [self.records[k] for k in keys]


def _patch_text_sources(monkeypatch, train, test):
  import tensorflow_datasets as tfds  # a required dependency: fail, never skip
  sources = {"train": _FakeTextSource(train), "test": _FakeTextSource(test)}
  calls = []

  def fake_data_source(name, *, split, data_dir=None, download=True):
    calls.append((name, split, data_dir, download))
    return sources[split]

  monkeypatch.setattr(tfds, "data_source", fake_data_source)
  return sources, calls


def test_text_bytes_records_concatenated_and_unknown_test_chars(monkeypatch):
  train = ["ba\n".encode(), "c\u00e9".encode(), np.asarray("ab".encode(), dtype=object)]
  train += [b"a"] * 2000  # more records than one batched read of 1024
  test = [b"abz\xc3\xa9", "Q".encode()]  # 'z' and 'Q' are not in the train split
  sources, calls = _patch_text_sources(monkeypatch, train, test)
  ds = data.load_text_dataset("tfds:fake_text", data_dir="/some/dir")
  assert calls == [("fake_text", "train", "/some/dir", False),
                   ("fake_text", "test", "/some/dir", False)]
  assert sources["train"].batched_calls == 2
  train_text = "ba\nc\u00e9ab" + "a" * 2000
  assert ds.vocab == "\nabc\u00e9"  # sorted by code point
  assert ds.vocab_size == 6
  np.testing.assert_array_equal(ds.train_tokens[:7], [2, 1, 0, 3, 4, 1, 2])
  assert data.decode_text(ds.train_tokens, ds.vocab) == train_text
  unk = len(ds.vocab)
  np.testing.assert_array_equal(ds.test_tokens, [1, 2, unk, 4, unk])
  assert data.decode_text(ds.test_tokens, ds.vocab) == "ab\ufffd\u00e9\ufffd"


@pytest.mark.parametrize(
    "train, match",
    [
        ([b""], r"split 'train' holds no text"),
        ([b"ok", b"\xff\xfe"], r"split 'train' record 1 is not valid UTF-8"),
        ([b"ok", 7], r"split 'train' record 1 has a 'text' value of type int"),
    ],
)
def test_text_bad_records(monkeypatch, train, match):
  _patch_text_sources(monkeypatch, train, [b"ok"])
  with pytest.raises(ValueError, match=rf"dataset='tfds:fake_text': {match}"):
    data.load_text_dataset("tfds:fake_text")


def test_text_record_without_text_feature(monkeypatch):
  sources, _ = _patch_text_sources(monkeypatch, [b"ok"], [b"ok"])
  sources["test"].records = [{"image": np.zeros(3)}]
  with pytest.raises(ValueError, match=r"split 'test' record 0 has no 'text' feature"):
    data.load_text_dataset("tfds:fake_text")


def test_text_not_prepared_names_the_tfds_command(tmp_path):
  import tensorflow_datasets  # noqa: F401  (required dependency)
  with pytest.raises(ValueError) as info:
    data.load_text_dataset("tfds:tiny_shakespeare", data_dir=str(tmp_path))
  msg = str(info.value)
  assert f"dataset='tfds:tiny_shakespeare' with data_dir='{tmp_path}'" in msg
  assert "Nothing is downloaded at run time" in msg
  assert ("`tfds build tiny_shakespeare --data_dir=<dir> --file_format=array_record`"
          in msg), msg
  assert not any(p.is_file() for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("name", ["shakespeare", "tfds:", "tfds: ", "mnist10k", 3, None])
def test_load_text_dataset_rejects_bad_name(name):
  with pytest.raises(ValueError, match=r"dataset=.*is not allowed.*'tfds:<name>'"):
    data.load_text_dataset(name)


def test_encode_decode_text():
  vocab = " !ab"
  np.testing.assert_array_equal(data.encode_text("ab a!?", vocab), [2, 3, 0, 2, 1, 4])
  assert data.encode_text("", vocab).dtype == np.int32
  assert data.decode_text(np.array([3, 2, 0, 4]), vocab) == "ba \ufffd"
  np.testing.assert_array_equal(data.encode_text("xy", ""), [0, 0])  # all unknown
  with pytest.raises(ValueError, match=r"vocab=.*not allowed.*sorted"):
    data.encode_text("a", "ba")
  with pytest.raises(ValueError, match=r"vocab=.*not allowed.*distinct"):
    data.encode_text("a", "aab")
  with pytest.raises(ValueError, match=r"text of type bytes is not allowed"):
    data.encode_text(b"a", vocab)
  with pytest.raises(ValueError, match=r"tokens in \[0, 5\] is not allowed.*\[0, 4\]"):
    data.decode_text(np.array([0, 5]), vocab)
  with pytest.raises(ValueError, match=r"tokens with shape \(1, 2\)"):
    data.decode_text(np.zeros((1, 2), np.int32), vocab)


# ----------------------------------------------------------------------------- text partition


@pytest.mark.parametrize("num, n", [(103, 4), (100, 4), (5, 5), (7, 1)])
def test_partition_text_equal_contiguous_chunks(num, n):
  tokens = np.arange(num, dtype=np.int64) % 50
  shards = data.partition_text(tokens, n, scheme="contiguous")
  length = num // n
  chex.assert_shape(shards, (n, length))
  assert shards.dtype == np.int32
  for i in range(n):
    np.testing.assert_array_equal(shards[i], tokens[i * length:(i + 1) * length])
  np.testing.assert_array_equal(shards.reshape(-1), tokens[:n * length])  # tail dropped


def test_partition_text_iid_gives_every_worker_the_whole_stream():
  tokens = np.arange(103, dtype=np.int64) % 50
  shards = data.partition_text(tokens, 4)
  chex.assert_shape(shards, (4, 103))
  assert shards.dtype == np.int32 and shards.flags.writeable
  for row in shards:
    np.testing.assert_array_equal(row, tokens)


def test_partition_text_dirichlet_is_rejected_with_reason():
  with pytest.raises(ValueError, match=r"scheme='dirichlet' is not allowed for text.*'iid'"):
    data.partition_text(np.arange(10), 2, scheme="dirichlet")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_workers=0), "num_workers"),
        (dict(num_workers=2.0), "num_workers"),
        (dict(num_workers=True), "num_workers"),
        (dict(num_workers=11, scheme="contiguous"), "num_workers"),
        (dict(num_workers=2, scheme="shuffled"), "scheme"),
        (dict(num_workers=2, min_length=0), "min_length"),
        (dict(num_workers=3, min_length=4, scheme="contiguous"), "num_workers"),  # 3 < 4
        (dict(num_workers=3, min_length=11), "num_workers"),  # iid: 10 < 11
    ],
)
def test_partition_text_bad_inputs(kwargs, field):
  with pytest.raises(ValueError, match=rf"{field}=.*not allowed"):
    data.partition_text(np.arange(10), **kwargs)


@pytest.mark.parametrize("tokens", [np.zeros((2, 3), np.int32), np.array([], np.int32),
                                    np.array([0.5, 1.0])])
def test_partition_text_bad_tokens(tokens):
  with pytest.raises(ValueError, match=r"tokens with shape .* is not allowed"):
    data.partition_text(tokens, 1)
