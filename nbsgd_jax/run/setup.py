"""Everything a run needs, built from a config before any compilation: data, model, topology,
recipe, backend, the initial state and the host parts. The data and the model are read and
checked by :mod:`nbsgd_jax.run.loading`; the compiled program is :mod:`nbsgd_jax.run.step`'s;
the loop is :mod:`nbsgd_jax.run.loop`'s.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host import cluster_config
from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host import faults as faults_lib
from nbsgd_jax.host import ledger as ledger_lib
from nbsgd_jax.host import outages as outages_lib
from nbsgd_jax.host import workload as workload_lib
from nbsgd_jax import codecs
from nbsgd_jax import config as config_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax.models import forms as forms_lib
from nbsgd_jax.run import hparams as hparams_lib
from nbsgd_jax.run.loading import (_check_given, _check_model, _load, _model,  # noqa: F401
                                   _partition, _problem, _read)
from nbsgd_jax import host as host_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax.core import multihost
from nbsgd_jax.recipes import optim
from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.core.axis import AXIS, tree_bytes
from nbsgd_jax.run import task as task_lib
from nbsgd_jax.run import wallclock
from nbsgd_jax.core.backends import Backend, make_backend
from nbsgd_jax.run import step as step_lib
from nbsgd_jax.run.step import TrainState

DEFAULT_COMPILATION_CACHE = os.path.join("~", ".cache", "nbsgd_jax", "jax")


# ----------------------------------------------------------------------------- set-up


class Setup(NamedTuple):
  """Everything a run needs, built from a config before any compilation."""

  cfg: ml_collections.ConfigDict
  dataset: Any  # data_lib.Dataset, or the SyntheticProblem of a synthetic task
  worker_data: Any
  model: Any  # the flax model, or None for a synthetic task
  topology: topology_lib.Topology
  recipe: recipes_lib.Recipe
  backend: Backend
  task: task_lib.Task
  hparams: Any = None  # the run's hyperparameters (nbsgd_jax.run.hparams.values), on the devices
  structure: str = ""  # its structure key (nbsgd_jax.run.hparams.structure_key): "" shares nothing


def _config_error(prefix: str):
  def raise_(e):
    raise config_lib.ConfigError([f"{prefix}{e}"]) from None
  return raise_


def setup(cfg: ml_collections.ConfigDict, model: Any = None, data: Any = None) -> Setup:
  """Validate the config, load and partition the data, build model, recipe, backend and task.

  Args:
    cfg: the run's config (``config.imports`` are imported first: they may register models and
      data sets).
    model: a flax module of your own (``config.model`` must be ``"module"``), or None.
    data: an :class:`~nbsgd_jax.data.ArrayDataset` / :class:`~nbsgd_jax.data.TokenDataset` of
      your own (``config.dataset`` must be ``"arrays"``), or None.

  Raises:
    ConfigError: any bad key, including a ``batch_size`` larger than some worker's shard, a
      given model or data that does not fit (named), a ``config.init_from`` without a
      readable checkpoint or whose models do not fit this model (the first leaf that differs).
  """
  s = _build(cfg, model, data)
  return _init_from(s) if cfg.init_from else s


def _build(cfg: ml_collections.ConfigDict, model: Any, data: Any) -> Setup:
  if cfg.get("backend") == "multihost":  # before anything initializes a JAX backend
    try:
      multihost.initialize()
    except ValueError as e:
      raise config_lib.ConfigError([f"backend='multihost': {e}"]) from None
  config_lib.import_modules(cfg)
  config_lib.validate(cfg)
  _check_given(cfg, model, data)
  n = cfg.num_workers
  try:
    topo = topology_lib.make(cfg.topology, n, weights=cfg.mixing_weights, p=cfg.topology_p,
                             seed=cfg.topology_seed, rows=cfg.topology_rows or None,
                             cols=cfg.topology_cols or None)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.topology={cfg.topology!r}: {e}"]) from None
  try:
    backend = make_backend(cfg.backend, n, cfg.workers_per_device)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.{e}"]) from None
  forms = forms_lib.resolve(cfg, jax.default_backend(), forms_lib.device_workers(backend))
  try:
    recipe = recipes_lib.build(cfg, topo, backend.axis_name)
  except ValueError as e:
    raise config_lib.ConfigError(str(e).splitlines()) from None
  use_compilation_cache(cfg.compilation_cache)
  given = (model, data, models_lib.REGISTRY.get(cfg.model), data_lib.REGISTRY.get(cfg.dataset))
  key = hparams_lib.structure_key(cfg, *given)
  step_lib.PROGRAMS.get(key, "given", lambda: given)  # alive while their programs are: ids
  # numpy to the device by device_put: jnp.asarray would compile a program per array
  facts = dict(hparams=backend.replicate(hparams_lib.values(cfg)), structure=key)
  memo = lambda name, make: step_lib.PROGRAMS.get(key, name, make)
  if cfg.dataset in config_lib.SYNTHETIC:
    problem = _problem(cfg)
    task = task_lib.synthetic_task(cfg, problem, backend)
    return Setup(cfg, problem, task.worker_data, None, topo, recipe, backend, task, **facts)
  dataset = _load(cfg, data)
  if isinstance(dataset, data_lib.TextDataset):
    return _language_model_setup(cfg, dataset, model, topo, recipe, backend, memo)._replace(
        **facts)
  shards = _partition(cfg, dataset)
  model = _model(cfg, model, dataset.num_classes, forms)
  if cfg.model not in models_lib.MODELS:  # the user's: checked before anything runs
    _check_model(model, cfg, dataset.train_images[:1], dataset.num_classes)
  if backend.name == "multihost":
    worker_data = task_lib.process_local_data(dataset, shards, backend)
  else:
    images, labels, sizes = data_lib.stack_shards(dataset.train_images, dataset.train_labels,
                                                  shards)
    worker_data = task_lib.WorkerData(*jax.device_put(backend.place((images, labels, sizes))))
  task = task_lib.classification_task(cfg, dataset, worker_data, model, backend,
                                      recipe.decentralized, memo)
  return Setup(cfg, dataset, worker_data, model, topo, recipe, backend, task, **facts)


def _init_from(s: Setup) -> Setup:
  """``s`` whose task starts from ``config.init_from``'s averaged model
  (:func:`nbsgd_jax.core.checkpoint.read_models`), checked leaf by leaf against the model's own
  initialisation (tree, shapes, dtypes)."""
  from nbsgd_jax.core import checkpoint  # orbax: only when a run starts from a checkpoint
  field = f"config.init_from={s.cfg.init_from!r}"
  try:
    step, params, model_state = checkpoint.read_models(
        s.cfg.init_from, lambda line: print(f"warning: {field}: {line}", flush=True))
  except (FileNotFoundError, checkpoint.Unreadable) as e:
    raise config_lib.ConfigError([f"{field}: {e}"]) from None
  want = jax.eval_shape(s.task.init)
  # a stateless model's empty model state may come back as another empty container
  loaded = (params, model_state if jax.tree.leaves(want[1]) else jax.tree.map(jnp.zeros_like,
                                                                              want[1]))
  have = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), loaded)
  if jax.tree.structure(want) != jax.tree.structure(have):
    raise config_lib.ConfigError([f"{field}: its step-{step} checkpoint's parameters are not "
                                  "this model's (another model, sizes or layer names)"])
  for (path, w), h in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(have)):
    if (w.shape, w.dtype) != (h.shape, h.dtype):
      raise config_lib.ConfigError([
          f"{field}: {('params', 'model_state')[path[0].idx]}{jax.tree_util.keystr(path[1:])} "
          f"is {h.dtype}{list(h.shape)} in its step-{step} "
          f"checkpoint, {w.dtype}{list(w.shape)} in this model"])
  init = lambda seed=None: jax.tree.map(jnp.asarray, loaded)
  return s._replace(task=s.task._replace(init=init))


def use_compilation_cache(directory: str) -> Optional[str]:
  """JAX's persistent compilation cache in ``directory`` (``config.compilation_cache``):
  ``"default"``: ``$NBSGD_JAX_COMPILATION_CACHE`` if set, else
  ``~/.cache/nbsgd_jax/jax``; ``"none"``: off. A program compiled once (its HLO, compile
  options, JAX version and device) is read back by later processes instead of compiled; a
  program whose compilation took under ``jax_persistent_cache_min_compile_time_secs``
  (1 s) is not stored. Returns the directory in use (None: off)."""
  if directory == "default":
    directory = os.environ.get("NBSGD_JAX_COMPILATION_CACHE", DEFAULT_COMPILATION_CACHE)
  path = None if directory in ("none", "") else os.path.abspath(os.path.expanduser(directory))
  if jax.config.jax_compilation_cache_dir != path:
    compilation_cache.reset_cache()  # the directory is read once: start again from it
    jax.config.update("jax_compilation_cache_dir", path)
  return path


def _language_model_setup(cfg, dataset, model, topo, recipe, backend, memo=None) -> Setup:
  """The set-up of a language model on a text data set (the built-in ``"transformer"`` or a
  given / registered token model), cut into one contiguous shard per worker.

  Raises:
    ConfigError: shards shorter than ``lm.context + 1``, a model that does not fit.
  """
  try:
    rows = data_lib.partition_text(dataset.train_tokens, cfg.num_workers, cfg.partition,
                                   min_length=cfg.lm.context + 1)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.partition={cfg.partition!r} with "
                                  f"config.lm.context={cfg.lm.context}: {e}"]) from None
  model = _model(cfg, model, dataset.vocab_size, forms_lib.Forms())
  if cfg.model not in models_lib.MODELS:
    _check_model(model, cfg, np.zeros((1, cfg.lm.context), np.int32), dataset.vocab_size,
                 tokens=True)
  worker_tokens = task_lib.place_rows(np.asarray(rows, np.int32), backend)
  task = task_lib.language_model_task(cfg, dataset, worker_tokens, model, backend,
                                      recipe.decentralized, memo)
  return Setup(cfg, dataset, worker_tokens, model, topo, recipe, backend, task)


def check_model_fit(s: Setup) -> list[str]:
  """The config against the model and the data, abstractly (nothing is computed or
  compiled): the codec's model checks (:attr:`nbsgd_jax.codecs.Spec.check_model`) on one
  worker's parameter shapes, then the transform's state on them (streaming DiLoCo's fragments
  need as many parameter arrays).

  Returns:
    warning lines (odd or wasteful, not wrong): the codec's (PowerSGD at full rank),
    ``eval_train_examples`` / ``eval_test_examples`` above the split's examples.

  Raises:
    ConfigError: one line per value that does not fit the model (named).
  """
  params, _ = jax.eval_shape(s.task.init)
  shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
  errs: list = []
  warns: list = []
  spec = codecs.REGISTRY.get(s.cfg.compression.name)
  if spec is not None and spec.check_model is not None:
    warns += spec.check_model(s.cfg, shapes, errs) or []
  if errs:
    raise config_lib.ConfigError(errs)
  try:
    jax.eval_shape(s.recipe.transform.init, params)
  except ValueError as e:  # a transform that cannot be built on this model says why
    line = str(e).splitlines()[0]
    if "is not allowed" not in line:
      raise
    raise config_lib.ConfigError([line if line.startswith("config.") else f"config.{line}"]
                                 ) from None
  labels = getattr(s.dataset, "train_labels", None)
  if labels is not None and s.cfg.eval_train_examples > len(labels):
    warns.append(f"config.eval_train_examples={s.cfg.eval_train_examples} is more than the "
                 f"{len(labels):,} training examples: train_loss is measured on all of them")
  test = getattr(s.dataset, "test_labels", None)
  if test is not None and s.cfg.eval_test_examples > len(test):
    warns.append(f"config.eval_test_examples={s.cfg.eval_test_examples} is more than the "
                 f"{len(test):,} test examples: the test metrics are measured on all of them")
  return warns


def init_state(s: Setup) -> TrainState:
  """Identical initial models on every worker (seeded by ``config.seed``, an input), each
  with its own transform state, built by ONE compiled program (the model's init, the
  broadcast to ``[n, ...]`` and the transforms' ``init`` under ``vmap``), kept in
  :data:`~nbsgd_jax.run.step.PROGRAMS` by the run's structure: another seed compiles nothing.
  A run that starts from ``config.init_from`` (its models are constants of the program) is
  not kept.

  Returns:
    the placed :class:`~nbsgd_jax.run.step.TrainState`: leaves ``[n, ...]``.
  """
  make = lambda: jax.jit(lambda seed: _initial_state(s, seed))
  program = make() if s.cfg.init_from else step_lib.PROGRAMS.get(s.structure, "init", make)
  # the seed from numpy, as the eager init was: the state leaves the program on the default
  # device, uncommitted, and the backend places it (a replicated input would shard it)
  return s.backend.place(program(np.int32(s.cfg.seed)))


def init_states(setups: list) -> TrainState:
  """The initial states of R runs of one structure (a sweep's stacked group), stacked on a
  leading runs axis, built by ONE compiled program: :func:`init_state`'s body under
  ``jax.vmap`` over the runs' seeds, kept in :data:`~nbsgd_jax.run.step.PROGRAMS` by the
  structure. Runs that start from ``config.init_from`` are built one by one and stacked.

  Returns:
    the placed :class:`~nbsgd_jax.run.step.TrainState`: leaves ``[R, n, ...]``.
  """
  s = setups[0]
  if any(x.cfg.init_from for x in setups):
    return s.backend.place(stack_trees([init_state(x) for x in setups]))
  make = lambda: jax.jit(jax.vmap(lambda seed: _initial_state(s, seed)))
  program = step_lib.PROGRAMS.get(s.structure, ("init", "runs"), make)
  return s.backend.place(program(np.asarray([x.cfg.seed for x in setups], np.int32)))


@jax.jit
def stack_trees(trees: list):
  """The trees (the same structure and shapes) stacked on a new leading axis, in one
  compiled program (per structure and shapes) rather than one eager stack per leaf."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@jax.jit
def _equal_trees(a, b) -> jax.Array:
  return jnp.all(jnp.asarray([jnp.array_equal(x, y)
                              for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]))


def same_trees(trees: list) -> bool:
  """Whether every tree holds the same values as the first (one compiled comparison per
  structure and shapes)."""
  shapes = lambda t: [(x.shape, x.dtype) for x in jax.tree.leaves(t)]
  return all(shapes(t) == shapes(trees[0]) and bool(_equal_trees(trees[0], t))
             for t in trees[1:])


def _initial_state(s: Setup, seed: jax.Array) -> TrainState:
  """The traced body of :func:`init_state` (``seed``: int32 scalar)."""
  n = s.cfg.num_workers
  params, model_state = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape),
                                     s.task.init(seed))
  opt_state = jax.vmap(s.recipe.transform.init)(params)
  # Own buffers for every leaf: a state that starts as a copy of the params (an anchor) must
  # not alias them, or donating the train state would donate one buffer twice (a program's
  # outputs are distinct buffers: XLA copies a value returned twice).
  return TrainState(params, opt_state, jnp.zeros((n,), jnp.int32), model_state)


def one_worker_data(s: Setup):
  """The data shard of the first worker this process holds (leaves without the worker axis)."""
  def first(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      x = x.addressable_shards[0].data
    return x[0]
  return jax.tree.map(first, s.worker_data)


def measure_time_per_example(s: Setup, repeats: int = 5) -> float:
  """Seconds of forward and backward per example of the run's model at its batch size on this
  process's first device: ``jax.value_and_grad`` of the task's loss on one worker's batch,
  compiled and run once untimed, then the median of ``repeats`` timed runs divided by
  ``batch_size``. Across processes (multihost) process 0's figure is used by all, so every
  process simulates the same cluster.

  Returns:
    float seconds, > 0.
  """
  data = one_worker_data(s)
  batch = jax.vmap(lambda d: s.task.batch(d, jnp.int32(0), AXIS), axis_name=AXIS)(
      jax.tree.map(lambda x: x[None], data))
  batch = jax.tree.map(lambda x: x[0], batch)
  params, model_state = s.task.init()
  fn = jax.jit(jax.value_and_grad(s.task.loss_fn, has_aux=True))
  jax.block_until_ready(fn(params, model_state, batch))
  times = []
  for _ in range(max(int(repeats), 1)):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(params, model_state, batch))
    times.append(time.perf_counter() - t0)
  seconds = max(float(np.median(times)), 1e-9) / s.cfg.batch_size
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    seconds = float(multihost_utils.broadcast_one_to_all(np.float64(seconds)))
  return seconds


def make_host(s: Setup) -> host_lib.Host:
  """The host parts of the run (:mod:`nbsgd_jax.host`), built from the config and the
  recipe's communications.

  Raises:
    ConfigError: a bad consensus target set-up (named).
    ValueError: two different communications of the recipe share a report key.
  """
  cfg, n = s.cfg, s.cfg.num_workers
  comms = list(dict.fromkeys(s.recipe.transform.communications))
  keys = [c.key for c in comms]
  if len(set(keys)) != len(keys):  # the clock reads each communication's bytes by its key
    raise ValueError(f"recipe {cfg.algorithm!r} has two communications with one key: {keys}")
  measured = None
  if cfg.cluster.measure_time_per_example:
    measured = measure_time_per_example(s)
  cluster = cluster_config.from_config(cfg, measured)
  schedule = cluster_lib.parse_failures(cfg.cluster.failures, n)
  process = failures_lib.failure_process(cfg, cluster)
  restart = cfg.cluster.failure_policy == "restart"  # nobody drops out: the job restarts
  lockstep = not restart and s.recipe.clock is None  # the event clock's own: its outages
  parts = [host_lib.Failures(schedule if lockstep else [], n, process if lockstep else None,
                            failures_lib.quorum(cfg, cluster)),  # quorum_policy='wait'
           host_lib.Activations(comms)]
  if s.recipe.periodic:
    offset = s.task.facts["f_star"] if cfg.local_sgd.offset_optimum else 0.0
    parts.append(host_lib.Periods(s.recipe.planner(offset)))
  nb = cfg.nonblocking
  if cfg.cluster.clock == "wall":
    parts.append(wallclock.WallWorkload(cluster, nb.enabled, nb.deadline, nb.adaptive_k,
                                        nb.window, cfg.cluster.emulate))
  elif s.recipe.clock is not None:  # the event clock times each computation itself
    parts.append(workload_lib.WholeBatches(cluster))
  else:
    parts.append(host_lib.Workload(cluster, nb.enabled, nb.deadline, nb.deadline_group,
                                   s.recipe.primary, nb.adaptive_k, nb.window,
                                   cfg.cluster.step_overhead))
  if cfg.consensus.control:
    parts.append(_targets(cfg))
  parts += [make() for make in s.recipe.host_parts]  # the recipe's own (its open context)
  fetch = None
  if cfg.cluster.rejoin_fetch and not restart:
    fetch = failures_lib.ModelFetch(n, tree_bytes(jax.eval_shape(lambda: s.task.init()[0])))
  if s.recipe.clock is None:
    clock = host_lib.Clock(cluster, comms, fetch)
  else:  # the recipe's own (the event clock): it charges one worker's model per message
    clock = s.recipe.clock(cluster, comms, jax.eval_shape(lambda: s.task.init()[0]))
    clock.set_outages(outages_lib.outages_of(cfg, cluster, lambda: np.array(
        [clock.pair_s(i, n) for i in range(n)])))  # a joiner fetches the server's model
    clock.set_restarts(outages_lib.restarts_of(cfg, cluster))
  restarts = None
  if restart and type(clock) is host_lib.Clock:
    restarts = ledger_lib.Restarts(clock, schedule, process, cfg.cluster.restart_every,
                                   cfg.cluster.restart_seconds)
  parts += [clock] + ([restarts] if restarts else []) + [host_lib.Totals(fetch)]
  if type(clock) is host_lib.Clock:  # the lockstep clock: where its time went
    parts.append(ledger_lib.Ledger(clock, cfg.cluster.step_overhead, restarts))
  faults = faults_lib.fault_counts(cfg, cluster, clock)  # failures, episodes begun
  return host_lib.Host(parts + ([faults] if faults else []))


def _targets(cfg) -> host_lib.Targets:
  cs = cfg.consensus
  try:
    if cs.critical:
      schedule = host_lib.CriticalTarget(cfg.num_workers, cs.critical_scale, cs.smoothness,
                                              cs.until_step, cs.critical_ema,
                                              cs.critical_form)
    else:
      schedule = host_lib.TargetSchedule(cs.target, cs.target_ratio, cs.reference_workdir,
                                              cs.until_step)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.{e}"]) from None
  lr = optim.make_schedule(cfg)
  return host_lib.Targets(cfg.num_workers, schedule,
                          lambda t: float(lr(t)) / (1.0 - cfg.momentum),
                          0 if cs.smoothness else cs.smoothness_every, cs.until_step)


__all__ = ["Setup", "check_model_fit", "init_state", "make_host", "measure_time_per_example",
           "one_worker_data", "setup"]
