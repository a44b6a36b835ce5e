"""Tests for nbsgd_jax.transforms.error_feedback and collectives.sparse_all_gather."""

from __future__ import annotations


import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from nbsgd_jax.communications import collectives
from nbsgd_jax import transforms as T
from nbsgd_jax.transforms import ErrorFeedbackState, densify, error_feedback

AXIS = "workers"
N = 4


# --- local compressors (independent of nbsgd_jax.codecs) ---------------------------


def topk(x, key, k=3):
  del key
  _, idx = lax.top_k(jnp.abs(x), k)
  return x[idx], idx.astype(jnp.int32)


def padded_topk(x, key, k=3, pad=2):
  """Top-k plus ``pad`` padding slots (index d, value 0): capacity k + pad."""
  vals, idx = topk(x, key, k)
  d = x.shape[0]
  return (jnp.concatenate([vals, jnp.zeros((pad,), x.dtype)]),
          jnp.concatenate([idx, jnp.full((pad,), d, jnp.int32)]))


def identity(x, key):
  del key
  return x, jnp.arange(x.shape[0], dtype=jnp.int32)


# --- numpy references --------------------------------------------------------------------


def np_topk(x, k):
  idx = np.argsort(-np.abs(x), kind="stable")[:k]
  return x[idx], idx


def np_dense(vals, idx, d):
  out = np.zeros(d, np.float64)
  for v, i in zip(vals, idx):
    if 0 <= i < d:
      out[i] += v
  return out


def _tree():
  return {"a": jnp.zeros((3, 4), jnp.float32), "b": jnp.zeros((5,), jnp.float32)}


def _rand_like(tree, key, lead=()):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return jax.tree_util.tree_unflatten(
      treedef, [jax.random.normal(k, lead + l.shape, l.dtype) for k, l in zip(keys, leaves)])


# --- sparse_all_gather -------------------------------------------------------------------


def test_sparse_all_gather_duplicates_and_padding_vmap():
  d = 6
  values = jnp.array([[1., 2., 7.], [3., 4., 7.], [5., 6., 7.], [0.5, 0.25, 7.]])
  # Padding index d (with a nonzero value) must be dropped; index 1 repeats across workers
  # and within worker 3.
  indices = jnp.array([[1, 2, d], [1, 5, d], [0, 1, d], [1, 1, d]], jnp.int32)
  out = jax.jit(jax.vmap(lambda v, i: collectives.sparse_all_gather(v, i, d, AXIS),
                         axis_name=AXIS))(values, indices)
  ref = np.zeros(d)
  for w in range(N):
    ref += np_dense(np.asarray(values[w]), np.asarray(indices[w]), d)
  np.testing.assert_allclose(np.asarray(out), np.broadcast_to(ref, (N, d)), rtol=1e-6)
  chex.assert_shape(out, (N, d))


def test_sparse_all_gather_bad_shapes():
  with pytest.raises(ValueError):
    jax.vmap(lambda v, i: collectives.sparse_all_gather(v, i[:2], 5, AXIS),
             axis_name=AXIS)(jnp.ones((2, 3)), jnp.zeros((2, 3), jnp.int32))


# --- single worker -----------------------------------------------------------------------


@pytest.mark.parametrize("compressor", [topk, padded_topk])
def test_mass_conservation(compressor):
  params = _tree()
  tx = error_feedback(compressor)
  state = tx.init(params)
  update = jax.jit(tx.update)
  key = jax.random.PRNGKey(1)
  for step in range(5):
    key, sub = jax.random.split(key)
    g = _rand_like(params, sub)
    e_old = state.residual
    u, state, _ = update(g, state)
    lhs = jax.tree_util.tree_map(lambda r, s: r + s, state.residual, u)
    rhs = jax.tree_util.tree_map(lambda a, b: a + b, g, e_old)
    chex.assert_trees_all_close(lhs, rhs, atol=1e-6)
    chex.assert_trees_all_equal_shapes_and_dtypes(u, params)
    assert int(state.sent_count) == 3
    # The update is 3-sparse in the flattened tree.
    assert int(jnp.sum(ravel_pytree(u)[0] != 0)) <= 3
  assert isinstance(state, ErrorFeedbackState)
  assert state.sent_count.dtype == jnp.int32


def test_key_is_split_each_update():
  tx = error_feedback(topk, seed=3)
  state = tx.init(_tree())
  _, s1, _ = tx.update(_rand_like(_tree(), jax.random.PRNGKey(0)), state)
  _, s2, _ = tx.update(_rand_like(_tree(), jax.random.PRNGKey(0)), s1)
  assert not np.array_equal(np.asarray(state.key), np.asarray(s1.key))
  assert not np.array_equal(np.asarray(s1.key), np.asarray(s2.key))


@pytest.mark.parametrize("flatten", [True, False])
def test_identity_compressor_is_identity(flatten):
  params = _tree()
  tx = error_feedback(identity, flatten=flatten)
  state = tx.init(params)
  for step in range(3):
    g = _rand_like(params, jax.random.PRNGKey(step))
    u, state, _ = jax.jit(tx.update)(g, state)
    chex.assert_trees_all_close(u, g, atol=0)
    chex.assert_trees_all_close(state.residual, jax.tree_util.tree_map(jnp.zeros_like, g),
                                atol=0)
  assert int(state.sent_count) == 17


def test_no_residual_keeps_zero():
  params = _tree()
  tx = error_feedback(topk, use_residual=False)
  state = tx.init(params)
  for step in range(3):
    g = _rand_like(params, jax.random.PRNGKey(step))
    u, state, _ = jax.jit(tx.update)(g, state)
    chex.assert_trees_all_close(state.residual, jax.tree_util.tree_map(jnp.zeros_like, g),
                                atol=0)
    flat = np.asarray(ravel_pytree(g)[0])
    vals, idx = np_topk(flat, 3)
    np.testing.assert_allclose(np.asarray(ravel_pytree(u)[0]), np_dense(vals, idx, 17),
                               rtol=1e-6)


def test_per_leaf_matches_numpy():
  params = _tree()
  tx = error_feedback(padded_topk, flatten=False)
  state = tx.init(params)
  e_ref = {k: np.zeros(v.shape) for k, v in params.items()}
  for step in range(4):
    g = _rand_like(params, jax.random.PRNGKey(10 + step))
    u, state, _ = jax.jit(tx.update)(g, state)
    for name in ("a", "b"):
      p = np.asarray(g[name], np.float64).reshape(-1) + e_ref[name].reshape(-1)
      vals, idx = np_topk(p, 3)
      dense = np_dense(vals, idx, p.size)
      np.testing.assert_allclose(np.asarray(u[name]).reshape(-1), dense, rtol=1e-5,
                                 atol=1e-6)
      e_ref[name] = (p - dense).reshape(params[name].shape)
      np.testing.assert_allclose(np.asarray(state.residual[name]), e_ref[name], rtol=1e-5,
                                 atol=1e-6)
    assert int(state.sent_count) == 6  # 3 per leaf, padding not counted


# --- n workers -----------------------------------------------------------------------------


def _worker_grads(d=10, steps=3):
  """[steps, N, d] gradients where every worker has a large entry at index 4 (duplicates)."""
  g = np.array(jax.random.normal(jax.random.PRNGKey(7), (steps, N, d)), np.float32)
  g[:, :, 4] += 10.0
  g[:, 1, 7] += 8.0
  g[:, 2, 7] += 8.0
  return g


def _numpy_multiworker(g, k):
  steps, n, d = g.shape
  e = np.zeros((n, d))
  outs, res = [], []
  for t in range(steps):
    dense = np.zeros((n, d))
    for w in range(n):
      p = g[t, w].astype(np.float64) + e[w]
      vals, idx = np_topk(p, k)
      dense[w] = np_dense(vals, idx, d)
      e[w] = p - dense[w]
    outs.append(np.broadcast_to(dense.mean(0), (n, d)).copy())
    res.append(e.copy())
  return np.stack(outs), np.stack(res)


def _worker_program(tx):
  """One worker: runs all steps over its gradients [steps, d]; returns updates, residuals."""

  def run(gs):
    state = tx.init({"w": gs[0]})

    def body(state, g):
      u, state, _ = tx.update({"w": g}, state)
      return state, (u["w"], state.residual["w"], state.sent_count)

    _, out = lax.scan(body, state, gs)
    return out

  return run


def test_multiworker_vmap_matches_numpy():
  g = _worker_grads()  # [steps, N, d]
  tx = error_feedback(padded_topk, axis_name=AXIS)
  u, r, sent = jax.jit(jax.vmap(_worker_program(tx), axis_name=AXIS))(
      jnp.asarray(g.transpose(1, 0, 2)))
  ref_u, ref_r = _numpy_multiworker(g, 3)
  np.testing.assert_allclose(np.asarray(u).transpose(1, 0, 2), ref_u, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(r).transpose(1, 0, 2), ref_r, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(sent), 3)
  # Duplicates did occur: index 4 was sent by every worker in step 0.
  assert abs(ref_u[0, 0, 4]) > 9.0


def test_multiworker_shard_map_matches_numpy():
  g = _worker_grads()
  tx = error_feedback(padded_topk, axis_name=AXIS)
  mesh = jax.make_mesh((N,), (AXIS,), devices=jax.devices()[:N])
  x = jax.device_put(jnp.asarray(g.transpose(1, 0, 2)), NamedSharding(mesh, P(AXIS)))
  prog = _worker_program(tx)

  def per_device(xb):
    out = prog(xb[0])
    return jax.tree_util.tree_map(lambda leaf: leaf[None], out)

  fn = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
  u, r, sent = jax.jit(fn)(x)
  ref_u, ref_r = _numpy_multiworker(g, 3)
  np.testing.assert_allclose(np.asarray(u).transpose(1, 0, 2), ref_u, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(r).transpose(1, 0, 2), ref_r, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(sent), 3)


def test_workers_get_independent_keys():

  def rand_k(x, key):
    idx = jax.random.randint(key, (2,), 0, x.shape[0])
    return x[idx], idx.astype(jnp.int32)

  tx = error_feedback(rand_k, axis_name=AXIS)

  def run(g):
    state = tx.init(g)
    _, state, _ = tx.update(g, state)
    return state.residual

  g = jnp.tile(jnp.arange(1.0, 65.0), (N, 1))
  res = np.asarray(jax.vmap(run, axis_name=AXIS)(g))
  assert len({tuple(r) for r in res}) > 1


# --- composition -------------------------------------------------------------------------


def test_chain_with_sgd_under_jit():
  params = _rand_like(_tree(), jax.random.PRNGKey(42))
  lr, wd = 0.1, 1e-2
  tx = T.chain(error_feedback(topk), optax.add_decayed_weights(wd),
               optax.sgd(lr, momentum=0.9))
  state = tx.init(params)
  g = _rand_like(params, jax.random.PRNGKey(5))

  @jax.jit
  def step(params, state, g):
    u, state, _ = tx.update(g, state, params, None)
    return optax.apply_updates(params, u), state

  new_params, state = step(params, state, g)
  flat_g, unravel = ravel_pytree(g)
  vals, idx = np_topk(np.asarray(flat_g), 3)
  sparse = unravel(jnp.asarray(np_dense(vals, idx, 17), jnp.float32))
  expected = jax.tree_util.tree_map(lambda p, s: p - lr * (s + wd * p), params, sparse)
  chex.assert_trees_all_close(new_params, expected, atol=1e-6)
  assert isinstance(state[0], ErrorFeedbackState)
  new_params, state = step(new_params, state, g)  # second step runs
  chex.assert_tree_all_finite(new_params)


def test_densify_drops_padding_and_negative():
  out = densify(jnp.array([1., 2., 3., 4.]), jnp.array([0, 0, 3, -1]), 3)
  np.testing.assert_allclose(np.asarray(out), [3., 0., 0.])


def test_bad_compressor_raises():
  tx = error_feedback(lambda x, k: (x[:2], jnp.arange(3)))
  with pytest.raises(ValueError):
    tx.update(_tree(), tx.init(_tree()))
