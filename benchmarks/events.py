"""Events per second of asynchronous training: the event clock's batches against one jitted
update per event.

    python benchmarks/events.py --out docs/events.md                 # n = 64 and 1,024
    python benchmarks/events.py --workers 64 --mlp_hidden 16 --out runs/events.md

AD-PSGD (Lian et al. 2018, Algorithm 1) on mnist10k with the MLP (784-256-10 by default,
``--mlp_hidden``), ``--batch_size`` examples per worker, SGD with momentum 0.9, on a ring, a
lognormal cluster (sigma 0.5) with random stragglers (probability 0.1, mean 0.5 s). Two ways,
side by side in one process, over the same event schedule (the recipe's own
:class:`~nbsgd_jax.host.events.EventTimes`):

* ``event clock``: nbsgd_jax's engine, one device step per batch of commuting events
  (``Stepper.steps(read_each_dispatch=False)``, after a warm-up that compiles);
* ``one update per event``: the anchors' design (a process or thread per node, each applying
  its own events): each worker's model, in-flight gradient and momentum are its own device
  arrays, and a Python loop over the events dispatches one jitted update per event: the
  average with the peer, the momentum step with the held gradient, and the gradient of the
  worker's next read on its next batch (drawn on the host). The loop's schedule (the same
  clock, ``next_batch(limit=1)``) is drawn before its timing starts: only its updates are
  timed, while the event clock's time includes its host scheduler;
* ``ceiling``: the loop's own update, ``jax.vmap``-ed over as many events as the event
  clock's mean batch, its inputs already stacked (no scheduler, no gather or scatter, no
  worker that is not in an event): the cost of an event's arithmetic alone, so the most any
  batching engine can gain over the loop on this device is ceiling / loop.

Events per second = events applied / wall seconds. Written as a markdown table with the
device, the command and the date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax.core import files  # noqa: E402
from nbsgd_jax import train  # noqa: E402


def make_config(a, n: int):
  """The benchmark's AD-PSGD run with ``n`` workers."""
  c = config_lib.default_config()
  return config_lib.override(c, {
      "dataset": "mnist10k", "model": "mlp", "mlp_hidden": tuple(a.mlp_hidden),
      "algorithm": "ad_psgd", "num_workers": n, "batch_size": a.batch_size,
      "learning_rate": 0.05, "momentum": 0.9, "topology": "ring", "progress": False,
      "cluster.scenario": "lognormal", "cluster.spread": 0.5,
      "cluster.delay": "bernoulli_exponential", "cluster.delay_prob": 0.1,
      "cluster.delay_mean": 0.5, "num_steps": 10 ** 6, "eval_every": 10 ** 6,
      "compilation_cache": "none"})


def engine(cfg, events: int) -> tuple:
  """``(events, seconds, mean batch)`` of the event clock's engine, after a warm-up."""
  stepper = train.Stepper.of(train.setup(cfg))
  clock = stepper.runs[0].host.part("clock")
  stepper.steps(3, read_each_dispatch=False)  # compiles
  jax.block_until_ready(stepper.state)
  first, steps, t0 = clock.events, 0, time.perf_counter()
  while clock.events - first < events:
    stepper.steps(5, read_each_dispatch=False)
    steps += 5
  jax.block_until_ready(stepper.state)
  done = clock.events - first
  return done, time.perf_counter() - t0, done / steps


def per_event_loop(cfg, events: int) -> tuple:
  """``(events, seconds)`` of the same schedule, one jitted update per event."""
  s = train.setup(cfg)
  clock = train.make_host(s).part("clock").clock
  n, lr, mom = cfg.num_workers, cfg.learning_rate, cfg.momentum
  images = np.asarray(s.dataset.train_images, np.float32)
  labels = np.asarray(s.dataset.train_labels, np.int32)
  shards = np.array_split(np.random.default_rng(0).permutation(len(labels)), n)
  step, loss = _mlp_update(cfg, s)

  def alone(xi, held, buf, x, y):  # an event without a peer (AD-PSGD: a passive worker's)
    buf = jax.tree.map(lambda m, g: mom * m + g, buf, held)
    new = jax.tree.map(lambda p, m: p - lr * m, xi, buf)
    return new, jax.grad(loss)(new, x, y), buf

  paired, solo = jax.jit(step), jax.jit(alone)
  rng = np.random.default_rng(1)

  def batch(i):
    idx = rng.choice(shards[i], cfg.batch_size)
    return jnp.asarray(images[idx]), jnp.asarray(labels[idx])

  p0 = s.task.init()[0]
  x = [jax.tree.map(jnp.array, p0) for _ in range(n)]
  buf = [jax.tree.map(jnp.zeros_like, p0) for _ in range(n)]
  held = [jax.grad(loss)(x[i], *batch(i)) for i in range(n)]

  def apply(e):
    i = e.worker
    if len(e.touched) == 2:
      j = e.touched[1]
      x[i], x[j], held[i], buf[i] = paired(x[i], x[j], held[i], buf[i], *batch(i))
    else:
      x[i], held[i], buf[i] = solo(x[i], held[i], buf[i], *batch(i))

  schedule = []  # drawn before the clock starts: the loop is timed on its updates alone
  while len(schedule) < 4 * n + events:
    schedule += clock.next_batch(limit=1)
  for e in schedule[:4 * n]:  # warm-up: both programs compiled
    apply(e)
  jax.block_until_ready(x)
  t0 = time.perf_counter()
  for e in schedule[4 * n:]:
    apply(e)
  jax.block_until_ready((x, held, buf))
  return len(schedule) - 4 * n, time.perf_counter() - t0


def _mlp_update(cfg, s):
  """The loop's paired update (average, momentum step with the held gradient, the next
  gradient) and its loss, for the setup ``s``."""
  model, lr, mom = s.model, cfg.learning_rate, cfg.momentum

  def loss(p, x, y):
    logits = model.apply(p, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(xi, xj, held, buf, x, y):
    avg = jax.tree.map(lambda a, b: (a + b) / 2, xi, xj)
    buf = jax.tree.map(lambda m, g: mom * m + g, buf, held)
    new = jax.tree.map(lambda p, m: p - lr * m, avg, buf)
    return new, avg, jax.grad(loss)(new, x, y), buf

  return step, loss


def ceiling(cfg, k: int, events: int) -> tuple:
  """``(events, seconds)`` of the paired update vmapped over ``k`` events at once, the inputs
  stacked beforehand: an event's arithmetic without any engine around it."""
  s = train.setup(cfg)
  step, loss = _mlp_update(cfg, s)
  p0 = s.task.init()[0]
  stack = lambda t: jax.tree.map(lambda a: jnp.stack([a] * k), t)  # noqa: E731
  xi, xj = stack(p0), stack(p0)
  buf = jax.tree.map(jnp.zeros_like, xi)
  rng = np.random.default_rng(0)
  idx = rng.integers(0, len(s.dataset.train_labels), (k, cfg.batch_size))
  x = jnp.asarray(np.asarray(s.dataset.train_images, np.float32)[idx])
  y = jnp.asarray(np.asarray(s.dataset.train_labels, np.int32)[idx])
  held = jax.vmap(jax.grad(loss))(xi, x, y)
  run = jax.jit(jax.vmap(step))
  out = run(xi, xj, held, buf, x, y)
  jax.block_until_ready(out)
  calls = max(1, events // k)
  t0 = time.perf_counter()
  for _ in range(calls):
    xi, xj, held, buf = run(xi, xj, held, buf, x, y)
  jax.block_until_ready((xi, xj, held, buf))
  return calls * k, time.perf_counter() - t0


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="the markdown table")
  ap.add_argument("--workers", type=int, nargs="+", default=[64, 1024])
  ap.add_argument("--events", type=int, default=2000, help="events timed per way and n")
  ap.add_argument("--batch_size", type=int, default=4, help="examples per worker")
  ap.add_argument("--mlp_hidden", type=int, nargs="+", default=[256])
  a = ap.parse_args()
  rows = []
  for n in a.workers:
    cfg = make_config(a, n)
    ev_a, sec_a, batch = engine(cfg, a.events)
    ev_b, sec_b = per_event_loop(cfg, a.events)
    ev_c, sec_c = ceiling(cfg, max(1, int(round(batch))), a.events)
    rows.append((n, ev_a / sec_a, batch, ev_b / sec_b, ev_c / sec_c))
    print(f"n={n}: event clock {ev_a / sec_a:.0f} events/s (batches of {batch:.0f}), one "
          f"update per event {ev_b / sec_b:.0f} events/s: {ev_a / sec_a * sec_b / ev_b:.2f}x; "
          f"ceiling {ev_c / sec_c:.0f} events/s ({ev_c / sec_c * sec_b / ev_b:.2f}x)",
          flush=True)
  hidden = "-".join(str(h) for h in [784] + a.mlp_hidden + [10])
  lines = [f"# Events per second: AD-PSGD on the event clock\n\nMeasured by `python "
           f"benchmarks/events.py {' '.join(sys.argv[1:])}` on "
           f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), jax "
           f"{jax.__version__}, backend {jax.default_backend()} "
           f"({jax.devices()[0].device_kind}), {datetime.date.today()}; MLP {hidden}, "
           f"{a.batch_size} examples per worker, both ways in one process.\n",
           "| workers | event clock, events/s | events per device step | one jitted update "
           "per event, events/s | ratio | ceiling, events/s | ceiling / loop |",
           "|---|---|---|---|---|---|---|"]
  for n, fast, batch, slow, top in rows:
    lines.append(f"| {n} | {fast:.0f} | {batch:.0f} | {slow:.0f} | {fast / slow:.2f}x | "
                 f"{top:.0f} | {top / slow:.2f}x |")
  files.atomic_write(a.out, "\n".join(lines) + "\n")
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
