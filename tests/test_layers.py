"""The package's structure (``docs/design.md``, "Layers and folders"), read from the source
with :mod:`ast`: one direction of imports between the layers of docs/design.md and no import
cycle (imports inside functions included), a reason for each import made inside a function, no algorithm or
codec name compared outside its registry, functions and modules short enough to read."""

import ast
import os

import pytest

from nbsgd_jax import codecs, config, recipes

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nbsgd_jax")

# the layers, lowest first, by folder (or module at the root): a module imports from its own
# layer or those below
LAYERS = {
    "base": ("core",),
    "device": ("models", "topology", "codecs", "communications", "transforms"),
    "host": ("host", "data"),
    "build": ("recipes", "config"),
    "run": ("run",),
    "study": ("study",),
    "programs": ("train", "tx", "main", "launch", "report", "config_doc"),
}
# the package root holds the public faces only; everything else lives in a folder
MAX_ROOT_MODULES = 10
# the imports made inside a function, each with its reason
IN_FUNCTION = {
    ("nbsgd_jax.main", "nbsgd_jax.config"): "start-up: --help answers without importing jax",
    ("nbsgd_jax.main", "nbsgd_jax.train"): "start-up: --help answers without importing jax",
    ("nbsgd_jax.main", "nbsgd_jax.core.multihost"): "start-up: only a multi-process run needs it",
    ("nbsgd_jax.run.loop", "nbsgd_jax.core.checkpoint"): "start-up: orbax, only with checkpoints",
    ("nbsgd_jax.run.setup", "nbsgd_jax.core.checkpoint"): "start-up: orbax, only with init_from",
    ("nbsgd_jax.run.records", "nbsgd_jax.core.tensorboard"): "optional dependency (tensorboardX)",
}


def _modules():
  """``{dotted name: (path, ast)}`` of every module of the package."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        name = os.path.relpath(path[:-3], os.path.dirname(PACKAGE)).replace(os.sep, ".")
        name = name[:-len(".__init__")] if name.endswith(".__init__") else name
        with open(path) as fh:
          out[name] = (path, ast.parse(fh.read()))
  return out


MODULES = _modules()


def _targets(module, node):
  """The package's modules an import statement loads (its packages' ``__init__`` too)."""
  if isinstance(node, ast.ImportFrom):
    base = module if MODULES[module][0].endswith("__init__.py") else module.rsplit(".", 1)[0]
    for _ in range(max(node.level - 1, 0)):
      base = base.rsplit(".", 1)[0]
    src = (base + "." + node.module if node.module else base) if node.level else node.module
    names = [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names]
  else:
    names = [a.name for a in node.names]
  out = set()
  for name in names:
    parts = name.split(".")
    out.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
  return {t for t in out if t in MODULES and t != module and not module.startswith(t + ".")}


def _imports():
  """``[(module, target, inside a function)]`` for every import of the package."""
  out = []
  for module, (_, tree) in MODULES.items():
    def visit(node, inside):
      for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
          out.extend((module, t, inside) for t in _targets(module, child))
        visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    visit(tree, False)
  return out


IMPORTS = _imports()


def _layer(module):
  first = module.split(".")[1] if "." in module else "__init__"
  for i, (_, members) in enumerate(LAYERS.items()):
    if first in members:
      return i
  return None


def test_every_module_has_a_layer():
  assert [m for m in MODULES if m != "nbsgd_jax" and _layer(m) is None] == []


def test_the_root_holds_the_public_faces_and_every_folder_says_what_lives_there():
  root = [m for m in MODULES if m.count(".") == 1 and not MODULES[m][0].endswith("__init__.py")]
  assert len(root) + 1 <= MAX_ROOT_MODULES, sorted(root)
  folders = [m for m, (path, _) in MODULES.items() if path.endswith("__init__.py")]
  assert [f for f in folders if not ast.get_docstring(MODULES[f][1])] == []


def test_imports_run_down_the_layers():
  names = list(LAYERS)
  up = [f"{m} ({names[_layer(m)]}) -> {t} ({names[_layer(t)]})" for m, t, _ in IMPORTS
        if m != "nbsgd_jax" and t != "nbsgd_jax" and _layer(t) > _layer(m)]
  assert up == []


def test_no_import_cycle():
  graph: dict = {}
  for m, t, _ in IMPORTS:
    graph.setdefault(m, set()).add(t)
  state: dict = {}

  def cycle_from(node, path):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return path + [node, nxt]
      if nxt not in state:
        found = cycle_from(nxt, path + [node])
        if found:
          return found
    state[node] = "done"
    return None

  for module in sorted(MODULES):
    if module not in state:
      assert cycle_from(module, []) is None


def test_imports_inside_functions_have_a_reason():
  pairs = {(m, t) for m, t, f in IMPORTS if f}
  # the module imported, not the packages above it that Python initialises on the way
  inside = sorted(p for p in pairs if not any(q[0] == p[0] and q[1].startswith(p[1] + ".")
                                              for q in pairs))
  assert [pair for pair in inside if pair not in IN_FUNCTION] == []
  assert len(IN_FUNCTION) <= 6


def test_no_algorithm_or_codec_name_is_compared_outside_its_registry():
  names = set(config.ALGORITHMS) | set(codecs.names()) - {codecs.NONE}
  found = []
  for module, (path, tree) in MODULES.items():
    if module in ("nbsgd_jax.recipes", "nbsgd_jax.codecs") or module.startswith(
        ("nbsgd_jax.codecs.", "nbsgd_jax.recipes.")):
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.Compare):
        for c in ast.walk(node):
          if isinstance(c, ast.Constant) and c.value in names:
            found.append(f"{path}:{node.lineno}: {c.value!r}")
  assert found == []
  assert recipes.REGISTRY and codecs.REGISTRY  # the names came from the registries


@pytest.mark.parametrize("limit", [100])
def test_functions_and_modules_are_short(limit):
  long_functions, long_modules = [], []
  for module, (path, tree) in MODULES.items():
    with open(path) as f:
      if len(f.read().splitlines()) > 500:
        long_modules.append(path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = node.body
        if (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str) and len(body) > 1):
          body = body[1:]  # the docstring is not counted
        if node.end_lineno - body[0].lineno + 1 > limit:
          long_functions.append(f"{path}:{node.lineno} {node.name}")
  assert long_functions == []
  assert long_modules == []
