"""DiLoCo's descendants as recipes, with their config sections (keys named as in each
reference): DeMo (``docs/algorithms.md``)."""

from __future__ import annotations

import ml_collections

from nbsgd_jax.communications import ContributorAllGather
from nbsgd_jax.core import checks
from nbsgd_jax.recipes import optim
from nbsgd_jax.recipes.builder import Builder
from nbsgd_jax.recipes.registry import Recipe, Section, register
from nbsgd_jax.transforms import algorithms as A
from nbsgd_jax.transforms.base import injected


def demo_defaults() -> ml_collections.ConfigDict:
  """``config.demo.*`` with their defaults: DeMo (bloc97/DeMo ``demo.py``, its constructor's
  defaults)."""
  s = ml_collections.ConfigDict()
  s.compression_decay = 0.999    # beta: the decoupled momentum's decay, in [0, 1)
  s.compression_topk = 32        # DCT coefficients each worker sends per chunk
  s.compression_chunk = 64       # target chunk length per axis (the largest divisor <= it)
  return s


def check_demo_config(cfg, errs: list) -> None:
  """demo.compression_decay in [0, 1); compression_topk, compression_chunk >= 1."""
  checks.number(cfg, errs, "demo.compression_decay", 0, hi=1, hi_open=True)
  checks.integer(cfg, errs, "demo.compression_topk", 1)
  checks.integer(cfg, errs, "demo.compression_chunk", 1)


def _check_demo(cfg, errs: list) -> None:
  """DeMo's momentum is its own: SGD's would be a second one on the sign."""
  if cfg.optimizer == "sgd" and cfg.momentum:
    errs.append(f"config.momentum={cfg.momentum} is not allowed with algorithm='demo': DeMo "
                "keeps its own decoupled momentum (demo.compression_decay) and steps by SGD "
                "without momentum; set momentum=0")


DEMO = Section(demo_defaults, check_demo_config, "DeMo (Peng, Quesnelle, Kingma 2024)",
               hparams=("compression_decay",))


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
                                      c.compression_topk, c.compression_chunk),
                    optim.hparams(cfg))

  return Recipe(b.injected(make, "demo.compression_decay"), decentralized=False,
                primary=exchange)
