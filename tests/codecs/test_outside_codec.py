"""A codec registered from outside the package with options of its own
(``codecs.register(..., options=codecs.Options(defaults, check))``): its keys join
``config.compression`` with their defaults and checks, reach its factory, are named as having
no effect while another codec runs, and may not take a key that exists."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from nbsgd_jax import codecs, train
from nbsgd_jax.core import checks
from nbsgd_jax import config as config_lib

from tests.helpers import registered, small_cfg


def terngrad_options() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.terngrad_clip = 2.5  # TernGrad's gradient clipping at c standard deviations (0: none)
  return s


def check_terngrad(cfg, errs):
  checks.number(cfg, errs, "compression.terngrad_clip", 0)


def terngrad(terngrad_clip, made):
  """TernGrad (Wen et al. 2017) with its clipping (Sec. 3.3: |x| at c sigma): ``C(x) = s
  sgn(x) b``, ``s = max |x|``, ``b ~ Bernoulli(|x| / s)``; 2 bits an entry and a float32."""
  import jax
  made.append(terngrad_clip)

  def compress(x, key):
    if terngrad_clip:
      bound = terngrad_clip * jnp.std(x)
      x = jnp.clip(x, -bound, bound)
    s = jnp.max(jnp.abs(x))
    keep = jax.random.uniform(key, x.shape) < jnp.abs(x) / jnp.where(s > 0, s, 1.0)
    out = jnp.where(keep, s * jnp.sign(x), 0.0).astype(x.dtype)
    return out, jnp.float32(np.ceil(2 * x.size / 8) + 4)

  return codecs.Codec("terngrad", compress)


def _register(made):
  """Registers TernGrad with its option; returns its factory."""
  factory = lambda terngrad_clip: terngrad(terngrad_clip, made)
  codecs.register("terngrad", factory, options=codecs.Options(terngrad_options, check_terngrad))
  return factory


def test_a_codec_s_own_options_join_the_config_and_reach_its_factory():
  made = []
  with registered():
    _register(made)
    assert config_lib.default_config().compression.terngrad_clip == 2.5
    cfg = small_cfg(algorithm="allreduce", num_steps=2, eval_every=2,
                    **{"compression.name": "terngrad", "compression.terngrad_clip": 1.0})
    config_lib.validate(cfg)
    out = train.train(cfg)
    assert made and set(made) == {1.0}
    assert np.isfinite(out["train_loss"]) and out["bytes_sent"] > 0
    bad = small_cfg(**{"compression.terngrad_clip": -1.0})
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.validate(bad)
    assert e.value.errors == ["config.compression.terngrad_clip=-1.0 is not allowed: it must "
                              "be a number >= 0"]
    other = small_cfg(algorithm="allreduce", **{"compression.name": "top_k",
                                                "compression.terngrad_clip": 1.0})
    assert any(w.startswith("config.compression.terngrad_clip=1.0 has no effect")
               for w in config_lib.inactive_warnings(other))
  assert "terngrad_clip" not in config_lib.default_config().compression  # unregistered


def test_a_codec_may_not_take_a_key_that_exists():
  with registered():
    taken = lambda: ml_collections.ConfigDict({"density": 0.5})
    with pytest.raises(ValueError, match=r"codec 'mine': option config.compression.density "
                                         r"exists already"):
      codecs.register("mine", lambda density: None, options=codecs.Options(taken, check_terngrad))
    assert "mine" not in codecs.REGISTRY
    factory = _register([])
    codecs.register("terngrad", factory,  # registered again: its own keys are not "taken"
                    options=codecs.Options(terngrad_options, check_terngrad))
    assert codecs.REGISTRY["terngrad"].keys == ("terngrad_clip",)
