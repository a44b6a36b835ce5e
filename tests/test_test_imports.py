"""No test module imports another (issue 70, item 6e): code two test files share lives in
``tests/helpers.py`` (or ``tests/references/``), so running one file never collects, imports or
depends on another's tests."""

import ast
import glob
import os

from tests.helpers import ROOT


def imported_tests(path):
  """The ``tests.X...test_Y`` modules that the file at ``path`` imports (anywhere in it)."""
  found = []
  for node in ast.walk(ast.parse(open(path).read())):
    names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
             else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
    found += [n for n in names if n.startswith("tests.")
              and n.rsplit(".", 1)[-1].startswith("test_")]
  return sorted(found)


def test_no_test_module_imports_another():
  files = glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True)
  assert len(files) > 50
  bad = {os.path.relpath(f, ROOT): imported_tests(f) for f in files if imported_tests(f)}
  assert not bad, f"move the shared code to tests/helpers.py: {bad}"


def test_the_check_finds_a_test_module_import(tmp_path):
  p = tmp_path / "test_x.py"
  p.write_text("import os\nfrom tests.helpers import ROOT\n"
               "def f():\n  from tests.algorithms.test_composition import cell_cfg\n"
               "import tests.run.test_sweeps as s\n")
  assert imported_tests(str(p)) == ["tests.algorithms.test_composition", "tests.run.test_sweeps"]
