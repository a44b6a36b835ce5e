"""Non-blocking SGD (He & Dube 2022) in training, and the simulated clock."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import topology, train
from tests.helpers import logreg_grads_numpy, run_steps, slow_except, small_cfg

ALGOS = ["allreduce", "allreduce_ring", "dpsgd", "matcha"]


@pytest.mark.parametrize("algorithm", slow_except(ALGOS, fast=("dpsgd",)))
def test_homogeneous_nonblocking_equals_blocking(algorithm):
  """Equal speeds, no delays: every worker finishes all M by the deadline, so the
  non-blocking trajectory is the blocking one."""
  kw = dict(algorithm=algorithm, num_workers=4, batch_size=8, momentum=0.9,
            topology="ring", **{"nonblocking.num_minibatches": 4})
  _, b, lb = run_steps(small_cfg(**kw), 5)
  _, nb, lnb = run_steps(small_cfg(**kw, **{"nonblocking.enabled": True}), 5)
  chex.assert_trees_all_close(b.params, nb.params, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lb, lnb, rtol=1e-5)


def _finished_counts(cfg, step):
  s = train.setup(cfg)
  host = train.make_host(s)
  for t in range(step + 1):
    inputs = host.inputs(t)
  return inputs.count


def _minibatch_grads(s, cfg, kernel, bias, worker, step):
  images = np.asarray(s.worker_data.images, np.float64).reshape(cfg.num_workers, -1, 784) / 255.
  labels = np.asarray(s.worker_data.labels)
  idx = np.asarray(train.sample_batch_indices(
      train.data_key(cfg.seed, worker), jnp.int32(int(s.worker_data.sizes[worker])),
      labels.shape[1], cfg.batch_size, jnp.int32(step)))
  m = cfg.nonblocking.num_minibatches
  per = cfg.batch_size // m
  return [logreg_grads_numpy(kernel, bias, images[worker, idx[j * per:(j + 1) * per]],
                             labels[worker, idx[j * per:(j + 1) * per]]) for j in range(m)]


def test_nonblocking_allreduce_weights_by_finished_counts():
  """g = sum_i sum_{j < m_i} g_ij / sum_i m_i (He & Dube 2022), against numpy."""
  cfg = small_cfg(algorithm="allreduce", model="logreg", num_workers=3, batch_size=8,
                  momentum=0.0, learning_rate=0.5,
                  **{"nonblocking.enabled": True, "nonblocking.num_minibatches": 4,
                     "nonblocking.deadline": "kth:2"})
  cfg.cluster.slowdown = (1.0, 1.6, 3.5)  # full batch at 0.04, 0.064, 0.14 s
  counts = _finished_counts(cfg, 0)
  np.testing.assert_array_equal(counts, [4, 4, 1])  # deadline = 2nd fastest full batch
  s, state, _ = run_steps(cfg, 1)
  p0 = train.init_state(s).params["params"]["Dense_0"]
  k, b = np.asarray(p0["kernel"][0], np.float64), np.asarray(p0["bias"][0], np.float64)
  gk, gb, total = 0.0, 0.0, 0
  for i in range(3):
    grads = _minibatch_grads(s, cfg, k, b, i, 0)
    for j in range(counts[i]):
      gk, gb, total = gk + grads[j][0], gb + grads[j][1], total + 1
  got = state.params["params"]["Dense_0"]
  for i in range(3):
    np.testing.assert_allclose(np.asarray(got["kernel"][i]), k - 0.5 * gk / total, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got["bias"][i]), b - 0.5 * gb / total, atol=1e-5)


@pytest.mark.parametrize("order", ["atc", "parallel"])
def test_nonblocking_dpsgd_straggler_only_gossips(order):
  """Decentralized form: a worker with no finished mini-batch takes no gradient step but
  still gossips; the others step with the mean of their own finished mini-batches
  (``parallel``: x_i <- sum_j W_ij x_j + u_i; ``atc``: x_i <- sum_j W_ij (x_j + u_j))."""
  n = 4
  cfg = small_cfg(algorithm="dpsgd", model="logreg", num_workers=n, batch_size=8,
                  momentum=0.9, learning_rate=0.5,
                  **{"nonblocking.enabled": True, "nonblocking.num_minibatches": 2,
                     "dpsgd.order": order})
  cfg.cluster.slowdown = (1.0, 1.0, 1.0, 100.0)
  counts = _finished_counts(cfg, 0)
  np.testing.assert_array_equal(counts, [2, 2, 2, 0])
  s, state, _ = run_steps(cfg, 1)
  p0 = train.init_state(s).params["params"]["Dense_0"]
  k0, b0 = np.asarray(p0["kernel"], np.float64), np.asarray(p0["bias"], np.float64)
  w = topology.ring(n).mixing_matrix
  got = state.params["params"]["Dense_0"]
  uk, ub = np.zeros_like(k0), np.zeros_like(b0)  # u_i: -0.5 x the mean finished gradient
  for i in range(n):
    if counts[i]:
      grads = _minibatch_grads(s, cfg, k0[i], b0[i], i, 0)
      uk[i] = -0.5 * np.mean([g[0] for g in grads], axis=0)
      ub[i] = -0.5 * np.mean([g[1] for g in grads], axis=0)
  for i in range(n):
    if order == "parallel":
      mk, mb = np.einsum("j,jab->ab", w[i], k0) + uk[i], w[i] @ b0 + ub[i]
    else:
      mk, mb = np.einsum("j,jab->ab", w[i], k0 + uk), w[i] @ (b0 + ub)
    np.testing.assert_allclose(np.asarray(got["kernel"][i]), mk, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got["bias"][i]), mb, atol=1e-5)
  # the straggler's momentum buffer stayed at zero: no gradient step at all
  trace = state.opt_state[1][0].trace["params"]["Dense_0"]["kernel"]
  assert float(jnp.abs(trace[3]).max()) == 0.0
  assert float(jnp.abs(trace[0]).max()) > 0.0


def test_sim_time_closed_form_for_blocking_allreduce():
  """Homogeneous cluster, no delay: each step costs B * time_per_example + 2 (n - 1) latency
  + 2 (n - 1) / n * S / bandwidth, whatever M."""
  n, m = 4, 2
  cfg = small_cfg(algorithm="allreduce", num_workers=n, num_steps=6, eval_every=3,
                  **{"nonblocking.num_minibatches": m})
  cfg.cluster.time_per_example = 1e-3
  cfg.cluster.latency = 1e-3
  cfg.cluster.bandwidth = 1e6
  summary = train.train(cfg)
  s_bytes = 4 * summary["model_params"]
  per_step = cfg.batch_size * 1e-3 + 2 * (n - 1) * 1e-3 + 2 * (n - 1) / n * s_bytes / 1e6
  assert [h["sim_time"] for h in summary["history"]] == pytest.approx(
      [0.0, 3 * per_step, 6 * per_step], rel=1e-9)


@pytest.mark.slow
def test_nonblocking_is_faster_on_a_straggler_cluster():
  """With random straggler delays a non-blocking step ends at the fastest worker's time."""
  kw = dict(algorithm="allreduce", num_workers=8, num_steps=10, eval_every=10,
            **{"nonblocking.num_minibatches": 4})
  times = {}
  for nb in (False, True):
    cfg = small_cfg(**kw, **{"nonblocking.enabled": nb})
    cfg.cluster.delay = "bernoulli_exponential"
    cfg.cluster.delay_prob = 0.2
    cfg.cluster.delay_mean = 0.05
    times[nb] = train.train(cfg)["sim_time"]
  assert times[True] < 0.8 * times[False]


@pytest.mark.parametrize("key,value,needle", [
    ("nonblocking.num_minibatches", 0, "config.nonblocking.num_minibatches=0 is not allowed"),
    ("nonblocking.num_minibatches", 3, "batch_size divisible by num_minibatches"),  # on below
    ("cluster.delay_mean", -0.1, "config.cluster.delay_mean=-0.1 is not allowed"),
    ("cluster.slowdown", (1.0, -2.0, 1.0, 1.0), "config.cluster.slowdown"),
    ("nonblocking.deadline", "0.001", "config.nonblocking.deadline=0.001 is not allowed: no "
                                      "worker can finish a mini-batch before it"),
    ("nonblocking.deadline", "kth:9", "config.nonblocking.deadline"),
])
def test_bad_nonblocking_input(key, value, needle):
  cfg = small_cfg(num_workers=4, batch_size=8, **{"nonblocking.enabled": True})
  sec, k = key.split(".")
  cfg[sec][k] = value
  with pytest.raises(config_lib.ConfigError, match=None) as e:
    config_lib.validate(cfg)
  assert any(needle in line for line in e.value.errors), e.value.errors
