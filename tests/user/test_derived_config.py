"""The committed configs' derived settings follow the command line (issue 70, item 5): a value
computed from other keys (a rate scaled with the global batch, a warm-up in epochs, the run's
length, an evaluation or checkpoint cadence) is an ml_collections FieldReference of the keys
it comes from, so ``--config.num_workers=2 --config.batch_size=64`` reaches it, and
``config.json`` holds the resolved numbers.

The expected numbers are written out by hand from each config's docstring (Goyal et al.'s
rule: 0.1 per 128 examples of the global batch; CIFAR-10's 50,000 training images; nanoGPT's
``min_lr = learning_rate / 10`` and ``eval_iters = 20`` batches)."""

import ast
import glob
import json
import os

import pytest
from absl import flags
from ml_collections import config_flags

from nbsgd_jax import config as config_lib
from tests.helpers import ROOT, run_main

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py")))
CIFAR = os.path.join(ROOT, "experiments", "configs", "cifar10_resnet20.py")


def parsed(name, *overrides):
  """``experiments/configs/NAME.py`` with ``--config.KEY=VALUE`` overrides, parsed by
  ml_collections' ``config_flags`` as ``nbsgd_jax.main`` parses them (a locked config)."""
  path = os.path.join(ROOT, "experiments", "configs", f"{name}.py")
  argv = ["main", f"--config={path}", *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)  # the overrides it defines as flags
  fv(argv)
  return fv.config


def resolved(cfg, *keys):
  """The values of ``keys`` in the config's JSON (what ``config.json`` holds)."""
  d = config_lib.flatten_dict(json.loads(cfg.to_json_best_effort()))
  return {k: d[k] for k in keys}


CIFAR_KEYS = ("learning_rate", "warmup_steps", "num_steps", "eval_every", "checkpoint_every")


@pytest.mark.parametrize("overrides,want", [
    # 16 x 128: an epoch of 50,000 // 2,048 = 24 steps; lr 0.1 x 2,048 / 128 = 1.6; warm-up
    # 5 epochs = 120; 300 epochs = 7,200; evaluations every 10 epochs = 240, checkpoints every
    # 5th evaluation = 1,200
    ((), (1.6, 120, 7200, 240, 1200)),
    # 2 x 64: an epoch of 50,000 // 128 = 390 steps; lr 0.1 x 128 / 128 = 0.1
    (("--config.num_workers=2", "--config.batch_size=64"), (0.1, 1950, 117000, 3900, 19500)),
    # 4 x 16 (the docstring's CPU check): 50,000 // 64 = 781; lr 0.1 x 64 / 128 = 0.05
    (("--config.num_workers=4", "--config.batch_size=16"), (0.05, 3905, 234300, 7810, 39050)),
    # 32 x 128: 50,000 // 4,096 = 12; lr 0.1 x 4,096 / 128 = 3.2
    (("--config.num_workers=32",), (3.2, 60, 3600, 120, 600)),
])
def test_cifar_rate_and_epochs_follow_workers_and_batch(overrides, want):
  cfg = parsed("cifar10_resnet20", *overrides)
  got = resolved(cfg, *CIFAR_KEYS)
  assert got == pytest.approx(dict(zip(CIFAR_KEYS, want)), rel=1e-12)
  assert isinstance(got["warmup_steps"], int) and isinstance(got["learning_rate"], float)
  config_lib.validate(cfg)


def test_cifar_setting_a_derived_key_sets_that_key_alone():
  """``--config.warmup_steps`` and ``--config.num_steps`` replace their own value only; the
  checkpoint cadence follows ``--config.eval_every`` (every 5th evaluation)."""
  cfg = parsed("cifar10_resnet20", "--config.num_workers=2", "--config.batch_size=64",
               "--config.warmup_steps=7", "--config.num_steps=50", "--config.eval_every=10")
  assert resolved(cfg, *CIFAR_KEYS) == {"learning_rate": 0.1, "warmup_steps": 7,
                                        "num_steps": 50, "eval_every": 10,
                                        "checkpoint_every": 50}
  cfg = parsed("cifar10_resnet20", "--config.learning_rate=0.3", "--config.checkpoint_every=0",
               "--config.batch_size=64")
  assert resolved(cfg, *CIFAR_KEYS) == {"learning_rate": 0.3, "warmup_steps": 5 * 48,
                                        "num_steps": 300 * 48, "eval_every": 480,
                                        "checkpoint_every": 0}  # 50,000 // 1,024 = 48


@pytest.mark.parametrize("name,overrides,want", [
    ("shakespeare_char", (), {"lr_min": 1e-4, "eval_train_examples": 240}),
    ("shakespeare_char", ("--config.learning_rate=6e-4", "--config.batch_size=64"),
     {"lr_min": 6e-5, "eval_train_examples": 1280}),  # 6e-4 / 10; 20 x 64
    ("quickstart", (), {"checkpoint_every": 100}),  # every 5th evaluation: 5 x 20
    ("quickstart", ("--config.eval_every=8",), {"checkpoint_every": 40}),
    ("mnist", (), {"checkpoint_every": 100}),  # at every evaluation
    ("mnist", ("--config.eval_every=50",), {"checkpoint_every": 50}),
])
def test_other_configs_derived_values_follow_their_sources(name, overrides, want):
  cfg = parsed(name, *overrides)
  assert resolved(cfg, *want) == pytest.approx(want, rel=1e-12)
  config_lib.validate(cfg)


def test_a_sweep_over_the_batch_scales_each_run_s_rate_and_epochs():
  """``config.sweep`` sets the source keys per run as the command line does (a deep copy of
  the config keeps its references): 0.1 x 2 x 32 / 128 = 0.05 with epochs of 781 steps."""
  from nbsgd_jax.run import grid
  cfg = parsed("cifar10_resnet20", "--config.num_workers=2",
               "--config.sweep=batch_size=32,64,128")
  got = [(r.cfg.learning_rate, r.cfg.warmup_steps) for r in grid.expand(cfg)]
  assert got == [(0.05, 5 * 781), (0.1, 5 * 390), (0.2, 5 * 195)]
  assert cfg.learning_rate == 0.2  # the sweep's own config is left as it was (2 x 128)


def _eager_reads(path):
  """``(line, text)`` of each place in ``get_config`` that reads a config key's value while
  the config is built (``c.KEY`` inside an assigned expression, or ``c.KEY op= ...``): a value
  computed there is frozen before the command line's overrides; ``c.get_ref(KEY)`` is not."""
  src = open(path).read()
  fn = next(n for n in ast.parse(src).body
            if isinstance(n, ast.FunctionDef) and n.name == "get_config")
  cfg_names = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)
               and isinstance(n.value, ast.Call) and "default_config" in ast.unparse(n.value)
               for t in n.targets if isinstance(t, ast.Name)}
  def key_read(a):  # c.KEY or c.SECTION.KEY, not c.get_ref(...) or what is made of it
    root = a
    while isinstance(root, ast.Attribute):
      root = root.value
    return (isinstance(a, ast.Attribute) and a.attr != "get_ref"
            and isinstance(root, ast.Name) and root.id in cfg_names)
  found = []
  for node in ast.walk(fn):
    reads = []
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
      reads = [a for a in ast.walk(node.value) if key_read(a)]
    elif isinstance(node, ast.AugAssign) and key_read(node.target):
      reads = [node.target]
    found += [(node.lineno, ast.get_source_segment(src, node)) for _ in reads[:1]]
  return found


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_no_committed_config_computes_from_an_eagerly_read_key(path):
  """Every derived value goes through ``get_ref``: a line that reads ``c.KEY`` to compute
  another key (``c.num_workers * c.batch_size``) would not see ``--config.num_workers``."""
  assert _eager_reads(path) == [], f"{os.path.relpath(path, ROOT)}: read c.KEY via get_ref"


def test_the_eager_read_check_catches_the_frozen_rate(tmp_path):
  """The check above on the config as it was (issue 70): the rate and the epoch frozen."""
  p = tmp_path / "old.py"
  p.write_text("from nbsgd_jax.config import default_config\n\n"
               "def get_config():\n  c = default_config()\n  c.num_workers = 16\n"
               "  spe = 50_000 // (c.num_workers * c.batch_size)\n"
               "  c.learning_rate = 0.1 * c.num_workers * c.batch_size / 128\n"
               "  c.checkpoint_every = c.get_ref('eval_every') * 5\n"
               "  c.augment.flip = True\n  c.eval_every *= 2\n  return c\n")
  assert [line for line, _ in _eager_reads(p)] == [6, 7, 10]


@pytest.mark.slow
def test_cifar_command_line_writes_the_scaled_rate_and_its_own_epochs(tmp_path):
  """The real command line: ``--config.num_workers=2 --config.batch_size=64`` on the ResNet-20
  config writes learning rate 0.1 (not 16 x 128's 1.6) and a warm-up of 5 of its own epochs
  (5 x 390 steps) to config.json. The run is one step on the least-squares problem (the CIFAR
  data are not needed to check the configuration; nothing downloads)."""
  r = run_main(tmp_path, "--config.num_workers=2", "--config.batch_size=64",
               "--config.num_steps=1", "--config.dataset=least_squares",
               "--config.problem.examples_per_worker=64", config=CIFAR)
  assert r.returncode == 0, r.stderr[-3000:]
  got = json.loads((tmp_path / "run" / "config.json").read_text())
  assert {k: got[k] for k in ("num_workers", "batch_size", "learning_rate", "warmup_steps",
                              "eval_every", "checkpoint_every", "num_steps")} == {
      "num_workers": 2, "batch_size": 64, "learning_rate": 0.1, "warmup_steps": 1950,
      "eval_every": 3900, "checkpoint_every": 19500, "num_steps": 1}
