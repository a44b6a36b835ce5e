"""The main job: 8 simulated workers, D-PSGD on a ring, the LeNet-style CNN, on mnist10k.

    python -m nbsgd_jax.main --config=experiments/configs/mnist.py --workdir=runs/mnist
"""

from nbsgd_jax.config import default_config


def get_config():
  c = default_config()
  c.algorithm = "dpsgd"
  c.num_workers = 8
  c.topology = "ring"
  c.backend = "simulate"
  c.model = "cnn"
  c.dataset = "mnist10k"
  c.batch_size = 32
  c.learning_rate = 0.1
  c.lr_schedule = "cosine"
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.num_steps = 600
  # gradient computations per worker: 600 steps here, and the same budget for the
  # asynchronous family (--config.algorithm=ad_psgd), whose steps are batches of events
  c.budget_unit = "grads_per_worker"
  c.eval_every = 100
  c.seed = 0
  # a checkpoint at every evaluation (follows --config.eval_every): a killed run resumes
  c.checkpoint_every = c.get_ref("eval_every").identity()  # setting it leaves eval_every
  return c
