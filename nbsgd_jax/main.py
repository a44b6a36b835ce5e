"""Command line: ``python -m nbsgd_jax.main --config=experiments/configs/mnist.py --workdir=DIR``.

Any key can be overridden with ``--config.KEY=VALUE`` (``ml_collections.config_flags``), e.g.
``--config.algorithm=allreduce --config.num_workers=16``. A bad configuration stops before
training with one line per problem and exit status 2.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an experiment config file (a get_config() function).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for config.json, metrics.jsonl, "
                               "summary.json.")


def _summary_table(summary: dict) -> str:
  keys = ["algorithm", "num_workers", "backend", "model", "dataset", "step", "sim_time",
          "wall_time",
          "train_loss", "test_loss", "test_accuracy", "worker_test_accuracy",
          "consensus_distance", "bytes_sent", "rounds", "samples_per_second"]
  rows = ["| metric | value |", "|---|---|"]
  for k in keys:
    v = summary.get(k)
    if v is None:
      continue
    if isinstance(v, float):
      v = f"{v:.4g}" if k != "bytes_sent" else f"{v:.4e}"
    rows.append(f"| {k} | {v} |")
  return "\n".join(rows)


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
  try:
    summary = train_lib.train(_CONFIG.value, _WORKDIR.value)
  except config_lib.ConfigError as e:
    for line in e.errors:
      print(f"error: {line}", file=sys.stderr)
    sys.exit(2)
  print(_summary_table(summary))
  print(f"wrote {_WORKDIR.value}/config.json, metrics.jsonl, summary.json")


if __name__ == "__main__":
  app.run(main)
