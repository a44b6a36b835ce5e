"""The training loop: one worker program, run on a backend, logged to a work directory.

Data flow (``DESIGN.md`` section 2): config -> per-worker data shards -> worker step
(gradient -> algorithm update with collectives on ``"workers"``) -> backend
(``jax.vmap`` | ``jax.shard_map``) -> ``metrics.jsonl`` / ``summary.json``.

Every leaf of the train state carries a leading worker axis ``[n, ...]``; on the mesh backend
it is sharded along the ``"workers"`` mesh axis. The whole step is one jitted call, with no
Python loop over workers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax import algorithms as algos
from nbsgd_jax import config as config_lib
from nbsgd_jax import files as files_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax import metrics as metrics_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.algorithms.base import AXIS


class TrainState(NamedTuple):
  """Per-worker train state; every leaf has a leading worker axis ``[n, ...]``.

  Attributes:
    params: model parameters of each worker.
    opt_state: each worker's optax state.
    step: int32 ``[n]``, steps taken (the same on every worker).
  """

  params: Any
  opt_state: Any
  step: jax.Array


class WorkerData(NamedTuple):
  """Each worker's training shard, padded to a common capacity ``m``.

  Attributes:
    images: uint8 ``[n, m, H, W, C]``.
    labels: int32 ``[n, m]``.
    sizes: int32 ``[n]``, valid rows of each shard (rows ``>= size`` are padding).
  """

  images: jax.Array
  labels: jax.Array
  sizes: jax.Array


# ----------------------------------------------------------------------------- sampling


def sample_batch_indices(key: jax.Array, size: jax.Array, capacity: int, batch_size: int,
                         step: jax.Array) -> jax.Array:
  """Indices of one worker's batch at ``step``: epoch-wise reshuffling without replacement.

  Sample ``t * B + b`` of the worker's stream is element ``(t * B + b) mod size`` of the
  random permutation of epoch ``(t * B + b) // size``; a permutation is the ``argsort`` of
  uniform keys with the padding rows pushed last. Deterministic in ``(key, step)``, so a
  resumed run sees the same data order.

  Args:
    key: the worker's data key.
    size: int32 scalar, valid rows of the shard (``>= batch_size``).
    capacity: padded shard length ``m`` (static).
    batch_size: ``B`` (static).
    step: int32 scalar.

  Returns:
    int32 ``[B]`` row indices in ``[0, size)``.
  """
  pos = step * batch_size + jnp.arange(batch_size, dtype=jnp.int32)
  first_epoch = (step * batch_size) // size
  valid = jnp.arange(capacity) < size

  def permutation(epoch):
    u = jax.random.uniform(jax.random.fold_in(key, epoch), (capacity,))
    return jnp.argsort(jnp.where(valid, u, 2.0)).astype(jnp.int32)

  within = pos % size
  return jnp.where(pos // size == first_epoch, permutation(first_epoch)[within],
                   permutation(first_epoch + 1)[within])


def data_key(seed: int, worker: jax.Array | int) -> jax.Array:
  """The key of worker ``worker``'s data order (independent of the init key ``seed``)."""
  return jax.random.fold_in(jax.random.key(seed + 1), worker)


def worker_batch(data: WorkerData, seed: int, batch_size: int, capacity: int,
                 step: jax.Array, axis_name=AXIS) -> tuple[jax.Array, jax.Array]:
  """This worker's training batch at ``step`` (inside the worker program on ``axis_name``).

  Returns:
    images float32 ``[B, H, W, C]`` scaled to [0, 1] and int labels ``[B]``, rows drawn by
    :func:`sample_batch_indices` with the worker's :func:`data_key`.
  """
  idx = sample_batch_indices(data_key(seed, lax.axis_index(axis_name)), data.sizes, capacity,
                             batch_size, step)
  return data.images[idx].astype(jnp.float32) / 255.0, data.labels[idx]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy (nats) of logits ``[B, C]`` against int labels ``[B]``."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_worker_step(model, algorithm: algos.Algorithm, batch_size: int, capacity: int,
                     seed: int, num_minibatches: int = 1, nonblocking: bool = False,
                     sync: bool = False, axis_name=AXIS) -> Callable:
  """The program of one worker for one step (runs on the ``"workers"`` axis).

  With ``nonblocking`` the batch is split into ``num_minibatches`` mini-batches and the
  gradient is the mean over the first ``inputs.count`` of them (He & Dube 2022;
  :func:`nbsgd_jax.transforms.minibatch_mean_gradient`); the loss is then the mean over the
  finished mini-batches (0 if none). With ``sync`` the step runs the algorithm's
  ``sync_update`` (the last step of a communication period of local SGD / DiLoCo).

  Returns:
    ``(state, data, inputs) -> (state, (loss, bytes_sent, aux))`` on one worker's (unbatched)
    state, shard and :class:`~nbsgd_jax.algorithms.base.StepInputs`; ``loss`` is the float32
    mini-batch loss before the update, ``bytes_sent`` the float32 bytes this worker sent,
    ``aux`` the algorithm's extra per-step values (a dict, often empty).
  """
  from nbsgd_jax import transforms
  if sync and algorithm.sync_update is None:
    raise ValueError(f"algorithm {algorithm.name!r} has no sync_update")
  algo_update = algorithm.sync_update if sync else algorithm.update

  def loss_fn(params, batch):
    x, y = batch
    return cross_entropy(model.apply(params, x), y)

  def step_fn(state: TrainState, data: WorkerData, inputs: algos.StepInputs):
    batch = worker_batch(data, seed, batch_size, capacity, state.step, axis_name)
    if nonblocking:
      grads, loss, _ = transforms.minibatch_mean_gradient(
          loss_fn, state.params, batch, num_minibatches, inputs.count, weighting="local")
    else:
      loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    out = algo_update(grads, state.opt_state, state.params, inputs)
    params, opt_state, sent = out[:3]
    aux = out[3] if len(out) > 3 else {}
    return TrainState(params, opt_state, state.step + 1), (loss, sent, aux)

  return step_fn


# ----------------------------------------------------------------------------- backends


class Backend(NamedTuple):
  """How the worker program is executed.

  Attributes:
    name: ``"simulate"``, ``"mesh"`` or ``"multihost"``.
    num_workers: n.
    mesh: the device mesh (mesh backend) or None.
    axis_name: the worker axis of the worker program: ``"workers"``, or
      ``("devices", "workers")`` with several workers per device.
    spmd: ``worker_fn -> fn`` running a per-worker function on arrays with a leading
      worker axis (not jitted).
    place: ``pytree -> pytree`` putting arrays with a leading worker axis where the
      backend wants them.
    replicate: ``pytree -> pytree`` putting arrays whole on every device of the backend
      (evaluation data, the stacked models for evaluation).
    fetch: ``array -> np.ndarray``, the whole value on the host (an all-gather across
      processes for ``"multihost"``: every process must call it at the same point).
  """

  name: str
  num_workers: int
  mesh: Any
  spmd: Callable[[Callable], Callable]
  place: Callable[[Any], Any]
  axis_name: Any = AXIS
  replicate: Callable[[Any], Any] = jax.device_put
  fetch: Callable[[Any], np.ndarray] = np.asarray


DEVICE_AXIS = "devices"


def workers_per_device(num_workers: int, num_devices: int, requested: int = 0) -> int:
  """k, workers per device of the mesh backend: ``requested`` if > 0, else the smallest k
  dividing n with n / k <= devices.

  Raises:
    ValueError: k does not divide n, or n / k devices are more than there are.
  """
  if requested:
    k = requested
  else:
    k = next(k for k in range(1, num_workers + 1)
             if num_workers % k == 0 and num_workers // k <= num_devices)
  if num_workers % k or num_workers // k > num_devices:
    raise ValueError(f"workers_per_device={k} is not allowed with num_workers={num_workers} "
                     f"on {num_devices} devices: it must divide num_workers and leave at most "
                     f"{num_devices} devices")
  return k


def make_backend(name: str, num_workers: int, per_device: int = 0) -> Backend:
  """``"simulate"``: ``jax.vmap(..., axis_name="workers")`` on one device; ``"mesh"``:
  ``jax.shard_map`` over a 1-D mesh of the first n / k devices, k workers each
  (:func:`workers_per_device`; ``per_device`` = 0 picks k). With k = 1 the mesh axis is
  ``"workers"``; with k > 1 it is ``"devices"`` and each device runs
  ``vmap(..., axis_name="workers")`` over its k workers: the worker program's axis is the pair
  ``("devices", "workers")`` (:mod:`nbsgd_jax.collectives`). ``"multihost"``: the mesh
  backend over every device of every process (``jax.distributed``, :mod:`nbsgd_jax.multihost`),
  n / devices workers per device; each process holds the workers of its own devices.

  Raises:
    ValueError: unknown backend, or workers that do not fit the devices.
  """
  if name == "simulate":
    return Backend(name, num_workers, None, lambda f: jax.vmap(f, axis_name=AXIS),
                   lambda tree: tree)
  if name not in ("mesh", "multihost"):
    raise ValueError(f"backend={name!r} is not allowed: use one of {list(config_lib.BACKENDS)}")
  devices = jax.devices()
  if name == "multihost":
    nd = len(devices)
    if num_workers % nd or (per_device and per_device * nd != num_workers):
      raise ValueError(
          f"num_workers={num_workers} is not allowed with backend='multihost' on {nd} devices "
          f"({jax.process_count()} processes): every device must hold the same number of "
          f"workers (num_workers a multiple of {nd}"
          + (f", workers_per_device = num_workers / {nd}" if per_device else "") + ")")
    per_device = num_workers // nd
  k = workers_per_device(num_workers, len(devices), per_device)
  axis = DEVICE_AXIS if k > 1 else AXIS
  mesh = jax.make_mesh((num_workers // k,), (axis,), devices=devices[:num_workers // k])
  sharding = NamedSharding(mesh, P(axis))
  replicated = NamedSharding(mesh, P())
  extra = dict(replicate=lambda tree: jax.device_put(tree, replicated))
  if name == "multihost":
    from nbsgd_jax import multihost
    extra["fetch"] = multihost.fetch
  if k > 1:
    def spmd_k(f):
      # check_vma=False: the worker values vary over the vmap axis too, which the
      # varying-axes type system does not track through psum over the axis pair
      return jax.shard_map(jax.vmap(f, axis_name=AXIS), mesh=mesh, in_specs=P(DEVICE_AXIS),
                           out_specs=P(DEVICE_AXIS), check_vma=False)

    return Backend(name, num_workers, mesh, spmd_k,
                   lambda tree: jax.device_put(tree, sharding), (DEVICE_AXIS, AXIS), **extra)

  def spmd(f):
    def local(*args):
      out = f(*jax.tree.map(lambda a: a[0], args))
      return jax.tree.map(lambda a: a[None], out)
    return jax.shard_map(local, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))

  return Backend(name, num_workers, mesh, spmd, lambda tree: jax.device_put(tree, sharding),
                 **extra)


# ----------------------------------------------------------------------------- evaluation


def _chunked(images: np.ndarray, labels: np.ndarray, chunk: int):
  """Pad to a multiple of ``chunk`` and reshape to ``[k, chunk, ...]`` plus a validity mask."""
  n = len(labels)
  k = max(1, -(-n // chunk))
  pad = k * chunk - n
  images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
  labels = np.concatenate([labels, np.zeros((pad,), labels.dtype)])
  mask = np.arange(k * chunk) < n
  return (images.reshape((k, chunk) + images.shape[1:]), labels.reshape(k, chunk),
          mask.reshape(k, chunk))


def _loss_acc(model, params, chunks):
  """Mean cross-entropy and accuracy of one model over ``_chunked`` data."""
  def one(c):
    images, labels, mask = c
    logits = model.apply(params, images.astype(jnp.float32) / 255.0)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    hit = (jnp.argmax(logits, -1) == labels)
    return jnp.sum(ce * mask), jnp.sum(hit * mask)
  ce, hit = lax.map(one, chunks)
  count = jnp.sum(chunks[2])
  return jnp.sum(ce) / count, jnp.sum(hit) / count


def make_train_loss_fn(model) -> Callable:
  """Jitted ``(params [n, ...], train) -> float32`` training loss of the averaged model (the
  ``F`` that ADA-LUPA observes at each synchronisation)."""
  return jax.jit(lambda params, chunks: _loss_acc(model, metrics_lib.average_model(params),
                                                  chunks)[0])


def make_eval_fn(model, decentralized: bool) -> Callable:
  """Jitted ``(params [n, ...], test, train) -> dict`` of float32 scalars.

  ``test`` and ``train`` are ``(images, labels, mask)`` from :func:`_chunked`. Reports loss
  and accuracy of the averaged model, consensus distance and, for decentralized algorithms,
  the mean over workers of each worker's own test accuracy.
  """

  def loss_acc(params, chunks):
    return _loss_acc(model, params, chunks)

  @jax.jit
  def eval_fn(params, test, train):
    avg = metrics_lib.average_model(params)
    test_loss, test_acc = loss_acc(avg, test)
    train_loss, _ = loss_acc(avg, train)
    out = {"train_loss": train_loss, "test_loss": test_loss, "test_accuracy": test_acc,
           "consensus_distance": metrics_lib.consensus_distance(params)}
    if decentralized:
      # lax.map, not vmap: a vmapped convolution over per-worker weights becomes a grouped
      # convolution, which is several times slower on CPU.
      _, accs = lax.map(lambda p: loss_acc(p, test), params)
      out["worker_test_accuracy"] = jnp.mean(accs)
    return out

  return eval_fn


# ----------------------------------------------------------------------------- set-up


def make_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Learning rate per step: optional linear warm-up, then constant or cosine decay to 0."""
  decay_steps = max(cfg.num_steps - cfg.warmup_steps, 1)
  if cfg.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps)
  else:
    main = optax.constant_schedule(cfg.learning_rate)
  if cfg.warmup_steps:
    warm = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warm, main], [cfg.warmup_steps])
  return main


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Local optimizer: L2 weight decay added to the gradient, then SGD with momentum."""
  return optax.chain(
      optax.add_decayed_weights(cfg.weight_decay) if cfg.weight_decay else optax.identity(),
      optax.sgd(make_schedule(cfg), momentum=cfg.momentum or None, nesterov=cfg.nesterov))


def _compressor_options(cfg: ml_collections.ConfigDict) -> dict:
  if cfg.compression.name == "gaussian_k":
    return {"rounds": cfg.compression.gaussian_rounds,
            "correction": cfg.compression.gaussian_correction}
  return {}


def make_algorithm(cfg: ml_collections.ConfigDict, topology: topology_lib.Topology,
                   optimizer: optax.GradientTransformation, plan=None,
                   axis_name=AXIS) -> algos.Algorithm:
  """The :class:`Algorithm` named by ``cfg.algorithm`` (``plan``: MATCHA's, for matcha) on
  the worker axis ``axis_name`` (:attr:`Backend.axis_name`)."""
  ax = axis_name
  # a failed worker finished no mini-batch: the non-blocking (count-weighted) path
  nb = cfg.nonblocking.enabled or bool(cfg.cluster.failures)
  if cfg.algorithm == "allreduce" and cfg.compression.name != "none":
    from nbsgd_jax import compression
    return algos.sparse_allreduce(
        compression.make_compressor(cfg.compression.name, cfg.compression.density,
                                    **_compressor_options(cfg)),
        optimizer, cfg.num_workers, error_feedback=cfg.compression.error_feedback,
        flatten=cfg.compression.flatten, seed=cfg.seed, axis_name=ax)
  if cfg.algorithm == "allreduce":
    return algos.allreduce(optimizer, cfg.num_workers, nonblocking=nb, axis_name=ax)
  if cfg.algorithm == "allreduce_ring":
    return algos.allreduce_ring(optimizer, cfg.num_workers, nonblocking=nb, axis_name=ax)
  if cfg.algorithm in ("dpsgd", "matcha"):
    if cfg.algorithm == "dpsgd":
      phases = ([topology.mixing_matrix_at(t) for t in range(topology.period)]
                if topology.is_time_varying else [topology.mixing_matrix])
      mixer = algos.time_varying_mixer(phases, ax)
    else:
      mixer = algos.matcha_mixer(plan.matchings, plan.alpha, topology.n, ax)
    control = None
    if cfg.consensus.control:
      from nbsgd_jax import consensus
      control = consensus.Control(cfg.consensus.max_gossip_steps, cfg.consensus.measure,
                                  cfg.consensus.sketch_size, cfg.seed,
                                  gradient_stats=cfg.consensus.critical)
    control_mixer = None
    if cfg.algorithm == "matcha":  # extra gossip over the base graph (see gossip_sgd)
      control_mixer = algos.static_mixer(topology.mixing_matrix, ax)
    return algos.gossip_sgd(cfg.algorithm, optimizer, mixer, order=cfg.dpsgd.order,
                            nonblocking=nb, control=control, num_workers=cfg.num_workers,
                            log_consensus=cfg.consensus.log_every_step,
                            control_mixer=control_mixer, axis_name=ax)
  if cfg.algorithm == "local_sgd":
    mixer = None
    if cfg.local_sgd.averaging == "gossip":
      if topology.is_time_varying:
        mixer = algos.time_varying_mixer(
            [topology.mixing_matrix_at(t) for t in range(topology.period)], ax)
      else:
        mixer = algos.static_mixer(topology.mixing_matrix, ax)
    return algos.local_sgd(optimizer, cfg.num_workers, averaging=cfg.local_sgd.averaging,
                           opt_state_sync=cfg.local_sgd.opt_state, mixer=mixer, axis_name=ax)
  if cfg.algorithm == "diloco":
    d = cfg.diloco
    outer = optax.sgd(d.outer_lr, momentum=d.outer_momentum or None,
                      nesterov=bool(d.outer_momentum) and d.outer_nesterov)
    return algos.diloco(optimizer, cfg.num_workers, outer=outer, axis_name=ax)
  raise config_lib.ConfigError(
      [f"config.algorithm={cfg.algorithm!r} is not allowed: use one of "
       f"{list(config_lib.ALGORITHMS)}"])


class Setup(NamedTuple):
  """Everything a run needs, built from a config before any compilation."""

  cfg: ml_collections.ConfigDict
  dataset: data_lib.Dataset
  worker_data: WorkerData
  model: Any
  topology: topology_lib.Topology
  algorithm: algos.Algorithm
  backend: Backend
  plan: Any  # MATCHA's MatchaPlan, or None


def setup(cfg: ml_collections.ConfigDict) -> Setup:
  """Validate the config, load and partition the data, build model, algorithm and backend.

  Raises:
    ConfigError: any bad key, including a ``batch_size`` larger than some worker's shard.
  """
  if cfg.get("backend") == "multihost":  # before anything initializes a JAX backend
    from nbsgd_jax import multihost
    try:
      multihost.initialize()
    except ValueError as e:
      raise config_lib.ConfigError([f"backend='multihost': {e}"]) from None
  config_lib.validate(cfg)
  try:
    dataset = data_lib.load_dataset(cfg.dataset, data_dir=cfg.data_dir or None)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.dataset={cfg.dataset!r}: {e}"]) from None
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
  model = models_lib.make_model(cfg.model, dataset.num_classes, mlp_hidden=cfg.mlp_hidden,
                                cnn_channels=cfg.cnn_channels)
  try:
    topo = topology_lib.make(cfg.topology, n, weights=cfg.mixing_weights, p=cfg.topology_p,
                             seed=cfg.topology_seed, rows=cfg.topology_rows or None,
                             cols=cfg.topology_cols or None)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.topology={cfg.topology!r}: {e}"]) from None
  plan = None
  if cfg.algorithm == "matcha":
    from nbsgd_jax import matcha as matcha_lib
    plan = matcha_lib.plan(topo.n, topo.edges, cfg.matcha.budget)
  try:
    backend = make_backend(cfg.backend, n, cfg.workers_per_device)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.{e}"]) from None
  algorithm = make_algorithm(cfg, topo, make_optimizer(cfg), plan, backend.axis_name)
  if backend.name == "multihost":
    worker_data = _process_local_data(dataset, shards, backend)
  else:
    images, labels, sizes = data_lib.stack_shards(dataset.train_images, dataset.train_labels,
                                                  shards)
    worker_data = WorkerData(*backend.place((jnp.asarray(images), jnp.asarray(labels),
                                             jnp.asarray(sizes))))
  return Setup(cfg, dataset, worker_data, model, topo, algorithm, backend, plan)


def _process_local_data(dataset: data_lib.Dataset, shards: list, backend: Backend) -> WorkerData:
  """The stacked worker data of the multihost backend as global arrays, each process
  gathering only the shards of the workers on its own devices."""
  sharding = NamedSharding(backend.mesh, P(backend.mesh.axis_names[0]))
  n, cap = len(shards), max(len(sh) for sh in shards)
  local: dict = {}

  def rows(index) -> tuple:
    key = index[0].indices(n)
    if key not in local:
      images, labels, sizes = data_lib.stack_shards(
          dataset.train_images, dataset.train_labels, shards[index[0]])
      pad = cap - images.shape[1]  # to the global capacity
      local[key] = (np.pad(images, [(0, 0), (0, pad)] + [(0, 0)] * (images.ndim - 2), "edge"),
                    np.pad(labels, [(0, 0), (0, pad)], "edge"), sizes)
    return local[key]

  shapes = ((n, cap) + dataset.train_images.shape[1:], (n, cap), (n,))
  return WorkerData(*(jax.make_array_from_callback(shape, sharding,
                                                   lambda idx, i=i: rows(idx)[i])
                      for i, shape in enumerate(shapes)))


def init_state(s: Setup) -> TrainState:
  """Identical initial models on every worker (seeded), each with its own optax state."""
  n = s.cfg.num_workers
  sample = jnp.zeros((1,) + s.dataset.train_images.shape[1:], jnp.float32)
  params = s.model.init(jax.random.key(s.cfg.seed), sample)
  params = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), params)
  opt_state = jax.vmap(s.algorithm.init)(params)
  # Own buffers for every leaf: a state that starts as a copy of the params (DiLoCo's anchor)
  # must not alias them, or donating the train state would donate one buffer twice.
  opt_state = jax.tree.map(lambda x: jnp.array(x, copy=True), opt_state)
  return s.backend.place(TrainState(params, opt_state, jnp.zeros((n,), jnp.int32)))


def make_train_step(s: Setup) -> Callable:
  """Jitted ``(state, data, inputs, sync=True) -> (state, (loss [n], bytes_sent [n]))`` on the
  chosen backend (state donated); ``inputs`` from :meth:`Simulator.step` via
  :func:`step_inputs`. ``sync`` matters only for periodic algorithms (local SGD, DiLoCo):
  False runs the local step, True the step that ends a period (two programs, each compiled
  on first use)."""
  def build(sync: bool):
    worker = make_worker_step(s.model, s.algorithm, s.cfg.batch_size,
                              s.worker_data.labels.shape[1], s.cfg.seed,
                              s.cfg.nonblocking.num_minibatches,
                              s.cfg.nonblocking.enabled or bool(s.cfg.cluster.failures),
                              sync=sync, axis_name=s.backend.axis_name)
    return jax.jit(s.backend.spmd(worker), donate_argnums=(0,))

  if s.algorithm.sync_update is None:
    plain = build(False)
    return lambda state, data, inputs, sync=True: plain(state, data, inputs)
  programs = {}

  def step(state, data, inputs, sync=True):
    if sync not in programs:
      programs[sync] = build(bool(sync))
    return programs[sync](state, data, inputs)

  return step


def make_simulator(s: Setup, model_bytes: float):
  """The host schedule and simulated clock of the run (:class:`Simulator`)."""
  from nbsgd_jax import cluster as cluster_lib
  from nbsgd_jax import simulation
  cfg = s.cfg
  message_bytes = model_bytes
  if cfg.compression.name != "none":  # the clock charges the target k values + int32 indices
    from nbsgd_jax import compression
    d = model_bytes // 4
    message_bytes = compression.num_selected(d, cfg.compression.density) * 8.0
  name = cfg.algorithm
  if cfg.compression.name != "none":
    name = "sparse_allgather"
  elif cfg.algorithm in config_lib.PERIODIC:  # charged at the syncs only (Simulator.step)
    gossip = cfg.algorithm == "local_sgd" and cfg.local_sgd.averaging == "gossip"
    name = "dpsgd" if gossip else "allreduce"
    if (cfg.algorithm == "local_sgd" and cfg.local_sgd.opt_state == "average"
        and cfg.momentum):
      message_bytes = 2 * model_bytes  # the momentum buffers travel with the model
  return simulation.Simulator(
      name,
      config_lib.make_cluster(cfg), message_bytes,
      nonblocking=cfg.nonblocking.enabled, deadline=cfg.nonblocking.deadline,
      topology=s.topology, plan=s.plan, matcha_seed=cfg.matcha.seed,
      deadline_group=cfg.nonblocking.deadline_group,
      failures=cluster_lib.parse_failures(cfg.cluster.failures, cfg.num_workers))


def step_inputs(s: Setup, inputs: dict) -> algos.StepInputs:
  """Place the simulator's per-step numpy inputs for the backend (``inputs["target"]``, the
  consensus-control target of every worker, when present)."""
  target, alive = inputs.get("target"), inputs.get("alive")
  return s.backend.place(algos.StepInputs(
      jnp.asarray(inputs["step"]), jnp.asarray(inputs["count"]), jnp.asarray(inputs["active"]),
      None if target is None else jnp.asarray(target, jnp.float32),
      None if alive is None else jnp.asarray(alive)))


# ----------------------------------------------------------------------------- files



class MetricsWriter:
  """Writes one JSON object per line (``metrics.jsonl``), flushed and fsynced each line;
  ``append=True`` continues an existing file (resume)."""

  def __init__(self, path: str, append: bool = False):
    self._f = open(path, "a" if append else "w")

  def write(self, record: dict) -> None:
    self._f.write(json.dumps(record) + "\n")
    self._f.flush()
    os.fsync(self._f.fileno())

  def close(self) -> None:
    self._f.close()


# ----------------------------------------------------------------------------- loop


class TrainingDiverged(RuntimeError):
  """A non-finite loss or model: training stops (the last good checkpoint is kept).

  Attributes:
    step: the step (1-based) whose loss, or the model after which, is not finite.
    workers: the workers concerned.
    what: ``"loss"`` (a step's training loss), ``"model"`` (the parameters), or
      ``"train_loss"`` / ``"test_loss"`` of the averaged model at an evaluation (``workers``
      empty).
  """

  def __init__(self, step: int, workers: list, what: str):
    self.step, self.workers, self.what = int(step), list(workers), what
    shown = self.workers[:16] + (["..."] if len(self.workers) > 16 else [])
    where = f"on worker(s) {shown}" if self.workers else "of the averaged model"
    super().__init__(
        f"training diverged: non-finite {what} at step {self.step} {where}; "
        "lower config.learning_rate or add config.warmup_steps and start a new run in a new "
        "workdir (a resume from the last good checkpoint replays the same steps)")


def _check_same_run(cfg: ml_collections.ConfigDict, workdir: str) -> None:
  """Resuming needs the config of the checkpointed run (``workdir/config.json``).

  Raises:
    ConfigError: naming the keys that differ.
  """
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError):
    return  # no readable record of the old config: trust the checkpoint
  new = json.loads(cfg.to_json_best_effort())

  a, b = config_lib.flatten_dict(old), config_lib.flatten_dict(new)
  diff = sorted(k for k in set(a) | set(b)
                if a.get(k) != b.get(k) and k not in ("progress", "tensorboard"))  # outputs only
  if diff:
    raise config_lib.ConfigError([
        f"config.{k}={b.get(k)!r} is not allowed: workdir {workdir!r} holds checkpoints of a "
        f"run with {k}={a.get(k)!r}; use a new workdir to start another run"
        for k in diff])


def train(cfg: ml_collections.ConfigDict, workdir: str | None = None,
          hooks: tuple = ()) -> dict:
  """Run one training job.

  Writes ``workdir/config.json``, ``workdir/metrics.jsonl`` (one object per evaluation with
  ``step``, ``sim_time`` (s on the simulated cluster, :mod:`nbsgd_jax.simulation`),
  ``wall_time`` s, ``train_loss``, ``train_batch_loss``, ``test_loss``,
  ``test_accuracy``, ``consensus_distance``, ``bytes_sent`` (bytes per worker, cumulative),
  ``rounds`` (communication rounds so far: every step, or the synchronisations of local SGD /
  DiLoCo) and, for decentralized algorithms, ``worker_test_accuracy``) and
  ``workdir/summary.json`` (with ``periods``, the communication periods tau_i, for local SGD
  and DiLoCo). ``wall_time`` counts the training steps (compilation included) and excludes
  evaluation and ADA-LUPA's loss measurements.

  Args:
    cfg: a config from :func:`nbsgd_jax.config.default_config` (possibly changed).
    workdir: output directory (created), or None to write nothing.
    hooks: callables ``hook(step, state, setup)`` run on the host before step ``step``
      (0-based) with the state after ``step`` steps (and once more after the last step,
      with ``step = num_steps``); for measurements such as
      ``experiments/reproduce_sparsification.py``'s gradient probes. A hook must not keep
      ``state`` (its buffers are donated to the next step) and should block on what it
      computes; its time is not counted in ``wall_time``. On the mesh backend every hook
      synchronizes the in-flight steps first.

  Returns:
    the summary dict (last evaluation plus run facts).

  Raises:
    ConfigError: bad configuration, before anything is compiled.
  """
  with contextlib.ExitStack() as stack:  # checkpoint manager and writers closed on any exit
    return _run(cfg, workdir, hooks, stack)


def _run(cfg: ml_collections.ConfigDict, workdir: str | None, hooks: tuple,
         stack: contextlib.ExitStack) -> dict:
  """:func:`train`'s body; every resource it opens is closed by ``stack``."""
  from tqdm.auto import tqdm

  s = setup(cfg)
  cs = cfg.consensus
  targets = critical = None  # built before any file is touched: they may refuse the config
  if cs.control:
    from nbsgd_jax import consensus as consensus_lib
    try:
      if cs.critical:
        critical = consensus_lib.CriticalTarget(cfg.num_workers, cs.critical_scale,
                                                cs.smoothness, cs.until_step,
                                                cs.critical_ema)
      else:
        targets = consensus_lib.TargetSchedule(cs.target, cs.target_ratio,
                                               cs.reference_workdir, cs.until_step)
    except ValueError as e:
      raise config_lib.ConfigError([f"config.{e}"]) from None
  if cfg.tensorboard and workdir:
    try:
      import tensorboardX  # noqa: F401  (the writer's dependency)
    except ImportError:
      raise config_lib.ConfigError([
          "config.tensorboard=True needs the tensorboardX package: pip install tensorboardX"
      ]) from None
  ckpt, resume_step = None, None
  if workdir and cfg.checkpoint_every:
    from nbsgd_jax import checkpoint as checkpoint_lib
    ckpt = checkpoint_lib.Checkpointer(workdir)  # every process takes part
    stack.callback(ckpt.close)
    resume_step = ckpt.latest_step()
    if resume_step is not None:
      _check_same_run(cfg, workdir)
      if jax.process_index() == 0:
        print(f"resuming from the checkpoint of step {resume_step} in {ckpt.directory}",
              file=sys.stderr, flush=True)
  checkpoint_dir = workdir
  if jax.process_index() != 0:  # multihost: process 0 writes the run's files
    workdir = None
  writer = tb = None
  resumed_history: list = []
  if resume_step is not None and not workdir:  # the history of the records on disk
    resumed_history = checkpoint_lib.read_records(
        os.path.join(checkpoint_dir, "metrics.jsonl"), resume_step)
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    files_lib.atomic_write(os.path.join(workdir, "config.json"), cfg.to_json_best_effort(indent=2))
    path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is not None:  # drop the records after the checkpoint (and a torn line)
      resumed_history = checkpoint_lib.truncate_records(path, resume_step)
      checkpoint_lib.truncate_records(os.path.join(workdir, "steps.jsonl"), resume_step)
    else:  # a new run: no stale file of an earlier run in this workdir
      for stale in ("summary.json", "steps.jsonl"):
        if os.path.exists(os.path.join(workdir, stale)):
          os.remove(os.path.join(workdir, stale))
    writer = stack.enter_context(contextlib.closing(
        MetricsWriter(path, append=resume_step is not None)))
    if cfg.tensorboard:  # the same scalars as TensorBoard event files
      from nbsgd_jax import tensorboard as tensorboard_lib
      tb = stack.enter_context(contextlib.closing(tensorboard_lib.TensorBoardWriter(
          os.path.join(workdir, "tensorboard"),
          purge_step=None if resume_step is None else resume_step + 1)))
  step_writer = None
  if workdir and (cs.log_every_step or cs.control):
    step_writer = stack.enter_context(contextlib.closing(MetricsWriter(
        os.path.join(workdir, "steps.jsonl"), append=resume_step is not None)))

  state = init_state(s)
  step_fn = make_train_step(s)
  eval_fn = make_eval_fn(s.model, s.algorithm.decentralized)
  finite_fn = jax.jit(lambda params: jnp.all(jnp.stack([
      jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
      for x in jax.tree.leaves(params)]), axis=0))
  ds = s.dataset
  test = _chunked(ds.test_images, ds.test_labels, 500)
  sub = np.random.default_rng(cfg.seed).permutation(len(ds.train_labels))
  sub = sub[:min(cfg.eval_train_examples, len(sub))]
  train_sub = _chunked(ds.train_images[sub], ds.train_labels[sub], 500)
  test, train_sub = s.backend.replicate(test), s.backend.replicate(train_sub)

  # from shapes: indexing a worker out of a mesh-sharded array would need a gather
  model_params = int(sum(np.prod(x.shape[1:]) for x in jax.tree.leaves(state.params)))
  model_bytes = int(sum(np.prod(x.shape[1:]) * x.dtype.itemsize
                        for x in jax.tree.leaves(state.params)))
  sim = make_simulator(s, model_bytes)
  planner = None
  if s.algorithm.sync_update is not None:
    from nbsgd_jax import local_sgd as local_sgd_lib
    planner = local_sgd_lib.make_planner(cfg)
    train_loss_fn = make_train_loss_fn(s.model)
  rounds = 0
  extra_gossip = 0  # consensus control's extra gossip steps, all steps
  smoothness_fn = None
  if cs.control:
    control = consensus_lib.Control(cs.max_gossip_steps, cs.measure, cs.sketch_size, cfg.seed)
    one_measure = consensus_lib.measure_bytes(model_bytes, cfg.num_workers, control)
  if critical is not None:
    stats_bytes = consensus_lib.gradient_stats_bytes(cfg.num_workers, control)
    schedule = make_schedule(cfg)
    if not cs.smoothness:  # L of the averaged model on the fixed training examples
      smoothness_fn = jax.jit(lambda params, chunks: consensus_lib.smoothness_estimate(
          lambda p: _loss_acc(s.model, p, chunks)[0], metrics_lib.average_model(params),
          cs.smoothness_iters, cfg.seed) + cfg.weight_decay)

  def target_at(step: int) -> float:
    """The target Xi of (0-based) ``step`` (inf: control off at that step)."""
    if critical is not None:
      return critical.at(step, float(schedule(step)) / (1.0 - cfg.momentum))
    return targets.at(step)

  history = []
  step_targets, step_smoothness = {}, {}  # per step, until written to steps.jsonl
  wall = 0.0
  bytes_total = 0.0  # float64 on the host
  # Per-step outputs stay on the device until the next evaluation. They are not reduced
  # step by step: on the mesh backend a reduction is an extra collective program, and
  # interleaving it with in-flight steps can starve XLA:CPU's collective rendezvous.
  pending: list = []

  def evaluate(step: int) -> dict:
    nonlocal bytes_total
    fetch = s.backend.fetch
    losses = np.array([fetch(l).astype(np.float64) for _, (l, _, _) in pending])  # [steps, n]
    if losses.size and not np.all(np.isfinite(losses)):
      t, _ = np.argwhere(~np.isfinite(losses))[0]
      bad = np.flatnonzero(~np.isfinite(losses[t])).tolist()
      raise TrainingDiverged(pending[t][0], bad, "loss")
    sent = np.array([fetch(b).astype(np.float64) for _, (_, b, _) in pending])  # [steps, n]
    bytes_total += float(sent.mean(axis=1).sum()) if pending else 0.0
    # every process fetches (an all-gather on the multihost backend), process 0 writes
    auxes = [{k: float(fetch(v)[0]) for k, v in aux.items()}  # the same on every worker
             for _, (_, _, aux) in pending] if (cs.log_every_step or cs.control) else []
    if step_writer is not None:
      for i, (t, _) in enumerate(pending):
        srec = {"step": t, "train_batch_loss": float(losses[i].mean())}
        srec.update(auxes[i])
        if srec.get("measurements") == 0:  # control off at this step: nothing measured
          srec["measured_consensus_distance"] = None
          for k in ("grad_sq", "grad_noise"):
            if k in srec:
              srec[k] = None
        if cs.control:  # None: no binding target (control off, or no estimate yet)
          target = step_targets.pop(t)
          srec["target"] = target if target < consensus_lib.NO_CONSTRAINT else None
        if critical is not None:
          srec["smoothness"] = step_smoothness.pop(t)
        step_writer.write(srec)
    pending.clear()
    step_targets.clear()
    step_smoothness.clear()
    params = state.params
    if s.backend.mesh is not None:  # evaluation reads whole models: replicate the stack once
      params = s.backend.replicate(params)
    finite = np.asarray(finite_fn(params))
    if not finite.all():
      raise TrainingDiverged(step, np.flatnonzero(~finite).tolist(), "model")
    ev = {k: float(v) for k, v in eval_fn(params, test, train_sub).items()}
    bad = [k for k in ("train_loss", "test_loss") if not math.isfinite(ev.get(k, 0.0))]
    if bad:  # finite workers whose average overflows the loss
      raise TrainingDiverged(step, [], bad[0])
    rec = {"step": step, "sim_time": sim.sim_time, "wall_time": wall,
           "train_batch_loss": float(losses.mean()) if losses.size else None,
           **ev, "bytes_sent": bytes_total, "rounds": rounds}
    if cs.control:
      rec["extra_gossip_steps"] = extra_gossip
    if cs.per_layer:
      rec["consensus_distance_layers"] = {
          k: float(v) for k, v in metrics_lib.consensus_distance_per_layer(params).items()}
    history.append(rec)
    if writer:
      writer.write(rec)
      if tb:
        tb.write(rec)
    return rec

  def host_state() -> dict:
    return {"clocks": sim.clocks.tolist(), "bytes_total": bytes_total, "wall": wall,
            "rounds": rounds, "extra_gossip": extra_gossip,
            "planner": planner.state_dict() if planner is not None else None,
            "critical": critical.state_dict() if critical is not None else None}

  start = 0
  if resume_step is not None:
    state, host = ckpt.restore(resume_step, state)
    sim.clocks = np.asarray(host["clocks"], np.float64)
    bytes_total, wall = host["bytes_total"], host["wall"]
    rounds, extra_gossip = host["rounds"], host["extra_gossip"]
    if planner is not None:
      planner.load_state_dict(host["planner"])
    if critical is not None:
      critical.load_state_dict(host["critical"])
    history.extend(resumed_history)
    start = resume_step

  bar = stack.enter_context(tqdm(
      total=cfg.num_steps, initial=start, disable=not cfg.progress or jax.process_index() != 0,
      desc=cfg.algorithm, unit="step", dynamic_ncols=True, mininterval=1.0))
  if resume_step is None:
    rec = evaluate(0)
    if planner is not None and planner.needs_loss:
      planner.observe(rec["train_loss"])
  else:
    rec = history[-1]
  seg = time.perf_counter()  # stopwatch over training steps; paused during evaluation

  def run_hooks(step: int) -> None:
    nonlocal seg, wall
    if hooks:
      jax.block_until_ready(state)
      wall += time.perf_counter() - seg
      for hook in hooks:
        hook(step, state, s)
      seg = time.perf_counter()

  def off_clock(fn):
    """``fn(params)`` on the whole stacked models (replicated on a mesh), outside the
    stopwatch: host-side measurements are not training time."""
    nonlocal seg, wall
    jax.block_until_ready(state)
    wall += time.perf_counter() - seg
    out = fn(state.params if s.backend.mesh is None else s.backend.replicate(state.params))
    seg = time.perf_counter()
    return out

  for step in range(start + 1, cfg.num_steps + 1):
    run_hooks(step - 1)
    sync = planner.sync_now(step - 1) if planner is not None else True
    rounds += int(sync)
    inputs, _ = sim.step(step - 1, communicate=sync)
    if (smoothness_fn is not None and (step - 1) % cs.smoothness_every == 0
        and (not cs.until_step or step - 1 < cs.until_step)):  # L only while controlled
      critical.set_smoothness(off_clock(lambda p: float(smoothness_fn(p, train_sub))))
    if cs.control:
      target = target_at(step - 1)
      step_targets[step] = target
      if critical is not None:
        step_smoothness[step] = critical.smoothness
      inputs["target"] = np.full(cfg.num_workers, target, np.float32)
    state, out = step_fn(state, s.worker_data, step_inputs(s, inputs), sync)
    pending.append((step, out))
    if cs.control:  # the extra gossip decided on the device enters the clock
      k = int(s.backend.fetch(out[2]["gossip_steps"])[0])
      m = int(s.backend.fetch(out[2]["measurements"])[0])
      extra_gossip += k
      sim.extra(step - 1, k, m, one_measure)
      if critical is not None and m > 0:  # the gradient sketch all-reduce
        critical.observe(float(s.backend.fetch(out[2]["grad_sq"])[0]),
                         float(s.backend.fetch(out[2]["grad_noise"])[0]))
        sim.extra(step - 1, 0, 1, stats_bytes)
    if sync and planner is not None and planner.needs_loss:
      planner.observe(off_clock(lambda p: float(train_loss_fn(p, train_sub))))
    if step % cfg.eval_every == 0 or step == cfg.num_steps:
      jax.block_until_ready(state)
      wall += time.perf_counter() - seg
      rec = evaluate(step)
      bar.set_postfix(loss=f"{rec['train_loss']:.4f}", acc=f"{rec['test_accuracy']:.4f}")
      if ckpt is not None and step % cfg.checkpoint_every == 0 and step < cfg.num_steps:
        ckpt.save(step, state, host_state())
      seg = time.perf_counter()
    bar.update(1)
  run_hooks(cfg.num_steps)

  summary = {**rec, "algorithm": cfg.algorithm, "num_workers": cfg.num_workers,
             "backend": cfg.backend, "model": cfg.model, "dataset": cfg.dataset,
             "model_params": model_params, "rounds": rounds,
             **({"periods": planner.periods} if planner is not None else {}),
             "bytes_per_step": bytes_total / cfg.num_steps if cfg.num_steps else 0.0,
             "samples_per_second": (cfg.num_steps * cfg.batch_size * cfg.num_workers / wall
                                    if wall > 0 else None)}
  if workdir:
    files_lib.atomic_write(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2))
  summary["history"] = history
  return summary
