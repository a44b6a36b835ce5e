"""Decentralized algorithms beyond D-PSGD, each a worker transform over a gossip communication.

* :func:`choco_sgd`: CHOCO-SGD (Koloskova, Stich, Jaggi, ICML 2019, Algorithm 2; Koloskova,
  Lin, Stich, Jaggi, ICLR 2020 for deep learning): compressed gossip with public copies
  ``x_hat``::

      x_i^{t+1/2} = x_i^t + u_i^t                       (the local optimizer's step)
      q_i = C(x_i^{t+1/2} - x_hat_i)                    (sent to the neighbours)
      x_hat_j <- x_hat_j + q_j                          (every holder of a copy of x_hat_j)
      x_i^{t+1} = x_i^{t+1/2} + gamma sum_j W_ij (x_hat_j - x_hat_i)

  ``x_hat_i`` starts at 0. With the identity codec and ``gamma = 1`` this is D-PSGD (atc).
  ``order="released"`` is the order both released codes run (epfml/ChocoSGD
  ``dl_code/pcode/optim/parallel_choco.py``: the consensus step, then the compression;
  ``convex_code/logistic.py`` alike): ``x_i^{t+1} = x_i^{t+1/2} + gamma sum_j W_ij (x_hat_j^t
  - x_hat_i^t)`` with the copies of the last step, then ``q_i = C(x_i^{t+1} - x_hat_i^t)``.
* :func:`gradient_tracking`: DIGing (Nedic, Olshevsky, Shi, SIAM J. Optim. 2017, Eq. (3)),
  the tracking variable ``y_i^t = sum_j W_ij y_j^{t-1} + g_i^t - g_i^{t-1}`` (``y^{-1} =
  g^{-1} = 0``, so ``y^0 = g^0`` and ``sum_i y_i^t = sum_i g_i^t`` at every step), fed to the
  local optimizer in place of the gradient; the models then gossip as in D-PSGD
  (``parallel``: ``x^{t+1} = W x^t - eta y^t``, DIGing exactly; ``atc``: ``W (x^t - eta y^t)``).
* :func:`d2`: D^2 (Tang, Lian, Yan, Zhang, Liu, ICML 2018, Algorithm 1)
  ``x^{t+1} = W (2 x^t - x^{t-1} + u^t - u^{t-1})`` with ``u^t`` the optimizer's step
  (``-eta g^t`` for SGD) and ``x^1 = W (x^0 + u^0)``; over ``(I + W) / 2`` it is Exact
  Diffusion (Yuan, Ying, Zhao, Sayed, IEEE TSP 2019).
* :func:`gossip_pga`: Gossip-PGA (Chen, Yuan, Zhang, Pan, Xu, Yin, ICML 2021, Algorithm 1):
  D-PSGD with a global average instead of the gossip at every period end (every H steps).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from nbsgd_jax import codecs
from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params)
from nbsgd_jax.transforms.wrappers import gossip_step


class ChocoState(NamedTuple):
  """State of :func:`choco_sgd`: the local transform's, this worker's public copy ``x_hat``
  (the same on every holder of a copy) and the codec's PRNG key."""

  local: Any
  x_hat: Any
  key: jax.Array


CHOCO_ORDERS = ("paper", "released")


def choco_sgd(local, gossip, codec: codecs.Codec, gamma: float, flatten: bool = True,
              seed: int = 0, order: str = "paper") -> WorkerTransform:
  """CHOCO-SGD (module docstring).

  Args:
    local: the local transform (an optax optimizer, with Non-blocking SGD's skip rule).
    gossip: a :class:`~nbsgd_jax.communications.CompressedGossip` (the bytes of ``q_i`` to
      every neighbour that keeps a copy of ``x_hat_i``).
    codec: the compressor ``C`` (:func:`nbsgd_jax.codecs.make_codec`).
    gamma: the consensus step size, in (0, 1] (a float, checked; or a traced array, the
      step's hparam ``choco.gamma``, checked by the config).
    flatten: compress the raveled model (True) or each leaf (False).
    seed: seed of the codec's randomness (folded with the worker index).
    order: ``"paper"`` (Algorithm 2: compress, update the copies, then the consensus step)
      or ``"released"`` (the released codes: the consensus step on the last copies, then
      compress the new model's difference).

  Raises:
    ValueError: ``gamma`` outside (0, 1]; unknown ``order``.
  """
  if not isinstance(gamma, jax.core.Tracer) and not 0.0 < float(gamma) <= 1.0:
    raise ValueError(f"choco.gamma={gamma!r} is not allowed: it must be in (0, 1]")
  if order not in CHOCO_ORDERS:
    raise ValueError(f"choco.order={order!r} is not allowed: use one of {list(CHOCO_ORDERS)}")
  local = as_worker_transform(local)

  def init(params):
    return ChocoState(local.init(params), jax.tree.map(jnp.zeros_like, params),
                      jax.random.PRNGKey(seed))

  def update(grads, state, params, ctx):
    u, local_state, report = local.update(grads, state.local, params, ctx)
    half = optax.apply_updates(params, u)
    key, sub = jax.random.split(state.key)
    sub = jax.random.fold_in(sub, lax.axis_index(gossip.axis_name))
    live = gossip.live(ctx)  # a failed worker sends nothing: x_hat_i stays

    def send(x):  # q_i = C(x - x_hat_i), x_hat_i += q_i
      q, nbytes = codecs.compress_tree(codec, jax.tree.map(jnp.subtract, x, state.x_hat), sub,
                                       flatten)
      return jax.tree.map(lambda h, d: h + jnp.where(live, d, jnp.zeros_like(d)),
                          state.x_hat, q), nbytes

    def consensus(x, x_hat):  # x + gamma sum_j W_ij (x_hat_j - x_hat_i)
      mixed, _ = gossip.mix(x_hat, ctx, jnp.float32(0.0))
      return jax.tree.map(lambda a, m, h: a + jnp.asarray(gamma, a.dtype) * (m - h),
                          x, mixed, x_hat)

    if order == "paper":
      x_hat, nbytes = send(half)
      new = consensus(half, x_hat)
    else:
      new = consensus(half, state.x_hat)
      x_hat, nbytes = send(new)
    comm = gossip.message_report(nbytes, ctx)
    return (replace_params(params, new), ChocoState(local_state, x_hat, key),
            merge_reports(report, comm))

  return WorkerTransform(init, update, local.communications + (gossip,))


class TrackingState(NamedTuple):
  """State of :func:`gradient_tracking`: ``y^{t-1}`` and ``g^{t-1}`` (zeros before step 0)."""

  y: Any
  g: Any


def gradient_tracking(gossip) -> WorkerTransform:
  """The tracking variable of DIGing (module docstring): gradients in, ``y^t`` out (one gossip
  round of ``y``). A worker that finished no mini-batch (``ctx.count == 0``) reuses its last
  gradient, so the tracked sum stays that of the latest gradients.

  Args:
    gossip: a :class:`~nbsgd_jax.communications.Gossip` (its own key: ``y`` is a second
      message besides the model).
  """

  def init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return TrackingState(zeros, zeros)

  def update(grads, state, params, ctx):
    del params
    if ctx is not None:
      grads = jax.tree.map(lambda g, p: jnp.where(ctx.count > 0, g, p), grads, state.g)
    mixed, report = gossip.mix(state.y, ctx)
    y = jax.tree.map(lambda m, g, p: m + g - p, mixed, grads, state.g)
    return y, TrackingState(y, grads), report

  return WorkerTransform(init, update, (gossip,))


class D2State(NamedTuple):
  """State of :func:`d2`: the local transform's and the correction ``c^t = x^t - x^{t-1} -
  u^{t-1}`` (0 at the start)."""

  local: Any
  c: Any


def d2(local, gossip) -> WorkerTransform:
  """D^2 (module docstring) in the adapt-correct-combine form of Exact Diffusion:
  ``z = x^t + u^t + c^t``, ``x^{t+1} = W z``, ``c^{t+1} = x^{t+1} - x^t - u^t``, which is
  ``W (2 x^t - x^{t-1} + u^t - u^{t-1})``. Computed as ``L = z - W z`` from the neighbours'
  differences (:meth:`~nbsgd_jax.communications.Gossip.mix` with ``difference``), ``x^{t+1} =
  z - L`` and ``c^{t+1} = c^t - L``: the worker mean of ``c`` stays 0 to rounding of ``L``
  (which vanishes at consensus), while the textbook form accumulates float32 rounding of
  ``W z`` in ``x^t - x^{t-1}`` and drifts (F - F* climbs back to ~1e-6 on the least-squares
  task). A failed worker keeps its model and its correction.

  Args:
    local: the local transform (its updates are ``u^t``).
    gossip: the :class:`~nbsgd_jax.communications.Gossip` (over W, or ``(I + W) / 2`` for
      Exact Diffusion).
  """
  local = as_worker_transform(local)

  def init(params):
    return D2State(local.init(params), jax.tree.map(jnp.zeros_like, params))

  def update(grads, state, params, ctx):
    u, local_state, report = local.update(grads, state.local, params, ctx)
    z = jax.tree.map(lambda x, a, c: x + a + c, params, u, state.c)
    lap, comm = gossip.mix(z, ctx, difference=True)
    live = gossip.live(ctx)
    new = jax.tree.map(lambda zz, l, x: jnp.where(live, zz - l, x), z, lap, params)
    c = jax.tree.map(lambda c, l: jnp.where(live, c - l, c), state.c, lap)
    return replace_params(params, new), D2State(local_state, c), merge_reports(report, comm)

  return WorkerTransform(init, update, local.communications + (gossip,))


def gossip_pga(local, gossip, average, order: str = "atc") -> WorkerTransform:
  """Gossip-PGA (module docstring): :func:`~nbsgd_jax.transforms.gossip_step` on steps inside
  a period, ``mean(x_i + u_i)`` over the live workers by ``average`` (an
  :class:`~nbsgd_jax.communications.AllReduce`) at a period end (``ctx.period_end``, static).
  """
  local = as_worker_transform(local)
  inner = gossip_step(local, gossip, order)

  def update(grads, state, params, ctx):
    if not ctx.period_end:
      return inner.update(grads, state, params, ctx)
    u, state, report = local.update(grads, state, params, ctx)
    avg, comm = average.mean(optax.apply_updates(params, u), ctx, "alive")
    return replace_params(params, avg), state, merge_reports(report, comm)

  return WorkerTransform(local.init, update, inner.communications + (average,))


def check_d2_mixing(phases, mixing: str) -> None:
  """D^2 needs a static W with ``lambda_min(W) > -1/3`` (Tang et al. 2018, Theorem 1);
  ``(I + W) / 2`` always has ``lambda_min >= 0``.

  Raises:
    ValueError: a time-varying W, or ``mixing='w'`` and ``lambda_min(W) <= -1/3``.
  """
  if len(phases) != 1:
    raise ValueError("config.algorithm='d2' is not allowed with a time-varying topology: D^2 "
                     "and Exact Diffusion are defined for a static W")
  if mixing != "w":
    return
  lam = float(np.min(np.linalg.eigvalsh((phases[0] + phases[0].T) / 2)))
  if lam <= -1 / 3 + 1e-12:
    raise ValueError(f"config.d2.mixing='w' is not allowed with this W: lambda_min(W) = "
                     f"{lam:.4f} <= -1/3 (Tang et al. 2018, Theorem 1); use d2.mixing='lazy' "
                     "(Exact Diffusion's (I + W) / 2)")


# ----------------------------------------------------------------------------- config

D2_MIXINGS = ("lazy", "w")
