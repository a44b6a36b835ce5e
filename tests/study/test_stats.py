"""The study's numbers (:mod:`nbsgd_jax.study.stats`) against independent references: Python's
``statistics`` for the mean and the sample standard deviation, hand-computed interpolations,
and a synthetic tuning score whose best learning rate lies past the grid's edge."""

import math
import statistics

import pytest

from nbsgd_jax.study import driver, schema, stats


def test_mean_and_sample_std_over_seeds():
  s = stats.summarize({0: 1.0, 1: 2.0, 2: 4.0})
  assert s["mean"] == pytest.approx(statistics.mean([1.0, 2.0, 4.0]))
  assert s["std"] == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))  # ddof 1: 1.5275
  assert stats.show(s) == "2.333 ± 1.528 (3 seeds)"


def test_one_seed_has_no_std_and_says_so_and_diverged_seeds_are_named():
  s = stats.summarize({0: 0.25}, diverged=[1], unfinished=[2])
  assert s["mean"] == 0.25 and s["std"] is None and s["n"] == 1
  assert stats.show(s) == "0.25 (1 seed); diverged: seed 1; unfinished: seed 2"


def test_a_target_a_seed_misses_is_not_reached_never_a_number():
  history = [{"sim_time": 0.0, "gap": 1.0}, {"sim_time": 1.0, "gap": 0.5},
             {"sim_time": 2.0, "gap": 0.3}]
  assert stats.time_to(history, "sim_time", "gap", "<=", 0.1) is None
  assert stats.time_to(history, "sim_time", "gap", "<=", 0.4) == pytest.approx(1.5)  # by hand
  assert stats.time_to(history, "sim_time", "gap", ">=", 0.9) == 0.0
  s = stats.summarize({0: 1.5, 1: None})
  assert s["mean"] is None and s["not_reached"] == [1]
  assert stats.show(s) == "not reached (1 of 2 seeds)"


def test_value_at_equal_bytes_interpolates_and_refuses_past_the_end():
  history = [{"bytes_sent": 0, "loss": 2.0}, {"bytes_sent": 100, "loss": 1.0},
             {"bytes_sent": 300, "loss": 0.0}]
  assert stats.at_equal(history, "bytes_sent", "loss", 200) == pytest.approx(0.5)
  assert stats.at_equal(history, "bytes_sent", "loss", 301) is None
  assert stats.common_x([history, history[:2]], "bytes_sent") == 100


def test_the_next_value_beyond_an_edge():
  assert stats.beyond([0.01, 0.1], 0.1) == pytest.approx(1.0)  # geometric
  assert stats.beyond([0.01, 0.1], 0.01) == pytest.approx(0.001)
  assert stats.beyond([0, 2, 4], 4) == 6  # arithmetic (0 in the grid), an integer
  assert stats.beyond([0.01, 0.1, 1.0], 0.1) is None  # inside
  assert stats.beyond([0.1], 0.1) is None and stats.beyond([True, False], True) is None


class _Scores:
  """A run store whose runs are a synthetic score: final ``train_loss`` =
  ``(log10(lr) - log10(0.5))^2``, best at lr = 0.5; lr >= 2 diverges."""

  def __init__(self):
    self.trained = []

  def get(self, jobs):
    out = []
    for cfg, label, _ in jobs:
      self.trained.append(cfg.learning_rate)
      loss = (math.log10(cfg.learning_rate) - math.log10(0.5)) ** 2
      out.append({"key": label, "history": [{"train_loss": loss}],
                  "diverged": "nan" if cfg.learning_rate >= 2 else None, "seconds": 0.0})
    return out


def _study(grid, extend=True):
  return schema.check({"methods": {"sgd": {"grid": {"learning_rate": grid}}},
                       "tune": {"seeds": 9, "extend": extend}, "seeds": [0, 1],
                       "budget": {"num_steps": 10}})


@pytest.mark.parametrize("extend,pick", [(True, 0.5), (False, 0.25)])
def test_the_pick_and_the_extension_at_an_edge(extend, pick):
  study = _study([0.0625, 0.125, 0.25], extend)
  store = _Scores()
  got = driver.tune(study, schema.base_config(study), store, "sgd", "train", "default")
  # at the edge either way: 0.5 is the extended grid's largest value (one step only)
  assert got["pick"] == {"learning_rate": pick} and got["edge"]
  assert store.trained == [0.0625, 0.125, 0.25] + ([0.5] if extend else [])
  assert got["extended"] == ([{"learning_rate": 0.5}] if extend else [])


def test_a_diverged_run_is_never_picked_and_a_pick_inside_the_extended_grid_is_not_at_its_edge():
  study = _study([0.25, 4.0])
  got = driver.tune(study, schema.base_config(study), _Scores(), "sgd", "train", "default")
  # 4.0 diverges (its score is None); 0.25 is the grid's smallest: one step beyond it,
  # 0.25 * (0.25 / 4) = 0.0156, scores worse, so 0.25 stays, inside the extended grid
  assert [t["point"]["learning_rate"] for t in got["grid"]] == [0.25, 4.0, 0.0156]
  assert got["grid"][1]["score"] is None
  assert got["pick"] == {"learning_rate": 0.25} and not got["edge"]
