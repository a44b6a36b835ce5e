"""``python -m nbsgd_jax.study FILE --out DIR [--quick] [--only M ...] [--redo M ...]
[--variants V ...] [--allow_mixed]``: run a study (:mod:`nbsgd_jax.study`). A bad study
prints one ``error:`` line per problem and exits with status 2 before anything trains; so
does a study that would train into a cache of another commit's runs without
``--allow_mixed``."""

from __future__ import annotations

import argparse
import sys

from nbsgd_jax import config as config_lib
from nbsgd_jax.study import driver, output, schema


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog="python -m nbsgd_jax.study",
      description="Run a study: each method tuned on held-out seeds over its grid, reported "
      "over seeds at the pick, compared at equal bytes and equal time (docs/guide.md, 'A "
      "study in one file').")
  p.add_argument("study", metavar="FILE", help="a Python file whose get_study() returns the "
                 "study's fields")
  p.add_argument("--out", required=True, help="the study's directory: runs/ (the run cache: "
                 "a second command resumes), results.json, results.md, curves_<variant>.png")
  p.add_argument("--quick", action="store_true", help="apply the study's quick replacements "
                 "(a smoke run)")
  p.add_argument("--only", nargs="+", metavar="METHOD", default=None,
                 help="train these methods only; the others are read from the cache")
  p.add_argument("--redo", nargs="+", metavar="METHOD", default=[],
                 help="retrain these methods' runs, replacing their cached runs")
  p.add_argument("--variants", nargs="+", metavar="VARIANT", default=None,
                 help="these variants only (a study larger than a session, a size at a time; "
                 "the cache is shared, so the full study later trains only what is missing)")
  p.add_argument("--allow_mixed", action="store_true",
                 help="train new runs into a cache whose runs were made by another commit "
                 "(results.json then says mixed); reading a complete cache never needs it")
  p.add_argument("--no_progress", dest="progress", action="store_false",
                 help="no progress bar")
  return p.parse_args(argv)


def main(argv=None) -> int:
  """The command line (module docstring); returns the exit status (0, or 2: a bad study)."""
  a = parse_args(argv)
  try:
    study = schema.only_variants(schema.check(schema.load_file(a.study), a.study, a.quick),
                                 a.variants)
    results = driver.run(study, a.out, a.only, a.redo, a.progress, a.allow_mixed)
  except config_lib.ConfigError as e:
    for line in e.errors:
      print(f"error: {line}", file=sys.stderr)
    return 2
  paths = output.write(results, a.out)
  with open(paths[1]) as f:
    print(f.read())
  print("wrote " + ", ".join(paths))
  return 0


if __name__ == "__main__":
  sys.exit(main())
