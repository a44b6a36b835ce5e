"""Tests for nbsgd_jax.host.cluster (simulated cluster, deadlines, max-plus clock)."""

import re

import numpy as np
import pytest

from nbsgd_jax.host import cluster as cl

# Path graph 0 - 1 - 2 (diagonal left False on purpose: it is treated as True).
PATH = np.array([[0, 1, 0],
                 [1, 0, 1],
                 [0, 1, 0]], dtype=bool)


def _hand_cluster():
  return cl.make_cluster(3, 2, slowdown=[1.0, 2.0, 3.0], time_per_example=1.0, batch_size=2)


def test_hand_computed_example():
  c = _hand_cluster()
  f = cl.minibatch_finish_times(c, step=0)
  # per mini-batch time (B / M) * time_per_example * slowdown_i = [1, 2, 3]; cumulative over M = 2:
  #   worker 0: [1, 2]; worker 1: [2, 4]; worker 2: [3, 6]
  np.testing.assert_array_equal(f, [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
  # "fastest": min_i finish[i, M-1] = min(2, 4, 6) = 2
  d = cl.deadline(f)
  assert d == 2.0
  # finished by t = 2: worker 0 both (1, 2 <= 2), worker 1 one (2 <= 2 < 4), worker 2 none
  counts = cl.finished_counts(f, d)
  assert counts.dtype == np.int32
  np.testing.assert_array_equal(counts, [2, 1, 0])
  # non-blocking compute: min(2, [2, 4, 6]) = [2, 2, 2]; blocking: [2, 4, 6]
  np.testing.assert_array_equal(cl.compute_time(f, d), [2.0, 2.0, 2.0])
  blocking = cl.compute_time(f)
  np.testing.assert_array_equal(blocking, [2.0, 4.0, 6.0])
  # max-plus with clocks [0, 0, 3], blocking compute: ready = c + compute = [2, 4, 9];
  # comm = [0.5, 0.25, 1.0]
  clocks = np.array([0.0, 0.0, 3.0])
  comm = np.array([0.5, 0.25, 1.0])
  # all-reduce: max(2, 4, 9) + comm = [9.5, 9.25, 10.0]
  np.testing.assert_array_equal(cl.advance_clocks(clocks, blocking, comm), [9.5, 9.25, 10.0])
  # path: N(0) = {0, 1}: max(2, 4) = 4 -> 4.5; N(1) = {0, 1, 2}: 9 -> 9.25;
  #       N(2) = {1, 2}: max(4, 9) = 9 -> 10.0
  np.testing.assert_array_equal(cl.advance_clocks(clocks, blocking, comm, PATH),
                                [4.5, 9.25, 10.0])
  # full adjacency == all-reduce
  np.testing.assert_array_equal(cl.advance_clocks(clocks, blocking, comm, np.ones((3, 3))),
                                [9.5, 9.25, 10.0])


def test_kth_and_fixed_deadlines():
  f = cl.minibatch_finish_times(_hand_cluster(), 0)  # last column [2, 4, 6]
  assert cl.deadline(f, "kth:1") == 2.0
  assert cl.deadline(f, "kth:2") == 4.0
  assert cl.deadline(f, "kth:3") == 6.0
  assert cl.deadline(f, 3.5) == 3.5
  assert cl.deadline(f, "3.5") == 3.5
  np.testing.assert_array_equal(cl.finished_counts(f, 4.0), [2, 2, 1])
  np.testing.assert_array_equal(cl.finished_counts(f, 0.5), [0, 0, 0])
  with pytest.raises(ValueError, match="nonblocking.deadline"):
    cl.deadline(f, "kth:4")


def test_per_neighbourhood_deadlines():
  f = cl.minibatch_finish_times(_hand_cluster(), 0)  # last column [2, 4, 6]
  # fastest over N(0)={0,1}: 2; N(1)={0,1,2}: 2; N(2)={1,2}: 4
  d = cl.deadline(f, "fastest", group=PATH)
  np.testing.assert_array_equal(d, [2.0, 2.0, 4.0])
  # counts: w0 [1,2]<=2 -> 2; w1 [2,4]<=2 -> 1; w2 [3,6]<=4 -> 1
  np.testing.assert_array_equal(cl.finished_counts(f, d), [2, 1, 1])
  np.testing.assert_array_equal(cl.compute_time(f, d), [2.0, 2.0, 4.0])
  # kth:2: N(0) {2,4} -> 4; N(1) {2,4,6} -> 4; N(2) {4,6} -> 6
  np.testing.assert_array_equal(cl.deadline(f, "kth:2", group=PATH), [4.0, 4.0, 6.0])
  # kth:3 with 2-worker neighbourhoods: the slowest of the neighbourhood
  np.testing.assert_array_equal(cl.deadline(f, "kth:3", group=PATH), [4.0, 6.0, 6.0])
  np.testing.assert_array_equal(cl.deadline(f, 1.5, group=PATH), [1.5, 1.5, 1.5])
  # no edges: each worker is its own group
  np.testing.assert_array_equal(cl.deadline(f, group=np.zeros((3, 3), bool)), [2.0, 4.0, 6.0])


def test_reproducible_per_seed_and_step():
  c = cl.make_cluster(4, 5, delay="bernoulli_exponential", delay_mean=0.1, delay_prob=0.5,
                      seed=7)
  a5 = cl.minibatch_finish_times(c, 5)
  a3 = cl.minibatch_finish_times(c, 3)
  # other order, with an unrelated draw in between
  c2 = cl.make_cluster(4, 5, delay="bernoulli_exponential", delay_mean=0.1, delay_prob=0.5,
                       seed=7)
  b3 = cl.minibatch_finish_times(c2, 3)
  cl.minibatch_finish_times(c2, 11)
  b5 = cl.minibatch_finish_times(c2, 5)
  np.testing.assert_array_equal(a5, b5)
  np.testing.assert_array_equal(a3, b3)
  assert not np.array_equal(a3, a5)
  c3 = c._replace(seed=8)
  assert not np.array_equal(cl.minibatch_finish_times(c3, 5), a5)
  assert np.all(np.diff(a5, axis=1) > 0)


def _delays(c):
  f = cl.minibatch_finish_times(c, 1)
  per = np.diff(f, axis=1, prepend=0.0)
  return per - c.minibatch_time[:, None]


def test_delay_means():
  # 100 workers x 200 mini-batches = 20000 draws
  c = cl.make_cluster(100, 200, delay="shifted_exponential", delay_mean=0.2, delay_shift=0.05,
                      seed=1, delay_per="minibatch")
  d = _delays(c)
  assert d.min() >= 0.05 - 1e-12
  assert abs(d.mean() - 0.25) < 0.05 * 0.25
  c = cl.make_cluster(100, 200, delay="bernoulli_exponential", delay_mean=0.2, delay_prob=0.3,
                      seed=2, delay_per="minibatch")
  d = _delays(c)
  assert abs(d.mean() - 0.3 * 0.2) < 0.05 * 0.06
  assert abs(np.mean(d > 1e-12) - 0.3) < 0.05 * 0.3
  c = cl.make_cluster(100, 200)
  np.testing.assert_allclose(_delays(c), 0.0, atol=1e-12)


def test_scenarios():
  c = cl.make_cluster(4, 2)
  np.testing.assert_array_equal(c.slowdown, [1, 1, 1, 1])
  c = cl.make_cluster(4, 2, scenario="one_slow", slow_factor=3.0)
  np.testing.assert_array_equal(c.slowdown, [1, 1, 1, 3])
  c = cl.make_cluster(8, 2, scenario="lognormal", spread=0.5, seed=3)
  assert c.slowdown.min() == 1.0 and np.all(c.slowdown >= 1.0)
  np.testing.assert_array_equal(
      c.slowdown, cl.make_cluster(8, 2, scenario="lognormal", spread=0.5, seed=3).slowdown)
  c = cl.make_cluster(2, 2, scenario="one_slow", slowdown=[2.0, 5.0])
  np.testing.assert_array_equal(c.slowdown, [2.0, 5.0])


def test_comm_time():
  c = cl.make_cluster(3, 1, latency=1e-3, bandwidth=1e6)
  # 1e-3 * [1, 2, 0] + [1e6, 0, 5e5] / 1e6 = [1.001, 0.002, 0.5]
  np.testing.assert_allclose(cl.comm_time(c, [1, 2, 0], [1e6, 0, 5e5]), [1.001, 0.002, 0.5])
  np.testing.assert_allclose(cl.comm_time(c, 2, 1e3), [0.003] * 3)
  with pytest.raises(ValueError, match="messages"):
    cl.comm_time(c, [-1, 0, 0], 0)
  with pytest.raises(ValueError, match="num_bytes"):
    cl.comm_time(c, 0, [1, 2])


def test_check_deadline():
  c = cl.make_cluster(3, 2, slowdown=[2.0, 3.0, 4.0], time_per_example=0.5, batch_size=2,
                      delay="shifted_exponential", delay_mean=0.1, delay_shift=0.25,
                      delay_per="minibatch")
  # smallest first mini-batch: 0.5 * 2 + 0.25 = 1.25
  assert cl.check_deadline(c, 1.25) == 1.25
  assert cl.check_deadline(c, "fastest") == "fastest"
  with pytest.raises(ValueError, match=r"nonblocking\.deadline=1\.2 is not allowed: no worker"):
    cl.check_deadline(c, 1.2)
  with pytest.raises(ValueError, match="nonblocking.deadline"):
    cl.check_deadline(c, "kth:4")
  assert cl.check_deadline(c, "kth:3") == "kth:3"


@pytest.mark.parametrize("value", ["slowest", "kth:0", "kth:x", "kth:", 0, -1.0, float("inf"),
                                   float("nan"), True, None, "0"])
def test_parse_deadline_rejects(value):
  with pytest.raises(ValueError, match=r"nonblocking\.deadline=.* is not allowed"):
    cl.parse_deadline(value)


def test_parse_deadline_accepts():
  assert cl.parse_deadline("fastest") == "fastest"
  assert cl.parse_deadline(" kth:2 ") == "kth:2"
  assert cl.parse_deadline(2) == 2.0 and isinstance(cl.parse_deadline(2), float)


@pytest.mark.parametrize("kwargs, field", [
    (dict(n=0), "num_workers"),
    (dict(n=2.0), "num_workers"),
    (dict(num_minibatches=0), "nonblocking.num_minibatches"),
    (dict(num_minibatches=1.5), "nonblocking.num_minibatches"),
    (dict(num_minibatches=True), "nonblocking.num_minibatches"),
    (dict(time_per_example=0.0), "cluster.time_per_example"),
    (dict(time_per_example=-1e-3), "cluster.time_per_example"),
    (dict(time_per_example=float("nan")), "cluster.time_per_example"),
    (dict(overhead=-1.0), "cluster.overhead"),
    (dict(delay_per="step"), "cluster.delay_per"),
    (dict(batch_size=0), "batch_size"),
    (dict(slowdown=[1.0, 0.0]), "cluster.slowdown"),
    (dict(slowdown=[1.0, -2.0]), "cluster.slowdown"),
    (dict(slowdown=[1.0, 2.0, 3.0]), "cluster.slowdown"),
    (dict(slowdown=["a", "b"]), "cluster.slowdown"),
    (dict(delay_mean=-0.1), "cluster.delay_mean"),
    (dict(delay_shift=-0.1), "cluster.delay_shift"),
    (dict(delay_prob=-0.1), "cluster.delay_prob"),
    (dict(delay_prob=1.1), "cluster.delay_prob"),
    (dict(latency=-1e-6), "cluster.latency"),
    (dict(bandwidth=0.0), "cluster.bandwidth"),
    (dict(spread=-1.0), "cluster.spread"),
    (dict(slow_factor=0.0), "cluster.slow_factor"),
    (dict(seed=-1), "cluster.seed"),
    (dict(scenario="fast"), "cluster.scenario"),
    (dict(delay="gamma"), "cluster.delay"),
])
def test_make_cluster_rejects(kwargs, field):
  args = dict(n=2, num_minibatches=2)
  args.update(kwargs)
  with pytest.raises(ValueError, match="^" + re.escape(field) + "=.* is not allowed"):
    cl.make_cluster(**args)


def test_unknown_names_list_allowed():
  with pytest.raises(ValueError, match="homogeneous.*one_slow.*lognormal"):
    cl.make_cluster(2, 2, scenario="fast")
  with pytest.raises(ValueError, match="none.*shifted_exponential.*bernoulli_exponential"):
    cl.make_cluster(2, 2, delay="gamma")


def test_shape_errors():
  c = _hand_cluster()
  f = cl.minibatch_finish_times(c, 0)
  with pytest.raises(ValueError, match="step"):
    cl.minibatch_finish_times(c, -1)
  with pytest.raises(ValueError, match="group"):
    cl.deadline(f, group=np.ones((2, 2), bool))
  with pytest.raises(ValueError, match="deadline"):
    cl.finished_counts(f, [1.0, 2.0])
  with pytest.raises(ValueError, match="finish"):
    cl.finished_counts(np.ones(3), 1.0)
  with pytest.raises(ValueError, match="compute"):
    cl.advance_clocks(np.zeros(3), np.zeros(2), np.zeros(3))
  with pytest.raises(ValueError, match="adjacency"):
    cl.advance_clocks(np.zeros(3), np.zeros(3), np.zeros(3), np.ones((3, 2)))
