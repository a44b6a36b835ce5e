"""Algorithms as recipes: ``config.algorithm`` names a short composition in one registry.

A recipe is a function ``build(b: Builder) -> Recipe`` registered with :func:`register`. The
:class:`Builder` hands out the pieces a recipe composes, built from the config: the local
optimizer (with Non-blocking SGD's skip rule when mini-batches may be missing), communications
(all-reduce, gossip over the topology, MATCHA's matchings) and the reducers of gradients and
models (compressed with error feedback when ``config.compression.name`` is set). The
cross-cutting pieces are applied to every recipe by :func:`build`, never by a recipe:

* the gradient source (full batch, or the mean over the finished mini-batches);
* consensus control (Kong et al. 2021) over the recipe's ``gossip``, when it has one;
* compression, wherever the recipe asked for a reducer: a recipe that never does (gossip
  exchanges models) refuses it with the reason it declared.

Adding an algorithm: a communication or wrapper if a new one is needed, then::

    @recipes.register("my_sgd")
    def my_sgd(b):
      comm = b.allreduce()
      return recipes.Recipe(chain(b.gradient_reducer(comm), b.optimizer("global")),
                            decentralized=False, primary=comm)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import ml_collections
import numpy as np
import optax

from nbsgd_jax import transforms as T
from nbsgd_jax.axis import AXIS
from nbsgd_jax.communications import (AllReduce, Communication, CompressedGossip, Gossip,
                                      Matchings, MessageAllGather, SparseAllGather)
from nbsgd_jax.transforms import decentralized as D
from nbsgd_jax.transforms.decentralized import check_d2_mixing  # noqa: F401 (its old home)


class Recipe(NamedTuple):
  """What a recipe builds.

  Attributes:
    transform: the worker transform of a step (gradient in, parameter change out).
    decentralized: whether workers hold different models (consensus distance > 0).
    gossip: the communication consensus control repeats (None: the recipe does not gossip
      every step, and consensus control is refused).
    primary: the step's main communication (Non-blocking SGD's per-neighbourhood deadlines).
    planner: for a recipe that synchronises at period ends (local SGD, DiLoCo, Gossip-PGA),
      ``loss_offset -> SyncPlanner`` (:mod:`nbsgd_jax.local_sgd`): the host plans the periods
      (``ctx.period_end``); None: every step is a period end.
  """

  transform: T.WorkerTransform
  decentralized: bool
  gossip: Optional[Communication] = None
  primary: Optional[Communication] = None
  planner: Optional[Callable[[float], Any]] = None

  @property
  def periodic(self) -> bool:
    """Whether the host plans communication periods (:attr:`planner`)."""
    return self.planner is not None


Reason = Union[None, str, Callable[[ml_collections.ConfigDict], Optional[str]]]


class Entry(NamedTuple):
  """A registered recipe: ``build``, whether it gossips every step (consensus control
  applies) and why compression does not apply (None: it does)."""

  build: Callable[["Builder"], Recipe]
  gossips: bool = False
  no_compression: Reason = None


REGISTRY: dict[str, Entry] = {}
GOSSIP_REASON = ("gossip exchanges models, not gradients; compressed gossip needs CHOCO-SGD's "
                 "public copies x_hat")


def register(name: str, gossips: bool = False, no_compression: Reason = None) -> Callable:
  """Decorator: register ``build`` as ``config.algorithm=name``. ``gossips``: the recipe
  gossips every step and returns its ``Recipe.gossip`` (consensus control applies);
  ``no_compression``: the mathematical reason compression does not apply (a string, or
  ``cfg -> str | None``)."""

  def wrap(build):
    if name in REGISTRY and REGISTRY[name].build is not build:
      raise ValueError(f"recipe {name!r} is already registered")
    REGISTRY[name] = Entry(build, gossips, no_compression)
    return build

  return wrap


class Builder:
  """The pieces of a recipe, built from the config on request.

  Args:
    cfg: the run's config.
    topology: the :class:`~nbsgd_jax.topology.Topology`.
    plan: MATCHA's plan (``config.algorithm='matcha'``), or None.
    axis_name: the worker axis of the backend.
  """

  def __init__(self, cfg: ml_collections.ConfigDict, topology=None, plan=None,
               axis_name: Any = AXIS):
    self.cfg, self.topology, self.plan, self.axis_name = cfg, topology, plan, axis_name
    self.n = cfg.num_workers
    # mini-batches may be missing (Non-blocking SGD, failures): count-weighted means, skips
    from nbsgd_jax.config import counted_steps
    self.weighted = counted_steps(cfg)
    self.compressed = cfg.compression.name != "none"
    self.compression_used = False

  # ------------------------------------------------------------------ optimizers

  def optimizer(self, skip: Optional[str] = None) -> T.WorkerTransform:
    """The local optimizer (weight decay, SGD with momentum); ``skip`` = ``"local"`` /
    ``"global"`` adds the no-step rule of :func:`~nbsgd_jax.transforms.skip_when_idle` when
    mini-batches may be missing."""
    from nbsgd_jax.run.setup import make_optimizer
    opt = T.from_optax(make_optimizer(self.cfg))
    return T.skip_when_idle(opt, skip) if skip and self.weighted else opt

  # ------------------------------------------------------------------ communications

  def allreduce(self, ring: bool = False, key: str = "allreduce") -> AllReduce:
    return AllReduce(self.n, self.axis_name, key, self.weighted, ring)

  def gossip(self, key: str = "gossip", lazy: bool = False, kind=Gossip) -> Gossip:
    """Gossip over the topology's W (or its period of W_t); ``lazy``: over ``(I + W) / 2``;
    ``kind``: the class (:class:`~nbsgd_jax.communications.CompressedGossip` for CHOCO)."""
    g = kind.of_topology(self.topology, self.axis_name, key)
    if lazy:
      g = kind([(w + np.eye(self.n)) / 2 for w in g.phases], self.axis_name, key)
    return g

  def matchings(self) -> Matchings:
    return Matchings(self.plan, self.n, self.cfg.matcha.seed, self.axis_name)

  def fixed_periods(self, tau: int) -> Callable[[float], Any]:
    """A :attr:`Recipe.planner` of periods of ``tau`` steps."""
    from nbsgd_jax.local_sgd import SyncPlanner
    return lambda offset: SyncPlanner("fixed", tau)

  # ------------------------------------------------------------------ reducers

  def codec(self):
    """The :class:`~nbsgd_jax.codecs.Codec` of ``config.compression`` (marks compression as
    used by the recipe)."""
    from nbsgd_jax import codecs
    self.compression_used = True
    c = self.cfg.compression
    options = ({"rounds": c.gaussian_rounds or None,  # 0: the correction's default
                "correction": c.gaussian_correction}
               if c.name == "gaussian_k" else {})
    return codecs.make_codec(c.name, density=c.density, levels=c.levels,
                             bucket_size=c.bucket_size, **options)

  def _compressed(self, by: str) -> T.WorkerTransform:
    c = self.cfg.compression
    if c.name == "powersgd":  # a two-round all-reduce, not a codec
      from nbsgd_jax.transforms.powersgd import powersgd
      self.compression_used = True
      comm = AllReduce(self.n, self.axis_name, "powersgd", self.weighted)
      return powersgd(c.rank, comm, seed=self.cfg.seed, use_residual=c.error_feedback,
                      weight_by=by)
    codec = self.codec()
    comm = (SparseAllGather if codec.sparse else MessageAllGather)(
        self.n, self.axis_name, "sparse_allgather" if codec.sparse else "allgather",
        self.weighted)
    return T.error_feedback(codec, axis_name=self.axis_name, flatten=c.flatten,
                            seed=self.cfg.seed, use_residual=c.error_feedback,
                            communication=comm, weight_by=by)

  def gradient_reducer(self, allreduce: AllReduce) -> T.WorkerTransform:
    """The mean gradient: ``allreduce`` (count-weighted under Non-blocking SGD), or the
    compressed mean with error feedback when compression is on."""
    if self.compressed:
      return self._compressed("count")
    return T.mean_of(allreduce, "count")

  def delta_reducer(self, allreduce: AllReduce) -> T.WorkerTransform:
    """The mean of model differences (pseudo-gradients) over the live workers: ``allreduce``,
    or compressed with error feedback."""
    if self.compressed:
      return self._compressed("alive")
    return T.mean_of(allreduce, "alive")

  def model_reducer(self, allreduce: AllReduce) -> T.WorkerTransform:
    """The model average over the live workers: ``allreduce`` of the models, or, compressed,
    the compressed mean of the differences to the last average
    (:func:`~nbsgd_jax.transforms.via_anchor`)."""
    if self.compressed:
      return T.via_anchor(self.delta_reducer(allreduce))
    return T.mean_of(allreduce, "alive")


# ----------------------------------------------------------------------------- recipes


def _centralized(b: Builder, ring: bool) -> Recipe:
  comm = b.allreduce(ring=ring)
  return Recipe(T.chain(b.gradient_reducer(comm), b.optimizer("global")), decentralized=False,
                primary=comm)


@register("allreduce")
def allreduce(b: Builder) -> Recipe:
  """All-Reduce SGD, ``g = (1/n) sum_i g_i`` by ``lax.psum`` (or compressed with EF)."""
  return _centralized(b, ring=False)


@register("allreduce_ring")
def allreduce_ring(b: Builder) -> Recipe:
  """All-Reduce SGD by the explicit ring (reduce-scatter + all-gather of ``ppermute`` s)."""
  return _centralized(b, ring=True)


@register("dpsgd", gossips=True, no_compression=GOSSIP_REASON)
def dpsgd(b: Builder) -> Recipe:
  """D-PSGD (Lian et al. 2017) over the topology's W or W_t."""
  g = b.gossip()
  return Recipe(T.gossip_step(b.optimizer("local"), g, b.cfg.dpsgd.order), decentralized=True,
                gossip=g, primary=g)


@register("matcha", gossips=True, no_compression=GOSSIP_REASON)
def matcha(b: Builder) -> Recipe:
  """MATCHA (Wang et al. 2019): gossip over randomly activated matchings; consensus control
  gossips over the static base graph."""
  m = b.matchings()
  return Recipe(T.gossip_step(b.optimizer("local"), m, b.cfg.dpsgd.order), decentralized=True,
                gossip=b.gossip(), primary=m)


def _choco_reason(cfg) -> Optional[str]:
  if cfg.compression.name == "powersgd":
    return ("CHOCO-SGD compresses each worker's x - x_hat with a codec; PowerSGD's message is "
            "built by two all-reduces over all workers, which gossip does not have")
  return None


@register("choco_sgd", gossips=True, no_compression=_choco_reason)
def choco_sgd(b: Builder) -> Recipe:
  """CHOCO-SGD (Koloskova et al. 2019, Algorithm 2): gossip of compressed model differences
  with public copies; consensus control repeats a plain gossip round."""
  c = b.cfg
  g = b.gossip("choco", kind=CompressedGossip)
  t = D.choco_sgd(b.optimizer("local"), g, b.codec(), c.choco.gamma, c.compression.flatten,
                  c.seed, c.choco.order)
  return Recipe(t, decentralized=True, gossip=b.gossip(), primary=g)


@register("gradient_tracking", gossips=True, no_compression=GOSSIP_REASON)
def gradient_tracking(b: Builder) -> Recipe:
  """Gradient tracking, DIGing (Nedic et al. 2017): the optimizer follows the tracked mean
  gradient ``y``; two gossip rounds a step (``y`` and the model)."""
  g = b.gossip()
  t = T.chain(D.gradient_tracking(b.gossip("tracking")),
              T.gossip_step(b.optimizer("local"), g, b.cfg.dpsgd.order))
  return Recipe(t, decentralized=True, gossip=g, primary=g)


@register("d2", gossips=True, no_compression=GOSSIP_REASON)
def d2(b: Builder) -> Recipe:
  """D^2 (Tang et al. 2018) over W, or Exact Diffusion over (I + W) / 2 (``d2.mixing``)."""
  g = b.gossip(lazy=b.cfg.d2.mixing == "lazy")
  check_d2_mixing(g.phases, b.cfg.d2.mixing)
  return Recipe(D.d2(b.optimizer("local"), g), decentralized=True, gossip=g, primary=g)


@register("gossip_pga", gossips=True, no_compression=GOSSIP_REASON)
def gossip_pga(b: Builder) -> Recipe:
  """Gossip-PGA (Chen et al. 2021): D-PSGD with a global average every ``gossip_pga.period``
  steps."""
  g, avg = b.gossip(), b.allreduce()
  t = D.gossip_pga(b.optimizer("local"), g, avg, b.cfg.dpsgd.order)
  return Recipe(t, decentralized=True, gossip=g, primary=g,
                planner=b.fixed_periods(b.cfg.gossip_pga.period))


def _local_sgd_reason(cfg) -> Optional[str]:
  if cfg.local_sgd.averaging == "gossip":
    return "config.local_sgd.averaging='gossip' exchanges models by " + GOSSIP_REASON
  return None


@register("local_sgd", no_compression=_local_sgd_reason)
def local_sgd(b: Builder) -> Recipe:
  """Local SGD / LUPA-SGD (Haddadpour et al. 2019): local steps, a model average (or one
  gossip round) at every period end."""
  c, opt = b.cfg.local_sgd, b.optimizer("local")
  comm = b.gossip() if c.averaging == "gossip" else b.allreduce()
  plain = T.gossip_of(comm) if c.averaging == "gossip" else T.mean_of(comm, "alive")
  reducer = plain if c.averaging == "gossip" else b.model_reducer(comm)
  sync = T.average_models(reducer, c.opt_state, local_init=opt.init, opt_reducer=plain)
  from nbsgd_jax import local_sgd as local_sgd_lib
  return Recipe(T.periodic(opt, sync), decentralized=True, primary=comm,
                planner=lambda offset: local_sgd_lib.make_planner(b.cfg, offset))


def _outer(cfg) -> optax.GradientTransformation:
  d = cfg.diloco
  return optax.sgd(d.outer_lr, momentum=d.outer_momentum or None,
                   nesterov=bool(d.outer_momentum) and d.outer_nesterov)


@register("diloco")
def diloco(b: Builder) -> Recipe:
  """DiLoCo (Douillard et al. 2023): H inner steps, then an outer optimizer step on the
  averaged pseudo-gradient."""
  comm = b.allreduce()
  sync = T.outer_step(b.delta_reducer(comm), _outer(b.cfg))
  return Recipe(T.periodic(b.optimizer("local"), sync), decentralized=True, primary=comm,
                planner=b.fixed_periods(b.cfg.diloco.inner_steps))


@register("streaming_diloco")
def streaming_diloco(b: Builder) -> Recipe:
  """Streaming DiLoCo (Douillard et al. 2025): DiLoCo whose P fragments synchronise in turn,
  one every H / P steps (``diloco.*`` as DiLoCo, ``streaming_diloco.fragments`` = P), each
  all-reduce overlapping ``streaming_diloco.delay`` = tau inner steps, merged with mixing
  factor ``streaming_diloco.alpha``."""
  from nbsgd_jax.local_sgd import FragmentPlanner
  h, c = b.cfg.diloco.inner_steps, b.cfg.streaming_diloco
  comm = b.allreduce()
  sync = T.streaming_outer_step(b.delta_reducer(comm), _outer(b.cfg), c.fragments, c.delay,
                                c.alpha)
  return Recipe(T.periodic(b.optimizer("local"), sync), decentralized=True, primary=comm,
                planner=lambda offset: FragmentPlanner(h, c.fragments, c.delay))


# ----------------------------------------------------------------------------- assembly


def _reason(entry: Entry, cfg) -> Optional[str]:
  r = entry.no_compression
  return r(cfg) if callable(r) else r


def gossip_recipes() -> list[str]:
  """Names of the recipes that gossip every step (consensus control applies)."""
  return [n for n, e in REGISTRY.items() if e.gossips]


def combination_errors(cfg: ml_collections.ConfigDict) -> list[str]:
  """The config's combinations that are mathematically undefined, one line each, with the
  reason (:func:`nbsgd_jax.config.validate` calls this)."""
  name = cfg.get("algorithm")
  if name not in REGISTRY:
    return [f"config.algorithm={name!r} is not allowed: use one of {list(REGISTRY)}"]
  errs: list = []
  reason = _reason(REGISTRY[name], cfg)
  from nbsgd_jax.config import COMPRESSIONS  # an unknown name is the config's error
  if cfg.compression.name in COMPRESSIONS and cfg.compression.name != "none" and reason:
    errs.append(f"config.compression.name={cfg.compression.name!r} is not allowed with "
                f"config.algorithm={name!r}: {reason}")
  gossipers = gossip_recipes()
  if cfg.consensus.control is True and name not in gossipers:
    errs.append(f"config.consensus.control=True is not allowed with config.algorithm={name!r}: "
                "consensus control repeats the gossip of a recipe that gossips every step; "
                f"consensus control runs on {', '.join(map(repr, gossipers))}")
  return errs


def build(cfg: ml_collections.ConfigDict, topology=None, plan=None,
          axis_name: Any = AXIS) -> Recipe:
  """The recipe of ``cfg.algorithm`` with the cross-cutting pieces applied (module docstring).

  Raises:
    ValueError: an unknown algorithm or an undefined combination (:func:`combination_errors`),
      or a recipe that declares compression but never asks for a reducer.
  """
  errs = combination_errors(cfg)
  if errs:
    raise ValueError("\n".join(errs))
  b = Builder(cfg, topology, plan, axis_name)
  recipe = REGISTRY[cfg.algorithm].build(b)
  if b.compressed and not b.compression_used:
    raise ValueError(f"recipe {cfg.algorithm!r} accepts compression but asked for no reducer")
  cs = cfg.consensus
  if cs.control:
    if recipe.gossip is None:
      raise ValueError(f"recipe {cfg.algorithm!r} is registered with gossips=True but returned "
                       "no Recipe.gossip for consensus control")
    from nbsgd_jax import consensus
    control = consensus.Control(cs.max_gossip_steps, cs.measure, cs.sketch_size, cfg.seed,
                                gradient_stats=cs.critical)
    from nbsgd_jax.transforms.consensus import consensus_control
    recipe = recipe._replace(transform=consensus_control(
        recipe.transform, recipe.gossip, control, cfg.num_workers, cs.log_every_step))
  elif cs.log_every_step and recipe.decentralized:
    from nbsgd_jax.transforms.consensus import log_consensus_distance
    recipe = recipe._replace(transform=log_consensus_distance(recipe.transform, axis_name))
  return recipe
