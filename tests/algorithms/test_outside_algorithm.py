"""An algorithm added from outside the package (``examples/easgd.py``: EASGD, Zhang et al.
2015) with its own config section: against a numpy transcription of the paper's update, and
through the command line with its own keys (``--config.imports``)."""

import json

import jax
import numpy as np
import pytest

from nbsgd_jax import config as config_lib

from tests.helpers import make_stepper, registered, run_main

QUICKSTART = "experiments/configs/quickstart.py"


def _easgd_reference(x0, features, targets, lr, beta, tau, steps):
  """Synchronous EASGD (Zhang et al. 2015, eqs. (5)-(6); the elastic step every tau steps,
  Algorithm 1), float64, on least squares with exact local gradients
  ``A_i^T (A_i x_i - b_i) / m``: ``x_i <- x_i - (beta / n)(x_i - c)``,
  ``c <- c + beta (mean_i x_i - c)``, ``c_0 = x_0``."""
  a, b = np.asarray(features, np.float64), np.asarray(targets, np.float64)
  x = np.asarray(x0, np.float64).copy()
  n, m = a.shape[:2]
  c = x[0].copy()
  for t in range(steps):
    resid = np.einsum("nmd,nd->nm", a, x) - b
    x = x - lr * np.einsum("nmd,nm->nd", a, resid) / m
    if (t + 1) % tau == 0:
      mean = x.mean(axis=0)
      x, c = x - beta / n * (x - c), c + beta * (mean - c)
  return x


@pytest.mark.parametrize("beta,tau", [(0.6, 2), (0.9, 3)])
def test_easgd_from_outside_equals_the_paper_s_update(beta, tau):
  with registered("examples.easgd"):
    cfg = config_lib.override(config_lib.default_config(), {
        "algorithm": "easgd", "dataset": "least_squares", "problem.shards": 4,
        "problem.examples_per_worker": 16, "problem.dim": 5, "problem.full_batch": True,
        "problem.l2": 0.0, "problem.heterogeneity": 1.0, "num_workers": 4, "batch_size": 16,
        "learning_rate": 0.1, "momentum": 0.0, "weight_decay": 0.0,
        "lr_schedule": "constant", "easgd.beta": beta, "easgd.local_steps": tau, "num_steps": 6,
        "eval_every": 6, "progress": False})
    stepper = make_stepper(cfg)
    x0 = np.asarray(jax.device_get(stepper.state.params)["w"])
    features, targets = jax.device_get(stepper.setups[0].worker_data)
    stepper.steps(6)
    got = np.asarray(jax.device_get(stepper.state.params)["w"])
  want = _easgd_reference(x0, features, targets, 0.1, beta, tau, 6)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  assert not np.allclose(want[0], want[1])  # the workers differ: not an average


@pytest.mark.slow
def test_easgd_trains_from_the_command_line_with_its_own_keys(tmp_path):
  """``--config.imports`` is imported before the config file loads, so the section's keys
  exist on the command line; a bad value is one line naming the key, exit status 2."""
  args = ["--config.imports=examples.easgd", "--config.algorithm=easgd"]
  r = run_main(tmp_path, *args, "--config.easgd.beta=0.8", "--config.easgd.local_steps=5",
               "--config.num_steps=20", "--config.eval_every=10",
               "--config.eval_train_examples=100", config=QUICKSTART)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["algorithm"] == "easgd" and summary["rounds"] == 4  # 20 steps / tau 5
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["easgd"] == {"beta": 0.8, "local_steps": 5}
  assert summary["test_accuracy"] > 0.5  # chance 0.1
  bad = run_main(tmp_path / "bad", *args, "--config.easgd.beta=2.0", config=QUICKSTART)
  assert bad.returncode == 2
  assert [l for l in bad.stderr.splitlines() if l.startswith("error: ")] == [
      "error: config.easgd.beta=2.0 is not allowed: it must be a number > 0 and <= 1"]
