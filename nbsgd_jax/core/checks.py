"""Checks of one configuration key, shared by every component's section check.

Each helper checks ``cfg[key]`` (a dotted key), appends one line
``config.KEY=VALUE is not allowed: WHY`` to ``errs`` when it is bad and returns whether it was
good. NaN passes the range checks: :func:`nbsgd_jax.config.validate`'s final scan reports it.
A component checks its own section with ``check_config(cfg, errs)`` beside its code
(:func:`nbsgd_jax.config.section_checks` lists them).
"""

from __future__ import annotations

import numbers
import operator

import numpy as np
from typing import Any, Sequence

Errors = list[str]


def is_int(v: Any) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def not_allowed(field: str, value: Any, why: str) -> ValueError:
  """``ValueError("FIELD=VALUE is not allowed: WHY")``, the one form of a bad value's error."""
  return ValueError(f"{field}={value!r} is not allowed: {why}")



def choice(cfg, errs: Errors, key: str, allowed: Sequence) -> bool:
  v = cfg.get(key)
  if v in allowed:
    return True
  errs.append(f"config.{key}={v!r} is not allowed: use one of {list(allowed)}")
  return False


def integer(cfg, errs: Errors, key: str, lo: int, note: str = "") -> bool:
  v = cfg.get(key)
  if is_int(v) and v >= lo:
    return True
  errs.append(f"config.{key}={v!r} is not allowed: it must be an integer >= {lo}"
              + (f" ({note})" if note else ""))
  return False


def number(cfg, errs: Errors, key: str, lo: float, lo_open: bool = False,
            hi: float | None = None, hi_open: bool = False) -> bool:
  v = cfg.get(key)
  bad = not is_num(v) or v < lo or (lo_open and v == lo) or (hi is not None and (
      v > hi or (hi_open and v == hi)))
  if not bad:
    return True
  rng = f"{'>' if lo_open else '>='} {lo}" + (
      f" and {'<' if hi_open else '<='} {hi}" if hi is not None else "")
  errs.append(f"config.{key}={v!r} is not allowed: it must be a number {rng}")
  return False


def typed(cfg, errs: Errors, key: str, kind: type, allowed: str) -> bool:
  v = cfg.get(key)
  if isinstance(v, kind):
    return True
  errs.append(f"config.{key}={v!r} is not allowed: {allowed}")
  return False


def boolean(cfg, errs: Errors, key: str) -> bool:
  return typed(cfg, errs, key, bool, "use True or False")


def string(cfg, errs: Errors, key: str) -> bool:
  return typed(cfg, errs, key, str, "it must be a string")


def record_fields(value: Any, allowed: Sequence[str], where: str, name: str,
                  errs: Errors) -> bool:
  """A field of a file that is a dict of named fields (a study's claim, its trend): whether
  ``value`` is a dict; lines in ``errs``: ``WHERE=VALUE is not allowed: NAME is a dict with
  the fields A, B`` when it is not, ``WHERE.KEY=VALUE is not allowed: NAME has the fields A,
  B`` for each key not in ``allowed``."""
  if not isinstance(value, dict):
    errs.append(f"{where}={value!r} is not allowed: {name} is a dict with the fields "
                f"{', '.join(allowed)}")
    return False
  errs.extend(f"{where}.{k}={value[k]!r} is not allowed: {name} has the fields "
              f"{', '.join(allowed)}" for k in value if k not in allowed)
  return True


def index_at_least(name: str, value: Any, low: int) -> int:
  """``value`` as a Python int (any integer type, not a bool) that is ``>= low``.

  Raises:
    ValueError: otherwise, naming ``name``, the value and what is allowed.
  """
  if isinstance(value, bool) or type(value).__name__ == "bool_":
    raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {low}")
  try:
    v = operator.index(value)
  except TypeError:
    raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {low}") from None
  if v < low:
    raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {low}")
  return int(v)


def period_within_run(cfg, errs: list, key: str, active: bool) -> None:
  """A communication period ``cfg[key]`` (steps) longer than ``cfg.num_steps`` when
  ``active``: the run would never communicate (0 rounds, 0 bytes)."""
  period, steps = cfg.get(key), cfg.get("num_steps")
  if active and is_int(period) and is_int(steps) and steps >= 1 and period > steps:
    errs.append(f"config.{key}={period} is not allowed with config.num_steps={steps}: the run "
                f"would end before its first communication (0 rounds, 0 bytes); use at most "
                f"{steps}")


def register(registry: dict, kind: str, name: Any, fn: Any, reserved: Sequence[str],
             role: str, call: str, prefix: str = "") -> None:
  """``registry[name] = fn`` for ``register_<kind>`` (a model, a data set).

  Raises:
    ValueError: ``name`` is not a non-empty string, is one of ``reserved`` or starts with
      ``prefix``; ``fn`` (its ``role``, called as ``call``) is not callable.
  """
  if (not isinstance(name, str) or not name or name in reserved
      or (prefix and name.startswith(prefix))):
    extra = f" nor '{prefix}<name>'" if prefix else ""
    raise ValueError(f"register_{kind}(name={name!r}) is not allowed: give a new name (not "
                     f"one of {list(reserved)}{extra})")
  if not callable(fn):
    raise ValueError(f"register_{kind}({name!r}, {role}={fn!r}): the {role} must be callable "
                     f"as {call}")
  registry[name] = fn


def as_input(cfg, key: str) -> np.ndarray:
  """The value of config key ``key`` (dotted) as an input of the compiled step: an int32
  scalar for an integer, else float32 (``docs/design.md``, "Runs as data")."""
  value = cfg
  for part in key.split("."):
    value = value[part]
  return np.asarray(value, np.int32 if isinstance(value, int) and not isinstance(value, bool)
                    else np.float32)
