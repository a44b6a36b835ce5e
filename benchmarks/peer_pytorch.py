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
* ``compile``: the ``vmap`` step under ``torch.compile`` (inductor), where it compiles and runs
  its first 5 steps (a side that fails is shown as ``-``);
* ``jax``: the same step in bare JAX (:func:`bare_jax`: the run's own loss under
  ``jax.jit(vmap(grad))``, SGD and the ring's mixing as two ``jnp.roll`` s, on fixed arrays);
  the framework's host parts are a column of their own: the Python thread's CPU time per
  step (``time.thread_time``) while the framework steps, and its share of the step.

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
difference grows to ~1e-4 over the remaining steps, hence 1e-3 (``ATOL``); ResNet-20's
BatchNorm over random batches amplifies rounding to ~1e-3 in 5 steps, hence 1e-2.

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

from benchmarks.simulated_workers import _cpu_name as cpu_name  # noqa: E402

SHAPES = {"mlp": (28, 28, 1), "cnn": (28, 28, 1), "resnet": (32, 32, 3)}
BATCH = {"mlp": 32, "cnn": 32, "resnet": 128}
# largest parameter difference allowed after 5 steps (--atol 0): ResNet-20's BatchNorm over
# random batches amplifies rounding about 6x a step at this rate (1e-7 -> ~1e-3 in 5 steps)
ATOL = {"mlp": 1e-3, "cnn": 1e-3, "resnet": 1e-2}
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
  return (train.Stepper.of(s), np.asarray(shards.images)[:, :b],
          np.asarray(shards.labels)[:, :b], s)


def framework_params(stepper) -> dict:
  """Worker-stacked parameters ``[n, ...]`` of the stepper's state as numpy."""
  params = jax.tree.map(np.asarray, stepper.state.params)
  return params.get("params", params)  # flax's collection name, if kept


def time_framework(stepper, steps: int, host: list) -> float:
  """Seconds per step of ``steps`` framework steps (reports read once at the end); appends
  to ``host`` the CPU seconds per step of this (the Python) thread: the host parts, the data
  and dispatch, no device work (XLA:CPU computes on its own threads) and no waiting."""
  jax.block_until_ready(stepper.state)
  t, cpu = time.perf_counter(), time.thread_time()
  stepper.steps(steps, read_each_dispatch=False)
  jax.block_until_ready(stepper.state)
  host.append((time.thread_time() - cpu) / steps)
  return (time.perf_counter() - t) / steps


def bare_jax(s, params, model_state, x, y):
  """The same step without the framework: ``jax.jit`` of ``vmap(grad)`` of the run's own
  loss (``s.task.loss_fn``, the model in the run's forms), SGD and the ring's mixing, on the
  batches ``x`` ``[n, B, ...]``, ``y`` ``[n, B]`` as fixed arrays: the model's arithmetic
  without the framework's data sampling, host parts and program structure. Returns
  ``(step(), read())``, ``read()`` the parameters ``[n, ...]`` as numpy."""
  import jax.numpy as jnp
  n = x.shape[0]

  def mix(p):  # sum_j W_ij p_j for the ring (1/3 each) or the mean (n <= 2)
    if n <= 2:
      return jnp.broadcast_to(p.mean(0), p.shape)
    return (jnp.roll(p, 1, 0) + p + jnp.roll(p, -1, 0)) / 3.0

  @jax.jit
  def update(params, model_state, x, y):
    grad = jax.vmap(jax.grad(s.task.loss_fn, has_aux=True))
    g, model_state = grad(params, model_state, (x, y))
    new = jax.tree.map(lambda p, gi: mix(p - LR * gi), params, g)
    return new, model_state

  state = [jax.tree.map(jnp.array, params), jax.tree.map(jnp.array, model_state)]
  xs, ys = jnp.asarray(x), jnp.asarray(y)

  def step():
    state[:] = update(state[0], state[1], xs, ys)

  def read():
    jax.block_until_ready(state)
    p = jax.tree.map(np.asarray, state[0])
    return p.get("params", p)

  return step, read


def ring(n: int) -> np.ndarray:
  """The step's mixing matrix W ``[n, n]``: the ring's Metropolis-Hastings weights (1/3 on
  self and both neighbours) for n >= 3, the average (All-Reduce) for n <= 2."""
  if n <= 2:
    return np.full((n, n), 1.0 / n)
  w = np.zeros((n, n))
  for i in range(n):
    for j in (i - 1, i, i + 1):
      w[i, j % n] = 1.0 / 3.0
  return w


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
  w = torch.tensor(ring(n), dtype=torch.float32)

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
  stepper, x, y, s = framework(model, n, b, **args.set)
  start = framework_params(stepper)
  sides, read = torch_side(model, start, x, y, args.threads)
  sides["jax"], read_jax = bare_jax(s, stepper.state.params, stepper.state.model_state, x, y)
  skip = set(args.skip.split(",")) - {""}
  compile_ok = "compile" not in skip
  stepper.steps(5, read_each_dispatch=False)
  ours = framework_params(stepper)
  diffs = {}
  for name in ("jax", "loop", "vmap", "compile"):
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
    diffs[name] = max_diff(ours, read_jax() if name == "jax" else read(name))
    print(f"  {model} n={n}: |{name} - nbsgd_jax| after 5 steps = {diffs[name]:.2e}",
          flush=True)
    atol = args.atol or ATOL[model]
    if diffs[name] > atol:
      raise SystemExit(f"{name} and nbsgd_jax differ by {diffs[name]:.2e} > --atol "
                       f"{atol} after 5 steps: not the same step")
  host_cpu: list = []
  active = {"nbsgd_jax": lambda: time_framework(stepper, args.steps, host_cpu)}
  for name in ("jax", "loop", "vmap", "compile"):
    if name in diffs:
      fn = sides[name]

      def timed(fn=fn, name=name):
        t = time.perf_counter()
        for _ in range(args.steps):
          fn()
        if name == "jax":
          read_jax()
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
  host = statistics.median(host_cpu)
  torch_diff = max([v for k, v in diffs.items() if k != "jax"], default=float("nan"))
  row = (f"| {model} | {n} | {b} | {1e3 * med['nbsgd_jax']:.1f} ms ({images:.0f} images/s) | "
         f"{1e3 * host:.1f} ms ({100 * host / med['nbsgd_jax']:.0f} %) | {cell('jax')} | "
         f"{cell('loop')} | {cell('vmap')} | {cell('compile')} | {torch_diff:.1e} |")
  print(row, flush=True)
  return [row]


HEADER = ["| model | n | B / worker | nbsgd_jax step | its host parts (share) | bare JAX (x) | "
          "PyTorch loop (x) | torch.func vmap (x) | torch.compile (x) | "
          "largest difference after 5 steps |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]


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


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workloads", default="mlp:8,mlp:64,cnn:8,cnn:64,resnet:1,resnet:16",
                 help="model:n pairs, model in mlp, cnn, resnet")
  p.add_argument("--batch", type=int, default=0, help="B per worker (0: mlp/cnn 32, resnet 128)")
  p.add_argument("--steps", type=int, default=5, help="steps per timing")
  p.add_argument("--reps", type=int, default=5, help="interleaved rounds")
  p.add_argument("--threads", type=int, default=os.cpu_count())
  p.add_argument("--skip", default="", help="comma-separated sides not to run "
                 "(jax, loop, vmap, compile)")
  p.add_argument("--atol", type=float, default=0.0,
                 help="largest parameter difference allowed after 5 steps (0: per model, "
                 "ATOL)")
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
  head = (f"{datetime.date.today()}, {cpu_name()}, {os.cpu_count()} cores, {args.threads} "
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
