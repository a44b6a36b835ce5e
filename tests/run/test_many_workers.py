"""Many workers per device: the mesh backend with k workers on each of n / k devices
(``shard_map`` over devices around ``vmap`` over local workers) gives the simulate backend's
numbers, with collectives (ring shifts, matchings, all-gathers) crossing device boundaries."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from nbsgd_jax import train
from nbsgd_jax.communications import collectives
from nbsgd_jax import config as config_lib

from tests.helpers import (assert_histories_close, hierarchical, run_steps,
                           run_steps_with_targets, small_cfg)

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


@pytest.mark.parametrize("d,k", [(4, 3), (8, 2), (2, 4)])
def test_permute_and_all_gather_over_device_and_local_axes(d, k):
  n = d * k
  ax = ("devices", "workers")
  rng = np.random.default_rng(d * 10 + k)
  x = jnp.asarray(rng.standard_normal((n, 5)), jnp.float32)
  perm = rng.permutation(n)
  pairs = [(j, int(perm[j])) for j in range(n)]
  out = hierarchical(lambda v: collectives.permute(v, ax, pairs), d, k)(x)
  ref = np.empty((n, 5), np.float32)
  ref[perm] = np.asarray(x)  # worker perm[j] receives worker j's value
  np.testing.assert_array_equal(out, ref)
  gathered = hierarchical(lambda v: collectives.all_gather(v, ax), d, k)(x)
  np.testing.assert_array_equal(gathered, np.broadcast_to(np.asarray(x), (n, n, 5)))
  idx = hierarchical(lambda v: lax.axis_index(ax) + 0 * v[0].astype(jnp.int32), d, k)(x)
  np.testing.assert_array_equal(idx, np.arange(n))
  ring = hierarchical(lambda v: collectives.ring_all_reduce(v, ax), d, k)(x)
  np.testing.assert_allclose(ring, np.broadcast_to(np.asarray(x).sum(0), (n, 5)), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("n,algorithm,extra", [  # n = 64: the long tier, but one case
    pytest.param(64, "dpsgd", {"topology": "exponential"}, marks=pytest.mark.long),
    # time-varying W_t: the phase is one value (a pmax over the device and local axes)
    pytest.param(16, "dpsgd", {"topology": "one_peer_exponential"}, marks=pytest.mark.long),
    pytest.param(64, "allreduce", {"compression.name": "top_k", "compression.density": 0.05},
                 marks=pytest.mark.long),
    (64, "dpsgd", {"consensus.control": True, "consensus.target": 1e-4,
                   "consensus.max_gossip_steps": 3, "nonblocking.enabled": True,
                   "nonblocking.num_minibatches": 2}),
    # 2(n - 1) ring rounds and MATCHA's matchings: compile time grows with n, so 16 = 8 x 2
    pytest.param(16, "allreduce_ring", {}, marks=pytest.mark.long),
    pytest.param(16, "matcha", {"topology": "torus"}, marks=pytest.mark.long),
])
def test_many_workers_on_8_devices_match_simulate(n, algorithm, extra):
  kw = dict(algorithm=algorithm, num_workers=n, batch_size=4, **extra)
  if extra.get("consensus.control"):
    sim = run_steps_with_targets(small_cfg(backend="simulate", **kw), 3)
    mesh = run_steps_with_targets(small_cfg(backend="mesh", **kw), 3)
    chex.assert_trees_all_close(sim.params, jax.device_get(mesh.params), rtol=1e-4, atol=1e-5)
    return
  s, mesh, lm = run_steps(small_cfg(backend="mesh", **kw), 3)
  assert s.backend.axis_name == ("devices", "workers")
  assert len(jax.tree.leaves(mesh.params)[0].sharding.device_set) == 8
  _, sim, ls = run_steps(small_cfg(backend="simulate", **kw), 3)
  np.testing.assert_allclose(lm, ls, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(sim.params, jax.device_get(mesh.params), rtol=1e-4, atol=1e-5)


def test_train_loop_with_many_workers_per_device():
  kw = dict(algorithm="dpsgd", num_workers=16, num_steps=6, eval_every=3, workers_per_device=4)
  mesh = train.train(small_cfg(backend="mesh", **kw))
  sim = train.train(small_cfg(backend="simulate", **kw))
  assert_histories_close(mesh, sim, ("train_loss", "test_accuracy", "consensus_distance",
                                     "bytes_sent", "sim_time"))


def test_workers_per_device_choice_and_errors():
  assert train.workers_per_device(64, 8) == 8
  assert train.workers_per_device(12, 8) == 2
  assert train.workers_per_device(8, 8) == 1
  assert train.workers_per_device(16, 8, 4) == 4
  with pytest.raises(ValueError, match="workers_per_device=3 is not allowed"):
    train.workers_per_device(16, 8, 3)
  with pytest.raises(config_lib.ConfigError, match="config.workers_per_device=1 is not allowed"):
    config_lib.validate(small_cfg(backend="mesh", num_workers=16, workers_per_device=1))
