"""Helpers shared by several test modules (no test module imports another): configurations,
the stepper loop, per-worker step contexts, record files, command lines, script loaders and
small fixtures made on disk."""

import contextlib
import importlib
import importlib.util
import io
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax import numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import recipes, train
from nbsgd_jax.transforms import StepContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST_CONFIG = os.path.join(ROOT, "experiments", "configs", "mnist.py")
WALL_KEYS = ("wall_time", "samples_per_second")  # a record's fields that vary run to run


# ----------------------------------------------------------------------------- loaders


def load_module(*parts, name=None, register=False):
  """The Python file ``ROOT/parts...`` as a module named ``name`` (default: the file's stem);
  ``register`` also puts it in ``sys.modules`` (dataclasses look their module up there)."""
  path = os.path.join(ROOT, *parts)
  name = name or os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec)
  if register:
    sys.modules[name] = mod
  spec.loader.exec_module(mod)
  return mod


def load_script(name):
  """``experiments/NAME.py`` as a module."""
  return load_module("experiments", f"{name}.py")


class _Parsed(Exception):
  """Raised in place of a script's parse_args return: its arguments are read, nothing runs."""


def script_args(script, recorded: dict, **fixed):
  """The ``argparse.Namespace`` an experiments script (``load_script``'s module) ran with:
  its parser's defaults (read by running its ``main()`` up to ``parse_args``), then the
  record's ``recorded`` arguments, then ``fixed``."""
  import argparse
  from unittest import mock

  def grab(parser, *args, **kw):
    raise _Parsed(parser)
  with mock.patch.object(argparse.ArgumentParser, "parse_args", grab):
    try:
      script.main()
    except _Parsed as e:
      parser = e.args[0]
  defaults = {a.dest: a.default for a in parser._actions if a.dest != "help"}
  return argparse.Namespace(**{**defaults, **recorded, **fixed})


def stored_config(stored: dict):
  """A stored config (``config.json``, a study's ``run.json`` ``config``) as a ConfigDict:
  today's defaults overridden by every stored key (an old name under its new one, lists as
  the config's tuples; a key added since keeps its default). Raises ConfigError for a key
  today's config lacks."""
  from nbsgd_jax.config import renamed
  from nbsgd_jax.core import provenance
  flat = config_lib.flatten_dict(renamed.upgrade(provenance.config_of(stored)))
  cfg = config_lib.default_config()
  defaults = config_lib.flatten_dict(cfg.to_dict())
  return config_lib.override(cfg, {
      k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
      if isinstance(v, list) and isinstance(defaults.get(k), tuple) else v
      for k, v in flat.items()})


def experiment_config(name, module_name=None):
  """``experiments/configs/NAME.py``'s ``get_config()``: a fresh ConfigDict (the file loaded
  as a module named ``module_name``, default ``NAME``)."""
  return load_module("experiments", "configs", f"{name}.py", name=module_name).get_config()


@contextlib.contextmanager
def registered(module_name=None):
  """Imports ``module_name``, a module that registers an algorithm or a codec from outside
  the package (``examples.easgd``), and yields it (None: yields None, for registrations the
  test makes itself); on exit removes what was registered (:func:`nbsgd_jax.recipes.
  registrations`) and the module, so that other tests see the built-in registries."""
  if module_name:
    sys.modules.pop(module_name, None)
  try:
    with recipes.registrations():
      yield importlib.import_module(module_name) if module_name else None
  finally:
    if module_name:
      sys.modules.pop(module_name, None)


# ----------------------------------------------------------------------------- configurations


COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILED: list = []  # the function name of every backend compilation of this process
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: _COMPILED.append(kw.get("fun_name")) if name == COMPILE_EVENT
    else None)


def backend_compiles(fn):
  """``(fn(), the names of the backend compilations it made)`` (``jax.monitoring``; a
  persistent-cache hit is no backend compilation: give the run ``compilation_cache="none"``
  to count every program)."""
  start = len(_COMPILED)
  out = fn()
  return out, _COMPILED[start:]


def small_cfg(**overrides):
  """The small MNIST-10k run most tests start from: an MLP with 32 hidden units, 4 workers of
  batch 8, 5 steps evaluated at step 5 on 64 training examples, constant learning rate, no
  progress bar. ``overrides`` (keys ``a.b``, or ``a__b`` for ``a.b``) set any key."""
  c = config_lib.default_config()
  c.model = "mlp"
  c.mlp_hidden = (32,)
  c.num_workers = 4
  c.batch_size = 8
  c.num_steps = 5
  c.eval_every = 5
  c.eval_train_examples = 64
  c.progress = False
  c.lr_schedule = "constant"
  return config_lib.override(c, {k.replace("__", "."): v for k, v in overrides.items()})


def least_squares_cfg(*, n, m, dim, lr, momentum, weight_decay, slowdown, time_per_example,
                      latency, bandwidth, **kw):
  """The asynchronous family's small set-up: full-batch least squares, ``n`` workers of ``m``
  examples in ``dim`` dimensions (one shard each), AD-PSGD on a ring with the given cluster,
  no progress bar; ``kw`` sets ``num_steps``, ``eval_every`` and overrides any key."""
  over = {"dataset": "least_squares", "problem.shards": n, "problem.examples_per_worker": m,
          "problem.dim": dim, "problem.noise": 1.0, "problem.l2": 0.0, "problem.seed": 0,
          "problem.heterogeneity": 1.0, "problem.full_batch": True, "algorithm": "ad_psgd",
          "num_workers": n, "batch_size": m, "learning_rate": lr, "momentum": momentum,
          "nesterov": True, "weight_decay": weight_decay, "cluster.slowdown": slowdown,
          "cluster.time_per_example": time_per_example, "cluster.latency": latency,
          "cluster.bandwidth": bandwidth, "topology": "ring", "progress": False,
          **kw}
  return config_lib.override(config_lib.default_config(), over)


def malformed(overrides):
  """The default config with ``overrides`` (``{"a.b": value}``), bypassing ConfigDict's type
  safety (as a config file could: ``with c.ignore_type(): ...``) so that validate sees the bad
  types too. Raises AssertionError for a key the config does not have."""
  cfg = config_lib.default_config()
  with cfg.ignore_type():
    for k, v in overrides.items():
      *sections, key = k.split(".")
      node = cfg
      for sec in sections:
        node = node[sec]
      assert key in node, k  # the table names real keys
      node[key] = v
  return cfg


# ----------------------------------------------------------------------------- running


class Crash(Exception):
  """A hook's exception that stops a run mid-way (a simulated kill)."""


def full_and_crashed(cfg, tmp_path, at: int = 13) -> dict:
  """``cfg`` trained whole into ``tmp_path/full`` (its summary returned) and into
  ``tmp_path/run`` stopped by a :class:`Crash` before step ``at`` (after the checkpoints
  before it), for a resume to be compared with the whole run."""
  full = train.train(cfg, str(tmp_path / "full"))

  def crash(step, state, setup):
    if step == at:
      raise Crash()

  with pytest.raises(Crash):
    train.train(cfg, str(tmp_path / "run"), hooks=(crash,))
  return full


def make_stepper(cfg, **setup_kw):
  """A fresh :class:`train.Stepper` of ``cfg``'s run (``setup_kw``: :func:`train.setup`'s
  keywords, e.g. ``data``): step it with ``.steps(n, hook)``, read ``.state``, ``.runs``."""
  return train.Stepper.of(train.setup(cfg, **setup_kw))


def run_steps(cfg, steps):
  """``steps`` steps of the trainer's step function, driven by the run's host parts
  (periodic recipes: with the config's sync planner). Returns ``(setup, state, losses)``,
  ``losses`` the per-step losses stacked, ``[steps, ...]``."""
  stepper = make_stepper(cfg)
  out = stepper.steps(steps)
  return stepper.setups[0], stepper.state, np.stack([loss for _, _, loss, _ in out])


def run_steps_with_targets(cfg, steps):
  """``steps`` steps with consensus control's target set to ``cfg.consensus.target`` at every
  step; asserts each step ran 3 gossip steps (an unreachable target: K = 3). Returns the
  final state."""
  stepper = make_stepper(cfg)

  def target(inputs):  # controlled at every step
    inputs.target = np.float32(cfg.consensus.target)
    inputs.target_value = float(cfg.consensus.target)

  for _, _, _, report in stepper.steps(steps, target):
    assert int(report["gossip_steps"][0]) == 3  # unreachable target: K steps
  return stepper.state


def step_contexts(n, step=0, *, count=1, total=None, active=None, **fields):
  """Per-worker :class:`StepContext` (leading axis ``n``): ``step``, ``count`` (mini-batches
  done) and ``total`` (default ``n``) as ``[n]`` int32; ``active`` a ``[k]`` or ``[n, k]``
  array broadcast to ``[n, k]`` (default ``[n, 1]`` all False); ``fields`` (``target``,
  ``alive``, ...) passed as given."""
  active = np.zeros((n, 1), bool) if active is None else np.asarray(active)
  return StepContext(jnp.full((n,), step, jnp.int32),
                     jnp.asarray(np.broadcast_to(count, (n,)), jnp.int32),
                     jnp.full((n,), n if total is None else total, jnp.int32),
                     jnp.asarray(np.broadcast_to(active, (n, active.shape[-1]))), **fields)


def hierarchical(f, d, k):
  """``f`` per worker on a (devices=d, local=k) axis pair, jitted; the returned function takes
  a ``[d*k, ...]`` array and returns ``f``'s outputs as a numpy ``[d*k, ...]`` array."""
  mesh = jax.make_mesh((d,), ("devices",), devices=jax.devices()[:d])
  g = jax.jit(jax.shard_map(jax.vmap(f, axis_name="workers"), mesh=mesh,
                            in_specs=P("devices"), out_specs=P("devices"), check_vma=False))
  return lambda x: np.asarray(g(jax.device_put(x, NamedSharding(mesh, P("devices")))))


def logreg_grads_numpy(kernel, bias, x, y):
  """The mean softmax cross-entropy gradients of a logistic regression in numpy:
  ``kernel [d, c]``, ``bias [c]``, ``x [b, d]``, integer labels ``y [b]``; returns
  ``(d kernel [d, c], d bias [c])``."""
  logits = x @ kernel + bias
  logits -= logits.max(1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return x.T @ p / len(y), p.mean(0)


# ----------------------------------------------------------------------------- records


def read_records(path):
  """The JSON lines of ``path`` (metrics.jsonl, steps.jsonl), one dict a line."""
  with open(path) as f:
    return [json.loads(line) for line in f]


def without_wall(recs, keys=WALL_KEYS):
  """``recs`` (dicts) without the fields ``keys`` that vary run to run (wall-clock time)."""
  return [{k: v for k, v in r.items() if k not in keys} for r in recs]


def assert_histories_close(a, b, keys, rtol=1e-4, atol=1e-6):
  """Asserts that two runs' summaries (:func:`train.train`'s) have, record by record of their
  ``history``, each of ``keys`` equal within ``rtol`` / ``atol`` (``pytest.approx``)."""
  for ra, rb in zip(a["history"], b["history"]):
    for key in keys:
      assert ra[key] == pytest.approx(rb[key], rel=rtol, abs=atol), key


# ----------------------------------------------------------------------------- command line


def run_python(args, *, timeout=300, env=None):
  """``python ARGS`` in the repository root with ``PYTHONPATH=ROOT`` and ``env`` added to
  this process's environment; the CompletedProcess with text stdout and stderr."""
  return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})), cwd=ROOT,
                        timeout=timeout)


def run_main(tmp_path, *args, config=MNIST_CONFIG):
  """``python -m nbsgd_jax.main --config=CONFIG`` writing to ``tmp_path/run``, no progress
  bar, with ``args`` (``--config.key=value``, ...) after; waits up to 300 s."""
  return run_python(["-m", "nbsgd_jax.main", f"--config={config}",
                     f"--workdir={tmp_path / 'run'}", "--config.progress=False", *args])


def write_config_file(path, expression):
  """Writes a config file at ``path`` whose ``get_config()`` returns ``expression`` evaluated
  with this module imported as ``helpers`` (e.g. ``"helpers.small_cfg(num_steps=3)"``)."""
  path.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests import helpers\n"
                  f"def get_config():\n  return {expression}\n")
  return path


def launch_processes(config_file, workdir, *extra, devices_per_process, launcher_timeout,
                     timeout):
  """``python -m nbsgd_jax.launch`` of 2 processes of ``devices_per_process`` devices each,
  running ``config_file`` into ``workdir`` with ``extra`` flags; the launcher gives up after
  ``launcher_timeout`` s, this call after ``timeout`` s."""
  return run_python(["-m", "nbsgd_jax.launch", "--num_processes=2",
                     f"--devices_per_process={devices_per_process}",
                     f"--timeout={launcher_timeout}", "--", f"--config={config_file}",
                     f"--workdir={workdir}", *extra], timeout=timeout)


# ----------------------------------------------------------------------------- image folders


IMAGE_CLASSES = ("cat", "ant", "bee")  # sorted: ant = 0, bee = 1, cat = 2


def png_bytes(a: np.ndarray) -> bytes:
  """``a`` (uint8 ``[h, w, c]``, c = 1 or 3) as the bytes of a (lossless) PNG file."""
  from PIL import Image  # pylint: disable=import-outside-toplevel  (only the image tests)
  buf = io.BytesIO()
  Image.fromarray(a.squeeze(-1) if a.shape[-1] == 1 else a).save(buf, format="PNG")
  return buf.getvalue()


def image_folder(root, size=(6, 5), channels=3, per_class=(3, 2), seed=0, wrap=""):
  """An image folder of random PNGs (lossless) at ``root/wrap/{train,test}/CLASS/NNN.png``,
  ``per_class`` images a class in each split, plus a non-image file; returns the arrays it
  must load as, ``{split: (images uint8 [count, *size, channels], labels int32 [count])}``."""
  rng = np.random.default_rng(seed)
  expect = {}
  for split, count in zip(("train", "test"), per_class):
    xs, ys = [], []
    for label, c in enumerate(sorted(IMAGE_CLASSES)):
      d = os.path.join(root, wrap, split, c)
      os.makedirs(d)
      for i in range(count):
        a = rng.integers(0, 256, size + (channels,), dtype=np.uint8)
        with open(os.path.join(d, f"{i:03d}.png"), "wb") as f:
          f.write(png_bytes(a))
        xs.append(a)
        ys.append(label)
    expect[split] = (np.stack(xs), np.asarray(ys, np.int32))
  with open(os.path.join(root, wrap, "train", "README.txt"), "w") as f:
    f.write("not an image: skipped")
  return expect


def check_image_arrays(arrays, expect):
  """Asserts ``arrays`` (a loaded image folder) are :func:`image_folder`'s ``expect``, bit for
  bit, with its classes, uint8 images and int32 labels."""
  assert arrays.classes == tuple(sorted(IMAGE_CLASSES))
  np.testing.assert_array_equal(arrays.train_images, expect["train"][0])
  np.testing.assert_array_equal(arrays.train_labels, expect["train"][1])
  np.testing.assert_array_equal(arrays.test_images, expect["test"][0])
  np.testing.assert_array_equal(arrays.test_labels, expect["test"][1])
  assert arrays.train_images.dtype == np.uint8 and arrays.train_labels.dtype == np.int32


def slow_except(values, fast, slow=None):
  """``values`` for ``pytest.mark.parametrize`` with every one not in ``fast`` marked slow
  (tests/tiers.py: the slow tier), so that the fast tier runs a few representative cases and
  the slow tier the rest; with ``slow`` given, only those are slow and the others long (the
  long tier, not run by CI). A value is a parameter or a tuple of them.

  Raises:
    ValueError: a value of ``fast`` or ``slow`` is not among ``values``.
  """
  missing = [v for v in (*fast, *(slow or ())) if v not in values]
  if missing:
    raise ValueError(f"slow_except: {missing} not among the values {list(values)}")

  def param(v, mark):
    return pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=mark)

  return [v if v in fast else param(v, pytest.mark.slow) if slow is None or v in slow
          else param(v, pytest.mark.long) for v in values]


def vmapped_steps(opt, params, grads, shared=None):
  """A user's loop of the optax transformation ``opt`` over the worker axis ``"w"``
  (``jax.vmap``): ``params`` a stacked tree ``[n, ...]``, ``grads[t]`` step t's stacked
  gradients, ``shared(t)`` (optional) step t's ``shared`` extra argument. Yields ``(t,
  params, state)`` after every step."""
  import optax
  state = jax.vmap(opt.init, axis_name="w")(params)

  def worker(p, st, g, kw):
    u, st = opt.update(g, st, p, **kw)
    return optax.apply_updates(p, u), st

  step = jax.jit(jax.vmap(worker, axis_name="w", in_axes=(0, 0, 0, None)))
  for t, g in enumerate(grads):
    params, state = step(params, state, g, {} if shared is None else {"shared": shared(t)})
    yield t, params, state


def state_of(state, kind):
  """The one ``kind`` (a NamedTuple class) inside a chain's state."""
  found = [x for x in jax.tree.leaves(state, is_leaf=lambda z: isinstance(z, kind))
           if isinstance(x, kind)]
  assert len(found) == 1, f"{len(found)} {kind.__name__} in the state"
  return found[0]


def start_and_gradients(shapes: dict, n: int, steps: int, seed: int = 0):
  """``(x0, grads)``: every worker's same random start ``{name: [n, *shape]}`` and ``steps``
  steps of random per-worker gradients (float32), drawn in that order from ``seed``: the
  inputs a reference test feeds both the framework and the transcription."""
  rng = np.random.default_rng(seed)
  x0 = {k: np.broadcast_to(rng.normal(size=s), (n,) + s).astype(np.float32)
        for k, s in sorted(shapes.items())}
  grads = [{k: rng.normal(size=(n,) + s).astype(np.float32) for k, s in sorted(shapes.items())}
           for _ in range(steps)]
  return x0, grads


# ----------------------------------------------------------------------------- composition cells


COMPOSITION_STEPS = 4  # a composition cell's steps


def cell_cfg(algorithm, nonblocking, compression, failures, control, **kw):
  """A cell of the composition matrix (tests/algorithms/test_composition.py): ``algorithm``
  with Non-blocking SGD, a top_k codec, a failure and consensus control each on or off, on
  4 workers of logistic regression for :data:`COMPOSITION_STEPS` steps; ``kw`` overrides any
  key (``a.b`` spelled as a ``**{"a.b": v}`` entry)."""
  c = config_lib.default_config()
  over = {"algorithm": algorithm, "model": "logreg", "num_workers": 4, "batch_size": 8,
          "num_steps": COMPOSITION_STEPS, "eval_every": COMPOSITION_STEPS,
          "eval_train_examples": 32,
          "progress": False, "topology": "ring", "learning_rate": 0.1,
          "local_sgd.local_steps": 2, "diloco.local_steps": 2, "gossip_pga.period": 2,
          "sparseloco.local_steps": 2, "noloco.local_steps": 2,
          "halos.local_steps": 1, "halos.accumulation": 1,  # the global model steps by 3
          "epidemic.rounds": 2, "epidemic.graph_degree": 2, "teleportation.local_steps": 2,
          "teleportation.sample_size": 2,
          "nonblocking.enabled": nonblocking, "nonblocking.num_minibatches": 2,
          "compression.name": "top_k" if compression else "none",
          "compression.density": 0.1,
          "cluster.failures": "1:1:2" if failures else "",
          "cluster.scenario": "lognormal", "cluster.spread": 0.5,
          "consensus.control": control, "consensus.target": 1e-4 if control else 0.0,
          "consensus.max_gossip_steps": 2,
          "momentum": 0.0 if algorithm == "demo" else 0.9, **kw}  # DeMo's momentum is its own
  return config_lib.override(c, over)


def run_cell(cfg, steps=COMPOSITION_STEPS):
  """Steps through the run's parts; checks device bytes == clock bytes at every step.

  Returns the final state and the host."""
  stepper = make_stepper(cfg)
  host = stepper.hosts[0]
  clock = host.part("clock")
  for t, inputs, loss, report in stepper.steps(steps):  # the host parts observed each step
    assert np.all(np.isfinite(np.asarray(loss)))
    device = report.get("bytes_sent", np.zeros(cfg.num_workers))
    charged = sum((r.num_bytes for r in clock.rounds(t, inputs, report)),
                  np.zeros(cfg.num_workers))
    np.testing.assert_allclose(charged, device, rtol=1e-6, err_msg=f"step {t}")
    if inputs.alive is not None:  # a failed worker sends nothing
      assert np.all(device[~inputs.alive] == 0)
  return stepper.state, host


def compose_study_run_before_stages(study, base, method, variant, point, seed):
  """``nbsgd_jax.study.schema.compose`` as it was at commit c98bc4c, before the prefix stage
  and the tuning overrides: a study that uses neither must compose exactly this (its cached
  runs' keys depend on it)."""
  import copy
  from nbsgd_jax import config as config_lib
  cfg = copy.deepcopy(base)
  unit, amount = study.budget
  budget = {"num_steps": amount, "budget_unit": "steps" if unit == "num_steps" else unit}
  for over in (study.methods[method].overrides, study.variants[variant], study.late, budget,
               point, {"seed": seed, "progress": False}):
    config_lib.override(cfg, over)
  return cfg


# a study of least squares small enough for a fast test (tests/study)
TINY_STUDY = {"base": {"dataset": "least_squares", "num_workers": 2, "eval_every": 5,
                       "batch_size": 4, "problem": {"examples_per_worker": 8, "dim": 3}},
              "methods": {"dpsgd": {"overrides": {"algorithm": "dpsgd"},
                                    "grid": {"learning_rate": [0.05, 0.1]}},
                          "allreduce": {"overrides": {"algorithm": "allreduce"},
                                        "grid": {"learning_rate": [0.1]}}},
              "tune": {"seeds": 7, "metric": "gap", "extend": False}, "seeds": [0, 1],
              "budget": {"num_steps": 10},
              "columns": ["final gap", "gap at equal bytes_sent", "sim_time to gap <= 1e-9"]}
