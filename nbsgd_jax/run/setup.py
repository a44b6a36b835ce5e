"""Everything a run needs, built from a config before any compilation: data, model, topology,
recipe, backend, the compiled worker program and the host parts.

The worker program of one step (on the ``"workers"`` axis)::

    batch = task.batch(data, step)                              # the task
    loss, grads, model_state = gradient_source(loss_fn, params, model_state, batch, ctx)
    updates, state, report = recipe.transform.update(grads, state, params, ctx)
    params = optax.apply_updates(params, updates)

``model_state`` (BatchNorm's running statistics) stays with its worker: the gradient source
updates it, no transform sees it.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax import lax

from nbsgd_jax import cluster as cluster_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax import host as host_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax import transforms
from nbsgd_jax.axis import AXIS
from nbsgd_jax.run import task as task_lib
from nbsgd_jax.run.backends import Backend, make_backend
from nbsgd_jax.transforms import CONTEXT_AXES, StepContext


class TrainState(NamedTuple):
  """Per-worker train state; every leaf has a leading worker axis ``[n, ...]``.

  Attributes:
    params: model parameters of each worker.
    opt_state: each worker's transform state.
    step: int32 ``[n]``, steps taken (the same on every worker).
    model_state: each worker's model state besides the parameters (BatchNorm's running
      statistics; ``()`` / ``{}`` when the model has none), updated by its own batches only.
  """

  params: Any
  opt_state: Any
  step: jax.Array
  model_state: Any = ()


def make_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Learning rate per step: optional linear warm-up, then constant, cosine decay to 0,
  inverse time ``learning_rate * t0 / (t + t0)``, ``t0 = lr_time_scale`` (the step sizes of
  the PL analyses, e.g. Haddadpour et al. 2019: ``2 / (mu (t + a))``), or step decays
  (``lr_decay`` at each of ``lr_milestones`` x ``num_steps``, counted from step 0; Goyal et
  al. 2017; the phases of Kong et al. 2021)."""
  decay_steps = max(cfg.num_steps - cfg.warmup_steps, 1)
  if cfg.lr_schedule == "step":
    bounds: dict = {}
    for f in cfg.lr_milestones:  # two milestones on one step decay twice there
      b = max(milestone_step(cfg, f) - cfg.warmup_steps, 1)
      bounds[b] = bounds.get(b, 1.0) * cfg.lr_decay
    main = optax.piecewise_constant_schedule(cfg.learning_rate, bounds)
  elif cfg.lr_schedule == "cosine":  # to lr_min at num_steps (nanoGPT's min_lr)
    main = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps,
                                       alpha=cfg.lr_min / cfg.learning_rate)
  elif cfg.lr_schedule == "inverse_time":  # eta_t = eta t0 / (t + t0), e.g. 2 / (mu (t + a))
    lr, t0 = cfg.learning_rate, float(cfg.lr_time_scale)
    main = lambda step: lr * t0 / (step + t0)
  else:
    main = optax.constant_schedule(cfg.learning_rate)
  if cfg.warmup_steps:
    warm = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warm, main], [cfg.warmup_steps])
  return main


def milestone_step(cfg: ml_collections.ConfigDict, fraction: float) -> int:
  """The first step (0-based) with the decayed rate of the milestone at ``fraction`` of
  ``num_steps``: ``round(fraction * num_steps)``."""
  return int(round(fraction * cfg.num_steps))


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Local optimizer: ``config.optimizer="sgd"``: L2 weight decay added to the gradient, then
  SGD with (Nesterov) momentum; ``"adamw"``: AdamW (Loshchilov & Hutter 2019; DiLoCo's inner
  optimizer, Douillard et al. 2023) with ``b1 = momentum``, ``b2 = adam_b2`` and decoupled
  ``weight_decay``. ``weight_decay_on="matrices"`` decays only parameters with >= 2 axes
  (karpathy/nanoGPT ``configure_optimizers``); ``grad_clip > 0`` first clips the gradient to
  that global L2 norm (``optax.clip_by_global_norm``, nanoGPT's ``grad_clip``)."""
  mask = None
  if cfg.weight_decay_on == "matrices":
    mask = lambda params: jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)
  if cfg.optimizer == "adamw":
    opt = optax.adamw(make_schedule(cfg), b1=cfg.momentum, b2=cfg.adam_b2,
                      weight_decay=cfg.weight_decay, mask=mask)
  else:
    opt = optax.chain(
        optax.add_decayed_weights(cfg.weight_decay, mask) if cfg.weight_decay
        else optax.identity(),
        optax.sgd(make_schedule(cfg), momentum=cfg.momentum or None, nesterov=cfg.nesterov))
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt) if cfg.grad_clip else opt


# ----------------------------------------------------------------------------- gradient sources


def full_batch(loss_fn, params, model_state, batch, ctx):
  """``(loss, grads, model_state)`` of the whole batch (``loss_fn(params, model_state, batch)
  -> (loss, model_state)``)."""
  del ctx
  (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, model_state, batch)
  return loss, grads, model_state


def minibatches(num_minibatches: int, unroll: bool = False) -> Callable:
  """Non-blocking SGD's gradient source (He & Dube 2022): the mean over the first
  ``ctx.count`` of ``M`` mini-batches
  (:func:`nbsgd_jax.transforms.minibatch_mean_gradient_with_state`: the model state goes
  through the finished mini-batches only); the loss is the mean over the finished
  mini-batches (0 if none). ``unroll``: the loop over the mini-batches unrolled
  (``nonblocking.unroll``)."""

  def source(loss_fn, params, model_state, batch, ctx):
    grads, loss, _, model_state = transforms.minibatch_mean_gradient_with_state(
        loss_fn, params, model_state, batch, num_minibatches, ctx.count, weighting="local",
        unroll=unroll)
    return loss, grads, model_state

  return source


def gradient_source(cfg: ml_collections.ConfigDict) -> Callable:
  """Counted mini-batches whenever workers may contribute unequal work
  (:func:`nbsgd_jax.config.counted_steps`: Non-blocking SGD's ``M``, failures' single batch,
  :func:`nbsgd_jax.cluster.num_minibatches`), else the whole batch."""
  if config_lib.counted_steps(cfg):
    return minibatches(cluster_lib.num_minibatches(cfg), cfg.nonblocking.unroll)
  return full_batch


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
  plan: Any  # MATCHA's MatchaPlan, or None
  task: task_lib.Task


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
      given model or data that does not fit (named).
  """
  if cfg.get("backend") == "multihost":  # before anything initializes a JAX backend
    from nbsgd_jax import multihost
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
  plan = None
  if cfg.algorithm == "matcha":  # MATCHA's set-up: matchings, probabilities, alpha (cvxpy)
    from nbsgd_jax import matcha as matcha_lib
    plan = matcha_lib.plan(topo.n, topo.edges, cfg.matcha.budget)
  try:
    backend = make_backend(cfg.backend, n, cfg.workers_per_device)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.{e}"]) from None
  try:
    recipe = recipes_lib.build(cfg, topo, plan, backend.axis_name)
  except ValueError as e:
    raise config_lib.ConfigError(str(e).splitlines()) from None
  if cfg.dataset in config_lib.SYNTHETIC:
    problem = _problem(cfg)
    task = task_lib.synthetic_task(cfg, problem, backend)
    return Setup(cfg, problem, task.worker_data, None, topo, recipe, backend, plan, task)
  dataset = _load(cfg, data)
  if isinstance(dataset, data_lib.TextDataset):
    return _language_model_setup(cfg, dataset, model, topo, recipe, backend, plan)
  shards = _partition(cfg, dataset)
  model = _model(cfg, model, dataset.num_classes)
  if cfg.model not in models_lib.MODELS:  # the user's: checked before anything runs
    _check_model(model, cfg, dataset.train_images[:1], dataset.num_classes)
  if backend.name == "multihost":
    worker_data = task_lib.process_local_data(dataset, shards, backend)
  else:
    images, labels, sizes = data_lib.stack_shards(dataset.train_images, dataset.train_labels,
                                                  shards)
    worker_data = task_lib.WorkerData(*backend.place((jnp.asarray(images), jnp.asarray(labels),
                                                      jnp.asarray(sizes))))
  task = task_lib.classification_task(cfg, dataset, worker_data, model, backend,
                                      recipe.decentralized)
  return Setup(cfg, dataset, worker_data, model, topo, recipe, backend, plan, task)


def _check_given(cfg, model, data) -> None:
  """``config.model="module"`` goes with a given model and only then, ``config.dataset=
  "arrays"`` with given data.

  Raises:
    ConfigError: one without the other (named).
  """
  errs = []
  for key, name, obj, arg in (("model", models_lib.GIVEN, model, "model=<flax module>"),
                              ("dataset", data_lib.GIVEN, data, "data=ArrayDataset(...)")):
    if (cfg[key] == name) != (obj is not None):
      errs.append(f"config.{key}={cfg[key]!r} " + (
          f"needs train(cfg, {arg})" if obj is None else
          f"is not allowed with train(..., {arg.split('=')[0]}=...): set config.{key}={name!r}"))
  if errs:
    raise config_lib.ConfigError(errs)


def _load(cfg, data):
  """The run's data set: given, from a registered loader, a text set for the built-in
  language model, or an image set.

  Raises:
    ConfigError: an unreadable data set, or a given / loaded one that does not fit (named).
  """
  where = f"config.dataset={cfg.dataset!r}"
  try:
    if data is None and cfg.dataset in data_lib.REGISTRY:
      data = data_lib.REGISTRY[cfg.dataset](cfg)
      where += " (registered loader)"
    if data is not None:
      return data_lib.from_arrays(data)
    if cfg.model == "transformer" or cfg.dataset in data_lib.TEXT_DATASETS:
      return data_lib.load_text_dataset(cfg.dataset, data_dir=cfg.data_dir or None,
                                        data_path=cfg.data_path or None)
    return data_lib.load_dataset(cfg.dataset, data_dir=cfg.data_dir or None,
                                 data_path=cfg.data_path or None,
                                 cache_dir=cfg.data_cache or None, progress=bool(cfg.progress))
  except ValueError as e:
    raise config_lib.ConfigError([f"{where}: {e}"]) from None


def _model(cfg, model, num_classes: int):
  """The given module, a registered model's or a built-in one."""
  if model is not None:
    return model
  if cfg.model in models_lib.REGISTRY:
    return models_lib.REGISTRY[cfg.model](num_classes, cfg)
  return models_lib.make_model(cfg.model, num_classes, mlp_hidden=cfg.mlp_hidden,
                               cnn_channels=cfg.cnn_channels, norm=cfg.norm,
                               norm_groups=cfg.norm_groups, dtype=cfg.compute_dtype,
                               lm=cfg.lm, depth=cfg.resnet_depth, conv_impl=cfg.conv_impl,
                               pool_impl=cfg.pool_impl)


def _check_model(model, cfg, sample: np.ndarray, num_classes: int, tokens: bool = False) -> None:
  """The model maps one input to ``num_classes`` logits (abstractly: nothing is computed).

  Raises:
    ConfigError: it fails on the data's inputs or its output has another shape (named).
  """
  x = jnp.asarray(sample)
  if data_lib.is_images(np.asarray(sample)):  # the task feeds scaled float32 images
    x = x.astype(jnp.float32)
  want = x.shape + (num_classes,) if tokens else (x.shape[0], num_classes)
  name = f"config.model={cfg.model!r}" + (f" ({type(model).__name__})" if
                                          cfg.model == models_lib.GIVEN else "")
  try:
    out = jax.eval_shape(lambda k, v: models_lib.apply_eval(
        model, *models_lib.init(model, k, v), v), jax.random.key(0), x)
  except Exception as e:  # the user's module: any error is theirs, named with its input
    raise config_lib.ConfigError([f"{name} fails on the data's inputs {x.dtype}{list(x.shape)}: "
                                  f"{type(e).__name__}: {str(e).splitlines()[0]}"]) from None
  shape = getattr(out, "shape", None)
  if shape != want:
    raise config_lib.ConfigError([f"{name} returns {shape} for inputs of shape {x.shape}: the "
                                  f"data has {num_classes} classes, so it must return logits "
                                  f"of shape {want}"])


def _language_model_setup(cfg, dataset, model, topo, recipe, backend, plan) -> Setup:
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
  model = _model(cfg, model, dataset.vocab_size)
  if cfg.model not in models_lib.MODELS:
    _check_model(model, cfg, np.zeros((1, cfg.lm.context), np.int32), dataset.vocab_size,
                 tokens=True)
  worker_tokens = task_lib.place_rows(np.asarray(rows, np.int32), backend)
  task = task_lib.language_model_task(cfg, dataset, worker_tokens, model, backend,
                                      recipe.decentralized)
  return Setup(cfg, dataset, worker_tokens, model, topo, recipe, backend, plan, task)


def _partition(cfg, dataset) -> list:
  """The shards of an image data set over the workers.

  Raises:
    ConfigError: more workers than examples, or a batch larger than a worker's shard.
  """
  n = cfg.num_workers
  if n > len(dataset.train_labels):
    raise config_lib.ConfigError(
        [f"config.num_workers={n} is not allowed: the training set has only "
         f"{len(dataset.train_labels)} examples"])
  try:
    shards = data_lib.partition(dataset.train_labels, n, scheme=cfg.partition,
                                alpha=cfg.dirichlet_alpha, seed=cfg.seed,
                                min_size=cfg.batch_size if cfg.partition == "dirichlet" else 1)
  except ValueError as e:
    raise config_lib.ConfigError(
        [f"config.partition={cfg.partition!r} with config.batch_size={cfg.batch_size}: {e}"]
    ) from None
  smallest = min(len(s) for s in shards)
  if cfg.batch_size > smallest:
    raise config_lib.ConfigError(
        [f"config.batch_size={cfg.batch_size} is not allowed: the smallest worker shard has "
         f"{smallest} examples ({len(dataset.train_labels)} examples over {n} workers); use "
         f"batch_size <= {smallest}"])
  if not data_lib.is_images(dataset.train_images):
    on = [k for k in ("crop_padding", "flip", "normalize") if cfg.augment[k]]
    if on:
      raise config_lib.ConfigError([
          f"config.augment.{on[0]}={cfg.augment[on[0]]!r} is not allowed: the data's features "
          f"({dataset.train_images.dtype}{list(dataset.train_images.shape[1:])}) are not uint8 "
          "[H, W, C] images"])
  return shards


def _problem(cfg):
  """The synthetic problem of ``config.problem``, drawn with ``problem.shards`` shards and
  regrouped to ``num_workers`` (:func:`nbsgd_jax.problems.regroup`).

  Raises:
    ConfigError: a batch larger than a worker's examples, or a bad problem (named).
  """
  from nbsgd_jax import problems as problems_lib
  p, n = cfg.problem, cfg.num_workers
  shards = p.shards or n
  try:
    if cfg.dataset == "least_squares":
      prob = problems_lib.least_squares(shards, p.examples_per_worker, p.dim, noise=p.noise,
                                        l2=p.l2, heterogeneity=p.heterogeneity,
                                        condition=p.condition, seed=p.seed)
    else:
      prob = problems_lib.logistic(shards, p.examples_per_worker, p.dim, l2=p.l2,
                                   heterogeneity=p.heterogeneity, seed=p.seed)
  except (ValueError, RuntimeError) as e:
    raise config_lib.ConfigError([f"config.problem: {e}"]) from None
  prob = problems_lib.regroup(prob, n)
  m = prob.features.shape[1]
  if cfg.batch_size > m:
    raise config_lib.ConfigError([
        f"config.batch_size={cfg.batch_size} is not allowed: a worker holds {m} examples "
        f"(problem.examples_per_worker x problem.shards / num_workers); use batch_size <= {m}"])
  return prob


def check_model_fit(s: Setup) -> list[str]:
  """The config against the model and the data, abstractly (nothing is computed or
  compiled): the :data:`~nbsgd_jax.config.MODEL_CHECKS` on one worker's parameter shapes,
  then the transform's state on them (streaming DiLoCo's fragments need as many parameter
  arrays).

  Returns:
    warning lines (odd, not wrong): ``eval_train_examples`` above the training set.

  Raises:
    ConfigError: one line per value that does not fit the model (named).
  """
  params, _ = jax.eval_shape(s.task.init)
  shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
  errs: list = []
  for name in config_lib.MODEL_CHECKS:
    config_lib.section_check(name, config_lib.MODEL_CHECKS)(s.cfg, shapes, errs)
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
    return [f"config.eval_train_examples={s.cfg.eval_train_examples} is more than the "
            f"{len(labels):,} training examples: train_loss is measured on all of them"]
  return []


def init_state(s: Setup) -> TrainState:
  """Identical initial models on every worker (seeded), each with its own transform state."""
  n = s.cfg.num_workers
  params, model_state = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape),
                                     s.task.init())
  opt_state = jax.vmap(s.recipe.transform.init)(params)
  # Own buffers for every leaf: a state that starts as a copy of the params (an anchor) must
  # not alias them, or donating the train state would donate one buffer twice.
  opt_state, model_state = jax.tree.map(lambda x: jnp.array(x, copy=True),
                                        (opt_state, model_state))
  return s.backend.place(TrainState(params, opt_state, jnp.zeros((n,), jnp.int32),
                                    model_state))


def make_worker_step(s: Setup, period_end: bool = True) -> Callable:
  """The program of one worker for one step (module docstring).

  Returns:
    ``(state, data, ctx) -> (state, (loss, report))`` on one worker's (unbatched) state,
    shard and :class:`~nbsgd_jax.transforms.StepContext`; ``loss`` is the float32 mini-batch
    loss before the update, ``report`` the recipe's (``bytes_sent`` ...).
  """
  source, task = gradient_source(s.cfg), s.task

  def step_fn(state: TrainState, data, ctx: StepContext):
    ctx = ctx._replace(period_end=period_end)
    batch = task.batch(data, state.step, s.backend.axis_name)
    loss, grads, model_state = source(task.loss_fn, state.params, state.model_state, batch,
                                      ctx)
    return apply_update(s, state._replace(model_state=model_state), loss, grads, ctx)

  return step_fn


def apply_update(s: Setup, state: TrainState, loss, grads, ctx: StepContext):
  """The recipe's update of one worker from its gradient: ``(state, (loss, report))``."""
  updates, opt_state, report = s.recipe.transform.update(grads, state.opt_state, state.params,
                                                         ctx)
  params = optax.apply_updates(state.params, updates)
  return TrainState(params, opt_state, state.step + 1, state.model_state), (loss, report)


def make_train_step(s: Setup, host: host_lib.Host | None = None) -> Callable:
  """``(state, data, ctx, period_end=True, inputs=None) -> (state, (loss [n], report))`` on
  the backend (state donated); ``ctx`` from :func:`device_context`. Periodic recipes have two
  programs (a local step and a synchronising step), each compiled on first use. On the wall
  clock (``cluster.clock="wall"``) the step of :mod:`nbsgd_jax.run.wallclock` (it needs the
  run's ``host`` and each step's ``inputs``)."""
  if s.cfg.cluster.clock == "wall":
    from nbsgd_jax.run import wallclock
    return wallclock.WallClockStep(s, host.part("workload"))
  programs: dict = {}
  spare: list = []  # the double buffer: the parameters' buffers of the step before

  def compile_step(key):
    spmd = s.backend.spmd(make_worker_step(s, key), (0, 0, CONTEXT_AXES))
    if not s.cfg.double_buffer:
      return jax.jit(spmd, donate_argnums=(0,))
    return jax.jit(double_buffered(spmd), donate_argnums=(0, 1), keep_unused=True)

  def step(state, data, ctx, period_end=True, inputs=None):
    del inputs
    key = period_end if s.recipe.periodic else True  # a static (hashable) period end
    if key not in programs:
      programs[key] = compile_step(key)
    if not s.cfg.double_buffer:
      return programs[key](state, data, ctx)
    buffers = spare.pop() if spare else fresh_like(state.params)
    old_state, params, out = programs[key](state, buffers, data, ctx)
    spare.append(old_state.params)
    return old_state._replace(params=params), out

  return step


def double_buffered(spmd_step: Callable) -> Callable:
  """``spmd_step`` writing the new parameters into a second set of buffers (``cfg.
  double_buffer``): ``(state, spare, data, ctx) -> (state with the old parameters, new
  parameters, out)``, to be compiled with ``state`` and ``spare`` donated and kept.

  Why: a step that mixes the models (gossip) cannot update the parameters in place (worker
  i reads its neighbours' old rows), so XLA writes them to a fresh ``[n, ...]`` buffer and
  copies that into the donated one; on a CPU the fresh buffer's pages are also faulted in at
  every step (``docs/scaling.md``). Here the old parameters go out unchanged into their own
  buffers and the new ones into ``spare``'s, which the caller passes back at the next step.
  Donated inputs are matched to outputs of the same shape and dtype in order, so the outputs
  are ordered as the inputs: the state's leaves (old parameters first), then the new
  parameters in ``spare``'s place.
  """
  def program(state, spare, data, ctx):
    del spare  # donated and kept: its buffers receive the new parameters
    new, out = spmd_step(state, data, ctx)
    return new._replace(params=state.params), new.params, out

  return program


@jax.jit
def fresh_like(tree):
  """New buffers of ``tree``'s shapes and dtypes, placed as ``tree`` is (its sharding and
  whether it is committed to its devices follow, so the step that receives them compiles
  once); the values are ``tree * 0``."""
  return jax.tree.map(lambda x: x * 0, tree)


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
  cluster = config_lib.make_cluster(cfg, measured)
  parts = [host_lib.Failures(cluster_lib.parse_failures(cfg.cluster.failures, n), n),
           host_lib.Activations(comms)]
  if s.recipe.periodic:
    offset = s.task.facts["f_star"] if cfg.local_sgd.offset_optimum else 0.0
    parts.append(host_lib.Periods(s.recipe.planner(offset)))
  nb = cfg.nonblocking
  if cfg.cluster.clock == "wall":
    from nbsgd_jax.run import wallclock
    parts.append(wallclock.WallWorkload(cluster, nb.enabled, nb.deadline, nb.adaptive_k,
                                        nb.window, cfg.cluster.emulate))
  else:
    parts.append(host_lib.Workload(cluster, nb.enabled, nb.deadline, nb.deadline_group,
                                   s.recipe.primary, nb.adaptive_k, nb.window,
                                   cfg.cluster.step_overhead))
  if cfg.consensus.control:
    parts.append(_targets(cfg))
  parts += [host_lib.Clock(cluster, comms), host_lib.Totals()]
  return host_lib.Host(parts)


def _targets(cfg) -> host_lib.Targets:
  from nbsgd_jax import consensus as consensus_lib
  cs = cfg.consensus
  try:
    if cs.critical:
      schedule = consensus_lib.CriticalTarget(cfg.num_workers, cs.critical_scale, cs.smoothness,
                                              cs.until_step, cs.critical_ema,
                                              cs.critical_form)
    else:
      schedule = consensus_lib.TargetSchedule(cs.target, cs.target_ratio, cs.reference_workdir,
                                              cs.until_step)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.{e}"]) from None
  lr = make_schedule(cfg)
  return host_lib.Targets(cfg.num_workers, schedule,
                          lambda t: float(lr(t)) / (1.0 - cfg.momentum),
                          0 if cs.smoothness else cs.smoothness_every, cs.until_step)


def host_context(s: Setup, inputs: dict) -> StepContext:
  """The host inputs of a step as numpy arrays: ``count`` per worker (int32 ``[n]``), the
  other values once, the same for every worker (:data:`~nbsgd_jax.transforms.CONTEXT_AXES`;
  None stays None)."""
  del s

  def once(x, dtype):
    return None if x is None else np.asarray(x, dtype)

  return StepContext(once(inputs["step"], np.int32), np.asarray(inputs["count"], np.int32),
                     once(inputs["total"], np.int32), once(inputs["active"], bool),
                     once(inputs.get("alive"), bool), once(inputs.get("target"), np.float32))


def _place_context(s: Setup, ctx: StepContext) -> StepContext:
  """``ctx`` on the devices: the per-worker fields split over the workers (``place``), the
  others whole on every device (``replicate``)."""
  put = lambda ax, x: x if x is None else (
      s.backend.replicate(jnp.asarray(x)) if ax is None else s.backend.place(jnp.asarray(x)))
  return jax.tree.map(put, CONTEXT_AXES, ctx, is_leaf=lambda x: x is None)


def device_context(s: Setup, inputs: dict) -> StepContext:
  """The host inputs of a step as the workers' :class:`~nbsgd_jax.transforms.StepContext`
  (:func:`host_context`, placed for the backend): the compiled step's context, read with
  ``in_axes`` :data:`~nbsgd_jax.transforms.CONTEXT_AXES`."""
  return _place_context(s, host_context(s, inputs))


def device_contexts(s: Setup, inputs: list) -> StepContext:
  """The contexts of ``k`` consecutive steps, stacked (``count`` ``[n, k]``, the shared
  fields ``[k, ...]``), placed for the backend: the input of :func:`make_block_step`."""
  ctxs = [host_context(s, i) for i in inputs]
  stack = lambda ax, *xs: None if xs[0] is None else np.stack(xs, axis=0 if ax is None else 1)
  return _place_context(s, jax.tree.map(stack, CONTEXT_AXES, *ctxs,
                                        is_leaf=lambda x: x is None))


def make_block_step(s: Setup) -> Callable:
  """``(state, data, ctx, keys) -> (state, outs)``: ``k`` steps in one dispatch
  (``config.steps_per_dispatch``), each the program of :func:`make_worker_step` for its
  static period end ``keys[j]``, consecutive steps with the same period end (a run) as one
  ``lax.scan``; ``ctx`` from :func:`device_contexts`; ``outs``: per run ``(loss [n, m],
  report [n, m])`` of its ``m`` steps. One program
  is compiled per run-length pattern of ``keys`` (e.g. ``(False x 3, True)`` for local SGD
  with tau = 4); the state is donated."""
  programs: dict = {}

  def block(state, data, ctx, keys):
    if not s.recipe.periodic:
      keys = (True,) * len(keys)
    runs = tuple((key, len(list(group))) for key, group in itertools.groupby(keys))
    if runs not in programs:
      programs[runs] = jax.jit(s.backend.spmd(_scanned_steps(s, runs), (0, 0, CONTEXT_AXES)),
                               donate_argnums=(0,))
    return programs[runs](state, data, ctx)

  return block


def _scanned_steps(s: Setup, runs: tuple) -> Callable:
  """One worker's program for the steps of ``runs`` (``(period_end, length)`` pairs)."""

  def worker(state, data, ctx):
    outs, offset = [], 0
    for key, length in runs:
      step_fn = make_worker_step(s, key)
      part = jax.tree.map(lambda x, o=offset, m=length: x[o:o + m], ctx)
      state, out = lax.scan(lambda st, c, f=step_fn: f(st, data, c), state, part)
      outs.append(out)
      offset += length
    return state, tuple(outs)  # per run: its steps' reports may have other keys

  return worker


__all__ = ["AXIS", "Setup", "TrainState", "device_context", "device_contexts", "full_batch",
           "gradient_source", "host_context", "make_block_step",
           "init_state", "make_host", "make_optimizer", "make_schedule", "make_train_step",
           "make_worker_step", "minibatches", "setup"]
