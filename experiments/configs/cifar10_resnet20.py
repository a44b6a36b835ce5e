"""ResNet-20 on CIFAR-10, the EPFL recipe (Lin, Stich, Patel & Jaggi 2020, LocalSGD-Code;
Kong et al. 2021, consensus control; Koloskova et al. 2020): 16 workers on a ring, D-PSGD,
batch 128 per worker, learning rate 0.1 per 128 examples scaled by the global batch
(0.1 x 16 = 1.6) with a 5-epoch linear warm-up, step decay x 0.1 at 50 % and 75 % of
300 epochs, Nesterov momentum 0.9, weight decay 1e-4, random crop (padding 4), horizontal
flip and per-channel normalisation with the published CIFAR-10 statistics
(``augment.stats="cifar10"``, whatever the source); BatchNorm statistics kept per worker.

The data, from any of three sources (no TensorFlow and no network for the first two):

* an image folder (a directory or a .tar / .tar.gz / .tar.xz / .zip archive laid out
  ``train/<class>/<image>``, ``test/<class>/<image>``; decoded once, then cached as .npz in
  ``--config.data_cache``, default ~/.cache/nbsgd_jax)::

    python -m nbsgd_jax.main --config=experiments/configs/cifar10_resnet20.py \
        --workdir=runs/cifar10_resnet20 --config.dataset=image_folder \
        --config.data_path=../shared/data/cifar10_jpeg.tar.xz

* the CIFAR-10 python release (``cifar-10-python.tar.gz`` from the authors' page or
  torchvision, or its extracted ``cifar-10-batches-py/``)::

    python -m nbsgd_jax.main --config=experiments/configs/cifar10_resnet20.py \
        --workdir=runs/cifar10_resnet20 --config.dataset=cifar10 \
        --config.data_path=$HOME/data/cifar-10-python.tar.gz

* tfds (the default ``dataset``; prepared once, ArrayRecord: the CIFAR builder downloads the
  archive)::

    tfds build cifar10 --file_format=array_record --data_dir=$HOME/tensorflow_datasets
    python -m nbsgd_jax.main --config=experiments/configs/cifar10_resnet20.py \
        --workdir=runs/cifar10_resnet20

Sixteen workers are simulated with jax.vmap on one device (a GPU for the full 300 epochs).
Other algorithms: ``--config.algorithm=allreduce`` (or ``choco_sgd``, ``local_sgd``, ...);
GroupNorm instead of BatchNorm: ``--config.norm=group``; bfloat16 compute:
``--config.compute_dtype=bfloat16``; a short check on CPU: ``--config.num_steps=20
--config.eval_every=10 --config.num_workers=4 --config.batch_size=16
--config.eval_test_examples=1000`` (its test loss is BatchNorm's running statistics after 20
steps, not divergence: docs/guide.md, "Workloads").

The derived settings follow ``num_workers`` and ``batch_size`` as given on the command line
(ml_collections FieldReferences, resolved in ``config.json``): an epoch is
``50,000 // (num_workers x batch_size)`` steps, and the learning rate, the warm-up, the run's
length and the evaluation and checkpoint cadences are counted from it, e.g.
``--config.num_workers=2 --config.batch_size=64``: learning rate 0.1 x 128 / 128 = 0.1, an
epoch of 390 steps, a warm-up of 1,950 steps. Setting a derived key itself
(``--config.warmup_steps=100``) overrides that key alone.
"""

from nbsgd_jax.config import default_config

TRAIN_EXAMPLES = 50_000
EPOCHS = 300


def get_config():
  c = default_config()
  c.algorithm = "dpsgd"
  c.num_workers = 16
  c.topology = "ring"
  c.backend = "simulate"
  c.model = "resnet"
  c.resnet_depth = 20
  c.norm = "batch"
  c.dataset = "tfds:cifar10"
  c.partition = "iid"
  c.batch_size = 128
  # derived lazily from num_workers and batch_size (FieldReferences): a command line's
  # --config.num_workers / --config.batch_size reach them
  workers, batch = c.get_ref("num_workers"), c.get_ref("batch_size")
  steps_per_epoch = TRAIN_EXAMPLES // (workers * batch)  # 24 for 16 x 128
  # linear scaling (Goyal et al.): 0.1 per 128 examples of the global batch (1.6 for 16 x 128)
  c.learning_rate = 0.1 * workers.to_float() * batch / 128
  c.warmup_steps = 5 * steps_per_epoch
  c.lr_schedule = "step"
  c.lr_milestones = (0.5, 0.75)  # fractions of num_steps
  c.lr_decay = 0.1
  c.momentum = 0.9
  c.nesterov = True
  c.weight_decay = 1e-4
  c.num_steps = EPOCHS * steps_per_epoch
  c.eval_every = 10 * steps_per_epoch
  c.eval_train_examples = 2000
  c.augment.crop_padding = 4
  c.augment.flip = True
  c.augment.normalize = True
  c.augment.stats = "cifar10"  # the published statistics for every source
  # every 5th evaluation, 50 epochs (follows --config.eval_every; setting it leaves
  # eval_every); a checkpoint is also written at the end
  c.checkpoint_every = c.get_ref("eval_every") * 5
  c.seed = 0
  return c
