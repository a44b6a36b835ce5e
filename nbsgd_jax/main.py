"""Command line: ``python -m nbsgd_jax.main --config=experiments/configs/mnist.py --workdir=DIR``.

Any key can be overridden with ``--config.KEY=VALUE`` (``ml_collections.config_flags``), e.g.
``--config.algorithm=allreduce --config.num_workers=16``. A bad configuration stops before
training with one line per problem and exit status 2.

Exit status: 0 the run finished; 2 bad configuration or command line (an unknown
``--config.KEY``, a value of the wrong type, an unreadable config file, a value that
``nbsgd_jax.config.validate`` rejects), one ``error:`` line per problem; 3 training diverged
(a non-finite loss or model, ``nbsgd_jax.train.TrainingDiverged``), one ``error:`` line.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an experiment config file (a get_config() function).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for config.json, metrics.jsonl, "
                               "summary.json.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "backend=multihost: host:port of process 0 (default: "
    "$JAX_COORDINATOR_ADDRESS, else JAX's cluster detection).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "backend=multihost: number of processes (default: "
    "$JAX_NUM_PROCESSES).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "backend=multihost: this process's id in [0, num_processes) (default: "
    "$JAX_PROCESS_ID).")


# the summary's times named in the table (docs/guide.md, "Outputs": the three times)
TIME_LABELS = {
    "sim_time": "sim_time (s, simulated cluster)",
    "wall_time": "wall_time (s, training steps, compilation included)",
    "run_seconds": "run_seconds (s, all of train(): data, set-up, steps, evaluations)",
}
TIMES_NOTE = ("times: the progress bar times the step loop (steps, the evaluations after "
              "step 0, checkpoints); the whole command adds Python's start and imports to "
              "run_seconds (docs/guide.md, Outputs)")


def _summary_table(summary: dict) -> str:
  keys = ["algorithm", "num_workers", "backend", "model", "dataset", "step", "sim_time",
          "wall_time", "run_seconds",
          "train_loss", "gap", "f_star", "test_loss", "test_accuracy", "worker_test_accuracy",
          "consensus_distance", "bytes_sent", "rounds", "samples_per_second"]
  rows = ["| metric | value |", "|---|---|"]
  for k in keys:
    v = summary.get(k)
    if v is None:
      continue
    if isinstance(v, float):
      v = f"{v:.4e}" if k in ("bytes_sent", "gap") else f"{v:.4g}"
    rows.append(f"| {TIME_LABELS.get(k, k)} | {v} |")
  return "\n".join(rows)




def _report_sweep(summaries: list) -> None:
  """One line per run of a sweep, then the command of its report (process 0)."""
  import jax
  if jax.process_index():
    return
  rows = ["| run | steps | train_loss | test_accuracy | sim_time | stopped |",
          "|---|---|---|---|---|---|"]
  fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
  for s in summaries:
    rows.append("| " + " | ".join(fmt(s.get(k)) for k in (
        "run", "steps", "train_loss", "test_accuracy", "sim_time", "stopped")) + " |")
  print("\n".join(rows))
  print(f"wrote {_WORKDIR.value}/sweep.json and one directory per run")
  print("mean +- std over seeds, per cell of the grid: python -m nbsgd_jax.report "
        f"{shlex.quote(_WORKDIR.value)}")


def _flag_errors(message: str) -> list[str]:
  """absl's ``flag --config.KEY=VALUE: why`` (a value of the wrong type) in the style of
  ``nbsgd_jax.config.validate``; other flag errors as they are."""
  m = re.match(r"flag --config\.([\w.]+)=(.*?): ", message, re.S)
  if not m:
    return [" ".join(message.split())]
  key, value = m.groups()
  try:
    from nbsgd_jax import config as config_lib
    allowed = config_lib.TYPE_NAMES.get(type(flags.FLAGS["config"].value[key]))
  except Exception:  # pylint: disable=broad-except
    allowed = None
  why = f"it must be {allowed}" if allowed else " ".join(message[m.end():].split())
  return [f"config.{key}={value!r} is not allowed: {why}"]


def _config_file_errors(e: Exception, path: str, argv: list[str] = ()) -> list[str]:
  """The line of an exception raised while the config file ``path`` loads: its type, its
  message and the file's line that raised it (a missing file: the OS's reason), or the
  unknown ``--config.KEY`` that ml_collections raised on."""
  here = [f for f in traceback.extract_tb(e.__traceback__)
          if path and os.path.abspath(f.filename) == os.path.abspath(path)]
  lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [""]
  if isinstance(e, (AttributeError, KeyError)) and not here:  # an unknown --config.KEY
    return _unknown_keys(list(argv) or sys.argv) or [" ".join(f"--config: {e}".split())]
  if isinstance(e, OSError) and not here:
    return [f"--config={path} could not be loaded: {lines[-1]}"]
  where = f" at line {here[-1].lineno} ({here[-1].line})" if here else ""
  return [f"--config={path} could not be loaded: {type(e).__name__}: {lines[-1]}{where}"]


def _callback_error(e: RuntimeError):
  """The Python exception line inside XLA's error for a host callback that raised (a run-time
  check, e.g. :func:`nbsgd_jax.codecs.sparse.check_message`'s), or None for anything else."""
  if type(e).__name__ != "JaxRuntimeError" or "callback" not in str(e):
    return None
  found = [l.strip() for l in str(e).splitlines()
           if re.match(r"^\s*[A-Za-z_][\w.]*(Error|Exception): ", l)]
  return found[-1] if found else None


def _unknown_keys(argv: list[str]) -> list[str]:
  from nbsgd_jax import config as config_lib
  keys = [m.group(1) for m in (re.match(r"--?(?:no)?config\.([^=]+)", arg) for arg in argv[1:])
          if m]
  return config_lib.unknown_key_errors(keys)


def _import_early(argv: list[str]) -> None:
  """Imports the modules of ``--config.imports=M1,M2`` before the config file loads, so that
  what they register comes with its config keys: an algorithm registered with its own
  section (``recipes.register(..., sections=...)``) has ``--config.SECTION.KEY``. Each entry
  is a module name on ``sys.path`` (``examples.easgd``: ``python -m`` puts the current
  directory there) or a ``.py`` file's path (``path/to/my_algo.py``, relative to the current
  directory), :func:`nbsgd_jax.config.import_modules`. One that cannot be imported: one
  ``error:`` line naming the key and the value, and exit status 2."""
  values = [a.split("=", 1)[1] for a in argv[1:] if re.match(r"--config\.imports=", a)]
  if not values:
    return
  import ml_collections
  from nbsgd_jax import config as config_lib
  try:
    config_lib.import_modules(ml_collections.ConfigDict({"imports": values[-1]}))
  except config_lib.ConfigError as e:
    for line in e.errors:
      print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad command line as ``error:`` lines and exit status 2
  (absl alone exits with 1 on a value of the wrong type; ml_collections raises, with a
  traceback, on an unknown ``--config.KEY`` or a config file that cannot be read).
  ``--config.imports`` are imported first (:func:`_import_early`)."""
  _import_early(argv)
  try:
    rest = flags.FLAGS(argv)
    cfg = flags.FLAGS["config"].value
    if cfg is not None:
      cfg.get("algorithm")  # a config file that failed to load raises here
    return rest
  except flags.Error as e:  # a value of the wrong type, an unknown --flag
    errors = _flag_errors(str(e))
  except Exception as e:  # pylint: disable=broad-except  (an unknown --config.KEY; the file)
    path = next((a.split("=", 1)[1] for a in argv if re.match(r"--?config=", a)), "")
    errors = _config_file_errors(e, path, argv)
  for line in errors:
    print(f"error: {line}", file=sys.stderr)
  sys.exit(2)


def main(argv):
  del argv
  from nbsgd_jax import config as config_lib
  from nbsgd_jax import train as train_lib

  if _CONFIG.value is None:
    print("error: --config is required, e.g. --config=experiments/configs/mnist.py",
          file=sys.stderr)
    sys.exit(2)
  if not _WORKDIR.value:
    print("error: --workdir is required (the run's output directory)", file=sys.stderr)
    sys.exit(2)
  if _CONFIG.value.get("backend") == "multihost":  # join before JAX starts its backend
    from nbsgd_jax.core import multihost
    try:
      multihost.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
  if not flags.FLAGS["verbosity"].present:  # orbax's and JAX's INFO lines: --verbosity=0 shows them
    logging.set_verbosity(logging.WARNING)
  try:
    if _CONFIG.value.get("sweep"):
      _report_sweep(train_lib.sweep(_CONFIG.value, _WORKDIR.value))
      return
    summary = train_lib.train(_CONFIG.value, _WORKDIR.value)
  except config_lib.ConfigError as e:
    for line in e.errors:
      print(f"error: {line}", file=sys.stderr)
    sys.exit(2)
  except train_lib.TrainingDiverged as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(3)
  except RuntimeError as e:  # a host callback's check (a compressor's indices) inside XLA
    line = _callback_error(e)
    if line is None:
      raise
    print(f"error: the run stopped: {line}", file=sys.stderr)
    sys.exit(3)
  except KeyboardInterrupt:  # the records are whole (written line by line), files closed
    again = ("resumes from the last checkpoint" if _CONFIG.value.checkpoint_every else
             "starts it again (config.checkpoint_every=0: no checkpoints)")
    print(f"error: interrupted; {_WORKDIR.value} holds the records so far; the same command "
          f"{again}", file=sys.stderr)
    sys.exit(130)
  import jax
  if jax.process_index() == 0:  # multihost: process 0 reports (and wrote the files)
    print(_summary_table(summary))
    print(TIMES_NOTE)
    if not summary.get("finished_before"):  # a finished run was only read back
      print(f"wrote {_WORKDIR.value}/config.json, metrics.jsonl, summary.json")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
