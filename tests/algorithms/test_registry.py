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
      "ad_psgd", "swarm_sgd", "async_diloco", "halos"]
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
      "cluster.rebuild_collectives": True, "batch_size": 128})
  errs = recipes.combination_errors(cfg)
  assert len(errs) == 3, errs
  assert errs[0].startswith("config.nonblocking.enabled=True is not allowed with "
                            "config.algorithm='my_event_sgd': an asynchronous worker")
  assert "no all-reduce to rebuild" in errs[1]
  assert "at most 64" in errs[2]
  cfg = config_lib.override(cfg, {"nonblocking.enabled": False, "batch_size": 32,
                                  "cluster.rebuild_collectives": False})  # failures: taken
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


def _register_token_gossip():
  """An outside recipe on the event clock whose event rule keeps state: pairwise averaging
  along a token's random walk (host.RandomWalkToken), AD-PSGD's device half."""
  from nbsgd_jax.communications.pairwise import PairwiseAverage
  from nbsgd_jax.host import EventTimes, RandomWalkToken
  from nbsgd_jax.transforms import asynchronous as A

  @recipes.register("token_gossip", clock="event", no_compression="models, not gradients",
                    no_face="the host's event clock")
  def token_gossip(b):
    pairwise = PairwiseAverage(b.n, b.topology.edges, b.axis_name)
    clock = lambda cluster, comms, params: EventTimes(
        cluster, RandomWalkToken(pairwise.neighbours, b.cfg.seed),
        pairwise.message_bytes(params), b.cfg.cluster.step_overhead)
    return recipes.Recipe(A.pairwise_events(b.optimizer(), pairwise), decentralized=True,
                          primary=pairwise, clock=clock)


@pytest.mark.slow
def test_an_outside_event_rule_with_state_trains_and_resumes(tmp_path):
  """train() with an outside recipe whose event rule keeps state: the token's walk moves
  models (bytes), and a run that crashed after a checkpoint resumes to the records of a run
  never stopped (the rule's state and its drawn event travel in the checkpoint)."""
  from nbsgd_jax import train
  from tests.helpers import (full_and_crashed, read_records, registered, small_cfg,
                             without_wall)
  with registered():
    _register_token_gossip()
    cfg = small_cfg(algorithm="token_gossip", num_workers=8, num_steps=24, eval_every=4,
                    checkpoint_every=8, **{"cluster.scenario": "lognormal"})
    full = full_and_crashed(cfg, tmp_path)
    train.train(cfg, str(tmp_path / "run"))
  assert full["bytes_sent"] > 0 and full["events"] > 24
  assert (without_wall(read_records(tmp_path / "run" / "metrics.jsonl"))
          == without_wall(read_records(tmp_path / "full" / "metrics.jsonl")))


def test_registrations_inside_the_block_are_undone():
  from nbsgd_jax import codecs
  before = (dict(recipes.REGISTRY), dict(recipes.SECTIONS), dict(codecs.REGISTRY))
  with recipes.registrations():
    recipes.register("inside_sgd", sections={"inside": recipes.Section(
        lambda: config_lib.default_config().dpsgd, lambda cfg, errs: None, "inside")})(
            recipes.REGISTRY["dpsgd"].build)
    codecs.register("inside_codec", lambda **kw: None, ())
    assert "inside_sgd" in recipes.REGISTRY and "inside_codec" in codecs.REGISTRY
  assert (dict(recipes.REGISTRY), dict(recipes.SECTIONS), dict(codecs.REGISTRY)) == before
