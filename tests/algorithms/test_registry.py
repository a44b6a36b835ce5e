"""The algorithm registry's contracts (``nbsgd_jax/recipes/``): one import registers every
built-in algorithm; the clock kind is declared at registration, and the event clock's rules
follow the declaration, not the identity of a check function."""

import subprocess
import sys

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import recipes

from tests.helpers import ROOT


def test_a_fresh_import_of_recipes_sees_every_algorithm():
  code = "from nbsgd_jax import recipes; print(' '.join(sorted(recipes.REGISTRY)))"
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.split()
  assert out == sorted(config_lib.ALGORITHMS)
  assert {"ad_psgd", "swarm_sgd", "async_diloco", "sgp"} <= set(out)


def test_the_event_clock_family_is_declared():
  assert [n for n in config_lib.ALGORITHMS if recipes.is_asynchronous(n)] == [
      "ad_psgd", "swarm_sgd", "async_diloco"]
  assert not recipes.is_asynchronous("sgp") and not recipes.is_asynchronous("no_such_sgd")


@pytest.fixture
def event_recipe():
  """An outside recipe on the event clock with a check of its own (removed afterwards)."""
  def own_rule(cfg, errs):
    if cfg.batch_size > 64:
      errs.append(f"config.batch_size={cfg.batch_size} is not allowed with "
                  "config.algorithm='my_event_sgd': at most 64")

  recipes.register("my_event_sgd", clock="event", check=own_rule)(
      recipes.REGISTRY["ad_psgd"].build)
  yield
  del recipes.REGISTRY["my_event_sgd"]


def test_a_recipe_declared_on_the_event_clock_gets_its_rules_and_its_own(event_recipe):
  del event_recipe
  assert recipes.is_asynchronous("my_event_sgd")
  cfg = config_lib.override(config_lib.default_config(), {
      "algorithm": "my_event_sgd", "nonblocking.enabled": True, "cluster.failures": "1:2:3",
      "batch_size": 128})
  errs = recipes.combination_errors(cfg)
  assert len(errs) == 3, errs
  assert errs[0].startswith("config.nonblocking.enabled=True is not allowed with "
                            "config.algorithm='my_event_sgd': an asynchronous worker")
  assert "the event clock simulates no failures" in errs[1]
  assert "at most 64" in errs[2]
  cfg = config_lib.override(cfg, {"nonblocking.enabled": False, "cluster.failures": "",
                                  "batch_size": 32})
  assert recipes.combination_errors(cfg) == []


def test_register_refuses_an_unknown_clock():
  with pytest.raises(ValueError, match=r"register\('x', clock='wall'\): use one of "
                                       r"\['lockstep', 'event'\]"):
    recipes.register("x", clock="wall")
  assert "x" not in recipes.REGISTRY


def test_register_refuses_both_a_face_and_a_reason_for_none():
  with pytest.raises(ValueError, match=r"register\('x'\): give face='gossip' or a no_face "
                                       "reason, not both"):
    recipes.register("x", face="gossip", no_face="because")
  assert "x" not in recipes.REGISTRY
