"""Tests for nbsgd_jax.transforms (non-blocking mini-batches, He & Dube 2022)."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import transforms as T
from nbsgd_jax.transforms import AccumulateState, accumulate_minibatches

B, D, M = 12, 4, 4


def minibatch_mean_gradient(loss_fn, params, batch, num_minibatches, count):
  """The framework's gradient source on a loss without model state: ``(grads, loss,
  count)``."""
  grads, loss, count, _ = T.minibatch_mean_gradient(T.stateless(loss_fn), params, (), batch,
                                                    num_minibatches, count)
  return grads, loss, count


def _data(seed=0, b=B):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, D)).astype(np.float32)
  y = rng.normal(size=(b,)).astype(np.float32)
  params = {"w": rng.normal(size=(D,)).astype(np.float32),
            "b": np.float32(rng.normal())}
  return params, {"x": x, "y": y}


def ls_loss(params, batch):
  pred = batch["x"] @ params["w"] + params["b"]
  return 0.5 * jnp.mean((pred - batch["y"]) ** 2)


def logistic_loss(params, batch):
  logits = batch["x"] @ params["w"] + params["b"]
  labels = (batch["y"] > 0).astype(jnp.float32)
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


def np_ls_grad(params, x, y):
  """Closed-form least-squares gradient of 0.5 * mean((x w + b - y)^2)."""
  r = x @ params["w"] + params["b"] - y
  return {"w": x.T @ r / len(y), "b": np.float32(r.mean())}


def np_minibatch_grads(params, x, y, m):
  per = len(y) // m
  return [np_ls_grad(params, x[j * per:(j + 1) * per], y[j * per:(j + 1) * per])
          for j in range(m)]


def _tree_mean(trees):
  return jax.tree_util.tree_map(lambda *a: np.mean(np.stack(a), 0), *trees)


class MinibatchMeanGradientTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_finished_equals_full_batch_least_squares(self):
    params, batch = _data()
    fn = self.variant(functools.partial(minibatch_mean_gradient, ls_loss,
                                        num_minibatches=M))
    grads, loss, count = fn(params, batch, count=M)
    chex.assert_trees_all_close(grads, jax.grad(ls_loss)(params, batch), atol=1e-5)
    chex.assert_trees_all_close(
        grads, np_ls_grad(params, batch["x"], batch["y"]), atol=1e-5)
    np.testing.assert_allclose(loss, ls_loss(params, batch), rtol=1e-5)
    assert int(count) == M

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_finished_equals_full_batch_logistic(self):
    params, batch = _data(1)
    fn = self.variant(functools.partial(minibatch_mean_gradient, logistic_loss,
                                        num_minibatches=M))
    grads, loss, _ = fn(params, batch, count=M)
    chex.assert_trees_all_close(grads, jax.grad(logistic_loss)(params, batch), atol=1e-5)
    np.testing.assert_allclose(loss, logistic_loss(params, batch), rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_partial_count_is_mean_of_first_k(self):
    params, batch = _data(2)
    fn = self.variant(functools.partial(minibatch_mean_gradient, ls_loss,
                                        num_minibatches=M))
    per_mb = np_minibatch_grads(params, batch["x"], batch["y"], M)
    for k in range(1, M):
      grads, _, count = fn(params, batch, count=jnp.int32(k))
      chex.assert_trees_all_close(grads, _tree_mean(per_mb[:k]), atol=1e-5)
      assert int(count) == k

  def test_count_is_runtime_input_no_recompile(self):
    params, batch = _data(3)
    traces = []

    @jax.jit
    def fn(params, batch, count):
      traces.append(1)
      return minibatch_mean_gradient(ls_loss, params, batch, M, count)
    for k in range(M + 1):
      fn(params, batch, jnp.int32(k))
    assert len(traces) == 1

  @chex.variants(with_jit=True, without_jit=True)
  def test_count_zero_gives_zeros(self):
    params, batch = _data(4)
    fn = self.variant(functools.partial(minibatch_mean_gradient, ls_loss,
                                        num_minibatches=M))
    grads, loss, count = fn(params, batch, count=0)
    chex.assert_trees_all_close(grads, jax.tree_util.tree_map(np.zeros_like, params))
    assert float(loss) == 0.0 and int(count) == 0

  def test_local_weighting_under_vmap_is_per_worker(self):
    params, _ = _data(8)
    rng = np.random.default_rng(9)
    xs = rng.normal(size=(2, B, D)).astype(np.float32)
    ys = rng.normal(size=(2, B)).astype(np.float32)
    counts = np.array([3, 0], np.int32)
    grads, _, _ = jax.jit(jax.vmap(
        lambda b, c: minibatch_mean_gradient(ls_loss, params, b, M, c),
        axis_name="w"))({"x": xs, "y": ys}, counts)
    exp0 = _tree_mean(np_minibatch_grads(params, xs[0], ys[0], M)[:3])
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda g: g[0], grads), exp0,
                                atol=1e-5)
    assert all(np.all(np.asarray(g[1]) == 0) for g in jax.tree_util.tree_leaves(grads))

  def test_indivisible_batch_raises_naming_fields(self):
    params, batch = _data(b=10)
    with pytest.raises(ValueError, match=r"nonblocking\.num_minibatches") as e:
      minibatch_mean_gradient(ls_loss, params, batch, 4, 4)
    assert "batch_size" in str(e.value)

  def test_num_minibatches_below_one_raises(self):
    params, batch = _data()
    for m in (0, -1):
      with pytest.raises(ValueError, match=r"num_minibatches"):
        minibatch_mean_gradient(ls_loss, params, batch, m, 0)


class AccumulateMinibatchesTest(chex.TestCase):

  def _grads(self, seed=10):
    params, batch = _data(seed)
    return params, batch, np_minibatch_grads(params, batch["x"], batch["y"], M)

  def _run(self, tx, params, grads, finished, emit, state=None):
    update = self.variant(tx.update)
    state = tx.init(params) if state is None else state
    outs = []
    for g, f, e in zip(grads, finished, emit):
      u, state = update(g, state, params, finished=jnp.bool_(f), emit=jnp.bool_(e))
      outs.append(u)
    return outs, state

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_finished_equals_one_full_batch_step(self):
    params, batch, grads = self._grads()
    tx = accumulate_minibatches(optax.sgd(0.1))
    outs, state = self._run(tx, params, grads, [True] * M, [False] * (M - 1) + [True])
    zeros = jax.tree_util.tree_map(np.zeros_like, params)
    for u in outs[:-1]:
      chex.assert_trees_all_close(u, zeros)
    ref_tx = optax.sgd(0.1)
    full = jax.grad(ls_loss)(params, batch)
    ref, _ = ref_tx.update(full, ref_tx.init(params), params)
    chex.assert_trees_all_close(outs[-1], ref, atol=1e-6)
    assert isinstance(state, AccumulateState)
    assert int(state.count) == 0
    chex.assert_trees_all_close(state.grad_sum, zeros)

  @chex.variants(with_jit=True, without_jit=True)
  def test_unfinished_dropped(self):
    params, _, grads = self._grads(11)
    tx = accumulate_minibatches(optax.sgd(0.1))
    finished = [True, False, True, False]
    outs, _ = self._run(tx, params, grads, finished, [False] * (M - 1) + [True])
    mean = _tree_mean([grads[0], grads[2]])
    chex.assert_trees_all_close(
        outs[-1], jax.tree_util.tree_map(lambda g: -0.1 * g, mean), atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_none_finished_zero_updates_inner_state_unchanged(self):
    params, _, grads = self._grads(12)
    tx = accumulate_minibatches(optax.sgd(0.1, momentum=0.9))
    # A first round gives the momentum trace a non-zero value.
    _, state = self._run(tx, params, grads, [True] * M, [False] * (M - 1) + [True])
    trace_before = state.inner_state
    outs, state2 = self._run(tx, params, grads, [False] * M,
                             [False] * (M - 1) + [True], state=state)
    zeros = jax.tree_util.tree_map(np.zeros_like, params)
    for u in outs:
      chex.assert_trees_all_close(u, zeros)
    chex.assert_trees_all_close(state2.inner_state, trace_before)
    assert any(np.any(np.asarray(t) != 0)
               for t in jax.tree_util.tree_leaves(trace_before))
    assert int(state2.count) == 0

  def test_momentum_two_rounds_matches_reference(self):
    params, _, grads = self._grads(13)
    tx = accumulate_minibatches(optax.sgd(0.1, momentum=0.9))
    ref_tx = optax.sgd(0.1, momentum=0.9)
    update = jax.jit(tx.update)
    state, ref_state = tx.init(params), ref_tx.init(params)
    for finished in ([True, True, False, False], [True, True, True, True]):
      for j, g in enumerate(grads):
        u, state = update(g, state, params, finished=finished[j], emit=j == M - 1)
      mean = _tree_mean([g for g, f in zip(grads, finished) if f])
      ref, ref_state = ref_tx.update(mean, ref_state, params)
      chex.assert_trees_all_close(u, ref, atol=1e-6)

  def test_vmap_over_workers(self):
    params, _, grads = self._grads(14)
    tx = accumulate_minibatches(optax.sgd(0.1))
    n = 2
    stacked_params = jax.tree_util.tree_map(lambda p: np.stack([p] * n), params)
    state = jax.vmap(tx.init)(stacked_params)
    finished = np.array([[True] * M, [False] * M])
    update = jax.jit(jax.vmap(
        lambda g, s, p, f, e: tx.update(g, s, p, finished=f, emit=e)))
    for j, g in enumerate(grads):
      gs = jax.tree_util.tree_map(lambda x: np.stack([x] * n), g)
      u, state = update(gs, state, stacked_params, finished[:, j],
                        np.array([j == M - 1] * n))
    mean = _tree_mean(grads)
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda x: x[0], u),
                                jax.tree_util.tree_map(lambda g: -0.1 * g, mean),
                                atol=1e-6)
    assert all(np.all(np.asarray(x[1]) == 0) for x in jax.tree_util.tree_leaves(u))

  def test_missing_kwargs_raise(self):
    params, _, grads = self._grads()
    tx = accumulate_minibatches(optax.sgd(0.1))
    with pytest.raises(TypeError):
      tx.update(grads[0], tx.init(params), params)


def test_unrolled_minibatch_loop_equals_the_rolled_scan():
  """nonblocking.unroll: the same gradient, loss and model state as the rolled lax.scan (a
  small CNN with a running statistic as model state; count 3 of M = 4)."""
  import flax.linen as nn

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Conv(4, (3, 3))(x))
      return nn.Dense(3)(x.reshape(x.shape[0], -1))

  net = Net()
  x = jax.random.normal(jax.random.key(0), (8, 6, 6, 2))
  y = jnp.arange(8) % 3
  params = net.init(jax.random.key(1), x[:1])

  def loss_fn(p, state, batch):
    xb, yb = batch
    loss = optax.softmax_cross_entropy_with_integer_labels(net.apply(p, xb), yb).mean()
    return loss, state + xb.mean()

  out = [T.minibatch_mean_gradient(loss_fn, params, jnp.zeros(()), (x, y), 4, 3, unroll=u)
         for u in (False, True)]
  chex.assert_trees_all_close(out[0], out[1], rtol=1e-6, atol=1e-7)
  assert int(out[1][2]) == 3
