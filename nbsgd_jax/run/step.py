"""The compiled program of a run: ``k`` consecutive steps of every worker in one dispatch.

The program of one worker for one step (on the ``"workers"`` axis)::

    batch = task.batch(data, step)                              # the task
    loss, grads, model_state = gradient_source(loss_fn, params, model_state, batch, ctx)
    ctx = ctx._replace(learning_rate=..., opt_step=...)         # the optimizer's, from state
    updates, state, report = recipe.transform.update(grads, state, params, ctx)
    params = optax.apply_updates(params, updates)

``model_state`` (BatchNorm's running statistics) stays with its worker: the gradient source
updates it, no transform sees it. :class:`Program` runs ``k`` such steps (``config.
steps_per_dispatch``; ``k = 1`` is the same path) as one ``lax.scan`` per run of steps with
the same period end, on the backend, with the state donated and the parameters double
buffered (``config.double_buffer``); one cache holds its compiled programs. The host's
inputs of each step (:func:`host_context`) go in stacked (:func:`device_contexts`). The wall
clock's step (``cluster.clock="wall"``) is :class:`nbsgd_jax.run.wallclock.WallClockStep`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax import lax

from nbsgd_jax.host import cluster_config
from nbsgd_jax.recipes import optim
from nbsgd_jax.run import gathered as gathered_lib
from nbsgd_jax import transforms
from nbsgd_jax.core.axis import varying_like
from nbsgd_jax.transforms import CONTEXT_AXES, StepContext


class TrainState(NamedTuple):
  """Per-worker train state; every leaf has a leading worker axis ``[n, ...]``.

  Attributes:
    params: model parameters of each worker.
    opt_state: each worker's transform state.
    step: int32 ``[n]``, steps taken (the same on every worker).
    model_state: each worker's model state besides the parameters (BatchNorm's running
      statistics; ``()`` / ``{}`` when the model has none), updated by its own batches only.
  """

  params: Any
  opt_state: Any
  step: jax.Array
  model_state: Any = ()


def full_batch(loss_fn, params, model_state, batch, ctx):
  """``(loss, grads, model_state)`` of the whole batch (``loss_fn(params, model_state, batch)
  -> (loss, model_state)``)."""
  del ctx
  (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, model_state, batch)
  return loss, grads, model_state


def minibatches(num_minibatches: int, unroll: bool = False) -> Callable:
  """Non-blocking SGD's gradient source (He & Dube 2022): the mean over the first
  ``ctx.count`` of ``M`` mini-batches
  (:func:`nbsgd_jax.transforms.minibatch_mean_gradient`: the model state goes
  through the finished mini-batches only); the loss is the mean over the finished
  mini-batches (0 if none). ``unroll``: the loop over the mini-batches unrolled
  (``nonblocking.unroll``)."""

  def source(loss_fn, params, model_state, batch, ctx):
    grads, loss, _, model_state = transforms.minibatch_mean_gradient(
        loss_fn, params, model_state, batch, num_minibatches, ctx.count, unroll=unroll)
    return loss, grads, model_state

  return source


def gradient_source(cfg: ml_collections.ConfigDict) -> Callable:
  """Counted mini-batches whenever workers may contribute unequal work
  (:func:`nbsgd_jax.host.cluster.counted_steps`: Non-blocking SGD's ``M``, failures' single batch,
  :func:`nbsgd_jax.host.cluster.num_minibatches`), else the whole batch."""
  if cluster_config.counted_steps(cfg):
    return minibatches(cluster_config.num_minibatches(cfg), cfg.nonblocking.unroll)
  return full_batch


def make_worker_step(s, period_end: bool = True) -> Callable:
  """The program of one worker for one step (module docstring).

  Returns:
    ``(state, data, ctx, hparams=None) -> (state, (loss, report))`` on one worker's
    (unbatched) state, shard, :class:`~nbsgd_jax.transforms.StepContext` and the run's
    hyperparameters (:func:`nbsgd_jax.run.hparams.values`, arrays; None: those the run was built
    with); ``loss`` is the float32 mini-batch loss before the update, ``report`` the
    recipe's (``bytes_sent`` ...).
  """
  source, task = gradient_source(s.cfg), s.task

  def step_fn(state: TrainState, data, ctx: StepContext, hparams=None):
    ctx = ctx._replace(period_end=period_end, hparams=hparams)
    seed = None if hparams is None else hparams["seed"]
    batch = task.batch(data, data_index(state, ctx), s.backend.axis_name, seed)
    loss, grads, model_state = source(task.loss_fn, state.params, state.model_state, batch,
                                      ctx)
    return apply_update(s, state._replace(model_state=model_state), loss, grads, ctx)

  return step_fn


def data_index(state: TrainState, ctx: StepContext):
  """int32 scalar: the index of the worker's data draw this step (its batch, augmentation
  and the key of any randomness of the task): the event clock's ``ctx.events.sample`` (the
  gradients the worker applied before: its k-th gradient reads draw k), else the step number
  (on the lockstep clock a worker's k-th gradient is step k's). So a worker's k-th gradient
  sees the same data whichever clock runs it (common random numbers, ``docs/algorithms.md``,
  "The event clock")."""
  events = ctx.events
  if events is None or events.sample is None:
    return state.step
  return events.sample.astype(state.step.dtype)


def apply_update(s, state: TrainState, loss, grads, ctx: StepContext):
  """The recipe's update of one worker from its gradient: ``(state, (loss, report))``; the
  recipe's transform sees ``ctx`` with the local optimizer's ``learning_rate`` and
  ``opt_step`` of this step, read from the worker's state (:func:`nbsgd_jax.recipes.optim.
  step_rate`: the optimizer's own count and its schedule there, never a second counter)."""
  rate, count = optim.step_rate(s.cfg, state.opt_state, ctx.hparams)
  ctx = ctx._replace(learning_rate=rate, opt_step=count)
  updates, opt_state, report = s.recipe.transform.update(grads, state.opt_state, state.params,
                                                         ctx)
  params = optax.apply_updates(state.params, updates)
  return TrainState(params, opt_state, state.step + 1, state.model_state), (loss, report)




class ProgramCache:
  """The process's compiled programs, by structure (:func:`nbsgd_jax.run.hparams.structure_key`):
  a run whose config differs from an earlier one only in its hyperparameters and host keys
  finds its programs here and compiles nothing (``docs/design.md``, "Runs as data"). Least
  recently used structures beyond ``max_structures`` are dropped (a program holds its first
  run's set-up, data included).

  Args:
    max_structures: structures kept.
  """

  def __init__(self, max_structures: int = 8):
    self.max_structures = max_structures
    self._entries: dict = {}  # structure -> {name: value}, in order of use

  def get(self, structure: str, name: Any, make: Callable) -> Any:
    """The value of ``name`` under ``structure``, made by ``make()`` the first time. An empty
    ``structure`` shares nothing (always ``make()``)."""
    if not structure:
      return make()
    entry = self._entries.pop(structure, None)
    entry = {} if entry is None else entry
    self._entries[structure] = entry  # most recently used last
    while len(self._entries) > self.max_structures:
      self._entries.pop(next(iter(self._entries)))
    if name not in entry:
      entry[name] = make()
    return entry[name]

  def clear(self) -> None:
    """Forget every program (the next run compiles anew)."""
    self._entries.clear()


PROGRAMS = ProgramCache()  # train()'s cache: one per process


class Program:
  """``(state, data, ctx, keys, inputs=None, hparams=None) -> (state, outs)``: ``k =
  len(keys)`` steps in one dispatch, each the program of :func:`make_worker_step` for its
  static period end ``keys[j]``; consecutive steps with the same period end (a run) are one
  ``lax.scan`` (a run of one step is the step itself, no loop). ``ctx`` from
  :func:`device_contexts`; ``hparams`` the run's hyperparameters (None: ``s.hparams``);
  ``outs``: per run ``(loss [n, m], report [n, m])`` of its ``m`` steps. One program is
  compiled per run-length pattern of ``keys`` (``(True,)`` for one step; ``(False x 3,
  True)`` for local SGD with tau = 4), kept in ``cache`` under the run's structure (every
  run of that structure shares them); the state is donated, and with
  ``config.double_buffer`` the new parameters are written into the spare buffers of the
  dispatch before (:func:`double_buffered`).

  With ``runs = R`` (not None) the program steps R runs of the structure at once (a sweep's
  group):
  ``jax.vmap`` over a leading runs axis of the state, the data (unless ``shared_data``: one
  copy for all), the contexts (:func:`stacked_contexts`) and the hparams; ``outs`` then
  ``[R, n, m]``.

  Args:
    s: the run's :class:`~nbsgd_jax.run.setup.Setup` (the first run's, with ``runs > 1``).
    cache: the :class:`ProgramCache` (default: the process's, :data:`PROGRAMS`).
    runs: R, the runs stepped together on a runs axis (None: one run, no runs axis).
    shared_data: with ``runs``, whether every run reads the same worker data.
  """

  stacked = True  # outs per run of steps, each [n, m]

  def __init__(self, s, cache: Optional[ProgramCache] = None, runs: Optional[int] = None,
               shared_data: bool = False):
    self.s, self.runs, self.shared_data = s, runs, bool(shared_data)
    self.cache = PROGRAMS if cache is None else cache
    self._spare: list = []  # the double buffer: the parameters' buffers of the dispatch before

  def _compile(self, runs: tuple, gather: Optional[int] = None):
    if gather is not None:
      spmd = _gathered_program(self.s, runs, self.runs is not None, self.shared_data, gather)
    else:
      spmd = self.s.backend.spmd(_scanned_steps(self.s, runs), (0, 0, CONTEXT_AXES, None))
    if self.runs is not None and gather is None:  # the runs axis, outside the workers'
      spmd = jax.vmap(spmd, in_axes=(0, None if self.shared_data else 0, 0, 0))
    if not self.s.cfg.double_buffer:
      return jax.jit(spmd, donate_argnums=(0,))
    return jax.jit(double_buffered(spmd), donate_argnums=(0, 1), keep_unused=True)

  def context(self, inputs: list) -> StepContext:
    """The program's ``ctx`` of the steps' host inputs (:func:`device_contexts`)."""
    return device_contexts(self.s, inputs)

  def __call__(self, state, data, ctx, keys, inputs=None, hparams=None):
    del inputs  # drawn already: ctx holds them
    if not self.s.recipe.periodic:
      keys = (True,) * len(keys)
    hparams = self.s.hparams if hparams is None else hparams
    runs = tuple((key, len(list(group))) for key, group in itertools.groupby(keys))
    gather = (gathered_lib.dispatch_bucket(ctx.events.compute, self.s.cfg.num_workers)
              if gathers(self.s, ctx) else None)  # the bucket of the gathered gradients
    program = self.cache.get(self.s.structure,
                             ("train", runs, self.runs, self.shared_data, gather),
                             lambda: self._compile(runs, gather))
    if not self.s.cfg.double_buffer:
      return program(state, data, ctx, hparams)
    buffers = self._spare.pop() if self._spare else fresh_like(state.params)
    old_state, params, outs = program(state, buffers, data, ctx, hparams)
    self._spare.append(old_state.params)
    return old_state._replace(params=params), outs


def _scanned_steps(s, runs: tuple) -> Callable:
  """One worker's program for the steps of ``runs`` (``(period_end, length)`` pairs)."""

  def worker(state, data, ctx, hparams):
    outs, offset = [], 0
    for key, length in runs:
      step_fn = make_worker_step(s, key)
      part = jax.tree.map(lambda x, o=offset, m=length: x[o:o + m], ctx)
      if length == 1:  # one step: no loop around it (as fast to compile and run as before)
        state, out = step_fn(state, data, jax.tree.map(lambda x: x[0], part), hparams)
        out = jax.tree.map(lambda x: x[None], out)
      else:
        state, out = lax.scan(lambda st, c, f=step_fn: _same_types(st, f(st, data, c, hparams)),
                              state, part)
      outs.append(out)
      offset += length
    return state, tuple(outs)  # per run: its steps' reports may have other keys

  return worker


def gathers(s, ctx: StepContext) -> bool:
  """Whether the run's steps compute only the computing workers' gradients
  (:mod:`nbsgd_jax.run.gathered`): ``config.gather_gradients``, an event clock that names
  them (``ctx.events.compute``), the whole-batch gradient source and the simulate backend
  (one device holds every worker; on a mesh each device computes its own workers')."""
  events = ctx.events
  return bool(s.cfg.gather_gradients and events is not None
              and getattr(events, "compute", None) is not None
              and s.backend.name == "simulate" and gradient_source(s.cfg) is full_batch)


def _steps_first(ctx: StepContext) -> StepContext:
  """A stacked context (per-worker fields ``[n, k]``, the others ``[k, ...]``) with the
  steps' axis first everywhere, for ``lax.scan``."""
  fields = {}
  for name, axis in zip(StepContext._fields, CONTEXT_AXES):
    value = getattr(ctx, name)
    fields[name] = value if value is None or axis is None else jax.tree.map(
        lambda x: jnp.moveaxis(x, 1, 0), value)
  return StepContext(**fields)


def _gathered_step(s, period_end, size: int) -> Callable:
  """Every worker's step on stacked ``[n, ...]`` arrays, the gradients computed for the
  workers of ``ctx.events.compute`` only, in a bucket of ``size``
  (:func:`nbsgd_jax.run.gathered.gathered_gradients`): ``(state, data, ctx, hparams) ->
  (state, (loss [n], report [n]))``, ``ctx`` one step's (per-worker fields ``[n]``)."""
  task, axes = s.task, (0, 0, CONTEXT_AXES, None)
  source = lambda p, ms, b: full_batch(task.loss_fn, p, ms, b, None)
  gradients = gathered_lib.gathered_gradients(source, size, s.cfg.num_workers)

  def batch_fn(state, data, ctx, hparams):
    return task.batch(data, data_index(state, ctx), s.backend.axis_name, hparams["seed"])

  def update_fn(state, loss, grads, ctx, hparams):
    return apply_update(s, state, loss, grads, ctx._replace(period_end=period_end,
                                                            hparams=hparams))

  batches = s.backend.spmd(batch_fn, axes)
  updates = s.backend.spmd(update_fn, (0, 0, 0, CONTEXT_AXES, None))

  def step(state, data, ctx, hparams):
    batch = batches(state, data, ctx, hparams)
    loss, grads, model_state, computed = gradients(state.params, state.model_state, batch,
                                                   ctx.events.compute)
    state, (loss, report) = updates(state._replace(model_state=model_state), loss, grads, ctx,
                                    hparams)
    return state, (loss, {**report, "grads_computed": computed})

  return step


def _gathered_program(s, runs: tuple, stacked_runs: bool, shared_data: bool,
                      size: int) -> Callable:
  """:class:`Program`'s function of the gathered steps (:func:`gathers`) with a bucket of
  ``size`` (the dispatch's, :func:`nbsgd_jax.run.gathered.dispatch_bucket`): ``(state, data,
  ctx, hparams) -> (state, outs)`` as the plain one's."""

  def scanned(state, data, ctx, hparams):
    ctx, outs, offset = _steps_first(ctx), [], 0
    for key, length in runs:
      step = _gathered_step(s, key, size)
      part = jax.tree.map(lambda x, o=offset, m=length: x[o:o + m], ctx)
      if length == 1:  # one step: no loop around it (as the plain program)
        state, out = step(state, data, jax.tree.map(lambda x: x[0], part), hparams)
        out = jax.tree.map(lambda x: x[None], out)
      else:
        state, out = lax.scan(lambda st, c, f=step: f(st, data, c, hparams), state, part)
      outs.append(jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), out))  # [n, m]
      offset += length
    return state, tuple(outs)

  if stacked_runs:
    return jax.vmap(scanned, in_axes=(0, None if shared_data else 0, 0, 0))
  return scanned


def _same_types(carry, out):
  """``out = (state, report)`` with every leaf of ``state`` varying over the mesh axes its
  input in ``carry`` varies over (a scan's carry keeps its type: a transform may return a
  constant where its state held a per-worker value, e.g. streaming DiLoCo's pending
  fragment)."""
  state, report = out
  return jax.tree.map(lambda new, old: varying_like(new, old), state, carry), report


def double_buffered(spmd_step: Callable) -> Callable:
  """``spmd_step`` writing the new parameters into a second set of buffers (``cfg.
  double_buffer``): ``(state, spare, data, ctx, hparams) -> (state with the old parameters, new
  parameters, out)``, to be compiled with ``state`` and ``spare`` donated and kept.

  Why: a step that mixes the models (gossip) cannot update the parameters in place (worker
  i reads its neighbours' old rows), so XLA writes them to a fresh ``[n, ...]`` buffer and
  copies that into the donated one; on a CPU the fresh buffer's pages are also faulted in at
  every step (``docs/scaling.md``). Here the old parameters go out unchanged into their own
  buffers and the new ones into ``spare``'s, which the caller passes back at the next
  dispatch. Donated inputs are matched to outputs of the same shape and dtype in order, so
  the outputs are ordered as the inputs: the state's leaves (old parameters first), then the
  new parameters in ``spare``'s place.
  """
  def program(state, spare, data, ctx, hparams):
    del spare  # donated and kept: its buffers receive the new parameters
    new, out = spmd_step(state, data, ctx, hparams)
    return new._replace(params=state.params), new.params, out

  return program


@jax.jit
def fresh_like(tree):
  """New buffers of ``tree``'s shapes and dtypes, placed as ``tree`` is (its sharding and
  whether it is committed to its devices follow, so the step that receives them compiles
  once); the values are ``tree * 0``."""
  return jax.tree.map(lambda x: x * 0, tree)


# ----------------------------------------------------------------------------- host inputs


def host_context(s, inputs) -> StepContext:
  """The host inputs of a step as numpy arrays: ``count`` per worker (int32 ``[n]``), the
  other values once, the same for every worker (:data:`~nbsgd_jax.transforms.CONTEXT_AXES`;
  None stays None); the open parts (``inputs.shared``, ``inputs.per_worker``) as dicts of
  arrays, None when empty; the event masks (``inputs.events``) as arrays.

  Raises:
    ValueError: a ``per_worker`` entry or an event mask whose leading axis is not the n
      workers (named).
  """
  n = s.cfg.num_workers

  def once(x, dtype):
    return None if x is None else np.asarray(x, dtype)

  def rows(name, value):
    if np.ndim(value) == 0 or np.shape(value)[0] != n:
      raise ValueError(f"HostInputs.{name} has shape {np.shape(value)}: [n = {n}, ...] is "
                       "allowed (one row per worker)")
    return np.asarray(value)

  per_worker = {k: rows(f"per_worker[{k!r}]", v) for k, v in inputs.per_worker.items()}
  events = inputs.events
  if events is not None:
    events = type(events)(*(None if v is None else rows(f"events.{f}", v)
                            for f, v in zip(events._fields, events)))
  return StepContext(once(inputs.step, np.int32), np.asarray(inputs.count, np.int32),
                     once(inputs.total, np.int32), once(inputs.active, bool),
                     once(inputs.alive, bool), once(inputs.target, np.float32),
                     shared={k: np.asarray(v) for k, v in inputs.shared.items()} or None,
                     per_worker=per_worker or None, events=events)


def _place_context(s, ctx: StepContext) -> StepContext:
  """``ctx`` as the program takes it (the backend's ``stage``): on a mesh, the per-worker
  fields split over the workers, the others whole on every device."""
  # numpy, never jnp.asarray: that would dispatch an operation that waits for the step still
  # running on the device (measured: 4 waits a step at n = 64)
  return s.backend.stage(CONTEXT_AXES, ctx)


def device_context(s, inputs) -> StepContext:
  """The host inputs of a step as the workers' :class:`~nbsgd_jax.transforms.StepContext`
  (:func:`host_context`, placed for the backend): the compiled step's context, read with
  ``in_axes`` :data:`~nbsgd_jax.transforms.CONTEXT_AXES`."""
  return _place_context(s, host_context(s, inputs))


def _host_contexts(s, inputs: list) -> StepContext:
  """The numpy contexts of ``k`` consecutive steps, stacked (``count`` ``[n, k]``, the
  shared fields ``[k, ...]``)."""
  ctxs = [host_context(s, i) for i in inputs]
  stack = lambda ax, *subs: None if subs[0] is None else jax.tree.map(
      lambda *xs: np.stack(xs, axis=0 if ax is None else 1), *subs)
  return jax.tree.map(stack, CONTEXT_AXES, *ctxs, is_leaf=lambda x: x is None)


def device_contexts(s, inputs: list) -> StepContext:
  """The contexts of ``k`` consecutive steps, stacked (``count`` ``[n, k]``, the shared
  fields ``[k, ...]``), placed for the backend: the input of :class:`Program`."""
  return _place_context(s, _host_contexts(s, inputs))


def stacked_contexts(s, inputs: list) -> StepContext:
  """The contexts of R runs' ``k`` steps (``inputs[r]``: run r's host inputs), stacked on a
  leading runs axis (``count`` ``[R, n, k]``, the shared fields ``[R, k, ...]``): the input
  of a :class:`Program` with ``runs = R`` (the simulate backend: one device)."""
  per_run = [_host_contexts(s, mine) for mine in inputs]
  stack = lambda *xs: None if xs[0] is None else np.stack(xs)  # numpy: no eager wait
  return jax.tree.map(stack, *per_run, is_leaf=lambda x: x is None)


__all__ = ["PROGRAMS", "Program", "ProgramCache", "TrainState", "apply_update", "device_context", "device_contexts",
           "double_buffered", "fresh_like", "full_batch", "gradient_source", "host_context",
           "make_worker_step", "minibatches",
           "stacked_contexts"]
