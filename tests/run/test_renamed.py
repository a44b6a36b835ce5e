"""One name per concept (``nbsgd_jax/config/renamed.py``): each concept has one key name in
every section, an old name is refused with its new one (as an override, on the command line,
as a sweep axis), and a ``config.json`` written before a rename still resumes."""

import json

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.config import renamed
from nbsgd_jax.run import grid, records

from tests.helpers import run_main, small_cfg

OLD_LEAVES = {"inner_steps", "number_of_local_steps", "outer_learning_rate", "compression_topk",
              "compression_chunk", "compression_decay", "local_group_size", "synch_freq",
              "tau", "max_tau", "p", "allreduce_group", "min_inner_steps"}


def _keys():
  return config_lib.flatten_dict(config_lib.default_config().to_dict())


def test_every_concept_has_one_name_in_every_section():
  """The table's keys exist and each ends in the concept's name; no key of the config keeps a
  leaf of a renamed one (a new section bringing back ``inner_steps`` fails here)."""
  keys = _keys()
  for c in renamed.CONCEPTS:
    for key in c.keys:
      leaf = key.rsplit(".", 1)[-1]
      assert key in keys, key
      assert leaf == c.name or leaf.endswith("_" + c.name), (c.name, key)
  assert not {k for k in keys if k.rsplit(".", 1)[-1] in OLD_LEAVES}


@pytest.mark.parametrize("old", list(renamed.RENAMED))
def test_an_old_name_is_refused_with_its_new_one(old):
  new = renamed.RENAMED[old]
  assert new in _keys() and old not in _keys()
  want = f"config.{old} was renamed config.{new}"
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.override(config_lib.default_config(), {old: 1})
  assert len(e.value.errors) == 1 and e.value.errors[0].startswith(want), e.value.errors
  with pytest.raises(config_lib.ConfigError) as e:
    grid.parse(f"{old}=1,2", small_cfg())
  assert e.value.errors == [f"config.sweep: {want} (one name per concept: docs/config.md, "
                            "'One name per concept')"], e.value.errors


def test_a_run_recorded_before_a_rename_resumes(tmp_path):
  """A workdir whose ``config.json`` has ``diloco.inner_steps`` = 7 is the same run as today's
  ``diloco.local_steps`` = 7 (resumed, not refused) and another run than ``= 8``."""
  cfg = small_cfg(algorithm="diloco", **{"diloco.local_steps": 7})
  stored = json.loads(cfg.to_json_best_effort())
  stored["diloco"]["inner_steps"] = stored["diloco"].pop("local_steps")
  (tmp_path / "config.json").write_text(json.dumps(stored))
  assert records.check_workdir(cfg, str(tmp_path)) is None
  cfg.diloco.local_steps = 8
  with pytest.raises(config_lib.ConfigError, match=r"config\.diloco\.local_steps=8 .* with "
                     r"diloco\.local_steps=7"):
    records.check_workdir(cfg, str(tmp_path))


@pytest.mark.slow  # a process of its own (7 s)
def test_the_command_line_refuses_an_old_name_naming_the_new(tmp_path):
  r = run_main(tmp_path, "--config.diloco.inner_steps=5", "--config.sparta.p=0.1")
  assert r.returncode == 2, r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert errors == [
      "error: config.diloco.inner_steps was renamed config.diloco.local_steps (one name per "
      "concept: docs/config.md, 'One name per concept')",
      "error: config.sparta.p was renamed config.sparta.density (one name per concept: "
      "docs/config.md, 'One name per concept')"], r.stderr
  assert not (tmp_path / "run").exists()
