"""nbsgd_jax.tx: the algorithms as optax transformations in a user's own training step.

References: D-PSGD's closed form ``X <- W (X - lr G)`` in numpy; and ``train()`` itself, an
independent driver of the same worker transforms (host-drawn contexts, its own data
pipeline, one program per period value), step for step on vmap and on a device mesh.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from nbsgd_jax import config, topology, train, tx
from nbsgd_jax.models import problems
from nbsgd_jax import recipes
from nbsgd_jax.codecs import sparse as compression

N = 4


def _cfg(algorithm, backend, **over):
  c = config.default_config()
  c.update(dict(algorithm=algorithm, backend=backend, num_workers=N, dataset="least_squares",
                num_steps=4, eval_every=4, learning_rate=0.05, momentum=0.0, weight_decay=0.0,
                progress=False, topology="ring", batch_size=16))
  c.problem.update(dict(examples_per_worker=16, dim=6, full_batch=True))
  for k, v in over.items():
    section, _, key = k.rpartition(".")
    (c[section] if section else c)[key] = v
  return c


def _framework(cfg) -> list:
  seen = []
  train.train(cfg, None, hooks=(lambda step, state, s: seen.append(
      np.asarray(jax.device_get(state.params["w"]))),))
  return seen[1:]  # after steps 1, 2, ...


def _user(cfg, opt, backend, extra=lambda step: {}) -> list:
  """A user's loop: one full-batch gradient per worker, ``opt`` from nbsgd_jax.tx (its update
  given ``extra(step)``'s extra arguments, the same on every worker)."""
  s = train.setup(cfg)
  prob = s.dataset
  loss = problems.loss_fn(prob)
  data = (jnp.asarray(prob.features), jnp.asarray(prob.targets))
  params = jax.tree.map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), problems.init_params(prob))
  state = jax.vmap(opt.init, axis_name="w")(params)

  def worker(p, st, d, kw):
    u, st = opt.update(jax.grad(loss)(p, d), st, p, **kw)
    return optax.apply_updates(p, u), st

  if backend == "simulate":
    step = jax.jit(jax.vmap(worker, axis_name="w", in_axes=(0, 0, 0, None)))
  else:
    mesh = jax.make_mesh((N,), ("w",), devices=jax.devices()[:N])
    one = lambda t: jax.tree.map(lambda a: a[0], t)
    step = jax.jit(jax.shard_map(
        lambda p, st, d, kw: jax.tree.map(lambda x: x[None], worker(*map(one, (p, st, d)), kw)),
        mesh=mesh, in_specs=(P("w"), P("w"), P("w"), P()), out_specs=P("w")))
    params, state, data = jax.device_put((params, state, data), NamedSharding(mesh, P("w")))
  out = []
  for t in range(cfg.num_steps):
    params, state = step(params, state, data, extra(t))
    out.append(np.asarray(jax.device_get(params["w"])))
  return out


TOP = functools.partial(compression.top_k, density=0.5)
CASES = {
    "allreduce": ({}, lambda: optax.chain(tx.allreduce_mean(axis_name="w"), optax.sgd(0.05))),
    "dpsgd": ({}, lambda: optax.chain(optax.sgd(0.05), tx.gossip("ring", axis_name="w"))),
    "choco_sgd": ({"compression.name": "top_k", "compression.density": 0.5, "choco.gamma": 0.6},
                  lambda: optax.chain(optax.sgd(0.05), tx.choco(
                      TOP, gamma=0.6, topology="ring", axis_name="w"))),
    "ef_allreduce": ({"compression.name": "top_k", "compression.density": 0.5},
                     lambda: optax.chain(tx.error_feedback(TOP, axis_name="w"), optax.sgd(0.05))),
    "diloco": ({"diloco.local_steps": 2, "diloco.outer_lr": 0.7, "diloco.outer_momentum": 0.9},
               lambda: optax.chain(optax.sgd(0.05), tx.diloco(
                   optax.sgd(0.7, momentum=0.9, nesterov=True), 2, axis_name="w"))),
}
MORE = {  # the other recipes that fit, on vmap only
    "gradient_tracking": ({}, lambda: optax.chain(tx.gradient_tracking("ring", axis_name="w"),
                                                  optax.sgd(0.05), tx.gossip("ring", axis_name="w"))),
    "d2": ({}, lambda: optax.chain(optax.sgd(0.05), tx.d2("ring", axis_name="w"))),
    "local_sgd": ({"local_sgd.local_steps": 3},
                  lambda: optax.chain(optax.sgd(0.05), tx.local_sgd(3, axis_name="w"))),
    "allreduce_ring": ({}, lambda: optax.chain(tx.allreduce_mean(axis_name="w", ring=True),
                                               optax.sgd(0.05))),
    "gossip_pga": ({"gossip_pga.period": 3},
                   lambda: optax.chain(optax.sgd(0.05), tx.gossip_pga(3, "ring", axis_name="w"))),
    "sgp": ({}, lambda: optax.chain(optax.sgd(0.05), tx.sgp("ring", axis_name="w"))),
    "sparta": ({"sparta.density": 0.3}, lambda: optax.chain(optax.sgd(0.05), tx.sparta(
        0.3, axis_name="w", seed=0))),
    "demo": ({"demo.top_k": 2, "demo.chunk_size": 3},
             lambda: optax.chain(tx.demo(0.05, axis_name="w", top_k=2,
                                         chunk_size=3), optax.sgd(0.05))),
    "sparseloco": ({"sparseloco.local_steps": 2, "sparseloco.top_k": 4,
                    "sparseloco.chunk_size": 3, "sparseloco.outer_lr": 0.7},
                   lambda: optax.chain(optax.sgd(0.05), tx.sparseloco(
                       2, axis_name="w", outer_lr=0.7, top_k=4, chunk_size=3))),
    "noloco": ({"noloco.local_steps": 2, "noloco.group_size": 2, "seed": 5,
                "num_steps": 6},
               lambda: optax.chain(optax.sgd(0.05), tx.noloco(2, axis_name="w", seed=5))),
    "streaming_diloco": (  # one parameter array, so one fragment; launch and land apart
        {"diloco.local_steps": 4, "diloco.outer_lr": 0.7, "diloco.outer_momentum": 0.9,
         "streaming_diloco.fragments": 1, "streaming_diloco.delay": 1,
         "streaming_diloco.alpha": 0.5, "num_steps": 9},
        lambda: optax.chain(optax.sgd(0.05), tx.streaming_diloco(
            optax.sgd(0.7, momentum=0.9, nesterov=True), 4, 1, axis_name="w", delay=1,
            alpha=0.5))),
}


def test_matcha_with_the_hosts_activations_equals_train():
  """MATCHA's face, given the activations train() draws (tx.matcha_activations), is MATCHA."""
  cfg = _cfg("matcha", "simulate", **{"matcha.budget": 0.5, "matcha.seed": 3, "num_steps": 6})
  plan = tx.matcha_plan("ring", 0.5, N)
  opt = optax.chain(optax.sgd(0.05), tx.matcha(plan, axis_name="w"))
  got = _user(cfg, opt, "simulate", lambda t: {"active": tx.matcha_activations(plan, 3, t)})
  want = _framework(cfg)
  for a, b in zip(want, got):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
  assert 0 < sum(tx.matcha_activations(plan, 3, t).sum() for t in range(6)) < 6 * 3


@pytest.mark.parametrize("name,over,make", [
    ("epidemic", {"epidemic.rounds": 2, "epidemic.graph_degree": 2, "epidemic.variant": "oracle"},
     lambda: tx.epidemic_mixing(N, 2, variant="oracle", graph_degree=2, seed=5)),
    ("teleportation", {"teleportation.local_steps": 2, "teleportation.sample_size": 2},
     lambda: tx.teleportation_mixing(N, 2, sample_size=2, seed=5))])
def test_a_round_graph_from_the_hosts_draw_equals_train(name, over, make):
  """Epidemic Learning's and Teleportation's faces, given the rounds train() draws
  (tx.mixing_inputs of the same rule), are the algorithms."""
  cfg = _cfg(name, "simulate", **over, seed=5, num_steps=6)
  mixing = make()
  face = getattr(tx, name)(mixing, axis_name="w")
  got = _user(cfg, optax.chain(optax.sgd(0.05), face), "simulate",
              lambda t: {"shared": tx.mixing_inputs(mixing, t)})
  for a, b in zip(_framework(cfg), got):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
  assert np.ptp(got[-1], axis=0).max() > 0


@pytest.mark.parametrize("backend,name", [  # the mesh cases in the slow tier
    (b, n) if b == "simulate" else pytest.param(b, n, marks=pytest.mark.slow)
    for n in CASES for b in ("simulate", "mesh")]
                         + [("simulate", n) for n in MORE])
def test_user_loop_equals_train(name, backend):
  over, make = {**CASES, **MORE}[name]
  cfg = _cfg("allreduce" if name == "ef_allreduce" else name, backend, **over)
  want, got = _framework(cfg), _user(cfg, make(), backend)
  assert len(want) == len(got) == cfg.num_steps
  for a, b in zip(want, got):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
  spread = max(np.ptp(g, axis=0).max() for g in got)  # the workers' models differ at times
  assert (spread == 0) == (name in ("allreduce", "allreduce_ring", "ef_allreduce", "demo"))


def test_every_algorithm_has_an_optax_face_or_says_why():
  """The registry names each algorithm's optax constructor (which the cases above hold to
  train()) or the reason it has none; every lockstep algorithm has one."""
  faces = {name: e.face for name, e in recipes.REGISTRY.items()}
  assert all(e.face is not None or (e.no_face and len(e.no_face) > 20)
             for e in recipes.REGISTRY.values())
  assert {f for f in faces.values() if f} <= set(tx.__all__)
  checked = ({name for name in {**CASES, **MORE} if name in faces}
             | {"matcha", "epidemic", "teleportation"})
  assert checked == {name for name, f in faces.items() if f is not None}
  assert {name for name, e in recipes.REGISTRY.items()
          if e.clock == "lockstep" and e.face is None} == set()


def test_gossip_after_sgd_is_dpsgd_closed_form():
  w = topology.ring(N).mixing_matrix
  x = np.random.default_rng(0).normal(size=(N, 5)).astype(np.float32)
  g = np.random.default_rng(1).normal(size=(N, 5)).astype(np.float32)
  opt = optax.chain(optax.sgd(0.1), tx.gossip("ring", axis_name="w"))

  @functools.partial(jax.vmap, axis_name="w")
  def step(p, s, gr):
    u, s = opt.update(gr, s, p)
    return optax.apply_updates(p, u), s

  new, state = step(jnp.asarray(x), jax.vmap(opt.init, axis_name="w")(jnp.asarray(x)), jnp.asarray(g))
  np.testing.assert_allclose(new, w @ (x - 0.1 * g), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tx.bytes_sent(state), [2 * 5 * 4.0] * N)  # 2 neighbours x 20 B


def test_sgp_after_sgd_is_dpsgd_on_the_one_peer_exponential_graph():
  """tx.sgp without overlap equals tx.gossip over the same doubly stochastic W_t (the push-sum
  weights stay 1) step for step; with overlap it differs (the round carries the model from
  before the step), and a delay without overlap is refused by name."""
  x0 = np.random.default_rng(0).normal(size=(N, 5)).astype(np.float32)
  target = np.random.default_rng(1).normal(size=(N, 5)).astype(np.float32)
  runs = {}
  for name, t in (("gossip", tx.gossip("one_peer_exponential", axis_name="w")),
                  ("sgp", tx.sgp(axis_name="w")),
                  ("overlap", tx.sgp(axis_name="w", overlap=True))):
    opt = optax.chain(optax.sgd(0.1), t)

    @functools.partial(jax.vmap, axis_name="w")
    def step(p, s, c):
      u, s = opt.update(p - c, s, p)  # the gradient of |p - c|^2 / 2
      return optax.apply_updates(p, u), s

    p, s = jnp.asarray(x0), jax.vmap(opt.init, axis_name="w")(jnp.asarray(x0))
    for _ in range(6):
      p, s = step(p, s, jnp.asarray(target))
    runs[name] = np.asarray(p)
  np.testing.assert_allclose(runs["sgp"], runs["gossip"], rtol=1e-5, atol=1e-6)
  assert not np.allclose(runs["overlap"], runs["gossip"], atol=1e-3)
  with pytest.raises(ValueError, match="sgp.delay=2 is not allowed"):
    tx.sgp(axis_name="w", delay=2)


def test_error_feedback_is_a_plain_optax_transformation():
  ef = tx.error_feedback(functools.partial(compression.top_k, density=0.4))
  g = jnp.array([3.0, -1.0, 0.5, -4.0, 0.1])
  u, s = ef.update(g, ef.init(g), g)
  chex.assert_trees_all_close(u, jnp.array([3.0, 0.0, 0.0, -4.0, 0.0]))
  chex.assert_trees_all_close(s.inner.residual, g - u)
  u2, _ = ef.update(jnp.zeros(5), s)  # the memory is sent next
  chex.assert_trees_all_close(u2, jnp.array([0.0, -1.0, 0.5, 0.0, 0.0]))


def test_nonblocking_accumulate_averages_the_first_count():
  acc = tx.nonblocking_accumulate(3, optax.sgd(1.0))
  s = acc.init(jnp.zeros(2))
  outs = []
  for g in ([1.0, 2.0], [3.0, 4.0], [100.0, 100.0]):  # the third is past the deadline
    u, s = acc.update(jnp.array(g), s, count=2)
    outs.append(np.asarray(u))
  np.testing.assert_allclose(outs, [[0, 0], [0, 0], [-2.0, -3.0]])


def _vmapped(opt, x):
  return jax.vmap(lambda p, s: opt.update(p, s, p), axis_name="w")(x, jax.vmap(opt.init, axis_name="w")(x))


def test_bad_inputs_are_named():
  x = jnp.ones((N, 3))
  with pytest.raises(ValueError, match=r"tx.gossip\(axis_name='v'\): no axis"):
    _vmapped(tx.gossip("ring", axis_name="v"), x)
  with pytest.raises(ValueError, match="not doubly stochastic"):
    tx.gossip(np.full((N, N), 0.3), axis_name="w")
  # the observed deviation (N = 4: rows sum to 1.2) and the tolerance, each named as such
  with pytest.raises(ValueError, match=r"row sums differ from 1 by up to 0.2 and its column "
                     r"sums by up to 0.2, where the tolerance is 1e-06"):
    tx.gossip(np.full((N, N), 0.3), axis_name="w")
  with pytest.raises(ValueError, match=r"<3 x 3 matrix>\) does not fit the axis: it has 4"):
    _vmapped(tx.gossip(np.full((3, 3), 1 / 3), axis_name="w"), x)
  with pytest.raises(TypeError, match=r"tx.error_feedback\(compressor=.*compressor\(x, key\)"):
    tx.error_feedback(lambda x: x)
  with pytest.raises(ValueError, match=r"tx.local_sgd\(period=0\)"):
    tx.local_sgd(0, axis_name="w")
  with pytest.raises(ValueError, match="call update\\(updates, state, params\\)"):
    jax.vmap(lambda s: tx.gossip("ring", axis_name="w").update(jnp.ones(3), s),
             axis_name="w")(jax.vmap(tx.gossip("ring", axis_name="w").init, axis_name="w")(x))


@pytest.mark.slow
def test_powersgd_at_full_rank_is_the_mean_gradient():
  g = {"m": jnp.asarray(np.random.default_rng(2).normal(size=(N, 3, 2)), jnp.float32),
       "b": jnp.arange(N * 2, dtype=jnp.float32).reshape(N, 2)}
  opt = tx.powersgd(2, axis_name="w")  # rank 2 = min(3, 2): P_hat Q^T is the mean exactly
  u, state = _vmapped(opt, g)
  chex.assert_trees_all_close(u, jax.tree.map(lambda a: jnp.broadcast_to(a.mean(0), a.shape), g),
                              atol=1e-5)
  assert float(tx.bytes_sent(state)[0]) == 2 * (N - 1) / N * 4 * (3 * 2 + 2 * 2 + 2)


def test_tx_and_the_compressors_are_where_users_reach_for_them():
  import subprocess
  import sys
  import nbsgd_jax
  from nbsgd_jax import codecs
  from nbsgd_jax.codecs import sparse
  assert nbsgd_jax.tx.gossip is tx.gossip
  assert codecs.top_k is sparse.top_k and codecs.gaussian_k is sparse.gaussian_k
  assert codecs.random_k is sparse.random_k
  assert "tx" in dir(nbsgd_jax)
  with pytest.raises(AttributeError, match="no attribute 'txx'"):
    nbsgd_jax.txx  # noqa: B018
  # the package itself imports no JAX (the command line's --help stays fast)
  out = subprocess.run([sys.executable, "-c", "import sys, nbsgd_jax; print('jax' in sys.modules)"],
                       capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


@pytest.mark.parametrize("bad,error,match", [
    (lambda x, key: x, ValueError, r"must return \(values \[cap\], indices \[cap\]\); it "
                                   r"returned one array of shape \(5,\)"),
    (lambda x, key: (x[:2], jnp.array([0.0, 1.0])), TypeError, "indices of dtype float32"),
    (lambda x, key: (x[:2], jnp.array([0, 9])), ValueError,
     r"returned index 9 for a vector of 5 entries: indices are in \[0, 5\)"),
    (lambda x, key: (x[:2], jnp.array([-1, 0])), ValueError, "returned index -1"),
])
def test_a_compressors_output_is_checked_once_at_trace_time(bad, error, match):
  g = jnp.array([3.0, -1.0, 0.5, -4.0, 0.1])
  ef = tx.error_feedback(bad)
  with pytest.raises(error, match=match):
    ef.update(g, ef.init(g), g)
  from nbsgd_jax import codecs
  with pytest.raises(error, match=match):
    codecs.sparse_codec("custom", bad).compress(g, None)
  # the padding index d is no entry, not an error: what it drops costs no bytes
  pad = codecs.sparse_codec("pad", lambda x, key: (x[:2], jnp.array([0, 5])))
  dense, sent = pad.compress(g, None)
  np.testing.assert_allclose(dense, [3.0, 0, 0, 0, 0])
  assert float(sent) == 8.0


def test_init_outside_the_axis_is_refused_with_how_to_map_it():
  stacked = jnp.zeros((4, 3))
  opt = optax.chain(optax.sgd(0.1), tx.gossip("ring", axis_name="w"))
  with pytest.raises(ValueError, match=r"no axis of that name is bound where init runs; .*"
                     r"jax.vmap\(opt.init, axis_name='w'\)"):
    opt.init(stacked)
  state = jax.vmap(opt.init, axis_name="w")(stacked)  # once per worker
  assert state[1].step.shape == (4,)


def test_a_constructor_whose_init_is_not_its_transforms_is_refused_at_trace_time():
  """An optax face whose ``init`` is not its transform's (a chain's update would zip its
  transforms with a state of no parts, run none of them, and return the local gradient)."""
  from nbsgd_jax import transforms as T
  from nbsgd_jax.communications import AllReduce
  from nbsgd_jax.transforms import algorithms as A
  from nbsgd_jax.tx import adapter
  make = lambda n: A.allreduce_sgd(optax.identity(), T.mean_of(AllReduce(n, "w"), "count"))
  bad = adapter.to_optax(adapter._sized(make, T.no_state, "w", "tx.bad"), axis_name="w",
                         name="tx.bad")
  grads = jnp.arange(N * 3, dtype=jnp.float32).reshape(N, 3)
  state = jax.vmap(bad.init, axis_name="w")(grads)
  with pytest.raises(ValueError, match="tx.bad: its state"):
    jax.vmap(lambda g, s: bad.update(g, s), axis_name="w")(grads, state)
