"""Simulated worker failures (``cluster.failures``): all-reduce averages over the live workers,
gossip renormalises the mixing weights over live neighbours, a failed worker keeps its model
(it finished zero mini-batches, the non-blocking rule)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import topology, train
from nbsgd_jax.communications import collectives
from nbsgd_jax.host import cluster
from nbsgd_jax.topology import matcha
from nbsgd_jax import config as config_lib
from nbsgd_jax import transforms as T
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.communications import AllReduce, Gossip, Matchings

from tests.helpers import small_cfg, step_contexts

N, D, LR = 6, 5, 0.1


def _inputs(alive, k=1, step=0):
  """Per-worker contexts: a failed worker finished 0 mini-batches, the live ones 1 each."""
  alive = np.asarray(alive, bool)
  count = alive.astype(np.int32)
  return step_contexts(N, step, count=count, total=count.sum(), active=np.zeros((N, k), bool),
                       alive=jnp.asarray(np.broadcast_to(alive, (N, N))))


def _step(alg, g, x, ctx):
  """One vmapped step of a worker transform: (new params, bytes sent per worker)."""
  state = jax.vmap(alg.init)(x)
  updates, _, report = jax.vmap(alg.update, axis_name=AXIS)(g, state, x, ctx)
  return optax.apply_updates(x, updates), report["bytes_sent"]


def _xg(seed):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((N, D)), jnp.float32),
          jnp.asarray(rng.standard_normal((N, D)), jnp.float32))


def _renormalised(w, alive):
  """Dense numpy reference: W'_ij = W_ij for live i != j, self weight takes the rest; a failed
  worker keeps its model."""
  w2 = np.where(np.outer(alive, alive), w, 0.0)
  np.fill_diagonal(w2, 0.0)
  np.fill_diagonal(w2, 1.0 - w2.sum(axis=1))
  return w2


def test_parse_failures_and_alive_mask():
  f = cluster.parse_failures("3:10:5, 0:0:1", 4)
  assert f == [cluster.Failure(3, 10, 5), cluster.Failure(0, 0, 1)]
  assert cluster.alive_mask(f, 0, 4).tolist() == [False, True, True, True]
  assert cluster.alive_mask(f, 14, 4).tolist() == [True, True, True, False]
  assert cluster.alive_mask(f, 15, 4).all()
  assert cluster.parse_failures("", 4) == []
  for bad in ("3:10", "a:b:c", "4:0:1", "1:-1:2", "1:0:0"):
    with pytest.raises(ValueError, match="cluster.failures"):
      cluster.parse_failures(bad, 4)


@pytest.mark.parametrize("topo", ["ring", "exponential", "erdos_renyi"])
def test_gossip_renormalises_over_live_neighbours(topo):
  w = np.asarray(topology.make(topo, N, p=0.6, seed=1).mixing_matrix)
  x, _ = _xg(0)
  alive = np.array([1, 0, 1, 1, 0, 1], bool)
  out = jax.vmap(lambda v, a: collectives.gossip(v, w, AXIS, a), axis_name=AXIS,
                 in_axes=(0, None))(x, jnp.asarray(alive))
  ref = _renormalised(w, alive) @ np.asarray(x, np.float64)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(out)[~alive], np.asarray(x)[~alive])


def test_dpsgd_step_with_failures_against_numpy():
  w = np.asarray(topology.make("ring", N).mixing_matrix)
  alg = T.gossip_step(T.skip_when_idle(optax.sgd(LR), "local"), Gossip([w]), "parallel")
  x, g = _xg(1)
  alive = np.array([1, 1, 0, 1, 1, 1], bool)
  new, sent = _step(alg, g, x, _inputs(alive))
  ref = _renormalised(w, alive) @ np.asarray(x, np.float64) - LR * np.asarray(g) * alive[:, None]
  np.testing.assert_allclose(np.asarray(new), ref, rtol=1e-5, atol=1e-6)
  nbytes = 4 * D
  # live workers send to live neighbours: 1 and 3 lost neighbour 2; 2 sends nothing
  assert np.asarray(sent).tolist() == [2 * nbytes, nbytes, 0, nbytes, 2 * nbytes, 2 * nbytes]


@pytest.mark.slow
def test_time_varying_gossip_with_failures_counts_live_neighbours():
  """one_peer_exponential (W_t = (I + P_t) / 2): each phase mixes over live partners only and a
  live worker is charged for its live partners, the rule of the static mixer."""
  phases = [np.asarray(w) for w in topology.make("one_peer_exponential", 8).phases]
  comm = Gossip(phases)
  n = len(phases[0])
  x = jnp.asarray(np.random.default_rng(2).standard_normal((n, D)), jnp.float32)
  alive = np.array([1, 1, 0, 1, 1, 1, 0, 1], bool)
  nbytes = 4 * D
  for step in range(len(phases)):
    inputs = step_contexts(n, step, alive=jnp.asarray(np.broadcast_to(alive, (n, n))))
    out, report = jax.vmap(comm.mix, axis_name=AXIS)(x, inputs)
    sent = report["bytes_sent"]
    w = phases[step]
    ref = _renormalised(w, alive) @ np.asarray(x, np.float64)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
    nbrs = (w != 0) & ~np.eye(n, dtype=bool)
    expect = nbytes * (nbrs & alive[None, :]).sum(axis=1) * alive
    np.testing.assert_array_equal(np.asarray(sent), expect)


@pytest.mark.parametrize("ring", [False, True])
def test_allreduce_averages_over_live_workers(ring):
  alg = T.chain(T.mean_of(AllReduce(N, ring=ring, weighted=True)),
                T.skip_when_idle(optax.sgd(LR), "global"))
  x, g = _xg(2)
  x = jnp.broadcast_to(x[0], (N, D))  # replicas
  alive = np.array([1, 0, 1, 1, 1, 0], bool)
  new, sent = _step(alg, g, x, _inputs(alive))
  ref = np.asarray(x[0]) - LR * np.asarray(g)[alive].mean(axis=0)
  np.testing.assert_allclose(np.asarray(new), np.broadcast_to(ref, (N, D)), rtol=1e-5,
                             atol=1e-6)
  assert (np.asarray(sent)[~alive] == 0).all() and (np.asarray(sent)[alive] > 0).all()


def test_matcha_mixing_skips_pairs_with_a_failed_worker():
  topo = topology.make("ring", N)
  plan = matcha.plan(N, topo.edges, 1.0)
  comm = Matchings(plan, N)
  x, _ = _xg(3)
  alive = np.array([1, 1, 1, 0, 1, 1], bool)
  k = len(plan.matchings)
  inputs = _inputs(alive, k)._replace(active=jnp.ones((N, k), bool))
  out, _ = jax.vmap(comm.mix, axis_name=AXIS)(x, inputs)
  lap = np.zeros((N, N))
  for m in plan.matchings:
    for a, b in m:
      if alive[a] and alive[b]:
        lap[a, a] += 1; lap[b, b] += 1; lap[a, b] -= 1; lap[b, a] -= 1
  ref = (np.eye(N) - plan.alpha * lap) @ np.asarray(x, np.float64)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dpsgd", "allreduce"])
def test_training_continues_through_a_failure(algorithm):
  """Worker 1 is down for steps 2..5: its model does not move (dpsgd) or it contributes no
  gradient (allreduce); the run goes on; bytes drop against no failure (the down worker
  sends nothing) and the simulated time does not grow."""
  snaps = {}

  def snap(step, state, setup):
    del setup
    snaps[step] = np.asarray(jax.tree.leaves(state.params)[0][1])

  kw = dict(algorithm=algorithm, num_steps=8, eval_every=8, num_workers=4,
            **{"cluster.failures": "1:2:4"})
  out = train.train(small_cfg(**kw), hooks=(snap,))
  free = train.train(small_cfg(**{**kw, "cluster.failures": ""}))
  assert np.isfinite(out["train_loss"])
  assert out["bytes_sent"] < free["bytes_sent"]
  assert out["sim_time"] <= free["sim_time"] * (1 + 1e-12)
  if algorithm == "dpsgd":
    for t in range(3, 7):  # state after steps 2..5 (0-based): worker 1 frozen
      np.testing.assert_array_equal(snaps[t], snaps[2])
    assert not np.array_equal(snaps[7], snaps[6])  # back after the failure


@pytest.mark.parametrize("override,needle", [
    ({"cluster.failures": "9:0:1"}, "config.cluster.failures='9:0:1' is not allowed"),
    ({"cluster.failures": "1:2"}, "worker:start:duration"),
])
def test_bad_failures_config(override, needle):
  with pytest.raises(config_lib.ConfigError, match=needle):
    config_lib.validate(small_cfg(**override))


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
def test_failures_run_with_local_sgd():
  """``cluster.failures`` works with every algorithm (it used to be refused for local SGD):
  local SGD with a failed worker validates and trains with a finite loss."""
  cfg = small_cfg(algorithm="local_sgd", num_steps=6, eval_every=6,
                  **{"cluster.failures": "1:0:3"})
  config_lib.validate(cfg)
  out = train.train(cfg)
  assert np.isfinite(out["train_loss"])


@pytest.mark.parametrize("group", ["all", "neighbours"])
def test_a_failed_worker_sets_no_deadline(group):
  """Slowdowns (1, 2, 2, 2), the fastest worker down, deadline 'fastest', M = 4: the live
  workers wait for the fastest *live* worker and finish all their mini-batches (the
  hand-computed counts [0, 4, 4, 4]); a failed worker's finish times do not count."""
  cfg = small_cfg(algorithm="dpsgd", num_workers=4, batch_size=8,
                  **{"nonblocking.enabled": True, "nonblocking.num_minibatches": 4,
                     "nonblocking.deadline_group": group, "cluster.failures": "0:0:1"})
  cfg.cluster.slowdown = (1.0, 2.0, 2.0, 2.0)
  host = train.make_host(train.setup(cfg))
  np.testing.assert_array_equal(host.inputs(0).count, [0, 4, 4, 4])
  # back up, it sets the deadline again: for everyone, or on the ring for its neighbours 1, 3
  expected = [4, 2, 2, 2] if group == "all" else [4, 2, 4, 2]
  np.testing.assert_array_equal(host.inputs(1).count, expected)
