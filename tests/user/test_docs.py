"""The documentation against the code: the generated configuration reference
(``docs/config.md``) is up to date and complete, and every command of the README and of the
pages of ``docs/`` (all but ``config.md``) runs as written (the quick ones, here, in a copy of the
repository) or passes its checks (``scripts/check_docs_commands.py``: program, ``--help``
flags, config overrides and validation); the links and images of the README and of the pages
that hold its former sections exist."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import config_doc

from tests.helpers import ROOT, load_module



def _load_checker():
  return load_module("scripts", "check_docs_commands.py", register=True)


checker = _load_checker()


def _read(path):
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


# ----------------------------------------------------------------------------- config.md


@pytest.fixture(scope="module")
def collected():
  """``config_doc.collect()`` once for the module's tests (it validates ~700 probes: 5 s)."""
  return config_doc.collect()


@pytest.mark.slow
def test_config_md_is_generated_from_the_code(collected, monkeypatch):
  monkeypatch.setattr(config_doc, "collect", lambda: collected)
  assert _read(config_doc.OUT) == config_doc.generate(), (
      f"docs/config.md is stale: run {config_doc.COMMAND}")


@pytest.mark.slow
def test_config_md_lists_every_key_with_default_and_comment(collected):
  text = _read(config_doc.OUT)
  rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w.]+)` \|.*$", text, re.M)}
  keys = [k for k, v in config_doc.config_keys() if not hasattr(v, "items")]
  sections = [k for k, v in config_doc.config_keys() if hasattr(v, "items")]
  assert len(keys) > 50
  missing = [k for k in keys if k not in rows]
  assert not missing, f"keys of default_config() missing from docs/config.md: {missing}"
  for sec in sections:
    assert re.search(rf"^## `{re.escape(sec)}`", text, re.M), sec
  for d in collected:
    if d.section:
      continue
    assert d.comment, f"{d.key} has no comment in default_config()"
    assert d.allowed, f"validate() says nothing about a bad {d.key}"


@pytest.mark.slow
def test_config_doc_facts_come_from_comments_and_validate(collected):
  docs = {d.key: d for d in collected}
  # choice tuples, through validate's message
  assert all(a in docs["algorithm"].allowed[0] for a in config_lib.ALGORITHMS)
  assert all(t in docs["topology"].allowed[0] for t in config_lib.TOPOLOGIES)
  # ranges
  assert docs["num_workers"].allowed == ["it must be an integer >= 1"]
  assert docs["matcha.budget"].allowed == ["it must be a number > 0 and <= 1"]
  assert docs["compression.density"].allowed == ["it must be a number > 0 and <= 1"]  # context
  assert docs["nesterov"].allowed == ["use True or False"]
  # comments, continuation lines joined; units
  assert "multihost" in docs["backend"].comment and "mesh" in docs["backend"].comment
  assert docs["cluster.latency"].unit == "s" and docs["cluster.bandwidth"].unit == "bytes/s"
  assert docs["num_steps"].unit == "steps" and docs["learning_rate"].unit == "-"
  assert docs["cluster"].section and "He & Dube" in docs["cluster"].comment
  # defaults are the values of default_config()
  assert docs["cluster.bandwidth"].default == config_lib.default_config().cluster.bandwidth
  assert "| `cluster.bandwidth` | `1e9` | float |" in config_doc.render(list(docs.values()))


def test_source_comments_parser():
  def fake_config():
    import ml_collections
    cfg = ml_collections.ConfigDict()
    cfg.a = 1  # first line
               # second line
    # a standalone comment, not a continuation
    cfg.sec = ml_collections.ConfigDict()  # a section
    cfg.sec.b = "x"  # b's comment
    cfg.c = (1,
             2)  # after a bracket
    return cfg
  got = config_doc.source_comments(fake_config)
  assert got == {"a": "first line second line", "sec": "a section", "sec.b": "b's comment",
                 "c": "after a bracket"}


@pytest.mark.slow
def test_config_doc_check_flag(tmp_path, monkeypatch, collected):
  monkeypatch.setattr(config_doc, "collect", lambda: collected)
  good, bad = tmp_path / "good.md", tmp_path / "bad.md"
  good.write_text(config_doc.generate())
  bad.write_text(config_doc.generate().replace("`8`", "`9`", 1))
  assert config_doc.main(["--check", str(good)]) == 0
  assert config_doc.main(["--check", str(bad)]) == 1


# ----------------------------------------------------------------------------- commands


def test_extract_commands():
  md = "\n".join([
      "text", "```bash", "# a comment", "", "python -m a --x=1 \\", "  --y=2",
      "FOO=1 python b.py", "```", "```", "python not_a_bash_block.py", "```",
      "```text", "error: nothing", "```", "  ```sh", "  echo indented", "  ```"])
  cmds = checker.extract(md, "X.md")
  assert [(c.line, c.text) for c in cmds] == [
      (5, "python -m a --x=1 --y=2"), (7, "FOO=1 python b.py"), (16, "echo indented")]
  with pytest.raises(ValueError):
    checker.extract("```bash\necho a \\\n```\n", "X.md")
  with pytest.raises(ValueError):
    checker.extract("```bash\necho a\n", "X.md")


@pytest.fixture(scope="module")
def commands():
  cmds = checker.doc_commands(ROOT)
  # every page is read (a page without a ```bash block has none); the README and the guide
  # hold commands
  assert set(checker.FIRST_DOCS) <= {c.doc for c in cmds} <= set(checker.DOCS)
  assert set(checker.DOCS) >= {"README.md", "docs/guide.md", "docs/results.md",
                               "docs/algorithms.md"}
  assert "docs/config.md" not in checker.DOCS
  return cmds


def test_every_class_rule_is_used(commands):
  """The explicit lists name real commands (a stale entry would hide nothing, but says the
  docs changed)."""
  for _, rules in checker.CLASSES:
    for pattern, why in rules:
      assert any(re.search(pattern, c.text) for c in commands), (pattern, why)


@pytest.mark.slow  # the checker's own test; the docs' checks stay fast
def test_checker_finds_problems():
  """The checks can fail: a bad value, an unknown key, a missing file or flag, an extra."""
  main = "python -m nbsgd_jax.main --config=experiments/configs/quickstart.py --workdir=runs/x"
  assert checker.check(main) == []
  assert any("validate: config.algorithm='sgdx'" in p
             for p in checker.check(main + " --config.algorithm=sgdx"))
  assert checker.check(main + " --config.num_worker=3")  # unknown key
  assert checker.check(main + " --config.num_workers=abc")  # wrong type
  assert any("--wrkdir" in p for p in checker.check(main.replace("--workdir", "--wrkdir")))
  # --config.imports first, as the program: an outside algorithm's own keys exist
  easgd = main + " --config.imports=examples.easgd --config.algorithm=easgd"
  assert checker.check(easgd + " --config.easgd.local_steps=3") == []
  assert checker.check(easgd + " --config.easgd.beta=2.0") == [
      "validate: config.easgd.beta=2.0 is not allowed: it must be a number > 0 and <= 1"]
  assert "easgd" not in config_lib.algorithm_names()  # the checker's process: built-ins only
  assert checker.check("python -m nbsgd_jax.main --config=experiments/configs/nope.py")
  assert any("--nope" in p for p in checker.check(
      "python experiments/topology_table.py --nope=1"))
  assert checker.check("python experiments/not_there.py")
  assert checker.check("python -m nbsgd_jax.not_a_module")
  assert checker.check('pip install -e ".[no_such_extra]"')
  assert any("validate" in p for p in checker.check(
      "python -m nbsgd_jax.launch --num_processes=2 -- --config=experiments/configs/"
      "quickstart.py --workdir=runs/x --config.num_workers=0"))


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.slow
@pytest.mark.long  # 50 s of --help subprocesses; scripts/check_docs_commands.py does the same
def test_long_and_hardware_commands_pass_their_checks(commands):
  results = checker.process([c for c in commands if c.kind != "quick"], run=False,
                            skip_long=True, cwd=ROOT, timeout=60)
  bad = [checker.format_result(r) for r in results if r.status == "problems"]
  assert not bad, "\n".join(bad)
  assert sum(r.status == "checked" for r in results) >= 15


@pytest.mark.slow
def test_quick_commands_pass_their_checks(commands):
  """The slow tier's check of the quick commands (test_quick_commands_run_as_written, the
  long tier, runs them): each program exists, its flags are in its ``--help``, its config
  overrides name real keys and pass ``validate``. The quick start's three runs and its report
  run in test_notebook, through the same configuration (test_notebook_config_is_the_...)."""
  quick = [c for c in commands if c.kind == "quick"]
  assert sum("nbsgd_jax.main" in c.text for c in quick) >= 3
  results = checker.process(quick, run=False, skip_long=True, cwd=ROOT, timeout=60)
  bad = [checker.format_result(r) for r in results if r.status != "checked"]
  assert not bad, "\n".join(bad)


@pytest.mark.optimized  # a long run: XLA's optimisations pay (tests/conftest.py)
@pytest.mark.long  # 80 s: three 200-step runs, the report, config_doc and design.md's blocks
def test_quick_commands_run_as_written(commands, tmp_path):
  """A new user's session: a copy of the repository, the quick commands of the README and the
  pages of docs/ in order, unchanged."""
  quick = [c for c in commands if c.kind == "quick"]
  texts = [c.text for c in quick]
  assert any("nbsgd_jax.report" in t for t in texts)
  assert sum("nbsgd_jax.main" in t for t in texts) >= 3
  cwd = str(tmp_path / "clone")
  os.makedirs(cwd)
  checker.copy_repo(ROOT, cwd)
  assert not os.path.exists(os.path.join(cwd, "runs"))
  results = checker.process(quick, run=True, skip_long=True, cwd=cwd, timeout=300)
  bad = [checker.format_result(r) for r in results if r.status == "failed"]
  assert not bad, "\n".join(bad)
  assert any(r.status == "ok" for r in results)
  report = os.path.join(cwd, "runs", "report")
  for f in ("report.md", "loss_accuracy_vs_sim_time.png", "consensus_distance.png"):
    assert os.path.isfile(os.path.join(report, f)), f
  md = open(os.path.join(report, "report.md")).read()
  for run in ("dpsgd", "allreduce", "dpsgd_nonblocking"):
    assert f"| {run} |" in md
  # the regenerated reference in the copy is the committed one
  assert open(os.path.join(cwd, "docs", "config.md")).read() == _read("docs/config.md")
  shutil.rmtree(cwd, ignore_errors=True)


# ----------------------------------------------------------------------------- links


def _anchors(path):
  """GitHub's heading anchors of a markdown file."""
  with open(path) as f:
    heads = re.findall(r"^#{1,6} +(.+?) *$", f.read(), re.M)
  return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md", "docs/algorithms.md",
                                 "docs/results.md"])
def test_relative_links_images_and_anchors_exist(doc):
  text = _read(doc)
  text = re.sub(r"```.*?```", "", text, flags=re.S)  # not in code blocks
  base = os.path.dirname(os.path.join(ROOT, doc))
  targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text)
             if not re.match(r"^(https?:|mailto:)", t)]
  assert targets
  broken = []
  for t in targets:
    path, _, anchor = t.partition("#")
    full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, doc)
    if not os.path.exists(full):
      broken.append(t)
    elif anchor and anchor not in _anchors(full):
      broken.append(t)
  assert not broken, f"{doc}: broken links {broken}"


def test_readme_links_the_guide_and_shows_a_report_plot():
  readme = _read("README.md")
  assert "](docs/guide.md)" in readme and "](docs/config.md)" in readme
  assert "![" in readme and "(docs/guide/report_loss_accuracy_vs_sim_time.png)" in readme
  png = os.path.join(ROOT, "docs", "guide", "report_loss_accuracy_vs_sim_time.png")
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(png) < 200_000


def test_guide_results_cover_every_reproduction():
  guide = _read("docs/guide.md")
  scripts = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments"))
                   if f.startswith("reproduce_") and f.endswith(".py"))
  assert scripts
  for s in scripts:
    name = s[len("reproduce_"):-3]
    assert f"python experiments/{s} --out docs/{name}" in guide, s
    assert f"]({name}/results.md)" in guide, name
    assert re.search(rf"!\[[^\]]*\]\({name}/[\w.]+\.png\)", guide), name
