"""A bad study is refused before anything trains: one line per problem, naming the field, the
value and what is allowed; through the command line, ``error:`` lines and exit status 2."""

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.study import __main__ as cli
from nbsgd_jax.study import schema

from tests.helpers import ROOT

GOOD = {"base": {"dataset": "least_squares", "num_workers": 2},
        "methods": {"dpsgd": {"overrides": {"algorithm": "dpsgd"},
                              "grid": {"learning_rate": [0.1, 0.2]}}},
        "tune": {"seeds": 9}, "seeds": [0, 1], "budget": {"num_steps": 10}}


def _errors(**fields):
  with pytest.raises(config_lib.ConfigError) as e:
    study = schema.check({**GOOD, **fields})
    schema.validate(study, schema.base_config(study))
  return e.value.errors


@pytest.mark.parametrize("fields,line", [
    ({"colour": "red"}, "study.colour='red' is not allowed: study has the fields base, methods, "
     "variants, tune, seeds, budget, columns, quick, claims, trend, prefix"),
    ({"methods": {"dpsgd": {"overrides": {"algorithm": "dpsgd"}}}},
     "study.methods.dpsgd.grid=None is not allowed: a method needs a tuning grid {key: "
     "[values]} with at least one key"),
    ({"tune": {"seeds": [1]}}, "study.tune.seeds=[1] is not allowed: seed(s) 1 also in "
     "study.seeds=[0, 1]; the seed that tunes must not be reported"),
    ({"budget": {"num_steps": 0}}, "study.budget={'num_steps': 0} is not allowed: it must be "
     "one of {'num_steps': N}, {'grads_per_worker': N} with N a positive integer"),
    ({"columns": ["gap at equal wall_time"]}, "study.columns entry 'gap at equal wall_time' is "
     "not allowed: a column is one of 'final METRIC', 'METRIC at equal X', 'METRIC gap to "
     "METHOD', 'X to METRIC <= TARGET', 'X to METRIC >= TARGET', with X one of sim_time, "
     "bytes_sent, grads_per_worker, step"),
    ({"tune": {"seeds": 9, "variant": "slow"}}, "study.tune.variant='slow' is not allowed: it "
     "must be one of the variants 'default', or 'each' (each variant tuned on its own)"),
    ({"variants": {"top_k": {"compression": {"name": "top_k"}}}},
     "method dpsgd, variant top_k: config.compression.name='top_k' is not allowed with "
     "config.algorithm='dpsgd': gossip exchanges models, not gradients; compressed gossip "
     "needs CHOCO-SGD's public copies x_hat"),
    ({"base": {"dataset": "least_squares", "learnin_rate": 0.1}},
     "config.learnin_rate is not a configuration key (did you mean config.learning_rate?)"),
])
def test_each_bad_field_is_one_line(fields, line):
  assert _errors(**fields) == [line]


def test_a_good_study_composes_its_runs():
  study = schema.check(GOOD)
  cfg = schema.compose(study, schema.base_config(study), "dpsgd", "default",
                       {"learning_rate": 0.2}, 1)
  assert (cfg.algorithm, cfg.learning_rate, cfg.seed, cfg.num_steps, cfg.num_workers,
          cfg.progress) == ("dpsgd", 0.2, 1, 10, 2, False)


def test_the_command_line_prints_error_lines_and_exits_2(tmp_path, capsys):
  path = tmp_path / "bad_study.py"
  path.write_text("def get_study():\n  return {'methods': {'dpsgd': {}}, 'seeds': [0], "
                  "'tune': {'seeds': 0}, 'budget': {'num_steps': 5}}\n")
  assert cli.main([str(path), "--out", str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err.splitlines()
  assert err == [
      "error: study.methods.dpsgd.grid=None is not allowed: a method needs a tuning grid "
      "{key: [values]} with at least one key",
      "error: study.tune.seeds=[0] is not allowed: seed(s) 0 also in study.seeds=[0]; the seed "
      "that tunes must not be reported"]
  assert not (tmp_path / "out").exists()  # nothing written


def test_a_base_config_file_is_read_relative_to_the_current_directory(monkeypatch):
  monkeypatch.chdir(ROOT)
  study = schema.check({**GOOD, "base": "experiments/configs/quickstart.py"})
  cfg = schema.compose(study, schema.base_config(study), "dpsgd", "default",
                       {"learning_rate": 0.1}, 0)
  assert (cfg.model, cfg.dataset, cfg.num_steps, cfg.cluster.spread) == ("mlp", "mnist10k", 10, 0.3)


def test_variants_restricts_the_study_and_names_a_bad_variant():
  raw = {**GOOD, "variants": {"a": {}, "b": {"momentum": 0.5}}}
  study = schema.check(raw)
  assert list(schema.only_variants(study, ["b", "a"]).variants) == ["a", "b"]
  assert schema.only_variants(study, None) is study
  with pytest.raises(config_lib.ConfigError) as e:
    schema.only_variants(study, ["b", "c"])
  assert e.value.errors == [
      "--variants 'c' is not allowed: the study's variants are a, b",
      "--variants b c is not allowed: the methods are tuned on 'a', which must be among them"]
  each = schema.check({**raw, "tune": {**raw["tune"], "variant": "each"}})
  assert list(schema.only_variants(each, ["b"]).variants) == ["b"]
