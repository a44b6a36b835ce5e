"""The worker-transform protocol: optax's ``GradientTransformation`` with a step context and a
report.

A :class:`WorkerTransform` is the program of ONE worker for one part of a step. It runs inside
``jax.vmap`` / ``jax.shard_map`` over the worker axis and may use collectives on it::

    update(updates, state, params, ctx) -> (updates, state, report)

* ``updates``: what flows down the chain (gradients at the top, a parameter change at the
  bottom: the new parameters are ``optax.apply_updates(params, updates)``);
* ``ctx``: the step's :class:`StepContext`, drawn on the host (one typed object, the same
  for every transform of the chain);
* ``report``: a dict of float/int scalars. ``report["bytes_sent"]`` (bytes this worker sent
  in this step) and the per-communication keys ``"bytes/<key>"``, ``"rounds/<key>"`` are
  *summed* over a chain; every other key is owned by one transform (a duplicate is an
  error) and is logged per step (``steps.jsonl``).

:func:`chain` composes transforms (and plain optax ``GradientTransformation`` s, wrapped by
:func:`from_optax`) like ``optax.chain``. ``communications`` lists the
:class:`~nbsgd_jax.communications.Communication` objects a transform uses, so the host (the
simulated clock) can ask each one for its pattern.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

Report = dict
SUMMED_PREFIXES = ("bytes/", "rounds/")


class StepContext(NamedTuple):
  """Per-step inputs of one worker, drawn on the host (array inputs of the jitted step: a new
  value never recompiles).

  Attributes:
    step: int32 scalar, the (0-based) step number.
    count: int32 scalar, mini-batches this worker finished by the deadline (Non-blocking SGD,
      He & Dube 2022); ``M`` when blocking; 0 for a failed worker.
    total: int32 scalar, ``sum_i count_i`` over all workers (the same on every worker).
    active: bool ``[K]``, MATCHA's matching activations ``B_j`` of this step (the same on
      every worker); ``[1]`` and unused without MATCHA.
    alive: bool ``[n]``, the workers up at this step, or None when the run simulates no
      failures (``cluster.failures``).
    target: float32 scalar, the consensus-control target Xi (``inf``: not controlled at this
      step), or None when the run has no consensus control.
    period_end: static Python bool, whether this step ends a communication period (periodic
      synchronisation: local SGD, DiLoCo); True for every step of other recipes. The trainer
      compiles one program per value; on the host side it is None.
    hparams: the run's hyperparameters, a dict of arrays (the same on every worker and every
      step: the program's second input, ``docs/design.md`` "Runs as data"), read by the
      transforms made with :func:`injected`; None: each uses the values it was built with.
    shared: the open part of the context: a dict ``{key: array}`` that host parts add
      (``HostInputs.shared``), the same on every worker; None when no part adds one.
    per_worker: the open per-worker part: a dict ``{key: array}`` (``HostInputs.
      per_worker``, ``[n, ...]`` on the host), each worker reading its own row (a worker's
      own step count, the age of its gradient); None when no part adds one. Its keys and
      shapes are the program's structure (a new key compiles), its values are not.
    events: the event clock's per-worker masks of this step, an
      :class:`~nbsgd_jax.transforms.asynchronous.Events` (``HostInputs.events``), each worker
      reading its own row; None on the lockstep clock.
    learning_rate: float32 scalar, ``eta_t``: the learning rate this worker's local optimizer
      (:meth:`nbsgd_jax.recipes.Builder.optimizer`) applies at this step, the same number
      (its schedule at its own count :attr:`opt_step`, warm-up and decay included). Filled in
      on the device from the worker's state before the recipe's transform runs
      (:func:`nbsgd_jax.recipes.optim.step_rate`); None on the host, in ``nbsgd_jax.tx`` and
      where the recipe's state holds no scheduled optax optimizer.
    opt_step: int32 scalar, the local optimizer's own count of the updates it applied before
      this step (optax's ``count``): it does not advance on the steps the optimizer skips
      (Non-blocking SGD's idle worker, a failed worker, an event clock's idle worker), so it
      may lag :attr:`step`; None where :attr:`learning_rate` is.
  """

  step: jax.Array
  count: jax.Array
  total: jax.Array
  active: jax.Array
  alive: Any = None
  target: Any = None
  period_end: Any = None
  hparams: Any = None
  shared: Any = None
  per_worker: Any = None
  events: Any = None
  learning_rate: Any = None
  opt_step: Any = None


# ``jax.vmap`` in_axes of a context given to the backends (``Backend.spmd``): ``count`` and
# the ``per_worker`` dict and the ``events`` masks are per worker, every other field is the same on every worker and
# goes in as one value (an unbatched / replicated input), not n copies (``alive`` would be
# ``[n, n]``). An entry covers a whole subtree (a prefix, as ``jax.vmap``'s in_axes).
# ``learning_rate`` and ``opt_step`` are None on the host (each worker's program fills them in).
CONTEXT_AXES = StepContext(step=None, count=0, total=None, active=None, alive=None, target=None,
                           period_end=None, hparams=None, shared=None, per_worker=0,
                           events=0, learning_rate=None, opt_step=None)


class WorkerTransform(NamedTuple):
  """One worker's transformation of a step (see module docstring).

  Attributes:
    init: ``params -> state`` for one worker.
    update: ``(updates, state, params, ctx) -> (updates, state, report)``.
    communications: the communication objects used (host halves: the clock's patterns).
  """

  init: Callable[[Any], Any]
  update: Callable[[Any, Any, Any, StepContext], tuple[Any, Any, Report]]
  communications: tuple = ()


def is_summed(key: str) -> bool:
  """Whether a report key is summed over a chain (``bytes_sent``, ``bytes/*``, ``rounds/*``)
  rather than owned by one transform."""
  return key == "bytes_sent" or key.startswith(SUMMED_PREFIXES)


def merge_reports(*reports: Report) -> Report:
  """One report from several: ``bytes_sent``, ``bytes/*`` and ``rounds/*`` are summed.

  Raises:
    ValueError: another key appears in two reports (each transform owns its keys).
  """
  out: Report = {}
  for rep in reports:
    for k, v in rep.items():
      if k in out:
        if not is_summed(k):
          raise ValueError(f"report key {k!r} is written by two transforms of one chain")
        out[k] = out[k] + v
      else:
        out[k] = v
  return out


def from_optax(tx: optax.GradientTransformation) -> WorkerTransform:
  """Any optax ``GradientTransformation`` as a :class:`WorkerTransform` (no communication,
  empty report)."""

  def update(updates, state, params, ctx):
    del ctx
    updates, state = tx.update(updates, state, params)
    return updates, state, {}

  return WorkerTransform(tx.init, update)


def as_worker_transform(t) -> WorkerTransform:
  """``t`` itself if it is a :class:`WorkerTransform`, else :func:`from_optax` of it.

  Raises:
    TypeError: ``t`` is neither.
  """
  if isinstance(t, WorkerTransform):
    return t
  if isinstance(t, optax.GradientTransformation):
    return from_optax(t)
  raise TypeError(f"{t!r} is neither a WorkerTransform nor an optax GradientTransformation")


def chain(*transforms) -> WorkerTransform:
  """Apply transforms in sequence (``optax.chain`` for worker transforms); optax
  ``GradientTransformation`` s may be mixed in. The state is the tuple of the states, the
  report :func:`merge_reports` of the reports, ``communications`` the concatenation."""
  ts = tuple(as_worker_transform(t) for t in transforms)

  def init(params):
    return tuple(t.init(params) for t in ts)

  def update(updates, state, params, ctx):
    new_states, reports = [], []
    for t, s in zip(ts, state):
      updates, s, r = t.update(updates, s, params, ctx)
      new_states.append(s)
      reports.append(r)
    return updates, tuple(new_states), merge_reports(*reports)

  return WorkerTransform(init, update, sum((t.communications for t in ts), ()))


def skip_unless(inner, keep: Callable[[Any], Any]) -> WorkerTransform:
  """No step at all (zero updates, state unchanged) where ``keep(ctx)`` (a bool scalar) is
  False, in the spirit of ``optax.MultiSteps``' skip: an idle worker (:func:`skip_when_idle`),
  a node Teleportation does not activate this round."""
  inner = as_worker_transform(inner)

  def update(updates, state, params, ctx):
    on = keep(ctx)
    new_updates, new_state, report = inner.update(updates, state, params, ctx)
    new_updates = jax.tree.map(lambda u: jnp.where(on, u, jnp.zeros_like(u)), new_updates)
    return new_updates, tree_where(on, new_state, state), report

  return WorkerTransform(inner.init, update, inner.communications)


def skip_when_idle(inner, scope: str = "local") -> WorkerTransform:
  """No step at all (zero updates, state unchanged) when no mini-batch was finished.

  The rule of Non-blocking SGD (He & Dube 2022, Sec. 3) and of a failed worker
  (:func:`skip_unless`): ``scope="local"`` skips where this worker finished nothing
  (``ctx.count == 0``; decentralized form), ``"global"`` where no worker did
  (``ctx.total == 0``; all-reduce form, the same on every worker).

  Raises:
    ValueError: unknown ``scope``.
  """
  if scope not in ("local", "global"):
    raise ValueError(f"scope={scope!r} is not allowed: use 'local' or 'global'")
  return skip_unless(inner, lambda ctx: (ctx.count if scope == "local" else ctx.total) > 0)


def injected(factory: Callable[[dict], Any], defaults: dict) -> WorkerTransform:
  """A transform whose numbers are inputs of the step: ``factory(values)`` (a
  :class:`WorkerTransform` or an optax ``GradientTransformation``) is built at every update
  from ``ctx.hparams[k]`` for each key ``k`` of ``defaults`` (traced arrays), so one
  compiled program runs every value; ``init`` and a context without hparams use
  ``defaults``. The idea of ``optax.inject_hyperparams``, with the values in the step's
  context instead of the state (a sweep's runs share one state structure; a checkpoint does
  not hold them).

  Args:
    factory: ``{key: value} -> transform``; the structure of its state must not depend on
      the values (e.g. SGD's momentum buffer exists for every momentum > 0).
    defaults: ``{key: value}``, the values of the config the run was built from.

  Raises:
    KeyError: ``ctx.hparams`` lacks a key of ``defaults`` (named).
  """
  base = as_worker_transform(factory(dict(defaults)))

  def update(updates, state, params, ctx):
    if ctx.hparams is None:
      return base.update(updates, state, params, ctx)
    missing = [k for k in defaults if k not in ctx.hparams]
    if missing:
      raise KeyError(f"the step's hparams lack {missing}: they hold {sorted(ctx.hparams)}")
    inner = as_worker_transform(factory({k: ctx.hparams[k] for k in defaults}))
    return inner.update(updates, state, params, ctx)

  return WorkerTransform(base.init, update, base.communications)


def replace_params(params, new_params):
  """The updates that turn ``params`` into ``new_params`` (a transform that computes new
  parameters, e.g. a gossip or a synchronisation, returns these)."""
  return jax.tree.map(lambda new, old: new - old, new_params, params)


def tree_where(cond, new, old):
  """``new`` where the scalar bool ``cond`` holds, else ``old``, leaf by leaf (a masked
  update: a worker that is not in an event, a step that is skipped)."""
  return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def no_state(params) -> tuple:
  """``init`` of a stateless transform."""
  del params
  return ()

