"""Tests for nbsgd_jax.communications.collectives: ring all-reduce and gossip under vmap and shard_map."""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from nbsgd_jax.communications import collectives
from nbsgd_jax import topology

AXIS = "workers"


def _run_vmap(f: Callable[[Any], Any], x: Any) -> Any:
  """Run a one-worker program over the leading axis of every leaf of ``x`` with vmap."""
  return jax.jit(jax.vmap(f, axis_name=AXIS))(x)


def _run_mesh(f: Callable[[Any], Any], x: Any) -> Any:
  """Run a one-worker program with shard_map, one worker per host device."""
  n = jax.tree_util.tree_leaves(x)[0].shape[0]
  mesh = jax.make_mesh((n,), (AXIS,), devices=jax.devices()[:n])
  x = jax.device_put(x, NamedSharding(mesh, P(AXIS)))

  def per_device(xb):
    out = f(jax.tree_util.tree_map(lambda leaf: leaf[0], xb))
    return jax.tree_util.tree_map(lambda leaf: leaf[None], out)

  fn = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
  return jax.jit(fn)(x)


RUNNERS = {"vmap": _run_vmap, "mesh": _run_mesh}


def _psum(x):
  return lax.psum(x, AXIS)


def _rand(n: int, shape: tuple[int, ...], seed: int = 0, dtype=np.float32) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal((n, *shape)).astype(dtype)


def _count_prims(f: Callable[[Any], Any], x: Any, n: int) -> dict[str, int]:
  """Primitive counts in the one-worker program (the axis bound to size ``n``)."""
  jaxpr = jax.make_jaxpr(f, axis_env=[(AXIS, n)])(x)
  counts: dict[str, int] = {}
  for eqn in jaxpr.jaxpr.eqns:
    counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
  return counts


# ------------------------------------------------------------------ ring all-reduce


@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("length", [1, 5, 13, 1001])
def test_ring_all_reduce_matches_psum_vmap(n, length):
  x = _rand(n, (length,), seed=n * 10_000 + length)
  got = _run_vmap(collectives.ring_all_reduce, x)
  want = _run_vmap(_psum, x)
  chex.assert_trees_all_equal_shapes_and_dtypes(got, want)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)
  # The sum itself (not only agreement with psum).
  chex.assert_trees_all_close(got[0], x.sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [3, 8])
def test_ring_all_reduce_2d_and_pytree_vmap(n):
  x = {"w": _rand(n, (7, 5), seed=1), "b": _rand(n, (3,), seed=2),
       "s": _rand(n, (), seed=3)}
  got = _run_vmap(collectives.ring_all_reduce, x)
  want = _run_vmap(_psum, x)
  chex.assert_trees_all_equal_shapes_and_dtypes(got, want)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)
  got2d = _run_vmap(collectives.ring_all_reduce, x["w"])
  chex.assert_shape(got2d, (n, 7, 5))
  chex.assert_trees_all_close(got2d, want["w"], rtol=1e-5, atol=1e-5)


def test_ring_all_reduce_int_exact_and_dtype():
  x = np.arange(8 * 11, dtype=np.int32).reshape(8, 11)
  got = _run_vmap(collectives.ring_all_reduce, x)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(x.sum(0), x.shape))


def test_ring_all_reduce_n1_identity():
  x = _rand(1, (4, 3))
  chex.assert_trees_all_equal(_run_vmap(collectives.ring_all_reduce, x), x)


@pytest.mark.parametrize("n", [3, 8])
def test_ring_all_reduce_matches_psum_mesh(n):
  x = {"a": _rand(n, (1,), seed=4), "b": _rand(n, (13,), seed=5),
       "c": _rand(n, (9, 111), seed=6)}
  got = _run_mesh(collectives.ring_all_reduce, x)
  want = _run_mesh(_psum, x)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)
  for k in ("a", "b", "c"):  # one ring per leaf too
    got_k = _run_mesh(collectives.ring_all_reduce, x[k])
    chex.assert_trees_all_close(got_k, want[k], rtol=1e-5, atol=1e-5)
  vm = _run_vmap(collectives.ring_all_reduce, x)  # backends agree
  chex.assert_trees_all_close(got, vm, rtol=1e-6, atol=1e-6)


def test_ring_all_reduce_uses_2n_minus_2_ppermutes():
  counts = _count_prims(collectives.ring_all_reduce, jnp.ones((100,)), 8)
  assert counts.get("ppermute", 0) == 14
  assert "psum" not in counts and "all_gather" not in counts


def test_ring_all_reduce_bytes():
  assert collectives.ring_all_reduce_bytes(800.0, 8) == pytest.approx(1400.0)
  assert collectives.ring_all_reduce_bytes(100, 1) == 0.0
  assert collectives.ring_all_reduce_bytes(100, 2) == pytest.approx(100.0)
  with pytest.raises(ValueError):
    collectives.ring_all_reduce_bytes(100, 0)


# ------------------------------------------------------------------ gossip


def _random_topology() -> topology.Topology:
  rng = np.random.default_rng(7)
  n = 6
  pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
  pick = rng.choice(len(pairs), size=7, replace=False)
  return topology.from_edges(n, [pairs[k] for k in pick])


def _topologies() -> list[tuple[str, np.ndarray]]:
  out = []
  for n in (1, 2, 3, 5, 8):
    out.append((f"ring{n}", topology.ring(n).mixing_matrix))
    out.append((f"complete{n}", topology.complete(n).mixing_matrix))
  out.append(("random6", _random_topology().mixing_matrix))
  # Not symmetric, only row stochastic: gossip does not require symmetry.
  rng = np.random.default_rng(3)
  a = rng.random((4, 4)) * (rng.random((4, 4)) < 0.6) + np.eye(4)
  out.append(("asym4", a / a.sum(axis=1, keepdims=True)))
  return out


TOPOS = _topologies()


def _model(n: int, seed: int = 0) -> dict[str, np.ndarray]:
  return {"w": _rand(n, (3, 4), seed=seed), "b": _rand(n, (5,), seed=seed + 1)}


def _dense_ref(w: np.ndarray, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k: np.einsum("ij,j...->i...", w, v.astype(np.float64)).astype(v.dtype)
          for k, v in x.items()}


@pytest.mark.parametrize("backend", ["vmap", "mesh"])
@pytest.mark.parametrize("name,w", TOPOS, ids=[t[0] for t in TOPOS])
def test_gossip_matches_dense(backend, name, w):
  del name
  n = w.shape[0]
  x = _model(n, seed=n)
  got = RUNNERS[backend](lambda v: collectives.gossip(v, w), x)
  chex.assert_trees_all_equal_shapes_and_dtypes(got, x)
  chex.assert_trees_all_close(got, _dense_ref(w, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,w", TOPOS[-4:], ids=[t[0] for t in TOPOS[-4:]])
def test_gossip_dense_equals_gossip(name, w):
  del name
  x = _model(w.shape[0], seed=11)
  a = _run_vmap(lambda v: collectives.gossip(v, w), x)
  b = _run_vmap(lambda v: collectives.gossip_dense(v, w), x)
  chex.assert_trees_all_close(a, b, rtol=1e-5, atol=1e-5)
  c = _run_mesh(lambda v: collectives.gossip_dense(v, w), x)
  chex.assert_trees_all_close(a, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("topo", [topology.ring(8), topology.complete(5), _random_topology()],
                         ids=["ring8", "complete5", "random6"])
def test_gossip_preserves_mean(topo):
  x = _model(topo.n, seed=21)
  got = _run_vmap(lambda v: collectives.gossip(v, topo), x)  # a Topology is accepted too
  chex.assert_trees_all_close(jax.tree_util.tree_map(lambda a: a.mean(0), got),
                              jax.tree_util.tree_map(lambda a: a.mean(0), x),
                              rtol=1e-5, atol=1e-5)


def test_gossip_ring_is_two_ppermutes():
  w = topology.ring(8).mixing_matrix
  counts = _count_prims(lambda v: collectives.gossip(v, w), jnp.ones((10,)), 8)
  assert counts.get("ppermute", 0) == 2
  assert "all_gather" not in counts


def test_gossip_shifts():
  assert collectives.gossip_shifts(topology.ring(8).mixing_matrix) == [1, 7]
  assert collectives.gossip_shifts(topology.ring(2).mixing_matrix) == [1]
  assert collectives.gossip_shifts(topology.ring(1).mixing_matrix) == []
  assert collectives.gossip_shifts(topology.complete(4).mixing_matrix) == [1, 2, 3]
  assert collectives.gossip_shifts(np.eye(5)) == []


def test_gossip_bytes():
  assert collectives.gossip_bytes(100.0, topology.ring(8)) == pytest.approx(200.0)
  assert collectives.gossip_bytes(100.0, topology.complete(5).mixing_matrix) == pytest.approx(400.0)
  assert collectives.gossip_bytes(100.0, topology.ring(1)) == 0.0
  t = _random_topology()
  assert collectives.gossip_bytes(10.0, t) == pytest.approx(10.0 * t.mean_degree)


def test_gossip_bad_matrix_raises():
  x = jnp.ones((3, 4))
  with pytest.raises(ValueError, match="shape"):
    _run_vmap(lambda v: collectives.gossip(v, topology.ring(4).mixing_matrix), x)
  with pytest.raises(ValueError, match="shape"):
    _run_vmap(lambda v: collectives.gossip(v, np.ones((3, 2)) / 2), x)
  with pytest.raises(ValueError, match="shape"):
    _run_vmap(lambda v: collectives.gossip_dense(v, np.ones((2, 2)) / 2), x)
  with pytest.raises(ValueError):
    collectives.gossip_shifts(np.ones((3,)))
