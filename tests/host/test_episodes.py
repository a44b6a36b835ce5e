"""Compute speed over time (``nbsgd_jax/host/episodes.py``): fail-slow episodes match their
distributions over a long seeded run, the draw does not depend on the order steps are asked
for, and a compute trace replays exactly through train()'s clock."""

import math

import numpy as np
import pytest
from scipy import stats

from nbsgd_jax import config as config_lib
from nbsgd_jax import train
from nbsgd_jax.host import cluster as cluster_lib
from nbsgd_jax.host import cluster_config
from nbsgd_jax.host.episodes import ComputeTrace, SlowEpisodes

N, T, S0 = 3000, 2000, 1.0  # workers, steps, seconds per step
RATE, MEDIAN, SIGMA, FACTOR = 36.0, 20.0, 0.5, 2.0  # 36 / h: a gap of 100 s on average


def _expected_steps() -> float:
  """E[ceil(L / (factor s0))] for L ~ lognormal(ln median, sigma): sum_k P(L > k factor s0)."""
  k = np.arange(0, 400)
  return float(np.sum(stats.lognorm.sf(k * FACTOR * S0, SIGMA, scale=MEDIAN)))


def test_episode_counts_and_lengths_match_their_distributions():
  """Over 2,000 steps of 3,000 workers: the mean number of onsets per worker within 2 % of
  the renewal count T / E[cycle] (E[cycle] = the exponential gap, floored to whole steps, and
  the episode's slow steps), and the mean slow steps of an episode within 2 % of
  E[ceil(L / (factor s0))] (lognormal L; the closed form by scipy's survival function)."""
  ep = SlowEpisodes(N, S0, RATE, MEDIAN, SIGMA, FACTOR, seed=1)
  spans = [ep.episodes(i, T) for i in range(N)]
  lengths = np.array([b - a for s in spans for a, b in s])
  gap = 3600.0 / RATE
  floored_gap = gap - 0.5  # E[floor(t + g) - t] for t on the grid: g - 1/2 on average
  cycle = floored_gap + _expected_steps()
  assert np.mean([len(s) for s in spans]) == pytest.approx(T / cycle, rel=0.02)
  assert lengths.mean() == pytest.approx(_expected_steps(), rel=0.02)
  assert lengths.min() >= 1


def test_the_draw_does_not_depend_on_the_order_steps_are_asked_for():
  a = SlowEpisodes(4, [1.0, 2.0, 0.5, 1.0], 360.0, 30.0, 1.0, 3.0, seed=5)
  b = SlowEpisodes(4, [1.0, 2.0, 0.5, 1.0], 360.0, 30.0, 1.0, 3.0, seed=5)
  forward = [a.factors(t) for t in range(300)]
  backward = [b.factors(t) for t in reversed(range(300))][::-1]
  np.testing.assert_array_equal(forward, backward)
  assert {1.0, 3.0} == set(np.concatenate(forward))
  inside = [[any(s <= t < e for s, e in a.episodes(i, 300)) for i in range(4)]
            for t in range(300)]  # factors() is each worker's own episodes, step by step
  np.testing.assert_array_equal(forward, np.where(inside, 3.0, 1.0))
  off = SlowEpisodes(4, 1.0, 0.0, 30.0, 1.0, 3.0)
  np.testing.assert_array_equal(off.factors(10), np.ones(4))


def _cfg(**over):
  c = config_lib.default_config()
  c.update(dict(num_workers=3, dataset="least_squares", num_steps=6, eval_every=6,
                progress=False, batch_size=16, algorithm="allreduce"))
  c.problem.update(dict(examples_per_worker=16, dim=4, full_batch=True))
  return config_lib.override(c, {"cluster.latency": 0.0, "cluster.bandwidth": 1e15, **over})


def test_a_compute_trace_replays_exactly(tmp_path):
  """Blocking all-reduce: each step lasts the slowest worker's traced seconds (a worker
  before its first row computes at the cluster's speed, 16 x 1 ms)."""
  path = tmp_path / "trace.csv"
  path.write_text("step,worker,seconds\n0,0,0.5\n0,1,0.2\n2,1,0.9\n4,0,0.1\n3,2,0.3\n")
  rows = {0: 0.5, 1: 0.5, 2: 0.9, 3: 0.9, 4: 0.9, 5: 0.9}  # the slowest worker per step
  out = train.train(_cfg(**{"cluster.trace": str(path)}), None)
  assert out["sim_time"] == pytest.approx(sum(rows.values()), rel=1e-9)
  trace = ComputeTrace(str(path), 3)
  np.testing.assert_array_equal(trace.seconds(3), [0.5, 0.9, 0.3])
  assert math.isnan(ComputeTrace(str(path), 3).seconds(1)[2])


def test_episodes_slow_the_clock_by_their_factor():
  """One worker always in an episode (a rate so high the first gap is under a step, and
  episodes longer than the run): every blocking step lasts factor x the nominal step."""
  cl = cluster_config.from_config(_cfg(**{"cluster.episode_rate": 3.6e9,
                                       "cluster.episode_median": 1e6,
                                       "cluster.episode_factor": 3.0}))
  steps = [cluster_lib.minibatch_finish_times(cl, t)[:, -1] for t in range(6)]
  np.testing.assert_allclose(steps, 3.0 * 16 * 1e-3)


@pytest.mark.parametrize("text,match", [
    ("step,worker\n0,0\n", "header must be step,worker,seconds"),
    ("step,worker,seconds\n0,5,1.0\n", "line 2 needs step >= 0, 0 <= worker < 3"),
    ("step,worker,seconds\n0,0,fast\n", "line 2 is not step,worker,seconds numbers")])
def test_a_bad_trace_is_refused_by_name_with_its_line(tmp_path, text, match):
  path = tmp_path / "t.csv"
  path.write_text(text)
  with pytest.raises(ValueError, match=r"cluster\.trace=.* is not allowed: .*" + match):
    ComputeTrace(str(path), 3)
  with pytest.raises(ValueError, match=r"cluster\.trace"):
    ComputeTrace(str(tmp_path / "missing.csv"), 3)


def test_the_documented_example_trace_reads_as_docs_clock_md_says():
  from tests.helpers import ROOT
  import os
  trace = ComputeTrace(os.path.join(ROOT, "experiments", "configs", "traces",
                                    "fail_slow_example.csv"), 8)
  for step, worker3, worker5 in ((0, np.nan, 0.0352), (150, 0.096, 0.0352),
                                 (300, 0.032, 0.0352)):
    np.testing.assert_array_equal(trace.seconds(step)[[3, 5]], [worker3, worker5])
