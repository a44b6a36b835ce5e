"""Communication periods of local SGD: when do the workers synchronise? (No JAX here.)

Host-side schedules of the period ``tau`` for the ``local_sgd`` and
``diloco`` recipes (:mod:`nbsgd_jax.recipes`). Period ``i`` (0-based) starts at step ``s_i`` (``s_0 = 0``)
and lasts ``tau_i`` steps; the workers synchronise after step ``s_i + tau_i - 1`` and
``s_{i+1} = s_i + tau_i``.

* ``"fixed"``: ``tau_i = tau`` (LUPA-SGD, Haddadpour et al., NeurIPS 2019, Algorithm 1;
  ``tau = 1`` is synchronous SGD).
* ``"ada_lupa"``: ADA-LUPA-SGD (Haddadpour et al. 2019, Sec. 5, adaptive synchronisation),
  ``tau_i = ceil((F(x_0) / F(x_{s_i}))^(1/3)) * tau_0``, with ``F`` the training loss of the
  averaged model measured at each synchronisation (:meth:`SyncPlanner.observe`) minus an
  optional known offset (e.g. ``F*`` of a synthetic problem); the period grows as the loss
  falls. ``max_tau`` caps it. Not verified against the paper's text: Sec. 5 of arXiv
  1910.13598 could not be read here (whether ``tau_0`` sits inside the ceiling is open), and
  the released code has no loss-based rule (its ``--adaptive`` is the linear ramp below).
* ``"linear"``: the released code's ramp (mmkamani7/LUPA-SGD, ``main.py`` with
  ``--adaptive`` and ``utils.SyncHook``)::

    alpha = 2 / (num_comm + 1) * (train_steps / (num_comm * sync_step))
    local_updates = [sync_step * (1 + alpha * j) for j in range(num_comm + 1)]

  SyncHook averages in ``before_run`` of global step 0 and then whenever
  ``step >= last_synced_step + local_updates[j]`` (TF's ``SecondOrStepTimer``, float
  ``every_steps``), ``j = 1, 2, ...`` counting the syncs after step 0. Mapping: that code's
  sync before step ``s`` is our sync after step ``s - 1``; its step-0 sync of the workers'
  (differently initialised) models is our common initial model (every worker starts from
  the same parameters here), so it is neither counted nor charged; ``sync_step`` is
  ``tau`` (= ``tau_0``) and ``train_steps`` is ``num_steps``. Hence period ``i`` (0-based,
  starting at step ``s_i``) ends with a sync after step ``ceil(s_i + tau (1 + alpha (i + 1)))
  - 1`` (the float sum as in TF), i.e. ``tau_i = ceil(tau (1 + alpha (i + 1)))`` up to float
  rounding. ``alpha`` is ``local_sgd.alpha``, or derived as above from ``num_comm`` > 0
  (``--num-comm``). Periods past ``local_updates[num_comm]`` (where the released hook would
  index past its list) continue the ramp; with the derived alpha they start after
  ``num_steps`` (the first ``num_comm`` periods add up to ``num_comm tau + num_steps``).
  In the released code every tower's ``apply_gradients`` increments the global step, so with
  G GPUs its ``--train-steps`` and ``--sync-step`` count G x iterations: divide both by G
  for ``num_steps`` and ``tau`` (alpha is unchanged).
* ``"post_local"``: post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD",
  ICLR 2020): ``tau = 1`` for the periods that start before ``switch_step``, then ``tau``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import ml_collections

from nbsgd_jax.core import checks
from nbsgd_jax.models.problems import PROBLEMS
from nbsgd_jax.transforms.wrappers import OPT_STATE_SYNCS

SCHEDULES = ("fixed", "ada_lupa", "linear", "post_local")
AVERAGINGS = ("mean", "gossip")  # of the local_sgd recipe


class SyncPlanner:
  """Decides, step by step on the host, which steps end with a synchronisation.

  Args:
    schedule: one of :data:`SCHEDULES`.
    tau: ``tau`` (fixed, post_local) or ``tau_0`` (ada_lupa, linear), an int >= 1.
    alpha: slope of the ``"linear"`` ramp, >= 0 (ignored when ``num_comm`` > 0).
    num_comm: ``"linear"``: the released code's number of communications; > 0 derives
      ``alpha = 2 / (num_comm + 1) * (num_steps / (num_comm * tau))`` (0: use ``alpha``).
    num_steps: training steps behind the derived alpha (needed when ``num_comm`` > 0).
    switch_step: first step of the local phase (``"post_local"``), >= 0.
    max_tau: upper bound on any period (0: none).
    loss_offset: subtracted from every observed loss in ``"ada_lupa"`` (``F - offset``,
      clipped at a tiny positive value).

  Attributes:
    periods: the periods ``tau_i`` started so far.
    sync_steps: the (0-based) steps that ended with a synchronisation.
    losses: the losses passed to :meth:`observe`.

  Raises:
    ValueError: unknown schedule or an argument out of range (named in the message).
  """

  def __init__(self, schedule: str = "fixed", tau: int = 1, alpha: float = 0.0,
               switch_step: int = 0, max_tau: int = 0, loss_offset: float = 0.0,
               num_comm: int = 0, num_steps: int = 0):
    if schedule not in SCHEDULES:
      raise ValueError(f"local_sgd.schedule={schedule!r} is not allowed: use one of "
                       f"{list(SCHEDULES)}")
    if not _is_int(tau) or tau < 1:
      raise ValueError(f"local_sgd.local_steps={tau!r} is not allowed: it must be an int >= 1")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha >= 0:
      raise ValueError(f"local_sgd.alpha={alpha!r} is not allowed: it must be a number >= 0")
    if not _is_int(switch_step) or switch_step < 0:
      raise ValueError(f"local_sgd.switch_step={switch_step!r} is not allowed: it must be an "
                       "int >= 0")
    if not _is_int(max_tau) or max_tau < 0:
      raise ValueError(f"local_sgd.max_local_steps={max_tau!r} is not allowed: it must be an "
                       "int >= 0 (0: no cap)")
    if not _is_int(num_comm) or num_comm < 0:
      raise ValueError(f"local_sgd.num_comm={num_comm!r} is not allowed: it must be an int >= 0 "
                       "(0: use local_sgd.alpha)")
    if num_comm and (not _is_int(num_steps) or num_steps < 1):
      raise ValueError(f"num_steps={num_steps!r} is not allowed with local_sgd.num_comm="
                       f"{num_comm}: the derived alpha needs an int >= 1")
    if num_comm:
      alpha = linear_alpha(num_comm, num_steps, tau)
    self.schedule, self.tau, self.alpha = schedule, int(tau), float(alpha)
    self.num_comm = int(num_comm)
    self.switch_step, self.max_tau, self.loss_offset = switch_step, max_tau, float(loss_offset)
    self.periods: list[int] = []
    self.sync_steps: list[int] = []
    self.losses: list[float] = []
    self._f0: Optional[float] = None
    self._next_sync: Optional[int] = None
    self._start = 0

  @property
  def needs_loss(self) -> bool:
    """Whether :meth:`observe` must be called with ``F`` at step 0 and after each sync."""
    return self.schedule == "ada_lupa"

  @property
  def rounds(self) -> int:
    """Synchronisations so far (communication rounds)."""
    return len(self.sync_steps)

  def observe(self, loss: float) -> None:
    """Report ``F`` of the averaged model: at step 0 (``F(x_0)``), then after each sync."""
    loss = float(loss)
    if not math.isfinite(loss):
      raise ValueError(f"observed loss {loss!r} is not finite")
    self.losses.append(loss)
    if self._f0 is None:
      self._f0 = loss

  def _period(self, i: int, start: int) -> int:
    if self.schedule == "fixed":
      tau = self.tau
    elif self.schedule == "linear":
      # the released SyncHook: sync before the first step >= last sync + local_updates[i + 1]
      every = self.tau * (1 + self.alpha * (i + 1))
      tau = math.ceil(start + every) - start
    elif self.schedule == "post_local":
      tau = 1 if start < self.switch_step else self.tau
    else:  # ada_lupa
      if self._f0 is None:
        raise RuntimeError("ada_lupa needs observe(F(x_0)) before the first step")
      eps = 1e-12
      f0 = max(self._f0 - self.loss_offset, eps)
      fi = max(self.losses[-1] - self.loss_offset, eps)
      tau = math.ceil(round((f0 / fi) ** (1.0 / 3.0), 9)) * self.tau
    if self.max_tau:
      tau = min(tau, self.max_tau)
    return max(int(tau), 1)

  def state_dict(self) -> dict:
    """The planner's progress as a JSON-serialisable dict (checkpoints)."""
    return {"periods": list(self.periods), "sync_steps": list(self.sync_steps),
            "losses": list(self.losses), "f0": self._f0, "next_sync": self._next_sync,
            "start": self._start}

  def load_state_dict(self, d: dict) -> None:
    """Continue from :meth:`state_dict`'s output."""
    self.periods, self.sync_steps = list(d["periods"]), list(d["sync_steps"])
    self.losses, self._f0 = list(d["losses"]), d["f0"]
    self._next_sync, self._start = d["next_sync"], d["start"]

  def sync_now(self, step: int) -> bool:
    """Whether the workers synchronise after (0-based) ``step``; call once per step, in order.

    Raises:
      RuntimeError: ``"ada_lupa"`` without the loss of the previous sync (:meth:`observe`).
    """
    if self._next_sync is None:
      if self.needs_loss and len(self.losses) != len(self.sync_steps) + 1:
        raise RuntimeError("ada_lupa needs observe(F) at step 0 and after every sync")
      tau = self._period(len(self.periods), self._start)
      self.periods.append(tau)
      self._next_sync = self._start + tau - 1
    if step != self._next_sync:
      return False
    self.sync_steps.append(step)
    self._start = step + 1
    self._next_sync = None
    return True


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class FragmentSync:
  """What Streaming DiLoCo's synchronisation does after a step (a static, hashable
  ``ctx.period_end``): ``launch`` the all-reduce of fragment ``fragment``'s pseudo-gradient,
  and/or ``land`` it (the outer step and the merge). Without overlap both in one step."""

  fragment: int
  launch: bool = True
  land: bool = True


class FragmentPlanner(SyncPlanner):
  """Streaming DiLoCo's staggered schedule (Douillard et al. 2025): one fragment synchronises
  every ``H / P`` steps, in turn, so each fragment every ``H`` steps; with overlap
  (``delay`` = tau > 0) its all-reduce is launched tau steps before (the schedule of
  pytorch/torchft's ``StreamingDiLoCo``, ``fragment_sync_delay``). :meth:`sync_now` returns a
  :class:`FragmentSync` or 0; ``P = 1`` and tau = 0 is DiLoCo's period H.

  Raises:
    ValueError: ``P`` does not divide ``H``, or tau is not in ``[0, H / P)``.
  """

  def __init__(self, local_steps: int, fragments: int, delay: int = 0):
    if local_steps % fragments:
      raise ValueError(f"streaming_diloco.fragments={fragments} is not allowed with "
                       f"diloco.local_steps={local_steps}: it must divide H")
    every = local_steps // fragments
    if not 0 <= delay < every:
      raise ValueError(f"streaming_diloco.delay={delay} is not allowed with H / P = {every}: "
                       f"a fragment's all-reduce must land before the next one starts "
                       f"(0 <= tau < {every})")
    super().__init__("fixed", every)
    self.fragments, self.delay, self.every = int(fragments), int(delay), every

  def sync_now(self, step: int):
    land = super().sync_now(step)
    if land:
      return FragmentSync((len(self.sync_steps) - 1) % self.fragments, not self.delay, True)
    k, r = divmod(step + 1 + self.delay, self.every)
    if self.delay and r == 0:
      return FragmentSync((k - 1) % self.fragments, True, False)
    return 0


def linear_alpha(num_comm: int, num_steps: int, tau: int) -> float:
  """The released code's ramp slope (mmkamani7/LUPA-SGD ``main.py``, ``--adaptive``):
  ``2 / (num_comm + 1) * (num_steps / (num_comm * tau))``, the same float operations
  (``train_steps = num_steps``, ``sync_step = tau``)."""
  return 2 / (num_comm + 1) * (num_steps / (num_comm * tau))


def make_planner(cfg, loss_offset: float = 0.0) -> SyncPlanner:
  """The :class:`SyncPlanner` of ``local_sgd.*`` (the ``local_sgd`` recipe's planner).
  ``loss_offset``: ADA-LUPA's ``F*`` when ``local_sgd.offset_optimum`` (a synthetic task)."""
  c = cfg.local_sgd
  return SyncPlanner(c.schedule, c.local_steps, alpha=c.alpha, switch_step=c.switch_step,
                     max_tau=c.max_local_steps, loss_offset=loss_offset, num_comm=c.num_comm,
                     num_steps=cfg.num_steps)


# ----------------------------------------------------------------------------- config


def local_sgd_defaults() -> ml_collections.ConfigDict:
  """``config.local_sgd.*`` with their defaults: LUPA-SGD (Haddadpour et al. 2019)."""
  s = ml_collections.ConfigDict()
  s.local_steps = 4              # H: local steps per communication period (tau_0 of ada_lupa)
  s.schedule = "fixed"           # fixed | ada_lupa | linear | post_local (see host/periods.py)
  s.alpha = 0.1                  # linear: tau_i = ceil(tau (1 + alpha (i + 1))), i = 0, 1, ..
                                 # (the released code's ramp, see host/periods.py)
  s.num_comm = 0                 # linear: > 0 derives alpha = 2 / (num_comm + 1) * num_steps /
                                 # (num_comm tau) as the released main.py --num-comm (alpha
                                 # ignored); 0: use alpha
  s.switch_step = 0              # post_local: tau = 1 before this step, then tau
  s.max_local_steps = 0          # cap on any period (0: none)
  s.averaging = "mean"           # mean (exact average) | gossip (one step over topology)
  s.opt_state = "keep"           # at a sync: keep local | average | reset the optimizer state
  s.offset_optimum = False       # ada_lupa: observe F - F* (synthetic problems) not F
  return s


def check_period(cfg, errs: list) -> None:
  """Local SGD's first period ends within the run (``config.algorithm='local_sgd'``)."""
  checks.period_within_run(cfg, errs, "local_sgd.local_steps",
                           cfg.local_sgd.get("schedule") != "post_local")


def check_config(cfg, errs: list) -> None:
  """Config check of local_sgd.*: the period schedule and what a sync averages."""
  for key, allowed in (("schedule", SCHEDULES), ("averaging", AVERAGINGS),
                       ("opt_state", OPT_STATE_SYNCS)):
    checks.choice(cfg, errs, f"local_sgd.{key}", allowed)
  for key, lo in (("local_steps", 1), ("switch_step", 0), ("max_local_steps", 0), ("num_comm", 0)):
    checks.integer(cfg, errs, f"local_sgd.{key}", lo)
  checks.number(cfg, errs, "local_sgd.alpha", 0)
  if (checks.boolean(cfg, errs, "local_sgd.offset_optimum") and cfg.local_sgd.offset_optimum
      and cfg.get("dataset") not in PROBLEMS):
    errs.append(f"config.local_sgd.offset_optimum=True is not allowed with config.dataset="
                f"{cfg.get('dataset')!r}: F* is known only for {list(PROBLEMS)}")
