"""A run's budget in gradient computations per worker (``config.budget_unit =
"grads_per_worker"``): its evaluations and end in device steps (:class:`Budget`, read by
:class:`nbsgd_jax.run.stepper.Run`; :mod:`nbsgd_jax.run.stepper` re-exports it).
"""

from __future__ import annotations

import bisect
from typing import NamedTuple, Optional


class Budget(NamedTuple):
  """A run's evaluations and end in device steps, from its budget in gradient computations
  per worker (``config.budget_unit = "grads_per_worker"``: ``num_steps``, ``eval_every``
  and ``checkpoint_every`` in that unit; ``docs/design.md``, "Budgets in gradients per
  worker").

  Attributes:
    points: the budget points, gradient computations per worker, increasing: every multiple
      of ``eval_every`` below the budget, then the budget.
    steps: the device steps from step 0 that reach each, as the run's clock says
      (:meth:`nbsgd_jax.host.Host.steps_for`: lockstep, the points themselves).
  """

  points: tuple
  steps: tuple

  @classmethod
  def of(cls, cfg, host) -> Optional["Budget"]:
    """The budget of a run with ``cfg.budget_unit = "grads_per_worker"`` and host parts
    ``host``; None in device steps (``num_steps`` device steps, an evaluation every
    ``eval_every``)."""
    total, every = cfg.num_steps, cfg.eval_every
    if cfg.budget_unit != "grads_per_worker" or not total:
      return None
    points = tuple(range(every, total, every)) + (total,)
    return cls(points, tuple(int(t) for t in host.steps_for(points)))

  def next_step(self, done: int) -> int:
    """The device step of the first evaluation after step ``done`` (the last step when none
    is left)."""
    i = bisect.bisect_right(self.steps, done)
    return self.steps[min(i, len(self.steps) - 1)]

  def point_at(self, step: int) -> Optional[int]:
    """The budget point that device step ``step`` reaches last, or None when it is not one's
    step."""
    i = bisect.bisect_right(self.steps, step)
    return self.points[i - 1] if i and self.steps[i - 1] == step else None
