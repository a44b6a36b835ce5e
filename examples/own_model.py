"""Your own flax model and numpy data through nbsgd_jax's ``train()`` and its CLI.

    python examples/own_model.py                  # train() from Python, ~25 s on a CPU
    python -m nbsgd_jax.main --config=experiments/configs/quickstart.py \\
        --config.imports=examples.own_model --config.model=two_layer \\
        --config.dataset=spirals --config.batch_size=16 --workdir=runs/spirals  # by name

The data are two interleaved spirals (numpy features ``[N, 2]``, integer labels), the model a
small MLP written here. ``train()`` partitions them over the workers (iid or Dirichlet),
samples, runs the algorithm of the config (here D-PSGD with Non-blocking SGD on a simulated
heterogeneous cluster), evaluates, checkpoints and writes the same records as for the
built-in models; importing this module also registers both by name for the CLI.
"""
import argparse

import flax.linen as nn
import numpy as np

from nbsgd_jax import config, data, models, train


class TwoLayer(nn.Module):
  """``[B, d]`` features -> ``[B, num_classes]`` logits."""

  num_classes: int
  hidden: int = 64

  @nn.compact
  def __call__(self, x):
    x = nn.tanh(nn.Dense(self.hidden)(x))
    return nn.Dense(self.num_classes)(nn.tanh(nn.Dense(self.hidden)(x)))


def spirals(n: int = 2000, seed: int = 0) -> data.ArrayDataset:
  """Two spirals, 80 % train / 20 % test: float32 ``[N, 2]`` and int ``[N]`` labels."""
  rng = np.random.default_rng(seed)
  t = np.sqrt(rng.uniform(size=n)) * 3 * np.pi
  y = rng.integers(0, 2, size=n)
  sign = np.where(y == 1, 1.0, -1.0)
  x = np.stack([sign * t * np.cos(t), sign * t * np.sin(t)], 1) / 10
  x = (x + rng.normal(scale=0.02, size=x.shape)).astype(np.float32)
  cut = int(0.8 * n)
  return data.ArrayDataset(x[:cut], y[:cut], x[cut:], y[cut:], num_classes=2, name="spirals")


# the names the CLI reaches with --config.imports=examples.own_model (from the repository root)
models.register_model("two_layer", lambda num_classes, cfg: TwoLayer(num_classes))
data.register_dataset("spirals", lambda cfg: spirals(seed=cfg.seed))


def get_config(steps: int = 1500):
  cfg = config.default_config()
  cfg.model, cfg.dataset = "module", "arrays"  # given to train() below
  cfg.algorithm, cfg.topology, cfg.num_workers = "dpsgd", "ring", 8
  cfg.num_steps, cfg.eval_every, cfg.batch_size, cfg.learning_rate = steps, 100, 16, 0.3
  cfg.nonblocking.enabled = True  # accumulate the mini-batches finished by each deadline
  cfg.cluster.scenario = "one_slow"
  return cfg


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=1500)
  p.add_argument("--workdir", default=None)
  a = p.parse_args()
  summary = train.train(get_config(a.steps), a.workdir, model=TwoLayer(2), data=spirals())
  print(f"test accuracy {summary['test_accuracy']:.4f}  train loss {summary['train_loss']:.4f}  "
        f"simulated time {summary['sim_time']:.2f} s  bytes per worker {summary['bytes_sent']:.0f}")
