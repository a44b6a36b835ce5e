"""nanoGPT's character-level Shakespeare on a CPU, on one worker: the anchor of the LM workload.

karpathy/nanoGPT, ``config/train_shakespeare_char.py`` with the README's CPU overrides
(``--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0``): a 4-layer, 4-head, 128-wide decoder, context 64, batch 12, 2,000 iterations,
AdamW (lr 1e-3, beta1 0.9, beta2 0.99, weight decay 0.1 on the weight matrices and
embeddings only), 100 warm-up steps, then a cosine decay to 1e-4 at step 2,000, gradients
clipped to norm 1.0, no dropout. nanoGPT reports a validation loss of about 1.88 for it.

The data are the embedded tiny_shakespeare text split as nanoGPT's ``shakespeare_char``
(first 90 % train, last 10 % validation, the 65 characters); ``test_loss`` in
``metrics.jsonl`` is the loss on the whole validation split (nats per character)::

    python -m nbsgd_jax.main --config=experiments/configs/shakespeare_char.py \\
        --workdir=runs/shakespeare_char

The model is nanoGPT's ``GPT`` (``model.py``) with ``train.py``'s default ``bias=False``:
no biases (LayerNorms scale only, epsilon 1e-5), the output layer tied to the token embedding,
``_init_weights`` (weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(8))), exact
(erf) GELU, and the 65-character vocabulary without a reserved unknown id
(``text_unknown_id=False``): 804,096 parameters, position embeddings included
(``tests/models/test_nanogpt.py`` checks the count and the forward pass against a numpy transcription
of ``model.py``).

Differences from nanoGPT that we know of: the validation loss is averaged over the whole split
rather than 20 random batches (and ``train_loss`` over the first 240 training windows); the
warm-up ramp is ``lr * t / 100`` at step ``t`` (nanoGPT's ``get_lr``: ``lr * (t + 1) / 101``);
and the random streams (initialisation, batches) are JAX's, not PyTorch's.

``lr_min`` and ``eval_train_examples`` follow ``learning_rate`` and ``batch_size`` as given on
the command line (ml_collections FieldReferences, resolved in ``config.json``), as nanoGPT's
``min_lr = learning_rate / 10`` and ``eval_iters`` batches do.
"""

from nbsgd_jax.config import default_config


def get_config():
  c = default_config()
  c.algorithm = "allreduce"   # one worker: no communication
  c.num_workers = 1
  c.backend = "simulate"
  c.model = "transformer"
  c.dataset = "tiny_shakespeare"
  c.lm.context = 64
  c.lm.num_layers = 4
  c.lm.num_heads = 4
  c.lm.d_model = 128
  c.lm.bias = False           # nanoGPT's train.py default
  c.lm.tie_embeddings = True
  c.lm.init = "nanogpt"
  c.lm.gelu = "exact"
  c.lm.layernorm_eps = 1e-5
  c.text_unknown_id = False   # the 65 characters: nanoGPT's vocab_size and stoi
  c.batch_size = 12
  c.optimizer = "adamw"
  c.learning_rate = 1e-3
  c.momentum = 0.9            # AdamW's beta1
  c.adam_b2 = 0.99
  c.weight_decay = 0.1
  c.weight_decay_on = "matrices"
  c.grad_clip = 1.0
  c.lr_schedule = "cosine"
  c.lr_min = c.get_ref("learning_rate") / 10  # 1e-4; nanoGPT: "learning_rate / 10 usually"
  c.warmup_steps = 100
  c.num_steps = 2000
  c.eval_every = 250
  # training windows behind train_loss: nanoGPT's eval_iters = 20 batches (20 x 12 = 240)
  c.eval_train_examples = 20 * c.get_ref("batch_size")
  c.seed = 0
  return c
