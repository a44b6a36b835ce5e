"""The rules of ``nbsgd_jax.config``: every section checks its values also when it is off, a
changed key of a section that is off gets a warning, the batch has to split into
``nonblocking.num_minibatches`` only when it is split, and the combinations of sections are
the recipe registry's (``_combination_errors``)."""

import io

import pytest

from nbsgd_jax.host import cluster_config
from nbsgd_jax import config as config_lib
from nbsgd_jax import recipes
from tests.helpers import malformed


def cfg_with(**overrides):
  """The default config with ``overrides`` (``section__key`` for ``section.key``), bypassing
  ConfigDict's type safety as a config file could (:func:`tests.helpers.malformed`)."""
  return malformed({name.replace("__", "."): value for name, value in overrides.items()})


def errors_of(cfg):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  return e.value.errors


# ------------------------------------------------------- bad values in sections that are off


@pytest.mark.parametrize("overrides,line", [
    ({"compression__density": 2.0},
     "config.compression.density=2.0 is not allowed: it must be a number > 0 and <= 1"),
    ({"compression__gaussian_rounds": 100},
     "config.compression.gaussian_rounds=100 is not allowed: it must be an int in [0, 64]"),
    ({"compression__gaussian_correction": "newton"},
     "config.compression.gaussian_correction='newton' is not allowed: use 'bracket' or 'paper'"),
    ({"algorithm": "dpsgd", "diloco__outer_lr": -1.0},
     "config.diloco.outer_lr=-1.0 is not allowed: it must be a number > 0"),
    ({"algorithm": "allreduce", "local_sgd__local_steps": 0},
     "config.local_sgd.local_steps=0 is not allowed: it must be an integer >= 1"),
    ({"algorithm": "allreduce", "matcha__budget": 0.0},
     "config.matcha.budget=0.0 is not allowed: it must be a number > 0 and <= 1"),
    ({"consensus__max_gossip_steps": 0},
     "config.consensus.max_gossip_steps=0 is not allowed: it must be an integer >= 1"),
    ({"nonblocking__deadline_group": "some"},
     "config.nonblocking.deadline_group='some' is not allowed: use one of ['all', 'neighbours']"),
    ({"problem__dim": 0}, "config.problem.dim=0 is not allowed: it must be an integer >= 1"),
    ({"local_sgd__offset_optimum": True},
     "config.local_sgd.offset_optimum=True is not allowed with config.dataset='mnist10k': F* "
     "is known only for ['least_squares', 'logistic']"),
])
def test_bad_value_in_a_section_that_is_off_is_an_error(overrides, line):
  assert errors_of(cfg_with(**overrides)) == [line]


def test_every_section_has_a_check():
  sections = {k for k, v in config_lib.default_config().items() if hasattr(v, "items")}
  checked = set(config_lib.section_checks())
  assert sections <= checked, sections - checked


# ------------------------------------------------- changed keys of sections that are off


@pytest.mark.parametrize("overrides,line", [
    ({"compression__density": 0.05},
     "config.compression.density=0.05 has no effect: config.compression.name='none'"),
    ({"algorithm": "dpsgd", "local_sgd__local_steps": 8},
     "config.local_sgd.local_steps=8 has no effect: config.algorithm='dpsgd'"),
    ({"algorithm": "allreduce", "matcha__budget": 0.25},
     "config.matcha.budget=0.25 has no effect: config.algorithm='allreduce'"),
    ({"lr_milestones": (0.3, 0.6)},
     "config.lr_milestones=(0.3, 0.6) has no effect: config.lr_schedule='constant'"),
    ({"algorithm": "allreduce", "dpsgd__order": "parallel"},
     "config.dpsgd.order='parallel' has no effect: config.algorithm='allreduce'"),
    ({"nonblocking__deadline": "kth:2"},
     "config.nonblocking.deadline='kth:2' has no effect: config.nonblocking.enabled=False"),
    ({"consensus__critical_scale": 0.5},  # off twice (control and critical): named once
     "config.consensus.critical_scale=0.5 has no effect: config.consensus.control=False"),
    ({"consensus__control": True, "consensus__critical": False, "consensus__target": 0.1,
      "consensus__critical_ema": 0.5},
     "config.consensus.critical_ema=0.5 has no effect: config.consensus.critical=False"),
    ({"topology": "ring", "topology_p": 0.5},
     "config.topology_p=0.5 has no effect: config.topology='ring'"),
    ({"topology": "ring", "topology_rows": 2},
     "config.topology_rows=2 has no effect: config.topology='ring'"),
    ({"cluster__slow_factor": 8.0},
     "config.cluster.slow_factor=8.0 has no effect: config.cluster.scenario='homogeneous'"),
    ({"cluster__scenario": "one_slow", "cluster__spread": 1.0},
     "config.cluster.spread=1.0 has no effect: config.cluster.scenario='one_slow'"),
    ({"cluster__delay_mean": 0.1},
     "config.cluster.delay_mean=0.1 has no effect: config.cluster.delay='none'"),
    ({"problem__dim": 20},
     "config.problem.dim=20 has no effect: config.dataset='mnist10k'"),
    ({"dataset": "least_squares", "model": "mlp"},
     "config.model='mlp' has no effect: config.dataset='least_squares'"),
    ({"lr_time_scale": 10.0},
     "config.lr_time_scale=10.0 has no effect: config.lr_schedule='constant'"),
    ({"adam_b2": 0.95}, "config.adam_b2=0.95 has no effect: config.optimizer='sgd'"),
])
def test_changed_key_of_a_section_that_is_off_warns_once(overrides, line):
  assert config_lib.inactive_warnings(cfg_with(**overrides)) == [line]


@pytest.mark.parametrize("overrides", [
    {},  # every key at its default
    {"algorithm": "allreduce", "compression__name": "top_k", "compression__density": 0.05},
    {"algorithm": "local_sgd", "local_sgd__local_steps": 8},
    {"algorithm": "matcha", "matcha__budget": 0.25},
    {"algorithm": "matcha", "dpsgd__order": "parallel"},
    {"optimizer": "muon", "adam_b2": 0.95},  # Muon's Adam (the non-matrix parameters) reads it
    {"nonblocking__enabled": True, "nonblocking__deadline": "kth:2"},
    {"consensus__control": True, "consensus__critical": True, "consensus__critical_scale": 0.5},
    {"consensus__log_every_step": True, "consensus__per_layer": True},  # not control's keys
    {"topology": "erdos_renyi", "topology_p": 0.5},
    {"topology": "torus", "topology_rows": 2},
    {"cluster__scenario": "lognormal", "cluster__spread": 1.0},
    {"cluster__delay": "shifted_exponential", "cluster__delay_mean": 0.1},
])
def test_no_warning_when_the_section_is_on_or_the_key_at_its_default(overrides):
  assert config_lib.inactive_warnings(cfg_with(**overrides)) == []


def test_warn_inactive_prints_warning_lines():
  stream = io.StringIO()
  cfg = cfg_with(algorithm="dpsgd", compression__density=0.05, local_sgd__local_steps=8)
  lines = config_lib.warn_inactive(cfg, stream=stream)
  assert stream.getvalue().splitlines() == [f"warning: {line}" for line in lines]
  assert len(lines) == 2
  config_lib.validate(cfg)  # a warning, not an error


# ------------------------------------------------------------------ batch_size vs num_minibatches

SPLIT = ("config.batch_size=30 is not allowed with config.nonblocking.num_minibatches=4: the "
         "batch must split into M equal mini-batches (batch_size divisible by num_minibatches)")


def test_batch_not_divisible_by_m_is_refused_with_nonblocking():
  cfg = cfg_with(batch_size=30, nonblocking__num_minibatches=4, nonblocking__enabled=True)
  assert errors_of(cfg) == [SPLIT]


@pytest.mark.parametrize("failures", ["", "1:0:2"])
def test_batch_not_divisible_by_m_is_accepted_without_nonblocking(failures):
  """Only Non-blocking SGD splits the batch (cluster.partial_minibatches); a blocking run,
  with failures too, computes it at once (M = 1 in the cluster model)."""
  cfg = cfg_with(batch_size=30, nonblocking__num_minibatches=4, cluster__failures=failures)
  config_lib.validate(cfg)
  assert cluster_config.num_minibatches(cfg) == 1


def test_num_minibatches_warns_when_nonblocking_is_off():
  cfg = cfg_with(nonblocking__num_minibatches=8)
  assert config_lib.inactive_warnings(cfg) == [
      "config.nonblocking.num_minibatches=8 has no effect: config.nonblocking.enabled=False"]


@pytest.mark.parametrize("enabled", [False, True])
def test_num_minibatches_is_checked_always(enabled):
  cfg = cfg_with(nonblocking__num_minibatches=0, nonblocking__enabled=enabled)
  assert errors_of(cfg) == [
      "config.nonblocking.num_minibatches=0 is not allowed: it must be an integer >= 1"]


# ------------------------------------------------------------------ combinations of sections


def test_combination_errors_come_from_the_recipe_registry(monkeypatch):
  seen = []
  monkeypatch.setattr(recipes, "combination_errors", lambda cfg: seen.append(cfg) or ["x"])
  cfg = cfg_with(learning_rate=-1.0)
  errors = errors_of(cfg)
  assert "x" in errors and len(errors) == 2, errors
  assert seen == [cfg]
  assert errors_of(cfg_with()) == ["x"]  # the registry alone can refuse a config


@pytest.mark.parametrize("overrides,line", [
    ({"algorithm": "allreduce", "consensus__control": True, "consensus__target": 0.1},
     "config.consensus.control=True is not allowed with config.algorithm='allreduce': "
     "consensus control repeats the gossip of a recipe that gossips every step; consensus "
     "control runs on 'dpsgd', 'matcha', 'choco_sgd', 'gradient_tracking', 'd2', 'gossip_pga'"),
    ({"algorithm": "dpsgd", "compression__name": "top_k"},
     "config.compression.name='top_k' is not allowed with config.algorithm='dpsgd': gossip "
     "exchanges models, not gradients; compressed gossip needs CHOCO-SGD's public copies x_hat"),
    ({"algorithm": "matcha", "compression__name": "random_k"},
     "config.compression.name='random_k' is not allowed with config.algorithm='matcha': gossip "
     "exchanges models, not gradients; compressed gossip needs CHOCO-SGD's public copies x_hat"),
])
def test_registry_refuses_undefined_combinations(overrides, line):
  assert errors_of(cfg_with(**overrides)) == [line]


# ------------------------------------------------------------------ the fleet clock's keys


@pytest.mark.parametrize("overrides,line", [
    ({"cluster__placement": (1, 0, 2, 3, 4, 5, 6, 7)},
     "config.cluster.placement=(1, 0, 2, 3, 4, 5, 6, 7) is not allowed with "
     "config.cluster.levels=(): a place matters only on a hierarchical network (set "
     "cluster.levels, or placement=())"),
    ({"algorithm": "allreduce", "cluster__rebuild_collectives": True,
      "cluster__allreduce_group_size": 4},
     "config.cluster.rebuild_collectives=True is not allowed with "
     "config.cluster.allreduce_group_size=4: the rebuilt all-reduce is the flat one (ring or tree) "
     "over the live workers"),
    ({"cluster__quorum_policy": "wait"},
     "config.cluster.quorum_policy='wait' is not allowed with config.nonblocking.deadline="
     "'fastest' and config.nonblocking.enabled=False: the quorum is the K of a 'kth:K' or "
     "'kth:K:G' deadline of Non-blocking SGD (enabled=True)"),
    ({"cluster__quorum_policy": "wait", "cluster__failure_policy": "restart",
      "nonblocking__enabled": True, "nonblocking__deadline": "kth:6:0.01"},
     "config.cluster.quorum_policy='wait' is not allowed with config.cluster.failure_policy="
     "'restart': a restart brings every worker back (use failure_policy='elastic')"),
    ({"cluster__quorum_policy": "always"},
     "config.cluster.quorum_policy='always' is not allowed: use one of ['go_on', 'wait']"),
])
def test_the_fleet_clock_refuses_a_key_that_would_do_nothing_or_the_wrong_thing(overrides, line):
  assert errors_of(cfg_with(**overrides)) == [line]


def test_a_quorum_to_wait_for_is_a_kth_deadline_of_non_blocking_sgd():
  config_lib.validate(cfg_with(cluster__quorum_policy="wait", nonblocking__enabled=True,
                               nonblocking__deadline="kth:6:0.01"))


def test_a_run_stored_before_a_key_existed_is_the_same_run_at_its_default(tmp_path):
  """A workdir's config.json without a key the package added later holds the same run when
  the new config has that key's default (the old run ran as the default does), another run
  when it does not."""
  import json
  from nbsgd_jax.run import records
  cfg = config_lib.default_config()
  stored = json.loads(cfg.to_json_best_effort())
  del stored["diloco"]["overlap"]  # as written before config.diloco.overlap existed
  (tmp_path / "config.json").write_text(json.dumps(stored))
  assert records.check_workdir(cfg, str(tmp_path)) is None
  with pytest.raises(config_lib.ConfigError, match=r"config\.diloco\.overlap='eager' is not "
                                                   r"allowed: workdir .* holds a run with "
                                                   r"diloco\.overlap=None"):
    records.check_workdir(config_lib.override(cfg, {"diloco.overlap": "eager"}), str(tmp_path))
  stored["learning_rate"] = 1.0  # a key it has, another value: another run
  (tmp_path / "config.json").write_text(json.dumps(stored))
  with pytest.raises(config_lib.ConfigError, match=r"holds a run with learning_rate=1\.0"):
    records.check_workdir(cfg, str(tmp_path))
