"""The configuration's keys with their defaults: the top-level keys (:data:`TOP_LEVEL`), the
components' sections (:data:`SECTIONS`, each with its check beside the code that reads it) and
:func:`default_config`, which adds the algorithms' own sections
(:data:`nbsgd_jax.recipes.SECTIONS`). :mod:`nbsgd_jax.config` re-exports them.
"""

from __future__ import annotations

import ml_collections

from nbsgd_jax.data import augment as augment_lib
from nbsgd_jax import codecs as codecs_lib
from nbsgd_jax.host import consensus as consensus_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax.models import problems as problems_lib
from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax.host import cluster_config
from nbsgd_jax.recipes import Section


def _setup_defaults() -> ml_collections.ConfigDict:
  """The top-level keys of the algorithm, workers, backend, model and data."""
  c = ml_collections.ConfigDict()
  c.algorithm = "dpsgd"          # a registered algorithm (recipes.REGISTRY)
  c.num_workers = 8              # workers n
  c.topology = "ring"            # communication graph of decentralized algorithms
                                 # (matcha_graph0: MATCHA's 8-node Erdos-Renyi graph 0)
  c.mixing_weights = "metropolis_hastings"  # how W is built from the graph
  c.topology_p = 0.3             # erdos_renyi edge probability, in (0, 1]
  c.topology_seed = 0            # erdos_renyi graph seed
  c.topology_rows = 0            # torus rows (0: most square rows x cols = num_workers)
  c.topology_cols = 0            # torus cols (0: num_workers / rows)
  c.backend = "simulate"         # simulate (jax.vmap) | mesh (jax.shard_map over devices) |
                                 # multihost (mesh over the devices of every process)
  c.workers_per_device = 0       # mesh: k workers per device (vmap inside shard_map); 0: the
                                 # smallest k with num_workers / k <= devices
  c.imports = ""                 # comma-separated modules imported before the run, each a
                                 # module name on sys.path or a file path (ends in .py or
                                 # holds a /); they may register models, data sets and
                                 # recipes by name (docs/extending.md)
  c.model = "cnn"                # logreg | mlp | cnn | resnet (CIFAR ResNet, He et al. 2016) |
                                 # transformer (decoder-only language model, config.lm; a
                                 # text data set, e.g. tfds:tiny_shakespeare)
  c.mlp_hidden = (256,)          # hidden sizes of the MLP
  c.cnn_channels = (6, 16)       # conv widths of the CNN
  c.conv_impl = "auto"           # auto | batched | per_worker: cnn / resnet convolutions under
                                 # vmap (batched: one grouped conv; per_worker: n ordinary
                                 # convs; auto: per_worker on a CPU with 2-64 workers per
                                 # device, else batched; forms.py)
  c.pool_impl = "auto"           # auto | window (nn.max_pool) | reshape (reshape + max, the
                                 # same values, an elementwise gradient): the CNN's max-pools
                                 # (auto: reshape where the sizes are even, else window)
  c.residuals = "auto"           # auto | fused | materialized: resnet's residual stream
                                 # stored once per block (auto: materialized on a CPU; forms.py)
  c.resnet_depth = 20            # resnet: 6 k + 2 layers (20: ResNet-20, 0.27 M parameters)
  c.norm = "batch"               # resnet: batch (BatchNorm, running statistics per worker)
                                 # | group (GroupNorm, no model state)
  c.norm_groups = 2              # groups of norm=group (divides 16)
  c.compute_dtype = "float32"    # float32 | bfloat16: the model's compute dtype (parameters,
                                 # gradients, optimizer state and messages stay float32)
  c.dataset = "mnist10k"         # images: mnist10k (embedded) | image_folder | cifar10 |
                                 # cifar100 (data_path) | tfds:<name>; text (model=transformer):
                                 # tiny_shakespeare (embedded) | text_file (data_path) |
                                 # tfds:<name>; least_squares | logistic (synthetic PL
                                 # problems, config.problem, known F*); a registered name;
                                 # arrays (train(data=ArrayDataset(...)))
  c.data_path = ""               # image_folder: a directory or .tar/.tar.gz/.tar.xz/.zip laid
                                 # out train/<class>/<image>, test/<class>/<image>; cifar10 /
                                 # cifar100: the python release (cifar-10-python.tar.gz or
                                 # cifar-10-batches-py/); text_file: a UTF-8 text file
  c.data_cache = ""              # image_folder: decoded .npz cache ("": ~/.cache/nbsgd_jax)
  c.data_dir = ""                # tfds data_dir ("" = tfds default)
  c.text_unknown_id = True       # text: one more id, reserved unknown (False: nanoGPT's ids)
  c.partition = "iid"            # iid | dirichlet (labels) | contiguous (text: own 1/n each)
  c.dirichlet_alpha = 0.5        # concentration of the Dirichlet partition (> 0)
  return c


def _training_defaults() -> ml_collections.ConfigDict:
  """The top-level keys of the optimizer, the schedule, evaluation and the run's records."""
  c = ml_collections.ConfigDict()
  c.batch_size = 32              # examples per worker per step
  c.learning_rate = 0.05         # SGD step size (peak value of the schedule)
  c.lr_schedule = "constant"     # constant | cosine (decay to 0 at num_steps) |
                                 # inverse_time: learning_rate * t0 / (step + t0) |
                                 # step: x lr_decay at each of lr_milestones
  c.lr_time_scale = 100.0        # steps, t0 of inverse_time
  c.lr_milestones = (0.5, 0.75)  # step: decays at these fractions of num_steps (Goyal et al.
                                 # 2017; Kong et al. 2021 on CIFAR-10), increasing in (0, 1)
  c.lr_decay = 0.1               # step: factor at each milestone, in (0, 1]
  c.warmup_steps = 0             # linear warm-up from 0 over this many steps
  c.lr_min = 0.0                 # cosine: the rate reached at num_steps (nanoGPT: lr / 10),
                                 # in [0, learning_rate]
  c.optimizer = "sgd"            # local optimizer: sgd (momentum, L2 weight decay) | adamw
                                 # (b1 = momentum, b2 = adam_b2, decoupled weight decay) |
                                 # muon (optax.contrib.muon: matrices orthogonalised,
                                 # beta = momentum; the others by Adam, b2 = adam_b2)
  c.adam_b2 = 0.999              # adamw: second-moment decay in [0, 1)
  c.momentum = 0.9               # heavy-ball momentum in [0, 1) (0 = plain SGD)
  c.nesterov = False             # Nesterov momentum
  c.weight_decay = 0.0           # L2 coefficient added to the gradient
  c.weight_decay_on = "all"      # all | matrices: only parameters with >= 2 axes decay (kernels,
                                 # embeddings; not biases or norm scales: nanoGPT's rule)
  c.grad_clip = 0.0              # clip each worker's gradient to this global L2 norm before
                                 # its optimizer (0: off; nanoGPT: 1.0)
  c.num_steps = 1000             # steps: the run's length (gradients per worker with budget_unit)
  c.budget_unit = "steps"        # unit of num_steps, eval_every, checkpoint_every, schedule:
                                 # steps | grads_per_worker (the same for every algorithm)
  c.eval_every = 100             # steps between evaluations (a final one is always made)
  c.eval_train_examples = 2000   # training examples used for train_loss (averaged model)
  c.eval_test_examples = 0       # test examples behind test_loss / test_accuracy: a fixed
                                 # uniform sample, the same at every evaluation (0: all)
  c.validation_examples = 0      # > 0: held-out training examples test_* is measured on
  c.eval_worker_accuracy = True  # decentralized recipes: also each worker's own test accuracy
                                 # (worker_test_accuracy, the mean over the workers)
  c.eval_worker_examples = 0     # test examples behind each worker's own accuracy, a fixed
                                 # sample (0: auto, n_test / n, >= 100: about one pass in all)
  c.stop_sim_time = 0.0          # s: stop at the first evaluation with sim_time >= this, before
                                 # num_steps (equal-time budgets; 0: off)
  c.stop_train_loss = 0.0        # stop at the first evaluation with train_loss <= this, before
                                 # num_steps (time to a target loss; 0: off)
  c.stop_step = 0                # steps: stop at the first evaluation with step >= this, before
                                 # num_steps (a prefix of the run: the schedule still sees
                                 # num_steps; 0: off)
  c.steps_per_dispatch = 0       # k: training steps per compiled dispatch (lax.scan over the
                                 # steps between evaluations whose host inputs are known in
                                 # advance; hooks run before each dispatch; clock=wall: 1);
                                 # 0: auto, the largest divisor of eval_every up to 16, and 1
                                 # with hooks, clock=wall, a periodic recipe or on a CPU
                                 # (run/stepper.py, forms.blocks_pay)
  c.double_buffer = True         # a spare set of parameter buffers: each step writes the new
                                 # parameters there (no fresh [n, d] buffer and copy when the
                                 # models are mixed); False: one set, less memory
  c.gather_gradients = True      # event clock, simulate backend: a step computes the
                                 # gradients of the workers whose computation starts only
                                 # (gathered into a bucket of 1, 2, 4, ..., n; run/
                                 # gathered.py); False: every worker's, the rest dropped
  c.seed = 0                     # init, data order and partition seed
  c.sweep = ""                   # a grid of runs, one program per structure: axes separated
                                 # by ;, each key=v1,v2,... (a:b: the integers a..b-1), e.g.
                                 # learning_rate=0.05,0.1;seed=0:3 (docs/guide.md, Sweeps);
                                 # WORKDIR/<run>/ per run
  c.sweep_runs = "auto"          # how a sweep's runs of one structure train: stacked (one
                                 # program, a runs axis) | in_turn (one after another, compiled
                                 # once) | auto: stacked on a GPU / TPU, in turn on a CPU (a
                                 # CPU step's time grows with the runs: docs/results.md, Sweeps)
  c.compilation_cache = "default"  # directory of JAX's persistent compilation cache (a later
                                 # process reads programs back instead of compiling them);
                                 # default: $NBSGD_JAX_COMPILATION_CACHE, else
                                 # ~/.cache/nbsgd_jax/jax; none: off
  c.progress = True              # tqdm progress bar
  c.overwrite = False            # replace the run the workdir holds (its records and
                                 # checkpoints; the same run starts again from step 0); False:
                                 # this run finished is not trained again, unfinished it
                                 # resumes, another run is refused
  c.tensorboard = False          # also write workdir/tensorboard event files (tensorboardX):
                                 # the same scalars as metrics.jsonl
  c.checkpoint_every = 0         # steps between orbax checkpoints in workdir/checkpoints (a
                                 # multiple of eval_every; 0: none); a run started again in
                                 # the same workdir resumes from the newest one
  c.init_from = ""               # a run's workdir: start from its newest checkpoint's average
                                 # model (optimizer state and step count fresh); "": seeded init
  return c


# the top-level keys, in the order of docs/config.md
TOP_LEVEL = (_setup_defaults, _training_defaults)


def default_config() -> ml_collections.ConfigDict:
  """Every configuration key with its default (units in the comments): the top-level keys
  (:data:`TOP_LEVEL`), the components' sections (:data:`SECTIONS`) and the algorithms' own
  (:data:`nbsgd_jax.recipes.SECTIONS`)."""
  c = ml_collections.ConfigDict()
  for part in TOP_LEVEL:
    for key, value in part().items():
      c[key] = value
  for name, section in {**SECTIONS, **recipes_lib.SECTIONS}.items():
    c[name] = section.defaults()
  return c


# The sections of the framework's components: each one's defaults and check beside the code
# that reads it (an algorithm's own sections come with its registration: recipes.SECTIONS).
SECTIONS: dict[str, Section] = {
    "lm": Section(models_lib.lm_defaults, models_lib.check_lm_config,
                     'model=transformer: sizes and options of the language model'),
    "augment": Section(augment_lib.augment_defaults, augment_lib.check_config,
                     'on-device input augmentation of image batches'),
    "dpsgd": Section(recipes_lib.dpsgd_defaults, recipes_lib.check_dpsgd_config,
                     "D-PSGD's order of the local step and the gossip (every recipe that gossips)"),
    "cluster": Section(cluster_config.cluster_defaults, cluster_config.check_config,
                     'simulated cluster behind sim_time (He & Dube)',
                     host=cluster_config.HOST_KEYS),
    "nonblocking": Section(cluster_config.nonblocking_defaults, cluster_config.check_nonblocking_config,
                     'Non-blocking SGD (He & Dube 2022)'),
    "compression": Section(codecs_lib.compression_defaults, codecs_lib.check_config,
                     'codecs (nbsgd_jax.codecs), error feedback'),
    "consensus": Section(consensus_lib.consensus_defaults, consensus_lib.check_config,
                     'consensus distance (Kong et al. 2021)'),
    "problem": Section(problems_lib.problem_defaults, problems_lib.check_config,
                     'synthetic PL problems (dataset least_squares | logistic; Haddadpour et al. 2019)'),
}
