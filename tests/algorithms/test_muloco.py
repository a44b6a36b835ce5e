"""MuLoCo: DiLoCo (and local SGD) with Muon as the inner optimizer (``config.optimizer=
"muon"``). The optimizer the config builds is held to optax's own ``optax.contrib.muon``
called with the same numbers (the reference implementation the package uses, optax 0.2.8);
DiLoCo's outer step around any inner optimizer is tested in test_tx and test_local_sgd, and
the language model learning through MuLoCo in tests/models/test_workloads.py."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.recipes import optim


def test_the_configs_muon_is_optax_muon_step_by_step():
  cfg = config_lib.override(config_lib.default_config(), {
      "optimizer": "muon", "learning_rate": 0.02, "momentum": 0.9, "weight_decay": 0.01,
      "adam_b2": 0.99, "lr_schedule": "constant", "nesterov": True})
  ours = optim.make_optimizer(cfg)
  ref = optax.contrib.muon(0.02, beta=0.9, weight_decay=0.01, adam_b2=0.99, nesterov=True)
  key = jax.random.key(0)
  params = {"kernel": jax.random.normal(key, (6, 4)), "bias": jnp.zeros(4)}
  a, b = params, params
  sa, sb = ours.init(a), ref.init(b)
  for t in range(5):
    g = jax.tree.map(lambda x, t=t: jnp.sin(x * (t + 1)) + 0.1 * t, a)
    ua, sa = ours.update(g, sa, a)
    ub, sb = ref.update(g, sb, b)
    a, b = optax.apply_updates(a, ua), optax.apply_updates(b, ub)
    for k in a:
      np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-6, atol=1e-7)
  # the matrix moved by an orthogonalised step, unlike plain SGD's
  sgd = optax.sgd(0.02, momentum=0.9).update(g, optax.sgd(0.02, momentum=0.9).init(params))[0]
  assert not np.allclose(np.asarray(ua["kernel"]), np.asarray(sgd["kernel"]))


def test_an_unknown_optimizer_is_refused_by_name():
  cfg = config_lib.override(config_lib.default_config(), {"optimizer": "lion"})
  with pytest.raises(config_lib.ConfigError, match=r"config\.optimizer='lion' is not allowed"):
    config_lib.validate(cfg)
