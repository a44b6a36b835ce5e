"""Columns relative to a reference method: ``"METRIC gap to METHOD"`` (the percentage gap paired
by seed, hand-computed from known finals) and ``"X to METRIC <= METHOD"`` (the target is the
reference's mean final value; "no target" without a finished reference run); a METHOD that is
not among the study's methods is refused when the study is checked."""

import statistics

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.study import driver, output, schema, stats

LS = {"dataset": "least_squares", "num_workers": 2, "eval_every": 5, "batch_size": 4,
      "problem": {"examples_per_worker": 8, "dim": 3}}
COLUMNS = ["final gap", "gap gap to ref", "step to gap <= ref"]


def _study(columns=COLUMNS, seeds=(0, 1, 2)):
  return schema.check({"base": LS, "methods": {
      "ref": {"overrides": {"algorithm": "allreduce"}, "grid": {"learning_rate": [0.1]}},
      "m": {"overrides": {"algorithm": "dpsgd"}, "grid": {"learning_rate": [0.1]}}},
      "tune": {"seeds": 9, "metric": "gap"}, "seeds": list(seeds),
      "budget": {"num_steps": 10}, "columns": columns})


def _run(points, diverged=None):
  """A cached run's record from ``[(step, gap)]``."""
  return {"key": "k", "history": [{"step": s, "gap": g} for s, g in points],
          "diverged": diverged, "summary": {}}


def test_the_gap_is_paired_by_seed():
  values, unpaired = stats.relative({0: 1.5, 1: 0.5, 2: 2.0, 3: 1.0}, {0: 1.0, 1: 1.0, 3: 0.0})
  assert values == {0: 50.0, 1: -50.0} and unpaired == [2, 3]  # seed 3: a reference of 0
  s = stats.summarize(values, unpaired=unpaired)
  assert s["mean"] == 0.0 and s["std"] == pytest.approx(statistics.stdev([50, -50]))
  assert stats.show(s) == "0 ± 70.71 (2 seeds); no reference: seed 2, 3"


def test_gap_and_target_columns_from_known_finals():
  """ref's finals 2 and 4 (seed 2 diverged), m's 3, 3 and 1: gaps +50 % and -25 %, seed 2
  unpaired; the target is (2 + 4) / 2 = 3, which m reaches at steps 5, 20 and 6.67 (linear
  between evaluations) and ref at step 10 on seed 0 but never on seed 1."""
  reported = {"ref": {"default": {0: _run([(0, 4.0), (20, 2.0)]), 1: _run([(0, 8.0), (20, 4.0)]),
                                  2: _run([(0, 1.0)], diverged="nan")}},
              "m": {"default": {0: _run([(0, 5.0), (10, 1.0), (20, 3.0)]),
                                1: _run([(0, 6.0), (10, 4.0), (20, 3.0)]),
                                2: _run([(0, 4.0), (20, 1.0)])}}}
  table = driver.columns(_study(), reported)["default"]
  assert table["targets"] == {"step to gap <= ref": 3.0}
  gap = table["cells"]["m"]["gap gap to ref"]
  assert gap["values"] == pytest.approx({0: 50.0, 1: -25.0}) and gap["unpaired"] == [2]
  assert gap["mean"] == pytest.approx(12.5) and gap["std"] == pytest.approx(
      statistics.stdev([50.0, -25.0]))
  own = table["cells"]["ref"]["gap gap to ref"]
  assert (own["mean"], own["std"], own["n"], own["diverged"]) == (0.0, 0.0, 2, [2])
  to = table["cells"]["m"]["step to gap <= ref"]
  assert to["values"] == pytest.approx({0: 5.0, 1: 20.0, 2: 20 / 3})
  assert table["cells"]["ref"]["step to gap <= ref"]["not_reached"] == [1]


def test_a_reference_without_a_finished_run_gives_no_target():
  reported = {"ref": {"default": {0: _run([(0, 1.0)], diverged="nan"), 1: None}},
              "m": {"default": {0: _run([(0, 5.0), (10, 1.0)]), 1: _run([(0, 5.0)])}}}
  table = driver.columns(_study(seeds=(0, 1)), reported)["default"]
  assert table["targets"] == {"step to gap <= ref": None}
  cell = table["cells"]["m"]["step to gap <= ref"]
  assert cell["mean"] is None and cell["no_target"] and stats.show(cell) == "no target"
  assert table["cells"]["m"]["gap gap to ref"]["unpaired"] == [0, 1]
  assert stats.show(table["cells"]["ref"]["step to gap <= ref"]) == (
      "no target; diverged: seed 0; unfinished: seed 1")


@pytest.mark.parametrize("column", ["gap gap to nope", "sim_time to gap <= nope"])
def test_a_reference_that_is_not_a_method_is_refused(column):
  with pytest.raises(config_lib.ConfigError) as e:
    _study(columns=["final gap", column])
  assert e.value.errors == [f"study.columns entry {column!r} is not allowed: 'nope' is not "
                            "among the study's methods (ref, m)"]
  assert _study(columns=["sim_time to gap <= 1e-3"]).columns[0].target == 1e-3  # a number


def test_trained_gap_matches_the_per_seed_finals(tmp_path):
  study = _study(columns=["final gap", "gap gap to ref", "sim_time to gap <= ref"], seeds=(0, 1))
  res = driver.run(study, str(tmp_path), progress=False)
  finals = {m: {s: r["final"] for s, r in e["runs"]["default"].items()}
            for m, e in res["methods"].items()}
  cells = res["variants"]["default"]["cells"]
  assert cells["m"]["gap gap to ref"]["values"] == pytest.approx(
      {s: 100 * (finals["m"][s] / finals["ref"][s] - 1) for s in (0, 1)})
  assert cells["ref"]["gap gap to ref"]["mean"] == 0 and cells["ref"]["gap gap to ref"]["n"] == 2
  target = res["variants"]["default"]["targets"]["sim_time to gap <= ref"]
  assert target == pytest.approx((finals["ref"][0] + finals["ref"][1]) / 2)
  md = output.markdown(res)
  assert f"sim_time to gap <= ref: {target:.4g}" in md and "| gap gap to ref |" in md
