"""Data a user has on disk, read without TensorFlow: image folders (a directory and each
archive type), the CIFAR python-pickle release, text files and the embedded tiny_shakespeare;
the nanoGPT optimizer knobs of the LM anchor. Every fixture is made in the test."""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import pickle
import shutil
import tarfile
import zipfile

import numpy as np
import pytest

from nbsgd_jax import config as config_lib, data, train
from nbsgd_jax.data import augment
from nbsgd_jax.data import disk as disk_data

from tests.helpers import check_image_arrays, image_folder, png_bytes


def _archive(root, kind, dest):
  if kind == "zip":
    with zipfile.ZipFile(dest, "w") as z:
      for base, _, names in os.walk(root):
        for n in names:
          full = os.path.join(base, n)
          z.write(full, os.path.relpath(full, root))
  else:
    mode = {"tar": "w", "tar.gz": "w:gz", "tar.xz": "w:xz"}[kind]
    with tarfile.open(dest, mode) as t:
      for n in sorted(os.listdir(root)):
        t.add(os.path.join(root, n), arcname=n)
  return str(dest)


@pytest.mark.parametrize("kind", ["dir", "tar", "tar.gz", "tar.xz", "zip"])
def test_image_folder_reads_each_source_type(tmp_path, kind):
  src = tmp_path / "src"
  expect = image_folder(str(src), wrap="cifar" if kind == "tar.gz" else "")
  path = str(src) if kind == "dir" else _archive(str(src), kind, tmp_path / f"a.{kind}")
  check_image_arrays(disk_data.load_image_folder(path, cache_dir="none"), expect)


def test_image_folder_is_cached_and_a_changed_source_is_decoded_anew(tmp_path):
  src = tmp_path / "src"
  image_folder(str(src))
  path = _archive(str(src), "tar", tmp_path / "a.tar")
  cache = tmp_path / "cache"
  first = disk_data.load_image_folder(path, cache_dir=str(cache))
  (npz,) = os.listdir(cache)
  assert npz.startswith("image_folder-a-") and npz.endswith(".npz")
  with open(cache / npz, "r+b") as f:  # the cache, not the archive, answers the second call
    z = dict(np.load(f))
  z["train_labels"] = z["train_labels"] * 0
  with open(cache / npz, "wb") as f:
    np.savez(f, **z)
  assert (disk_data.load_image_folder(path, cache_dir=str(cache)).train_labels == 0).all()
  shutil.rmtree(src)
  expect = image_folder(str(src), seed=1)
  _archive(str(src), "tar", tmp_path / "a.tar")
  os.utime(path, ns=(1, 1))  # another mtime: another key
  second = disk_data.load_image_folder(path, cache_dir=str(cache))
  check_image_arrays(second, expect)
  assert not np.array_equal(first.train_images, second.train_images)
  assert len(os.listdir(cache)) == 2


def test_image_folder_greyscale_images_have_one_channel(tmp_path):
  expect = image_folder(str(tmp_path / "src"), channels=1)
  check_image_arrays(disk_data.load_image_folder(str(tmp_path / "src"), cache_dir="none"),
                     expect)


@pytest.mark.parametrize("case,words", [
    ("missing", "does not exist"),
    ("garbage", "could not be read as an archive"),
    ("no_test", "has no test/<class>/<image>"),
    ("empty_class", "class folder train/bee holds no image"),
    ("odd_size", "image test/cat/001.png is 4x5x3 while"),
    ("extra_test_class", "test class folder 'dog' is not a train class"),
    ("bad_image", "image train/ant/000.png could not be decoded"),
])
def test_image_folder_errors_are_one_line_naming_the_path(tmp_path, case, words):
  src = str(tmp_path / "src")
  path = src
  if case == "missing":
    path = str(tmp_path / "nothing.tar.gz")
  elif case == "garbage":
    path = str(tmp_path / "bad.tar.gz")
    with open(path, "wb") as f:
      f.write(b"this is not a tar archive" * 10)
  else:
    image_folder(src)
    if case == "no_test":
      shutil.rmtree(os.path.join(src, "test"))
    elif case == "empty_class":
      for n in os.listdir(os.path.join(src, "train", "bee")):
        os.remove(os.path.join(src, "train", "bee", n))
    elif case == "odd_size":
      with open(os.path.join(src, "test", "cat", "001.png"), "wb") as f:
        f.write(png_bytes(np.zeros((4, 5, 3), np.uint8)))
    elif case == "extra_test_class":
      os.makedirs(os.path.join(src, "test", "dog"))
      shutil.copy(os.path.join(src, "test", "cat", "000.png"), os.path.join(src, "test", "dog"))
    elif case == "bad_image":
      with open(os.path.join(src, "train", "ant", "000.png"), "wb") as f:
        f.write(b"not a png")
  with pytest.raises(ValueError) as e:
    disk_data.load_image_folder(path, cache_dir="none")
  msg = str(e.value)
  assert words in msg and "\n" not in msg and msg.startswith("data_path="), msg


# ----------------------------------------------------------------------------- CIFAR pickles


def _cifar_release(root, name, per_batch=4, seed=0):
  """A fake release with the real layout: python-2-style pickles of dicts with bytes keys,
  b'data' uint8 [N, 3072] (1,024 red, then green, then blue values, rows in order)."""
  layout = disk_data.CIFAR_LAYOUTS[name]
  rng = np.random.default_rng(seed)
  folder = os.path.join(root, layout.folder)
  os.makedirs(folder)
  k = 10 if name == "cifar10" else 100
  expect = {}
  for split, parts in (("train", layout.train), ("test", (layout.test,))):
    xs, ys = [], []
    for part in parts:
      img = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
      y = rng.integers(0, k, per_batch).tolist()
      rows = np.stack([im.transpose(2, 0, 1).reshape(-1) for im in img])  # CHW order
      d = {b"batch_label": b"fake", layout.labels_key: y, b"data": rows,
           b"filenames": [b"x.png"] * per_batch}
      if name == "cifar100":
        d[b"coarse_labels"] = [0] * per_batch
      with open(os.path.join(folder, part), "wb") as f:
        pickle.dump(d, f, protocol=2)
      xs.append(img)
      ys += y
    expect[split] = (np.concatenate(xs), np.asarray(ys, np.int32))
  with open(os.path.join(folder, layout.meta), "wb") as f:
    pickle.dump({layout.names_key: [f"c{i}".encode() for i in range(k)]}, f, protocol=2)
  return folder, expect


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("form", ["folder", "parent", "tar.gz"])
def test_cifar_pickle_release(tmp_path, name, form):
  folder, expect = _cifar_release(str(tmp_path), name)
  path = {"folder": folder, "parent": str(tmp_path)}.get(form)
  if form == "tar.gz":
    path = str(tmp_path / f"{name}-python.tar.gz")
    with tarfile.open(path, "w:gz") as t:
      t.add(folder, arcname=os.path.basename(folder))
  ds = data.load_dataset(name, data_path=path)
  np.testing.assert_array_equal(ds.train_images, expect["train"][0])
  np.testing.assert_array_equal(ds.train_labels, expect["train"][1])
  np.testing.assert_array_equal(ds.test_images, expect["test"][0])
  np.testing.assert_array_equal(ds.test_labels, expect["test"][1])
  assert ds.num_classes == (10 if name == "cifar10" else 100)
  assert ds.train_images.shape == (len(expect["train"][1]), 32, 32, 3)


def test_cifar_pickle_refuses_anything_but_arrays_and_names_a_missing_batch(tmp_path):
  folder, _ = _cifar_release(str(tmp_path), "cifar10")

  class Evil:
    def __reduce__(self):
      return (os.system, ("echo pwned",))

  with open(os.path.join(folder, "test_batch"), "wb") as f:
    pickle.dump({b"data": Evil()}, f, protocol=2)
  with pytest.raises(ValueError, match=r"test_batch could not be unpickled .*not allowed"):
    data.load_dataset("cifar10", data_path=folder)
  os.remove(os.path.join(folder, "data_batch_3"))
  with pytest.raises(ValueError, match="has no data_batch_3"):
    data.load_dataset("cifar10", data_path=folder)
  with pytest.raises(ValueError, match="holds neither cifar-100-python/"):
    data.load_dataset("cifar100", data_path=str(tmp_path))


# ----------------------------------------------------------------------------- text


def test_text_file_is_split_as_nanogpt(tmp_path):
  text = "To be, or not to be: that is the question. \u00e9" * 7
  path = tmp_path / "t.txt.gz"
  with gzip.open(path, "wb") as f:
    f.write(text.encode("utf-8"))
  ds = data.load_text_dataset("text_file", data_path=str(path))
  n = int(len(text) * 0.9)  # nanoGPT prepare.py: data[:int(n*0.9)], data[int(n*0.9):]
  chars = sorted(set(text))
  assert ds.vocab == "".join(chars) and ds.vocab_size == len(chars) + 1
  assert data.decode_text(ds.train_tokens, ds.vocab) == text[:n]
  assert data.decode_text(ds.test_tokens, ds.vocab) == text[n:]
  with open(tmp_path / "bad.txt", "wb") as f:
    f.write(b"\xff\xfe\x00bad")
  with pytest.raises(ValueError, match="is not UTF-8"):
    data.load_text_dataset("text_file", data_path=str(tmp_path / "bad.txt"))


def test_embedded_tiny_shakespeare_is_the_char_rnn_text():
  ds = data.load_text_dataset("tiny_shakespeare")
  text = data.decode_text(np.concatenate([ds.train_tokens, ds.test_tokens]), ds.vocab)
  # sha256 and lengths from the data's README (karpathy/char-rnn input.txt)
  assert hashlib.sha256(text.encode()).hexdigest() == (
      "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")
  assert (len(ds.train_tokens), len(ds.test_tokens), len(ds.vocab)) == (1003854, 111540, 65)


# ----------------------------------------------------------------------------- config and train()


def _cfg(**over):
  c = config_lib.default_config()
  base = {"model": "mlp", "mlp_hidden": (8,), "num_workers": 2, "batch_size": 2,
          "num_steps": 2, "eval_every": 2, "eval_train_examples": 4, "progress": False}
  return config_lib.override(c, {**base, **over})


@pytest.mark.parametrize("over,words", [
    ({"dataset": "image_folder"}, "config.data_path='' is not allowed"),
    ({"dataset": "tiny_shakespeare"}, "needs config.model='transformer'"),
    ({"dataset": "cifar101"}, "config.dataset='cifar101' is not allowed"),
    ({"augment.stats": "imagenet"}, "config.augment.stats='imagenet'"),
    ({"lr_schedule": "cosine", "lr_min": 1.0}, "config.lr_min=1.0 is not allowed"),
    ({"weight_decay_on": "biases"}, "config.weight_decay_on='biases'"),
    ({"grad_clip": -1.0}, "config.grad_clip=-1.0"),
])
def test_bad_data_and_optimizer_keys_are_named(over, words):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(_cfg(**over))
  assert any(words in line for line in str(e.value).splitlines()), str(e.value)


def test_a_missing_data_path_is_one_line_and_nothing_is_written(tmp_path):
  cfg = _cfg(dataset="cifar10", data_path=str(tmp_path / "no" / "cifar.tar.gz"))
  with pytest.raises(config_lib.ConfigError) as e:
    train.train(cfg, workdir=str(tmp_path / "run"))
  assert str(e.value).count("\n") == 0 and "does not exist" in str(e.value)
  assert not os.path.exists(tmp_path / "run") or not os.listdir(tmp_path / "run")


@pytest.mark.slow
def test_an_image_folder_and_a_text_file_train_through_train(tmp_path):
  image_folder(str(tmp_path / "img"), size=(4, 4), per_class=(4, 2))
  s = train.train(_cfg(dataset="image_folder", data_path=str(tmp_path / "img"),
                       data_cache=str(tmp_path / "cache"), **{"augment.normalize": True}))
  assert s["steps"] == 2 and math.isfinite(s["test_loss"]) and os.listdir(tmp_path / "cache")
  (tmp_path / "t.txt").write_text("abcdefgh" * 40)
  s = train.train(_cfg(dataset="text_file", data_path=str(tmp_path / "t.txt"),
                       model="transformer", optimizer="adamw", learning_rate=1e-3,
                       **{"lm.context": 8, "lm.num_layers": 1, "lm.d_model": 16,
                          "lm.num_heads": 2}))
  assert s["steps"] == 2 and math.isfinite(s["test_loss"])


def test_data_stats_are_the_pixels_mean_and_std():
  x = np.random.default_rng(0).integers(0, 256, (7, 3, 5, 3), dtype=np.uint8)
  mean, std = augment.data_stats(x)
  np.testing.assert_allclose(mean, (x / 255.0).mean(axis=(0, 1, 2)), rtol=1e-10)
  np.testing.assert_allclose(std, (x / 255.0).std(axis=(0, 1, 2)), rtol=1e-8)


# ----------------------------------------------------------------------------- nanoGPT's optimizer


def _torch_adamw_reference(params, grads, steps, lr_at, b1, b2, wd, clip, eps=1e-8):
  """A numpy transcription of nanoGPT's step: torch.nn.utils.clip_grad_norm_ over all
  gradients, then torch.optim.AdamW (decoupled decay p -= lr wd p on the 'decay' group: params
  with dim >= 2, nanoGPT's configure_optimizers), bias-corrected moments."""
  p = {k: v.astype(np.float64).copy() for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v2 = {k: np.zeros_like(v) for k, v in p.items()}
  for t in range(1, steps + 1):
    g = {k: grads[t - 1][k].astype(np.float64) for k in p}
    norm = math.sqrt(sum(float((x * x).sum()) for x in g.values()))
    if norm > clip:
      g = {k: x * clip / (norm + 1e-6) for k, x in g.items()}
    lr = lr_at(t - 1)
    for k in p:
      if p[k].ndim >= 2:
        p[k] -= lr * wd * p[k]
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
      mhat, vhat = m[k] / (1 - b1 ** t), v2[k] / (1 - b2 ** t)
      p[k] -= lr * mhat / (np.sqrt(vhat) + eps)
  return p


def test_nanogpt_optimizer_matches_a_transcription_of_torch_adamw():
  import jax.numpy as jnp
  import optax
  from nbsgd_jax.recipes import optim
  cfg = config_lib.override(config_lib.default_config(), {
      "optimizer": "adamw", "learning_rate": 1e-2, "momentum": 0.9, "adam_b2": 0.99,
      "weight_decay": 0.1, "weight_decay_on": "matrices", "grad_clip": 1.0,
      "lr_schedule": "cosine", "lr_min": 1e-3, "warmup_steps": 2, "num_steps": 6})
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(3, 4)).astype(np.float32),
            "b": rng.normal(size=(4,)).astype(np.float32)}
  grads = [{k: rng.normal(size=v.shape).astype(np.float32) * 3 for k, v in params.items()}
           for _ in range(6)]
  sched = optim.make_schedule(cfg)

  def nanogpt_lr(it):  # nanoGPT train.py get_lr after warm-up, lr_decay_iters = num_steps
    ratio = (it - 2) / (6 - 2)
    return 1e-3 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1e-2 - 1e-3)

  for it in range(2, 7):
    assert float(sched(it)) == pytest.approx(nanogpt_lr(it), rel=1e-5)
  opt = optim.make_optimizer(cfg)
  p = {k: jnp.asarray(v) for k, v in params.items()}
  state = opt.init(p)
  for g in grads:
    u, state = opt.update({k: jnp.asarray(v) for k, v in g.items()}, state, p)
    p = optax.apply_updates(p, u)
  ref = _torch_adamw_reference(params, grads, 6, lambda i: float(sched(i)), 0.9, 0.99, 0.1, 1.0)
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), ref[k], rtol=2e-5, atol=2e-6)
