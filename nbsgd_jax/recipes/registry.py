"""The algorithm registry: what a recipe returns (:class:`Recipe`), an algorithm's own config
section (:class:`Section`), :func:`register`, and the rules between an algorithm and the
shared sections (:func:`combination_errors`: compression, consensus control)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple, Optional, Union

import ml_collections

from nbsgd_jax import codecs
from nbsgd_jax import transforms as T
from nbsgd_jax.communications import Communication
from nbsgd_jax.host import failures as failures_lib


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
  clock: str = "lockstep"
  face: Optional[str] = None
  no_face: Optional[str] = None


CLOCKS = ("lockstep", "event")  # register(clock=...): the kind of time the recipe runs on
REGISTRY: dict[str, Entry] = {}
SECTIONS: dict[str, Section] = {}  # the algorithms' config sections, by name
GOSSIP_REASON = ("gossip exchanges models, not gradients; compressed gossip needs CHOCO-SGD's "
                 "public copies x_hat")


@contextlib.contextmanager
def registrations():
  """A block whose registrations are undone on exit: the algorithms, their config sections
  and the codecs registered inside it (a module from outside the package, imported by a
  test or a tool) are removed, the registries left as they were before (``docs/config.md``
  is generated from them)."""
  tables = (REGISTRY, SECTIONS, codecs.REGISTRY)
  before = [dict(t) for t in tables]
  try:
    yield
  finally:
    for table, kept in zip(tables, before):
      table.clear()
      table.update(kept)


def register(name: str, gossips: bool = False, no_compression: Reason = None,
             sections: Optional[dict[str, Section]] = None,
             check: Optional[Callable[[ml_collections.ConfigDict, list], None]] = None,
             ignores: tuple[str, ...] = (), clock: str = "lockstep",
             face: Optional[str] = None, no_face: Optional[str] = None) -> Callable:
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
    clock: ``"lockstep"`` (every worker takes each step; the cluster model's clock, with
      Non-blocking SGD, failures and the wall clock) or ``"event"`` (the asynchronous family:
      the recipe returns ``Recipe.clock``, one device step applies a batch of events, and
      :func:`event_clock_errors` holds: ``docs/design.md``, "The event clock").
    face: the name of the :mod:`nbsgd_jax.tx` constructor that adapts the same composition
      (:mod:`nbsgd_jax.transforms.algorithms`) for a user's own optax loop, or None.
    no_face: why the algorithm has no optax constructor (one line), when ``face`` is None.

  Raises:
    ValueError: ``name`` registered with another ``build``, a section name registered
      with another :class:`Section`, a ``clock`` not in :data:`CLOCKS`, or both ``face`` and
      ``no_face``.
  """
  if clock not in CLOCKS:
    raise ValueError(f"register({name!r}, clock={clock!r}): use one of {list(CLOCKS)}")
  if face is not None and no_face is not None:
    raise ValueError(f"register({name!r}): give face={face!r} or a no_face reason, not both")

  def wrap(build):
    if name in REGISTRY and REGISTRY[name].build is not build:
      raise ValueError(f"recipe {name!r} is already registered")
    for section, spec in (sections or {}).items():
      if section in SECTIONS and SECTIONS[section] != spec:
        raise ValueError(f"config section {section!r} is already registered")
    SECTIONS.update(sections or {})
    REGISTRY[name] = Entry(build, gossips, no_compression, tuple(sections or ()), check, ignores,
                           clock, face, no_face)
    return build

  return wrap


def is_asynchronous(algorithm: str) -> bool:
  """Whether ``config.algorithm=algorithm`` runs on the event clock (registered with
  ``clock="event"``); False for a name not registered."""
  entry = REGISTRY.get(algorithm)
  return entry is not None and entry.clock == "event"


def event_clock_errors(cfg: ml_collections.ConfigDict) -> list[str]:
  """The rules of every recipe on the event clock, one line each: no Non-blocking SGD
  deadline (a worker waits for nobody), no collective to rebuild and no wall clock (the event
  clock is the run's time); failures under both policies (:mod:`nbsgd_jax.host.outages`)."""
  algo, errs = f"config.algorithm={cfg.algorithm!r}", []
  if cfg.nonblocking.get("enabled"):
    errs.append(f"config.nonblocking.enabled=True is not allowed with {algo}: an asynchronous "
                "worker waits for nobody, so there is no deadline")
  if cfg.cluster.get("rebuild_collectives"):
    errs.append(f"config.cluster.rebuild_collectives=True is not allowed with {algo}: the "
                "event clock's algorithms run no all-reduce to rebuild")
  if cfg.cluster.get("clock") != "simulated":
    errs.append(f"config.cluster.clock={cfg.cluster.clock!r} is not allowed with {algo}: the "
                "event clock is simulated")
  return errs


def section_owners(section: str) -> list[str]:
  """The algorithms registered with config section ``section``."""
  return [n for n, e in REGISTRY.items() if section in e.sections]


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
  errs = event_clock_errors(cfg) if REGISTRY[name].clock == "event" else []
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
