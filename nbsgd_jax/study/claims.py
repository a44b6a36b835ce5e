"""A study's claims: what a paper says, beside what the study measures (the study's field
``claims``, :mod:`nbsgd_jax.study`).

Each claim is ``{"source": the paper (authors, year, arXiv id, table or equation), "quote":
its words, "column": one of the study's columns, "methods": [the study's methods it is
about], "supports": what our set-up can and cannot support of it}``; ``results.md`` gets a
"Claims" section: per claim the source and the quote, a table of the column's values for those
methods on each variant (mean ± sample standard deviation, seeds), then the supports text.
"""

from __future__ import annotations

from nbsgd_jax.core import checks
from nbsgd_jax.study import stats

FIELDS = ("source", "quote", "column", "methods", "supports")
TEXTS = {"source": "the paper: authors, year, arXiv id, table or equation",
         "quote": "the paper's words", "supports": "what our set-up can and cannot support"}


def _claim(i: int, claim, columns: list, methods: list, errs: list):
  """One claim checked: the claim as a plain dict, or None and lines in ``errs``."""
  where = f"study.claims[{i}]"
  n = len(errs)
  if not checks.record_fields(claim, FIELDS, where, "a claim", errs):
    return None
  for key, what in TEXTS.items():
    if not isinstance(claim.get(key), str) or not claim[key].strip():
      errs.append(f"{where}.{key}={claim.get(key)!r} is not allowed: it must be a non-empty "
                  f"text ({what})")
  if claim.get("column") not in columns:
    errs.append(f"{where}.column={claim.get('column')!r} is not allowed: it must be one of the "
                f"study's columns {', '.join(map(repr, columns))}")
  names = claim.get("methods")
  if (not isinstance(names, (list, tuple)) or not names
      or not all(isinstance(m, str) for m in names)):
    errs.append(f"{where}.methods={names!r} is not allowed: it must be a non-empty list of the "
                f"study's methods ({', '.join(methods)})")
  elif any(m not in methods for m in names):
    errs.append(f"{where}.methods={list(names)!r} is not allowed: "
                f"{', '.join(repr(m) for m in names if m not in methods)} not among the "
                f"study's methods ({', '.join(methods)})")
  return None if len(errs) > n else {k: (list(v) if k == "methods" else v)
                                      for k, v in claim.items()}


def check(raw, columns: list, methods: list, errs: list) -> tuple:
  """The study's ``claims`` checked (module docstring).

  Args:
    raw: the field's value: None (no claims) or a list of claims.
    columns: the study's column texts; methods: its method names.
    errs: each bad field appends one line, ``study.claims[I].FIELD=VALUE is not allowed:
      WHAT IS``.

  Returns:
    the claims, plain dicts in order (empty: none, or a bad field).
  """
  if raw is None:
    return ()
  if not isinstance(raw, (list, tuple)):
    errs.append(f"study.claims={raw!r} is not allowed: it must be a list of claims, each a "
                f"dict with the fields {', '.join(FIELDS)}")
    return ()
  got = [_claim(i, c, columns, methods, errs) for i, c in enumerate(raw)]
  return tuple(c for c in got if c)


def markdown(results: dict) -> list[str]:
  """``results.md``'s "Claims" section (module docstring) as lines; none without claims.

  Args:
    results: :func:`nbsgd_jax.study.driver.run`'s value (its ``"claims"`` and
      ``"variants"``).
  """
  claims = results.get("claims") or []
  if not claims:
    return []
  lines = ["## Claims", ""]
  for i, c in enumerate(claims, 1):
    lines += [f"### {i}. {c['source']}", "", f"> {c['quote']}", "",
              f"Ours, `{c['column']}`:", "",
              "| variant | " + " | ".join(c["methods"]) + " |",
              "| --- | " + " | ".join("---" for _ in c["methods"]) + " |"]
    for variant, table in results["variants"].items():
      lines.append(f"| {variant} | " + " | ".join(
          stats.show(table["cells"][m][c["column"]]) for m in c["methods"]) + " |")
    lines += ["", f"What this supports: {c['supports']}", ""]
  return lines
