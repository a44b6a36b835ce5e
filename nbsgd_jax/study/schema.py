"""A study file read and checked (the schema of :mod:`nbsgd_jax.study`), and the config of
each of its runs composed.

Every bad field is one line, ``study.FIELD=VALUE is not allowed: WHAT IS``, collected and
raised together as :class:`nbsgd_jax.config.ConfigError`; a composed config that
:func:`nbsgd_jax.config.validate` refuses gives its lines prefixed with the method and the
variant (``method easgd, variant slow: config.nonblocking...``).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import os
import re
from typing import NamedTuple, Optional

import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.core import checks
from nbsgd_jax.study import claims as claims_lib
from nbsgd_jax.study import stages
from nbsgd_jax.study import trend as trend_lib

FIELDS = ("base", "methods", "variants", "tune", "seeds", "budget", "columns", "quick",
          "claims", "trend", "prefix")
METHOD_FIELDS = ("overrides", "grid")
TUNE_FIELDS = ("seeds", "variant", "metric", "mode", "extend", "overrides")
QUICK_FIELDS = ("overrides", "seeds", "budget", "tune", "prefix")
PREFIX_FIELDS = ("overrides", "budget")
BUDGETS = ("num_steps", "grads_per_worker")
AXES = ("sim_time", "bytes_sent", "grads_per_worker", "step")  # x of "at equal" and "to"
COLUMN_FORMS = ("'final METRIC'", "'METRIC at equal X'", "'METRIC gap to METHOD'",
                "'X to METRIC <= TARGET'", "'X to METRIC >= TARGET'")
_COLUMN = [("final", re.compile(r"^final (\w+)$")),
           ("equal", re.compile(r"^(\w+) at equal (\w+)$")),
           ("gap", re.compile(r"^(\w+) gap to (\S+)$")),
           ("to", re.compile(r"^(\w+) to (\w+) (<=|>=) (\S+)$"))]
_NUMBER = re.compile(r"^[-+0-9.eE]+$")  # a target written as a number; otherwise a method
DEFAULT_VARIANT = "default"
EACH = "each"  # tune.variant: every variant tuned on its own (model sizes)


class Column(NamedTuple):
  """One column of the results: ``kind`` "final" (``metric``'s final value), "equal"
  (``metric`` at the largest ``x`` every reported run of the variant reaches), "gap" (the
  percentage gap of the final ``metric`` to the method ``ref``'s, paired by seed) or "to"
  (``x`` when ``metric`` first reaches ``target``, ``op`` "<=" or ">="; with ``ref`` set and
  ``target`` None, the target is the method ``ref``'s mean final ``metric`` on the
  variant)."""

  text: str
  kind: str
  metric: str
  x: Optional[str] = None
  op: Optional[str] = None
  target: Optional[float] = None
  ref: Optional[str] = None  # the reference method of "gap", or of a "to" target


class Method(NamedTuple):
  """A method: its config ``overrides`` (dotted keys) and tuning ``grid``, ``[(dotted key,
  [values])]`` (the product of its axes)."""

  overrides: dict
  grid: list


class Study(NamedTuple):
  """A checked study (the package docstring gives each field's meaning)."""

  path: str
  base: object  # a dict of dotted overrides, or a config file's path
  methods: dict
  variants: dict
  tune_seeds: tuple
  tune_variant: str
  metric: str
  mode: str  # "min" or "max": the better score
  extend: int  # the most extensions beyond an edge pick (True: 1, False: 0)
  seeds: tuple
  budget: tuple  # (unit, amount): ("num_steps", 300)
  columns: list
  late: dict  # --quick's config overrides, after the variant's
  quick: bool
  claims: tuple = ()  # the papers' claims beside our values (nbsgd_jax.study.claims)
  trend: Optional[dict] = None  # {"column", "x", "log_x"} (nbsgd_jax.study.trend)
  prefix: Optional[dict] = None  # {"overrides", "budget": (unit, amount)} (study.stages)
  tune_overrides: dict = {}  # the tuning runs' config overrides (dotted), after the budget


def load_file(path: str, function: str = "get_study"):
  """``function()`` of the Python file ``path`` (a study or a config file).

  Raises:
    ConfigError: no such file, or no such function in it (one line).
  """
  if not os.path.isfile(path):
    raise config_lib.ConfigError([f"study file {path!r} is not allowed: no such file"])
  name = "_study_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
  spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, function, None)):
    raise config_lib.ConfigError([f"{path} has no {function}(): a study file defines "
                                  f"{function}() returning its fields"])
  return getattr(module, function)()


def _plain(value):
  """A ConfigDict (or dict) as a plain dict, recursively; other values as they are."""
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  return {k: _plain(v) for k, v in value.items()} if isinstance(value, dict) else value


def _flat(value, where: str, errs: list) -> dict:
  """A dict of config overrides (nested sections or dotted keys) as dotted keys."""
  if value is None:
    return {}
  if not isinstance(value, dict):
    errs.append(f"{where}={value!r} is not allowed: it must be a dict of config overrides")
    return {}
  return config_lib.flatten_dict(value)


def _unknown(d: dict, allowed: tuple, where: str, errs: list) -> None:
  errs.extend(f"{where}.{k}={d[k]!r} is not allowed: {where} has the fields "
              f"{', '.join(allowed)}" for k in d if k not in allowed)


def _seeds(value, where: str, errs: list) -> tuple:
  seeds = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
  if (not isinstance(seeds, (list, tuple)) or not seeds or len(set(seeds)) != len(seeds)
      or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
    errs.append(f"{where}={value!r} is not allowed: it must be an integer or a list of "
                "distinct integers")
    return ()
  return tuple(seeds)


def parse_column(text, errs: list, methods: Optional[list] = None) -> Optional[Column]:
  """A column's text (:data:`COLUMN_FORMS`) read, or None and a line in ``errs``. A "to"
  column's TARGET is a number (digits, sign, ".", "e") or a method's name (its mean final
  METRIC); a METHOD not among ``methods`` (when given) is refused."""
  for kind, pattern in _COLUMN:
    m = pattern.match(str(text).strip()) if isinstance(text, str) else None
    if not m:
      continue
    if kind == "final":
      return Column(text, kind, m.group(1))
    if kind == "equal" and m.group(2) in AXES:
      return Column(text, kind, m.group(1), m.group(2))
    ref = m.group(2) if kind == "gap" else m.groups()[-1]  # the method, or a number
    if kind == "gap" or (kind == "to" and m.group(1) in AXES and not _NUMBER.match(ref)):
      if methods is not None and ref not in methods:
        errs.append(f"study.columns entry {text!r} is not allowed: {ref!r} is not among the "
                    f"study's methods ({', '.join(methods)})")
        return None
      return (Column(text, kind, m.group(1), ref=ref) if kind == "gap" else
              Column(text, kind, m.group(2), m.group(1), m.group(3), ref=ref))
    if kind == "to" and m.group(1) in AXES:
      try:
        return Column(text, kind, m.group(2), m.group(1), m.group(3), float(m.group(4)))
      except ValueError:
        break
  errs.append(f"study.columns entry {text!r} is not allowed: a column is one of "
              f"{', '.join(COLUMN_FORMS)}, with X one of {', '.join(AXES)}")
  return None


def _method(name: str, spec, errs: list) -> Optional[Method]:
  where = f"study.methods.{name}"
  if not isinstance(spec, dict):
    errs.append(f"{where}={spec!r} is not allowed: a method is a dict with the fields "
                f"{', '.join(METHOD_FIELDS)}")
    return None
  _unknown(spec, METHOD_FIELDS, where, errs)
  grid = config_lib.flatten_dict(spec.get("grid") or {})
  if not grid:
    errs.append(f"{where}.grid={spec.get('grid')!r} is not allowed: a method needs a tuning "
                "grid {key: [values]} with at least one key")
  axes = []
  for key, values in grid.items():
    if not isinstance(values, (list, tuple)) or not values or len(set(values)) != len(values):
      errs.append(f"{where}.grid.{key}={values!r} is not allowed: it must be a non-empty list "
                  "of distinct values")
    else:
      axes.append((key, list(values)))
  return Method(_flat(spec.get("overrides"), f"{where}.overrides", errs), axes)


def _budget(value, where: str, errs: list) -> tuple:
  if (isinstance(value, dict) and len(value) == 1 and next(iter(value)) in BUDGETS
      and isinstance(next(iter(value.values())), int) and next(iter(value.values())) > 0):
    return next(iter(value.items()))
  errs.append(f"{where}={value!r} is not allowed: it must be one of "
              f"{{'num_steps': N}}, {{'grads_per_worker': N}} with N a positive integer")
  return ("num_steps", 1)


def _tune(raw: dict, variants: dict, errs: list) -> dict:
  tune = raw.get("tune") or {}
  if not isinstance(tune, dict):
    errs.append(f"study.tune={tune!r} is not allowed: it must be a dict with the fields "
                f"{', '.join(TUNE_FIELDS)}")
    tune = {}
  _unknown(tune, TUNE_FIELDS, "study.tune", errs)
  out = {"tune_seeds": _seeds(tune.get("seeds"), "study.tune.seeds", errs),
         "tune_variant": tune.get("variant", next(iter(variants))),
         "metric": tune.get("metric", "train_loss"), "mode": tune.get("mode", "min"),
         "extend": tune.get("extend", True),
         "tune_overrides": _flat(tune.get("overrides"), "study.tune.overrides", errs)}
  if out["tune_variant"] not in variants and out["tune_variant"] != EACH:
    errs.append(f"study.tune.variant={out['tune_variant']!r} is not allowed: it must be one of "
                f"the variants {', '.join(map(repr, variants))}, or {EACH!r} (each variant "
                "tuned on its own)")
  if out["mode"] not in ("min", "max"):
    errs.append(f"study.tune.mode={out['mode']!r} is not allowed: it must be 'min' or 'max'")
  if not isinstance(out["metric"], str) or not out["metric"]:
    errs.append(f"study.tune.metric={out['metric']!r} is not allowed: it must be a record's "
                "name (train_loss, gap, test_accuracy, ...)")
  out["extend"] = _extend(out["extend"], errs)
  return out


def _extend(value, errs: list) -> int:
  """``tune.extend`` as the most extensions beyond an edge pick: True 1, False 0, an integer
  k >= 0 itself."""
  if isinstance(value, bool):
    return int(value)
  if isinstance(value, int) and value >= 0:
    return value
  errs.append(f"study.tune.extend={value!r} is not allowed: it must be True (one step beyond "
              "an edge pick), False (none) or an integer k >= 0 (up to k steps while the pick "
              "stays at an edge)")
  return 0


def _tune_keys(methods: dict, over: dict, errs: list) -> None:
  """``tune.overrides`` may not set what the tuning runs set themselves: ``seed`` (the tuning
  seeds) or a key of a method's grid (the grid point)."""
  for key, value in over.items():
    axes = [n for n, m in methods.items() if key in dict(m.grid)]
    if key == "seed" or axes:
      what = ("the tuning runs' seeds are study.tune.seeds" if key == "seed" else
              f"it is an axis of the grid of {', '.join(axes)} (the grid point sets it)")
      errs.append(f"study.tune.overrides.{key}={value!r} is not allowed: {what}")


def _with_quick(raw: dict, quick: bool, errs: list) -> tuple[dict, dict]:
  """The study's fields with ``quick``'s replacements (when ``quick``), and the late config
  overrides."""
  q = raw.get("quick") or {}
  if not isinstance(q, dict):
    errs.append(f"study.quick={q!r} is not allowed: it must be a dict with the fields "
                f"{', '.join(QUICK_FIELDS)}")
    return raw, {}
  _unknown(q, QUICK_FIELDS, "study.quick", errs)
  late = _flat(q.get("overrides"), "study.quick.overrides", errs)
  if not quick:
    return raw, {}
  out = {**raw, **{k: v for k, v in q.items() if k in QUICK_FIELDS and k != "overrides"}}
  for name in ("tune", "prefix"):  # quick.tune, quick.prefix: replace the fields they name
    if isinstance(q.get(name), dict) and isinstance(raw.get(name), dict):
      out[name] = {**raw[name], **q[name]}
  return out, late


def _prefix(raw: dict, errs: list) -> Optional[dict]:
  """``study.prefix`` checked (:mod:`nbsgd_jax.study.stages`): None, or ``{"overrides":
  dotted config overrides, "budget": (unit, amount)}``, both fields required."""
  q = raw.get("quick") if isinstance(raw.get("quick"), dict) else {}
  if q.get("prefix") is not None and raw.get("prefix") is None:
    errs.append(f"study.quick.prefix={q['prefix']!r} is not allowed: the study has no prefix "
                "(quick.prefix replaces fields of study.prefix)")
  spec = raw.get("prefix")
  if spec is None:
    return None
  n = len(errs)
  if not checks.record_fields(spec, PREFIX_FIELDS, "study.prefix", "study.prefix", errs):
    return None
  errs.extend(f"study.prefix.{field}=None is not allowed: it is required ({what})"
              for field, what in (("overrides", "config overrides, {} for none"),
                                  ("budget", "{'num_steps': N}")) if field not in spec)
  over = spec.get("overrides")
  if over is not None and not isinstance(over, dict):
    errs.append(f"study.prefix.overrides={over!r} is not allowed: it must be a dict of config "
                "overrides")
  over = config_lib.flatten_dict(over) if isinstance(over, dict) else {}
  budget = _budget(spec.get("budget"), "study.prefix.budget", errs) if "budget" in spec else ()
  return None if len(errs) > n else {"overrides": over, "budget": budget}


def check(raw, path: str = "<study>", quick: bool = False) -> Study:
  """The study ``raw`` (``get_study()``'s ConfigDict or dict) checked and normalised.

  Raises:
    ConfigError: every bad field, one line each (module docstring), all at once.
  """
  errs: list = []
  raw = _plain(raw)
  if not isinstance(raw, dict):
    raise config_lib.ConfigError([f"get_study() returned {type(raw).__name__}: it must return "
                                  "a ConfigDict or a dict"])
  _unknown(raw, FIELDS, "study", errs)
  raw, late = _with_quick(raw, quick, errs)
  base = raw.get("base") or {}
  if not isinstance(base, str):
    base = _flat(base, "study.base", errs)
  methods = raw.get("methods") or {}
  if not isinstance(methods, dict) or not methods:
    errs.append(f"study.methods={methods!r} is not allowed: it must name at least one method "
                "{name: {overrides, grid}}")
    methods = {}
  methods = {n: m for n, m in ((n, _method(n, s, errs)) for n, s in methods.items()) if m}
  variants = raw.get("variants") or {DEFAULT_VARIANT: {}}
  if not isinstance(variants, dict):
    errs.append(f"study.variants={variants!r} is not allowed: it must be a dict "
                "{name: overrides}")
    variants = {DEFAULT_VARIANT: {}}
  variants = {n: _flat(v, f"study.variants.{n}", errs) for n, v in variants.items()}
  tune = _tune(raw, variants, errs)
  _tune_keys(methods, tune["tune_overrides"], errs)
  seeds = _seeds(raw.get("seeds"), "study.seeds", errs)
  both = sorted(set(seeds) & set(tune["tune_seeds"]))
  if both:
    errs.append(f"study.tune.seeds={list(tune['tune_seeds'])} is not allowed: seed(s) "
                f"{', '.join(map(str, both))} also in study.seeds={list(seeds)}; the seed that "
                "tunes must not be reported")
  budget = _budget(raw.get("budget"), "study.budget", errs)
  columns = raw.get("columns") or [f"final {tune['metric']}"]
  columns = [c for c in (parse_column(t, errs, list(methods)) for t in columns) if c]
  texts = [c.text for c in columns]
  claims = claims_lib.check(raw.get("claims"), texts, list(methods), errs)
  trend = trend_lib.check(raw.get("trend"), texts, errs)
  prefix = _prefix(raw, errs)
  if errs:
    raise config_lib.ConfigError(errs)
  return Study(path, base, methods, variants, seeds=seeds, budget=budget, columns=columns,
               late=late, quick=quick, claims=claims, trend=trend, prefix=prefix, **tune)


def only_variants(study: Study, names: Optional[list]) -> Study:
  """``study`` restricted to the variants ``names`` (None: all), in the study's order.

  Raises:
    ConfigError: a name that is not a variant, or a list without the tuning variant.
  """
  if names is None:
    return study
  errs = [f"--variants {n!r} is not allowed: the study's variants are "
          f"{', '.join(study.variants)}" for n in names if n not in study.variants]
  if study.tune_variant not in (EACH, *names):
    errs.append(f"--variants {' '.join(names)} is not allowed: the methods are tuned on "
                f"{study.tune_variant!r}, which must be among them")
  if errs:
    raise config_lib.ConfigError(errs)
  return study._replace(variants={n: v for n, v in study.variants.items() if n in names})


def points(grid: list) -> list[dict]:
  """The grid's points, ``{key: value}`` each (the product of its axes, the last fastest)."""
  return [dict(zip((k for k, _ in grid), vs)) for vs in itertools.product(*(v for _, v in grid))]


def _imports(study: Study) -> str:
  """Every ``imports`` the study's overrides name, comma-separated (imported before the
  default config is made, so that their sections exist)."""
  parts = [study.base] if isinstance(study.base, dict) else []
  parts += [m.overrides for m in study.methods.values()] + list(study.variants.values())
  parts += [study.prefix["overrides"]] if study.prefix else []
  parts += [study.tune_overrides]
  names = [n.strip() for p in parts + [study.late] for n in str(p.get("imports", "")).split(",")]
  return ",".join(dict.fromkeys(n for n in names if n))


def base_config(study: Study) -> ml_collections.ConfigDict:
  """The study's base config: ``base``'s file's ``get_config()``, or the default config with
  ``base``'s overrides; the study's ``imports`` imported first.

  Raises:
    ConfigError: an import that fails, a bad file, an unknown key (one line each).
  """
  config_lib.import_modules(ml_collections.ConfigDict({"imports": _imports(study)}))
  if isinstance(study.base, str):
    return load_file(study.base, "get_config")
  return config_lib.override(config_lib.default_config(), study.base)


def compose(study: Study, base: ml_collections.ConfigDict, method: str, variant: str,
            point: dict, seed: int, tuning: bool = False) -> ml_collections.ConfigDict:
  """One run's config: ``base`` then the method's overrides, the variant's, ``--quick``'s, the
  budget, for a tuning run (``tuning``) ``tune.overrides``, the grid ``point`` and ``seed``
  (``progress`` off: the study has one bar); with a prefix, ``init_from`` its seed's prefix,
  relative to the study's directory (:func:`nbsgd_jax.study.stages.source`; a study without
  one composes nothing more, nor one without ``tune.overrides`` for its tuning runs).

  Raises:
    ConfigError: an unknown key or a value of the wrong type (one line).
  """
  cfg = copy.deepcopy(base)
  unit, amount = study.budget
  budget = {"num_steps": amount, "budget_unit": "steps" if unit == "num_steps" else unit}
  tuned = [study.tune_overrides] if tuning and study.tune_overrides else []
  for over in (study.methods[method].overrides, study.variants[variant], study.late, budget,
               *tuned, point, {"seed": seed, "progress": False}):
    config_lib.override(cfg, over)
  if study.prefix is not None:
    config_lib.override(cfg, {"init_from": stages.source(study, base, seed)})
  return cfg


def _cases(study: Study, method: Method) -> list[tuple]:
  """``[(variant, point, tuning)]`` that :func:`validate` checks: each grid point on the
  tuning variant(s), each variant at the grid's first point; with ``tune.overrides``, the
  reported configs (``tuning`` False) first, then the tuning runs'."""
  tuned = list(study.variants) if study.tune_variant == EACH else [study.tune_variant]
  first = points(method.grid)[0]
  tuning = [(v, p, True) for v in tuned for p in points(method.grid)]
  if not study.tune_overrides:  # the tuning runs are the tuned variants' reported configs
    return tuning + [(v, first, False) for v in study.variants if v not in tuned]
  return [(v, first, False) for v in study.variants] + tuning


def validate(study: Study, base: ml_collections.ConfigDict) -> None:
  """Every method's configs checked (:func:`nbsgd_jax.config.validate`): each grid point on
  the tuning variant (with ``tune.overrides``), each variant at the grid's first point; and
  the prefix's config.

  Raises:
    ConfigError: each refused config's lines (once each), prefixed ``method M, variant V: ``
      (``method M, variant V, tuning runs: `` for a line that only the tuning runs'
      ``tune.overrides`` bring; ``study.prefix: `` for the prefix's, alone: every run's config
      names the prefix).
  """
  errs: list = []
  if study.prefix is not None:
    try:
      config_lib.validate(stages.config(study, base, study.seeds[0]))
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError([f"study.prefix: {line}" for line in e.errors]) from None
  seen: set = set()
  for name, method in study.methods.items():
    for variant, point, tuning in _cases(study, method):
      where = f"method {name}, variant {variant}"  # a bad grid value: config's line names it
      where += ", tuning runs" if tuning and study.tune_overrides else ""
      try:
        config_lib.validate(compose(study, base, name, variant, point, study.seeds[0], tuning))
      except config_lib.ConfigError as e:
        new = [line for line in e.errors if (name, variant, line) not in seen]
        seen.update((name, variant, line) for line in new)
        errs.extend(f"{where}: {line}" for line in new)
  if errs:
    raise config_lib.ConfigError(errs)
