"""The algorithms as optax transformations, for a training step you wrote yourself.

Every function here returns an ``optax.GradientTransformationExtraArgs`` that runs inside any
SPMD context that binds a named worker axis, ``jax.vmap(..., axis_name=)``, ``jax.shard_map``
over a mesh axis or ``jax.pmap(..., axis_name=)``, and composes with ``optax.chain``::

    opt = optax.chain(optax.sgd(0.1), tx.gossip("ring", axis_name="w"))   # D-PSGD
    state = jax.vmap(opt.init, axis_name="w")(params)   # params: [n, ...], one per worker

    @functools.partial(jax.vmap, axis_name="w")
    def step(params, state, batch):
      grads = jax.grad(loss)(params, batch)
      updates, state = opt.update(grads, state, params)
      return optax.apply_updates(params, updates), state

**The axis contract.** ``init`` and ``update`` run where ``axis_name`` is bound, once per
worker (the worker's own parameters in, its own state out; its own gradient and parameters
in, its own update out); either one called outside the axis (``opt.init(params)`` on
stacked ``[n, ...]`` parameters, say) is refused with a line that says how to map it. Gossip, CHOCO, D^2, local SGD and DiLoCo return the change that
turns ``params`` into the new model, so they come *after* the optimizer and need ``params``;
all-reduce, error feedback, PowerSGD and gradient tracking map gradients to gradients and come
*before* it, as BlueFog's and PyTorch DDP's communication hooks do.

**One implementation.** Each algorithm is one composition
(:mod:`nbsgd_jax.transforms.algorithms`), which its recipe calls with the config's pieces and
the function here with the user's (``optax.identity()`` for the optimizer, which comes before
it in ``optax.chain``; the registry names each algorithm's function, ``register(face=...)``,
or why it has none). The function builds the framework's own communication
(:mod:`nbsgd_jax.communications`) and adapts the composition with :func:`to_optax`, which supplies the step context the framework's host would draw
(:func:`context`): the step from the state's counter, ``count`` from the extra argument of the
same name (Non-blocking SGD), every worker up. ``train()`` and these transformations run the
same code (``tests/algorithms/test_tx.py`` checks them step for step).

**Bytes.** Every state counts the bytes this worker sent (float32, cumulative, the framework's
accounting: a ring all-reduce ``2 (n - 1) / n`` times the message, a gossip the message times
the neighbours); :func:`bytes_sent` reads them from any state (a chain's included).

**Randomness** (top-k needs none; random-k, Gaussian-k and QSGD do) comes from a key in the
state, seeded by ``seed`` and folded with the worker index.

What the host draws for all workers comes in as data: MATCHA's activations as the ``active``
extra argument (:func:`matcha_activations`, the draw ``train()`` makes), fixed periods and
Streaming DiLoCo's fragments as a schedule on the step counter. What does not fit: consensus
control's targets and ADA-LUPA's loss-driven periods are host plans that follow the run, and
AD-PSGD, SwarmSGD and asynchronous DiLoCo step on the host's event clock (a device step is a
batch of events): use ``train()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from nbsgd_jax import codecs
from nbsgd_jax import transforms as T
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.communications import (AllReduce, CompressedGossip, Gossip, MaskedAllReduce,
                                      Matchings)
from nbsgd_jax.host import periods as periods_lib
from nbsgd_jax.topology import matcha as matcha_lib
from nbsgd_jax.topology import matchings as matchings_lib
from nbsgd_jax.transforms import algorithms as A
from nbsgd_jax.transforms import decentralized as D
from nbsgd_jax.transforms.powersgd import powersgd as _powersgd
from nbsgd_jax.transforms.wrappers import ORDERS as DPSGD_ORDERS

__all__ = [
    "TxState", "allreduce_mean", "bytes_sent", "choco", "context", "d2", "demo", "diloco",
    "epidemic", "epidemic_mixing", "mixing_inputs", "teleportation", "teleportation_mixing",
    "error_feedback", "gossip", "gossip_pga", "gradient_tracking", "local_sgd", "matcha",
    "matcha_activations", "matcha_plan", "noloco",
    "nonblocking_accumulate", "powersgd", "sgp", "sparseloco", "sparta", "streaming_diloco",
    "to_optax",
]

from nbsgd_jax.tx.adapter import (  # noqa: F401 (the adapter's names, re-exported)
    Topologyish, TxState, _check_period, _phases, _sized, axis_size, bytes_sent,
    check_compressor, check_mixing_matrix, context, to_optax)
from nbsgd_jax.tx.lowcomm import (  # noqa: E402 (DiLoCo's descendants, the sampled line)
    demo, epidemic, epidemic_mixing, mixing_inputs, noloco, sparseloco, teleportation,
    teleportation_mixing)


# ----------------------------------------------------------------------------- reducers


def allreduce_mean(*, axis_name: Any, ring: bool = False,
                   weighted: bool = False) -> optax.GradientTransformationExtraArgs:
  """The mean of the updates over the workers: All-Reduce SGD's gradient averaging.

  ``u_i -> (1/n) sum_j u_j`` by ``lax.psum`` (or the explicit ring of ``ppermute`` s,
  Patarasuk & Yuan 2009, with ``ring``); with ``weighted``, Non-blocking SGD's all-reduce form
  (He & Dube 2022): ``sum_j c_j u_j / sum_j c_j`` for the ``count`` extra argument ``c_j``
  (mini-batches worker j finished; give each worker's mean gradient over them). Place it
  before the optimizer. Shapes: any tree; bytes: ``2 (n - 1) / n`` times its float bytes.

  Raises:
    ValueError (at update): ``axis_name`` is not bound.
  """
  owner = "tx.allreduce_mean"
  build = lambda comm: A.allreduce_sgd(optax.identity(), T.mean_of(comm, "count"))
  make = lambda n: build(AllReduce(n, axis_name, weighted=weighted, ring=ring))
  return to_optax(_sized(make, build(None).init, axis_name, owner), axis_name=axis_name,
                  name=owner)


def error_feedback(compressor: Any, *, axis_name: Any = None, flatten: bool = True,
                   seed: int = 0, use_residual: bool = True
                   ) -> optax.GradientTransformationExtraArgs:
  """Compression with error feedback (Stich et al. 2018; Shi et al. 2019, Algorithm 1 with
  Top-k / Gaussian-k): ``p = g + e``, ``(values, indices) = C(p, key)``, ``e <- p -
  dense(values, indices)``; the update is the mean of every worker's message over
  ``axis_name`` (all-gathered, ``(n - 1) k (value + 4)`` bytes), or without ``axis_name`` the
  local ``dense(values, indices)``. Place it before the optimizer.

  Args:
    compressor: ``(x [d], key) -> (values [cap], indices [cap])`` (padding index ``d``), e.g.
      ``functools.partial(nbsgd_jax.codecs.sparse.top_k, density=0.01)``, or a
      :class:`~nbsgd_jax.codecs.Codec` (QSGD, sign).
    axis_name: the worker axis, or None (single worker).
    flatten: compress the raveled tree (True) or each leaf.
    seed: the state's PRNG key (split every update, folded with the worker index).
    use_residual: False: no memory.

  Raises:
    TypeError: ``compressor`` is not callable as ``compressor(x, key)``.
    ValueError (at update): ``axis_name`` is not bound.
  """
  owner = "tx.error_feedback"
  compressor = check_compressor(compressor, owner)
  t = T.error_feedback(compressor, axis_name=axis_name, flatten=flatten, seed=seed,
                       use_residual=use_residual)
  return to_optax(t, axis_name=axis_name, name=owner)


def powersgd(rank: int, *, axis_name: Any, seed: int = 0,
             use_residual: bool = True) -> optax.GradientTransformationExtraArgs:
  """PowerSGD (Vogels, Karimireddy, Jaggi 2019, Algorithm 1): the rank-``rank`` mean of the
  gradients by one warm-started power iteration and two all-reduces, with error feedback;
  vectors are averaged uncompressed. Place it before the optimizer.

  Raises:
    ValueError: ``rank`` < 1; (at update) ``axis_name`` is not bound.
  """
  owner = "tx.powersgd"
  init = _powersgd(rank, None, seed, use_residual).init
  make = lambda n: _powersgd(rank, AllReduce(n, axis_name, "powersgd"), seed, use_residual)
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name, name=owner)


# ----------------------------------------------------------------------------- gossip


def gossip(topology: Topologyish, *, axis_name: Any, order: str = "atc",
           weights: str = "metropolis_hastings") -> optax.GradientTransformationExtraArgs:
  """D-PSGD's gossip (Lian et al. 2017, Algorithm 1), after the optimizer:
  ``order="atc"``: ``x_i <- sum_j W_ij (x_j + u_j)``; ``"parallel"``: ``x_i <- sum_j W_ij x_j
  + u_i`` (their Eq. (2)). ``optax.chain(optax.sgd(lr), gossip("ring", axis_name="w"))`` is
  D-PSGD. Bytes: the model's bytes times the worker's neighbours.

  Args:
    topology: a name of :data:`nbsgd_jax.topology.TOPOLOGIES` (built for the axis size, with
      ``weights``; time-varying ones cycle through their phases), a
      :class:`~nbsgd_jax.topology.Topology`, or a doubly stochastic ``[n, n]`` matrix.
    axis_name: the worker axis (``n`` workers, worker ``i`` = axis index ``i``).
    order: ``"atc"`` or ``"parallel"``.

  Raises:
    ValueError: unknown name or order, a matrix that is not doubly stochastic; (at update)
      ``axis_name`` not bound, a matrix whose size is not the axis size, ``params`` missing.
  """
  owner = "tx.gossip"
  phases = _phases(topology, owner, weights)
  if order not in DPSGD_ORDERS:
    raise ValueError(f"{owner}(order={order!r}) is not allowed: use one of {list(DPSGD_ORDERS)}")
  init = A.dpsgd(optax.identity(), None, order).init
  make = lambda n: A.dpsgd(optax.identity(), Gossip(phases(n), axis_name), order)
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name,
                  needs_params=True, name=owner)


def matcha_plan(topology: Topologyish, budget: float, num_workers: int):
  """MATCHA's plan (Wang, Sahu, Yang, Joshi, Kar, 2019, Sec. 3-4): the topology's matchings,
  their activation probabilities for the communication ``budget`` in (0, 1] and the mixing
  weight alpha (cvxpy), for :func:`matcha` and :func:`matcha_activations`.

  Raises:
    ValueError: a bad topology, budget or number of workers (named); RuntimeError: a solver
      failed.
  """
  owner = "tx.matcha_plan"
  if isinstance(topology, str):
    edges = topology_lib.make(topology, num_workers).edges
  elif isinstance(topology, topology_lib.Topology):
    edges = topology.edges
  else:
    w = check_mixing_matrix(topology, owner)
    edges = [(i, j) for i in range(len(w)) for j in range(i + 1, len(w)) if w[i, j] > 0]
  return matcha_lib.plan(num_workers, edges, budget)


def matcha_activations(plan, seed: int, step: int) -> np.ndarray:
  """The activations of step ``step``, bool ``[M]``, drawn on the host as ``train()`` draws
  them (``np.random.default_rng([seed, step])``): give the same array to every worker as
  :func:`matcha`'s ``active`` extra argument."""
  return matchings_lib.sample_activations(plan, seed, step)


def matcha(plan, *, axis_name: Any, order: str = "atc") -> optax.GradientTransformationExtraArgs:
  """MATCHA (Wang et al. 2019, Algorithm 1) after the optimizer: D-PSGD's step over the
  matchings of ``plan`` (:func:`matcha_plan`) that this step activates, ``x_i <- x_i - alpha
  sum_j B_j (x_i - x_partner_j(i))``. ``update`` takes the activations as the extra argument
  ``active`` (bool ``[M]``, the same on every worker: :func:`matcha_activations`); without
  it no matching is active. Bytes: the model's times the active matchings the worker is in.

  Raises:
    ValueError: an unknown order; (at update) ``axis_name`` not bound, ``params`` missing.
  """
  owner = "tx.matcha"
  if order not in DPSGD_ORDERS:
    raise ValueError(f"{owner}(order={order!r}) is not allowed: use one of {list(DPSGD_ORDERS)}")
  init = A.dpsgd(optax.identity(), None, order).init
  make = lambda n: A.dpsgd(optax.identity(), Matchings(plan, n, 0, axis_name), order)
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name, needs_params=True,
                  name=owner)


def sgp(topology: Topologyish = "one_peer_exponential", *, axis_name: Any,
        overlap: bool = False, delay: int = 0) -> optax.GradientTransformationExtraArgs:
  """Stochastic Gradient Push (Assran et al. 2019, Algorithm 1; Overlap-SGP with ``overlap``),
  after the optimizer: the optimizer's update is added to the push-sum numerator, ``(x, w)``
  mixed over the topology's ``W_t``, and the returned change makes ``params`` the de-biased
  ``x / w`` (:func:`nbsgd_jax.transforms.push_sum.stochastic_gradient_push`). Bytes: the
  model's and the weight's, times the neighbours of the round.

  Args:
    topology: as :func:`gossip` (the paper's: ``"one_peer_exponential"``).
    axis_name: the worker axis.
    overlap, delay: Overlap-SGP; a round every ``delay + 1`` steps, landing after as many
      steps (``delay`` is the reference's ``synch_freq``; ``config.sgp.delay``).

  Raises:
    ValueError: as :func:`gossip`; ``delay < 0``, or ``> 0`` without ``overlap``.
  """
  owner = "tx.sgp"
  phases = _phases(topology, owner, "metropolis_hastings")
  make = lambda n: A.sgp(optax.identity(), Gossip(phases(n), axis_name), overlap, delay)
  make(2)  # the arguments' checks, at once
  init = make(1).init
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name,
                  needs_params=True, name=owner)


def _codec(compressor, owner):
  compressor = check_compressor(compressor, owner)
  return compressor if isinstance(compressor, codecs.Codec) else codecs.sparse_codec(
      "custom", compressor)


def choco(compressor: Any, *, gamma: float, topology: Topologyish, axis_name: Any,
          flatten: bool = True, seed: int = 0, order: str = "paper"
          ) -> optax.GradientTransformationExtraArgs:
  """CHOCO-SGD (Koloskova, Stich, Jaggi 2019, Algorithm 2), after the optimizer: ``x^{1/2} =
  x + u``, ``q_i = C(x^{1/2} - x_hat_i)`` sent to the neighbours, ``x_hat_j += q_j``, ``x <-
  x^{1/2} + gamma sum_j W_ij (x_hat_j - x_hat_i)``. Bytes: ``q_i``'s encoding times the
  neighbours.

  Args:
    compressor: as :func:`error_feedback`.
    gamma: the consensus step size in (0, 1].
    topology, axis_name: as :func:`gossip`.
    flatten, seed: as :func:`error_feedback`.
    order: ``"paper"`` (Algorithm 2) or ``"released"`` (epfml/ChocoSGD's order: the consensus
      step on the last copies, then compress).

  Raises:
    TypeError / ValueError: a bad compressor, gamma, order or topology; at update as
      :func:`gossip`.
  """
  owner = "tx.choco"
  codec, phases = _codec(compressor, owner), _phases(topology, owner, "metropolis_hastings")
  build = lambda g: A.choco_sgd(optax.identity(), g, codec, gamma, flatten, seed, order)
  init = build(None).init
  make = lambda n: build(CompressedGossip(phases(n), axis_name))
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name, needs_params=True,
                  name=owner)


def gradient_tracking(topology: Topologyish, *, axis_name: Any
                      ) -> optax.GradientTransformationExtraArgs:
  """Gradient tracking, DIGing (Nedic, Olshevsky, Shi 2017, Eq. (3)), before the optimizer:
  ``y_i <- sum_j W_ij y_j + g_i - g_i^prev`` replaces the gradient; chain it with the optimizer
  and :func:`gossip` of the models: ``optax.chain(gradient_tracking(W, axis_name=a),
  optax.sgd(lr), gossip(W, axis_name=a))`` is the composition
  :func:`nbsgd_jax.transforms.algorithms.gradient_tracking` (the recipe's).

  Raises:
    as :func:`gossip`.
  """
  owner = "tx.gradient_tracking"
  phases = _phases(topology, owner, "metropolis_hastings")
  init = D.gradient_tracking(None).init
  make = lambda n: D.gradient_tracking(Gossip(phases(n), axis_name, "tracking"))
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name, name=owner)


def d2(topology: Topologyish, *, axis_name: Any, mixing: str = "lazy"
       ) -> optax.GradientTransformationExtraArgs:
  """D^2 (Tang et al. 2018, Algorithm 1) after the optimizer, ``x^{t+1} = W (2 x^t - x^{t-1}
  + u^t - u^{t-1})``; ``mixing="lazy"`` uses ``(I + W) / 2`` (Exact Diffusion), ``"w"`` needs
  ``lambda_min(W) > -1/3``.

  Raises:
    ValueError: unknown ``mixing``; (at update) as :func:`gossip`, or ``lambda_min(W) <=
      -1/3`` with ``mixing="w"``.
  """
  owner = "tx.d2"
  if mixing not in D.D2_MIXINGS:
    raise ValueError(f"{owner}(mixing={mixing!r}) is not allowed: use one of {list(D.D2_MIXINGS)}")
  phases = _phases(topology, owner, "metropolis_hastings")
  init = D.d2(optax.identity(), None).init

  def make(n):
    ws = phases(n)
    D.check_d2_mixing(ws, mixing)
    if mixing == "lazy":
      ws = [(w + np.eye(n)) / 2 for w in ws]
    return A.d2(optax.identity(), Gossip(ws, axis_name))

  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name, needs_params=True,
                  name=owner)


def gossip_pga(period: int, topology: Topologyish, *, axis_name: Any, order: str = "atc"
               ) -> optax.GradientTransformationExtraArgs:
  """Gossip-PGA (Chen, Yuan, Zhang, Pan, Yin, Yan, ICML 2021, Algorithm 1) after the
  optimizer: D-PSGD's gossip (:func:`gossip`) on every update, and after every ``period``-th
  one a global average of the models (an all-reduce) in its place. Bytes: the gossip's, and a
  ring all-reduce of the model at each period end.

  Raises:
    ValueError: ``period`` < 1, and as :func:`gossip`.
  """
  owner = "tx.gossip_pga"
  period = _check_period(period, owner)
  phases = _phases(topology, owner, "metropolis_hastings")
  if order not in DPSGD_ORDERS:
    raise ValueError(f"{owner}(order={order!r}) is not allowed: use one of {list(DPSGD_ORDERS)}")
  init = A.gossip_pga(optax.identity(), None, None, order).init
  make = lambda n: A.gossip_pga(optax.identity(), Gossip(phases(n), axis_name),
                                AllReduce(n, axis_name), order)
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name,
                  period=period, needs_params=True, name=owner)


# ----------------------------------------------------------------------------- periodic


def local_sgd(period: int, *, axis_name: Any) -> optax.GradientTransformationExtraArgs:
  """Local SGD / LUPA-SGD (Haddadpour et al. 2019, Algorithm 1) after the optimizer: local
  steps, and after every ``period``-th update the models are averaged over the workers (an
  all-reduce; the optimizer's own state stays local). Bytes: a ring all-reduce of the model
  at each period end.

  Raises:
    ValueError: ``period`` < 1; (at update) ``axis_name`` not bound, ``params`` missing.
  """
  owner = "tx.local_sgd"
  period = _check_period(period, owner)
  build = lambda comm: A.local_sgd(optax.identity(), T.mean_of(comm, "alive"))
  make = lambda n: build(AllReduce(n, axis_name))
  return to_optax(_sized(make, build(None).init, axis_name, owner), axis_name=axis_name,
                  period=period, needs_params=True, name=owner)


def diloco(outer: optax.GradientTransformation, period: int, *, axis_name: Any,
           overlap: str = "none") -> optax.GradientTransformationExtraArgs:
  """DiLoCo (Douillard et al. 2023, Algorithm 1) after the inner optimizer: after every
  ``period`` = H updates, the pseudo-gradient ``Delta = x_outer - mean_i x_i`` goes through
  ``outer`` (e.g. ``optax.sgd(0.7, momentum=0.9, nesterov=True)``), ``x_outer <- x_outer +
  outer(Delta)`` and every worker restarts from ``x_outer``. ``init`` keeps ``x_outer`` =
  the initial params (give every worker the same). ``overlap="delayed"``: the all-reduce
  overlaps the next H updates and the outer step uses the mean that landed, one outer step
  late (pccl's async DiLoCo); ``"eager"``: with each worker's own fresh share in place of its
  stale one (Kale et al. 2025, arXiv 2502.12996).

  Raises:
    ValueError: ``period`` < 1, an unknown ``overlap``; (at update) ``axis_name`` not bound,
      ``params`` missing.
  """
  owner = "tx.diloco"
  period = _check_period(period, owner)
  build = lambda comm: A.diloco(optax.identity(), T.mean_of(comm, "alive"), outer, overlap,
                                period)
  build(None)  # the overlap's check, at once
  make = lambda n: build(AllReduce(n, axis_name))
  return to_optax(_sized(make, build(None).init, axis_name, owner), axis_name=axis_name,
                  period=period, needs_params=True, name=owner)


def streaming_diloco(outer: optax.GradientTransformation, period: int, fragments: int, *,
                     axis_name: Any, delay: int = 0, alpha: float = 0.0
                     ) -> optax.GradientTransformationExtraArgs:
  """Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512, Sec. 2.2-2.3) after the inner
  optimizer: DiLoCo (:func:`diloco`) whose ``fragments`` (contiguous groups of the parameter
  arrays) synchronise in turn, one every ``period / fragments`` updates, each all-reduce
  launched ``delay`` updates before it lands, merged with mixing factor ``alpha`` (0: the
  outer model's fragment). The schedule is the framework's
  (:class:`~nbsgd_jax.host.periods.FragmentPlanner`), drawn from the step counter.

  Raises:
    ValueError: ``period`` < 1, ``fragments`` not dividing it, ``delay`` not in ``[0, period
      / fragments)``, ``alpha`` outside [0, 1]; (at update) ``axis_name`` not bound,
      ``params`` missing, fewer parameter arrays than fragments.
  """
  owner = "tx.streaming_diloco"
  period = _check_period(period, owner)
  planner = periods_lib.FragmentPlanner(period, _check_period(fragments, owner), delay)
  schedule = [planner.sync_now(step) for step in range(period)]  # one cycle: it repeats
  build = lambda comm: A.streaming_diloco(optax.identity(), T.mean_of(comm, "alive"), outer,
                                          fragments, delay, alpha)
  make = lambda n: build(AllReduce(n, axis_name))
  return to_optax(_sized(make, make(1).init, axis_name, owner), axis_name=axis_name,
                  schedule=schedule, needs_params=True, name=owner)


def sparta(density: float, *, axis_name: Any, seed: int = 0, mask: str = "broadcast"
           ) -> optax.GradientTransformationExtraArgs:
  """SPARTA (exo-explore/gym ``exogym/strategy/sparta.py``, commit 9fa323c) after the
  optimizer: every update, the mean over the workers of a random fraction ``density`` of the
  coordinates (the reference's ``p_sparta``; ``config.sparta.density``), the same on every
  worker (drawn from ``seed`` and the step). Bytes: a ring all-reduce of the selected
  float32 values, and with ``mask="broadcast"`` (the reference) the mask's ``d`` bytes from
  worker 0 to each other one; ``"seeded"`` sends no mask.

  Raises:
    ValueError: ``density`` not in (0, 1], an unknown ``mask``; (at update) ``axis_name`` not
      bound, ``params`` missing.
  """
  owner = "tx.sparta"
  if not 0.0 < float(density) <= 1.0:
    raise ValueError(f"{owner}(density={density!r}) is not allowed: it must be in (0, 1]")
  MaskedAllReduce(2, axis_name, mask=mask)  # the mask's check, at once
  init = A.sparta(optax.identity(), None, density, seed).init
  make = lambda n: A.sparta(optax.identity(), MaskedAllReduce(n, axis_name, mask=mask), density,
                            seed)
  return to_optax(_sized(make, init, axis_name, owner), axis_name=axis_name, needs_params=True,
                  name=owner)


class NonblockingState(NamedTuple):
  """State of :func:`nonblocking_accumulate`: ``calls`` (int32, mini-batches seen) and the
  accumulator's :class:`~nbsgd_jax.transforms.AccumulateState`."""

  calls: jax.Array
  acc: Any


def nonblocking_accumulate(num_minibatches: int,
                           inner: Optional[optax.GradientTransformation] = None
                           ) -> optax.GradientTransformationExtraArgs:
  """Non-blocking SGD's accumulation (He & Dube 2022), like ``optax.MultiSteps``: one call
  per mini-batch gradient; of each round of ``M = num_minibatches`` calls the first ``count``
  (extra argument, int, mini-batches this worker finished by the deadline, clipped to
  ``[0, M]``) are summed, and at the M-th call ``inner`` steps on their mean (forwarded
  ``count=`` so a weighted :func:`allreduce_mean` inside ``inner`` weights by it); zero
  updates otherwise, and no step at all when ``count == 0``. Built on
  :func:`~nbsgd_jax.transforms.accumulate_minibatches`.

  Args:
    num_minibatches: ``M`` >= 1.
    inner: the rest of the step (e.g. ``optax.chain(allreduce_mean(axis_name="w",
      weighted=True), optax.sgd(lr))``); default the identity (the mean gradient itself).

  Raises:
    ValueError: ``M`` < 1; TypeError (at update): ``count`` missing.
  """
  m = _check_period(num_minibatches, "tx.nonblocking_accumulate")
  acc = T.accumulate_minibatches(inner if inner is not None else optax.identity())

  def init(params):
    return NonblockingState(jnp.zeros((), jnp.int32), acc.init(params))

  def update(updates, state, params=None, *, count=None, **extra):
    if count is None:
      raise TypeError("tx.nonblocking_accumulate: update needs count= (mini-batches this "
                      "worker finished by the deadline in this round)")
    count = jnp.clip(jnp.asarray(count, jnp.int32), 0, m)
    j = state.calls % m
    u, s = acc.update(updates, state.acc, params, finished=j < count, emit=j == m - 1,
                      count=count, **extra)
    return u, NonblockingState(state.calls + 1, s)

  return optax.GradientTransformationExtraArgs(init, update)
