"""Sweeps: a grid of hyperparameters and seeds written once, run as few programs as its
structures allow (``docs/guide.md``, "Sweeps"; ``docs/design.md``, "Runs as data").

``config.sweep`` is the grid: axes separated by ``;``, each ``key=v1,v2,...`` (a config
key, dotted, and its values; ``a:b`` for the integers ``a, ..., b - 1``), e.g.
``learning_rate=0.05,0.1;seed=0:3``. The grid is the product of its axes (6 runs here), each
run a config with ``sweep=""``; runs whose :func:`nbsgd_jax.run.hparams.structure_key` agree
form one group, trained as ONE program (a runs axis over the workers); groups run in turn.
"""

from __future__ import annotations

import copy
import itertools
from typing import Callable, NamedTuple, Optional

import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.config.switches import inactive_reasons
from nbsgd_jax.run import hparams as hparams_lib

# what a run's own config may not vary within one program, with the reason (grouped instead)
NOT_SWEPT = {
    "sweep": "a sweep does not nest",
}


class Run(NamedTuple):
  """One run of a sweep.

  Attributes:
    name: its directory under the sweep's workdir (``key=value,key=value`` of its axes).
    overrides: ``{dotted key: value}`` of its axes.
    cfg: its config (the sweep's with ``overrides``, ``sweep=""``).
  """

  name: str
  overrides: dict
  cfg: ml_collections.ConfigDict


def parse(text: str, cfg: ml_collections.ConfigDict) -> list[tuple[str, list]]:
  """The axes of ``config.sweep``: ``[(dotted key, [values])]`` in order, each value of the
  key's type (an int where the default is an int, ...).

  Raises:
    ConfigError: an axis without ``=``, an unknown key, a key swept twice, an empty list, a
      value of the wrong type, a tuple-valued key, an empty range (``a:b`` with ``a >= b``),
      a value twice in one axis, no axis at all (a grid of zero runs); one line each, naming
      the key.
  """
  errs, axes, seen = [], [], set()
  for part in [p.strip() for p in text.replace("\n", ";").split(";") if p.strip()]:
    key, eq, values = part.partition("=")
    key = key.strip()
    if not eq:
      errs.append(f"config.sweep: {part!r} is not an axis: write key=value1,value2,...")
      continue
    if key in seen:
      errs.append(f"config.sweep: config.{key} is swept twice")
      continue
    seen.add(key)
    errs_before = len(errs)
    default = _default(cfg, key, errs)
    if len(errs) > errs_before:
      continue
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
      errs.append(f"config.sweep: config.{key} has no values: write {key}=value1,value2,...")
      continue
    try:
      per_item = [_values(item, default) for item in items]
    except ValueError as e:
      errs.append(f"config.sweep: config.{key}={e} is not allowed: it must be "
                  f"{config_lib.TYPE_NAMES.get(type(default), type(default).__name__)}")
      continue
    axis_errs = _axis_errors(key, values.strip(), items, per_item)
    errs.extend(axis_errs)
    if not axis_errs:
      axes.append((key, [v for vs in per_item for v in vs]))
  if not axes and not errs:
    errs.append(f"config.sweep={text!r} has no axis: a grid of zero runs is not allowed; "
                "write key=value1,value2,... (axes separated by ;)")
  if errs:
    raise config_lib.ConfigError(errs)
  return axes


def _axis_errors(key: str, text: str, items: list, per_item: list) -> list[str]:
  """The lines refusing one axis ``key=text``: an item ``a:b`` that is an empty range (``a >=
  b``), a value given twice (after typing: ``0.1,1e-1``; ``0:3,2``); ``per_item[i]``: the
  values of ``items[i]``."""
  errs = [f"config.sweep: {key}={item} is an empty range: a:b needs a < b"
          for item, vs in zip(items, per_item) if not vs]
  seen, repeated = set(), {}  # repeated: a dict for its order
  for v in (v for vs in per_item for v in vs):
    if v in seen:
      repeated[v] = None
    seen.add(v)
  if repeated:
    errs.append(f"config.sweep: {key}={text} repeats {', '.join(map(str, repeated))}: each "
                "value of an axis is allowed once (one run per value)")
  return errs


def _default(cfg, key: str, errs: list):
  """The current value of ``key`` in ``cfg`` (its type types the values), or an error."""
  if key in NOT_SWEPT:
    errs.append(f"config.sweep: config.{key} cannot be swept: {NOT_SWEPT[key]}")
    return None
  node = cfg
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      errs.extend(f"config.sweep: {line}" for line in config_lib.unknown_key_errors([key]))
      return None
    node = node[part]
  if isinstance(node, (tuple, list, ml_collections.ConfigDict)):
    errs.append(f"config.sweep: config.{key} holds a {type(node).__name__}: a sweep varies "
                "numbers, strings and booleans")
  return node


def _values(item: str, default) -> list:
  """``item`` read as ``default``'s type; ``a:b`` -> ``range(a, b)`` for integers.

  Raises:
    ValueError: (with the item as its message) a value that does not read as that type.
  """
  if isinstance(default, bool):
    if item not in ("True", "False", "true", "false"):
      raise ValueError(repr(item))
    return [item in ("True", "true")]
  if isinstance(default, int):
    lo, colon, hi = item.partition(":")
    try:
      return list(range(int(lo), int(hi))) if colon else [int(item)]
    except ValueError:
      raise ValueError(repr(item)) from None
  if isinstance(default, float):
    try:
      return [float(item)]
    except ValueError:
      raise ValueError(repr(item)) from None
  return [item]


def expand(cfg: ml_collections.ConfigDict) -> list[Run]:
  """The runs of ``cfg.sweep`` (the product of its axes, the last axis fastest); each run's
  config validated.

  Raises:
    ConfigError: a bad grid (:func:`parse`), an axis with no effect on any run
      (:func:`idle_axis_errors`) or a run whose config is refused (named with the run).
  """
  axes = parse(cfg.sweep, cfg)
  runs = []
  for values in itertools.product(*(v for _, v in axes)):
    over = dict(zip((k for k, _ in axes), values))
    run_cfg = config_lib.override(copy.deepcopy(cfg), {**over, "sweep": ""})
    runs.append(Run(",".join(f"{k}={_show(v)}" for k, v in over.items()), over, run_cfg))
  errs = idle_axis_errors(axes, runs)
  if errs:
    raise config_lib.ConfigError(errs)
  for run in runs:
    try:
      config_lib.validate(run.cfg)
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError([f"config.sweep run {run.name}: {line}"
                                    for line in e.errors]) from None
  return runs


def idle_axis_errors(axes: list[tuple[str, list]], runs: list[Run]) -> list[str]:
  """One line per axis whose key has no effect on any run of the grid: a key of a section
  that is off in every run (:func:`nbsgd_jax.config.switches.inactive_reasons`, the switches
  behind the ``has no effect`` warnings), e.g. ``diloco.outer_lr`` with
  ``algorithm=dpsgd``, whose runs would be identical. An axis that matters in some runs
  (``algorithm`` swept too) passes."""
  reasons = [inactive_reasons(run.cfg) for run in runs]
  errs = []
  for key, values in axes:
    if all(key in r for r in reasons):
      why = ", ".join(dict.fromkeys(f"config.{r[key][0]}={r[key][1]!r}" for r in reasons))
      errs.append(f"config.sweep: config.{key}={','.join(map(_show, values))} is not allowed: "
                  f"it has no effect on any run ({why}), so its {len(values)} values would "
                  "train identical runs; sweep a key the runs read")
  return errs


def _show(v) -> str:
  return repr(v) if isinstance(v, str) and ("," in v or "=" in v) else str(v)


def groups(runs: list[Run], *given, alone: Optional[Callable[[int], bool]] = None
           ) -> list[list[int]]:
  """The runs' indices grouped by structure (:func:`nbsgd_jax.run.hparams.structure_key`;
  ``given``: the objects handed to ``train``), each group in grid order, the groups in the
  order of their first run. ``alone(i)``: run ``i`` is a group of its own (its host plans
  its communication periods from its own losses, ADA-LUPA: its period ends are its
  program's structure)."""
  out: dict = {}
  for i, run in enumerate(runs):
    key = hparams_lib.structure_key(run.cfg, *given)
    if alone is not None and alone(i):
      key = f"{key}#{i}"
    out.setdefault(key, []).append(i)
  return list(out.values())


__all__ = ["NOT_SWEPT", "Run", "expand", "groups", "idle_axis_errors", "parse"]
