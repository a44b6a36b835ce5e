"""A study's ``claims`` (checked field by field, rendered in results.md beside our values) and
its ``trend`` (checked; the points are the column's cells against the mean of a summary field
over each variant's runs; ``trend.png``)."""

import os

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.study import claims, driver, output, schema, trend

LS = {"dataset": "least_squares", "num_workers": 2, "eval_every": 5, "batch_size": 4,
      "problem": {"examples_per_worker": 8, "dim": 3}}
CLAIM = {"source": "Charles et al. 2025 (arXiv 2503.09799), Table 4",
         "quote": "DiLoCo is within 1 % of data-parallel", "column": "gap gap to ref",
         "methods": ["m"], "supports": "least squares only: no language model"}
STUDY = {"base": LS, "methods": {
    "ref": {"overrides": {"algorithm": "allreduce"}, "grid": {"learning_rate": [0.1]}},
    "m": {"overrides": {"algorithm": "dpsgd"}, "grid": {"learning_rate": [0.1]}}},
    "tune": {"seeds": 9, "metric": "gap", "extend": False}, "seeds": [0, 1],
    "budget": {"num_steps": 10}, "columns": ["final gap", "gap gap to ref"]}


def _errors(**fields):
  with pytest.raises(config_lib.ConfigError) as e:
    schema.check({**STUDY, **fields})
  return e.value.errors


def test_bad_claims_are_one_line_each():
  bad = {**CLAIM, "page": 3, "column": "final loss", "methods": ["m", "nope"], "quote": ""}
  assert _errors(claims=[CLAIM, bad, "x"]) == [
      "study.claims[1].page=3 is not allowed: a claim has the fields source, quote, column, "
      "methods, supports",
      "study.claims[1].quote='' is not allowed: it must be a non-empty text (the paper's words)",
      "study.claims[1].column='final loss' is not allowed: it must be one of the study's columns "
      "'final gap', 'gap gap to ref'",
      "study.claims[1].methods=['m', 'nope'] is not allowed: 'nope' not among the study's "
      "methods (ref, m)",
      "study.claims[2]='x' is not allowed: a claim is a dict with the fields source, quote, "
      "column, methods, supports"]
  assert _errors(claims={"a": 1}) == [
      "study.claims={'a': 1} is not allowed: it must be a list of claims, each a dict with the "
      "fields source, quote, column, methods, supports"]
  assert schema.check({**STUDY, "claims": [CLAIM]}).claims == (CLAIM,)


def test_bad_trends_are_one_line_each():
  assert _errors(trend={"column": "final loss", "x": 3, "log_x": "yes", "y": 1,
                        "reference": {"label": "paper", "points": [[1, 2]]}}) == [
      "study.trend.y=1 is not allowed: trend has the fields column, x, log_x, reference",
      "study.trend.column='final loss' is not allowed: it must be one of the study's columns "
      "'final gap', 'gap gap to ref'",
      "study.trend.x=3 is not allowed: it must name a numeric field of each run's summary "
      "(model_params, ...)",
      "study.trend.log_x='yes' is not allowed: it must be True, False or None (a log axis when "
      "x spans more than a decade)",
      "study.trend.reference={'label': 'paper', 'points': [[1, 2]]} is not allowed: it must be "
      "{'label': a text, 'points': [[x, y], ...]} with at least two pairs of finite numbers"]


def _run(final, params, diverged=None):
  return {"key": "k", "history": [{"gap": final}], "diverged": diverged,
          "summary": {"model_params": params}}


def test_the_claims_table_and_the_trend_points_by_hand():
  """Two sizes, x = model_params 10 and 1000 (two decades: a log axis); m's gaps to ref are
  +10 % and +30 % on the small size (mean 20, std 14.14), +50 % on the large one (seed 1
  diverged; its model_params still count for x)."""
  study = schema.check({**STUDY, "variants": {"small": {}, "large": {}}, "claims": [CLAIM],
                        "trend": {"column": "gap gap to ref", "x": "model_params"}})
  reported = {"ref": {"small": {0: _run(1.0, 10), 1: _run(1.0, 10)},
                      "large": {0: _run(2.0, 1000), 1: _run(2.0, 1000)}},
              "m": {"small": {0: _run(1.1, 10), 1: _run(1.3, 10)},
                    "large": {0: _run(3.0, 1000), 1: _run(9.0, 1000, diverged="nan")}}}
  tables = driver.columns(study, reported)
  pts = trend.points(study.trend, reported, tables)
  assert pts["m"][0][:2] == [10.0, pytest.approx(20.0)] and pts["m"][0][2:] == [
      pytest.approx(14.142, abs=1e-3), 2]
  assert pts["m"][1] == [1000.0, pytest.approx(50.0), None, 1]  # one seed: no std
  assert pts["ref"] == [[10.0, 0.0, 0.0, 2], [1000.0, 0.0, 0.0, 2]]
  assert trend.log_axis(study.trend, pts) and not trend.log_axis({"log_x": False}, pts)
  md = claims.markdown({"claims": list(study.claims), "variants": tables})
  assert md[:9] == ["## Claims", "", "### 1. " + CLAIM["source"], "", "> " + CLAIM["quote"], "",
                    "Ours, `gap gap to ref`:", "", "| variant | m |"]
  assert md[10:12] == ["| small | 20 ± 14.14 (2 seeds) |",
                       "| large | 50 (1 seed); diverged: seed 1 |"]
  assert md[13] == "What this supports: " + CLAIM["supports"]


def test_a_trained_trend_reads_model_params_and_writes_trend_png(tmp_path):
  raw = {**STUDY, "methods": {"ref": STUDY["methods"]["ref"]}, "columns": ["final gap"],
         "variants": {"d3": {}, "d40": {"problem": {"dim": 40}}}, "seeds": [0],
         "claims": [{**CLAIM, "column": "final gap", "methods": ["ref"]}],
         "trend": {"column": "final gap", "x": "model_params",
                   "reference": {"label": "a paper", "points": [[10, 1.0], [1000, 0.5]]}}}
  res = driver.run(schema.check(raw), str(tmp_path), progress=False)
  xs = [p[0] for p in res["trend"]["ref"]]
  assert 0 < xs[0] < xs[1] and res["trend_spec"]["log_x"] == (xs[1] / xs[0] > 10)
  assert [p[1:] for p in res["trend"]["ref"]] == [
      [res["variants"][v]["cells"]["ref"]["final gap"]["mean"], None, 1] for v in ("d3", "d40")]
  paths = output.write(res, str(tmp_path))
  assert os.path.join(str(tmp_path), "trend.png") in paths
  assert os.path.getsize(tmp_path / "trend.png") > 1000
  md = (tmp_path / "results.md").read_text()
  assert "## Claims" in md and "| d40 |" in md and "Trend (trend.png): final gap" in md
