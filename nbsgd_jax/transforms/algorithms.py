"""Each lockstep algorithm's worker transform from its pieces, written once.

An algorithm here is a function of its pieces: the local optimizer ``opt`` (a worker transform
or an optax transformation), its communications (:mod:`nbsgd_jax.communications`) and its
numbers. Both faces call the same function (optax's alias pattern, ``optax/_src/alias.py``: an
alias is a few lines over ``combine.chain``):

* a recipe (:mod:`nbsgd_jax.recipes`) is the adapter from config keys: it builds the pieces
  from the config (the Builder's optimizer, with Non-blocking SGD's skip rule and the
  hyperparameters as inputs; the topology's gossip; the codec) and calls the function;
* an optax constructor (:mod:`nbsgd_jax.tx`) builds the pieces from a user's arguments and the
  bound axis, with ``opt = optax.identity()`` (the user's optimizer comes before it in
  ``optax.chain``), and adapts the result with :func:`nbsgd_jax.tx.to_optax`.

The registry records which optax constructor adapts each algorithm (``register(face=...)``) or
why none does (``no_face``); ``tests/algorithms/test_tx.py`` holds every face to ``train()``
step for step.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import optax

from nbsgd_jax.communications.masked import sparta_masks
from nbsgd_jax.transforms import decentralized as D
from nbsgd_jax.transforms.decoupled import decoupled_momentum, demo_chunking, sparseloco_chunking
from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, chain,
                                       merge_reports, replace_params, skip_unless)
from nbsgd_jax.transforms.push_sum import stochastic_gradient_push
from nbsgd_jax.transforms.wrappers import (average_models, gossip_step, group_outer_step,
                                           holding, mixing_of, outer_step,
                                           overlapped_outer_step, periodic, OVERLAPS,
                                           streaming_outer_step)

# the compositions the decentralized module already is, under the algorithms' names
choco_sgd = D.choco_sgd
d2 = D.d2
gossip_pga = D.gossip_pga
sgp = stochastic_gradient_push


def allreduce_sgd(opt, reducer: WorkerTransform) -> WorkerTransform:
  """All-Reduce SGD: the workers' mean gradient by ``reducer`` (an all-reduce, count-weighted
  under Non-blocking SGD, He & Dube 2022; or compressed with error feedback, Stich et al.
  2018), then the optimizer's step on it."""
  return chain(reducer, opt)


def dpsgd(opt, gossip, order: str = "atc") -> WorkerTransform:
  """D-PSGD (Lian et al., NeurIPS 2017, Algorithm 1): the local step and one gossip round over
  ``gossip`` (a static W, W_t, or MATCHA's activated matchings, Wang et al. 2019), in
  ``order`` (:data:`~nbsgd_jax.transforms.wrappers.ORDERS`)."""
  return gossip_step(opt, gossip, order)


def gradient_tracking(opt, tracking, gossip, order: str = "atc") -> WorkerTransform:
  """Gradient tracking, DIGing (Nedic, Olshevsky, Shi 2017, Eq. (3)): the gradient replaced by
  the tracked mean ``y`` (one gossip round of ``y`` over ``tracking``), then D-PSGD's step."""
  return chain(D.gradient_tracking(tracking), dpsgd(opt, gossip, order))


def local_sgd(opt, reducer: WorkerTransform, opt_state: str = "keep",
              local_init: Optional[Any] = None,
              opt_reducer: Optional[WorkerTransform] = None) -> WorkerTransform:
  """Local SGD / LUPA-SGD (Haddadpour et al. 2019, Algorithm 1): local steps, and at a period
  end (``ctx.period_end``) the models averaged by ``reducer`` (the optimizer's state kept,
  reset or averaged: :func:`~nbsgd_jax.transforms.average_models`)."""
  return periodic(opt, average_models(reducer, opt_state, local_init=local_init,
                                      opt_reducer=opt_reducer))


def diloco(opt, reducer: WorkerTransform, outer: optax.GradientTransformation,
           overlap: str = "none", period: int = 1) -> WorkerTransform:
  """DiLoCo (Douillard et al. 2023, Algorithm 1): H inner steps of ``opt``, then at a period
  end the mean pseudo-gradient (``reducer``) through the ``outer`` optimizer, every worker
  restarting from the outer model; with ``overlap`` = ``"delayed"`` or ``"eager"`` the
  all-reduce overlaps the next ``period`` = H inner steps and the outer step uses the mean
  that landed (:func:`~nbsgd_jax.transforms.wrappers.overlapped_outer_step`).

  Raises:
    ValueError: an unknown ``overlap``.
  """
  if overlap not in OVERLAPS:
    raise ValueError(f"diloco.overlap={overlap!r} is not allowed: use one of {list(OVERLAPS)}")
  if overlap == "none":
    return periodic(opt, outer_step(reducer, outer))
  return periodic(opt, overlapped_outer_step(reducer, outer, period, overlap == "eager"))


def streaming_diloco(opt, reducer: WorkerTransform, outer: optax.GradientTransformation,
                     fragments: int, delay: int, alpha: float) -> WorkerTransform:
  """Streaming DiLoCo (Douillard et al. 2025): DiLoCo whose ``fragments`` synchronise in turn,
  each all-reduce overlapping ``delay`` inner steps, merged with mixing factor ``alpha``
  (:func:`~nbsgd_jax.transforms.streaming_outer_step`)."""
  return periodic(opt, streaming_outer_step(reducer, outer, fragments, delay, alpha))


def sparta(opt, exchange, p, seed) -> WorkerTransform:
  """SPARTA (exo-explore/gym ``exogym/strategy/sparta.py``, ``SPARTAStrategy``, commit
  9fa323c): after every local step of ``opt`` the workers average a random fraction ``p`` of
  the model's coordinates, the same coordinates on every worker (``exchange``: a
  :class:`~nbsgd_jax.communications.masked.MaskedAllReduce`, the mean over the live
  workers); the mask of step t is drawn from ``(seed, t)``
  (:func:`~nbsgd_jax.communications.masked.sparta_masks`). ``p`` and ``seed`` may be traced."""
  opt = as_worker_transform(opt)

  def update(grads, state, params, ctx):
    u, state, report = opt.update(grads, state, params, ctx)
    leaves, treedef = jax.tree.flatten(optax.apply_updates(params, u))
    key = jax.random.fold_in(jax.random.key(seed), ctx.step)
    masks = sparta_masks(key, [x.shape for x in leaves], p)
    mixed, comm = exchange.masked_mean(leaves, masks, ctx)
    return (replace_params(params, jax.tree.unflatten(treedef, mixed)), state,
            merge_reports(report, comm))

  return WorkerTransform(opt.init, update, opt.communications + (exchange,))


def demo(opt, exchange, schedule, decay, topk: int, chunk: int) -> WorkerTransform:
  """DeMo (Peng, Quesnelle, Kingma 2024, Algorithm 1; bloc97/DeMo ``demo.py``, commit
  0e48145d702b25f83055e11d9585a9c11bcfe154): the worker's decoupled momentum, the mean over
  the contributors of its top-``topk`` DCT coefficients per chunk (``exchange``), its sign,
  then ``opt`` (the reference: SGD without momentum, at the learning rate ``schedule``
  gives the momentum; :func:`~nbsgd_jax.transforms.decoupled.decoupled_momentum`)."""
  return chain(decoupled_momentum(exchange, schedule, decay, demo_chunking(topk, chunk)), opt)


def sparseloco(opt, exchange, outer_lr, outer_momentum, error_decay, top_k: int,
               chunk_size: int, bins: int, sigmas: float, momentum_on: bool = False
               ) -> WorkerTransform:
  """SparseLoCo (arXiv 2508.15706; tplr-ai/SparseLoCo ``src/tplr/sparseloco.py``, commit
  276fa59977f84a601fb81f3a7e9379b204b4e91c): DiLoCo whose pseudo-gradient goes into each
  worker's error-feedback accumulator (decay ``error_decay``, scaled by ``outer_lr``), of
  which the top-k entries per chunk, quantised to ``bins`` levels (0: float32), are sent and
  averaged over their contributors (``exchange``); the outer SGD (``outer_lr``, heavy-ball
  ``outer_momentum`` when ``momentum_on``; the reference's default is none) steps on that mean
  (:func:`~nbsgd_jax.transforms.decoupled.decoupled_momentum`)."""
  reducer = decoupled_momentum(exchange, lambda step: outer_lr, error_decay,
                               sparseloco_chunking(top_k, chunk_size, bins, sigmas))
  outer = optax.sgd(outer_lr, momentum=outer_momentum if momentum_on else None)
  return periodic(opt, outer_step(reducer, outer))


def noloco(opt, groups, outer_lr, outer_momentum) -> WorkerTransform:
  """NoLoCo (arXiv 2506.10911; jkolehm/noloco ``sparse_optimizer_c.py``, commit
  37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08): H inner steps of ``opt``, then each worker's
  outer step towards the mean of its random group's models (``groups``), with its own slow
  weights and outer momentum (:func:`~nbsgd_jax.transforms.wrappers.group_outer_step`); no
  all-reduce."""
  return periodic(opt, group_outer_step(groups, outer_lr, outer_momentum))


def epidemic(opt, mixing) -> WorkerTransform:
  """Epidemic Learning (de Vos et al., NeurIPS 2023; sacs-epfl/decentralizepy tag
  ``epidemic-neurips-2023``, commit ff70eeecf3fd79988ec88dcfcdd0ad7e7d70a44b): H local steps of
  ``opt``, then each node's uniform average of its model and those it received over the
  round's random graph (``mixing``: EL-Local's or EL-Oracle's rule)."""
  return periodic(opt, average_models(mixing_of(mixing)))


def teleportation(opt, mixing) -> WorkerTransform:
  """Teleportation (Takezawa & Stich, ICLR 2025; sacs-epfl/decentralized-learning-simulator
  ``dasklearn/simulation/teleportation``, commit bdbc50dbde61ef4894ebee5466d88023d9230461): the
  round's ``k`` active nodes take H local steps of ``opt`` (the others none), then the slots
  average over ``G_k`` and each slot's model moves to its next node (``mixing``: the rule's
  matrix does both); the state records which nodes hold a slot, the models an evaluation
  reads (:func:`~nbsgd_jax.transforms.wrappers.held_models`)."""
  return holding(periodic(skip_unless(opt, mixing.training),
                          average_models(mixing_of(mixing))), mixing.holds)


__all__ = ["allreduce_sgd", "choco_sgd", "d2", "demo", "diloco", "dpsgd", "epidemic",
           "gossip_pga", "gradient_tracking", "local_sgd", "noloco", "sgp", "sparseloco",
           "sparta", "streaming_diloco", "teleportation"]
