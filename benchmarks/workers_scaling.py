"""Wall time per training step as the number of workers grows, per algorithm and backend.

    # the main job (CNN, D-PSGD on a ring, 32 examples per worker, n = 8 .. 64), as before:
    python benchmarks/workers_scaling.py --out runs/scaling.md
    # many workers, few examples each (n = 8 .. 4096, every main algorithm, both backends):
    python benchmarks/workers_scaling.py --preset mlp --out runs/scaling_mlp.md
    python benchmarks/workers_scaling.py --preset cnn --out runs/scaling_cnn.md
    # a quick subset:
    python benchmarks/workers_scaling.py --preset mlp --workers 512 1024 2048 4096 \
        --algorithms allreduce dpsgd --backends simulate --device "2-core CPU"

Presets (``--preset``; any flag given overrides the preset's value): ``main`` (the default:
the main job of ``experiments/configs/mnist.py``, ``dpsgd``, the CNN, 32 examples per worker,
n = 8 .. 64), ``mlp`` (the 784-256-10 MLP, 1 example per worker, n = 8 .. 4096, every
algorithm of :data:`MAIN`) and ``cnn`` (the CNN, 4 examples per worker, n = 8 .. 1024, every
algorithm of :data:`MAIN`); mnist10k has 8000 training examples, so 4096 / 1024 workers fit.
A cell whose batch does not fit a worker's shard is skipped.

Cells: every (algorithm, backend, n) of the flags. The job is the main job's configuration
(``experiments/configs/mnist.py``: mnist10k, SGD with momentum, ring) with ``--model`` (the
LeNet-style CNN or the MLP, ``--mlp_hidden``) and ``--batch_size`` examples per worker. The
algorithms (``--algorithms``, :data:`ALGORITHMS`): ``allreduce`` (psum of gradients),
``dpsgd`` (D-PSGD on a ring), ``dpsgd_tv`` (D-PSGD on the one-peer exponential graph, a
time-varying W_t of period log2 n), ``matcha`` (MATCHA on a ring, budget 0.5), ``local_sgd``
(a model average every 4 steps), ``choco_sgd`` (CHOCO-SGD with Top-k, 1 %, on a ring).
Backends: ``simulate`` (``jax.vmap`` on one device) and ``mesh`` (``shard_map`` over
``--mesh_devices`` devices, n / devices workers each, ``vmap`` inside). ``--double_buffer``:
the cells with ``config.double_buffer`` on (the default), off, or both side by side.

A step is what the training loop does (:class:`nbsgd_jax.run.loop.Run`): the host parts'
inputs, the step's device context, the compiled program; after the last step of a run the
reports are fetched and every host part observes them (the simulated clock). Each cell:
median over ``--reps`` timed runs of ``--steps`` steps, after one untimed warm-up run
(compilation); the cells of one n take turns run by run (:func:`measure`). The ``host``
column is the part spent in the host parts (``inputs`` + ``observe``). All cells run in one
process, side by side, so their ratios are comparable; absolute times depend on the machine:
``--device`` is written into the output with the CPU count and the date.

MATCHA's set-up solves two SDPs over ``[n - 1, n - 1]`` matrices (cvxpy), which does not
finish at thousands of workers; above ``--matcha_exact_max`` workers the benchmark gives
MATCHA a timing plan instead (the same matchings, every ``p_j`` = the budget, ``alpha`` =
1 / (matchings + 1)): a step's cost depends on the matchings only, not on these numbers.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax.core import files  # noqa: E402
from nbsgd_jax import train  # noqa: E402

# name -> config overrides
ALGORITHMS = {
    "allreduce": {"algorithm": "allreduce"},
    "dpsgd": {"algorithm": "dpsgd", "topology": "ring"},
    "dpsgd_tv": {"algorithm": "dpsgd", "topology": "one_peer_exponential"},
    "matcha": {"algorithm": "matcha", "topology": "ring"},
    "local_sgd": {"algorithm": "local_sgd"},
    "choco_sgd": {"algorithm": "choco_sgd", "topology": "ring", "compression.name": "top_k",
                  "compression.density": 0.01},
}
MAIN = ("allreduce", "dpsgd", "dpsgd_tv", "matcha", "local_sgd")
PRESETS = {
    "main": dict(model="cnn", workers=[8, 16, 32, 64], algorithms=["dpsgd"], batch_size=32),
    "mlp": dict(model="mlp", workers=[8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                algorithms=list(MAIN), batch_size=1),
    "cnn": dict(model="cnn", workers=[8, 16, 32, 64, 128, 256, 512, 1024],
                algorithms=list(MAIN), batch_size=4),
}


def _base_config():
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "experiments", "configs", "mnist.py")
  spec = importlib.util.spec_from_file_location("mnist_cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


SINGLE = " (1 buffer)"  # the label suffix of a cell with config.double_buffer=False


def job(n: int, backend: str, algorithm: str, model: str, batch_size: int,
        mesh_devices: int = 8, mlp_hidden: tuple = ()):
  """The config of one cell (see module docstring); ``algorithm`` may end in
  :data:`SINGLE` (``double_buffer=False``)."""
  single = algorithm.endswith(SINGLE)
  algorithm = algorithm.removesuffix(SINGLE)
  over = {"num_workers": n, "backend": backend, "model": model, "batch_size": batch_size,
          "progress": False, "double_buffer": not single, **ALGORITHMS[algorithm]}
  if mlp_hidden:
    over["mlp_hidden"] = tuple(mlp_hidden)
  if backend == "mesh":
    over["workers_per_device"] = max(n // mesh_devices, 1)
  return config_lib.override(_base_config(), over)


def timing_plan(n: int, edges, budget: float):
  """MATCHA's plan for timing only: the real matchings, ``p_j = budget``, ``alpha = 1 / (M +
  1)`` (no SDP; module docstring)."""
  from nbsgd_jax.topology import matcha as matcha_lib
  ms = matcha_lib.matching_decomposition(n, edges)
  return matcha_lib.MatchaPlan(n=n, matchings=ms, probs=np.full(len(ms), float(budget)),
                               alpha=1.0 / (len(ms) + 1), rho=float("nan"), laplacians=None)


class TimedHost:
  """A run's host parts (:class:`nbsgd_jax.host.Host`) with the seconds spent in their
  ``inputs`` and ``observe`` counted in ``seconds``."""

  def __init__(self, host):
    self.host, self.seconds = host, 0.0

  def __getattr__(self, name):
    return getattr(self.host, name)

  def _timed(self, fn, *args, **kw):
    t = time.perf_counter()
    try:
      return fn(*args, **kw)
    finally:
      self.seconds += time.perf_counter() - t

  def inputs(self, *args, **kw):
    return self._timed(self.host.inputs, *args, **kw)

  def observe(self, *args, **kw):
    return self._timed(self.host.observe, *args, **kw)


class Cell:
  """One (algorithm, backend, n) of the benchmark: its set-up, host parts and program."""

  def __init__(self, cfg, exact_matcha: bool = True):
    from nbsgd_jax.topology import matcha as matcha_lib
    exact = matcha_lib.plan
    if not exact_matcha:
      matcha_lib.plan = timing_plan
    try:
      self.s = train.setup(cfg)
    finally:
      matcha_lib.plan = exact
    self.times: list = []
    self.host_times: list = []

  def run(self, steps: int) -> tuple:
    """``(seconds per step, host seconds per step)`` of one run of ``steps`` steps from the
    initial state (``Stepper.steps``: host inputs, device context and the program per step,
    then the reports fetched and observed by the host parts, as the training loop does
    between evaluations)."""
    host = TimedHost(train.make_host(self.s))
    stepper = train.Stepper.of(self.s, host)
    jax.block_until_ready(stepper.state)
    t0 = time.perf_counter()
    stepper.steps(steps, read_each_dispatch=False)
    jax.block_until_ready(stepper.state)
    return (time.perf_counter() - t0) / steps, host.seconds / steps

  def median(self) -> tuple:
    return float(np.median(self.times)), float(np.median(self.host_times))


def measure(cells: list, steps: int, reps: int) -> None:
  """One warm-up run of every cell (compilation), then ``reps`` rounds in which every cell
  runs once, in turn (a change of the machine's load hits every cell of the round alike)."""
  for c in cells:
    c.run(steps)
  for _ in range(reps):
    for c in cells:
      sec, hsec = c.run(steps)
      c.times.append(sec)
      c.host_times.append(hsec)


def table(rows: dict, a, batch: int) -> str:
  """The markdown table: ms / step, the host's share, microseconds per worker and the growth
  from the previous n (time ratio / n ratio: 1 is linear)."""
  model = a.model + (f" {784}-{'-'.join(map(str, a.mlp_hidden))}-10" if a.mlp_hidden else "")
  lines = [f"{model.upper()} (`experiments/configs/mnist.py` with model={a.model}), "
           f"{batch} examples per worker, wall time per step (median of {a.reps} runs x "
           f"{a.steps} steps after a compile run, cells of one n interleaved; host: the host "
           f"parts' share), measured side by side by "
           f"`python benchmarks/workers_scaling.py {' '.join(sys.argv[1:])}` on "
           f"{a.device or 'an unnamed device'} ({os.cpu_count()} CPUs visible, jax "
           f"{jax.__version__}, platform {jax.default_backend()}, "
           f"{datetime.date.today().isoformat()}; mesh: {a.mesh_devices} devices, n / "
           f"{a.mesh_devices} workers each).", "",
           "| algorithm | backend | workers n | ms / step | host ms / step | us / step / worker "
           "| growth vs previous n (time ratio / n ratio) |",
           "|---|---|---:|---:|---:|---:|---:|"]
  for al in a.algorithms:
    for b in a.backends:
      prev = None
      for n in a.workers:
        if (al, b, n) not in rows:
          continue
        sec, hsec = rows[(al, b, n)]
        growth = "-" if prev is None else f"{(sec / prev[1]) / (n / prev[0]):.2f}"
        lines.append(f"| {al} | {b} | {n} | {1e3 * sec:.2f} | {1e3 * hsec:.2f} | "
                     f"{1e6 * sec / n:.1f} | {growth} |")
        prev = (n, sec)
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="", help="write the table here (markdown)")
  ap.add_argument("--preset", default="main", choices=list(PRESETS),
                  help="the defaults of --model, --workers, --algorithms, --batch_size")
  ap.add_argument("--model", default=None, choices=["mlp", "cnn"])
  ap.add_argument("--workers", type=int, nargs="+", default=None, help="n values")
  ap.add_argument("--algorithms", nargs="+", default=None, choices=list(ALGORITHMS))
  ap.add_argument("--backends", nargs="+", default=["simulate", "mesh"],
                  choices=["simulate", "mesh"])
  ap.add_argument("--batch_size", type=int, default=0, help="examples per worker")
  ap.add_argument("--mlp_hidden", type=int, nargs="+", default=[],
                  help="hidden sizes of the MLP (default: the config's, 256); a small MLP "
                  "shows the per-step overheads that grow with n")
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--mesh_devices", type=int, default=8)
  ap.add_argument("--matcha_exact_max", type=int, default=64,
                  help="largest n whose MATCHA plan is solved exactly (module docstring)")
  ap.add_argument("--device", default="", help="a note on the machine, written into the output")
  ap.add_argument("--double_buffer", default="on", choices=["on", "off", "both"],
                  help="config.double_buffer of the cells; both: every algorithm also with one "
                  f"set of parameter buffers (labelled '<algorithm>{SINGLE}')")
  a = ap.parse_args()
  preset = PRESETS[a.preset]
  a.model = a.model or preset["model"]
  a.workers = a.workers or preset["workers"]
  a.algorithms = a.algorithms or preset["algorithms"]
  a.algorithms = {"on": a.algorithms, "off": [al + SINGLE for al in a.algorithms],
                  "both": [v for al in a.algorithms for v in (al, al + SINGLE)]}[a.double_buffer]
  batch = a.batch_size or preset["batch_size"]
  rows = {}
  for n in a.workers:
    cells = {}
    for al in a.algorithms:
      for b in a.backends:
        if b == "mesh" and n % a.mesh_devices:
          continue
        try:
          cells[(al, b, n)] = Cell(job(n, b, al, a.model, batch, a.mesh_devices,
                                       a.mlp_hidden), n <= a.matcha_exact_max)
        except config_lib.ConfigError as e:
          print(f"n={n:5d} {al:10s} {b:8s} skipped: {e}", flush=True)
    measure(list(cells.values()), a.steps, a.reps)
    for key, c in cells.items():
      rows[key] = c.median()
      print(f"n={n:5d} {key[0]:20s} {key[1]:8s} {1e3 * rows[key][0]:9.2f} ms/step "
            f"(host {1e3 * rows[key][1]:.2f})", flush=True)
    del cells
  text = table(rows, a, batch)
  print(text)
  if a.out:
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    files.atomic_write(a.out, text)


if __name__ == "__main__":
  main()
