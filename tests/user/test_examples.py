"""The examples a user copies (examples/), and your own model and data through train()."""

import functools
import json
import os
import subprocess
import sys

import flax.linen as nn
import numpy as np
import pytest

from nbsgd_jax import config, data, train

from tests.helpers import ROOT, load_module

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

EXAMPLES = os.path.join(ROOT, "examples")


def _run(args, **env):
  e = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the example sets its own
  e.update(env)
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                        env=e, timeout=300)


def test_own_training_loop_learns_with_dpsgd_under_shard_map():
  """The example a user copies learns and counts its bytes right: 30 steps of D-PSGD on 4
  workers bring the averaged CNN's MNIST-10k test accuracy above 0.5 (chance 0.1; measured
  0.74), and tx.bytes_sent is the closed form 30 steps x 2 ring neighbours x the CNN's
  101,274 float32 parameters (conv 5x5x1x8 + 8; dense 14x14x8 -> 64: 100,416; 64 -> 10:
  650; counted by hand) = 24.31 MB."""
  r = _run([os.path.join(EXAMPLES, "own_training_loop.py"), "--workers", "4", "--steps", "30"])
  assert r.returncode == 0, r.stderr[-2000:]
  line = r.stdout.strip().splitlines()[-1]
  assert line.startswith("workers 4  steps 30"), line
  assert float(line.split("test accuracy")[1].split()[0]) > 0.5, line
  params = (5 * 5 * 1 * 8 + 8) + (14 * 14 * 8 * 64 + 64) + (64 * 10 + 10)
  assert params == 101_274
  mb = float(line.split("MB sent per worker")[1])
  assert mb == round(30 * 2 * 4 * params / 1e6, 2) == 24.31, line


def test_own_model_by_name_through_the_cli(tmp_path):
  r = _run(["-m", "nbsgd_jax.main", "--config=experiments/configs/quickstart.py",
            "--config.imports=examples.own_model", "--config.model=two_layer", "--config.dataset=spirals",
            "--config.num_steps=10", "--config.eval_every=10", "--config.batch_size=16",
            "--config.progress=False", f"--workdir={tmp_path}"])
  assert r.returncode == 0, r.stderr[-2000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert (summary["model"], summary["dataset"], summary["step"]) == ("two_layer", "spirals", 10)
  cfg = config.default_config()
  cfg.imports = "examples.own_model, no_such_module"
  with pytest.raises(config.ConfigError, match="config.imports=.*cannot import 'no_such_module'"):
    config.import_modules(cfg)


@functools.lru_cache(maxsize=None)
def _example():
  """examples/own_model.py, loaded once (it registers its model and data set)."""
  return load_module("examples", "own_model.py")


def test_own_model_and_arrays_train_with_dirichlet_checkpoints_and_records(tmp_path):
  ex = _example()
  cfg = ex.get_config(steps=20)
  cfg.eval_every, cfg.checkpoint_every, cfg.partition, cfg.dirichlet_alpha = 10, 10, "dirichlet", 0.5
  cfg.progress = False
  s = train.train(cfg, str(tmp_path), model=ex.TwoLayer(2), data=ex.spirals(400))
  assert s["model"] == "TwoLayer" and s["dataset"] == "arrays" and np.isfinite(s["train_loss"])
  steps = [json.loads(r)["step"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert steps == [0, 10, 20] and any((tmp_path / "checkpoints").iterdir())


class _Tokens(nn.Module):
  vocab: int

  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(self.vocab)(nn.Embed(self.vocab, 8)(tokens))


def _chain(start, length, successor=(2, 4, 1, 0, 3)):
  """Tokens of a 5-cycle: each token's successor is ``successor[token]``."""
  out = [start]
  for _ in range(length - 1):
    out.append(successor[out[-1]])
  return np.array(out)


def test_own_token_model_and_token_stream():
  """A user's own token model learns the user's own token stream: in a stream where each
  token decides the next (a 5-cycle), the bigram model (embedding -> logits) must predict the
  held-out stream after 20 steps of local SGD: test accuracy 1 and a test loss far below
  ln 5 = 1.61, the loss of a uniform guess (measured 5e-6). Random tokens, as before, could
  not show that anything was learned."""
  toks = data.TokenDataset(_chain(0, 3000), _chain(3, 500), vocab_size=5)
  cfg = config.default_config()
  cfg.update(dict(model="module", dataset="arrays", num_workers=2, num_steps=20,
                  eval_every=20, batch_size=4, algorithm="local_sgd", learning_rate=0.5,
                  progress=False))
  cfg.lm.context = 16
  s = train.train(cfg, None, model=_Tokens(5), data=toks)
  assert s["vocab_size"] == 5
  assert s["test_accuracy"] == 1.0 and s["test_loss"] < 0.01, s


@pytest.mark.parametrize("model,given,needle", [
    (nn.Dense(7), True, r"returns \(1, 7\) for inputs of shape \(1, 2\): the data has 2 "
                        r"classes, so it must return logits of shape \(1, 2\)"),
    (None, True, r"config.model='module' needs train\(cfg, model=<flax module>\)"),
    (nn.Dense(2), False, r"config.dataset='arrays' needs train\(cfg, data=ArrayDataset"),
])
def test_given_model_and_data_errors_name_the_argument(model, given, needle):
  cfg = _example().get_config(steps=2)
  with pytest.raises(config.ConfigError, match=needle):
    train.train(cfg, None, model=model, data=_example().spirals(400) if given else None)


def test_array_dataset_errors_name_the_field():
  x = np.zeros((10, 3), np.float32)
  with pytest.raises(ValueError, match=r"ArrayDataset.y_train must be integer labels \[10\]"):
    data.from_arrays(data.ArrayDataset(x, np.zeros(10), x, np.zeros(10, int)))
  with pytest.raises(ValueError, match=r"ArrayDataset.num_classes=2 .* labels go up to 4"):
    data.from_arrays(data.ArrayDataset(x, np.arange(10) % 5, x, np.zeros(10, int), 2))
