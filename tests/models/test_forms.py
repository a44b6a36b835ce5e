"""The forms the framework picks per platform and workers (:mod:`nbsgd_jax.models.forms`): the rules,
and that every form computes what the plain model computes (the reference: the same model
without the form, XLA's default compilation)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import models
from nbsgd_jax.models import forms

from tests.helpers import run_steps, small_cfg

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


def _cfg(**over):
  return config_lib.override(config_lib.default_config(), over)


@pytest.mark.parametrize("platform,k,want", [
    ("cpu", 8, ("per_worker", "materialized")),
    ("cpu", 64, ("per_worker", "materialized")),
    ("cpu", 65, ("batched", "materialized")),
    ("cpu", 1, ("batched", "materialized")),
    ("gpu", 8, ("batched", "fused")),
])
def test_auto_rules(platform, k, want):
  assert forms.resolve(_cfg(), platform, k) == forms.Forms(*want[:1], "auto", want[1])


def test_forced_forms_are_kept():
  f = forms.resolve(_cfg(conv_impl="batched", pool_impl="window", residuals="fused"), "cpu", 8)
  assert f == forms.Forms("batched", "window", "fused")
  assert forms.resolve(_cfg(conv_impl="per_worker"), "gpu", 200).conv_impl == "per_worker"


def test_materialize_is_the_identity_and_one_conditional_under_vmap():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 5))
  f = lambda a: jnp.sum(jnp.sin(forms.materialize(a * 2.0)))
  np.testing.assert_array_equal(forms.materialize(x), x)
  np.testing.assert_allclose(jax.grad(f)(x), 2.0 * jnp.cos(2.0 * x), rtol=1e-6)
  _, tangent = jax.jvp(f, (x,), (jnp.ones_like(x),))  # forward mode too
  np.testing.assert_allclose(tangent, jnp.sum(2.0 * jnp.cos(2.0 * x)), rtol=1e-5)
  nan = x.at[0, 0, 0].set(jnp.nan)
  np.testing.assert_array_equal(forms.materialize(nan), nan)
  jaxpr = str(jax.make_jaxpr(jax.vmap(jax.grad(f)))(x))
  assert "cond[" in jaxpr and "select_n" not in jaxpr  # stays a conditional under vmap


def _resnet_workers(residuals, conv_impl="batched"):
  model = models.make_model("resnet", 10, depth=8, residuals=residuals, conv_impl=conv_impl)
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 4, 16, 16, 3))
  y = jax.random.randint(jax.random.PRNGKey(2), (3, 4), 0, 10)
  variables = jax.vmap(lambda k: model.init(k, x[0], train=False))(
      jax.random.split(jax.random.PRNGKey(0), 3))

  def loss(v, xb, yb):
    logits, new = model.apply(v, xb, train=True, mutable=["batch_stats"])
    ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], 1))
    return ce, new

  return jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True))), variables, x, y


@pytest.mark.long  # a run in these forms equals the plain one: test_a_run_in_the_auto_forms_...
def test_materialized_residuals_compute_the_plain_resnet():
  fn, v, x, y = _resnet_workers("materialized", "per_worker")
  ref, _, _, _ = _resnet_workers("fused")
  chex.assert_trees_all_close(fn(v, x, y), ref(v, x, y), rtol=1e-4, atol=1e-5)


def test_auto_pool_takes_the_window_where_a_size_is_odd():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 30, 30, 1))  # second pool: 11 x 11
  auto = models.make_model("cnn", 10, pool_impl="auto")
  window = models.make_model("cnn", 10, pool_impl="window")
  v = window.init(jax.random.PRNGKey(1), x)
  np.testing.assert_allclose(auto.apply(v, x), window.apply(v, x), rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="needs even image sizes"):
    models.make_model("cnn", 10, pool_impl="reshape").apply(v, x)


@pytest.mark.long  # 17 s of ResNet programs; each form against the plain one: the tests above
def test_a_run_in_the_auto_forms_takes_the_steps_of_the_plain_forms():
  base = dict(model="resnet", resnet_depth=8, num_workers=4, batch_size=4,
              eval_train_examples=16, algorithm="dpsgd")
  _, ref, ref_loss = run_steps(small_cfg(conv_impl="batched", residuals="fused", **base), 2)
  _, mine, loss = run_steps(small_cfg(**base), 2)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-4, atol=1e-5)
  chex.assert_trees_all_close(jax.device_get(mine.params), jax.device_get(ref.params),
                              rtol=1e-3, atol=1e-5)
