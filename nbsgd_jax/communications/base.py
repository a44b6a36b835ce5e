"""A communication that knows its cost: a device half and a host half in one object.

* **Device half** (inside the worker program, on the worker axis): apply the primitive to a
  tree and return the result with a report of the bytes this worker sent
  (``{"bytes_sent": b, "bytes/<key>": b, "rounds/<key>": 1}``).
* **Host half** (numpy): the step's :class:`Pattern` (who waits for whom, messages per
  worker) and, from the step's report, the rounds the simulated clock charges
  (:meth:`Communication.clock_rounds`). The clock charges the bytes the device reported, so
  device bytes and clock bytes are one number.

Written once here for every primitive: failures (a failed worker sends nothing and nobody
waits for it: :meth:`Communication.live_pattern`, :meth:`Communication.charge`) and the
weights of a mean (count weighting of Non-blocking SGD, He & Dube 2022; live workers only
under failures: :meth:`Communication.weight`).
"""

from __future__ import annotations

import abc
import copy
from typing import Any, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

from nbsgd_jax.communications import adjacency as adjacency_lib
from nbsgd_jax.core.axis import AXIS

WEIGHTINGS = ("uniform", "count", "alive")


class Pattern(NamedTuple):
  """One round of a communication, per worker (host side).

  Attributes:
    adjacency: whom each worker waits for (:data:`nbsgd_jax.communications.adjacency.Adjacency`, worker i always
      waits for itself): None for everyone (an all-reduce), index lists
      (:class:`~nbsgd_jax.communications.adjacency.Neighbours`, ``[n, d]``: what the built-in gossips use, so a
      step's host work is O(n d)), a :class:`~nbsgd_jax.communications.adjacency.Group`, or a bool ``[n, n]``
      matrix (row i; O(n^2) per round).
    messages: float ``[n]``, messages each worker sends in the round.
    collective: the workers of a neighbourhood move in lockstep (an all-reduce: it starts when
      the last of them is ready); else point to point (a message from j arrives when j has
      sent it). See :func:`nbsgd_jax.host.cluster.advance_clocks`.
  """

  adjacency: adjacency_lib.Adjacency
  messages: np.ndarray
  collective: bool = False


class Round(NamedTuple):
  """A round the clock charges: a :class:`Pattern`, the bytes (float ``[n]``) sent, whether it
  overlaps the step's computation (:attr:`Communication.overlap`) and the steps its result
  may arrive late (:attr:`Communication.delay`; 0: the step waits for it)."""

  adjacency: adjacency_lib.Adjacency
  messages: np.ndarray
  num_bytes: np.ndarray
  collective: bool = False
  overlap: bool = False
  delay: int = 0


class Communication(abc.ABC):
  """Base of every communication primitive (see module docstring).

  Args:
    n: workers.
    axis_name: the worker axis of the worker program.
    key: the name of this communication in reports (unique within a recipe).
    weighted: means are count-weighted (Non-blocking SGD or failures), see :meth:`weight`.
  """

  overlap = False  # the round runs while the step computes (its input is the step's start)
  delay = 0  # steps the round runs in the background before a step waits for its result

  def __init__(self, n: int, axis_name: Any = AXIS, key: str = "comm", weighted: bool = False):
    self.n, self.axis_name, self.key, self.weighted = int(n), axis_name, key, bool(weighted)

  def overlapping(self) -> "Communication":
    """A copy whose rounds overlap the step's computation (its input is known at the step's
    start: D-PSGD's ``parallel`` order gossips ``x_t`` while ``g(x_t)`` is computed)."""
    out = copy.copy(self)
    out.overlap = True
    return out

  def deferred(self, steps: int) -> "Communication":
    """A copy whose rounds run in the background: the workers go on computing and wait for
    the result only at the end of the ``steps``-th step after (Streaming DiLoCo's overlap of a
    fragment's all-reduce with tau inner steps, Douillard et al. 2025, Sec. 2.3).

    Raises:
      ValueError: ``steps`` < 0.
    """
    if int(steps) < 0:
      raise ValueError(f"deferred(steps={steps}) is not allowed: it must be >= 0")
    out = copy.copy(self)
    out.delay = int(steps)
    return out

  # -------------------------------------------------------------------- host half

  def host_inputs(self, step: int) -> dict:
    """Per-step inputs this communication draws on the host (e.g. MATCHA's activations)."""
    del step
    return {}

  @abc.abstractmethod
  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    """The round's pattern with every worker up (every primitive defines it)."""

  def live_pattern(self, step: int, active: np.ndarray, alive: Optional[np.ndarray]) -> Pattern:
    """:meth:`pattern` under failures: a failed worker sends nothing and nobody waits for it
    (:func:`~nbsgd_jax.communications.adjacency.live_adjacency`: everyone becomes a
    :class:`~nbsgd_jax.communications.adjacency.Group` of the live workers, index lists stay index lists)."""
    pat = self.pattern(step, active)
    if alive is None:
      return pat
    alive = np.asarray(alive, bool)
    return Pattern(adjacency_lib.live_adjacency(pat.adjacency, alive), pat.messages * alive,
                   pat.collective)

  def clock_rounds(self, step: int, active: np.ndarray, alive: Optional[np.ndarray],
                   report: dict) -> list[Round]:
    """The rounds of this step for the clock, from the step's report (host numpy, each value
    ``[n]``): ``rounds/<key>`` rounds of :meth:`live_pattern`, the reported ``bytes/<key>``
    split evenly over them; none when the key is absent (not used in this step)."""
    if f"bytes/{self.key}" not in report:
      return []
    rounds = int(np.max(report.get(f"rounds/{self.key}", 1)))
    if rounds <= 0:
      return []
    pat = self.live_pattern(step, active, alive)
    per = np.asarray(report[f"bytes/{self.key}"], np.float64) / rounds
    return [Round(pat.adjacency, pat.messages, per, pat.collective, self.overlap,
                  self.delay)] * rounds

  # -------------------------------------------------------------------- device half

  def index(self):
    """This worker's index on the axis (device half)."""
    return lax.axis_index(self.axis_name)

  def charge(self, num_bytes, ctx) -> jnp.ndarray:
    """float32 bytes sent by this worker: ``num_bytes``, 0 for a failed worker."""
    b = jnp.asarray(num_bytes, jnp.float32)
    if ctx is not None and ctx.alive is not None:
      b = jnp.where(ctx.alive[self.index()], b, jnp.float32(0.0))
    return b

  def report(self, num_bytes, rounds=1) -> dict:
    """The report of one use: ``bytes_sent``, ``bytes/<key>``, ``rounds/<key>``."""
    return {"bytes_sent": num_bytes, f"bytes/{self.key}": num_bytes,
            f"rounds/{self.key}": jnp.asarray(rounds, jnp.int32)}

  def weight(self, ctx, by: str = "count"):
    """This worker's weight ``w_i`` in a mean ``sum_i w_i x_i`` (``sum_i w_i = 1``), or None
    for the plain mean ``1/n``.

    ``by="count"``: ``count_i / total`` when :attr:`weighted` (He & Dube 2022, all-reduce
    form: ``g = sum_i sum_{j<m_i} g_ij / sum_i m_i`` for local means ``g_i`` over ``m_i``
    mini-batches; a failed worker has ``m_i = 0``), else None. ``by="alive"``: ``1 / live``
    for a live worker, 0 for a failed one (model averages), None without failures.
    ``"uniform"``: None.

    Raises:
      ValueError: unknown ``by``.
    """
    if by not in WEIGHTINGS:
      raise ValueError(f"by={by!r} is not allowed: use one of {list(WEIGHTINGS)}")
    if by == "count" and self.weighted:
      total = jnp.maximum(ctx.total, 1).astype(jnp.float32)
      return ctx.count.astype(jnp.float32) / total
    if by == "alive" and ctx is not None and ctx.alive is not None:
      # the live workers counted by a psum of one flag each: O(1) per worker (a sum over the
      # [n] mask every worker holds would be O(n) per worker, O(n^2) under vmap)
      up = ctx.alive[self.index()].astype(jnp.float32)
      live = jnp.maximum(lax.psum(up, self.axis_name), 1.0)
      return up / live
    return None

  def live(self, ctx):
    """bool scalar: whether this worker is up (it sends nothing when it is not)."""
    if ctx is None or ctx.alive is None:
      return jnp.asarray(True)
    return ctx.alive[self.index()]
