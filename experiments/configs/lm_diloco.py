"""A character-level decoder-only transformer on tiny_shakespeare trained with DiLoCo
(Douillard et al. 2023, "DiLoCo: Distributed low-communication training of language models",
Algorithm 1): 8 workers, H = 50 inner AdamW steps (b2 = 0.95, weight decay 0.1, cosine
schedule with warm-up) per round, an outer Nesterov SGD step (lr 0.7, momentum 0.9) on the
averaged pseudo-gradient.

The text is the embedded tiny_shakespeare, split as nanoGPT's ``shakespeare_char`` (first
90 % train, last 10 % validation); any UTF-8 file instead: ``--config.dataset=text_file
--config.data_path=FILE``; the tfds copy: ``--config.dataset=tfds:tiny_shakespeare`` after
``tfds build tiny_shakespeare --file_format=array_record`` (preparing it needs TensorFlow,
reading it does not).

On one GPU (8 workers simulated with jax.vmap on the device)::

    python -m nbsgd_jax.main --config=experiments/configs/lm_diloco.py --workdir=runs/lm_diloco

Streaming DiLoCo: ``--config.algorithm=streaming_diloco``; local SGD with the same inner
steps: ``--config.algorithm=local_sgd --config.local_sgd.local_steps=50``; bfloat16 compute:
``--config.compute_dtype=bfloat16``.
"""

from nbsgd_jax.config import default_config


def get_config():
  c = default_config()
  c.algorithm = "diloco"
  c.num_workers = 8
  c.backend = "simulate"
  c.model = "transformer"
  c.dataset = "tiny_shakespeare"
  c.lm.context = 128
  c.lm.num_layers = 4
  c.lm.d_model = 256
  c.lm.num_heads = 4
  c.batch_size = 32               # sequences of lm.context characters per worker per step
  c.optimizer = "adamw"
  c.learning_rate = 1e-3
  c.momentum = 0.9
  c.adam_b2 = 0.95
  c.weight_decay = 0.1
  c.lr_schedule = "cosine"
  c.warmup_steps = 100
  c.num_steps = 3000
  c.eval_every = 250
  c.eval_train_examples = 256     # training windows behind train_loss
  c.diloco.local_steps = 50
  c.diloco.outer_lr = 0.7
  c.diloco.outer_momentum = 0.9
  c.diloco.outer_nesterov = True
  c.seed = 0
  return c
