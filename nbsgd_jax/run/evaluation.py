"""Evaluation of the averaged model (and of each worker's own), off the training clock."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from nbsgd_jax import metrics as metrics_lib


def chunked(images: np.ndarray, labels: np.ndarray, chunk: int):
  """Pad to a multiple of ``chunk`` and reshape to ``[k, chunk, ...]`` plus a validity mask."""
  n = len(labels)
  k = max(1, -(-n // chunk))
  pad = k * chunk - n
  images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
  labels = np.concatenate([labels, np.zeros((pad,), labels.dtype)])
  mask = np.arange(k * chunk) < n
  return (images.reshape((k, chunk) + images.shape[1:]), labels.reshape(k, chunk),
          mask.reshape(k, chunk))


def loss_acc(model, params, chunks):
  """Mean cross-entropy and accuracy of one model over ``chunked`` data."""
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
  return jax.jit(lambda params, chunks: loss_acc(model, metrics_lib.average_model(params),
                                                  chunks)[0])


def make_eval_fn(model, decentralized: bool) -> Callable:
  """Jitted ``(params [n, ...], test, train) -> dict`` of float32 scalars.

  ``test`` and ``train`` are ``(images, labels, mask)`` from :func:`chunked`. Reports loss
  and accuracy of the averaged model, consensus distance and, for decentralized algorithms,
  the mean over workers of each worker's own test accuracy.
  """

  def of(params, chunks):
    return loss_acc(model, params, chunks)

  @jax.jit
  def eval_fn(params, test, train):
    avg = metrics_lib.average_model(params)
    test_loss, test_acc = of(avg, test)
    train_loss, _ = of(avg, train)
    out = {"train_loss": train_loss, "test_loss": test_loss, "test_accuracy": test_acc,
           "consensus_distance": metrics_lib.consensus_distance(params)}
    if decentralized:
      # lax.map, not vmap: a vmapped convolution over per-worker weights becomes a grouped
      # convolution, which is several times slower on CPU.
      _, accs = lax.map(lambda p: of(p, test), params)
      out["worker_test_accuracy"] = jnp.mean(accs)
    return out

  return eval_fn


def make_finite_fn() -> Callable:
  """Jitted ``params [n, ...] -> bool [n]``: whether every parameter of each worker is finite."""
  return jax.jit(lambda params: jnp.all(jnp.stack([
      jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
      for x in jax.tree.leaves(params)]), axis=0))


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
