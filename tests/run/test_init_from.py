"""config.init_from: a run that starts from another run's checkpoint (DiLoCo's synchronous
prefix, Douillard et al. 2023, Sec. 3: every method continues from one pre-trained model).

The reference is orbax's own restore of the source's whole train state (``Checkpointer``,
the resume path) averaged over the workers in numpy, not ``read_models``."""

import json
import os

import numpy as np
import pytest

import jax

from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax.run import hparams as hparams_lib
from nbsgd_jax import train

from tests.helpers import small_cfg


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A D-PSGD run (its workers' models differ) with a checkpoint at step 8."""
  wd = str(tmp_path_factory.mktemp("source"))
  cfg = small_cfg(algorithm="dpsgd", num_steps=8, eval_every=4, checkpoint_every=8)
  train.train(cfg, workdir=wd)
  s = train.setup(cfg)
  ckpt = checkpoint_lib.Checkpointer(wd)
  _, state, _ = ckpt.restore_newest(train.init_state(s), warn=print, move_aside=False)
  ckpt.close()
  return wd, state


def test_starts_from_the_workers_average(source):
  wd, state = source
  workers = jax.tree.leaves(state.params)
  assert np.ptp(np.asarray(workers[0]), axis=0).max() > 0   # D-PSGD: the models differ
  s = train.setup(small_cfg(algorithm="allreduce", init_from=wd, seed=5))
  got = train.init_state(s)
  for mine, theirs in zip(jax.tree.leaves(got.params), workers):
    want = np.asarray(theirs, np.float64).mean(axis=0)
    for w in range(4):
      np.testing.assert_allclose(np.asarray(mine)[w], want, rtol=1e-6, atol=1e-7)
  assert int(np.asarray(got.step).max()) == 0               # the step count starts fresh


def test_first_evaluation_is_the_sources_last(source):
  wd, _ = source
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    last = [json.loads(line) for line in f][-1]
  assert last["step"] == 8
  kw = dict(algorithm="allreduce", num_steps=4, eval_every=4, learning_rate=1e-12)
  fresh = train.train(small_cfg(**kw))
  cont = train.train(small_cfg(init_from=wd, **kw))
  # a vanishing rate: the model stays the loaded one, the source's averaged model
  assert cont["history"][-1]["test_loss"] == pytest.approx(last["test_loss"], rel=1e-5)
  assert cont["history"][-1]["test_accuracy"] == pytest.approx(last["test_accuracy"])
  assert abs(fresh["history"][-1]["test_loss"] - last["test_loss"]) > 1e-2


def test_shares_the_compiled_program():
  a, b = small_cfg(), small_cfg(init_from="/somewhere")
  assert hparams_lib.structure_key(a) == hparams_lib.structure_key(b)


def test_no_checkpoint_is_one_error_naming_the_field(tmp_path):
  with pytest.raises(config_lib.ConfigError, match=r"config.init_from=.*no checkpoint"):
    train.setup(small_cfg(init_from=str(tmp_path)))


def test_another_model_is_refused_naming_the_leaf(source):
  wd, _ = source
  with pytest.raises(config_lib.ConfigError,
                     match=r"init_from.*: params\['params'\]\['Dense_0'\]\['bias'\] is "
                     r"float32\[32\] in its step-8 checkpoint, float32\[16\] in this model"):
    train.setup(small_cfg(init_from=wd, mlp_hidden=(16,)))
  with pytest.raises(config_lib.ConfigError, match=r"init_from.*not this model"):
    train.setup(small_cfg(init_from=wd, model="logreg"))


def test_not_a_string_is_refused():
  with pytest.raises(config_lib.ConfigError, match=r"config.init_from"):
    config_lib.validate(small_cfg(init_from=3))
