"""JAX's multi-process runtime for ``backend="multihost"``.

Every process runs the same program (``python -m nbsgd_jax.main ...``); after
:func:`initialize` (``jax.distributed.initialize``) ``jax.devices()`` lists the devices of
all processes and the mesh backend spans them: process p holds the workers of its own
devices, loads only their data shards (:func:`nbsgd_jax.train.setup`), and the worker
program's collectives (``psum``, ``ppermute``) cross process boundaries. On CPU the
cross-process collectives are gloo's (``jax_cpu_collectives_implementation``); on GPU NCCL,
on TPU the ICI/DCN fabric, chosen by XLA.

Where the coordinates come from, first found wins:

1. arguments (``main.py``'s ``--coordinator_address``, ``--num_processes``,
   ``--process_id`` flags);
2. environment variables ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0),
   ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (set by :mod:`nbsgd_jax.launch`);
3. JAX's own cluster detection (Slurm, Open MPI, Cloud TPU, Kubernetes), when none of the
   above is given; if it finds no cluster, the run is a single process (the mesh backend over
   this process's devices).

Only process 0 writes ``config.json``, ``metrics.jsonl``, ``steps.jsonl`` and
``summary.json``; every process takes part in checkpoints (orbax).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple, Optional

import numpy as np

ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


class Coordinates(NamedTuple):
  """Where to join: entries None where JAX's cluster detection should find them."""

  address: Optional[str]  # host:port of process 0's coordinator service
  num_processes: Optional[int]
  process_id: Optional[int]


def _env_int(name: str) -> Optional[int]:
  v = os.environ.get(name, "").strip()
  if not v:
    return None
  try:
    return int(v)
  except ValueError:
    raise ValueError(f"environment variable {name}={v!r} is not allowed: it must be an "
                     "integer") from None


def coordinates(address: Optional[str] = None, num_processes: Optional[int] = None,
                process_id: Optional[int] = None) -> Coordinates:
  """The coordinator address, process count and process id, from the arguments or else the
  environment (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``).

  Raises:
    ValueError: a count < 1, an id outside ``[0, num_processes)``, an address without a port,
      or a non-integer environment value (each message names the field).
  """
  address = address or os.environ.get(ENV_ADDRESS, "").strip() or None
  num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
  process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
  if address is not None and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
    raise ValueError(f"coordinator_address={address!r} is not allowed: write host:port of "
                     "process 0 (e.g. 10.0.0.1:1234)")
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes={num_processes!r} is not allowed: it must be >= 1")
  if process_id is not None and (process_id < 0 or (
      num_processes is not None and process_id >= num_processes)):
    raise ValueError(f"process_id={process_id!r} is not allowed: it must be in "
                     f"[0, num_processes={num_processes})")
  return Coordinates(address, num_processes, process_id)


def initialize(address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> bool:
  """``jax.distributed.initialize`` with the :func:`coordinates` (and gloo collectives for
  CPU devices). With no coordinates at all, JAX's own cluster detection decides (Slurm, Open
  MPI, Cloud TPU, Kubernetes); where it finds nothing, or JAX already runs in this process,
  this is a single process and nothing is joined. A no-op if already initialized.

  Must run before anything initializes a JAX backend (``jax.devices()``, any computation).

  Returns:
    True if this process is part of a multi-process run.

  Raises:
    ValueError: bad coordinates (:func:`coordinates`).
    RuntimeError: coordinates were given but a JAX backend was initialized before, so
      joining is no longer possible.
  """
  import jax
  c = coordinates(address, num_processes, process_id)
  if jax.distributed.is_initialized():
    return True
  if c.num_processes == 1:  # remembered, so that a later call does not detect a cluster
    os.environ[ENV_NUM_PROCESSES] = "1"
    return False
  # gloo: cross-process collectives of the CPU client (no effect on GPU or TPU devices)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  detect = c.address is None and c.num_processes is None and c.process_id is None
  try:
    jax.distributed.initialize(c.address, c.num_processes, c.process_id)
  except (ValueError, RuntimeError) as e:
    if not detect:
      raise
    # JAX found no cluster ("coordinator_address should be defined") or already runs here
    logging.info("backend='multihost' runs as a single process: %s", e)
    return False
  return True


def fetch(x) -> np.ndarray:
  """The whole value of an array as numpy on every process: ``np.asarray`` where this
  process can address it, else an all-gather across processes
  (``multihost_utils.process_allgather``; every process must call it at the same point)."""
  import jax
  if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
