"""Input validation (issue 8, item 5): malformed configs fail cleanly before anything is
compiled, with one line per problem naming the key, the value and what is allowed.

``validate`` is fed a table of malformed configs (wrong types, out of range values, unknown
choices, cross-field constraints, every section); the command line is checked on a few of them
(exit status 2, ``error: config.KEY...`` lines, no traceback), including what ml_collections'
flag parser rejects itself (a value of the wrong type, an unknown key).
"""

import math
import os
import re

import jax
import pytest

from nbsgd_jax import config as config_lib

from tests.helpers import MNIST_CONFIG as CONFIG, ROOT, malformed, run_main, small_cfg

TOP_K = {"compression.name": "top_k", "algorithm": "allreduce"}  # a valid compression set-up
CONTROL = {"consensus.control": True, "consensus.target": 0.1}  # a valid consensus control


def bad(key, value, **context):
  """A case: ``key`` = ``value`` (on top of the valid ``context``), whose error line must
  contain ``config.KEY=repr(value)``."""
  overrides = {k.replace("__", "."): v for k, v in context.items()}
  overrides[key] = value
  return pytest.param(overrides, f"config.{key}={value!r}", id=f"{key}={value!r}")


def cross(overrides, needle, id):
  return pytest.param(overrides, needle, id=id)


CASES = [
    # ---- wrong types
    bad("num_workers", "8"),
    bad("num_workers", 2.5),
    bad("num_workers", None),
    bad("batch_size", True),
    bad("learning_rate", None),
    bad("learning_rate", "0.1"),
    bad("momentum", "0.9"),  # (True would be cast to 1.0 by ConfigDict: a float field)
    bad("eval_every", 10.0),
    bad("algorithm", None),
    bad("topology", 3),
    bad("progress", 1),
    bad("nesterov", "yes"),
    bad("tensorboard", "yes"),
    bad("mlp_hidden", "256"),
    bad("mlp_hidden", (256, 0)),
    bad("cnn_channels", (6,)),
    bad("cnn_channels", (6, 16.5)),
    bad("data_dir", None),
    bad("dataset", 10),
    bad("norm", "layer"),
    bad("resnet_depth", 18),
    bad("optimizer", "lamb"),
    bad("adam_b2", 1.0),
    bad("norm_groups", 3),
    bad("compute_dtype", "float16"),
    bad("lm.context", 0),
    bad("lm.d_model", 1.5),
    cross({"lm.d_model": 100, "lm.num_heads": 3}, "config.lm.num_heads=3", id="lm-heads"),
    bad("augment.crop_padding", -1),
    bad("augment.flip", "yes"),
    bad("augment.normalize", 1),
    bad("checkpoint_every", 2.5),
    bad("nonblocking.enabled", 1),
    bad("compression.error_feedback", 1),
    bad("compression.flatten", None),
    bad("compression.gaussian_rounds", 2.0, **TOP_K),
    bad("diloco.outer_nesterov", "no"), bad("diloco.overlap", "late"),
    bad("consensus.per_layer", "yes"),
    bad("consensus.reference_workdir", 5),
    bad("cluster.slowdown", 3),
    bad("cluster.slowdown", ("fast", "slow")),
    bad("cluster.failures", 3),
    bad("cluster.seed", 1.5), bad("cluster.episode_rate", -1.0),
    bad("cluster.episode_median", 0.0), bad("cluster.episode_sigma", -0.5),
    bad("cluster.episode_factor", 0.5), bad("cluster.trace", 3),
    bad("cluster.failure_mtbf", -1.0), bad("cluster.failure_repair", 0.0),
    bad("cluster.failure_shape", 0.0), bad("cluster.failure_policy", "retry"),
    bad("cluster.restart_every", 0), bad("cluster.restart_seconds", -1.0),
    bad("cluster.levels", ("8:fast:1",)), bad("cluster.allreduce_group_size", -1),
    bad("cluster.placement", (0, 0)),
    # ---- out of range
    bad("num_workers", 0),
    bad("batch_size", 0),
    bad("learning_rate", -0.1),
    bad("learning_rate", 0.0),
    bad("learning_rate", math.nan),
    bad("momentum", 1.5),
    bad("momentum", 1.0),  # no decay: eta / (1 - momentum) is infinite
    bad("weight_decay", -1e-4),
    bad("num_steps", -5),
    bad("budget_unit", "grads"),
    bad("warmup_steps", -1),
    bad("lr_milestones", (0.75, 0.5), lr_schedule="step"),
    bad("lr_milestones", (0.5, 1.0), lr_schedule="step"),
    bad("lr_decay", 0.0, lr_schedule="step"),
    bad("eval_every", 0),
    bad("eval_train_examples", 0),
    bad("seed", -1),
    bad("dirichlet_alpha", 0.0),
    bad("topology_p", 1.5),
    bad("topology_rows", -2),
    bad("workers_per_device", -1),
    bad("checkpoint_every", -4),
    bad("compression.density", 0.0, **TOP_K),
    bad("compression.density", 1.5, **TOP_K),
    bad("compression.gaussian_rounds", 100, **TOP_K),
    bad("compression.levels", 0, **{"compression.name": "qsgd", "algorithm": "allreduce"}),
    bad("compression.bucket_size", 2.5, **{"compression.name": "qsgd", "algorithm": "allreduce"}),
    bad("compression.rank", 0, **{"compression.name": "powersgd", "algorithm": "allreduce"}),
    bad("streaming_diloco.fragments", 0, algorithm="streaming_diloco"),
    bad("streaming_diloco.delay", -1, algorithm="streaming_diloco"),
    bad("streaming_diloco.delay", 25, algorithm="streaming_diloco"),  # H / P = 25
    bad("sparta.density", 0.0, algorithm="sparta"), bad("sparta.density", 1.5, algorithm="sparta"),
    bad("sparta.mask", "all", algorithm="sparta"),
    bad("demo.error_decay", 1.0, algorithm="demo", momentum=0.0),
    bad("demo.top_k", 0, algorithm="demo", momentum=0.0),
    bad("demo.chunk_size", 2.5, algorithm="demo", momentum=0.0),
    *[bad(f"sparseloco.{k}", v, algorithm="sparseloco") for k, v in (
        ("local_steps", 0), ("outer_lr", 0.0), ("outer_momentum", 1.0),
        ("error_decay", -0.1), ("top_k", 0), ("chunk_size", 0), ("use_quantization", "yes"),
        ("quantization_bins", 1), ("quantization_range", 0.0))],
    *[bad(f"noloco.{k}", v, algorithm="noloco") for k, v in (
        ("local_steps", 0), ("group_size", 0), ("outer_lr", 0.0),
        ("outer_momentum", 1.0))],
    bad("epidemic.variant", "global", algorithm="epidemic"),
    bad("epidemic.graph_degree", 0, algorithm="epidemic"),
    bad("epidemic.rounds", 0, algorithm="epidemic"),
    bad("teleportation.sample_size", 1, algorithm="teleportation"),
    bad("teleportation.local_steps", 0, algorithm="teleportation"),
    bad("streaming_diloco.alpha", 1.5, algorithm="streaming_diloco"),
    bad("choco.gamma", 0.0, algorithm="choco_sgd"),
    bad("choco.gamma", 1.5, algorithm="choco_sgd"),
    bad("d2.mixing", "half", algorithm="d2"),
    bad("gossip_pga.period", 0, algorithm="gossip_pga"),
    bad("matcha.budget", 0.0),
    bad("matcha.budget", 2.0),
    bad("matcha.seed", -1),
    bad("ad_psgd.pairing", "pairs", algorithm="ad_psgd"),
    bad("ad_psgd.seed", -1, algorithm="ad_psgd"),
    bad("ad_psgd.order", "gradient_first", algorithm="ad_psgd"),
    bad("swarm_sgd.local_steps", 0, algorithm="swarm_sgd"),
    bad("swarm_sgd.seed", -1, algorithm="swarm_sgd"),
    bad("swarm_sgd.averaging", "one-sided", algorithm="swarm_sgd"),
    bad("sgp.delay", -1, algorithm="sgp"),
    bad("sgp.overlap", "yes", algorithm="sgp"),
    bad("async_diloco.buffer", -1, algorithm="async_diloco"),
    bad("async_diloco.activation", 2.0, algorithm="async_diloco"),
    bad("async_diloco.staleness_weight", "linear", algorithm="async_diloco"),
    bad("async_diloco.dynamic_local_updates", "yes", algorithm="async_diloco"),
    bad("async_diloco.min_local_steps", 0, algorithm="async_diloco"),
    bad("async_diloco.reset_inner", 1, algorithm="async_diloco"),
    bad("async_diloco.pull", "eager", algorithm="async_diloco"),
    bad("cluster.rejoin_fetch", "yes"),
    bad("cluster.allreduce_algorithm", "butterfly"),
    bad("cluster.rebuild_collectives", "yes"), bad("cluster.quorum_policy", "always"),
    bad("halos.regions", 0, algorithm="halos"),
    bad("halos.local_steps", 0, algorithm="halos"),
    bad("halos.accumulation", 1.5, algorithm="halos"),
    bad("halos.merge_weight", 1.5, algorithm="halos"),
    bad("halos.lps_lr", -1.0, algorithm="halos"),
    bad("halos.lps_momentum", 1.5, algorithm="halos"),
    bad("halos.lps_buffer", 0, algorithm="halos"),
    bad("halos.gps_lr", "fast", algorithm="halos"),
    bad("halos.gps_momentum", -0.5, algorithm="halos"),
    bad("halos.gps_buffer", 0, algorithm="halos"),
    bad("local_sgd.local_steps", 0),
    bad("local_sgd.alpha", -0.5),
    bad("local_sgd.max_local_steps", -1),
    bad("diloco.local_steps", 0),
    bad("compression.levels", 2 ** 31),  # once an OverflowError inside the jitted codec
    bad("problem.dim", 0),
    bad("problem.condition", 0.5),
    bad("lr_time_scale", 0.0),
    bad("diloco.outer_lr", 0.0),
    bad("diloco.outer_momentum", 1.0),
    bad("nonblocking.num_minibatches", 0),
    bad("consensus.max_gossip_steps", 0),
    bad("consensus.sketch_size", 0),
    bad("consensus.target", -1.0),
    bad("consensus.critical_scale", 0.0),
    bad("cluster.delay_prob", 1.5),
    bad("cluster.time_per_example", 0.0),
    bad("cluster.time_per_example", -1e-3),
    bad("cluster.overhead", -0.5),
    bad("cluster.delay_per", "step"),
    bad("nonblocking.adaptive_k", -1.0),
    bad("nonblocking.window", 0),
    bad("cluster.bandwidth", math.inf),
    bad("cluster.latency", -1e-4),
    bad("cluster.slow_factor", -4.0),
    bad("cluster.spread", -0.5),
    bad("cluster.delay_mean", -0.1),
    bad("cluster.seed", -1),
    bad("cluster.slowdown", (1.0, -2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)),
    # ---- unknown choices
    bad("algorithm", "sgdx"),
    bad("topology", "moebius"),
    bad("mixing_weights", "random"),
    bad("backend", "tpu_pod"),
    bad("model", "resnet9000"),
    bad("dataset", "imagenet"),
    bad("dataset", "tfds:"),
    bad("partition", "zipf"),
    bad("lr_schedule", "staircase"),
    bad("dpsgd.order", "first"),
    bad("compression.name", "top-k"),
    bad("compression.gaussian_correction", "newton", **TOP_K),
    bad("nonblocking.deadline", "soon"),
    bad("nonblocking.deadline", "kth:0"),
    bad("nonblocking.deadline", "-1"),
    bad("nonblocking.deadline_group", "some"),
    bad("cluster.scenario", "two_slow"),
    bad("cluster.delay", "pareto"),
    bad("cluster.failures", "3:a:5"),
    bad("local_sgd.schedule", "adaptive"),
    bad("local_sgd.averaging", "median"),
    bad("local_sgd.opt_state", "drop"),
    bad("consensus.measure", "guess"),
    # ---- cross-field (which algorithm takes which section: nbsgd_jax.recipes.combination_errors)
    cross({"topology": "torus", "topology_rows": 3, "topology_cols": 3},
          "config.topology_rows=3 x config.topology_cols=3 is not allowed with "
          "config.num_workers=8", "torus rows x cols != n"),
    cross({"topology": "torus", "topology_rows": 3},
          "config.topology_rows=3 is not allowed: it must divide config.num_workers=8",
          "torus rows not dividing n"),
    cross({"batch_size": 30, "nonblocking.num_minibatches": 4, "nonblocking.enabled": True},
          "config.batch_size=30 is not allowed with config.nonblocking.num_minibatches=4",
          "batch not divisible by M"),  # refused only when the batch is split
    cross({"compression.name": "top_k", "algorithm": "dpsgd"},
          "config.compression.name='top_k' is not allowed with config.algorithm='dpsgd'",
          "compression with dpsgd"),
    cross({**CONTROL, "algorithm": "allreduce"},
          "config.consensus.control=True is not allowed with config.algorithm='allreduce'",
          "consensus control with allreduce"),
    cross({"consensus.control": True}, "config.consensus.target=0.0, "
          "config.consensus.target_ratio=0.0 and config.consensus.critical=False are not "
          "allowed: give exactly one target", "control without target"),
    cross({**CONTROL, "consensus.target_ratio": 0.5}, "config.consensus.target=0.1, "
          "config.consensus.target_ratio=0.5 and config.consensus.critical=False are not "
          "allowed: give exactly one target", "control with two targets"),
    cross({"consensus.control": True, "consensus.target_ratio": 0.5},
          "config.consensus.target_ratio=0.5 is not allowed with "
          "config.consensus.reference_workdir=''", "target_ratio without reference_workdir"),
    cross({"algorithm": "matcha", "topology": "one_peer_exponential"},
          "config.topology='one_peer_exponential' is not allowed with config.algorithm='matcha'",
          "matcha with one_peer_exponential"),
    cross({"cluster.failures": "8:0:2"}, "config.cluster.failures='8:0:2' is not allowed: entry "
          "'8:0:2' needs 0 <= worker < 8", "failure of a worker >= n"),
    cross({"checkpoint_every": 150}, "config.checkpoint_every=150 is not allowed with "
          "config.eval_every=100", "checkpoint_every not a multiple of eval_every"),
    cross({"backend": "mesh", "workers_per_device": 3},
          "config.workers_per_device=3 is not allowed with num_workers=8",
          "workers_per_device not dividing num_workers (mesh)"),
    cross({"nonblocking.deadline": "kth:9"}, "config.nonblocking.deadline='kth:9' is not "
          "allowed: K must be <= num_workers=8", "deadline kth:K with K > n"),
    cross({"nonblocking.deadline": "0.001"}, "config.nonblocking.deadline=0.001 is not "
          "allowed: no worker can finish", "deadline before any mini-batch"),
    cross({"cluster.slowdown": (1.0, 2.0)}, "config.cluster.slowdown=[1.0, 2.0] is not "
          "allowed: it must be a list of length num_workers=8", "slowdown not one per worker"),
    # every other key of docs/config.md, one bad value each
    bad("augment.stats", "bogus"), bad("choco.order", "first"), bad("cluster.clock", "sundial"),
    bad("cluster.delay_shift", -1.0), bad("cluster.emulate", "yes"),
    bad("cluster.measure_time_per_example", "yes"), bad("cluster.step_overhead", -1.0),
    bad("consensus.critical", "yes"), bad("consensus.critical_ema", 1.5),
    bad("consensus.critical_form", "exact"), bad("consensus.log_every_step", "yes"),
    bad("consensus.smoothness", -1.0), bad("consensus.smoothness_every", 0),
    bad("consensus.smoothness_iters", 0), bad("consensus.until_step", -1),
    bad("conv_impl", "fft"), bad("data_cache", 3), bad("data_path", 3), bad("init_from", 3),
    bad("validation_examples", -1),
    bad("compilation_cache", 3), bad("sweep", 3), bad("sweep_runs", "parallel"),
    bad("double_buffer", "yes"), bad("gather_gradients", "yes"), bad("eval_worker_accuracy", "yes"), bad("grad_clip", -1.0),
    bad("eval_test_examples", -1), bad("eval_worker_examples", -5),
    bad("imports", 3), bad("lm.num_layers", 0), bad("lm.bias", "no"),
    bad("lm.tie_embeddings", 1), bad("lm.init", "torch"), bad("lm.gelu", "relu"),
    bad("lm.layernorm_eps", 0.0), bad("text_unknown_id", "no"), bad("local_sgd.num_comm", -1),
    bad("local_sgd.offset_optimum", "yes"), bad("local_sgd.switch_step", -1),
    bad("lr_min", -0.1), bad("nonblocking.unroll", "yes"), bad("overwrite", "yes"),
    bad("pool_impl", "max"), bad("residuals", "kept"),
    bad("problem.examples_per_worker", 0),
    bad("problem.full_batch", "yes"), bad("problem.heterogeneity", -1.0),
    bad("problem.l2", -1.0), bad("problem.noise", -1.0), bad("problem.seed", -1),
    bad("problem.shards", -1), bad("steps_per_dispatch", -1), bad("stop_sim_time", -1.0),
    bad("stop_train_loss", -1.0), bad("stop_step", -1), bad("stop_step", 2.5), bad("topology_cols", -1), bad("topology_seed", -1),
    bad("weight_decay_on", "biases"),
    cross({"algorithm": "diloco", "num_steps": 20}, "config.diloco.local_steps=50 is not "
          "allowed with config.num_steps=20: the run would end before its first communication",
          "DiLoCo period longer than the run"),
    cross({"algorithm": "local_sgd", "local_sgd.local_steps": 30, "num_steps": 20},
          "config.local_sgd.local_steps=30 is not allowed with config.num_steps=20",
          "local SGD period longer than the run"),
    # ---- accepted in silence once (issue 70, item 4; tests/run/test_silent_inputs.py)
    bad("cluster.levels", ("3:0:1e9",)),  # groups of 3 in 8 workers
    bad("cluster.levels", ("16:0:1e9",)),  # a group bigger than the cluster
    bad("cluster.levels", ("2:0:1e9", "3:0:1e9")),  # groups of 6 in 8
    bad("halos.regions", 4, algorithm="halos", cluster__levels=("4:0:1e9",)),  # 2 groups of 4
    cross({"algorithm": "halos", "num_steps": 20}, "config.halos.accumulation=32 is not "
          "allowed with config.num_steps=20: the run would end before its evaluated model "
          "first changes, at step 145 at the earliest", "HALoS's global model never steps"),
    cross({"algorithm": "async_diloco", "num_steps": 50}, "config.diloco.local_steps=50 is "
          "not allowed with config.num_steps=50: the run would end before its evaluated model "
          "first changes, at step 51 at the earliest", "async DiLoCo's server never steps"),
    cross({"algorithm": "diloco", "diloco.overlap": "delayed", "num_steps": 60},
          "config.diloco.local_steps=50 is not allowed with config.diloco.overlap='delayed' "
          "and config.num_steps=60", "delayed DiLoCo's outer model never steps"),
]

LINE = re.compile(r"^config\.[a-z_][a-z_0-9]*(\.[a-z_0-9]+)?[= ]")


@pytest.fixture
def no_compilation():
  """Fails the test if JAX compiles or traces anything while it runs."""
  events = []

  def listener(name, *args, **kwargs):
    if "/jax/core/compile" in name:
      events.append(name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  yield events
  jax.monitoring.unregister_event_duration_listener(listener)
  assert not events, events


def test_table_has_a_bad_value_for_every_key_of_the_reference():
  """Every key of docs/config.md (``default_config()``) is the subject of some case's error."""
  keys = set(config_lib.flatten_dict(config_lib.default_config().to_dict()))
  named = {re.match(r"config\.([\w.]+)[= ]", p.values[1]).group(1) for p in CASES}
  assert keys <= named, sorted(keys - named)


def test_table_is_large_and_covers_every_section():
  assert len(CASES) >= 40
  named = {k.split(".")[0] for p in CASES for k in p.values[0]}
  sections = {k for k, v in config_lib.default_config().items() if hasattr(v, "items")}
  assert sections <= named, sections - named


def test_the_base_configs_are_valid():
  config_lib.validate(config_lib.default_config())
  config_lib.validate(malformed(TOP_K))
  config_lib.validate(malformed(CONTROL))


@pytest.mark.parametrize("overrides,needle", CASES)
def test_malformed_config_fails_cleanly(overrides, needle, no_compilation):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(malformed(overrides))
  errors = e.value.errors
  assert errors and str(e.value) == "\n".join(errors)
  for line in errors:
    assert "\n" not in line and LINE.match(line) and re.search(r"(is|are) not allowed", line), line
  assert len(errors) == 1, errors  # each case is one problem: one line
  assert needle in errors[0], errors


def test_all_errors_listed_at_once(no_compilation):
  """Problems in several sections are all reported, one line each (the cluster checks are
  not skipped because something else is wrong)."""
  overrides = {"algorithm": "sgdx", "num_workers": 0, "learning_rate": -1.0, "progress": 1,
               "checkpoint_every": 7, "matcha.budget": 2.0, "cluster.delay_prob": 1.5,
               "cluster.scenario": "two_slow", "nonblocking.deadline": "soon",
               "local_sgd.local_steps": 0, "consensus.measure": "guess", "compression.name": "top-k"}
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(malformed(overrides))
  errors = e.value.errors
  assert len(errors) == len(overrides), errors
  for key, value in overrides.items():
    assert sum(l.startswith(f"config.{key}={value!r} is not allowed") for l in errors) == 1, key


@pytest.mark.parametrize("key,value,allowed", [
    ("num_workers", "abc", "an integer"),
    ("num_workers", 2.5, "an integer"),
    ("learning_rate", "fast", "a number"),
    ("progress", 1, "True or False"),
    ("algorithm", 3, "a string"),
    ("cluster.delay_prob", "often", "a number"),
])
def test_override_rejects_wrong_types(key, value, allowed):
  """``config.override`` (scripts, tests) turns ConfigDict's TypeError into a ConfigError."""
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.override(config_lib.default_config(), {key: value})
  assert e.value.errors == [f"config.{key}={value!r} is not allowed: it must be {allowed}"]


# ----------------------------------------------------------------------------- command line


def error_lines(r):
  assert "Traceback" not in r.stderr, r.stderr
  assert r.returncode == 2, r.stderr
  return [l for l in r.stderr.splitlines() if l.startswith("error: ")]


@pytest.mark.slow
def test_cli_lists_every_bad_key(tmp_path):
  overrides = {"algorithm": "sgdx", "num_workers": "0", "batch_size": "0",
               "learning_rate": "-0.1", "momentum": "1.5", "eval_every": "0",
               "checkpoint_every": "-1", "compression.density": "0.0",
               "compression.name": "rand", "matcha.budget": "2.0", "cluster.delay_prob": "1.5",
               "cluster.scenario": "two_slow", "nonblocking.deadline": "soon",
               "local_sgd.local_steps": "0", "diloco.outer_momentum": "1.0",
               "consensus.max_gossip_steps": "0", "dpsgd.order": "first", "mlp_hidden": "(0,)"}
  del overrides["compression.density"]  # unchecked while compression.name is not valid
  r = run_main(tmp_path, *(f"--config.{k}={v}" for k, v in overrides.items()))
  errors = error_lines(r)
  assert len(errors) == len(overrides), r.stderr
  for key in overrides:
    assert sum(l.startswith(f"error: config.{key}=") for l in errors) == 1, (key, errors)
  assert not (tmp_path / "run").exists()


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
@pytest.mark.parametrize("config,args,expected", [
    (CONFIG, ["--config.num_workers=abc"],
     ["error: config.num_workers='abc' is not allowed: it must be an integer"]),
    (CONFIG, ["--config.progress=maybe", "--config.learning_rate=None"],  # absl stops at the first
     ["error: config.progress='maybe' is not allowed: it must be True or False"]),
    (CONFIG, ["--config.nonexistent=1", "--config.num_worker=3"],
     ["error: config.nonexistent is not a configuration key",
      "error: config.num_worker is not a configuration key (did you mean config.num_workers?)"]),
    ("experiments/configs/no_such_config.py", [],
     ["error: --config=experiments/configs/no_such_config.py could not be loaded: [Errno 2] "
      "No such file or directory: 'experiments/configs/no_such_config.py'"]),
])
def test_cli_rejects_what_the_flag_parser_cannot_read(tmp_path, config, args, expected):
  """Rejected while the flags are parsed (absl alone: exit 1 or a traceback)."""
  r = run_main(tmp_path, *args, config=config)
  assert error_lines(r) == expected, r.stderr
  assert not (tmp_path / "run").exists()


def test_train_refuses_a_key_the_defaults_lack_with_the_clis_message(tmp_path):
  """The Python API is as strict as the command line: a typo is not trained with defaults."""
  from nbsgd_jax import train
  cfg = config_lib.default_config()
  cfg.learnin_rate = 0.3
  cfg.choco.ordr = "x"
  with pytest.raises(config_lib.ConfigError) as e:
    train.train(cfg, str(tmp_path / "run"))
  assert e.value.errors == [
      "config.choco.ordr is not a configuration key (did you mean config.choco.order?)",
      "config.learnin_rate is not a configuration key (did you mean config.learning_rate?)"]
  assert not (tmp_path / "run").exists()


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
def test_cli_names_an_unusable_workdir_and_an_unreadable_config_file(tmp_path):
  (tmp_path / "afile").write_text("not a directory")
  r = run_main(tmp_path, f"--workdir={tmp_path / 'afile' / 'sub'}", "--config.num_steps=1")
  assert error_lines(r) == [f"error: workdir '{tmp_path / 'afile' / 'sub'}' cannot be used: "
                            "Not a directory (a part of the path is a file)"]
  r = run_main(tmp_path, config="README.md")
  assert len(error_lines(r)) == 1
  assert re.match(r"error: --config=README.md could not be loaded: SyntaxError: .*README.md, "
                  r"line \d+", error_lines(r)[0]), r.stderr
  # an exception raised by the file itself: its type, message and line (a KeyError is not
  # taken for an unknown --config.KEY)
  raising = tmp_path / "raising.py"
  raising.write_text("import os\nfrom nbsgd_jax.config import default_config\n\n"
                     "def get_config():\n  c = default_config()\n"
                     "  c.data_path = os.environ['NO_SUCH_DATA_ROOT']\n  return c\n")
  r = run_main(tmp_path, config=str(raising))
  assert error_lines(r) == [
      f"error: --config={raising} could not be loaded: KeyError: 'NO_SUCH_DATA_ROOT' at line "
      "6 (c.data_path = os.environ['NO_SUCH_DATA_ROOT'])"], r.stderr
  assert not (tmp_path / "run").exists()


def test_odd_values_are_warned_not_refused():
  cfg = config_lib.override(config_lib.default_config(), {
      "warmup_steps": 2000, "steps_per_dispatch": 3, "algorithm": "local_sgd",
      "local_sgd.schedule": "post_local", "local_sgd.local_steps": 5000})  # post-local: tau after
  config_lib.validate(cfg)
  assert config_lib.odd_warnings(cfg) == [
      "config.warmup_steps=2000 is longer than the run (config.num_steps=1000): the learning "
      "rate never reaches config.learning_rate=0.05",
      "config.steps_per_dispatch=3 does not divide config.eval_every=100: every shorter block "
      "before an evaluation compiles once more"]


@pytest.mark.parametrize("overrides,expected", [
    ({"algorithm": "streaming_diloco", "streaming_diloco.fragments": 5, "diloco.local_steps": 5},
     "config.streaming_diloco.fragments=5 is not allowed: the model has 4 parameter arrays"),
])
def test_values_that_do_not_fit_the_model_are_refused_before_anything_is_written(
    tmp_path, overrides, expected):
  from nbsgd_jax import train
  with pytest.raises(config_lib.ConfigError) as e:
    train.train(small_cfg(**overrides), str(tmp_path / "run"))
  assert len(e.value.errors) == 1 and e.value.errors[0].startswith(expected), e.value.errors
  assert not (tmp_path / "run").exists()


def test_powersgd_at_full_rank_is_a_warning_not_a_refusal():
  """Full rank is all-reduce, the method's sanity check: legal, but it saves no bytes."""
  from nbsgd_jax.run import setup as setup_lib
  s = setup_lib.setup(small_cfg(**{"algorithm": "allreduce", "compression.name": "powersgd",
                                   "compression.rank": 100000}))
  # 784-32-10: 32 (784 + 32) + 10 (32 + 10) + 42 sent at full rank, 25,088 + 320 + 42 dense
  assert setup_lib.check_model_fit(s) == [
      "config.compression.rank=100000 saves no bytes: it sends 26,574 entries per step, the "
      "dense message 25,450 (the model's matrices have smaller sides 10 to 32); full rank is "
      "all-reduce (a sanity check), a rank well below the smaller sides compresses"]
  s = setup_lib.setup(small_cfg(**{"algorithm": "allreduce", "compression.name": "powersgd",
                                   "compression.rank": 2}))
  assert setup_lib.check_model_fit(s) == []


def test_more_train_loss_examples_than_the_data_has_is_a_warning():
  from nbsgd_jax.run import setup as setup_lib
  s = setup_lib.setup(small_cfg(eval_train_examples=20000))
  assert setup_lib.check_model_fit(s) == [
      "config.eval_train_examples=20000 is more than the 8,000 training examples: train_loss "
      "is measured on all of them"]


def test_the_guides_example_error_is_the_one_the_code_gives():
  cfg = config_lib.override(config_lib.default_config(), {"algorithm": "sgdx"})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  with open(os.path.join(ROOT, "docs", "guide.md")) as f:
    assert f"\nerror: {e.value.errors[0]}\n" in f.read()
