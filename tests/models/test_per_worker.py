"""Per-worker convolutions (``conv_impl="per_worker"``) and the reshape max-pool
(``pool_impl="reshape"``) against XLA's own batched convolution and flax's max-pool."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jcore

from nbsgd_jax import config as config_lib
from nbsgd_jax import models
from nbsgd_jax.models import per_worker

from tests.helpers import run_steps, small_cfg

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

N = 4


def _conv_groups(jaxpr, out=None):
  """``feature_group_count`` of every convolution in ``jaxpr`` and its sub-jaxprs."""
  out = [] if out is None else out
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "conv_general_dilated":
      out.append(eqn.params["feature_group_count"])
    for p in eqn.params.values():
      for sub in p if isinstance(p, (list, tuple)) else [p]:
        if isinstance(sub, jcore.ClosedJaxpr):
          _conv_groups(sub.jaxpr, out)
        elif isinstance(sub, jcore.Jaxpr):
          _conv_groups(sub, out)
  return out


def _workers(model_name, shape, impl, pool="window", classes=10, n=N):
  """``vmap`` over n workers of the loss and gradient of ``model_name`` with distinct
  per-worker weights and images: ``(fn, params [n, ...], x [n, 3, ...], y [n, 3])``."""
  model = models.make_model(model_name, classes, cnn_channels=(4, 8), norm="group",
                            depth=8, conv_impl=impl, pool_impl=pool)
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  x = jax.random.normal(jax.random.PRNGKey(1), (n, 3) + shape)
  y = jax.random.randint(jax.random.PRNGKey(2), (n, 3), 0, classes)
  params = jax.vmap(lambda k: model.init(k, x[0]))(keys)

  def loss(p, xb, yb):
    logits = model.apply(p, xb)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], 1))

  return jax.vmap(jax.value_and_grad(loss)), params, x, y


@pytest.mark.long  # a run with them equals the batched run: test_training_with_per_worker_...
@pytest.mark.parametrize("name,shape,n", [("cnn", (28, 28, 1), N), ("resnet", (16, 16, 3), 3)])
def test_per_worker_conv_equals_the_batched_conv_under_vmap(name, shape, n):
  fn, params, x, y = _workers(name, shape, "per_worker", n=n)
  ref, _, _, _ = _workers(name, shape, "batched", n=n)
  chex.assert_trees_all_close(jax.jit(fn)(params, x, y), jax.jit(ref)(params, x, y),
                              rtol=1e-4, atol=1e-5)
  # the mechanism: no grouped convolution is left in the forward and backward passes
  groups = _conv_groups(jax.make_jaxpr(fn)(params, x, y).jaxpr)
  assert groups and set(groups) == {1}
  assert n in _conv_groups(jax.make_jaxpr(ref)(params, x, y).jaxpr)


def test_per_worker_conv_alone_is_lax_conv_and_has_reverse_mode_only():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 9, 3))
  k = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 3, 5))
  args = dict(window_strides=(2, 2), padding=((1, 1), (1, 1)),
              dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_array_equal(per_worker.conv_general_dilated(x, k, **args),
                                lax.conv_general_dilated(x, k, **args))
  f = lambda conv: (lambda k: jnp.sum(jnp.tanh(conv(x, k, **args))))
  mine, ref = f(per_worker.conv_general_dilated), f(lax.conv_general_dilated)
  np.testing.assert_allclose(jax.grad(mine)(k), jax.grad(ref)(k), rtol=1e-5, atol=1e-5)
  v = jnp.ones_like(k)  # a Hessian-vector product of one model: forward over reverse
  hvp = lambda g: jax.jvp(jax.grad(g), (k,), (v,))[1]
  np.testing.assert_allclose(hvp(mine), hvp(ref), rtol=1e-4, atol=1e-4)
  with pytest.raises(TypeError):
    jax.jvp(mine, (k,), (v,))


def test_reshape_max_pool_is_flax_max_pool():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8, 6, 4))  # continuous: no ties
  ref = lambda h: nn.max_pool(h.reshape((-1,) + h.shape[2:]), (2, 2), strides=(2, 2))
  np.testing.assert_array_equal(per_worker.max_pool(x).reshape((-1, 4, 3, 4)), ref(x))
  g = jax.grad(lambda h: jnp.sum(jnp.sin(per_worker.max_pool(h))))(x)
  g_ref = jax.grad(lambda h: jnp.sum(jnp.sin(ref(h))))(x)
  np.testing.assert_allclose(g, g_ref, rtol=1e-6)
  with pytest.raises(ValueError, match="pool_impl='reshape' needs even"):
    per_worker.max_pool(jnp.zeros((1, 5, 4, 1)))


def test_cnn_with_both_options_equals_the_default_cnn_under_vmap():
  fn, params, x, y = _workers("cnn", (28, 28, 1), "per_worker", pool="reshape")
  ref, _, _, _ = _workers("cnn", (28, 28, 1), "batched")
  chex.assert_trees_all_close(jax.jit(fn)(params, x, y), jax.jit(ref)(params, x, y),
                              rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["mesh", pytest.param("simulate", marks=pytest.mark.long)])
def test_training_with_per_worker_convs_is_the_same(backend):
  base = dict(model="cnn", cnn_channels=(4, 8), mlp_hidden=(16,), num_workers=8,
              backend=backend, algorithm="dpsgd", topology="ring", batch_size=4)
  _, ref, ref_loss = run_steps(small_cfg(conv_impl="batched", pool_impl="window", **base), 3)
  _, mine, loss = run_steps(small_cfg(conv_impl="per_worker", pool_impl="reshape", **base), 3)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-4, atol=1e-5)
  chex.assert_trees_all_close(jax.device_get(mine.params), jax.device_get(ref.params),
                              rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("key,value", [("conv_impl", "grouped"), ("pool_impl", "avg")])
def test_bad_impl_is_named(key, value):
  with pytest.raises(config_lib.ConfigError, match=f"config.{key}={value!r}"):
    config_lib.validate(small_cfg(model="cnn", **{key: value}))
  with pytest.raises(ValueError, match=f"{key}={value!r} is not allowed"):
    models.make_model("cnn", 10, **{key: value})
