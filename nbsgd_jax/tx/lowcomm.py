"""DiLoCo's descendants as optax transformations (the module docstring of :mod:`nbsgd_jax.tx`
gives the contract): DeMo, SparseLoCo and NoLoCo; Epidemic Learning and Teleportation, whose
round's graph the host draws (:func:`epidemic_mixing`, :func:`teleportation_mixing`) and the
user passes in as the ``shared`` extra argument (:func:`mixing_inputs`), as ``train()``
does."""

from __future__ import annotations

import copy
from typing import Any, Callable, Union

import optax

from nbsgd_jax.communications import ContributorAllGather
from nbsgd_jax.communications import random_mixing as RM
from nbsgd_jax.communications.groups import RandomGroups
from nbsgd_jax.transforms import algorithms as A
from nbsgd_jax.tx.adapter import _check_period, _sized, to_optax


def _rate(learning_rate: Union[float, Callable]) -> Callable:
  return learning_rate if callable(learning_rate) else (lambda step: learning_rate)


def demo(learning_rate: Union[float, Callable], *, axis_name: Any,
         error_decay: float = 0.999, top_k: int = 32,
         chunk_size: int = 64) -> optax.GradientTransformationExtraArgs:
  """DeMo (Peng, Quesnelle, Kingma 2024, Algorithm 1; bloc97/DeMo ``demo.py``, commit
  0e48145d702b25f83055e11d9585a9c11bcfe154) before the optimizer: gradients in, the sign of
  the mean over the contributors of the workers' top-k DCT coefficients per chunk of their
  decoupled momentum out. The reference steps by ``optax.sgd(learning_rate)`` after it
  (momentum 0; its weight decay ``p <- (1 - lr wd) p`` is ``optax.add_decayed_weights(wd)``
  between the two). ``learning_rate`` (a float or an optax schedule of the update count)
  scales the gradient into the momentum, as the reference does.

  Shapes: any tree of float arrays; 1-D and 2-D arrays are chunked as the reference, others
  as :func:`nbsgd_jax.codecs.dct.chunk_shape`. Bytes: ``(n - 1)`` times the message,
  ``12`` bytes (an int64 index and a float32 value) per coefficient sent.

  Raises:
    ValueError: ``error_decay`` not in [0, 1), ``top_k`` or
      ``chunk_size`` < 1; (at update) ``axis_name`` not bound.
  """
  owner = "tx.demo"
  if not 0.0 <= float(error_decay) < 1.0:
    raise ValueError(f"{owner}(error_decay={error_decay!r}) is not allowed: it "
                     "must be in [0, 1)")
  for key, v in (("top_k", top_k),
                 ("chunk_size", chunk_size)):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ValueError(f"{owner}({key}={v!r}) is not allowed: it must be an int >= 1")
  build = lambda comm: A.demo(optax.identity(), comm, _rate(learning_rate),
                              error_decay, top_k, chunk_size)
  make = lambda n: build(ContributorAllGather(n, axis_name, "demo"))
  return to_optax(_sized(make, build(None).init, axis_name, owner), axis_name=axis_name,
                  name=owner)


def sparseloco(period: int, *, axis_name: Any, outer_lr: float = 1.0,
               outer_momentum: float = 0.0, error_decay: float = 0.95, top_k: int = 128,
               chunk_size: int = 64, quantization_bins: int = 4,
               quantization_range: float = 6.0) -> optax.GradientTransformationExtraArgs:
  """SparseLoCo (arXiv 2508.15706; tplr-ai/SparseLoCo ``src/tplr/sparseloco.py``, commit
  276fa59977f84a601fb81f3a7e9379b204b4e91c) after the inner optimizer: after every
  ``period`` = H updates, each worker adds ``outer_lr`` times its pseudo-gradient
  ``x_outer - x_i`` to its error-feedback accumulator ``e`` (decayed by ``error_decay``),
  sends the top entries per chunk quantised to ``quantization_bins`` levels (0: float32)
  and keeps the rest in ``e``; the outer SGD steps on the mean over the contributors, and
  every worker restarts from ``x_outer`` (the initial params at ``init``: give every worker
  the same). Defaults: the paper's run.

  Bytes per outer step: ``(n - 1)`` times the message, per entry an int64 index and a byte
  per code (float32 without quantisation), per array ``4 (1 + bins)`` for the shift and
  lookup table.

  Raises:
    ValueError: ``period``, ``top_k`` or ``chunk_size`` < 1, ``quantization_bins`` = 1;
      (at update) ``axis_name`` not bound, ``params`` missing.
  """
  owner = "tx.sparseloco"
  period = _check_period(period, owner)
  for key, v, lo in (("top_k", top_k, 1), ("chunk_size", chunk_size, 1)):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
      raise ValueError(f"{owner}({key}={v!r}) is not allowed: it must be an int >= {lo}")
  if quantization_bins == 1:
    raise ValueError(f"{owner}(quantization_bins=1) is not allowed: use 0 (none) or >= 2")
  build = lambda comm: A.sparseloco(
      optax.identity(), comm, outer_lr, outer_momentum, error_decay, top_k,
      chunk_size, quantization_bins, quantization_range, bool(outer_momentum))
  make = lambda n: build(ContributorAllGather(n, axis_name, "sparseloco",
                                              value_bits=8 if quantization_bins else 32))
  return to_optax(_sized(make, build(None).init, axis_name, owner), axis_name=axis_name,
                  period=period, needs_params=True, name=owner)


def noloco(period: int, *, axis_name: Any, group_size: int = 2, outer_lr: float = 0.7,
           outer_momentum: float = 0.5, seed: int = 0) -> optax.GradientTransformationExtraArgs:
  """NoLoCo (arXiv 2506.10911; jkolehm/noloco ``sparse_optimizer_c.py``, commit
  37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08) after the inner optimizer: after every
  ``period`` = H updates, the workers split into random groups of ``group_size`` (the
  permutation drawn from ``seed`` and the step, the same on every worker), and each worker
  steps its own slow weights towards its group's mean model with its own outer momentum,
  ``m <- outer_momentum m + outer_lr (mean_G - slow)``, ``slow <- slow + m``, restarting
  from ``slow``. No all-reduce. Bytes per outer step: 2 models from a group member, 2 (g - 1)
  from the group's root.

  Raises:
    ValueError: ``period`` < 1; (at update) ``group_size`` not dividing the workers,
      ``axis_name`` not bound, ``params`` missing.
  """
  owner = "tx.noloco"
  period = _check_period(period, owner)
  build = lambda comm: A.noloco(optax.identity(), comm, outer_lr, outer_momentum)
  make = lambda n: build(RandomGroups(n, group_size, seed, axis_name, "noloco"))
  return to_optax(_sized(make, build(None).init, axis_name, owner), axis_name=axis_name,
                  period=period, needs_params=True, name=owner)


def epidemic_mixing(num_workers: int, period: int, *, variant: str = "local",
                    graph_degree: int = 7, seed: int = 0) -> RM.RandomMixing:
  """Epidemic Learning's rounds for :func:`epidemic`: EL-Local (``variant="local"``: each
  node sends to ``graph_degree`` random others) or EL-Oracle (``"oracle"``: a fresh random
  ``graph_degree``-regular graph), one round every ``period`` updates, drawn from ``seed``
  as ``train()`` draws them.

  Raises:
    ValueError: an unknown ``variant``, ``period`` < 1, a degree that does not fit.
  """
  if variant not in ("local", "oracle"):
    raise ValueError(f"epidemic_mixing(variant={variant!r}) is not allowed: use 'local' or "
                     "'oracle'")
  rule = (RM.epidemic_local if variant == "local" else RM.epidemic_oracle)(
      num_workers, graph_degree, seed)
  return RM.RandomMixing(num_workers, rule, _check_period(period, "tx.epidemic_mixing"),
                         key="epidemic")


def teleportation_mixing(num_workers: int, period: int, *, sample_size: int = 8,
                         seed: int = 0) -> RM.RandomMixing:
  """Teleportation's rounds for :func:`teleportation`: ``sample_size`` active nodes a round,
  one round every ``period`` updates, drawn from ``seed`` as ``train()`` draws them.

  Raises:
    ValueError: ``period`` < 1, ``sample_size`` not a power of two in [2, num_workers].
  """
  rule = RM.teleportation(num_workers, sample_size, seed)
  return RM.RandomMixing(num_workers, rule, _check_period(period, "tx.teleportation_mixing"),
                         key="teleportation")


def mixing_inputs(mixing: RM.RandomMixing, step: int) -> dict:
  """The ``shared`` extra argument of update ``step`` (0-based): the round's matrix and flags
  (numpy; the same on every worker)."""
  return mixing.host_inputs(int(step))["shared"]


def _round_face(algorithm: Callable, mixing: RM.RandomMixing, axis_name: Any, owner: str
                ) -> optax.GradientTransformationExtraArgs:
  """``algorithm(optax.identity(), mixing)`` on ``axis_name``, a round every
  ``mixing.period`` updates."""
  bound = copy.copy(mixing)
  bound.axis_name = axis_name
  return to_optax(algorithm(optax.identity(), bound), axis_name=axis_name,
                  period=bound.period, needs_params=True, name=owner)


def epidemic(mixing: RM.RandomMixing, *, axis_name: Any
             ) -> optax.GradientTransformationExtraArgs:
  """Epidemic Learning (de Vos et al., NeurIPS 2023; sacs-epfl/decentralizepy tag
  ``epidemic-neurips-2023``, commit ff70eeecf3fd79988ec88dcfcdd0ad7e7d70a44b) after the
  optimizer: after every ``mixing.period`` updates, each node's uniform average of its model
  and those it received over the round's graph. Give ``update`` the round's draw,
  ``shared=mixing_inputs(mixing, step)``. Bytes: a model to each receiver.

  Raises:
    ValueError (at update): ``axis_name`` not bound, ``params`` missing.
  """
  return _round_face(A.epidemic, mixing, axis_name, "tx.epidemic")


def teleportation(mixing: RM.RandomMixing, *, axis_name: Any
                  ) -> optax.GradientTransformationExtraArgs:
  """Teleportation (Takezawa & Stich, ICLR 2025; sacs-epfl/decentralized-learning-simulator
  ``dasklearn/simulation/teleportation``, commit bdbc50dbde61ef4894ebee5466d88023d9230461)
  after the optimizer: the round's active nodes step (the others' updates are zero and their
  optimizer state kept: put it after the optimizer, whose state then still moves; ``train()``
  skips it), and after every ``mixing.period`` updates the slots average over their graph and
  move to the next round's nodes. Give ``update`` ``shared=mixing_inputs(mixing, step)``.

  Raises:
    ValueError (at update): ``axis_name`` not bound, ``params`` missing.
  """
  return _round_face(A.teleportation, mixing, axis_name, "tx.teleportation")


__all__ = ["demo", "epidemic", "epidemic_mixing", "mixing_inputs", "noloco", "sparseloco",
           "teleportation", "teleportation_mixing"]
