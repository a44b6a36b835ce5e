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

Adding an algorithm: a communication or wrapper if a new one is needed, then one
registration, from any file (``docs/design.md``, "Adding an algorithm")::

    @recipes.register("my_sgd")
    def my_sgd(b):
      comm = b.allreduce()
      return recipes.Recipe(chain(b.gradient_reducer(comm), b.optimizer("global")),
                            decentralized=False, primary=comm)

An algorithm's own config sections and rules come with its registration (``sections=``,
``check=``): ``config`` derives its defaults, checks and warnings from this registry.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import ml_collections
import numpy as np
import optax

from nbsgd_jax import checks, codecs, consensus, optim
from nbsgd_jax import transforms as T
from nbsgd_jax.axis import AXIS
from nbsgd_jax.communications import (AllReduce, Communication, CompressedGossip, Gossip,
                                      Matchings, MessageAllGather, SparseAllGather)
from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host import matcha as matcha_lib
from nbsgd_jax.host import periods as local_sgd_lib
from nbsgd_jax.transforms import decentralized as D
from nbsgd_jax.transforms import asynchronous, powersgd  # noqa: F401  (powersgd: its reducer)
from nbsgd_jax.transforms.consensus import consensus_control, log_consensus_distance
from nbsgd_jax.transforms.decentralized import check_d2_mixing


class Recipe(NamedTuple):
  """What a recipe builds.

  Attributes:
    transform: the worker transform of a step (gradient in, parameter change out).
    decentralized: whether workers hold different models (consensus distance > 0).
    gossip: the communication consensus control repeats (None: consensus control refused).
    primary: the step's main communication (Non-blocking SGD's per-neighbourhood deadlines).
    planner: ``loss_offset -> SyncPlanner`` (:mod:`nbsgd_jax.host.periods`) of a recipe that
      synchronises at period ends (``ctx.period_end``); None: every step is a period end.
    host_parts: ``() -> HostPart`` factories, its own host parts (the open context's).
    clock: ``(cluster, communications, params) -> HostPart``, the run's clock instead of the
      lockstep one (the asynchronous recipes' event clock); None: lockstep.
    evaluated: ``(opt_state, params) -> params`` ``[n, ...]``, the models an evaluation reads
      (asynchronous DiLoCo's server replicas; Xi is still the workers'); None: the workers'.
  """

  transform: T.WorkerTransform
  decentralized: bool
  gossip: Optional[Communication] = None
  primary: Optional[Communication] = None
  planner: Optional[Callable[[float], Any]] = None
  host_parts: tuple = ()
  clock: Optional[Callable] = None
  evaluated: Optional[Callable] = None

  @property
  def periodic(self) -> bool:
    """Whether the host plans communication periods (:attr:`planner`)."""
    return self.planner is not None


Reason = Union[None, str, Callable[[ml_collections.ConfigDict], Optional[str]]]


class Section(NamedTuple):
  """A config section an algorithm owns (``config.<name>.*``): its keys have an effect only
  while an algorithm registered with it runs.

  Attributes:
    defaults: ``() -> ConfigDict``, the section's keys with their defaults; the comment beside
      each key is its documentation (``docs/config.md``).
    check: ``(cfg, errs) -> None``, appends one line per bad value of the section's keys
      (run whatever the algorithm: a bad value is an error wherever it is).
    doc: one line on what the section is (the heading of ``docs/config.md``).
    hparams: the section's keys whose values the compiled step reads from its hyperparameter
      input (:meth:`Builder.injected`), not as constants: a run that differs only in them
      reuses the compiled program (``docs/design.md``, "Runs as data").
    structure: ``cfg -> dict``, what of the ``hparams`` keys' values is structure (e.g.
      whether momentum is on), or None.
    host: the section's keys the device never reads (the host's alone): they do not key the
      compiled program either.
  """

  defaults: Callable[[], ml_collections.ConfigDict]
  check: Callable[[ml_collections.ConfigDict, list], None]
  doc: str = ""
  hparams: tuple = ()
  structure: Optional[Callable[[ml_collections.ConfigDict], dict]] = None
  host: tuple = ()


class Entry(NamedTuple):
  """A registered algorithm (:func:`register`)."""

  build: Callable[["Builder"], Recipe]
  gossips: bool = False
  no_compression: Reason = None
  sections: tuple[str, ...] = ()
  check: Optional[Callable[[ml_collections.ConfigDict, list], None]] = None
  ignores: tuple[str, ...] = ()


REGISTRY: dict[str, Entry] = {}
SECTIONS: dict[str, Section] = {}  # the algorithms' config sections, by name
GOSSIP_REASON = ("gossip exchanges models, not gradients; compressed gossip needs CHOCO-SGD's "
                 "public copies x_hat")


def register(name: str, gossips: bool = False, no_compression: Reason = None,
             sections: Optional[dict[str, Section]] = None,
             check: Optional[Callable[[ml_collections.ConfigDict, list], None]] = None,
             ignores: tuple[str, ...] = ()) -> Callable:
  """Decorator: register ``build`` (``Builder -> Recipe``) as ``config.algorithm=name``.

  Args:
    name: the algorithm's name in ``config.algorithm``.
    gossips: the recipe gossips every step and returns its ``Recipe.gossip`` (consensus
      control applies).
    no_compression: the mathematical reason compression does not apply (a string, or
      ``cfg -> str | None``); None: it does.
    sections: ``{section name: Section}``, the config sections only this algorithm (and the
      others registered with the same section) reads: ``default_config()`` holds them,
      ``validate`` runs their checks, and their keys changed while another algorithm runs
      are named as having no effect.
    check: ``(cfg, errs) -> None``, the rules that hold only while this algorithm runs
      (e.g. a period no longer than the run); ``validate`` calls it when
      ``config.algorithm == name``.
    ignores: dotted keys of the shared sections it never reads while they are on (CHOCO-SGD's
      codec keeps no residual: ``compression.error_feedback``): named as having no effect.

  Raises:
    ValueError: ``name`` registered with another ``build``, or a section name registered
      with another :class:`Section`.
  """

  def wrap(build):
    if name in REGISTRY and REGISTRY[name].build is not build:
      raise ValueError(f"recipe {name!r} is already registered")
    for section, spec in (sections or {}).items():
      if section in SECTIONS and SECTIONS[section] != spec:
        raise ValueError(f"config section {section!r} is already registered")
    SECTIONS.update(sections or {})
    REGISTRY[name] = Entry(build, gossips, no_compression, tuple(sections or ()), check, ignores)
    return build

  return wrap


def section_owners(section: str) -> list[str]:
  """The algorithms registered with config section ``section``."""
  return [n for n, e in REGISTRY.items() if section in e.sections]


class Builder:
  """The pieces of a recipe, built from the config on request.

  Args:
    cfg: the run's config.
    topology: the :class:`~nbsgd_jax.topology.Topology`.
    axis_name: the worker axis of the backend.
  """

  def __init__(self, cfg: ml_collections.ConfigDict, topology=None, axis_name: Any = AXIS):
    self.cfg, self.topology, self.axis_name = cfg, topology, axis_name
    self.n = cfg.num_workers
    # mini-batches may be missing (Non-blocking SGD, failures): count-weighted means, skips
    self.weighted = cluster_lib.counted_steps(cfg)
    self.compressed = cfg.compression.name != codecs.NONE
    self.compression_used = False

  # ------------------------------------------------------------------ optimizers

  def optimizer(self, skip: Optional[str] = None) -> T.WorkerTransform:
    """The local optimizer (weight decay, SGD with momentum), its numbers read from the
    step's hparams (:func:`nbsgd_jax.optim.hparams`); ``skip`` = ``"local"`` / ``"global"``
    adds the no-step rule of :func:`~nbsgd_jax.transforms.skip_when_idle` when mini-batches
    may be missing."""
    opt = T.injected(lambda hp: T.from_optax(optim.make_optimizer(self.cfg, hp)),
                     optim.hparams(self.cfg))
    return T.skip_when_idle(opt, skip) if skip and self.weighted else opt

  def injected(self, factory: Callable, *keys: str) -> T.WorkerTransform:
    """``factory(*values)`` (a transform) built at each step from the step's hparams of the
    config keys ``keys`` (each declared in its section's ``hparams``, or ``"seed"``):
    :func:`~nbsgd_jax.transforms.injected`.

    Raises:
      ValueError: a key not declared as a hyperparameter (it would key the program).
    """
    for key in keys:
      section, _, name = key.rpartition(".")
      spec = SECTIONS.get(section)
      if key != "seed" and (spec is None or name not in spec.hparams):
        raise ValueError(f"config.{key} is not declared as a hyperparameter: add it to the "
                         f"hparams of config section {section!r}")
    return T.injected(lambda v: factory(*(v[k] for k in keys)),
                      {k: checks.as_input(self.cfg, k) for k in keys})

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
    """MATCHA's matchings of the topology's graph (:func:`nbsgd_jax.host.matcha.plan`: the
    decomposition, probabilities and alpha, solved with cvxpy)."""
    plan = matcha_lib.plan(self.n, self.topology.edges, self.cfg.matcha.budget)
    return Matchings(plan, self.n, self.cfg.matcha.seed, self.axis_name)

  def fixed_periods(self, tau: int) -> Callable[[float], Any]:
    """A :attr:`Recipe.planner` of periods of ``tau`` steps."""
    return lambda offset: local_sgd_lib.SyncPlanner("fixed", tau)

  # ------------------------------------------------------------------ reducers

  def codec(self):
    """The :class:`~nbsgd_jax.codecs.Codec` of ``config.compression`` (marks compression as
    used by the recipe)."""
    self.compression_used = True
    return codecs.from_config(self.cfg.compression)

  def _compressed(self, by: str) -> T.WorkerTransform:
    c = self.cfg.compression
    if codecs.REGISTRY[c.name].reducer:  # a reducer of its own (PowerSGD), not a codec
      self.compression_used = True
      comm = AllReduce(self.n, self.axis_name, c.name, self.weighted)
      return codecs.from_config(c)(comm, seed=self.cfg.seed, use_residual=c.error_feedback,
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


# ----------------------------------------------------------- config sections (defaults, checks)


def check_diloco_config(cfg, errs: list) -> None:
  """diloco.*: inner steps and the outer optimizer."""
  checks.integer(cfg, errs, "diloco.inner_steps", 1, note="H")
  checks.number(cfg, errs, "diloco.outer_lr", 0, lo_open=True)
  checks.number(cfg, errs, "diloco.outer_momentum", 0, hi=1, hi_open=True)
  checks.boolean(cfg, errs, "diloco.outer_nesterov")


def dpsgd_defaults() -> ml_collections.ConfigDict:
  """``config.dpsgd.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.order = "atc"                # atc: local step, then gossip (the reference codes: MATCHA's
                                 # train_mpi.py, Koloskova et al. 2020) | parallel (Lian et
                                 # al. Eq. 2: gossip x while computing g(x), overlapped)
  return s


def check_dpsgd_config(cfg, errs: list) -> None:
  """dpsgd.order."""
  checks.choice(cfg, errs, "dpsgd.order", T.wrappers.ORDERS)


def _check_diloco_period(cfg, errs: list) -> None:
  """DiLoCo's first round ends within the run."""
  checks.period_within_run(cfg, errs, "diloco.inner_steps", True)


def check_streaming_diloco_config(cfg, errs: list) -> None:
  """streaming_diloco.*: fragments P >= 1, overlap tau >= 0, mixing factor alpha in [0, 1]."""
  checks.number(cfg, errs, "streaming_diloco.alpha", 0, hi=1)
  checks.integer(cfg, errs, "streaming_diloco.delay", 0, note="tau")
  checks.integer(cfg, errs, "streaming_diloco.fragments", 1, note="P")


def _check_streaming(cfg, errs: list) -> None:
  """Streaming DiLoCo's first round within the run, P dividing H = diloco.inner_steps and
  0 <= tau < H / P (a fragment's all-reduce lands before the next one starts)."""
  _check_diloco_period(cfg, errs)
  sd, h = cfg.streaming_diloco, cfg.diloco.get("inner_steps")
  p, tau = sd.get("fragments"), sd.get("delay")
  if not (checks.is_int(p) and p >= 1 and checks.is_int(h) and h >= 1):
    return
  if h % p:
    errs.append(f"config.streaming_diloco.fragments={p} is not allowed with "
                f"config.diloco.inner_steps={h}: it must divide H")
  elif checks.is_int(tau) and tau >= h // p:
    errs.append(f"config.streaming_diloco.delay={tau} is not allowed with H / P = {h // p}: "
                f"a fragment's all-reduce must land before the next one starts "
                f"(0 <= tau < {h // p})")


def check_choco_config(cfg, errs: list) -> None:
  """choco.gamma in (0, 1]; choco.order."""
  checks.number(cfg, errs, "choco.gamma", 0, lo_open=True, hi=1)
  checks.choice(cfg, errs, "choco.order", D.CHOCO_ORDERS)


def check_d2_config(cfg, errs: list) -> None:
  """d2.mixing."""
  checks.choice(cfg, errs, "d2.mixing", D.D2_MIXINGS)


def check_gossip_pga_config(cfg, errs: list) -> None:
  """gossip_pga.period >= 1."""
  checks.integer(cfg, errs, "gossip_pga.period", 1, note="H")


def choco_defaults() -> ml_collections.ConfigDict:
  """``config.choco.*`` with their defaults: CHOCO-SGD (Koloskova et al. 2019)."""
  s = ml_collections.ConfigDict()
  s.gamma = 0.5                  # consensus step size, in (0, 1]; tune it with the codec
  s.order = "paper"              # paper: Algorithm 2 (compress, then consensus) | released:
                                 # epfml/ChocoSGD's codes (consensus on the last copies, then
                                 # compress the new model's difference)
                                 # (smaller for stronger compression)
  return s


def d2_defaults() -> ml_collections.ConfigDict:
  """``config.d2.*`` with their defaults: D^2 (Tang et al. 2018) / Exact Diffusion."""
  s = ml_collections.ConfigDict()
  s.mixing = "lazy"              # lazy: (I + W) / 2 (Exact Diffusion) | w: W itself (needs
                                 # lambda_min(W) > -1/3)
  return s


def gossip_pga_defaults() -> ml_collections.ConfigDict:
  """``config.gossip_pga.*`` with their defaults: Gossip-PGA (Chen et al. 2021)."""
  s = ml_collections.ConfigDict()
  s.period = 8                   # H: a global average instead of the gossip every H steps
  return s


def diloco_defaults() -> ml_collections.ConfigDict:
  """``config.diloco.*`` with their defaults: DiLoCo (Douillard et al. 2023)."""
  s = ml_collections.ConfigDict()
  s.inner_steps = 50             # H: inner steps per round
  s.outer_lr = 0.7               # outer SGD learning rate
  s.outer_momentum = 0.9         # outer momentum (0: plain SGD)
  s.outer_nesterov = True        # Nesterov outer momentum
  return s


def streaming_diloco_defaults() -> ml_collections.ConfigDict:
  """``config.streaming_diloco.*`` with their defaults: Streaming DiLoCo (Douillard et al. 2025)."""
  s = ml_collections.ConfigDict()
  s.fragments = 2                # P: contiguous groups of parameter arrays, one synchronised
                                    # every diloco.inner_steps / P steps (P must divide H)
  s.delay = 0                    # tau: inner steps a fragment's all-reduce overlaps (0: none;
                                 # 0 <= tau < H / P)
  s.alpha = 0.0                  # mixing factor at landing: x <- alpha x + (1 - alpha) global
  return s


DILOCO = Section(diloco_defaults, check_diloco_config, "DiLoCo (Douillard et al. 2023)",
                 hparams=("outer_lr", "outer_momentum"),
                 structure=lambda cfg: {"outer_momentum_on": bool(cfg.diloco.outer_momentum)})
STREAMING_DILOCO = Section(streaming_diloco_defaults, check_streaming_diloco_config,
                           "Streaming DiLoCo (Douillard et al. 2025)")
CHOCO = Section(choco_defaults, check_choco_config, "CHOCO-SGD (Koloskova et al. 2019)",
                hparams=("gamma",))
D2 = Section(d2_defaults, check_d2_config, "D^2 (Tang et al. 2018) / Exact Diffusion")
GOSSIP_PGA = Section(gossip_pga_defaults, check_gossip_pga_config, "Gossip-PGA (Chen et al. 2021)")
LOCAL_SGD = Section(local_sgd_lib.local_sgd_defaults, local_sgd_lib.check_config,
                    "LUPA-SGD (Haddadpour et al. 2019)")
MATCHA = Section(matcha_lib.matcha_defaults, matcha_lib.check_config, "MATCHA (Wang et al. 2019)")


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


@register("matcha", gossips=True, no_compression=GOSSIP_REASON, sections={"matcha": MATCHA},
          check=matcha_lib.check_static_graph)
def matcha(b: Builder) -> Recipe:
  """MATCHA (Wang et al. 2019): gossip over randomly activated matchings; consensus control
  gossips over the static base graph."""
  m = b.matchings()
  return Recipe(T.gossip_step(b.optimizer("local"), m, b.cfg.dpsgd.order), decentralized=True,
                gossip=b.gossip(), primary=m)


def _choco_reason(cfg) -> Optional[str]:
  spec = codecs.REGISTRY.get(cfg.compression.name)
  if spec is not None and spec.reducer:
    return (f"CHOCO-SGD compresses each worker's x - x_hat with a codec; "
            f"{cfg.compression.name!r} is a reducer of its own (PowerSGD's message is built by "
            "two all-reduces over all workers), which gossip does not have")
  return None


@register("choco_sgd", gossips=True, no_compression=_choco_reason, sections={"choco": CHOCO},
          ignores=("compression.error_feedback",))
def choco_sgd(b: Builder) -> Recipe:
  """CHOCO-SGD (Koloskova et al. 2019, Algorithm 2): gossip of compressed model differences
  with public copies; consensus control repeats a plain gossip round."""
  c = b.cfg
  g, opt, codec = b.gossip("choco", kind=CompressedGossip), b.optimizer("local"), b.codec()
  t = b.injected(lambda gamma: D.choco_sgd(opt, g, codec, gamma, c.compression.flatten, c.seed,
                                           c.choco.order), "choco.gamma")
  return Recipe(t, decentralized=True, gossip=b.gossip(), primary=g)


@register("gradient_tracking", gossips=True, no_compression=GOSSIP_REASON)
def gradient_tracking(b: Builder) -> Recipe:
  """Gradient tracking, DIGing (Nedic et al. 2017): the optimizer follows the tracked mean
  gradient ``y``; two gossip rounds a step (``y`` and the model)."""
  g = b.gossip()
  t = T.chain(D.gradient_tracking(b.gossip("tracking")),
              T.gossip_step(b.optimizer("local"), g, b.cfg.dpsgd.order))
  return Recipe(t, decentralized=True, gossip=g, primary=g)


@register("d2", gossips=True, no_compression=GOSSIP_REASON, sections={"d2": D2})
def d2(b: Builder) -> Recipe:
  """D^2 (Tang et al. 2018) over W, or Exact Diffusion over (I + W) / 2 (``d2.mixing``)."""
  g = b.gossip(lazy=b.cfg.d2.mixing == "lazy")
  check_d2_mixing(g.phases, b.cfg.d2.mixing)
  return Recipe(D.d2(b.optimizer("local"), g), decentralized=True, gossip=g, primary=g)


@register("gossip_pga", gossips=True, no_compression=GOSSIP_REASON,
          sections={"gossip_pga": GOSSIP_PGA})
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


@register("local_sgd", no_compression=_local_sgd_reason, sections={"local_sgd": LOCAL_SGD},
          check=local_sgd_lib.check_period)
def local_sgd(b: Builder) -> Recipe:
  """Local SGD / LUPA-SGD (Haddadpour et al. 2019): local steps, a model average (or one
  gossip round) at every period end."""
  c, opt = b.cfg.local_sgd, b.optimizer("local")
  comm = b.gossip() if c.averaging == "gossip" else b.allreduce()
  plain = T.gossip_of(comm) if c.averaging == "gossip" else T.mean_of(comm, "alive")
  reducer = plain if c.averaging == "gossip" else b.model_reducer(comm)
  sync = T.average_models(reducer, c.opt_state, local_init=opt.init, opt_reducer=plain)
  return Recipe(T.periodic(opt, sync), decentralized=True, primary=comm,
                planner=lambda offset: local_sgd_lib.make_planner(b.cfg, offset))


def _outer(cfg, lr, momentum) -> optax.GradientTransformation:
  """DiLoCo's outer optimizer: SGD with (Nesterov) momentum; ``lr`` and ``momentum`` the
  step's hparams ``diloco.outer_lr``, ``diloco.outer_momentum`` (on when > 0: structure)."""
  on = bool(cfg.diloco.outer_momentum)
  return optax.sgd(lr, momentum=momentum if on else None, nesterov=on and cfg.diloco.outer_nesterov)


@register("diloco", sections={"diloco": DILOCO}, check=_check_diloco_period)
def diloco(b: Builder) -> Recipe:
  """DiLoCo (Douillard et al. 2023): H inner steps, then an outer optimizer step on the
  averaged pseudo-gradient; an evaluation reads the outer model (``docs/algorithms.md``)."""
  comm = b.allreduce()
  reducer, opt = b.delta_reducer(comm), b.optimizer("local")
  t = b.injected(lambda lr, m: T.periodic(opt, T.outer_step(reducer, _outer(b.cfg, lr, m))),
                 "diloco.outer_lr", "diloco.outer_momentum")
  return Recipe(t, decentralized=True, primary=comm, evaluated=asynchronous.outer_models,
                planner=b.fixed_periods(b.cfg.diloco.inner_steps))


@register("streaming_diloco", sections={"diloco": DILOCO, "streaming_diloco": STREAMING_DILOCO},
          check=_check_streaming)
def streaming_diloco(b: Builder) -> Recipe:
  """Streaming DiLoCo (Douillard et al. 2025): DiLoCo whose P fragments synchronise in turn,
  one every H / P steps (``diloco.*`` as DiLoCo, ``streaming_diloco.fragments`` = P), each
  all-reduce overlapping ``streaming_diloco.delay`` = tau inner steps, merged with mixing
  factor ``streaming_diloco.alpha``."""
  h, c = b.cfg.diloco.inner_steps, b.cfg.streaming_diloco
  comm = b.allreduce()
  reducer, opt = b.delta_reducer(comm), b.optimizer("local")
  t = b.injected(lambda lr, m: T.periodic(opt, T.streaming_outer_step(
      reducer, _outer(b.cfg, lr, m), c.fragments, c.delay, c.alpha)),
                 "diloco.outer_lr", "diloco.outer_momentum")
  return Recipe(t, decentralized=True, primary=comm,
                planner=lambda offset: local_sgd_lib.FragmentPlanner(h, c.fragments, c.delay))


# ----------------------------------------------------------------------------- assembly


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
  if REGISTRY[name].check is not None:  # the rules of this algorithm
    REGISTRY[name].check(cfg, errs)
  reason = REGISTRY[name].no_compression
  reason = reason(cfg) if callable(reason) else reason
  # an unknown name is the config's error
  if cfg.compression.name in codecs.REGISTRY and cfg.compression.name != codecs.NONE and reason:
    errs.append(f"config.compression.name={cfg.compression.name!r} is not allowed with "
                f"config.algorithm={name!r}: {reason}")
  gossipers = gossip_recipes()
  if cfg.consensus.control is True and name not in gossipers:
    errs.append(f"config.consensus.control=True is not allowed with config.algorithm={name!r}: "
                "consensus control repeats the gossip of a recipe that gossips every step; "
                f"consensus control runs on {', '.join(map(repr, gossipers))}")
  return errs


def build(cfg: ml_collections.ConfigDict, topology=None, axis_name: Any = AXIS) -> Recipe:
  """The recipe of ``cfg.algorithm`` with the cross-cutting pieces applied (module docstring).

  Raises:
    ValueError: an unknown algorithm or an undefined combination (:func:`combination_errors`),
      or a recipe that declares compression but never asks for a reducer.
  """
  errs = combination_errors(cfg)
  if errs:
    raise ValueError("\n".join(errs))
  b = Builder(cfg, topology, axis_name)
  recipe = REGISTRY[cfg.algorithm].build(b)
  if b.compressed and not b.compression_used:
    raise ValueError(f"recipe {cfg.algorithm!r} accepts compression but asked for no reducer")
  cs = cfg.consensus
  if cs.control:
    if recipe.gossip is None:
      raise ValueError(f"recipe {cfg.algorithm!r} is registered with gossips=True but returned "
                       "no Recipe.gossip for consensus control")
    inner = recipe.transform
    control = lambda seed: consensus.Control(cs.max_gossip_steps, cs.measure, cs.sketch_size,
                                             seed, gradient_stats=cs.critical)
    recipe = recipe._replace(transform=b.injected(lambda seed: consensus_control(
        inner, recipe.gossip, control(seed), cfg.num_workers, cs.log_every_step), "seed"))
  elif cs.log_every_step and recipe.decentralized:
    recipe = recipe._replace(transform=log_consensus_distance(recipe.transform, axis_name))
  return recipe
