"""Budgets in gradient computations per worker (``config.budget_unit = "grads_per_worker"``:
``num_steps`` B counts them; ``docs/design.md``,
"Budgets in gradients per worker"): a lockstep run with a budget of B is the run of
``num_steps = B``, record for record; an event-clock run ends at the first device step where
the workers' mean gradient count reaches B (within one batch of events), its evaluations at
the steps that reach each multiple of ``eval_every``, and a worker's learning-rate schedule
counts its own gradients. The reference counts are taken from the event stream of a fresh
host clock (its ``next_batch`` events: a worker's events, less asynchronous DiLoCo's pulls),
not from the budget's code.
"""


import jax
import numpy as np
import pytest

from nbsgd_jax.core import checkpoint as checkpoint_lib
from nbsgd_jax import config as config_lib
from nbsgd_jax.run import hparams as hparams_lib
from nbsgd_jax import recipes
from nbsgd_jax import train
from nbsgd_jax.run.stepper import Budget

from tests.helpers import Crash, read_records, without_wall

STRAGGLERS = {"cluster.scenario": "lognormal", "cluster.spread": 0.3,
              "cluster.delay": "bernoulli_exponential", "cluster.delay_prob": 0.1,
              "cluster.delay_mean": 0.05}


GRADS = {"budget_unit": "grads_per_worker"}
WALL = ("wall_time",)  # the records' fields compared apart (samples_per_second kept)


def _cfg(**over):
  """4 workers on a small least-squares problem (the quickest programs to compile) with
  lognormal speeds and random stragglers."""
  return config_lib.override(config_lib.default_config(), {
      "dataset": "least_squares", "problem.dim": 4, "problem.examples_per_worker": 16,
      "num_workers": 4, "batch_size": 4, "learning_rate": 0.05, "progress": False,
      **STRAGGLERS, **over})


@pytest.mark.parametrize("algorithm, over", [
    ("dpsgd", {"lr_schedule": "cosine", "warmup_steps": 2}),
    # the period plan reads the run's length too (linear periods: alpha from num_comm)
    ("local_sgd", {"local_sgd.schedule": "linear", "local_sgd.num_comm": 2,
                   "local_sgd.local_steps": 2, "lr_schedule": "step"})])
def test_a_lockstep_budget_is_num_steps_record_for_record(tmp_path, algorithm, over):
  base = {"algorithm": algorithm, "eval_every": 4, **over}
  steps = train.train(_cfg(num_steps=10, **base), str(tmp_path / "steps"))
  grads = train.train(_cfg(num_steps=10, **GRADS, **base), str(tmp_path / "grads"))
  a = read_records(tmp_path / "steps" / "metrics.jsonl")
  b = read_records(tmp_path / "grads" / "metrics.jsonl")
  assert [r["step"] for r in b] == [0, 4, 8, 10]
  assert [r["grads_per_worker"] for r in b] == [0, 4, 8, 10]
  assert without_wall(b, WALL) == without_wall(a, WALL)
  assert grads["steps"] == steps["steps"] == 10


def _replay(cfg, steps):
  """The workers' mean gradient computations after each of ``steps`` device steps
  (``[steps + 1]``, from 0) and each worker's at the end, from the events of a fresh host's
  clock: one per event, less the pulls of asynchronous DiLoCo (event k of worker i is a pull
  when k % (H_i + 1) == 0)."""
  s = train.setup(cfg)
  part = train.make_host(s).part("clock")
  pulls = None
  if cfg.algorithm == "async_diloco":
    pulls = recipes.local_steps_per_worker(cfg, part.cluster) + 1
  per_worker, means = np.zeros(cfg.num_workers, np.int64), [0.0]
  for _ in range(steps):
    for e in part.clock.next_batch():
      per_worker[e.worker] += pulls is None or e.step % pulls[e.worker] != 0
    means.append(per_worker.mean())
  return np.asarray(means), per_worker


def _optimizer_counts(opt_state):
  """Each worker's count of the schedule's optimizer state (optax's ``count``) ``[n]``."""
  counts = [np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(opt_state)
            if "count" in jax.tree_util.keystr(path)]
  assert counts
  return counts[0]


def _check_budget(cfg, summary, final=None):
  """The run ``summary`` of ``cfg`` (budget 8, eval_every 3 or 2) against the replayed events;
  ``final``: its state after the last step (the optimizers' counts)."""
  budget, done = cfg.num_steps, summary["steps"]
  means, per_worker = _replay(cfg, done)
  assert means[done] >= budget > means[done - 1]  # within one batch of the budget
  assert done > budget  # a step holds less than one gradient computation per worker
  assert summary["grads_per_worker"] == pytest.approx(means[done])
  first = lambda g: int(np.argmax(means >= g))  # the first step that reaches g
  hist = summary["history"]
  points = list(range(cfg.eval_every, budget, cfg.eval_every)) + [budget]
  assert [r["step"] for r in hist] == [0] + [first(g) for g in points]
  assert [r["grads_per_worker"] for r in hist] == pytest.approx(means[[r["step"] for r in hist]])
  assert hparams_lib.values(cfg)["decay_steps"] == budget  # the schedule ends at the budget
  if final is not None:  # AD-PSGD's optimizer counts the worker's own gradients
    assert final["step"] == done
    np.testing.assert_array_equal(_optimizer_counts(final["opt_state"]), per_worker)


def test_an_event_clock_budget_ends_within_one_batch():
  cfg = _cfg(algorithm="async_diloco", num_steps=8, **GRADS, eval_every=3, lr_schedule="cosine",
             **{"diloco.local_steps": 3})
  _check_budget(cfg, train.train(cfg))


def test_an_event_clock_budget_checkpoints_on_its_cadence_and_resumes(tmp_path):
  """AD-PSGD with a budget: it ends within one batch of it, its optimizers count their own
  gradients, and checkpoint_every counts gradient computations per worker as eval_every: a
  run killed after its first checkpoint resumes from it and ends with the uninterrupted run's
  records."""
  cfg = lambda: _cfg(algorithm="ad_psgd", num_steps=8, **GRADS, eval_every=2,
                     checkpoint_every=4, lr_schedule="cosine")
  final = {}
  hook = lambda step, state, setup: final.update(step=step, opt_state=state.opt_state)
  full = train.train(cfg(), str(tmp_path / "full"), hooks=(hook,))
  _check_budget(cfg(), full, final)
  at = [r["step"] for r in full["history"]]  # the steps of points 0, 2, 4, 6, 8

  def crash(step, state, setup):
    del state, setup
    if step == at[3] + 1:  # after the checkpoint of point 4 and the evaluation of point 6
      raise Crash()

  with pytest.raises(Crash):
    train.train(cfg(), str(tmp_path / "run"), hooks=(crash,))
  assert checkpoint_lib.Checkpointer(str(tmp_path / "run")).latest_step() == at[2]
  seen = []
  train.train(cfg(), str(tmp_path / "run"), hooks=(lambda step, *_: seen.append(step),))
  assert seen[0] == at[2]
  assert (without_wall(read_records(tmp_path / "run" / "metrics.jsonl"), WALL)
          == without_wall(read_records(tmp_path / "full" / "metrics.jsonl"), WALL))


def test_budget_points_and_their_steps():
  class Host:  # a clock whose every step holds half a gradient computation per worker
    steps_for = staticmethod(lambda grads: [2 * g for g in grads])
  b = Budget.of(_cfg(num_steps=7, eval_every=3, **GRADS), Host())
  assert b == Budget((3, 6, 7), (6, 12, 14))
  assert [b.next_step(d) for d in (0, 5, 6, 13, 14)] == [6, 6, 12, 14, 14]
  assert [b.point_at(d) for d in (6, 7, 12, 14)] == [3, None, 6, 7]
  assert Budget.of(_cfg(), Host()) is None  # off


@pytest.mark.parametrize("over, named", [
    ({"budget_unit": "grads"}, "config.budget_unit='grads' is not allowed"),
    ({**GRADS, "num_steps": 3, "algorithm": "local_sgd", "local_sgd.local_steps": 4},
     "config.local_sgd.local_steps=4 is not allowed with config.num_steps=3: the run would "
     "end before its first communication"),
    ({**GRADS, "num_steps": 3, "algorithm": "diloco", "diloco.local_steps": 5},
     "config.diloco.local_steps=5 is not allowed with config.num_steps=3")])
def test_a_bad_budget_is_one_line_naming_the_key(over, named):
  with pytest.raises(config_lib.ConfigError, match=named.replace("(", r"\(")):
    config_lib.validate(_cfg(**over))


def test_a_budget_unit_is_a_number_of_the_program_not_its_structure():
  """Nothing compiles again: the unit is the host's (its steps), the length a hyperparameter."""
  cfg = _cfg(num_steps=6, **GRADS)
  assert hparams_lib.structure_key(cfg) == hparams_lib.structure_key(_cfg())
  assert hparams_lib.values(cfg)["decay_steps"] == 6
