"""``benchmarks/peer_pytorch.py``'s JAX sides: the bare step it measures the framework's
overhead against is the framework's D-PSGD step (the reference: ``x_i <- sum_j W_ij (x_j -
lr g_j)`` with the ring's 1/3 weights, written in the script without the framework); the
torch models' weight conversions round-trip (only where torch is installed: an extra)."""

import jax
import numpy as np
import pytest

from benchmarks import peer_pytorch as pp

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


@pytest.mark.parametrize("model,n", [("mlp", 4), ("cnn", 3)])
def test_bare_step_is_the_framework_step(model, n):
  stepper, x, y, s = pp.framework(model, n, 8)
  step, read = pp.bare_jax(s, stepper.state.params, stepper.state.model_state, x, y)
  for _ in range(3):
    step()
  stepper.steps(3, read_each_dispatch=False)
  assert pp.max_diff(pp.framework_params(stepper), read()) < 1e-5


def test_ring_is_doubly_stochastic_with_thirds():
  w = pp.ring(5)
  np.testing.assert_allclose(w.sum(0), 1.0)
  np.testing.assert_allclose(w.sum(1), 1.0)
  assert w[0, 4] == w[0, 1] == w[0, 0] == pytest.approx(1 / 3) and w[0, 2] == 0


def test_torch_models_take_the_flax_weights():
  pytest.importorskip("torch")
  from benchmarks import peer_torch_models as tm
  for model in ("mlp", "cnn", "resnet"):
    stepper, _, _, _ = pp.framework(model, 1, 4)
    params = jax.tree.map(lambda a: a[0], pp.framework_params(stepper))
    module = tm.build(model)
    tm.load(model, module, params)
    back = tm.to_flax(model, {k: v.detach().numpy()[None] for k, v in module.named_parameters()})
    assert pp.max_diff(jax.tree.map(lambda a: a[None], params), back) == 0.0
