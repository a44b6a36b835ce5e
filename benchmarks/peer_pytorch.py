"""nbsgd_jax's D-PSGD step against the same step written the PyTorch way, side by side.

One D-PSGD step (Lian et al. 2017, adapt then combine: ``x_i <- sum_j W_ij (x_j - lr g_j)``,
W the ring's Metropolis-Hastings matrix, 1/3 on self and both neighbours; plain SGD, no
momentum; n = 1 is plain SGD) of n workers, each on its own batch of ``B`` examples:

* ``nbsgd_jax``: the framework's own compiled step (``train.setup`` + ``train.Stepper``,
  ``config.algorithm="dpsgd"``, the package's defaults otherwise: the convolution and pool
  forms it picks for the model and n, ``config.conv_impl="auto"``), with host parts;
* ``loop``: a Python loop over n ``torch.nn.Module`` s (forward, backward, SGD), then the
  gossip over the stacked parameters: what a PyTorch research code (MATCHA,
  LocalSGD-Code, ChocoSGD's simulators) does on one machine;
* ``vmap``: ``torch.func.functional_call`` under ``torch.vmap(torch.func.grad(...))`` over
  stacked parameters (BatchNorm without running statistics:
  ``torch.func.replace_all_batch_norm_modules_``);
* ``compile``: the ``vmap`` step under ``torch.compile`` (inductor), where it compiles within
  ``--compile_timeout`` seconds of its first call.

The models are the package's (``nbsgd_jax.models``): the MLP 784-256-10, the main job's
LeNet CNN (``config.model="cnn"``, 28x28x1) and ResNet-20 (``config.model="resnet"``,
BatchNorm, option-A shortcuts, 32x32x3), written again in torch with the same layout of
weights; both sides start from the framework's initial weights (copied into the modules)
and see the same batches: each worker's shard is exactly its batch (n B synthetic training
examples, ``config.dataset="arrays"``), so each step's mean gradient is of the same examples
on both sides (the framework visits them in a permuted order: rounding only). Before timing,
5 steps from the same start on both sides must agree (largest absolute parameter
difference against ``--atol``; printed): a step that computes something else is not timed.
The sides agree to ~1e-7 per step; a max-pool whose two largest inputs are within rounding
of each other can take the other branch on one side (a kink, not an error), after which the
difference grows to ~1e-4 over the remaining steps, hence the default 1e-3.

Timing: every side is warmed up (compiled) first, then ``--reps`` rounds, each timing every
side (in a fresh random order) over ``--steps`` steps; a time is the median over rounds, a
ratio the median over rounds of (PyTorch side's time / nbsgd_jax's time in the same round):
above 1, nbsgd_jax is faster. Both sides use ``--threads`` threads (``torch.set_num_threads``;
XLA:CPU's pool is the machine's cores) and ``OMP_WAIT_POLICY=PASSIVE`` (set before torch is
imported), so neither spins while the other runs.

PyTorch is an optional extra for this benchmark only::

    pip install -e ".[peers]"          # torch (a CPU build where pip finds one)
    python benchmarks/peer_pytorch.py --workloads mlp:8,mlp:64,cnn:8,cnn:64 --reps 5
    python benchmarks/peer_pytorch.py --workloads resnet:1,resnet:16 --reps 3 --steps 2

``--out FILE.md`` appends the table with the machine, versions and command. Source of the
step: ``nbsgd_jax.recipes.dpsgd`` (``docs/algorithms.md``); the models: ``nbsgd_jax.models``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import data as data_lib  # noqa: E402
from nbsgd_jax import train  # noqa: E402

SHAPES = {"mlp": (28, 28, 1), "cnn": (28, 28, 1), "resnet": (32, 32, 3)}
BATCH = {"mlp": 32, "cnn": 32, "resnet": 128}
LR = 0.05


# ----------------------------------------------------------------------------- nbsgd_jax
def framework(model: str, n: int, b: int, seed: int = 0, **over):
  """The framework's stepper for ``model`` with n workers x b examples and the data, as
  ``(stepper, x [n, b, ...] float32, y [n, b] int)`` (each worker's shard is its batch)."""
  rng = np.random.RandomState(seed)
  x = rng.randn(n * b, *SHAPES[model]).astype(np.float32)
  y = rng.randint(0, 10, n * b)
  data = data_lib.ArrayDataset(x, y, x[:b], y[:b], num_classes=10, name="peer")
  cfg = config_lib.override(config_lib.default_config(), {
      "model": model, "num_workers": n, "batch_size": b, "algorithm":
      "dpsgd" if n > 2 else "allreduce", "dataset": "arrays", "learning_rate": LR,
      "momentum": 0.0, "num_steps": 10**6, "eval_every": 10**6, "progress": False,
      "seed": seed, **over})
  s = train.setup(cfg, data=data)
  shards = s.worker_data
  sizes = np.asarray(shards.sizes)
  if not (sizes == b).all():
    raise RuntimeError(f"shards of {sizes} examples, not {b}: the batches would differ")
  return train.Stepper.of(s), np.asarray(shards.images)[:, :b], np.asarray(shards.labels)[:, :b]


def framework_params(stepper) -> dict:
  """Worker-stacked parameters ``[n, ...]`` of the stepper's state as numpy."""
  params = jax.tree.map(np.asarray, stepper.state.params)
  return params.get("params", params)  # flax's collection name, if kept


def time_framework(stepper, steps: int) -> float:
  """Seconds per step of ``steps`` framework steps (reports read once at the end)."""
  jax.block_until_ready(stepper.state)
  t = time.perf_counter()
  stepper.steps(steps, read_each_dispatch=False)
  jax.block_until_ready(stepper.state)
  return (time.perf_counter() - t) / steps


# ----------------------------------------------------------------------------- PyTorch
def torch_side(model: str, params: dict, x, y, threads: int):
  """``{name: step()}`` of the PyTorch sides and ``read()`` of the loop's parameters in the
  framework's layout, all starting from the framework's (stacked) ``params``."""
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(threads)
  from benchmarks import peer_torch_models as tm
  n = x.shape[0]
  xs = torch.from_numpy(np.array(np.moveaxis(x, -1, 2)))  # [n, b, C, H, W]
  ys = torch.from_numpy(np.array(y, np.int64))
  mods = [tm.build(model) for _ in range(n)]
  for i, m in enumerate(mods):
    tm.load(model, m, jax.tree.map(lambda a: a[i], params))
  w = torch.tensor(tm.ring(n), dtype=torch.float32)

  def gossip(stacked):
    return [torch.tensordot(w, p, dims=1) for p in stacked]

  def loop_step():
    for i, m in enumerate(mods):
      m.zero_grad(set_to_none=True)
      F.cross_entropy(m(xs[i]), ys[i]).backward()
    with torch.no_grad():
      plist = [list(m.parameters()) for m in mods]
      stacked = [torch.stack([p[k] - LR * p[k].grad for p in plist]) for k in range(len(plist[0]))]
      for k, new in enumerate(gossip(stacked)):
        for i in range(n):
          plist[i][k].copy_(new[i])

  sides = {"loop": loop_step}
  base = tm.build(model)
  torch.func.replace_all_batch_norm_modules_(base)
  names = [k for k, _ in base.named_parameters()]
  state = {"p": [torch.stack([dict(m.named_parameters())[k].detach().clone() for m in mods])
                 for k in names]}

  def loss(plist, xb, yb):
    out = torch.func.functional_call(base, dict(zip(names, plist)), (xb,))
    return F.cross_entropy(out, yb)

  grad = torch.vmap(torch.func.grad(loss))

  def vmap_update(plist):
    g = grad(plist, xs, ys)
    return gossip([p - LR * gi for p, gi in zip(plist, g)])

  def vmap_step():
    with torch.no_grad():
      state["p"] = vmap_update(state["p"])

  sides["vmap"] = vmap_step
  compiled = torch.compile(vmap_update)
  cstate = {"p": [p.clone() for p in state["p"]]}

  def compile_step():
    cstate["p"] = compiled(cstate["p"])

  sides["compile"] = compile_step

  def read(which="loop"):
    if which == "loop":
      per = [{k: v.detach().numpy() for k, v in m.named_parameters()} for m in mods]
      stacked = {k: np.stack([p[k] for p in per]) for k in names}
    else:
      src = state if which == "vmap" else cstate
      stacked = {k: v.detach().numpy() for k, v in zip(names, src["p"])}
    return tm.to_flax(model, stacked)

  return sides, read


def max_diff(a: dict, b: dict) -> float:
  """Largest absolute difference between two parameter trees of the same structure."""
  return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
             for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ----------------------------------------------------------------------------- one workload
def workload(model: str, n: int, args) -> list:
  """Markdown rows of one (model, n): check 5 steps, then interleaved timing."""
  b = args.batch or BATCH[model]
  stepper, x, y = framework(model, n, b, **args.set)
  start = framework_params(stepper)
  sides, read = torch_side(model, start, x, y, args.threads)
  skip = set(args.skip.split(",")) - {""}
  compile_ok = "compile" not in skip
  stepper.steps(5, read_each_dispatch=False)
  ours = framework_params(stepper)
  diffs = {}
  for name in ("loop", "vmap", "compile"):
    if name in skip or (name == "compile" and not compile_ok):
      continue
    try:
      t0 = time.perf_counter()
      for _ in range(5):
        sides[name]()
      if name == "compile":
        print(f"  torch.compile: {time.perf_counter() - t0:.1f} s for the first 5 steps",
              flush=True)
    except Exception as e:  # noqa: BLE001  (a side that does not run is reported, not timed)
      print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
      skip.add(name)
      continue
    diffs[name] = max_diff(ours, read(name))
    print(f"  {model} n={n}: |{name} - nbsgd_jax| after 5 steps = {diffs[name]:.2e}",
          flush=True)
    if diffs[name] > args.atol:
      raise SystemExit(f"{name} and nbsgd_jax differ by {diffs[name]:.2e} > --atol "
                       f"{args.atol} after 5 steps: not the same step")
  active = {"nbsgd_jax": lambda: time_framework(stepper, args.steps)}
  for name in ("loop", "vmap", "compile"):
    if name in diffs:
      fn = sides[name]

      def timed(fn=fn):
        t = time.perf_counter()
        for _ in range(args.steps):
          fn()
        return (time.perf_counter() - t) / args.steps
      active[name] = timed
  times = {k: [] for k in active}
  rng = random.Random(0)
  for _ in range(args.reps):
    for k in rng.sample(list(active), len(active)):
      times[k].append(active[k]())
  med = {k: statistics.median(v) for k, v in times.items()}
  ratio = {k: statistics.median(u / w for u, w in zip(times[k], times["nbsgd_jax"]))
           for k in times if k != "nbsgd_jax"}
  cell = lambda k: (f"{1e3 * med[k]:.1f} ms ({ratio[k]:.2f}x)" if k in ratio else "-")
  images = n * b / med["nbsgd_jax"]
  row = (f"| {model} | {n} | {b} | {1e3 * med['nbsgd_jax']:.1f} ms ({images:.0f} images/s) | "
         f"{cell('loop')} | {cell('vmap')} | {cell('compile')} | "
         f"{max(diffs.values()) if diffs else float('nan'):.1e} |")
  print(row, flush=True)
  return [row]


HEADER = ["| model | n | B / worker | nbsgd_jax step | PyTorch loop (x) | torch.func vmap (x) | "
          "torch.compile (x) | largest difference after 5 steps |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]


def _overrides(text: str) -> dict:
  """``key=value,...`` as a dict, values parsed as Python literals where they parse."""
  import ast
  out = {}
  for item in filter(None, text.split(",")):
    key, _, value = item.partition("=")
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as fh:
      return next(l.split(":", 1)[1].strip() for l in fh if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or "CPU"


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workloads", default="mlp:8,mlp:64,cnn:8,cnn:64,resnet:1,resnet:16",
                 help="model:n pairs, model in mlp, cnn, resnet")
  p.add_argument("--batch", type=int, default=0, help="B per worker (0: mlp/cnn 32, resnet 128)")
  p.add_argument("--steps", type=int, default=5, help="steps per timing")
  p.add_argument("--reps", type=int, default=5, help="interleaved rounds")
  p.add_argument("--threads", type=int, default=os.cpu_count())
  p.add_argument("--skip", default="", help="comma-separated PyTorch sides not to run "
                 "(loop, vmap, compile)")
  p.add_argument("--atol", type=float, default=1e-3,
                 help="largest parameter difference allowed after 5 steps")
  p.add_argument("--set", default="", type=_overrides,
                 help="config overrides of the nbsgd_jax side, key=value,... (e.g. "
                 "conv_impl=batched,pool_impl=window: the forms before 'auto')")
  p.add_argument("--out", default="", help="append the table (markdown) to this file")
  args = p.parse_args()
  try:
    import torch
  except ImportError:
    raise SystemExit("PyTorch is not installed: pip install -e '.[peers]'")
  rows = list(HEADER)
  for item in args.workloads.split(","):
    model, n = item.split(":")
    if model not in SHAPES:
      raise SystemExit(f"--workloads: model {model!r} is not allowed: use one of "
                       f"{sorted(SHAPES)}")
    rows += workload(model, int(n), args)
  head = (f"{datetime.date.today()}, {_cpu_name()}, {os.cpu_count()} cores, {args.threads} "
          f"threads; jax {jax.__version__}, torch {torch.__version__}; command: python "
          f"benchmarks/peer_pytorch.py {' '.join(sys.argv[1:])}. Cells: median time per step "
          "over the rounds and (x) the median over rounds of PyTorch's time / nbsgd_jax's: "
          "above 1, nbsgd_jax is faster.")
  print("\n" + head + "\n\n" + "\n".join(rows))
  if args.out:
    with open(args.out, "a") as fh:
      fh.write(head + "\n\n" + "\n".join(rows) + "\n\n")


if __name__ == "__main__":
  main()
