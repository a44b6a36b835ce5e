"""The field's standard workloads (issue 19): ResNet-20 on CIFAR-shaped data with per-worker
BatchNorm statistics, a character-level transformer language model, bfloat16 compute; all
through ``train()`` and the command line on ``tfds.testing.mock_data`` (nothing downloads)."""

import json
import math
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from nbsgd_jax import config as config_lib
from nbsgd_jax import models as models_lib
from nbsgd_jax import train
from nbsgd_jax.core.axis import AXIS

from tests.helpers import ROOT, make_stepper, run_python, run_steps, small_cfg

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

CIFAR = os.path.join(ROOT, "experiments", "configs", "cifar10_resnet20.py")
LM = os.path.join(ROOT, "experiments", "configs", "lm_diloco.py")


def cifar_cfg(**overrides):
  """A CIFAR-shaped run small enough for a test: ResNet-8 (BatchNorm), 4 workers."""
  c = config_lib.default_config()
  c.dataset = "tfds:cifar10"
  c.model = "resnet"
  c.resnet_depth = 8
  c.num_workers = 4
  c.batch_size = 4
  c.num_steps = 2
  c.eval_every = 2
  c.eval_train_examples = 16
  c.eval_worker_accuracy = False
  c.learning_rate = 0.05
  c.progress = False
  return config_lib.override(c, overrides)


def lm_cfg(**overrides):
  c = config_lib.default_config()
  c.dataset = "tfds:tiny_shakespeare"
  c.model = "transformer"
  c.lm.context = 8
  c.lm.num_layers = 1
  c.lm.d_model = 16
  c.lm.num_heads = 2
  c.num_workers = 2
  c.batch_size = 4
  c.num_steps = 4
  c.eval_every = 4
  c.eval_train_examples = 8
  c.optimizer = "adamw"
  c.learning_rate = 1e-3
  c.progress = False
  return config_lib.override(c, overrides)


# ----------------------------------------------------------------------------- ResNet-20


def test_resnet20_has_the_papers_parameter_count():
  # He et al. 2016, Sec. 4.2: 3x3 conv 16; 3 stages x 3 blocks x 2 convs of 3x3 (16, 32, 64;
  # the first conv of stages 2 and 3 widens); option A shortcuts (no parameters); one BN
  # (scale, bias) after every conv; dense 64 -> classes. Counted by hand, not by the model.
  convs = (3 * 9 * 16 + 6 * 9 * 16 * 16 + 9 * 16 * 32 + 5 * 9 * 32 * 32
           + 9 * 32 * 64 + 5 * 9 * 64 * 64)
  norms = 2 * (16 + 6 * 16 + 6 * 32 + 6 * 64)
  for classes in (10, 100):
    expected = convs + norms + 64 * classes + classes
    for norm in ("batch", "group"):
      model = models_lib.make_model("resnet", classes, norm=norm, depth=20)
      params, state = jax.eval_shape(lambda: models_lib.init(model, jax.random.key(0),
                                                              jnp.zeros((1, 32, 32, 3))))
      assert models_lib.num_params(params) == expected
      assert bool(state) == (norm == "batch")  # GroupNorm carries no model state
  assert convs + norms + 650 == 269_722  # "0.27 M"


class Crash(Exception):
  """A simulated crash of a run (raised by a hook)."""


def _stats(model_state, worker=None):
  leaves = jax.tree.leaves(model_state)
  return [np.asarray(x if worker is None else x[worker]) for x in leaves]


@pytest.mark.parametrize("backend", ["simulate", pytest.param("mesh", marks=pytest.mark.long)])
def test_batchnorm_statistics_are_each_workers_own(backend):
  # Reference: flax's BatchNorm applied to each worker's batch on its own (no vmap, no
  # shard_map): the running statistics after one step are those of that worker's batch.
  cfg = cifar_cfg(backend=backend, algorithm="dpsgd")
  with tfds.testing.mock_data(num_examples=32):
    stepper = make_stepper(cfg)
    initial = jax.device_get(stepper.state)  # every worker's model: the same init
    stepper.steps(1)
  s, state = stepper.setups[0], jax.device_get(stepper.state)
  params0, ms0 = jax.tree.map(lambda x: x[0], (initial.params, initial.model_state))
  # jitted, so that the reference compiles as two programs, not op by op
  batches = jax.jit(jax.vmap(lambda d: s.task.batch(d, jnp.int32(0), AXIS),
                             axis_name=AXIS))(jax.device_get(s.worker_data))
  stats = jax.jit(lambda x: s.model.apply({**params0, **ms0}, x, train=True,
                                          mutable=["batch_stats"])[1])
  for i in range(cfg.num_workers):
    ref = stats(batches[0][i])
    for got, want in zip(_stats(state.model_state, i), _stats(ref)):
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
  first = _stats(state.model_state)[0]
  assert not np.allclose(first[0], first[1])  # the workers' statistics differ


@pytest.mark.long  # CI's 15 minutes: BatchNorm's per-worker statistics stay in the slow tier
@pytest.mark.parametrize("with_mesh", [False, True])
def test_batchnorm_simulate_equals_mesh_and_survives_a_resume(tmp_path, with_mesh):
  """ResNet's BatchNorm statistics through local SGD's periodic programs: a run crashed at
  step 3 resumes from step 2's checkpoint to exactly the uninterrupted run's parameters and
  statistics, which moved; with ``with_mesh`` (the long tier) the mesh backend's equal the
  simulated ones."""
  def final_state(cfg, workdir, crash_at=None):
    seen = {}

    def hook(step, state, setup):
      del setup
      seen[step] = jax.device_get((state.params, state.model_state))
      if step == crash_at:
        raise Crash()

    if crash_at is None:
      train.train(cfg, workdir, hooks=(hook,))
    else:
      with pytest.raises(Crash):
        train.train(cfg, workdir, hooks=(hook,))
    return seen

  with tfds.testing.mock_data(num_examples=32):
    base = dict(num_steps=4, eval_every=2, checkpoint_every=2, algorithm="local_sgd")
    sim = final_state(cifar_cfg(**base), str(tmp_path / "sim"))
    if with_mesh:
      mesh = final_state(cifar_cfg(backend="mesh", **base), str(tmp_path / "mesh"))
    final_state(cifar_cfg(**base), str(tmp_path / "crash"), crash_at=3)
    resumed = final_state(cifar_cfg(**base), str(tmp_path / "crash"))
  assert min(resumed) == 2  # it resumed from the checkpoint of step 2
  chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  chex_equal(resumed[4], sim[4])  # exactly
  if with_mesh:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 mesh[4], sim[4])
  assert any(not np.array_equal(a, b) for a, b in zip(_stats(sim[4][1]), _stats(sim[2][1])))


@pytest.mark.long  # 12-17 s; BatchNorm's statistics and resume: the two tests above (slow)
def test_nonblocking_resnet_with_batchnorm_learns():
  """Non-blocking SGD's counted mini-batches carry ResNet's BatchNorm state (a slow worker
  counts fewer): the run must learn, not only run. 12 steps on 32 mock examples (8 per
  worker, 2 steps an epoch): the mean loss of the last 4 steps is below 0.85 of the first
  4's (measured 1.27 against 1.79; a run whose counted gradients or statistics were dropped
  stays near the first). The MLP run of every algorithm this test once made repeated
  test_composition::test_composition_cell (every algorithm, a finite loss and the bytes at
  every step); the periodic programs with model state are test_batchnorm_simulate_equals_
  mesh_and_survives_a_resume's."""
  cfg = cifar_cfg(algorithm="allreduce", **{"nonblocking.enabled": True,
                                            "nonblocking.num_minibatches": 2,
                                            "cluster.scenario": "one_slow"})
  with tfds.testing.mock_data(num_examples=32):
    _, _, losses = run_steps(cfg, 12)
  per_step = losses.reshape(12, -1).mean(axis=1)
  assert np.all(np.isfinite(per_step))
  assert per_step[-4:].mean() < 0.85 * per_step[:4].mean(), per_step


@pytest.mark.long  # 10 s; bfloat16 messages: test_allreduce_with_bf16_messages_... (slow)
def test_bfloat16_compute_keeps_float32_parameters():
  with tfds.testing.mock_data(num_examples=32):
    s, state, losses = run_steps(cifar_cfg(model="cnn", compute_dtype="bfloat16"), 2)
    _, state32, losses32 = run_steps(cifar_cfg(model="cnn"), 2)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
  assert np.all(np.isfinite(losses))
  np.testing.assert_allclose(losses, losses32, rtol=0.05)  # bf16 rounding, same run
  assert not np.array_equal(losses, losses32)  # it did compute in bfloat16


# ----------------------------------------------------------------------------- language model


def test_text_batches_are_windows_of_the_workers_shard():
  tokens = jnp.arange(100, dtype=jnp.int32).reshape(2, 50) * 3
  x, y = jax.vmap(lambda t: train.text_batch(t, 0, 5, 7, jnp.int32(3), AXIS),
                  axis_name=AXIS)(tokens)
  assert x.shape == y.shape == (2, 5, 7)
  for i in range(2):
    row = np.asarray(tokens[i])
    for b in range(5):
      start = int(np.flatnonzero(row == x[i, b, 0])[0])
      np.testing.assert_array_equal(x[i, b], row[start:start + 7])
      np.testing.assert_array_equal(y[i, b], row[start + 1:start + 8])


@pytest.mark.parametrize("algorithm", [
    "diloco", pytest.param("sparta", marks=pytest.mark.slow),
    *[pytest.param(a, marks=pytest.mark.slow) for a in ("demo", "sparseloco", "noloco")],
    pytest.param("muloco", marks=pytest.mark.long),  # Muon's wiring: test_muloco (fast)
    *[pytest.param(a, marks=pytest.mark.long) for a in ("streaming_diloco", "local_sgd")]])
def test_language_model_learns(algorithm, tmp_path):
  """The character transformer learns through each periodic recipe, SPARTA, DeMo, SparseLoCo, NoLoCo and MuLoCo (a
  user's LM run that only runs is no run): 16 steps at lr 1e-2 on mock tiny_shakespeare, the training loss at
  the last evaluation below 0.8 of the first's (diloco measured 2.85 -> 1.90, vocabulary 12,
  ln 12 = 2.48) and the test loss below ln(vocabulary), the loss of a uniform guess."""
  extra = ({"diloco.local_steps": 2} if "diloco" in algorithm else {"sparta.density": 0.05}
           if algorithm == "sparta" else {"momentum": 0.0, "learning_rate": 3e-3}
           if algorithm == "demo" else {"sparseloco.local_steps": 2}
           if algorithm == "sparseloco" else {"noloco.local_steps": 2}
           if algorithm == "noloco" else {"local_sgd.local_steps": 2})
  if algorithm == "muloco":  # DiLoCo with Muon as the inner optimizer
    algorithm, extra = "diloco", {"diloco.local_steps": 2, "optimizer": "muon"}
  with tfds.testing.mock_data(num_examples=3):
    summary = train.train(lm_cfg(algorithm=algorithm, num_steps=16, eval_every=8,
                                 **{"learning_rate": 1e-2, **extra}), str(tmp_path))
  recs = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in recs] == [0, 8, 16]
  assert recs[-1]["train_loss"] < 0.8 * recs[0]["train_loss"], recs
  assert summary["test_loss"] < math.log(summary["vocab_size"]), summary


@pytest.mark.long  # CI's 15 minutes: their reference tests are fast; docs/compare_cnn trains them
@pytest.mark.parametrize("algorithm", ["epidemic", "teleportation"])
def test_the_sampled_decentralized_line_trains_the_cnn(algorithm):
  """Epidemic Learning and Teleportation train the main job's CNN on mnist10k, 8 workers:
  40 steps at lr 0.05 take it from chance to over 70 % test accuracy (measured: EL-Local
  s = 3, H = 2: 84.3 %; Teleportation, k = 4 active, H = 2: 74.2 %; the study with 16
  workers: experiments/compare_algorithms.py)."""
  summary = train.train(small_cfg(**{
      "model": "cnn", "algorithm": algorithm, "num_workers": 8, "batch_size": 16,
      "learning_rate": 0.05, "momentum": 0.9, "num_steps": 40, "eval_every": 40,
      "eval_worker_accuracy": False, "eval_train_examples": 256, "epidemic.rounds": 2,
      "epidemic.graph_degree": 3, "teleportation.local_steps": 2,
      "teleportation.sample_size": 4}))
  assert summary["test_accuracy"] > 0.7, summary


# ----------------------------------------------------------------------------- command line


def _cli_under_mock_data(tmp_path, config, num_examples, *overrides):
  """The command line (``nbsgd_jax.main``'s flag parsing and main) in a fresh process whose
  tfds is ``tfds.testing.mock_data``."""
  script = textwrap.dedent(f"""
      import sys
      import tensorflow_datasets as tfds
      from absl import app
      from nbsgd_jax import main
      sys.argv = sys.argv + {list(overrides)!r}
      with tfds.testing.mock_data(num_examples={num_examples}):
        app.run(main.main, flags_parser=main._parse_flags)
  """)
  args = [f"--config={config}", f"--workdir={tmp_path / 'run'}", "--config.progress=False"]
  return run_python(["-c", script, *args], timeout=600)


@pytest.mark.long  # the command line's own test: tests/user/test_cli.py (the main job)
def test_cifar_resnet20_config_trains_through_the_cli(tmp_path):
  """The command a user copies from the config file trains the paper's ResNet-20 with
  D-PSGD: the run's model has the 269,722 parameters counted by hand in test_resnet20_has_
  the_papers_parameter_count (He et al. 2016: "0.27 M"), and each worker sent, in 2 steps on
  a ring of 2 (one neighbour), 2 x 269,722 float32 parameters: 2,157,776 bytes."""
  r = _cli_under_mock_data(
      tmp_path, CIFAR, 32, "--config.num_workers=2", "--config.batch_size=4",
      "--config.num_steps=2", "--config.eval_every=2", "--config.warmup_steps=1",
      "--config.checkpoint_every=0", "--config.eval_train_examples=16")
  assert r.returncode == 0, r.stderr[-3000:]
  with open(tmp_path / "run" / "summary.json") as f:
    summary = json.load(f)
  assert (summary["steps"], summary["model"], summary["algorithm"]) == (2, "resnet", "dpsgd")
  assert summary["model_params"] == 269_722
  assert summary["bytes_sent"] == 2 * 269_722 * 4 == 2_157_776


@pytest.mark.long  # the LM's parameter count: test_nanogpt; its outer rounds: test_local_sgd
def test_lm_config_trains_through_the_cli(tmp_path):
  """The LM config's command with its overrides builds the model asked for and runs DiLoCo's
  outer rounds: the transformer of d_model 16, one layer, context 8 over tiny_shakespeare's 66
  characters has, counted by hand, token embedding 66 x 16 = 1,056, positions 8 x 16 = 128,
  two layer norms 2 x 32, attention q, k, v 16 x 48 + 48 and output 16 x 16 + 16, MLP
  16 x 64 + 64 and 64 x 16 + 16, a final norm 32 and the head 16 x 66 + 66: 5,618 parameters;
  4 steps of 2 inner steps are 2 outer all-reduces of 2 (n - 1) / n = 1 model each (n = 2):
  2 x 5,618 x 4 = 44,944 bytes."""
  r = _cli_under_mock_data(
      tmp_path, LM, 3, "--config.num_workers=2", "--config.batch_size=2",
      "--config.num_steps=4", "--config.eval_every=2", "--config.warmup_steps=1",
      "--config.lm.context=8", "--config.lm.num_layers=1", "--config.lm.d_model=16",
      "--config.diloco.local_steps=2", "--config.eval_train_examples=8")
  assert r.returncode == 0, r.stderr[-3000:]
  with open(tmp_path / "run" / "summary.json") as f:
    summary = json.load(f)
  assert (summary["steps"], summary["vocab_size"], summary["rounds"]) == (4, 66, 2)
  assert summary["model_params"] == 1056 + 128 + 2 * 32 + 16 * 48 + 48 + 16 * 16 + 16 + (
      16 * 64 + 64) + (64 * 16 + 16) + 32 + 16 * 66 + 66 == 5618
  assert summary["bytes_sent"] == 2 * 5618 * 4 == 44_944


@pytest.mark.parametrize("config,command", [(CIFAR, "tfds build cifar10"),
                                            (LM, "tfds build tiny_shakespeare")])
def test_unprepared_data_names_the_tfds_command(tmp_path, config, command):
  r = run_python(["-m", "nbsgd_jax.main", f"--config={config}", f"--workdir={tmp_path / 'run'}",
                  f"--config.data_dir={tmp_path}", f"--config.dataset=tfds:{command.split()[-1]}"])
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and command in errors[0], r.stderr


# ----------------------------------------------------------------------------- bfloat16 messages


def test_bf16_codec_rounds_like_ml_dtypes_and_counts_two_bytes():
  import ml_dtypes
  from nbsgd_jax import codecs
  x = np.random.default_rng(0).standard_normal(1001).astype(np.float32) * 10.0 ** np.arange(
      -3, 4).repeat(143)
  out, nbytes = codecs.make_codec("bf16").compress(jnp.asarray(x))
  want = x.astype(ml_dtypes.bfloat16).astype(np.float32)  # round to nearest even
  np.testing.assert_array_equal(np.asarray(out), want)
  assert out.dtype == jnp.float32 and float(nbytes) == 2 * 1001
  assert np.max(np.abs(want - x) / np.abs(x)) <= 2.0 ** -8


def test_allreduce_with_bf16_messages_sends_half_the_float32_bytes():
  cfg = small_cfg(algorithm="allreduce", num_steps=3, eval_every=3,
                  **{"compression.name": "bf16"})
  summary = train.train(cfg)
  d, n = summary["model_params"], cfg.num_workers
  assert summary["bytes_sent"] == 3 * (n - 1) * 2 * d  # all-gather of 2-byte entries
  assert math.isfinite(summary["train_loss"])
