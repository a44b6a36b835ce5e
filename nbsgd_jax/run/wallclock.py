"""Non-blocking SGD on the wall clock (``cluster.clock="wall"``, ``backend="multihost"``).

He & Dube 2022's claim is about real time on a heterogeneous cluster; this runs it for real.
A step of each process (:class:`WallClockStep`)::

    deadline = the same on every process (from the finishing times exchanged last step)
    t0 = now
    for j in 0 .. M-1:                          # no collective: processes run apart
        sums_j = sums_{j-1} + (grad, loss) of mini-batch j of this process's workers
        (emulation: sleep until t0 + the cluster model's finish time of mini-batch j)
        stop at the deadline; a mini-batch that ends after it is dropped
    every process: the compiled collective step with its counts, and the counts, busy times
    and finishing times of every worker (exchanged inside the same program: a psum of
    one-hot rows), from which every process computes the same next deadline.

The update is the simulated run's program (the same :func:`nbsgd_jax.transforms.
add_minibatch` and :func:`nbsgd_jax.transforms.mean_of_sums`, then
:func:`nbsgd_jax.run.step.apply_update`), so feeding the recorded counts to a simulated run
gives the same losses.

Links (``cluster.emulate`` with ``cluster.levels``): after the collective step each process
also sleeps the seconds the step's blocking rounds take on the modelled hierarchical network
(the recipe's communications' rounds, as the simulated clock charges them, the slowest
worker's), added to the real (loopback) collective: per-level link delays on one machine.

Emulation (``cluster.emulate``): each process sleeps so that its mini-batch ``j`` finishes at
``t0 + finish[i, j]`` of the cluster model (:func:`nbsgd_jax.host.cluster.minibatch_finish_times`:
examples x time per example x slowdown + delays) whenever the real computation was faster:
heterogeneous workers on homogeneous hardware. A process holding several workers runs at the
pace of the slowest of them (its workers share its hardware and its counts).
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax.core import multihost
from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax import transforms
from nbsgd_jax.host.parts import Clock, HostPart
from nbsgd_jax.run import step as step_lib


class WallWorkload(HostPart):
  """The workload of a wall-clock run: the deadline (:class:`nbsgd_jax.host.cluster.
  DeadlineHistory` over the finishing times every process measured) and, once the step ran,
  what it measured.

  Inputs: ``deadline`` (seconds, ``inf`` when blocking or before anything was measured) and
  placeholders ``count`` (M), ``total`` and ``compute`` (0) that the step replaces by its
  measurements (:meth:`measured`): ``count`` int32 ``[n]``, ``compute`` (busy seconds before
  the collective step) and ``wall_step_s`` (seconds of the whole step). Record (steps.jsonl):
  ``counts``, ``deadline``, ``busy_s``, ``wall_step_s``.

  Args:
    cluster: the cluster model (its ``M``, and the times the emulation follows).
    nonblocking: whether workers stop at the deadline.
    deadline: the rule (:func:`nbsgd_jax.host.cluster.parse_deadline`); ``"fastest"`` and
      ``"kth:K"`` are estimated from the last ``window`` steps.
    adaptive_k, window: see :class:`nbsgd_jax.host.cluster.DeadlineHistory`.
    emulate: sleep to follow the cluster model.

  Raises:
    ValueError: a bad rule or parameter (named).
  """

  name = "workload"

  def __init__(self, cluster, nonblocking: bool, deadline="fastest", adaptive_k: float = 2.0,
               window: int = 10, emulate: bool = True):
    self.cluster, self.nonblocking, self.emulate = cluster, bool(nonblocking), bool(emulate)
    rule = cluster_lib.parse_deadline(deadline)
    if emulate:
      rule = cluster_lib.check_deadline(cluster, rule)
    self.history = cluster_lib.DeadlineHistory(cluster.n, rule, adaptive_k, window)

  def inputs(self, step, inputs, probe):
    n, m = self.cluster.n, self.cluster.num_minibatches
    inputs.update(deadline=self.history.deadline() if self.nonblocking else math.inf,
                  count=np.full(n, m, np.int32), total=np.int32(n * m), compute=np.zeros(n))

  def measured(self, step: int, inputs, shared: np.ndarray, wall_step_s: float) -> None:
    """What the step measured on every worker (``shared`` float ``[n, 3]``: count, busy
    seconds, finish time of the last counted mini-batch): the step's inputs and the next
    deadline.

    Raises:
      ValueError: no worker finished a mini-batch by a fixed deadline (named).
    """
    count = np.rint(shared[:, 0]).astype(np.int32)
    dl = inputs.deadline
    if self.nonblocking and count.sum() == 0:
      raise ValueError(
          f"nonblocking.deadline={self.history.rule!r} is not allowed: no process finished a "
          f"mini-batch by it ({dl:.4g} s) at step {step}; the busiest took "
          f"{float(shared[:, 1].max()):.4g} s")
    inputs.update(count=count, total=np.int32(count.sum()), compute=shared[:, 1].copy(),
                  wall_step_s=float(wall_step_s))
    if self.nonblocking:
      self.history.observe(cluster_lib.full_time_estimate(
          shared[:, 2], count, self.cluster.num_minibatches, dl))

  def observe(self, step, inputs, report, probe):
    return {"counts": np.asarray(inputs.count).tolist(), "deadline": float(inputs.deadline),
            "busy_s": np.asarray(inputs.compute).tolist(), "wall_step_s": inputs.wall_step_s}

  def state_dict(self):
    return self.history.state_dict()

  def load_state_dict(self, d):
    self.history.load_state_dict(d)


def local_workers(backend) -> np.ndarray:
  """int ``[k]``: the workers this process holds, in increasing order."""
  probe = jax.make_array_from_callback(
      (backend.num_workers,), NamedSharding(backend.mesh, P(backend.mesh.axis_names[0])),
      lambda idx: np.arange(backend.num_workers, dtype=np.int32)[idx])
  return np.sort(np.concatenate([np.asarray(s.data) for s in probe.addressable_shards]))


class WallClockStep:
  """The step of a wall-clock run (module docstring), called as the loop calls a
  :class:`nbsgd_jax.run.step.Program`, one step at a time (the step's host ``inputs``:
  deadline in; measurements out, :meth:`WallWorkload.measured`). Its programs live in the
  process's program cache under the run's structure (:data:`nbsgd_jax.run.step.PROGRAMS`),
  with the run's hyperparameters (seed included: the batches' draw) as inputs, so a second
  wall-clock run with another rate or seed compiles nothing.

  Args:
    s: the run's :class:`~nbsgd_jax.run.setup.Setup` (backend ``"multihost"`` or ``"mesh"``).
    workload: the run's :class:`WallWorkload`.
    cache: the :class:`~nbsgd_jax.run.step.ProgramCache` (default: the process's).
  """

  def __init__(self, s, workload: WallWorkload, cache=None):
    self.s, self.workload = s, workload
    self.cache = step_lib.PROGRAMS if cache is None else cache
    b, m = s.backend, workload.cluster.num_minibatches
    self.n, self.m = b.num_workers, m
    self.sharding = NamedSharding(b.mesh, P(b.mesh.axis_names[0]))
    self.local = local_workers(b)
    self._index = [self._global(np.full(self.n, j, np.int32)) for j in range(m)]
    self._own: dict = {}  # the programs of a run without a structure key
    cl = workload.cluster
    self.links = (Clock(cl, list(dict.fromkeys(s.recipe.transform.communications)))
                  if workload.emulate and cl.network is not None else None)

  def link_seconds(self, step: int, inputs, report: dict) -> float:
    """s of the step's blocking rounds on the modelled network (module docstring), from the
    step's report (``{key: [n]}``); 0 without levels."""
    if self.links is None:
      return 0.0
    return float(sum(np.max(cluster_lib.round_time(self.workload.cluster, r))
                     for r in self.links.rounds(step, inputs, report)
                     if not r.overlap and not r.delay))

  def _functions(self):
    """The step's three functions, jitted for the backend (compiled by :meth:`_program`)."""
    s, b, m, axis, task = self.s, self.s.backend, self.m, self.s.backend.axis_name, self.s.task

    def minibatch(params, data, step, j, sums, hparams):
      batch = transforms.split_minibatches(task.batch(data, step, axis, hparams["seed"]), m)
      one = jax.tree.map(lambda x: lax.dynamic_index_in_dim(x, j, keepdims=False), batch)
      return transforms.add_minibatch_with_state(sums, task.loss_fn, params, one)

    def update(period_end, state, sums, count, measured, ctx, hparams):
      ctx = ctx._replace(count=count, total=lax.psum(count, axis), period_end=period_end,
                         hparams=hparams)
      grads, loss = transforms.mean_of_sums(*sums[:2], count)
      state, out = step_lib.apply_update(s, state._replace(model_state=sums[2]), loss, grads,
                                          ctx)
      rows = jax.nn.one_hot(lax.axis_index(axis), self.n, dtype=jnp.float32)
      return state, out, lax.psum(rows[:, None] * measured[None, :], axis)

    zeros = jax.jit(b.spmd(lambda params, model_state: transforms.zero_sums(params)
                           + (model_state,)))
    return {"zeros": zeros,
            "minibatch": jax.jit(b.spmd(minibatch, (0, 0, 0, 0, 0, None))),
            "update": lambda key: jax.jit(  # one program per period end
                b.spmd(lambda *a: update(key, *a), (0, 0, 0, 0, transforms.CONTEXT_AXES, None)),
                donate_argnums=(0,))}

  def _program(self, name: str, key, *args):
    """The program ``name`` (with the period end ``key`` for the update), compiled ahead of
    time for ``args`` (compilation stays out of the timed loop), from the cache."""
    def make():
      fn = self._functions()[name]
      return (fn(key) if name == "update" else fn).lower(*args).compile()
    if not self.s.structure:  # a run that shares nothing (the cache keeps none of it)
      if (name, key) not in self._own:
        self._own[(name, key)] = make()
      return self._own[(name, key)]
    return self.cache.get(self.s.structure, ("wall", name, key), make)

  def _global(self, values: np.ndarray) -> jax.Array:
    """A worker-sharded array from this process's entries of ``values`` (``[n, ...]``)."""
    return jax.make_array_from_callback(values.shape, self.sharding, lambda idx: values[idx])

  def _pace(self, step: int) -> Optional[np.ndarray]:
    """The model's finish times of this process's mini-batches (its slowest worker's), or
    None without emulation."""
    if not self.workload.emulate:
      return None
    finish = cluster_lib.minibatch_finish_times(self.workload.cluster, step)
    return finish[self.local].max(axis=0)

  stacked = False  # one step per call: (loss [n], report)

  def context(self, inputs: list):
    """The device context of the one step of ``inputs`` (:func:`nbsgd_jax.run.step.
    device_context`)."""
    return step_lib.device_context(self.s, inputs[0])

  def __call__(self, state, data, ctx, keys=(True,), inputs: Optional[list] = None,
               hparams=None):
    """One step, ``keys = (period_end,)``, ``inputs = [the step's host inputs]``, ``hparams``
    the run's (None: ``s.hparams``)."""
    period_end, inputs = keys[0], inputs[0]
    hparams = self.s.hparams if hparams is None else hparams
    step, deadline = int(inputs.step), float(inputs.deadline)
    key = period_end if self.s.recipe.periodic else True  # a static (hashable) period end
    sums = self._program("zeros", None, state.params, state.model_state)(state.params,
                                                                         state.model_state)
    mb = self._program("minibatch", None, state.params, data, state.step, self._index[0], sums,
                       hparams)
    pace = self._pace(step)
    t0 = time.perf_counter()
    count, last = 0, 0.0
    for j in range(self.m):
      if time.perf_counter() - t0 >= deadline:
        break
      new = jax.block_until_ready(mb(state.params, data, state.step, self._index[j], sums,
                                     hparams))
      done = time.perf_counter() - t0
      if pace is not None and pace[j] > done:  # emulation: finish at the model's time
        time.sleep(max(min(pace[j], deadline) - done, 0.0))
        done = max(pace[j], time.perf_counter() - t0)
      if done > deadline:
        break
      sums, count, last = new, j + 1, done
    busy = time.perf_counter() - t0
    local = np.zeros((self.n, 3), np.float32)
    local[self.local] = (count, busy, last)
    counts = self._global(np.rint(local[:, 0]).astype(np.int32))
    measured = self._global(local)
    program = self._program("update", key, state, sums, counts, measured, ctx, hparams)
    state, out, shared = program(state, sums, counts, measured, ctx, hparams)
    rows = np.asarray(shared.addressable_shards[0].data)[0].astype(np.float64)
    if self.links is not None:  # the modelled links' delay, after the real collective
      inputs.update(count=np.rint(rows[:, 0]).astype(np.int32))
      report = {k: multihost.fetch(v) for k, v in out[1].items()
                if k.startswith(("bytes/", "rounds/"))}
      time.sleep(self.link_seconds(step, inputs, report))
    self.workload.measured(step, inputs, rows, time.perf_counter() - t0)
    return state, out


__all__ = ["WallClockStep", "WallWorkload", "local_workers"]
