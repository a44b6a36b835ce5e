"""The command line as a user runs it: bad input stops early with one clear line."""

import json
import os

import pytest

from tests.helpers import run_main


@pytest.mark.slow
@pytest.mark.parametrize("override,needle", [  # the other keys' messages: test_validation
    ("--config.algorithm=sgdx", "config.algorithm='sgdx' is not allowed: use one of"),
    ("--config.batch_size=5000", "config.batch_size=5000 is not allowed: the smallest worker "
                                 "shard has 1000 examples"),
])
def test_bad_input_one_line_no_traceback(tmp_path, override, needle):
  r = run_main(tmp_path, override)
  assert r.returncode == 2, r.stderr
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and needle in errors[0], r.stderr
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_main_job_smoke(tmp_path):
  r = run_main(tmp_path, "--config.num_steps=4", "--config.eval_every=2",
               "--config.eval_train_examples=100")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "| test_accuracy |" in r.stdout
  lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["step"] for l in lines] == [0, 2, 4]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["algorithm"] == "dpsgd" and summary["num_workers"] == 8


@pytest.mark.parametrize("dataset,lr", [  # the fast tier's command-line run: least squares
    ("least_squares", 0.1), pytest.param("logistic", 2.0, marks=pytest.mark.slow)])
def test_synthetic_problem_through_the_cli(tmp_path, dataset, lr):
  """A synthetic PL problem is a task of the same loop: ``gap = F(x_bar) - F*`` falls, and
  equals the problem's objective at the averaged model minus its F* (numpy float64)."""
  r = run_main(tmp_path, f"--config.dataset={dataset}", "--config.algorithm=local_sgd",
               "--config.num_workers=4", "--config.batch_size=8", "--config.num_steps=60",
               "--config.eval_every=30", "--config.momentum=0.0", f"--config.learning_rate={lr}",
               "--config.model=logreg", "--config.checkpoint_every=30")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "| gap |" in r.stdout and "has no effect: config.dataset=" in r.stderr  # model
  lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [0, 30, 60]
  assert lines[-1]["gap"] < 0.5 * lines[0]["gap"] and lines[-1]["gap"] > 0
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["gap"] == pytest.approx(summary["train_loss"] - summary["f_star"], rel=1e-9)
  assert summary["rounds"] == 15  # tau = 4


@pytest.mark.slow
def test_main_job_on_mesh_backend(tmp_path):
  """The CLI on 8 host devices (conftest's XLA_FLAGS reaches the subprocess): steps are
  dispatched asynchronously back to back and must not deadlock XLA:CPU's collectives."""
  assert "device_count=8" in os.environ.get("XLA_FLAGS", "")
  r = run_main(tmp_path, "--config.backend=mesh", "--config.num_steps=12",
               "--config.eval_every=4", "--config.eval_train_examples=100",
               "--config.model=mlp", "--config.mlp_hidden=(64,)")  # MLP: compiles faster
  assert r.returncode == 0, r.stderr[-3000:]
  lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [0, 4, 8, 12]
  assert lines[-1]["train_loss"] < lines[0]["train_loss"]


@pytest.mark.slow
def test_divergence_exits_3_without_traceback(tmp_path):
  """A learning rate far too large: the loss overflows within a few steps; main stops with one
  ``error:`` line (TrainingDiverged) and exit status 3, keeping the evaluations made so far."""
  r = run_main(tmp_path, "--config.model=mlp", "--config.mlp_hidden=(32,)",
               "--config.num_workers=2", "--config.learning_rate=1e6",
               "--config.num_steps=20", "--config.eval_every=2",
               "--config.eval_train_examples=100")
  assert r.returncode == 3, r.stderr[-3000:]
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "diverged" in errors[0] and "non-finite" in errors[0], r.stderr
  steps = [json.loads(l)["step"] for l in
           (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert steps[0] == 0 and steps[-1] < 20
  assert not (tmp_path / "run" / "summary.json").exists()
