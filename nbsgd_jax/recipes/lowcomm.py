"""DiLoCo's descendants as recipes, with their config sections (keys named as in each
reference): DeMo, SparseLoCo and NoLoCo (``docs/algorithms.md``)."""

from __future__ import annotations

import ml_collections

from nbsgd_jax.communications import ContributorAllGather
from nbsgd_jax.communications.groups import RandomGroups
from nbsgd_jax.core import checks
from nbsgd_jax.recipes import optim
from nbsgd_jax.transforms import asynchronous
from nbsgd_jax.recipes.builder import Builder
from nbsgd_jax.recipes.registry import Recipe, Section, register
from nbsgd_jax.transforms import algorithms as A
from nbsgd_jax.transforms.base import injected


def demo_defaults() -> ml_collections.ConfigDict:
  """``config.demo.*`` with their defaults: DeMo (bloc97/DeMo ``demo.py``, its constructor's
  defaults)."""
  s = ml_collections.ConfigDict()
  s.error_decay = 0.999    # beta: the decoupled momentum's decay, in [0, 1)
  s.top_k = 32        # DCT coefficients each worker sends per chunk
  s.chunk_size = 64       # target chunk length per axis (the largest divisor <= it)
  return s


def check_demo_config(cfg, errs: list) -> None:
  """demo.error_decay in [0, 1); top_k, chunk_size >= 1."""
  checks.number(cfg, errs, "demo.error_decay", 0, hi=1, hi_open=True)
  checks.integer(cfg, errs, "demo.top_k", 1)
  checks.integer(cfg, errs, "demo.chunk_size", 1)


def _check_demo(cfg, errs: list) -> None:
  """DeMo's momentum is its own: SGD's would be a second one on the sign."""
  if cfg.optimizer == "sgd" and cfg.momentum:
    errs.append(f"config.momentum={cfg.momentum} is not allowed with algorithm='demo': DeMo "
                "keeps its own decoupled momentum (demo.error_decay) and steps by SGD "
                "without momentum; set momentum=0")


DEMO = Section(demo_defaults, check_demo_config, "DeMo (Peng, Quesnelle, Kingma 2024)",
               hparams=("error_decay",))


@register("demo", no_compression="DeMo's message is its own codec: the top-k DCT "
          "coefficients per chunk of the worker's momentum", sections={"demo": DEMO},
          check=_check_demo, face="demo")
def demo(b: Builder) -> Recipe:
  """DeMo (Peng, Quesnelle, Kingma 2024): each worker's decoupled momentum, the mean over the
  contributors of its top-k DCT coefficients per chunk, signed, then SGD."""
  c, cfg = b.cfg.demo, b.cfg
  exchange = ContributorAllGather(b.n, b.axis_name, "demo")
  opt = b.optimizer("global")

  def make(decay):
    return injected(lambda hp: A.demo(opt, exchange, optim.make_schedule(cfg, hp), decay,
                                      c.top_k, c.chunk_size),
                    optim.hparams(cfg))

  return Recipe(b.injected(make, "demo.error_decay"), decentralized=False,
                primary=exchange)


def sparseloco_defaults() -> ml_collections.ConfigDict:
  """``config.sparseloco.*`` with their defaults: the paper's run (tplr-ai/SparseLoCo
  ``hparams/512M/sweeps/sparseloco.yaml``; the class's own defaults differ: error_decay
  0.999, top_k 32, no quantisation, outer lr 0.7)."""
  s = ml_collections.ConfigDict()
  s.local_steps = 15             # H: inner steps per outer step
  s.outer_lr = 1.0    # outer SGD rate (it also scales the pseudo-gradient into e)
  s.outer_momentum = 0.0         # heavy-ball outer momentum (the reference: none)
  s.error_decay = 0.95           # beta: the error-feedback accumulator's decay, in [0, 1]
  s.top_k = 128                  # entries per chunk_size^2 values (round(len top_k / c^2))
  s.chunk_size = 64              # target chunk length per axis (the largest divisor <= it)
  s.use_quantization = True      # the kept values quantised per tensor (else float32)
  s.quantization_bins = 4        # levels: 4 = the paper's 2 bits
  s.quantization_range = 6.0     # the bins span this many standard deviations
  return s


def check_sparseloco_config(cfg, errs: list) -> None:
  """sparseloco.*: H, chunk_size, top_k >= 1; rate > 0; momentum in [0, 1); decay in [0, 1];
  bins >= 2; range > 0."""
  checks.integer(cfg, errs, "sparseloco.local_steps", 1, note="H")
  checks.number(cfg, errs, "sparseloco.outer_lr", 0, lo_open=True)
  checks.number(cfg, errs, "sparseloco.outer_momentum", 0, hi=1, hi_open=True)
  checks.number(cfg, errs, "sparseloco.error_decay", 0, hi=1)
  checks.integer(cfg, errs, "sparseloco.top_k", 1)
  checks.integer(cfg, errs, "sparseloco.chunk_size", 1)
  checks.boolean(cfg, errs, "sparseloco.use_quantization")
  checks.integer(cfg, errs, "sparseloco.quantization_bins", 2)
  checks.number(cfg, errs, "sparseloco.quantization_range", 0, lo_open=True)


SPARSELOCO = Section(sparseloco_defaults, check_sparseloco_config,
                     "SparseLoCo (Sarfi et al. 2025)",
                     hparams=("outer_lr", "outer_momentum", "error_decay"),
                     structure=lambda cfg: {"sparseloco_momentum_on":
                                            bool(cfg.sparseloco.outer_momentum)})


def _check_sparseloco(cfg, errs: list) -> None:
  """SparseLoCo's first outer step ends within the run."""
  checks.period_within_run(cfg, errs, "sparseloco.local_steps", True)


@register("sparseloco", no_compression="SparseLoCo's message is its own codec: chunked top-k "
          "of the error-feedback accumulator, quantised", sections={"sparseloco": SPARSELOCO},
          check=_check_sparseloco, face="sparseloco")
def sparseloco(b: Builder) -> Recipe:
  """SparseLoCo (Sarfi et al. 2025): DiLoCo whose pseudo-gradients go through each worker's
  error feedback, chunked top-k and 2-bit quantisation, averaged over the contributors."""
  c = b.cfg.sparseloco
  bins = c.quantization_bins if c.use_quantization else 0
  exchange = ContributorAllGather(b.n, b.axis_name, "sparseloco",
                                  value_bits=8 if bins else 32)
  opt = b.optimizer("local")
  t = b.injected(lambda lr, m, beta: A.sparseloco(
      opt, exchange, lr, m, beta, c.top_k, c.chunk_size, bins, c.quantization_range,
      bool(c.outer_momentum)), "sparseloco.outer_lr", "sparseloco.outer_momentum",
      "sparseloco.error_decay")
  return Recipe(t, decentralized=True, primary=exchange, evaluated=asynchronous.outer_models,
                planner=b.fixed_periods(c.local_steps))


def noloco_defaults() -> ml_collections.ConfigDict:
  """``config.noloco.*`` with their defaults: the paper's runs (jkolehm/noloco's
  ``*noloco_mean_*`` configs; its builder's own outer_momentum default is 0.9)."""
  s = ml_collections.ConfigDict()
  s.local_steps = 50   # H: inner steps per outer step
  s.group_size = 2         # g: workers per random group (must divide num_workers)
  s.outer_lr = 0.7               # alpha: the step towards the group's mean
  s.outer_momentum = 0.5         # beta: the worker's own outer momentum (heavy ball)
  return s


def check_noloco_config(cfg, errs: list) -> None:
  """noloco.*: H, g >= 1; alpha > 0; beta in [0, 1)."""
  checks.integer(cfg, errs, "noloco.local_steps", 1, note="H")
  checks.integer(cfg, errs, "noloco.group_size", 1, note="g")
  checks.number(cfg, errs, "noloco.outer_lr", 0, lo_open=True)
  checks.number(cfg, errs, "noloco.outer_momentum", 0, hi=1, hi_open=True)


def _check_noloco(cfg, errs: list) -> None:
  """The first outer step within the run; g divides the workers."""
  checks.period_within_run(cfg, errs, "noloco.local_steps", True)
  g, n = cfg.noloco.group_size, cfg.num_workers
  if checks.is_int(g) and g >= 1 and checks.is_int(n) and n % g:
    errs.append(f"config.noloco.group_size={g} is not allowed with "
                f"config.num_workers={n}: the groups must partition the workers (g divides n)")


NOLOCO = Section(noloco_defaults, check_noloco_config, "NoLoCo (Kolehmainen et al. 2025)",
                 hparams=("outer_lr", "outer_momentum"))


@register("noloco", no_compression="NoLoCo exchanges models within random groups uncompressed "
          "(a codec on them is not built)", sections={"noloco": NOLOCO}, check=_check_noloco,
          face="noloco")
def noloco(b: Builder) -> Recipe:
  """NoLoCo (Kolehmainen et al. 2025): H inner steps, then each worker's outer step towards
  its random group's mean model, with its own slow weights and momentum; no all-reduce."""
  c = b.cfg.noloco
  groups = RandomGroups(b.n, c.group_size, b.cfg.seed, b.axis_name, "noloco")
  opt = b.optimizer("local")
  t = b.injected(lambda lr, m: A.noloco(opt, groups, lr, m), "noloco.outer_lr",
                 "noloco.outer_momentum")
  return Recipe(t, decentralized=True, primary=groups,
                planner=b.fixed_periods(c.local_steps))
