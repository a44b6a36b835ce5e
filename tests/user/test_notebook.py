"""``notebooks/quickstart.ipynb`` (the guide's quick start in Colab): a valid notebook stored
without outputs, whose configuration is ``experiments/configs/quickstart.py``'s, and that runs
top to bottom in a Jupyter kernel (this interpreter) with its ``parameters`` cell shrunk (20
steps instead of 200), writing the three runs and the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

nbformat = pytest.importorskip("nbformat")

NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")
RUNS = ("dpsgd", "allreduce", "dpsgd_nonblocking")
# Injected after the ``parameters`` cell (papermill's convention): a short run.
SMALL = {"NUM_STEPS": 20, "EVAL_EVERY": 10, "RUNS_DIR": "runs"}
CELL_TIMEOUT = 300  # s, per cell


def _notebook():
  return nbformat.read(NOTEBOOK, as_version=4)


def _tagged(nb, tag):
  cells = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
  assert len(cells) == 1, f"one cell tagged {tag!r}"
  return cells[0]


def test_notebook_is_valid_and_stored_without_outputs():
  nb = _notebook()
  nbformat.validate(nb)
  assert nb.nbformat == 4
  assert nb.metadata.kernelspec.name == "python3"
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, cell.id
  install = next(c for c in nb.cells if "use_source(SOURCE)" in c.source)
  assert 'if "google.colab" in sys.modules or "NBSGD_JAX_SOURCE" in os.environ:' in install.source
  assert "YOUR_ORG" not in json.dumps(nb)  # no placeholder a Colab user cannot fill


def test_notebook_config_is_the_quickstart_config():
  from tests.helpers import experiment_config  # the notebook's other tests need no jax
  ns = {}
  exec(_tagged(_notebook(), "config").source, ns)  # pylint: disable=exec-used
  assert (ns["quickstart_config"]().to_dict()
          == experiment_config("quickstart", "quickstart_config_file").to_dict())


def test_install_cell_imports_the_package_from_the_source_archive(tmp_path):
  """The Colab path, on this CPU: the archive made by the documented command, the install
  cell run by a fresh interpreter outside the checkout (pip finds every requirement installed,
  PIP_NO_INDEX: nothing is downloaded), the package imported from the unpacked archive with
  its data."""
  git = shutil.which("git")
  if git is None or not os.path.isdir(os.path.join(ROOT, ".git")):
    pytest.skip("needs git and a checkout (the archive is made with git archive)")
  archive = tmp_path / "nbsgd_jax.tar.gz"
  subprocess.run([git, "archive", "--format=tar.gz", "-o", str(archive), "HEAD"], cwd=ROOT,
                 check=True)
  cell = next(c for c in _notebook().cells if "use_source(SOURCE)" in c.source).source
  probe = cell + textwrap.dedent("""
      import nbsgd_jax
      from nbsgd_jax import data
      print(nbsgd_jax.__file__)
      print(data.load_dataset("mnist10k").train_images.shape)
      """)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(NBSGD_JAX_SOURCE=str(archive), PIP_NO_INDEX="1",
             PIP_DISABLE_PIP_VERSION_CHECK="1")
  r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  where, shape = r.stdout.strip().splitlines()[-2:]
  assert where == str(tmp_path / "nbsgd_jax_src" / "nbsgd_jax" / "__init__.py")
  assert shape == "(8000, 28, 28, 1)"


@pytest.mark.long  # CI's 15 minutes: the install cell's test stays in the slow tier
@pytest.mark.optimized  # three runs and a report in a kernel: XLA's optimisations pay
def test_notebook_runs(tmp_path, monkeypatch):
  """The notebook top to bottom in a Jupyter kernel, checked for what a Colab user reads
  there (the runs' training itself is test_docs::test_quick_commands_run_as_written's): the
  table it displays holds the numbers of the runs' summary.json files, the report it shows
  has its figures as images, and its claim holds: on the straggler cluster the non-blocking
  run spends less simulated time on its 20 steps than blocking D-PSGD and All-Reduce SGD,
  which wait for the slowest worker at every step."""
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  nb = _notebook()
  params = _tagged(nb, "parameters")
  for name in SMALL:
    assert f"{name} = " in params.source, name
  injected = nbformat.v4.new_code_cell(
      "\n".join(f"{k} = {v!r}" for k, v in SMALL.items()),
      metadata={"tags": ["injected-parameters"]})
  nb.cells.insert(nb.cells.index(params) + 1, injected)
  nb.cells.append(nbformat.v4.new_code_cell("import sys; print('kernel prefix:', sys.prefix)"))

  # The kernel inherits the environment (conftest's JAX_PLATFORMS=cpu); the package is found
  # even when it is not installed (pytest's pythonpath is not in the environment).
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  client = nbclient.NotebookClient(
      nb, timeout=CELL_TIMEOUT, kernel_name="python3",
      resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError on an error in a cell

  runs_dir = tmp_path / SMALL["RUNS_DIR"]
  summaries = {}
  for run in RUNS:
    with open(runs_dir / run / "summary.json") as f:
      summaries[run] = json.load(f)
    assert summaries[run]["steps"] == SMALL["NUM_STEPS"], run
  sim = {run: summaries[run]["sim_time"] for run in RUNS}
  assert sim["dpsgd_nonblocking"] < min(sim["dpsgd"], sim["allreduce"]), sim
  shown_md = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code"
              for o in c.outputs if "text/markdown" in o.get("data", {})]
  table = shown_md[0].splitlines()  # the first display: the notebook's own table
  for run, s in summaries.items():
    row = next(l for l in table if l.startswith(f"| {run} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [run, f"{s['test_accuracy']:.4f}", f"{s['train_loss']:.4f}",
                     f"{s['sim_time']:.2f}", f"{s['wall_time']:.2f}",
                     f"{s['bytes_sent'] / 1e6:.1f}"], (row, s)
  report = runs_dir / "report"
  for f in ("report.md", "loss_accuracy_vs_sim_time.png", "consensus_distance.png"):
    assert (report / f).is_file(), f
  md = (report / "report.md").read_text()
  for run in RUNS:
    assert f"| {run} |" in md, run

  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  shown = [k for o in outputs for k in o.get("data", {})]
  assert shown.count("image/png") >= 2 and "text/markdown" in shown
  printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert f"nbsgd_jax from {os.path.join(ROOT, 'nbsgd_jax')}" in printed
  # the kernel is this environment's Python ("python" in the kernel spec: sys.executable)
  assert f"kernel prefix: {sys.prefix}\n" in printed
