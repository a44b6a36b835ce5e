"""The adapter from a worker transform to an optax transformation (:func:`to_optax`), the step
context it supplies (:func:`context`), the bytes in its state (:func:`bytes_sent`) and the
checks of the optax face's arguments; the constructors are in :mod:`nbsgd_jax.tx`."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from nbsgd_jax import codecs
from nbsgd_jax.communications import Gossip, collectives
from nbsgd_jax import topology as topology_lib
from nbsgd_jax import transforms as T
from nbsgd_jax.core.axis import varying_like


Topologyish = Union[str, topology_lib.Topology, np.ndarray, Sequence[Sequence[float]]]
_STOCHASTIC_TOL = 1e-6


class TxState(NamedTuple):
  """State of a transformation made by :func:`to_optax`.

  Attributes:
    inner: the worker transform's state (e.g. :class:`~nbsgd_jax.transforms.ErrorFeedbackState`).
    step: int32 scalar, updates applied so far (the step of :func:`context`).
    bytes_sent: float32 scalar, bytes this worker has sent so far (cumulative).
  """

  inner: Any
  step: jax.Array
  bytes_sent: jax.Array


def bytes_sent(state: Any) -> jax.Array:
  """Bytes sent so far, summed over every :class:`TxState` in ``state`` (a chain's state, a
  ``MultiSteps`` state, ...): a float32 scalar per worker (``[n]`` for a state stacked over
  ``n`` workers), 0 when there is none."""
  found = [s.bytes_sent for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, TxState))
           if isinstance(s, TxState)]
  return functools.reduce(jnp.add, found) if found else jnp.float32(0.0)


def axis_size(axis_name: Any, owner: str, where: str = "update") -> int:
  """The number of workers ``n`` on ``axis_name``.

  Raises:
    ValueError: no axis of that name is bound where ``owner``'s ``where`` (``"update"`` or
      ``"init"``) runs.
  """
  try:
    return collectives.axis_size(axis_name)
  except NameError:
    raise ValueError(
        f"{owner}(axis_name={axis_name!r}): no axis of that name is bound where {where} runs; "
        f"call it inside jax.vmap(..., axis_name={axis_name!r}), jax.shard_map over a mesh "
        f"axis {axis_name!r} or jax.pmap(..., axis_name={axis_name!r}), once per worker "
        f"(e.g. jax.vmap(opt.{where}, axis_name={axis_name!r}) over parameters [n, ...])"
    ) from None


def context(step: jax.Array, count: Any = None, axis_name: Any = None,
            period_end: bool = True, active: Any = None, shared: Any = None) -> T.StepContext:
  """The step context a user's loop implies: step ``step`` (int32), ``count`` mini-batches
  finished by this worker (the ``count`` extra argument; 1 when None) and their sum ``total``
  over ``axis_name`` (``lax.psum``; ``n`` when ``count`` is None), MATCHA's activations
  ``active`` (bool ``[M]``, the ``active`` extra argument, the same on every worker; none when
  None), what the host draws for all workers ``shared`` (a dict of arrays, the same on every
  worker: e.g. a round's random mixing matrix; none when None), every worker up, no
  consensus target."""
  if count is None:
    c = jnp.ones((), jnp.int32)
    total = jnp.asarray(collectives.axis_size(axis_name) if axis_name is not None else 1,
                        jnp.int32)
  else:
    c = jnp.asarray(count, jnp.int32)
    total = lax.psum(c, axis_name) if axis_name is not None else c
  active = jnp.zeros((1,), bool) if active is None else jnp.asarray(active, bool)
  return T.StepContext(jnp.asarray(step, jnp.int32), c, total, active, period_end=period_end,
                       shared=shared)


def to_optax(transform: T.WorkerTransform, *, axis_name: Any = None,
             period: Optional[int] = None, needs_params: bool = False,
             name: str = "to_optax", schedule: Optional[Sequence[Any]] = None
             ) -> optax.GradientTransformationExtraArgs:
  """A framework :class:`~nbsgd_jax.transforms.WorkerTransform` as an optax transformation.

  ``update(updates, state, params=None, *, count=None, active=None, shared=None, **extra)``
  builds the step's :func:`context` from the state's step counter (and the extra arguments
  ``count``, ``active`` and ``shared``) and runs ``transform.update``; the report's
  ``bytes_sent`` is added to :attr:`TxState.bytes_sent`, the rest is dropped.

  Args:
    transform: the worker transform.
    axis_name: the worker axis (checked to be bound at each update; None: no collective).
    period: for a periodic transform (local SGD, DiLoCo): ``ctx.period_end`` is True after
      every ``period``-th update (``(step + 1) % period == 0``, the framework's fixed
      periods). The framework compiles one program per value; here both are traced and
      ``lax.cond`` on the step, made one value over the axis (:func:`nbsgd_jax.communications.collectives.
      shared`), runs one of them (no collective in a local step).
    needs_params: ``update`` refuses ``params=None``.
    name: the public name in error messages.
    schedule: the general form of ``period``: ``ctx.period_end`` of update ``t`` is
      ``schedule[t % len(schedule)]`` (static hashable values, e.g. Streaming DiLoCo's
      :class:`~nbsgd_jax.host.periods.FragmentSync`); each distinct value is traced once
      and ``lax.switch`` on the step runs one. ``period`` p is ``[False] * (p - 1) + [True]``.

  Returns:
    an ``optax.GradientTransformationExtraArgs`` with state :class:`TxState`.

  Raises:
    ValueError (at init or update): ``axis_name`` is not bound; (at update) ``params`` is
      None and needed.
  """

  cycle = schedule if period is None else [False] * (period - 1) + [True]
  if cycle is not None:
    values = list(dict.fromkeys(cycle))  # the distinct values, one program each
    table = np.asarray([values.index(v) for v in cycle], np.int32)

  def init(params):
    if axis_name is not None:  # once per worker: on stacked [n, ...] params it would build
      axis_size(axis_name, name, "init")  # a state of the wrong shapes
    return TxState(transform.init(params), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))

  def run(updates, inner, params, ctx):
    u, inner, report = transform.update(updates, inner, params, ctx)
    sent = jnp.asarray(report.get("bytes_sent", 0.0), jnp.float32)
    return u, inner, varying_like(sent, updates)

  def update(updates, state, params=None, *, count=None, active=None, shared=None, **extra):
    del extra
    if axis_name is not None:
      axis_size(axis_name, name)
    if needs_params and params is None:
      raise ValueError(f"{name} returns the change to the parameters: call "
                       "update(updates, state, params) with this worker's params")
    ctx = context(state.step, count, axis_name, active=active, shared=shared)
    if cycle is None:
      u, inner, sent = run(updates, state.inner, params, ctx)
    else:
      index = jnp.asarray(table)[state.step % len(cycle)]
      if axis_name is not None:
        index = collectives.shared(index, axis_name)
      branches = [functools.partial(lambda flag, ops: run(*ops, ctx._replace(period_end=flag)),
                                    flag) for flag in values]
      u, inner, sent = lax.switch(index, branches, (updates, state.inner, params))
    return u, TxState(inner, state.step + 1, state.bytes_sent + sent)

  return optax.GradientTransformationExtraArgs(init, update)


def _sized(make: Callable[[int], T.WorkerTransform], init: Callable, axis_name: Any,
           owner: str) -> T.WorkerTransform:
  """A worker transform built for the axis size ``n`` at trace time (a topology name or an
  all-reduce needs ``n``); ``init`` does not depend on ``n``.

  Raises:
    ValueError (at trace time): ``init``'s state is not the structure the transform built for
      ``n`` initialises (a constructor's bug, which would otherwise run silently).
  """

  def update(updates, state, params, ctx):
    t = make(axis_size(axis_name, owner))
    want = jax.tree.structure(jax.eval_shape(t.init, updates))
    if jax.tree.structure(state) != want:
      raise ValueError(f"{owner}: its state {jax.tree.structure(state)} is not the state its "
                       f"transform initialises, {want}")
    return t.update(updates, state, params, ctx)

  return T.WorkerTransform(init, update)


# ----------------------------------------------------------------------------- arguments


def _check_period(period, owner: str) -> int:
  if isinstance(period, bool) or not isinstance(period, (int, np.integer)) or period < 1:
    raise ValueError(f"{owner}(period={period!r}) is not allowed: it must be an int >= 1")
  return int(period)


def check_compressor(compressor: Any, owner: str) -> Any:
  """``compressor`` if it is a :class:`~nbsgd_jax.codecs.Codec` or a callable taking
  ``(x, key)``.

  Raises:
    TypeError: anything else (names ``compressor`` and the signature expected).
  """
  if isinstance(compressor, codecs.Codec):
    return compressor
  expected = ("a compressor is (x [d], key) -> (values [cap], indices [cap]), e.g. "
              "functools.partial(nbsgd_jax.codecs.sparse.top_k, density=0.01), or a "
              "nbsgd_jax.codecs.Codec")
  if not callable(compressor):
    raise TypeError(f"{owner}(compressor={compressor!r}): {expected}")
  try:
    inspect.signature(compressor).bind(jnp.zeros(1), None)
  except TypeError as e:
    raise TypeError(f"{owner}(compressor={compressor!r}) cannot be called as "
                    f"compressor(x, key) ({e}): {expected}") from None
  except ValueError:  # no signature (a builtin): trust it
    return compressor
  return compressor


def check_mixing_matrix(w: Any, owner: str) -> np.ndarray:
  """A float64 ``[n, n]`` doubly stochastic matrix (non-negative, rows and columns summing to
  1 within 1e-6).

  Raises:
    ValueError: anything else, naming ``topology`` and what is wrong.
  """
  w = np.asarray(w, np.float64)
  bad = None
  if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
    bad = f"its shape is {w.shape}, not [n, n]"
  elif not np.all(np.isfinite(w)) or np.any(w < 0):
    bad = "it has negative or non-finite entries"
  else:
    rows, cols = np.abs(w.sum(1) - 1).max(), np.abs(w.sum(0) - 1).max()
    if max(rows, cols) > _STOCHASTIC_TOL:
      bad = (f"it is not doubly stochastic: its row sums differ from 1 by up to {rows:.2g} "
             f"and its column sums by up to {cols:.2g}, where the tolerance is "
             f"{_STOCHASTIC_TOL:.0e}")
  if bad:
    raise ValueError(f"{owner}(topology=<matrix>) is not allowed: {bad}; give a doubly "
                     f"stochastic [n, n] mixing matrix or a name from {sorted(topology_lib.TOPOLOGIES)}")
  return w


def _phases(topology: Topologyish, owner: str, weights: str) -> Callable[[int], list]:
  """``n -> [W_0, ...]`` (one matrix for a static graph): a name is built for the axis size,
  a matrix must match it."""
  if isinstance(topology, str):
    if topology not in topology_lib.TOPOLOGIES:
      raise ValueError(f"{owner}(topology={topology!r}) is not allowed: use one of "
                       f"{sorted(topology_lib.TOPOLOGIES)} or a doubly stochastic [n, n] matrix")

    def of_name(n):
      topo = topology_lib.make(topology, n, weights=weights)
      return ([topo.mixing_matrix_at(t) for t in range(topo.period)] if topo.is_time_varying
              else [topo.mixing_matrix])
    return of_name
  if isinstance(topology, topology_lib.Topology):
    fixed = Gossip.of_topology(topology).phases
  else:
    fixed = [check_mixing_matrix(topology, owner)]

  def of_matrix(n):
    if fixed[0].shape[0] != n:
      raise ValueError(f"{owner}(topology=<{fixed[0].shape[0]} x {fixed[0].shape[0]} matrix>) "
                       f"does not fit the axis: it has {n} workers")
    return fixed
  return of_matrix
