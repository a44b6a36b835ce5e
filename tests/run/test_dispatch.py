"""k steps per dispatch (``config.steps_per_dispatch``, a ``lax.scan`` over steps): the same
run as one dispatch per step, record for record (wall time aside)."""

import jax
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train

from tests.helpers import read_records, slow_except, small_cfg, without_wall

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

CASES = {
    "dpsgd": {"algorithm": "dpsgd"},
    # two programs (local steps, synchronising steps) inside one block
    "local_sgd": {"algorithm": "local_sgd", "local_sgd.local_steps": 3},
    # counted mini-batches of a simulated heterogeneous cluster, mesh backend
    "nonblocking_mesh": {"algorithm": "allreduce", "nonblocking.enabled": True,
                         "nonblocking.num_minibatches": 2, "cluster.scenario": "one_slow",
                         "backend": "mesh"},
    # ADA-LUPA needs F at every synchronisation: a block ends there
    "ada_lupa": {"algorithm": "local_sgd", "local_sgd.schedule": "ada_lupa",
                 "local_sgd.local_steps": 2},
}


def _run(k, overrides, tmp_path):
  seen = {}

  def hook(step, state, setup):
    del setup
    seen[step] = jax.device_get(state.params)

  workdir = str(tmp_path / f"k{k}")
  summary = train.train(small_cfg(num_steps=12, eval_every=6, steps_per_dispatch=k,
                                  **overrides), workdir, hooks=(hook,))
  return summary, seen, read_records(f"{workdir}/metrics.jsonl")


@pytest.mark.parametrize("case", slow_except(sorted(CASES), fast=(), slow=("local_sgd",)))
def test_k_steps_per_dispatch_equal_one_step_per_dispatch(tmp_path, case):
  one, seen1, recs1 = _run(1, CASES[case], tmp_path)
  four, seen4, recs4 = _run(4, CASES[case], tmp_path)
  assert without_wall(recs4) == without_wall(recs1)
  jax.tree.map(np.testing.assert_array_equal, seen4[12], seen1[12])
  assert sorted(seen1) == list(range(13))
  if case != "ada_lupa":  # hooks before each dispatch: blocks of 4 cut at evaluations (6)
    assert sorted(seen4) == [0, 4, 6, 10, 12]


def test_steps_per_dispatch_is_refused_on_the_wall_clock():
  cfg = small_cfg(steps_per_dispatch=2, backend="mesh")
  cfg.cluster.clock = "wall"
  with pytest.raises(config_lib.ConfigError, match="config.steps_per_dispatch=2"):
    config_lib.validate(cfg)


def _setup(**over):
  cfg = small_cfg(**{"num_steps": 12, "eval_every": 6, **over})
  return train.setup(cfg)


def test_auto_dispatch_size_is_the_largest_divisor_of_eval_every_up_to_the_cap():
  from nbsgd_jax.run import stepper as stepper_lib
  size = lambda setups, **kw: stepper_lib.dispatch_size(setups, platform="gpu", **kw)
  assert size([_setup(algorithm="dpsgd")]) == 6
  assert size([_setup(algorithm="dpsgd", eval_every=100)]) == 10
  assert size([_setup(algorithm="dpsgd", eval_every=7)]) == 7
  assert size([_setup(algorithm="dpsgd", eval_every=34)]) == 2
  cap = stepper_lib.AUTO_DISPATCH_MAX
  assert size([_setup(algorithm="dpsgd", eval_every=4 * cap)]) == cap
  # every run of a group: the divisor of both cadences
  assert size([_setup(eval_every=6), _setup(eval_every=4)]) == 2
  # 1 where blocks would change what runs or compiles
  assert size([_setup(algorithm="dpsgd")], hooked=True) == 1
  assert size([_setup(algorithm="local_sgd", **{"local_sgd.local_steps": 3})]) == 1
  # a k that is set is kept, hooks or not
  assert size([_setup(steps_per_dispatch=4)], hooked=True) == 4


def test_auto_dispatch_is_one_on_the_wall_clock_and_on_a_cpu():
  """XLA:CPU runs a convolution in a loop's body 3-11x slower than at a program's top level
  and the MLP gains nothing from blocks (docs/steps_per_dispatch.md): k = 1 on a CPU."""
  from nbsgd_jax.run import stepper as stepper_lib
  import types
  cfg = small_cfg(steps_per_dispatch=0)  # a set-up's config (a wall-clock run's needs processes)
  cfg.cluster.clock = "wall"
  s = types.SimpleNamespace(cfg=cfg, recipe=types.SimpleNamespace(periodic=False))
  assert stepper_lib.dispatch_size([s], platform="gpu") == 1
  cfg.cluster.clock = "simulated"
  assert stepper_lib.dispatch_size([s], platform="gpu") == 5  # eval_every = 5
  assert stepper_lib.dispatch_size([s], platform="cpu") == 1
  assert jax.default_backend() == "cpu" and stepper_lib.dispatch_size([s]) == 1
  assert stepper_lib.dispatch_size([_setup(steps_per_dispatch=4)]) == 4  # set: kept
