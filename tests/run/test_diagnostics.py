"""Diagnostics that point the right way: bad data is named where it is loaded (not reported
later as a diverged run), and a data cache that cannot be used is a warning, not silence."""

import functools
import os

import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax.data import disk as disk_data
from nbsgd_jax import train

from tests.helpers import check_image_arrays, image_folder, small_cfg


def _arrays(**change):
  rng = np.random.default_rng(0)
  fields = dict(x_train=rng.normal(size=(64, 5)).astype(np.float32),
                y_train=rng.integers(0, 3, 64), x_test=rng.normal(size=(16, 5)),
                y_test=rng.integers(0, 3, 16))
  fields.update(change)
  return data_lib.ArrayDataset(**fields)


def _train(data, tmp_path):
  cfg = small_cfg(dataset="arrays", model="mlp", num_steps=2, eval_every=2)
  return train.train(cfg, str(tmp_path / "run"), data=data)


@pytest.mark.parametrize("field,bad", [("x_train", np.nan), ("x_test", np.inf)])
def test_non_finite_features_are_named_at_load_not_reported_as_divergence(tmp_path, field,
                                                                           bad):
  x = _arrays()._asdict()[field].copy()
  x[7, 2] = bad
  x[9, 0] = bad
  with pytest.raises(config_lib.ConfigError) as e:
    _train(_arrays(**{field: x}), tmp_path)
  assert e.value.errors == [
      f"config.dataset='arrays': ArrayDataset.{field} is not finite: example 7 holds a NaN or "
      f"an infinity (2 such examples of {len(x)}); clean the data before training"]
  assert not (tmp_path / "run").exists()


def test_an_empty_test_split_is_refused_at_load(tmp_path):
  with pytest.raises(config_lib.ConfigError, match=r"ArrayDataset.x_test is empty \(0 "
                     r"examples\): every evaluation would measure nothing"):
    _train(_arrays(x_test=np.zeros((0, 5), np.float32), y_test=np.zeros(0, int)), tmp_path)
  assert not (tmp_path / "run").exists()


def test_a_data_cache_that_cannot_be_used_is_a_warning(tmp_path, capsys):
  expect = image_folder(str(tmp_path / "images"))
  cache = tmp_path / "a_file"
  cache.write_text("not a directory")
  check_image_arrays(
      disk_data.load_image_folder(str(tmp_path / "images"), cache_dir=str(cache)), expect)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(
      f"warning: config.data_cache: the decoded images cannot be cached in {str(cache)!r}"), err
  # a damaged cache file: decoded again and replaced, with one line
  good = tmp_path / "cache"
  disk_data.load_image_folder(str(tmp_path / "images"), cache_dir=str(good))
  (npz,) = os.listdir(good)
  (good / npz).write_bytes(b"damaged")
  check_image_arrays(
      disk_data.load_image_folder(str(tmp_path / "images"), cache_dir=str(good)), expect)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "cannot be read" in err[0] and err[0].startswith("warning:"), err
  check_image_arrays(
      disk_data.load_image_folder(str(tmp_path / "images"), cache_dir=str(good)), expect)
  assert capsys.readouterr().err == ""  # replaced: read silently now


def _bad_indices(x, key):
  """A user's compressor with a bug: its second index is d + 4 once x has a negative entry."""
  del key
  d = x.shape[0]
  return x[:2], jnp.stack([jnp.int32(0), jnp.where(jnp.any(x < 0), d + 4, 1)])


@pytest.mark.slow
def test_a_compressor_index_out_of_range_at_run_time_stops_the_run_with_its_line(tmp_path):
  """Traced (inside the compiled step), the index is checked by a host callback: the run
  stops and the command line prints the check's own line (not a silent drop)."""
  from nbsgd_jax import codecs
  from nbsgd_jax import main as main_lib
  codecs.register("bad_indices_test", lambda: codecs.sparse_codec("bad", _bad_indices))
  try:
    cfg = small_cfg(algorithm="allreduce", num_steps=4, eval_every=2,
                    **{"compression.name": "bad_indices_test"})
    with pytest.raises(RuntimeError) as e:
      train.train(cfg, str(tmp_path / "run"))
  finally:
    codecs.REGISTRY.pop("bad_indices_test")
  line = main_lib._callback_error(e.value)
  assert line is not None and line.startswith("ValueError: the compressor returned index "), (
      str(e.value)[-2000:])
  assert "for a vector of" in line and "padding, no entry" in line
  # the built-in compressors are in range by construction: no callback in their step
  assert codecs.sparse.indices_in_range(codecs.sparse.make_compressor("top_k", 0.1))
  assert codecs.sparse.indices_in_range(functools.partial(codecs.top_k, density=0.1))
  assert not codecs.sparse.indices_in_range(_bad_indices)
