"""Cheap evaluations (``config.eval_test_examples``, ``config.eval_worker_examples``): a
fixed sample of the test split, the same at every evaluation, equals the same run evaluated
on a test split that holds just that sample."""

import numpy as np
import pytest

from nbsgd_jax import data as data_lib
from nbsgd_jax import train
from nbsgd_jax.run import task as task_lib

from tests.helpers import small_cfg

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


def _mnist():
  d = data_lib.load_dataset("mnist10k")
  return d.train_images, d.train_labels, d.test_images, d.test_labels


def _run(test_x, test_y, **over):
  x, y, _, _ = _mnist()
  data = data_lib.ArrayDataset(x, y, test_x, test_y, num_classes=10, name="mnist_subset")
  cfg = small_cfg(**{"dataset": "arrays", "algorithm": "dpsgd", "num_steps": 6,
                     "eval_every": 3, **over})
  return train.train(cfg, data=data)["history"]


def test_the_sample_is_fixed_uniform_and_each_worker_sample_is_inside_it():
  cfg = small_cfg(eval_test_examples=300, seed=3)
  test, mine = task_lib.eval_examples(1000, cfg, num_workers=4)
  again, _ = task_lib.eval_examples(1000, cfg, num_workers=4)
  np.testing.assert_array_equal(test, again)
  assert len(test) == len(set(test)) == 300 and set(mine) <= set(test)
  assert len(mine) == 100  # auto: 300 / 4 = 75, at least 100
  # a label-sorted split is sampled across it, not its first labels
  assert test.max() > 900 and test.min() < 100
  cfg.eval_test_examples = 0
  test, mine = task_lib.eval_examples(1000, cfg, num_workers=4)
  np.testing.assert_array_equal(test, np.arange(1000))
  assert len(mine) == 250 and mine.max() > 900  # a uniform sample, not the first 250
  cfg.eval_worker_examples = 5000  # more than there are: all of them
  assert len(task_lib.eval_examples(1000, cfg, num_workers=4)[1]) == 1000


@pytest.mark.parametrize("key", ["eval_test_examples", "eval_worker_examples"])
def test_a_sample_equals_a_test_split_of_just_that_sample(key):
  _, _, tx, ty = _mnist()
  over = {key: 200, "eval_worker_examples": 200} if key == "eval_worker_examples" else {
      key: 200, "eval_worker_examples": 10**6}
  test, mine = task_lib.eval_examples(len(ty), small_cfg(**over), num_workers=4)
  sub = test if key == "eval_test_examples" else mine
  sampled = _run(tx, ty, **over)
  alone = _run(tx[sub], ty[sub], eval_worker_examples=10**6)
  field = "test_loss" if key == "eval_test_examples" else "worker_test_accuracy"
  assert [r[field] for r in sampled] == pytest.approx([r[field] for r in alone], rel=1e-6)
  assert [r["train_loss"] for r in sampled] == [r["train_loss"] for r in alone]
