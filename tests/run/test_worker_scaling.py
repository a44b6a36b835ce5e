"""Thousands of workers on one device: a step's device program and host work are linear in n.

* Device: no intermediate of a vmapped worker step (D-PSGD on a static and a time-varying W,
  CHOCO-SGD's compressed gossip, MATCHA, all-reduce) has two dimensions of size n, and no host
  constant of the program does (walks the jaxpr with its sub-jaxprs: cond branches, loops).
* Host: the clock's rounds hold neighbour lists, not ``[n, n]`` matrices (peak memory of a
  step's clock work measured with ``tracemalloc``), with the same results as the dense
  adjacency they replace (independent dense references).
"""

import tracemalloc

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax.host import cluster as cl
from nbsgd_jax import train
from nbsgd_jax.communications import collectives
from nbsgd_jax.topology import matcha as matcha_lib
from nbsgd_jax.run import step as step_lib
from nbsgd_jax import topology as topology_lib
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.communications import AllReduce, CompressedGossip, Gossip, Matchings
from nbsgd_jax.host import parts as host_parts
from nbsgd_jax.transforms import CONTEXT_AXES, StepContext
from nbsgd_jax.host.parts import HostInputs

from tests.helpers import hierarchical, make_stepper, small_cfg

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

N = 256  # workers of the jaxpr checks; no model dimension is N (MLP 784-32-10, batch 2)


def _timing_plan(n, edges, budget):
  """MATCHA's plan without its SDPs (they take minutes at n = 256): the real matchings."""
  ms = matcha_lib.matching_decomposition(n, edges)
  return matcha_lib.MatchaPlan(n=n, matchings=ms, probs=np.full(len(ms), float(budget)),
                               alpha=1.0 / (len(ms) + 1), rho=float("nan"), laplacians=None)


def _square_values(jaxpr, n, where="", out=None, operands=True):
  """``(where, primitive, shape)`` of every value of ``jaxpr`` (and its sub-jaxprs) with two or
  more dimensions of size ``n``: the results of every equation and, with ``operands``, what
  they read (the top-level inputs excepted: the test of the failures checks them)."""
  out = [] if out is None else out
  inputs = set(map(id, jaxpr.invars)) if not where else set()

  def square(v):
    shape = getattr(getattr(v, "aval", None), "shape", ())
    return sum(d == n for d in shape) >= 2

  for eqn in jaxpr.eqns:
    seen = list(eqn.outvars)
    if operands:
      seen += [v for v in eqn.invars if isinstance(v, jcore.Var) and id(v) not in inputs]
    for v in seen:
      if square(v):
        out.append((where, str(eqn.primitive), tuple(v.aval.shape)))
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (list, tuple)) else [p]):
        if isinstance(sub, jcore.ClosedJaxpr):
          out += [(where + "/" + str(eqn.primitive), "const", tuple(np.shape(c)))
                  for c in sub.consts if sum(d == n for d in np.shape(c)) >= 2]
          _square_values(sub.jaxpr, n, where + "/" + str(eqn.primitive), out, operands)
        elif isinstance(sub, jcore.Jaxpr):
          _square_values(sub, n, where + "/" + str(eqn.primitive), out, operands)
  return out


def _step_jaxpr(monkeypatch, **overrides):
  monkeypatch.setattr(matcha_lib, "plan", _timing_plan)
  cfg = small_cfg(num_workers=N, batch_size=2, **overrides)
  s = train.setup(cfg)
  host = train.make_host(s)
  inputs = host.inputs(0)
  ctx = train.device_context(s, inputs)
  fn = s.backend.spmd(train.make_worker_step(s, True), (0, 0, CONTEXT_AXES))
  return jax.make_jaxpr(fn)(train.init_state(s), s.worker_data, ctx)


CASES = {
    "dpsgd_ring": dict(algorithm="dpsgd", topology="ring"),
    "dpsgd_time_varying": dict(algorithm="dpsgd", topology="one_peer_exponential"),
    "dpsgd_exponential": dict(algorithm="dpsgd", topology="exponential"),
    "choco_time_varying": dict(algorithm="choco_sgd", topology="one_peer_exponential",
                               **{"compression.name": "top_k", "compression.density": 0.1}),
    "matcha": dict(algorithm="matcha", topology="ring"),
    "allreduce": dict(algorithm="allreduce"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_vmapped_step_has_no_n_by_n_value(monkeypatch, case):
  closed = _step_jaxpr(monkeypatch, **CASES[case])
  found = _square_values(closed.jaxpr, N)
  found += [("", "const", tuple(np.shape(c))) for c in closed.consts
            if sum(d == N for d in np.shape(c)) >= 2]
  assert not found, found[:10]


@pytest.mark.parametrize("case", ["dpsgd_time_varying", "matcha", "choco_time_varying"])
def test_vmapped_step_under_failures_makes_no_n_by_n_value(monkeypatch, case):
  """``alive`` ``[n]`` goes in once, unbatched (``CONTEXT_AXES``), not as ``[n, n]`` per-worker
  copies; the step reads O(degree) entries of it and makes nothing of size ``[n, n]``."""
  closed = _step_jaxpr(monkeypatch, **CASES[case], **{"cluster.failures": "3:0:5,17:0:2"})
  assert [v.aval.shape for v in closed.jaxpr.invars if v.aval.shape == (N,) * 2] == []
  found = _square_values(closed.jaxpr, N)
  found += [("", "const", tuple(np.shape(c))) for c in closed.consts
            if sum(d == N for d in np.shape(c)) >= 2]
  assert not found, found[:10]


def test_time_varying_gossip_runs_one_phase_under_vmap():
  """The phase is read as one value (collectives.shared): the switch stays a real branch
  (cond on an unbatched index), it does not become a select over every phase."""
  g = Gossip.of_topology(topology_lib.make("one_peer_exponential", 16))
  ctx = StepContext(step=jnp.full((16,), 3, jnp.int32), count=None, total=None, active=None)
  jaxpr = jax.make_jaxpr(jax.vmap(lambda x, c: g.mix(x, c)[0], axis_name=AXIS))(
      jnp.ones((16, 5)), ctx)
  conds = [e for e in jaxpr.jaxpr.eqns if str(e.primitive) == "cond"]
  assert len(conds) == 1 and len(conds[0].params["branches"]) == len(g.plans) == 4
  assert conds[0].invars[0].aval.shape == ()  # the index: one value, not one per worker
  out = jax.vmap(lambda x, c: g.mix(x, c)[0], axis_name=AXIS)(
      jnp.arange(16.0)[:, None] * jnp.ones((16, 5)), ctx)
  w = g.phases[3]
  np.testing.assert_allclose(out[:, 0], w @ np.arange(16.0), rtol=1e-6)


# ---------------------------------------------------------------------------- host


def _random_adjacency(rng, n, p):
  a = rng.random((n, n)) < p
  return a | a.T


@pytest.mark.parametrize("seed", range(4))
def test_neighbour_lists_and_groups_give_the_dense_clock(seed):
  rng = np.random.default_rng(seed)
  n = 9
  dense = _random_adjacency(rng, n, 0.3)
  lists = cl.Neighbours.of_lists([np.flatnonzero(r).tolist() for r in dense])
  np.testing.assert_array_equal(lists.dense(), dense | np.eye(n, dtype=bool))
  alive = rng.random(n) < 0.7
  clocks, compute, comm = rng.random(n), rng.random(n), rng.random(n)
  for collective in (True, False):
    for overlap in (True, False):
      ref = cl.advance_clocks(clocks, compute, comm, dense, collective, overlap)
      got = cl.advance_clocks(clocks, compute, comm, lists, collective, overlap)
      np.testing.assert_array_equal(got, ref)
      # under failures: index lists and a Group against the dense rule
      live_dense = dense & alive[:, None] & alive[None, :]
      np.fill_diagonal(live_dense, True)
      ref = cl.advance_clocks(clocks, compute, comm, live_dense, collective, overlap)
      got = cl.advance_clocks(clocks, compute, comm, cl.live_adjacency(lists, alive),
                              collective, overlap)
      np.testing.assert_array_equal(got, ref)
      everyone = alive[:, None] & alive[None, :]
      np.fill_diagonal(everyone, True)
      ref = cl.advance_clocks(clocks, compute, comm, everyone, collective, overlap)
      got = cl.advance_clocks(clocks, compute, comm, cl.live_adjacency(None, alive),
                              collective, overlap)
      np.testing.assert_array_equal(got, ref)
  finish = np.cumsum(rng.random((n, 3)), axis=1)
  for rule in ("fastest", "kth:2", "kth:4"):
    np.testing.assert_array_equal(cl.deadline(finish, rule, group=lists),
                                  cl.deadline(finish, rule, group=dense))
    group = cl.live_adjacency(None, alive)
    np.testing.assert_array_equal(cl.deadline(finish, rule, group=group),
                                  cl.deadline(finish, rule, group=group.dense()))


def test_adjacency_errors():
  with pytest.raises(ValueError, match="adjacency"):
    cl.advance_clocks(np.zeros(3), np.zeros(3), np.zeros(3), cl.Neighbours(np.zeros((2, 1), int)))
  with pytest.raises(ValueError, match=r"in \[0, 3\)"):
    cl.advance_clocks(np.zeros(3), np.zeros(3), np.zeros(3), cl.Neighbours(np.full((3, 1), 3)))
  with pytest.raises(ValueError, match="Group.members"):
    cl.advance_clocks(np.zeros(3), np.zeros(3), np.zeros(3), cl.Group(np.ones(2, bool)))


@pytest.mark.parametrize("kind", [Gossip, CompressedGossip])
@pytest.mark.parametrize("name", ["ring", "one_peer_exponential", "erdos_renyi"])
def test_gossip_patterns_are_the_graphs_neighbours(kind, name):
  n = 12
  topo = topology_lib.make(name, n, p=0.3, seed=1)
  g = kind.of_topology(topo)
  masks = [(w != 0) & ~np.eye(n, dtype=bool) for w in g.phases]
  if kind is CompressedGossip:
    masks = [np.logical_or.reduce(masks)] * len(masks)
  for t in range(2 * len(masks)):
    pat = g.pattern(t, None)
    assert isinstance(pat.adjacency, cl.Neighbours)
    np.testing.assert_array_equal(pat.adjacency.dense(), masks[t % len(masks)] | np.eye(n, dtype=bool))
    np.testing.assert_array_equal(pat.messages, masks[t % len(masks)].sum(1))


def test_matchings_pattern_is_the_active_matchings():
  n = 10
  topo = topology_lib.make("erdos_renyi", n, p=0.4, seed=2)
  comm = Matchings(_timing_plan(n, topo.edges, 0.5), n)
  rng = np.random.default_rng(0)
  for _ in range(5):
    active = rng.random(len(comm.perms)) < 0.5
    ref = np.eye(n, dtype=bool)  # the dense construction the lists replace
    for j, m in enumerate(comm.plan.matchings):
      if active[j]:
        for a, b in m:
          ref[a, b] = ref[b, a] = True
    pat = comm.pattern(0, active)
    np.testing.assert_array_equal(pat.adjacency.dense(), ref)
    np.testing.assert_array_equal(pat.messages, ref.sum(1) - 1.0)


@pytest.mark.parametrize("kind", [Gossip, CompressedGossip])
def test_gossip_bytes_count_live_neighbours(kind):
  """Bytes under failures: model bytes x live neighbours of W_t (dense numpy reference)."""
  n = 8
  topo = topology_lib.make("one_peer_exponential", n)
  g = kind.of_topology(topo)
  masks = [(w != 0) & ~np.eye(n, dtype=bool) for w in g.phases]
  if kind is CompressedGossip:
    masks = [np.logical_or.reduce(masks)] * len(masks)
  alive = np.array([1, 1, 0, 1, 1, 1, 0, 1], bool)
  x = jnp.ones((n, 3), jnp.float32)
  for t in range(4):
    ctx = StepContext(step=jnp.full((n,), t, jnp.int32), count=None, total=None, active=None,
                      alive=jnp.broadcast_to(jnp.asarray(alive), (n, n)))
    _, report = jax.vmap(lambda v, c: g.mix(v, c), axis_name=AXIS)(x, ctx)
    ref = 12.0 * (masks[t % len(masks)] & alive[None, :]).sum(1) * alive
    np.testing.assert_array_equal(np.asarray(report["bytes_sent"]), ref)


def _clock_peak(comms, n, steps, alive=None):
  """Peak bytes allocated while the clock observes ``steps`` steps of ``comms``."""
  cluster = cl.make_cluster(n, 1)
  clock = host_parts.Clock(cluster, comms)
  reports = []
  for t in range(steps):
    report = {}
    for c in comms:
      report[f"bytes/{c.key}"] = np.full(n, 1e3)
      report[f"rounds/{c.key}"] = np.ones(n, np.int32)
    inputs = HostInputs(t, compute=np.full(n, 1e-3), active=np.ones(3, bool))
    if alive is not None:
      inputs.alive = alive
    reports.append((t, inputs, report))
  tracemalloc.start()
  try:
    for t, inputs, report in reports:
      clock.observe(t, inputs, report, None)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  return peak, clock


def _comms(n):
  return [Gossip.of_topology(topology_lib.make("ring", n), key="ring"),
          Gossip.of_topology(topology_lib.make("one_peer_exponential", n), key="tv"),
          AllReduce(n, key="ar"),
          Matchings(_timing_plan(n, topology_lib.make("ring", n).edges, 0.5), n, key="m")]


@pytest.mark.parametrize("with_failures", [False, True])
def test_a_steps_clock_work_is_linear_in_n(with_failures):
  """A user simulating thousands of workers needs a clock that holds no [n, n] matrix. At
  n = 1024 an [n, n] bool matrix is 1 MiB (float64: 8 MiB); the clock's peak memory (tracemalloc
  counts Python's and numpy's allocations: deterministic, no timing) must stay below it and
  grow like n (it is O(n d): a few [n] vectors and the [n, d] neighbour lists). Measured:
  200 KB at n = 1024 (260 KB with failures), 3.7-3.8 x the peak at n = 256; the bounds sit
  between linear and quadratic with a wide margin: under n^2 bytes, and under 8 x for 4 x the
  workers (linear: <= 4, quadratic: 16)."""
  peaks = {}
  for n in (256, 1024):
    alive = None
    if with_failures:
      alive = np.ones(n, bool)
      alive[[3, 200]] = False
    comms = _comms(n)
    peaks[n], clock = _clock_peak(comms, n, 3, alive)
  assert peaks[1024] < 1024 * 1024, peaks  # one [n, n] bool matrix
  assert peaks[1024] < 8 * peaks[256], peaks
  # the same clocks as with dense adjacencies and the dense failure rule (the previous code)
  up = np.ones(n, bool) if alive is None else alive
  clocks = np.zeros(n)
  for t in range(3):
    compute = np.full(n, 1e-3)
    for c in comms:
      pat = c.pattern(t, np.ones(3, bool))
      adj = np.ones((n, n), bool) if pat.adjacency is None else pat.adjacency.dense()
      adj = adj & up[:, None] & up[None, :]
      np.fill_diagonal(adj, True)
      comm_t = cl.comm_time(clock.cluster, pat.messages * up, np.full(n, 1e3))
      clocks = cl.advance_clocks(clocks, compute, comm_t, adj, pat.collective)
      compute = np.zeros(n)
  np.testing.assert_array_equal(clock.clocks, clocks)


# ---------------------------------------------------------------------------- mesh


def test_permute_over_device_and_local_axes_all_gather_fallback(monkeypatch):
  """An irregular permutation with many local shifts per device shift all-gathers the slots
  (collectives._MAX_LOCAL_SHIFTS); the result is the same permutation."""
  monkeypatch.setattr(collectives, "_MAX_LOCAL_SHIFTS", 1)
  d, k = 4, 3
  n = d * k
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((n, 4)), jnp.float32)
  perm = rng.permutation(n)
  pairs = [(j, int(perm[j])) for j in range(n)]
  out = hierarchical(lambda v: collectives.permute(v, ("devices", "workers"), pairs), d, k)(x)
  ref = np.empty((n, 4), np.float32)
  ref[perm] = np.asarray(x)
  np.testing.assert_array_equal(out, ref)


def test_ring_shift_over_device_and_local_axes_uses_local_ppermutes():
  """A ring shift on a (devices, local) pair: at most two groups (no all-gather)."""
  d, k = 4, 8
  n = d * k
  pairs = [(j, (j + 3) % n) for j in range(n)]
  mesh = jax.make_mesh((d,), ("devices",), devices=jax.devices()[:d])
  f = jax.shard_map(jax.vmap(lambda v: collectives.permute(v, ("devices", "workers"), pairs),
                             axis_name="workers"),
                    mesh=mesh, in_specs=P("devices"), out_specs=P("devices"), check_vma=False)
  x = jax.device_put(jnp.zeros((n, 2)), NamedSharding(mesh, P("devices")))
  text = str(jax.make_jaxpr(f)(x))
  assert "all_gather" not in text
  x = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
  out = hierarchical(lambda v: collectives.permute(v, ("devices", "workers"), pairs), d, k)(x)
  np.testing.assert_array_equal(out[:, 0], np.roll(np.arange(n), 3))


# ------------------------------------------------------------------ double buffer


def _pointers(tree):
  """The device buffers' addresses of every shard of every leaf."""
  return [s.data.unsafe_buffer_pointer() for leaf in jax.tree.leaves(tree)
          for s in leaf.addressable_shards]


@pytest.mark.parametrize("backend", ["mesh", pytest.param("simulate", marks=pytest.mark.long)])
@pytest.mark.parametrize("algorithm", [
    dict(algorithm="dpsgd", topology="ring"),
    pytest.param(dict(algorithm="allreduce"), marks=pytest.mark.long),
    pytest.param(dict(algorithm="local_sgd", **{"local_sgd.local_steps": 2}), marks=pytest.mark.long)])
def test_double_buffer_reuses_two_sets_of_buffers(backend, algorithm):
  """With ``double_buffer`` the parameters alternate between two sets of buffers (the program
  allocates none for them: no fresh ``[n, d]`` buffer and no copy into the donated one), and
  the training is the same as with one set."""
  runs = {}
  for double in (True, False):
    cfg = small_cfg(backend=backend, num_workers=8, double_buffer=double, **algorithm)
    stepper = make_stepper(cfg)
    seen = []
    for t in range(5):
      seen.append(_pointers(stepper.state.params))
      stepper.steps(1)
    seen.append(_pointers(stepper.state.params))
    runs[double] = (jax.device_get(stepper.state.params), seen)
  params, seen = runs[True]
  assert seen[1] != seen[0]
  for t in range(2, len(seen)):
    assert seen[t] == seen[t - 2], f"step {t}: the parameters are in new buffers"
  chex.assert_trees_all_equal(params, runs[False][0])


@pytest.mark.parametrize("double", [True, False])
def test_double_buffer_removes_the_copy_of_the_mixed_parameters(double):
  """D-PSGD's compiled step: one set of buffers needs a copy of the mixed first-layer kernel
  ``[n, 784, 32]`` into the donated buffer; the double buffer none."""
  s = train.setup(small_cfg(num_workers=8, algorithm="dpsgd", topology="ring",
                            double_buffer=double))
  state = train.init_state(s)
  ctx = train.device_contexts(s, [train.make_host(s).inputs(0)])
  program = train.Program(s)._compile(((True, 1),))  # one step: the run's own program
  args = ((state, step_lib.fresh_like(state.params)) if double else (state,)) + (
      s.worker_data, ctx, s.hparams)
  hlo = program.lower(*args).compile().as_text()
  copies = [line for line in hlo.splitlines() if "f32[8,784,32]" in line and " copy(" in line]
  assert len(copies) == (0 if double else 1), copies


def test_double_buffered_step_compiles_once(caplog):
  """The spare buffers are placed as the parameters are, so the step's program is compiled at
  the first step only (a spare committed to its device where the initial state is not made
  the second step compile again)."""
  step_lib.PROGRAMS.clear()  # compiled here, not by an earlier test of the same structure
  stepper = make_stepper(small_cfg(algorithm="dpsgd", topology="ring"))
  with jax.log_compiles(True), caplog.at_level("WARNING"):
    stepper.steps(3)
  compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()
              and "program" in r.getMessage()]
  assert len(compiles) == 1, compiles
