"""Evaluation of the averaged model (and of each worker's own), off the training clock."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from nbsgd_jax.core import metrics as metrics_lib


def chunked(images: np.ndarray, labels: np.ndarray, chunk: int):
  """Pad to a multiple of ``chunk`` and reshape to ``[k, chunk, ...]`` plus a validity mask
  ``[k, chunk]`` (``labels`` may have trailing axes: a language model's ``[N, T]``)."""
  n = len(labels)
  k = max(1, -(-n // chunk))
  pad = k * chunk - n
  images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
  labels = np.concatenate([labels, np.zeros((pad,) + labels.shape[1:], labels.dtype)])
  mask = np.arange(k * chunk) < n
  return (images.reshape((k, chunk) + images.shape[1:]),
          labels.reshape((k, chunk) + labels.shape[1:]), mask.reshape(k, chunk))


def loss_acc(apply: Callable, params, model_state, chunks):
  """Mean cross-entropy and accuracy of one model over ``chunked`` data.

  Args:
    apply: ``(params, model_state, inputs [k, ...]) -> logits [k, ..., C]`` in evaluation
      mode (e.g. :func:`nbsgd_jax.models.apply_eval` with the task's input preprocessing).
    chunks: ``(inputs [c, k, ...], labels [c, k, ...], mask [c, k, ...])`` (:func:`chunked`);
      a language model's labels are the next tokens ``[c, k, T]``.
  """
  def one(c):
    inputs, labels, mask = c
    logits = apply(params, model_state, inputs)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    hit = (jnp.argmax(logits, -1) == labels)
    mask = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (ce.ndim - mask.ndim)), ce.shape)
    return jnp.sum(ce * mask), jnp.sum(hit * mask), jnp.sum(mask)
  ce, hit, count = lax.map(one, chunks)
  count = jnp.sum(count)
  return jnp.sum(ce) / count, jnp.sum(hit) / count


def average_state(model_state):
  """The averaged model's state: the mean over workers of each leaf of ``model_state [n, ...]``
  (BatchNorm: the mean of the workers' running means and of their running variances; a
  documented rule, not a recomputation of the statistics under the averaged weights)."""
  return metrics_lib.average_model(model_state)


def make_train_loss_fn(apply: Callable) -> Callable:
  """Jitted ``(params [n, ...], model_state [n, ...], train) -> float32`` training loss of
  the averaged model (the ``F`` that ADA-LUPA observes at each synchronisation)."""
  return jax.jit(lambda params, ms, chunks: loss_acc(
      apply, metrics_lib.average_model(params), average_state(ms), chunks)[0])


def make_eval_fn(apply: Callable, decentralized: bool) -> Callable:
  """Jitted ``(params [n, ...], model_state [n, ...], test, train, worker_test) -> dict`` of
  float32 scalars.

  ``test``, ``train`` and ``worker_test`` are :func:`chunked` data; ``apply`` as
  :func:`loss_acc`. Reports loss and accuracy of the averaged model on ``test`` and its loss on
  ``train`` (:func:`average_state` for its model state), consensus distance and, for
  decentralized algorithms, the mean over workers of each worker's own accuracy on
  ``worker_test`` (each with its own model state).
  """

  @jax.jit
  def eval_fn(params, model_state, test, train, worker_test):
    avg, avg_state = metrics_lib.average_model(params), average_state(model_state)
    test_loss, test_acc = loss_acc(apply, avg, avg_state, test)
    train_loss, _ = loss_acc(apply, avg, avg_state, train)
    out = {"train_loss": train_loss, "test_loss": test_loss, "test_accuracy": test_acc,
           "consensus_distance": metrics_lib.consensus_distance(params)}
    if decentralized:
      # lax.map, not vmap: a vmapped convolution over per-worker weights becomes a grouped
      # convolution, which is several times slower on CPU.
      _, accs = lax.map(lambda pm: loss_acc(apply, pm[0], pm[1], worker_test),
                        (params, model_state))
      out["worker_test_accuracy"] = jnp.mean(accs)
    return out

  return eval_fn


@jax.jit
def finite_workers(params) -> jax.Array:
  """``params [n, ...] -> bool [n]``: whether every parameter of each worker is finite (one
  jitted function for the process: compiled once per shape)."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
                            for x in jax.tree.leaves(params)]), axis=0)


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
