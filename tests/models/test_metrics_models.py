"""Consensus distance against dense numpy; model shapes; topology basics."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax import models, topology
from nbsgd_jax.core import metrics


def _random_tree(rng, n):
  return {"a": rng.normal(size=(n, 3, 4)).astype(np.float32),
          "b": {"c": rng.normal(size=(n, 7)).astype(np.float32)}}


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_consensus_distance_matches_numpy(n):
  rng = np.random.default_rng(n)
  tree = _random_tree(rng, n)
  flat = np.concatenate([tree["a"].reshape(n, -1), tree["b"]["c"].reshape(n, -1)], axis=1)
  expected = np.sqrt(np.mean(np.sum((flat - flat.mean(0)) ** 2, axis=1)))
  got = metrics.consensus_distance(jax.tree.map(jnp.asarray, tree))
  np.testing.assert_allclose(float(got), expected, rtol=1e-5, atol=1e-6)


def test_consensus_distance_zero_and_shift_invariant():
  rng = np.random.default_rng(0)
  one = rng.normal(size=(1, 10)).astype(np.float32)
  assert float(metrics.consensus_distance({"w": jnp.tile(one, (4, 1))})) == 0.0
  tree = {"w": jnp.asarray(rng.normal(size=(4, 10)).astype(np.float32))}
  shifted = {"w": tree["w"] + 100.0 * jnp.asarray(one)}
  np.testing.assert_allclose(float(metrics.consensus_distance(tree)),
                             float(metrics.consensus_distance(shifted)), rtol=1e-4)


def test_consensus_distance_bad_input():
  with pytest.raises(ValueError, match="empty"):
    metrics.consensus_distance({})
  with pytest.raises(ValueError, match="leading worker axis"):
    metrics.consensus_distance({"a": jnp.zeros((2, 3)), "b": jnp.zeros((3, 3))})


@pytest.mark.slow
@pytest.mark.parametrize("name", models.IMAGE_MODELS)
def test_models_output_shape(name):
  m = models.make_model(name, 10, depth=8)
  x = jnp.zeros((5, 28, 28, 1))
  params, state = models.init(m, jax.random.key(0), x)
  chex.assert_shape(models.apply_eval(m, params, state, x), (5, 10))
  logits, _ = models.apply_train(m, params, state, x)
  chex.assert_shape(logits, (5, 10))
  assert models.num_params(params) > 0


@pytest.mark.slow
def test_transformer_is_causal():
  m = models.make_model("transformer", 11, lm=models.LMSizes(context=6, d_model=16,
                                                               num_heads=2))
  x = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 11
  params, state = models.init(m, jax.random.key(0), x)
  assert state == {}
  logits = m.apply(params, x)
  chex.assert_shape(logits, (2, 6, 11))
  y = x.at[:, 4].set(0)  # changing token 4 changes no prediction before position 4
  np.testing.assert_allclose(m.apply(params, y)[:, :4], logits[:, :4], rtol=1e-6, atol=1e-6)
  assert not np.allclose(m.apply(params, y)[:, 4:], logits[:, 4:])


def test_unknown_model():
  with pytest.raises(ValueError, match="model='resnet9000'"):
    models.make_model("resnet9000", 10)


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_ring_and_complete_mixing(n):
  for topo in (topology.ring(n), topology.complete(n)):
    w = topo.mixing_matrix
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(0), 1.0)
    assert (w >= 0).all()
  np.testing.assert_allclose(topology.complete(n).mixing_matrix, np.full((n, n), 1.0 / n))
  assert topology.spectral_gap(topology.complete(n).mixing_matrix) == pytest.approx(1.0)
  if n >= 3:
    # ring with MH weights: W = I/3 + (P + P^T)/3; eigenvalues (1 + 2 cos(2 pi k / n)) / 3.
    eig = (1 + 2 * np.cos(2 * np.pi * np.arange(1, n) / n)) / 3
    assert topology.slem(topology.ring(n).mixing_matrix) == pytest.approx(np.abs(eig).max())


def test_topology_bad_input():
  with pytest.raises(ValueError, match="n=0"):
    topology.ring(0)
  with pytest.raises(ValueError, match="topology='moebius'"):
    topology.make("moebius", 4)
  with pytest.raises(ValueError, match="self loop"):
    topology.from_edges(3, [(1, 1)])
  with pytest.raises(ValueError, match="out of range"):
    topology.from_edges(3, [(0, 3)])
