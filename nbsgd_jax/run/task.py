"""The classification task: each worker's data shard, its batches and the loss.

Every leaf of the stacked worker data has a leading worker axis ``[n, ...]``; a worker's batch
at step t is drawn inside the worker program (:func:`worker_batch`), deterministic in
``(seed, worker, step)`` so a resumed run sees the same data order.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax import data as data_lib
from nbsgd_jax.data import augment
from nbsgd_jax.core import metrics as metrics_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax.models import problems as problems_lib
from nbsgd_jax import transforms
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.run import evaluation as ev


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


def augment_key(seed: int, worker: jax.Array | int, step: jax.Array) -> jax.Array:
  """The key of worker ``worker``'s input augmentation at ``step``: a stream of the data key
  that the batch permutations (folded with epoch numbers < 2^31 - 1) never use."""
  return jax.random.fold_in(jax.random.fold_in(data_key(seed, worker), 2**31 - 1), step)


def worker_batch(data: WorkerData, seed: int, batch_size: int, capacity: int,
                 step: jax.Array, axis_name=AXIS) -> tuple[jax.Array, jax.Array]:
  """This worker's training batch at ``step`` (inside the worker program on ``axis_name``).

  Returns:
    images ``[B, H, W, C]`` as stored (uint8) and int labels ``[B]``, rows drawn by
    :func:`sample_batch_indices` with the worker's :func:`data_key`.
  """
  idx = sample_batch_indices(data_key(seed, lax.axis_index(axis_name)), data.sizes, capacity,
                             batch_size, step)
  return data.images[idx], data.labels[idx]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy (nats) of logits ``[B, C]`` against int labels ``[B]``."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def process_local_data(dataset: data_lib.Dataset, shards: list, backend) -> WorkerData:
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


def place_rows(rows: np.ndarray, backend) -> jax.Array:
  """``rows [n, ...]`` (the same on every process) as the backend's worker-sharded array; on
  the multihost backend each process places only the rows of its own workers."""
  if backend.name != "multihost":
    return backend.place(jnp.asarray(rows))
  sharding = NamedSharding(backend.mesh, P(backend.mesh.axis_names[0]))
  return jax.make_array_from_callback(rows.shape, sharding, lambda idx: rows[idx])


# ----------------------------------------------------------------------------- tasks


class Task(NamedTuple):
  """What a run trains on: the workers' data, the loss, the batches and the evaluation.

  Attributes:
    name: ``"classification"``, ``"least_squares"`` or ``"logistic"``.
    worker_data: the stacked worker data (leaves ``[n, ...]``), placed for the backend.
    init: ``(seed=None) -> (params, model_state)`` of one worker (identical on every
      worker; ``seed``: an int32 scalar, traceable, None: ``config.seed``); ``model_state`` is
      what the model carries besides its parameters (BatchNorm's running statistics; ``{}``
      or ``()`` when none): kept per worker, never communicated. Pure: jitted whole at
      start-up (:func:`nbsgd_jax.run.setup.init_state`), so it builds its input sample
      inside.
    loss_fn: ``(params, model_state, batch) -> (loss, model_state)``: the float32 training
      loss of a batch and the model state after it.
    batch: ``(data, step, axis_name, seed=None) -> batch``: this worker's batch at ``step``
      inside the worker program (``data``: this worker's slice of ``worker_data``; ``seed``:
      the run's seed, an int32 array from the step's hparams, or None: ``config.seed``).
    eval_data: the data of the evaluations, replicated on the backend's devices.
    evaluate: ``(params [n, ...], model_state [n, ...], eval_data) -> dict`` of floats:
      ``train_loss`` and ``consensus_distance`` always, ``test_loss`` / ``test_accuracy`` /
      ``worker_test_accuracy`` (classification, language model) or ``gap`` = F(x_bar) - F*
      (synthetic).
    train_loss: ``(params [n, ...], model_state [n, ...], eval_data) -> float``, F of the
      averaged model (ADA-LUPA).
    point_loss: ``(params of one model, model_state of one model, eval_data) -> float32``
      (jax), the loss whose Hessian the smoothness estimate uses.
    facts: run facts for ``summary.json`` (e.g. ``f_star``).
  """

  name: str
  worker_data: Any
  init: Callable[[], tuple]
  loss_fn: Callable[[Any, Any, Any], tuple]
  batch: Callable[[Any, jax.Array, Any], Any]
  eval_data: Any
  evaluate: Callable[[Any, Any, Any], dict]
  train_loss: Callable[[Any, Any, Any], float]
  point_loss: Callable[[Any, Any, Any], jax.Array]
  facts: dict


def train_loss_examples(num: int, count: int, seed: int) -> np.ndarray:
  """The indices (int ``[min(count, num)]``) of the training examples behind ``train_loss``:
  a uniform sample without replacement from a stream of its own
  (``SeedSequence(seed, spawn_key=(2,))``). It must not share the partition's stream
  (``default_rng(seed)``): the first draws of that permutation are workers 0 and 1's iid
  shards, so the loss would be measured on their data only."""
  rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,)))
  return rng.permutation(num)[:min(count, num)]


def eval_examples(num: int, cfg, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
  """``(test, worker_test)``: the indices of the test examples behind the averaged model's
  ``test_loss`` / ``test_accuracy`` and behind ``worker_test_accuracy``, the same at every
  evaluation of a run. ``test``: all ``num`` in order when ``config.eval_test_examples`` is
  0 or at least ``num``, else that many drawn uniformly without replacement from a stream of
  their own (``SeedSequence(seed, spawn_key=(3,))``: the test split may be sorted by label).
  ``worker_test``: ``config.eval_worker_examples`` of ``test`` (0: auto, ``ceil(len(test) /
  n)`` but at least 100, so that n workers' own models cost about one pass of the averaged
  model's), the first of a fixed shuffle of ``test`` (the same stream), so a uniform sample
  of it even where the test split is sorted by label; both sorted."""
  want = cfg.eval_test_examples
  if 0 < want < num:
    rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(3,)))
    test = np.sort(rng.permutation(num)[:want])
    order = rng.permutation(len(test))
  else:
    test = np.arange(num)
    order = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(3,))
                                  ).permutation(num)
  per_worker = cfg.eval_worker_examples or max(100, -(-len(test) // num_workers))
  return test, np.sort(test[order[:min(per_worker, len(test))]])


def classification_task(cfg, dataset: data_lib.Dataset, worker_data: WorkerData, model,
                        backend, decentralized: bool, memo=None) -> Task:
  """Image classification with a flax model: cross-entropy on batches drawn without
  replacement (:func:`worker_batch`), preprocessed on the device (:func:`image_inputs`);
  evaluation of the averaged model (parameters and model state averaged over the workers) on
  the test set and on ``eval_train_examples`` fixed training examples
  (:func:`train_loss_examples`). ``memo(name, make)``: the run's cache of compiled functions
  (:class:`nbsgd_jax.run.step.ProgramCache`; None: made anew)."""
  capacity = worker_data.labels.shape[1]
  sub = train_loss_examples(len(dataset.train_labels), cfg.eval_train_examples, cfg.seed)
  test, mine = eval_examples(len(dataset.test_labels), cfg, cfg.num_workers)
  eval_data = backend.replicate((
      ev.chunked(dataset.test_images[test], dataset.test_labels[test], 500),
      ev.chunked(dataset.train_images[sub], dataset.train_labels[sub], 500),
      ev.chunked(dataset.test_images[mine], dataset.test_labels[mine], 500)))
  if data_lib.is_images(dataset.train_images):
    train_input, eval_input = image_inputs(cfg, dataset.name, dataset.train_images)
  else:  # features of the user's own data go to the model as they are
    train_input, eval_input = (lambda key, x: x), (lambda x: x)
  apply = lambda p, ms, images: models_lib.apply_eval(model, p, ms, eval_input(images))
  memo = memo or (lambda name, make: make())
  eval_fn = memo("eval", lambda: ev.make_eval_fn(apply, decentralized and
                                                 cfg.eval_worker_accuracy))
  loss_fn_avg = memo("train_loss", lambda: ev.make_train_loss_fn(apply))
  sample_shape = (1,) + dataset.train_images.shape[1:]
  sample_dtype = dataset.train_images.dtype

  def loss_fn(params, model_state, batch):
    x, y = batch
    logits, model_state = models_lib.apply_train(model, params, model_state, x)
    return cross_entropy(logits, y), model_state

  def batch(data, step, axis, seed=None):
    seed = cfg.seed if seed is None else seed
    images, labels = worker_batch(data, seed, cfg.batch_size, capacity, step, axis)
    return train_input(augment_key(seed, lax.axis_index(axis), step), images), labels

  return Task(
      "classification", worker_data,
      init=lambda seed=None: models_lib.init(
          model, jax.random.key(cfg.seed if seed is None else seed),
          eval_input(jnp.zeros(sample_shape, sample_dtype))),
      loss_fn=loss_fn, batch=batch, eval_data=eval_data,
      evaluate=lambda params, ms, d: {k: float(v) for k, v in eval_fn(params, ms, *d).items()},
      train_loss=lambda params, ms, d: float(loss_fn_avg(params, ms, d[1])),
      point_loss=lambda p, ms, d: ev.loss_acc(apply, p, ms, d[1])[0],
      facts={})


def image_inputs(cfg, dataset_name: str, train_images: np.ndarray) -> tuple[Callable, Callable]:
  """``(train_input, eval_input)``: uint8 images ``[B, H, W, C]`` to the model's float32
  input, for training ``(key, images)`` (with ``config.augment``'s random crop with zero
  padding and horizontal flip, drawn from ``key``) and for evaluation ``(images)`` (no
  augmentation). Pixels are scaled to [0, 1], then normalised per channel when
  ``augment.normalize`` is set, with ``augment.stats``: ``"auto"`` the data set's published
  statistics (:data:`nbsgd_jax.data.augment.CHANNEL_STATS`) or, for a data set without them, those
  of ``train_images [N, H, W, C]``; ``"data"`` always the latter; a name those of that set
  (:mod:`nbsgd_jax.data.augment`).

  Raises:
    ValueError: named statistics whose channel count differs from the images'.
  """
  a = cfg.augment
  channels = train_images.shape[-1]
  mean, std = (0.0,) * channels, (1.0,) * channels  # x / 255
  if a.normalize:
    name = dataset_name if a.stats == "auto" else a.stats
    if a.stats == "data" or (a.stats == "auto" and name not in augment.CHANNEL_STATS):
      mean, std = augment.data_stats(train_images)
    else:
      mean, std = augment.channel_stats(name)
    if len(mean) != channels:
      raise ValueError(f"config.augment.stats={a.stats!r}: {len(mean)} channel statistics for "
                       f"images with {channels} channels: use 'data' or 'auto'")
  return (augment.make_augment(a.crop_padding, a.flip, mean, std),
          lambda images: augment.normalize(images, mean, std))


def text_windows(tokens: np.ndarray, context: int, count: int) -> tuple[np.ndarray, np.ndarray]:
  """Up to ``count`` consecutive non-overlapping windows of ``tokens [N]``: inputs int32
  ``[k, T]`` and their next tokens ``[k, T]`` (``T = context``, ``k = min(count,
  (N - 1) // T)``)."""
  k = min(count, (len(tokens) - 1) // context)
  x = tokens[:k * context].reshape(k, context)
  y = tokens[1:k * context + 1].reshape(k, context)
  return x.astype(np.int32), y.astype(np.int32)


def text_batch(tokens: jax.Array, seed: int, batch_size: int, context: int, step: jax.Array,
               axis_name=AXIS) -> tuple[jax.Array, jax.Array]:
  """This worker's language-model batch at ``step``: ``batch_size`` windows of ``context``
  tokens starting at offsets drawn uniformly (with replacement) from its contiguous shard
  ``tokens [L]``, and their next tokens; deterministic in ``(seed, worker, step)``.

  Returns:
    int32 inputs ``[B, T]`` and targets ``[B, T]``.
  """
  key = jax.random.fold_in(data_key(seed, lax.axis_index(axis_name)), step)
  start = jax.random.randint(key, (batch_size,), 0, tokens.shape[0] - context)
  idx = start[:, None] + jnp.arange(context)[None, :]
  return tokens[idx], tokens[idx + 1]


def language_model_task(cfg, dataset, worker_tokens: jax.Array, model, backend,
                        decentralized: bool, memo=None) -> Task:
  """Character-level language modelling with a flax model (``config.model="transformer"``):
  mean next-token cross-entropy (nats per character) on windows drawn by
  :func:`text_batch`; evaluation of the averaged model on the test split's consecutive
  windows (``test_loss``; ``test_accuracy``: next-character accuracy) and on
  ``eval_train_examples`` windows of the training split (``train_loss``)."""
  t = cfg.lm.context
  windows = text_windows(dataset.test_tokens, t, max(1, len(dataset.test_tokens) // t))
  test, mine = eval_examples(len(windows[0]), cfg, cfg.num_workers)
  train = text_windows(dataset.train_tokens, t, cfg.eval_train_examples)
  eval_data = backend.replicate((ev.chunked(*(w[test] for w in windows), 64),
                                 ev.chunked(*train, 64),
                                 ev.chunked(*(w[mine] for w in windows), 64)))
  apply = lambda p, ms, x: models_lib.apply_eval(model, p, ms, x)
  memo = memo or (lambda name, make: make())
  eval_fn = memo("eval", lambda: ev.make_eval_fn(apply, decentralized and
                                                 cfg.eval_worker_accuracy))
  loss_fn_avg = memo("train_loss", lambda: ev.make_train_loss_fn(apply))

  def loss_fn(params, model_state, batch):
    x, y = batch
    logits, model_state = models_lib.apply_train(model, params, model_state, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), model_state

  return Task(
      "language_model", worker_tokens,
      init=lambda seed=None: models_lib.init(
          model, jax.random.key(cfg.seed if seed is None else seed),
          jnp.zeros((1, t), jnp.int32)),
      loss_fn=loss_fn,
      batch=lambda data, step, axis, seed=None: text_batch(
          data, cfg.seed if seed is None else seed, cfg.batch_size, t, step, axis),
      eval_data=eval_data,
      evaluate=lambda params, ms, d: {k: float(v) for k, v in eval_fn(params, ms, *d).items()},
      train_loss=lambda params, ms, d: float(loss_fn_avg(params, ms, d[1])),
      point_loss=lambda p, ms, d: ev.loss_acc(apply, p, ms, d[1])[0],
      facts={"vocab_size": dataset.vocab_size})


def synthetic_task(cfg, problem, backend) -> Task:
  """A synthetic PL problem (:mod:`nbsgd_jax.models.problems`) with its known optimum: batches of
  ``batch_size`` drawn uniformly with replacement from the worker's shard (i.i.d. unbiased
  stochastic gradients, as in the analysis of Haddadpour et al. 2019); evaluation: F of the
  averaged model in float64 and the gap ``F - F*``."""
  m = problem.features.shape[1]
  loss_fn = problems_lib.loss_fn(problem)
  worker_data = backend.place((jnp.asarray(problem.features), jnp.asarray(problem.targets)))
  eval_data = backend.replicate(tuple(jnp.asarray(a) for a in problems_lib.global_batch(problem)))

  def batch(data, step, axis, seed=None):
    feats, targs = data
    if cfg.problem.full_batch:  # the exact local gradient: every example of the shard
      return feats, targs
    seed = cfg.seed if seed is None else seed
    key = jax.random.fold_in(data_key(seed, lax.axis_index(axis)), step)
    idx = jax.random.randint(key, (cfg.batch_size,), 0, m)
    return feats[idx], targs[idx]

  def objective(params) -> float:
    w = np.asarray(backend.fetch(params["w"]), np.float64)
    return problems_lib.objective(problem, w.mean(axis=0))

  def evaluate(params, model_state, d):
    del model_state, d
    f = objective(params)
    return {"train_loss": f, "gap": f - problem.f_star,
            "consensus_distance": float(backend.fetch(metrics_lib.consensus_distance(params)))}

  return Task(
      problem.name, worker_data,
      init=lambda seed=None: (problems_lib.init_params(problem), ()),
      loss_fn=transforms.stateless(loss_fn), batch=batch, eval_data=eval_data,
      evaluate=evaluate, train_loss=lambda params, ms, d: objective(params),
      point_loss=lambda p, ms, d: loss_fn(p, d), facts={"f_star": problem.f_star})
