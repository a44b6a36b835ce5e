"""config.validation_examples: a validation split carved from the training data, so that
hyperparameters are chosen without the test split (issue: tuning on a held-out seed)."""

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import data
from nbsgd_jax import train

from tests.helpers import small_cfg

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


def test_images_split_is_fixed_disjoint_and_complete():
  ds = data.load_dataset("mnist10k")
  a, b = data.hold_out(ds, 500), data.hold_out(ds, 500)
  assert len(a.test_labels) == 500 and len(a.train_labels) == len(ds.train_labels) - 500
  np.testing.assert_array_equal(a.test_images, b.test_images)   # one split for every run
  # every training image lands in exactly one part (rows as bytes)
  rows = lambda x: {r.tobytes() for r in x.reshape(len(x), -1)}  # noqa: E731
  whole = [r.tobytes() for r in ds.train_images.reshape(len(ds.train_images), -1)]
  assert len(rows(a.test_images) | rows(a.train_images)) == len(set(whole))
  assert not rows(a.test_images) & rows(a.train_images) - {r for r in whole
                                                            if whole.count(r) > 1}
  # mnist10k is sorted by label: a uniform sample holds every class
  assert set(np.unique(a.test_labels)) == set(range(10))
  assert not np.array_equal(a.test_images, ds.test_images[:500])


def test_text_holds_out_the_training_texts_end():
  ds = data.load_text_dataset("tiny_shakespeare")
  v = data.hold_out(ds, 1000)
  np.testing.assert_array_equal(v.test_tokens, ds.train_tokens[-1000:])
  np.testing.assert_array_equal(v.train_tokens, ds.train_tokens[:-1000])
  assert v.vocab == ds.vocab


def test_a_run_evaluates_on_the_held_out_examples_and_never_trains_on_them():
  ds = data.load_dataset("mnist10k")
  v = data.hold_out(ds, 400)
  held = train.train(small_cfg(validation_examples=400, num_steps=10, eval_every=5))
  given = train.train(small_cfg(dataset="arrays", num_steps=10, eval_every=5),
                      data=data.ArrayDataset(v.train_images, v.train_labels, v.test_images,
                                             v.test_labels, num_classes=10))
  for h, g in zip(held["history"], given["history"]):
    assert h["test_loss"] == pytest.approx(g["test_loss"], rel=1e-6)
    assert h["test_accuracy"] == pytest.approx(g["test_accuracy"])
    assert h["train_loss"] == pytest.approx(g["train_loss"], rel=1e-6)


@pytest.mark.parametrize("count", [10_000, 8_000])
def test_too_many_is_one_error_naming_the_field(count):
  with pytest.raises(config_lib.ConfigError, match=r"config.validation_examples=\d+ is not "
                     r"allowed: the training split has 8,000 examples"):
    train.setup(small_cfg(validation_examples=count))


def test_negative_is_refused():
  with pytest.raises(config_lib.ConfigError, match=r"config.validation_examples=-1"):
    config_lib.validate(small_cfg(validation_examples=-1))
