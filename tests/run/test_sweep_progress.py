"""A sweep's progress bar counts runs (issue 70, item 6d): ``run 3 of 8`` when the runs go one
after another (a CPU's way), ``runs 5-8 of 8 (one program)`` for a stacked group, as the guide
speaks of the runs of a sweep, not ``group 1/4 (1 runs)``."""

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train
from nbsgd_jax.run import sweep as sweep_lib


@pytest.mark.parametrize("before,size,total,want", [
    (0, 1, 8, "dpsgd: run 1 of 8"),
    (2, 1, 8, "dpsgd: run 3 of 8"),
    (0, 4, 8, "dpsgd: runs 1-4 of 8 (one program)"),
    (4, 4, 8, "dpsgd: runs 5-8 of 8 (one program)"),
    (0, 1, 1, "dpsgd: run 1 of 1"),
])
def test_the_progress_text_counts_runs(before, size, total, want):
  assert sweep_lib.progress_text("dpsgd", before, size, total) == want


def test_a_sweep_in_turn_shows_each_run_of_the_grid(capsys):
  """Three seeds of a least-squares run, in turn: the bar names runs 1, 2 and 3 of 3."""
  cfg = config_lib.override(config_lib.default_config(), {
      "dataset": "least_squares", "algorithm": "allreduce", "num_workers": 2, "batch_size": 8,
      "num_steps": 2, "eval_every": 2, "problem.examples_per_worker": 16, "problem.dim": 4,
      "sweep": "seed=0:3", "sweep_runs": "in_turn", "progress": True})
  out = train.sweep(cfg)
  assert len(out) == 3
  err = capsys.readouterr().err
  assert [f"run {k} of 3" in err for k in (1, 2, 3)] == [True] * 3, err[-2000:]
  assert "group" not in err and "1 runs" not in err
