"""Which evaluations of a periodic run fall just after a synchronisation (:func:`sync_steps`,
:func:`sync_note`): a recipe that synchronises at period ends (local SGD, DiLoCo and its
descendants, Gossip-PGA: :attr:`nbsgd_jax.recipes.Recipe.planner`) evaluated every multiple
of its period measures its consensus distance right after the models were made equal
(DiLoCo: about 1e-8, float rounding), never between synchronisations.

The periods are the run's own when it has finished (``summary.json``'s ``periods``, the
planner's as run: ADA-LUPA's follow its losses), else those of the recipe its config builds
(:func:`nbsgd_jax.recipes.build`, its planner asked step by step). A period ``tau_i`` ends
with a synchronisation after its last step, so the evaluation at step ``s_i + tau_i`` (steps
done) is the first after it (``nbsgd_jax/host/periods.py``).
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import ml_collections

from nbsgd_jax import recipes as recipes_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.report.runs import Run, _num


def _planned_periods(config: dict, upto: int) -> Optional[list]:
  """The periods the recipe of ``config`` plans over ``upto`` steps, or None (not periodic,
  periods that follow the run's losses, or a config that builds no recipe)."""
  cfg = ml_collections.ConfigDict(config)
  try:
    topo = topology_lib.make(cfg.topology, cfg.num_workers, weights=cfg.mixing_weights,
                             p=cfg.topology_p, seed=cfg.topology_seed,
                             rows=cfg.topology_rows or None, cols=cfg.topology_cols or None)
    recipe = recipes_lib.build(cfg, topo)
  except (ValueError, KeyError, AttributeError, TypeError):
    return None
  if recipe.planner is None:
    return None
  planner = recipe.planner(0.0)
  if planner.needs_loss:
    return None
  for step in range(upto):
    planner.sync_now(step)
  return list(planner.periods)


def periods_of(run: Run) -> Optional[list]:
  """The periods (steps each) of ``run`` up to its last evaluation: its own when it has
  finished, else those its recipe plans (module docstring); None for a run that is not
  periodic (every step communicates) or whose periods cannot be known."""
  if run.summary is not None:
    periods = run.summary.get("periods")
  else:
    last = max((r["step"] for r in run.records), default=0)
    periods = _planned_periods(run.config, int(last))
  return [int(p) for p in periods] if periods else None


def sync_steps(run: Run) -> Optional[set]:
  """The evaluation steps (steps done) of ``run`` that come just after a synchronisation
  (the ends of :func:`periods_of`), or None."""
  periods = periods_of(run)
  return None if periods is None else set(itertools.accumulate(periods))


def _every(periods: Sequence[int]) -> str:
  return (f"every {periods[0]} steps" if len(set(periods)) == 1
          else f"periods of {min(periods)} to {max(periods)} steps")


def at_syncs(run: Run, key: str = "consensus_distance") -> Optional[list]:
  """The steps of ``run``'s evaluations of ``key`` after step 0 when every one of them falls
  just after a synchronisation (:func:`sync_steps`), else None."""
  steps = [r["step"] for r in run.records if r["step"] > 0 and _num(r.get(key)) is not None]
  syncs = sync_steps(run) if steps else None
  if syncs is None or not all(s in syncs for s in steps):
    return None
  return steps


def sync_note(run: Run, label: str, steps: list) -> str:
  """The note under the consensus figure for a run whose evaluations after step 0
  (``steps``, :func:`at_syncs`) all come just after a synchronisation."""
  periods = periods_of(run) or []
  shown = ", ".join(map(str, steps[:4])) + (", ..." if len(steps) > 4 else "")
  top = max(_num(r.get("consensus_distance")) or 0.0 for r in run.records)
  return (f"{label}: its {len(steps)} evaluations after step 0 (steps {shown}) all fall "
          f"just after a synchronisation (its periods: {_every(periods)}), "
          f"so its curve is the distance right after the models were synchronised (at most "
          f"{top:.2g}), not between synchronisations; an `eval_every` that is not a multiple "
          "of the period samples it in between.")


def sync_label(label: str) -> str:
  """The consensus figure's legend entry of such a run."""
  return f"{label} (evaluated just after syncs)"


__all__ = ["at_syncs", "periods_of", "sync_label", "sync_note", "sync_steps"]
