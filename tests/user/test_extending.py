"""An algorithm written from outside the package with only the names of ``docs/extending.md``,
one that needs the step's learning rate (``ctx.learning_rate``) and the optimizer's own count
(``ctx.opt_step``): registered from a file (``config.imports=path/to/file.py``) and held to a
numpy transcription of its update, with warm-up, cosine decay and Non-blocking SGD's skipped
steps, in process and through the command line; and ``config.imports``' two spellings."""

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import recipes, train

from tests.helpers import ROOT, make_stepper

# The user's file: heavy-ball D-PSGD whose momentum buffer is kept in gradient units, so the
# step size enters as a divisor (u = update / eta_t), not as a plain multiplier.
ALGORITHM = '''
"""Heavy-ball D-PSGD with the momentum buffer in gradient units. Each worker, at its
optimizer's rate eta = ctx.learning_rate:

    d = the local optimizer's update (-eta (g + wd x): SGD without momentum)
    u <- beta u + d / eta           (eta = 0, a warm-up's first step: u and x unchanged)
    x <- sum_j W_ij (x_j + eta u_j)  (one gossip round)

A worker that finished no mini-batch (Non-blocking SGD) takes no step: u and its optimizer's
count are kept; it still gossips."""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from nbsgd_jax import recipes
from nbsgd_jax import transforms as T
from nbsgd_jax.core import checks


def defaults():
  s = ml_collections.ConfigDict()
  s.beta = 0.5                   # momentum of the buffer u, in [0, 1)
  return s


def check(cfg, errs):
  checks.number(cfg, errs, "eta_momentum.beta", 0, hi=1, hi_open=True)


class State(NamedTuple):
  opt: Any                       # the local optimizer's (its count is ctx.opt_step)
  u: Any                         # the momentum buffer, gradient units


def momentum(opt, beta):
  def init(params):
    return State(opt.init(params), jax.tree.map(jnp.zeros_like, params))

  def update(grads, state, params, ctx):
    d, inner, report = opt.update(grads, state.opt, params, ctx)
    eta = ctx.learning_rate
    on = eta > 0
    u = jax.tree.map(lambda u, d: jnp.where(on, beta * u + d / jnp.where(on, eta, 1.0), u),
                     state.u, d)
    seen = {"eta": eta, "opt_step": ctx.opt_step, "count": ctx.count}
    return jax.tree.map(lambda u: eta * u, u), State(inner, u), T.merge_reports(report, seen)

  return T.WorkerTransform(init, update, opt.communications)


SECTION = recipes.Section(defaults, check, "heavy-ball D-PSGD, buffer in gradient units",
                          hparams=("beta",))


@recipes.register("eta_momentum", gossips=True, no_compression=recipes.GOSSIP_REASON,
                  sections={"eta_momentum": SECTION})
def eta_momentum(b):
  g = b.gossip()
  local = b.injected(lambda beta: momentum(b.optimizer(), beta), "eta_momentum.beta")
  if b.weighted:  # mini-batches may be missing: no step at all where none was finished
    local = T.skip_when_idle(local, "local")

  def update(grads, state, params, ctx):
    step, state, report = local.update(grads, state, params, ctx)
    mixed, comm = g.mix(jax.tree.map(lambda x, s: x + s, params, step), ctx)
    return T.replace_params(params, mixed), state, T.merge_reports(report, comm)

  return recipes.Recipe(T.WorkerTransform(local.init, update, local.communications + (g,)),
                        decentralized=True, gossip=g, primary=g)
'''

N, M_EX, DIM, MB = 4, 8, 3, 2  # workers, examples per worker, features, mini-batches
LR, LR_MIN, WARMUP, STEPS, BETA, WD = 0.2, 0.02, 3, 12, 0.6, 0.05
SETTINGS = {
    "algorithm": "eta_momentum", "eta_momentum.beta": BETA, "topology": "ring",
    "dataset": "least_squares", "problem.examples_per_worker": M_EX, "problem.dim": DIM,
    "problem.full_batch": True, "problem.l2": 0.0, "problem.heterogeneity": 1.0,
    "num_workers": N, "batch_size": M_EX, "optimizer": "sgd", "momentum": 0.0,
    "weight_decay": WD, "learning_rate": LR, "lr_schedule": "cosine", "lr_min": LR_MIN,
    "warmup_steps": WARMUP, "num_steps": STEPS, "eval_every": 1, "progress": False,
    "nonblocking.enabled": True, "nonblocking.num_minibatches": MB,
    "cluster.delay": "bernoulli_exponential", "cluster.delay_prob": 0.25,
    "cluster.delay_mean": 0.05}  # a delayed worker finishes 0 of its 2 mini-batches


def test_the_algorithm_uses_only_names_documented_in_extending_md():
  """Every name the file takes from the package (``recipes.*``, ``T.*``, ``checks.*``, the
  Builder's ``b.*``, the context's ``ctx.*``, the gossip's ``g.mix``) is in the page."""
  with open(os.path.join(ROOT, "docs", "extending.md")) as f:
    page = f.read()
  used = set(re.findall(r"\b((?:recipes|T|checks|b|ctx|g)\.\w+)", ALGORITHM))
  assert {"ctx.learning_rate", "ctx.opt_step", "g.mix", "T.replace_params"} <= used
  assert sorted(u for u in used if u not in page) == []


def _write_algorithm(folder):
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / "my_eta_momentum.py"
  path.write_text(ALGORITHM)
  return path


def _forget(path):
  """Drop the module imported from ``path`` (named after its stem) from this process."""
  sys.modules.pop(os.path.splitext(os.path.basename(str(path)))[0], None)


def _rate(k):
  """The rate at the optimizer's k-th update, written out: linear warm-up from 0 over WARMUP
  updates, then cosine from LR to LR_MIN over the remaining STEPS - WARMUP."""
  if k < WARMUP:
    return LR * k / WARMUP
  span = STEPS - WARMUP
  cos = 0.5 * (1 + np.cos(np.pi * min(k - WARMUP, span) / span))
  return LR_MIN + (LR - LR_MIN) * cos


def _reference(features, targets, counts):
  """The method in float64, from zero models: per step ``[(eta [n], k [n], x [n, d])]``
  (eta and k before the step's update, x after it), ``counts [T, n]`` the mini-batches each
  worker finished (of MB contiguous ones of its M_EX examples)."""
  a, b = np.asarray(features, np.float64), np.asarray(targets, np.float64)
  w = np.zeros((N, N))  # the ring: 1/3 on i-1, i, i+1
  for i in range(N):
    w[i, [(i - 1) % N, i, (i + 1) % N]] = 1 / 3
  x, u, k = np.zeros((N, DIM)), np.zeros((N, DIM)), np.zeros(N, int)
  per, out = M_EX // MB, []
  for c in counts:
    etas, ks, half = np.array([_rate(ki) for ki in k]), k.copy(), x.copy()
    for i in range(N):
      if c[i] == 0:
        continue  # no step: u and k kept
      rows = slice(0, c[i] * per)  # the first c_i mini-batches
      ai, bi = a[i, rows].reshape(c[i], per, DIM), b[i, rows].reshape(c[i], per)
      g = np.mean([aj.T @ (aj @ x[i] - bj) / per for aj, bj in zip(ai, bi)], axis=0)
      if etas[i] > 0:
        u[i] = BETA * u[i] - (g + WD * x[i])  # d / eta = -(g + wd x)
        half[i] = x[i] + etas[i] * u[i]
      k[i] += 1
    x = w @ half
    out.append((etas, ks, x))
  return out


def _check_skips(counts):
  counts = np.asarray(counts)
  assert (counts == 0).any() and (counts == 0).sum() < counts.size // 2  # some skips
  assert (counts[:, 0] == 0).any()  # worker 0's too (the records show worker 0)


def test_a_method_that_divides_by_the_step_size_follows_the_optimizer(tmp_path):
  """In process: ``ctx.learning_rate`` / ``ctx.opt_step`` of every worker and step are the
  rate and count of the optimizer (warm-up, cosine, Non-blocking SGD's skips, which hold a
  worker's count back) and the models follow the numpy transcription."""
  path = _write_algorithm(tmp_path / "algo")
  try:
    with recipes.registrations():
      config_lib.import_modules(config_lib.override(config_lib.default_config(),
                                                    {"imports": str(path)}))
      cfg = config_lib.override(config_lib.default_config(), SETTINGS)
      stepper = make_stepper(cfg)
      features, targets = jax.device_get(stepper.setups[0].worker_data)
      assert not np.asarray(stepper.state.params["w"]).any()  # zero models
      out = stepper.steps(STEPS)
      got = np.asarray(jax.device_get(stepper.state.params)["w"])
  finally:
    _forget(path)
  counts = np.stack([np.asarray(inputs.count) for _, inputs, _, _ in out])
  _check_skips(counts)
  ref = _reference(features, targets, counts)
  for t, ((etas, ks, _), (_, _, _, report)) in enumerate(zip(ref, out)):
    np.testing.assert_array_equal(report["opt_step"], ks, err_msg=f"step {t}")
    np.testing.assert_allclose(report["eta"], etas, rtol=1e-6, atol=1e-8, err_msg=f"step {t}")
  assert (ref[-1][1] < STEPS - 1).any()  # a skipped worker's count lags the step
  np.testing.assert_allclose(got, ref[-1][2], rtol=1e-4, atol=1e-6)
  assert not np.allclose(got[0], got[1])  # the workers differ


def _config_file(path):
  path.write_text("from nbsgd_jax import config\n\n\ndef get_config():\n"
                  f"  return config.override(config.default_config(), {SETTINGS!r})\n")
  return path


def _records(workdir, name):
  return [json.loads(l) for l in (workdir / name).read_text().splitlines()]


@pytest.mark.slow
def test_the_method_from_a_file_trains_through_the_command_line(tmp_path):
  """``python -m nbsgd_jax.main --config.imports=algo/my_eta_momentum.py`` from a directory
  that is not the repository's: the run's records (the averaged model's loss and the
  consensus distance at every step, worker 0's rate, count and mini-batches per step) are
  the numpy transcription's."""
  path = _write_algorithm(tmp_path / "algo")
  _config_file(tmp_path / "my_config.py")
  try:  # the host's counts and the data, in process: the transcription's inputs
    with recipes.registrations():
      config_lib.import_modules(config_lib.override(config_lib.default_config(),
                                                    {"imports": str(path)}))
      s = train.setup(config_lib.override(config_lib.default_config(), SETTINGS))
      host = train.make_host(s)
      counts = np.stack([np.asarray(host.inputs(t).count) for t in range(STEPS)])
      features, targets = jax.device_get(s.worker_data)
  finally:
    _forget(path)
  _check_skips(counts)
  r = subprocess.run(
      [sys.executable, "-m", "nbsgd_jax.main", "--config=my_config.py",
       "--config.imports=algo/my_eta_momentum.py", f"--config.eta_momentum.beta={BETA}",
       "--config.consensus.log_every_step=True", "--workdir=run"],
      capture_output=True, text=True, cwd=tmp_path, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert r.returncode == 0, r.stderr[-3000:]
  ref = _reference(features, targets, counts)
  a, b = np.asarray(features, np.float64).reshape(-1, DIM), np.asarray(targets, np.float64)
  evals = _records(tmp_path / "run", "metrics.jsonl")
  assert [e["step"] for e in evals] == list(range(STEPS + 1))
  for e, (_, _, x) in zip(evals[1:], ref):
    loss = 0.5 * np.mean((a @ x.mean(axis=0) - b.reshape(-1)) ** 2)
    xi = np.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))
    assert e["train_loss"] == pytest.approx(loss, rel=1e-5), e["step"]
    assert e["consensus_distance"] == pytest.approx(xi, rel=1e-4, abs=1e-7), e["step"]
  steps = _records(tmp_path / "run", "steps.jsonl")
  assert [(s["opt_step"], s["count"]) for s in steps] == [
      (int(ks[0]), int(c[0])) for (_, ks, _), c in zip(ref, counts)]
  assert [s["eta"] for s in steps] == pytest.approx([etas[0] for etas, _, _ in ref],
                                                    rel=1e-6, abs=1e-8)
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["imports"] == "algo/my_eta_momentum.py" and saved["eta_momentum"]["beta"] == BETA


# ----------------------------------------------------------------------------- config.imports


def test_imports_takes_a_file_path_or_a_module_name(tmp_path, monkeypatch):
  """A file path (relative to the current directory, here not the repository's) is imported
  by path; a module name is looked up on sys.path; either registers the algorithm."""
  path = _write_algorithm(tmp_path / "algo")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  for spelling, on_path in ((os.path.join("..", "algo", path.name), None),
                            ("my_eta_momentum", str(tmp_path / "algo"))):
    if on_path:
      monkeypatch.syspath_prepend(on_path)
    try:
      with recipes.registrations():
        assert "eta_momentum" not in recipes.REGISTRY
        cfg = config_lib.override(config_lib.default_config(), {"imports": spelling})
        config_lib.import_modules(cfg)
        config_lib.import_modules(cfg)  # twice (the program does): imported once
        assert "eta_momentum" in recipes.REGISTRY
        assert config_lib.default_config().eta_momentum.beta == 0.5  # its section's keys
    finally:
      _forget(path)


@pytest.mark.parametrize("value,why", [
    ("no_such_module_xyz", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("algo/missing.py", "FileNotFoundError: no file "),
    ("algo/broken.py", "ZeroDivisionError: division by zero"),
    ("algo/json.py", "ImportError: a module named 'json' is loaded already"),
])
def test_an_unimportable_import_is_one_line_naming_key_and_value(tmp_path, monkeypatch, value,
                                                                 why):
  (tmp_path / "algo").mkdir()
  (tmp_path / "algo" / "broken.py").write_text("x = 1 / 0\n")
  (tmp_path / "algo" / "json.py").write_text("x = 1\n")
  monkeypatch.chdir(tmp_path)
  imports = f"examples.easgd, {value}"
  cfg = config_lib.override(config_lib.default_config(), {"imports": imports})
  try:
    with recipes.registrations(), pytest.raises(config_lib.ConfigError) as e:
      config_lib.import_modules(cfg)
  finally:
    sys.modules.pop("examples.easgd", None)
  (line,) = e.value.errors
  assert "\n" not in line and why in line
  assert line.startswith(f"config.imports={imports!r} is not allowed: cannot import {value!r} (")
  assert line.endswith(f"; use {config_lib.IMPORTS_ALLOWED}")
  assert "broken" not in sys.modules
