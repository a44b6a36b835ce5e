"""The run's data and model, read and checked against the config before anything is
compiled: the given ones (:func:`_check_given`), the data set (:func:`_load`: given,
registered, text or images, with its validation split), its shards over the workers
(:func:`_partition`) or the synthetic problem (:func:`_problem`), and the model
(:func:`_model`, a model not built in checked by :func:`_check_model`). Each failure is a
:class:`~nbsgd_jax.config.ConfigError` naming the key; :mod:`nbsgd_jax.run.setup` builds the
run from them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from nbsgd_jax import config as config_lib
from nbsgd_jax import data as data_lib
from nbsgd_jax.models import forms as forms_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax.models import problems as problems_lib


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
  """The run's data set (:func:`_read`), with ``config.validation_examples`` held out of its
  training split as the split it is evaluated on (:func:`nbsgd_jax.data.hold_out`).

  Raises:
    ConfigError: as :func:`_read`; more validation examples than the training split allows.
  """
  dataset = _read(cfg, data)
  if not cfg.validation_examples:
    return dataset
  try:
    return data_lib.hold_out(dataset, cfg.validation_examples)
  except ValueError as e:
    raise config_lib.ConfigError([f"config.{e}"]) from None


def _read(cfg, data):
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
                                        data_path=cfg.data_path or None,
                                        unknown_id=cfg.text_unknown_id)
    return data_lib.load_dataset(cfg.dataset, data_dir=cfg.data_dir or None,
                                 data_path=cfg.data_path or None,
                                 cache_dir=cfg.data_cache or None, progress=bool(cfg.progress))
  except ValueError as e:
    raise config_lib.ConfigError([f"{where}: {e}"]) from None


def _model(cfg, model, num_classes: int, forms: forms_lib.Forms):
  """The given module, a registered model's or a built-in one (in the run's ``forms``)."""
  if model is not None:
    return model
  if cfg.model in models_lib.REGISTRY:
    return models_lib.REGISTRY[cfg.model](num_classes, cfg)
  return models_lib.make_model(cfg.model, num_classes, mlp_hidden=cfg.mlp_hidden,
                               cnn_channels=cfg.cnn_channels, norm=cfg.norm,
                               norm_groups=cfg.norm_groups, dtype=cfg.compute_dtype,
                               lm=cfg.lm, depth=cfg.resnet_depth, conv_impl=forms.conv_impl,
                               pool_impl=forms.pool_impl, residuals=forms.residuals)


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
  regrouped to ``num_workers`` (:func:`nbsgd_jax.models.problems.regroup`).

  Raises:
    ConfigError: a batch larger than a worker's examples, or a bad problem (named).
  """
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
