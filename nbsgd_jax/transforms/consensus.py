"""Consensus control as a wrapper over any recipe that gossips (Kong et al., ICML 2021), and the
exact consensus distance as a per-step diagnostic.

:func:`consensus_control` runs the wrapped transform, then gossips again (at most K times) while
the measured ``Xi > ctx.target`` (:func:`nbsgd_jax.consensus.control`); with
``gradient_stats`` it also estimates the gradient norm and noise behind the critical target
(:func:`nbsgd_jax.consensus.gradient_stats`) on every controlled step. Its communications: the
controlling gossip and its measurements (:class:`ControlRounds`, interleaved as they run) and
the gradient sketch all-reduce; the clock charges the bytes the device reports.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from nbsgd_jax import consensus as consensus_lib
from nbsgd_jax.axis import varying_like
from nbsgd_jax.communications import AllReduce, Communication, Pattern, Round
from nbsgd_jax.transforms.base import (WorkerTransform, as_worker_transform, merge_reports,
                                       replace_params)


class ControlRounds(Communication):
  """The extra gossip rounds and Xi measurements of consensus control, as the clock sees them:
  a measurement (an all-reduce of the model or sketch and of a scalar: ``4 (n - 1)``
  messages, everyone waits) then, ``k`` times, one more round of ``gossip`` and a measurement.

  The device reports ``gossip_steps`` (k), ``measurements`` (m) and the bytes of each kind
  (``bytes/consensus.gossip``, ``bytes/consensus.measure``).
  """

  def __init__(self, gossip: Communication, key: str = "consensus"):
    super().__init__(gossip.n, gossip.axis_name, key)
    self.gossip = gossip
    self.measure = AllReduce(gossip.n, gossip.axis_name, key + ".measure", parts=2)

  def pattern(self, step: int, active: np.ndarray) -> Pattern:
    return self.gossip.pattern(step, active)

  def clock_rounds(self, step: int, active: np.ndarray, alive: Optional[np.ndarray],
                   report: dict) -> list[Round]:
    if "gossip_steps" not in report:
      return []
    k, m = int(np.max(report["gossip_steps"])), int(np.max(report["measurements"]))
    out: list[Round] = []
    if k:
      g = self.gossip.live_pattern(step, active, alive)
      g_round = Round(g.adjacency, g.messages,
                      np.asarray(report[f"bytes/{self.key}.gossip"], np.float64) / k,
                      g.collective)
    if m:
      p = self.measure.live_pattern(step, active, alive)
      m_round = Round(p.adjacency, p.messages,
                      np.asarray(report[f"bytes/{self.key}.measure"], np.float64) / m,
                      p.collective)
    for r in range(max(k, m)):
      if r < m:
        out.append(m_round)
      if r < k:
        out.append(g_round)
    return out


def consensus_control(inner, gossip: Communication, control: consensus_lib.Control,
                      num_workers: int, log_consensus: bool = False) -> WorkerTransform:
  """``inner``, then gossip over ``gossip`` while ``Xi > ctx.target`` (Kong et al. 2021).

  Args:
    inner: the wrapped transform (a recipe that gossips).
    gossip: the communication of the extra rounds (MATCHA: the base graph's static W; one
      sampled W(t) is contractive only in expectation).
    control: the static settings (:class:`nbsgd_jax.consensus.Control`); with
      ``control.gradient_stats`` the critical target's statistics are measured too.
    num_workers: n.
    log_consensus: also report the exact Xi after the step (``consensus_distance``).

  Returns:
    a :class:`~nbsgd_jax.transforms.WorkerTransform` whose report adds ``gossip_steps``,
    ``measurements``, ``measured_consensus_distance`` (0 where not measured) and, with
    gradient statistics, ``grad_sq`` and ``grad_noise``.

  Raises:
    ValueError: bad ``control`` values (named).
  """
  consensus_lib.check_control(control)
  inner = as_worker_transform(inner)
  rounds = ControlRounds(gossip)
  stats = AllReduce(num_workers, gossip.axis_name, "consensus_stats", parts=2)
  axis = gossip.axis_name

  def grad_stats(grads, ctx):
    key = jax.random.fold_in(jax.random.PRNGKey(control.seed + 1), ctx.step)
    cost = consensus_lib.gradient_stats_bytes(num_workers, control)

    def on(g):
      gs, noise = consensus_lib.gradient_stats(g, control, key, num_workers, axis)
      return gs, noise, jnp.float32(cost), jnp.int32(1)

    def off(g):
      del g
      return jnp.float32(0.0), jnp.float32(0.0), jnp.float32(0.0), jnp.int32(0)

    gs, noise, sent, used = lax.cond(jnp.isfinite(ctx.target), on, off, grads)
    sent = stats.charge(varying_like(sent, grads), ctx)
    return {"grad_sq": gs, "grad_noise": noise, **stats.report(sent, used)}

  def mix_bytes(p, ctx):
    mixed, report = gossip.mix(p, ctx)
    return mixed, report["bytes_sent"]

  def update(grads, state, params, ctx):
    extra = grad_stats(grads, ctx) if control.gradient_stats else {}
    updates, state, report = inner.update(grads, state, params, ctx)
    x = optax.apply_updates(params, updates)
    x, _, aux = consensus_lib.control(x, mix_bytes, ctx, num_workers, control, axis)
    gossiped = aux["gossip_bytes"]  # already 0 for a failed worker (Gossip.mix)
    measure = rounds.charge(aux["measure_bytes"], ctx)  # a failed worker measures nothing
    ctl = {"gossip_steps": aux["gossip_steps"], "measurements": aux["measurements"],
           "measured_consensus_distance": aux["consensus_distance"],
           "bytes_sent": gossiped + measure, f"bytes/{rounds.key}.gossip": gossiped,
           f"bytes/{rounds.key}.measure": measure}
    report = merge_reports(report, ctl, extra)
    if log_consensus:
      report = merge_reports(report, {"consensus_distance": exact_distance(x, axis)})
    return replace_params(params, x), state, report

  comms = inner.communications + (rounds,) + ((stats,) if control.gradient_stats else ())
  return WorkerTransform(inner.init, update, comms)


def exact_distance(params: Any, axis_name) -> jax.Array:
  """Exact ``Xi`` of the workers' models (float32, the same on every worker; a diagnostic of
  the simulation, not charged in bytes)."""
  return jnp.sqrt(consensus_lib.measure_sq(params, consensus_lib.Control(), None, axis_name))


def log_consensus_distance(inner, axis_name) -> WorkerTransform:
  """``inner`` plus the exact Xi after the step in the report (``consensus_distance``)."""
  inner = as_worker_transform(inner)

  def update(grads, state, params, ctx):
    updates, state, report = inner.update(grads, state, params, ctx)
    xi = exact_distance(optax.apply_updates(params, updates), axis_name)
    return updates, state, merge_reports(report, {"consensus_distance": xi})

  return WorkerTransform(inner.init, update, inner.communications)
