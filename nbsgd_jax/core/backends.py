"""Backends: how the worker program runs over the workers.

``"simulate"``: ``jax.vmap(..., axis_name="workers")`` on one device; ``"mesh"``:
``jax.shard_map`` over a device mesh (k workers per device with a ``vmap`` inside);
``"multihost"``: the mesh over every device of every process (:mod:`nbsgd_jax.core.multihost`).
The same worker program gives the same numbers on each.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax.core import checks
from nbsgd_jax.core import multihost
from nbsgd_jax.core.axis import AXIS

BACKENDS = ("simulate", "mesh", "multihost")  # config.backend


class Backend(NamedTuple):
  """How the worker program is executed.

  Attributes:
    name: ``"simulate"``, ``"mesh"`` or ``"multihost"``.
    num_workers: n.
    mesh: the device mesh (mesh backend) or None.
    axis_name: the worker axis of the worker program: ``"workers"``, or
      ``("devices", "workers")`` with several workers per device.
    spmd: ``(worker_fn, in_axes=0) -> fn`` running a per-worker function on arrays with a
      leading worker axis (not jitted); ``in_axes`` as ``jax.vmap``'s (a prefix of the
      arguments: 0 per worker, None one value for every worker, placed by ``replicate``;
      e.g. :data:`nbsgd_jax.transforms.CONTEXT_AXES`).
    place: ``pytree -> pytree`` putting arrays with a leading worker axis where the
      backend wants them.
    replicate: ``pytree -> pytree`` putting arrays whole on every device of the backend
      (evaluation data, the stacked models for evaluation).
    fetch: ``pytree of arrays -> pytree of np.ndarray``, the whole values on the host in one
      transfer (an all-gather across processes for ``"multihost"``: every process must call
      it at the same point).
    stage: ``(in_axes, pytree of np.ndarray) -> pytree``, a dispatch's small host inputs (a
      step's context) as the compiled program takes them, ``in_axes`` as ``spmd``'s: on one
      device (``"simulate"``) numpy as it is (the jitted call transfers it on its C++ path:
      0.2 ms a step less than ``jax.device_put``, MLP at n = 8 on a 2-core CPU); on a mesh,
      ``place`` for axis 0 and ``replicate`` for None.
  """

  name: str
  num_workers: int
  mesh: Any
  spmd: Callable[[Callable], Callable]
  place: Callable[[Any], Any]
  axis_name: Any = AXIS
  replicate: Callable[[Any], Any] = jax.device_put
  fetch: Callable[[Any], Any] = lambda tree: jax.tree.map(np.asarray, jax.device_get(tree))
  stage: Callable[[Any, Any], Any] = lambda in_axes, tree: tree


DEVICE_AXIS = "devices"


def workers_per_device(num_workers: int, num_devices: int, requested: int = 0) -> int:
  """k, workers per device of the mesh backend: ``requested`` if > 0, else the smallest k
  dividing n with n / k <= devices.

  Raises:
    ValueError: k does not divide n, or n / k devices are more than there are.
  """
  if requested:
    k = requested
  else:
    k = next(k for k in range(1, num_workers + 1)
             if num_workers % k == 0 and num_workers // k <= num_devices)
  if num_workers % k or num_workers // k > num_devices:
    raise ValueError(f"workers_per_device={k} is not allowed with num_workers={num_workers} "
                     f"on {num_devices} devices: it must divide num_workers and leave at most "
                     f"{num_devices} devices")
  return k


def make_backend(name: str, num_workers: int, per_device: int = 0) -> Backend:
  """``"simulate"``: ``jax.vmap(..., axis_name="workers")`` on one device; ``"mesh"``:
  ``jax.shard_map`` over a 1-D mesh of the first n / k devices, k workers each
  (:func:`workers_per_device`; ``per_device`` = 0 picks k). With k = 1 the mesh axis is
  ``"workers"``; with k > 1 it is ``"devices"`` and each device runs
  ``vmap(..., axis_name="workers")`` over its k workers: the worker program's axis is the pair
  ``("devices", "workers")`` (:mod:`nbsgd_jax.communications.collectives`). ``"multihost"``: the mesh
  backend over every device of every process (``jax.distributed``, :mod:`nbsgd_jax.core.multihost`),
  n / devices workers per device; each process holds the workers of its own devices.

  Raises:
    ValueError: unknown backend, or workers that do not fit the devices.
  """
  if name == "simulate":
    return Backend(name, num_workers, None,
                   lambda f, in_axes=0: jax.vmap(f, in_axes=in_axes, axis_name=AXIS),
                   lambda tree: tree)
  if name not in ("mesh", "multihost"):
    raise ValueError(f"backend={name!r} is not allowed: use one of {list(BACKENDS)}")
  devices = jax.devices()
  if name == "multihost":
    nd = len(devices)
    if num_workers % nd or (per_device and per_device * nd != num_workers):
      raise ValueError(
          f"num_workers={num_workers} is not allowed with backend='multihost' on {nd} devices "
          f"({jax.process_count()} processes): every device must hold the same number of "
          f"workers (num_workers a multiple of {nd}"
          + (f", workers_per_device = num_workers / {nd}" if per_device else "") + ")")
    per_device = num_workers // nd
  k = workers_per_device(num_workers, len(devices), per_device)
  axis = DEVICE_AXIS if k > 1 else AXIS
  mesh = jax.make_mesh((num_workers // k,), (axis,), devices=devices[:num_workers // k])
  sharding = NamedSharding(mesh, P(axis))
  replicated = NamedSharding(mesh, P())
  put = lambda ax, tree: jax.device_put(tree, replicated if ax is None else sharding)
  extra = dict(replicate=lambda tree: jax.device_put(tree, replicated),
               stage=lambda in_axes, tree: _map_prefix(put, (in_axes,), (tree,))[0])
  if name == "multihost":
    extra["fetch"] = lambda tree: jax.tree.map(multihost.fetch, tree)
  if k > 1:
    def spmd_k(f, in_axes=0):
      # check_vma=False: the worker values vary over the vmap axis too, which the
      # varying-axes type system does not track through psum over the axis pair
      return jax.shard_map(jax.vmap(f, in_axes=in_axes, axis_name=AXIS), mesh=mesh,
                           in_specs=_specs(in_axes, DEVICE_AXIS), out_specs=P(DEVICE_AXIS),
                           check_vma=False)

    return Backend(name, num_workers, mesh, spmd_k,
                   lambda tree: jax.device_put(tree, sharding), (DEVICE_AXIS, AXIS), **extra)

  def spmd(f, in_axes=0):
    def local(*args):
      mine = lambda ax, arg: arg if ax is None else jax.tree.map(lambda a: a[0], arg)
      out = f(*_map_prefix(mine, in_axes, args))
      return jax.tree.map(lambda a: a[None], out)
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(in_axes, AXIS), out_specs=P(AXIS))

  return Backend(name, num_workers, mesh, spmd, lambda tree: jax.device_put(tree, sharding),
                 **extra)


def _map_prefix(fn: Callable, in_axes, args: tuple) -> tuple:
  """``fn(axis, subtree)`` for each entry of the ``jax.vmap``-style prefix ``in_axes`` (an int
  or None for all of ``args``, or a tuple with one prefix per argument) and the subtree of
  ``args`` it covers."""
  if not isinstance(in_axes, tuple):
    in_axes = (in_axes,) * len(args)
  return tuple(jax.tree.map(fn, ax, arg, is_leaf=lambda x: x is None)
               for ax, arg in zip(in_axes, args))


def _specs(in_axes, axis: str):
  """shard_map ``in_specs`` of a ``jax.vmap``-style ``in_axes``: 0 -> ``P(axis)`` (split over
  the workers), None -> ``P()`` (replicated)."""
  spec = lambda ax: P() if ax is None else P(axis)
  if not isinstance(in_axes, tuple):
    return spec(in_axes)
  return tuple(jax.tree.map(spec, ax, is_leaf=lambda x: x is None) for ax in in_axes)


# ----------------------------------------------------------------------------- config


def check_config(cfg, errs: list) -> None:
  """Config check of backend and workers_per_device (mesh, multihost: against jax's
  devices)."""
  checks.choice(cfg, errs, "backend", BACKENDS)
  if not checks.integer(cfg, errs, "workers_per_device", 0, note="0: chosen from the device count"):
    return
  k, n, backend = cfg.workers_per_device, cfg.get("num_workers"), cfg.get("backend")
  if not (checks.is_int(n) and n > 0) or backend not in ("mesh", "multihost"):
    return
  import jax  # deferred: the rest needs no devices; multihost: after jax.distributed.initialize
  nd = jax.device_count()
  if backend == "mesh":
    if k and (n % k or n // k > nd):
      errs.append(f"config.workers_per_device={k} is not allowed with num_workers={n} on {nd} "
                  f"devices: it must divide num_workers with num_workers / workers_per_device "
                  f"<= {nd}")
  elif n % nd:
    errs.append(f"config.num_workers={n} is not allowed with config.backend='multihost' on "
                f"{jax.process_count()} process(es) with {nd} devices in all: the workers must "
                f"divide evenly across processes and devices (a multiple of {nd})")
  elif k and k * nd != n:
    errs.append(f"config.workers_per_device={k} is not allowed with config.backend="
                f"'multihost': num_workers={n} on {nd} devices puts {n // nd} on each "
                "(0 picks it)")
