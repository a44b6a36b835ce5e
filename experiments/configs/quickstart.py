"""The user guide's first runs (docs/guide.md): the main job, made small enough for a laptop.

    python -m nbsgd_jax.main --config=experiments/configs/quickstart.py --workdir=runs/dpsgd

8 simulated workers, D-PSGD on a ring, as ``experiments/configs/mnist.py``, but the MLP
(784-256-10) for 200 steps (about 10 s of training on a laptop CPU) with an evaluation every
20 steps, on a simulated cluster with stragglers: worker speeds lognormal (sigma 0.3), 40 ms
per batch of 32 at speed 1, and a delay of Exponential(50 ms) on 10% of the workers' steps
(``docs/clock.md``), so that blocking and non-blocking runs differ in simulated time.
"""

from nbsgd_jax.config import default_config


def get_config():
  c = default_config()
  c.algorithm = "dpsgd"
  c.num_workers = 8
  c.topology = "ring"
  c.backend = "simulate"
  c.model = "mlp"
  c.dataset = "mnist10k"
  c.batch_size = 32
  c.learning_rate = 0.1
  c.lr_schedule = "cosine"
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.num_steps = 200
  c.eval_every = 20
  c.eval_train_examples = 1000
  c.seed = 0
  # a checkpoint every 5th evaluation (follows --config.eval_every): a killed run resumes
  c.checkpoint_every = c.get_ref("eval_every") * 5
  c.cluster.scenario = "lognormal"  # worker speeds
  c.cluster.spread = 0.3
  c.cluster.time_per_example = 1.25e-3  # s per example at speed 1 (32 examples: 40 ms)
  c.cluster.delay = "bernoulli_exponential"
  c.cluster.delay_prob = 0.1
  c.cluster.delay_mean = 0.05       # s
  c.nonblocking.num_minibatches = 4  # used with --config.nonblocking.enabled=True
  return c
