"""Asynchronous DiLoCo (``async_diloco``, Liu, Douillard et al. 2024, arXiv 2401.09135) against
independent references, and its reduction to DiLoCo at synchronous timing.

The references are numpy float64 event loops written from google-deepmind/asyncdiloco's toy
notebook (``AsyncLocalSGDToyExample.ipynb``, commit e783a30: ``AsyncExperiment.run`` with
``max_wait_time=0``, ``get_sync_weight``, ``sample_train_task(scale_steps=True)``,
``inner_loop``) and utnslab/halos' ``src/halos/opt.py`` ``DelayedNesterovOptimizer`` (commit
4b5bf73) as the server's optimizer, not from the package; the cluster's times are written out
(worker i computes a step in ``M * time_per_example * slowdown_i`` seconds, a model message
takes ``latency + 4 d / bandwidth``).
"""

import heapq

import jax
import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.models import problems
from nbsgd_jax import train
from nbsgd_jax.transforms.asynchronous import ServerState
from nbsgd_jax.transforms.wrappers import OuterState

from tests.helpers import Crash, least_squares_cfg, make_stepper, small_cfg

N, M, DIM = 8, 16, 4
LR, MOM, WD, TPE = 0.05, 0.9, 1e-3, 1e-3


def _cfg(**kw):
  """The asynchronous family's set-up (tests/helpers.py), 3 speeds, messages of 0.1 ms."""
  return least_squares_cfg(n=N, m=M, dim=DIM, lr=LR, momentum=MOM, weight_decay=WD,
                           slowdown=(1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 5.0, 5.0),
                           time_per_example=TPE, latency=1e-4, bandwidth=1e6,
                           **{"num_steps": 30, "eval_every": 30, **kw})

H_ASYNC, OUTER_LR, OUTER_M, BUFFER, ACTIVATION = 6, 0.7, 0.9, 3, 0.2
# 3 speeds whose round times (H_i steps) share no common multiple within the test: the order
# of two pushes of different speeds never rests on a float tie (equal speeds tie exactly)
SLOW_ASYNC = (1.0, 1.0, 1.0, 2.13, 2.13, 2.13, 4.71, 4.71)
SLOW_LATENCY = 0.01  # s: a message takes about 0.6 of the fastest step


def _problem():
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  return prob.features.astype(np.float64), prob.targets.astype(np.float64)


class _Server:
  """The server of the references: delayed Nesterov (halos' ``DelayedNesterovOptimizer``,
  buffer N, activation c) over pushes weighted as the notebook's ``get_sync_weight
  ('polynomial')``: sqrt(n) / n / sqrt(1 + staleness)."""

  def __init__(self, x0, polynomial=True, buffer=BUFFER, activation=ACTIVATION):
    self.x = np.asarray(x0, np.float64).copy()
    self.mom, self.acc, self.t = np.zeros_like(self.x), np.zeros_like(self.x), 0
    self.polynomial, self.buffer, self.c = polynomial, buffer, activation

  def push(self, delta, read_version):
    w = np.sqrt(N) / N / np.sqrt(1.0 + (self.t - read_version)) if self.polynomial else 1.0
    g, nb, c = w * delta, self.buffer, self.c
    self.acc += g
    if (self.t + 1) % nb == 0:
      self.mom = OUTER_M * self.mom + self.acc / nb
      self.x = self.x - OUTER_LR * ((1 - c * nb + c) * OUTER_M * self.mom + g / nb)
      self.acc = np.zeros_like(self.acc)
    else:
      self.x = self.x - OUTER_LR * (c * OUTER_M * self.mom + g / nb)
    self.t += 1


def _inner_loop(a, b, i, x0, steps):
  """The notebook's ``inner_loop`` with ``torch.optim.SGD(lr, momentum, weight_decay,
  nesterov=True)`` from a fresh optimizer on the worker's own shard (full batch): ``d = g + wd
  x; buf = m buf + d; x -= lr (d + m buf)``. Returns the pseudo-gradient ``x0 - x``."""
  x, buf = x0.copy(), np.zeros_like(x0)
  for _ in range(steps):
    d = a[i].T @ (a[i] @ x - b[i]) / M + WD * x
    buf = MOM * buf + d
    x = x - LR * (d + MOM * buf)
  return x0 - x


def reference_notebook(x0, pushes, steps_of, msg):
  """The notebook's loop (``AsyncExperiment.run``, ``max_wait_time=0``): the next worker to
  finish (``np.argmin`` of the finish times) pushes; the workers that finished at that time
  are synchronised one by one (staleness: server updates since the worker's start), then
  every idle worker restarts from the server's model (``train()``). The notebook's messages
  take no time; here a worker's round is lengthened by the package's messages, ``msg`` s for
  its first pull and ``2 msg`` (its push, then its pull) for each later one, while its read
  stays at the time it restarts. Returns the server's model after ``pushes`` pushes."""
  a, b = _problem()
  sec = M * TPE * np.asarray(SLOW_ASYNC)
  server = _Server(x0)
  finish, started_at, result = np.zeros(N), np.zeros(N, int), [None] * N

  def restart(now, waits):
    for i in range(N):
      if result[i] is None:
        result[i], started_at[i] = _inner_loop(a, b, i, server.x, steps_of[i]), server.t
        finish[i] = now
        for s in list(waits) + [sec[i]] * steps_of[i]:
          finish[i] += s

  restart(0.0, [msg])
  while True:
    now = finish.min()
    for i in np.flatnonzero(finish == now):  # in worker order, the ties of this time
      server.push(result[i], started_at[i])
      result[i], finish[i] = None, np.inf
      if server.t == pushes:
        return server.x
    restart(now, [msg, msg])


def reference_arrival(x0, pushes, steps_of, msg):
  """The ``"arrival"`` pull as its own event loop: a worker's push reaches the server at the
  end of its last inner step; ``2 msg`` s later (its push's transfer, then its pull's) it reads
  the server's model as it is then, pushes that arrived after its own included, and computes
  its next round from it. Events in time order, ties by worker. Returns the server's model
  after ``pushes`` pushes, the number of reads and the number of them that included a push
  made later than the reader's own (not at the same time)."""
  a, b = _problem()
  sec = M * TPE * np.asarray(SLOW_ASYNC)
  server = _Server(x0)
  anchor, version = [server.x.copy() for _ in range(N)], np.zeros(N, int)
  pushed_at, times, reads, late = np.zeros(N), [], 0, 0

  def round_end(i, start):
    t = start
    for _ in range(steps_of[i]):
      t += sec[i]
    return t

  heap = [(round_end(i, msg), i, "push") for i in range(N)]
  heapq.heapify(heap)
  while True:
    t, i, kind = heapq.heappop(heap)
    if kind == "push":
      server.push(_inner_loop(a, b, i, anchor[i], steps_of[i]), version[i])
      pushed_at[i] = t
      times.append(t)
      if server.t == pushes:
        return server.x, reads, late
      heapq.heappush(heap, ((t + msg) + msg, i, "read"))
    else:
      reads, late = reads + 1, late + (max(times) > pushed_at[i])
      anchor[i], version[i] = server.x.copy(), server.t
      heapq.heappush(heap, (round_end(i, t), i, "push"))


def _server_after(stepper, pushes):
  """Step one batch at a time until ``pushes`` pushes; the server's model then."""
  clock = stepper.runs[0].host.part("clock")
  while clock.pushes < pushes:
    stepper.steps(1)
  leaves = jax.tree.leaves(stepper.state.opt_state,
                           is_leaf=lambda z: isinstance(z, ServerState))
  return next(x for x in leaves if isinstance(x, ServerState)).server["w"], clock


def _notebook_cfg(pull, latency, bandwidth=1e6):
  """8 workers of 3 speeds, dynamic local updates (H_i = 6 and 2), delayed Nesterov N = 3,
  c = 0.2, polynomial staleness weights."""
  return _cfg(algorithm="async_diloco", num_steps=10 ** 5, **{
      "diloco.local_steps": H_ASYNC, "diloco.outer_lr": OUTER_LR,
      "diloco.outer_momentum": OUTER_M, "async_diloco.buffer": BUFFER,
      "async_diloco.activation": ACTIVATION, "async_diloco.staleness_weight": "polynomial",
      "async_diloco.dynamic_local_updates": True, "async_diloco.min_local_steps": 2,
      "async_diloco.pull": pull, "cluster.latency": latency, "cluster.bandwidth": bandwidth,
      "cluster.slowdown": SLOW_ASYNC})


def _run(cfg, pushes):
  stepper = make_stepper(cfg)
  x0 = np.asarray(stepper.state.params["w"][0])
  got, clock = _server_after(stepper, pushes)
  steps_of = clock.cycle - 1
  np.testing.assert_array_equal(steps_of, [6, 6, 6, 2, 2, 2, 2, 2])
  return x0, np.asarray(got[0], np.float64), clock


def _close(got, want):
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("latency, bandwidth", [(1e-12, 1e18), (SLOW_LATENCY, 1e6)])
def test_instant_pull_equals_the_notebook_s_event_loop(latency, bandwidth):
  """40 pushes with ``pull = "instant"`` equal the notebook's loop to 1e-6 relative, with
  messages of no time (1e-12 s) and of about 0.6 of a step: a worker reads the server's model
  when it asks, after the pushes of that time, whatever its transfer takes. Workers 0-2 push
  at the same times (equal speeds): the notebook synchronises them all before they restart."""
  msg = latency + 4 * DIM / bandwidth
  x0, got, clock = _run(_notebook_cfg("instant", latency, bandwidth), 40)
  _close(got, reference_notebook(x0, 40, clock.cycle - 1, msg))
  assert clock.record()["staleness_tau_max"] >= 1


def test_arrival_pull_equals_its_event_loop_and_is_not_the_notebook_s():
  """40 pushes with ``pull = "arrival"`` (the default) and messages of about 0.6 of a step
  equal the arrival event loop to 1e-6 relative; some reads included a push made after the
  reader's own, so the server's model is not the notebook's."""
  msg = SLOW_LATENCY + 4 * DIM / 1e6
  cfg = _notebook_cfg("arrival", SLOW_LATENCY)
  assert config_lib.default_config().async_diloco.pull == "arrival"
  x0, got, clock = _run(cfg, 40)
  want, reads, late = reference_arrival(x0, 40, clock.cycle - 1, msg)
  _close(got, want)
  assert 0 < late < reads
  notebook = reference_notebook(x0, 40, clock.cycle - 1, msg)
  assert np.abs(got - notebook).max() > 1e-3 * np.abs(notebook).max()


def test_arrival_pull_with_messages_of_no_time_is_the_notebook_s():
  """With messages of 1e-12 s the two reads coincide: ``"arrival"`` equals the notebook's
  loop too."""
  x0, got, clock = _run(_notebook_cfg("arrival", 1e-12, 1e18), 40)
  _close(got, reference_notebook(x0, 40, clock.cycle - 1, 1e-12 + 4 * DIM / 1e18))


SYNC = {"diloco.local_steps": 3, "diloco.outer_lr": OUTER_LR, "diloco.outer_momentum": OUTER_M,
        "cluster.slowdown": (), "budget_unit": "grads_per_worker", "num_steps": 12,
        "eval_every": 3, "async_diloco.reset_inner": False}


@pytest.mark.parametrize("pull", ["arrival", "instant"])
def test_at_synchronous_timing_async_diloco_s_records_are_diloco_s(pull):
  """Equal speeds, no stragglers, N = n, c = 0, no weights, the inner optimizer kept across
  rounds (as DiLoCo keeps it), the same H = 3, a budget in gradients per worker evaluated
  every H (``eval_every = 3``, the rounds' ends, 4 outer steps): asynchronous DiLoCo's records
  of the evaluated model (``train_loss``, ``gap``: both read the outer model, the server's)
  equal DiLoCo's to 1e-5 relative, step for step. The n pushes of a round all come at one
  time and every read comes after them: the n displacements add up to DiLoCo's outer Nesterov
  step on the mean. ``consensus_distance`` (the workers' own models) equals DiLoCo's with
  ``"instant"``, where every worker has read the new model by the last push; with
  ``"arrival"`` the workers then still hold their pushed models. (Off the rounds' ends the
  records differ: the device step where the workers' mean count reaches a budget point can
  hold a push, a fast worker's, while another worker is a step behind.)"""
  sync = train.train(_cfg(algorithm="diloco", **SYNC))["history"]
  asyn = train.train(_cfg(algorithm="async_diloco", **SYNC, **{"async_diloco.pull": pull}))
  asyn = asyn["history"]
  assert [r["grads_per_worker"] for r in sync] == [r["grads_per_worker"] for r in asyn] == [
      0, 3, 6, 9, 12]
  for key in ("train_loss", "gap"):
    np.testing.assert_allclose([r[key] for r in asyn], [r[key] for r in sync], rtol=1e-5,
                               err_msg=key)
  assert len({round(r["train_loss"], 6) for r in sync}) == 5  # 4 outer steps moved it
  ends = [r["consensus_distance"] for r in asyn[1:]]
  if pull == "instant":
    np.testing.assert_allclose(ends, [r["consensus_distance"] for r in sync[1:]], atol=1e-6)
  else:
    assert min(ends) > 1e-3


def test_diloco_evaluates_its_outer_model():
  """``Recipe.evaluated`` of DiLoCo: mid-round an evaluation reads x_outer (the model of its
  last outer step, the same on every worker), not the workers' models; ``consensus_distance``
  stays the workers' own."""
  stepper = make_stepper(_cfg(algorithm="diloco", num_steps=100, **{
      "diloco.local_steps": 3}))
  stepper.steps(4)  # an outer step, then one inner step
  run = stepper.runs[0]
  read = np.asarray(run.models()["w"])
  leaves = jax.tree.leaves(stepper.state.opt_state, is_leaf=lambda z: isinstance(z, OuterState))
  anchor = next(x for x in leaves if isinstance(x, OuterState)).anchor["w"]
  np.testing.assert_array_equal(read, np.asarray(anchor))
  np.testing.assert_array_equal(read, np.broadcast_to(read[0], read.shape))
  x = np.asarray(stepper.state.params["w"], np.float64).reshape(N, -1)
  assert not np.allclose(read.reshape(N, -1), x)
  want = np.sqrt(np.mean(np.sum((x - x.mean(0)) ** 2, axis=1)))
  np.testing.assert_allclose(run.evaluate(run.done, None)["consensus_distance"], want, rtol=1e-5)


def test_async_diloco_evaluates_the_server_s_model():
  """``Recipe.evaluated``: an evaluation of asynchronous DiLoCo reads the server's model (the
  same on every worker), not the workers' models in their rounds."""
  stepper = make_stepper(_cfg(algorithm="async_diloco", num_steps=10 ** 5,
                               **{"diloco.local_steps": 3}))
  server, _ = _server_after(stepper, 10)
  read = np.asarray(stepper.runs[0].models()["w"])
  np.testing.assert_array_equal(read, np.asarray(server))
  np.testing.assert_array_equal(read, np.broadcast_to(read[0], read.shape))
  assert not np.allclose(read, np.asarray(stepper.state.params["w"]))


def test_async_diloco_s_consensus_distance_is_the_workers_own():
  """The replicas an evaluation reads are equal (their Xi is 0), but the recorded
  ``consensus_distance`` is that of the workers' own models (numpy float64), not a false 0."""
  stepper = make_stepper(_cfg(algorithm="async_diloco", num_steps=10 ** 5,
                               **{"diloco.local_steps": 3}))
  _server_after(stepper, 10)
  run = stepper.runs[0]
  rec = run.evaluate(run.done, None)
  x = np.asarray(stepper.state.params["w"], np.float64).reshape(N, -1)
  want = np.sqrt(np.mean(np.sum((x - x.mean(0)) ** 2, axis=1)))
  assert want > 1e-3
  np.testing.assert_allclose(rec["consensus_distance"], want, rtol=1e-5)


@pytest.mark.parametrize("over, named", [
    ({"async_diloco.pull": "late"},
     "config.async_diloco.pull='late' is not allowed"),
    ({"async_diloco.min_local_steps": 0}, "config.async_diloco.min_local_steps=0"),
])
def test_bad_async_diloco_input_is_one_line_naming_the_key(over, named):
  with pytest.raises(config_lib.ConfigError, match=named):
    train.setup(_cfg(algorithm="async_diloco", **over))


def _between_tied_pushes(cfg) -> int:
  """The first device step after which one of the equal-speed workers 0-2 has pushed and
  waits while another's push of the same time is still to come."""
  stepper = make_stepper(cfg)
  clock = stepper.runs[0].host.part("clock")
  for step in range(1, 400):
    stepper.steps(1)
    asked, pending = clock.asked[:3], clock.clock.finish[:3]
    if (asked >= 0).any() and (asked < 0).any() and np.isin(pending, asked[asked >= 0]).any():
      return step
  raise AssertionError("no step between tied pushes")


@pytest.mark.slow  # two runs and a resume
def test_instant_pull_resumes_between_tied_pushes(tmp_path):
  """With ``pull = "instant"`` the host keeps when each waiting worker asked: a run killed
  after a checkpoint taken between two pushes of the same time resumes from it (the first
  pusher still reads after the second) and ends with the uninterrupted run's records."""
  import json

  at = _between_tied_pushes(_notebook_cfg("instant", SLOW_LATENCY))
  cfg = lambda: config_lib.override(_notebook_cfg("instant", SLOW_LATENCY), {
      "num_steps": 3 * at, "eval_every": at, "checkpoint_every": at})
  train.train(cfg(), str(tmp_path / "full"))

  def crash(step, state, setup):
    del state, setup
    if step == at + 1:
      raise Crash()

  with pytest.raises(Crash):
    train.train(cfg(), str(tmp_path / "run"), hooks=(crash,))
  train.train(cfg(), str(tmp_path / "run"))
  read = lambda d: [{k: v for k, v in json.loads(line).items() if k != "wall_time"}
                    for line in open(tmp_path / d / "metrics.jsonl")]
  assert read("run") == read("full") and len(read("full")) == 4


@pytest.mark.slow
def test_diloco_s_worker_test_accuracy_mid_round_is_the_workers_own():
  """Mid-round DiLoCo evaluates x_outer (``test_accuracy``), but ``worker_test_accuracy``
  stays the mean over workers of each worker's own model's accuracy on the worker test sample
  (:func:`nbsgd_jax.run.task.eval_examples`), computed here in numpy from the parameters:
  logistic regression, ``argmax(x W_i + b_i)``."""
  from nbsgd_jax import data as data_lib
  from nbsgd_jax.run import task as task_lib
  rng = np.random.default_rng(0)
  w_true = rng.normal(size=(20, 5))
  x, tx = rng.normal(size=(800, 20)), rng.normal(size=(400, 20))
  noisy = lambda f: np.argmax(f @ w_true + 2.0 * rng.normal(size=(len(f), 5)), 1)
  data = data_lib.ArrayDataset(x.astype(np.float32), noisy(x), tx.astype(np.float32),
                               noisy(tx), num_classes=5, name="toy")
  cfg = small_cfg(dataset="arrays", model="logreg", algorithm="diloco", num_steps=100,
                  learning_rate=0.5, **{"diloco.local_steps": 8})
  stepper = make_stepper(cfg, data=data)
  stepper.steps(12)  # an outer step, then 4 inner steps
  run = stepper.runs[0]
  rec = run.evaluate(run.done, None)
  _, mine = task_lib.eval_examples(len(tx), cfg, cfg.num_workers)
  (layer,) = jax.tree.leaves(stepper.state.params, is_leaf=lambda z: "kernel" in z)
  kern, bias = np.asarray(layer["kernel"], np.float64), np.asarray(layer["bias"], np.float64)
  hits = lambda k, b: np.mean(np.argmax(tx[mine] @ k + b, 1) == data.y_test[mine])
  own = np.mean([hits(kern[i], bias[i]) for i in range(cfg.num_workers)])
  outer = np.asarray(run.models()["params"]["Dense_0"]["kernel"][0], np.float64)
  outer_b = np.asarray(run.models()["params"]["Dense_0"]["bias"][0], np.float64)
  assert abs(hits(outer, outer_b) - own) > 0.01  # the two models differ on this sample
  np.testing.assert_allclose(rec["worker_test_accuracy"], own, atol=1e-6)
  np.testing.assert_allclose(rec["test_accuracy"], np.mean(
      np.argmax(tx @ outer + outer_b, 1) == data.y_test), atol=1e-6)


MLP_SYNC = {**SYNC, "cluster.time_per_example": 1e-3, "cluster.latency": 1e-4,
            "cluster.bandwidth": 1e9, "eval_train_examples": 64}


@pytest.mark.slow  # 4-14 s cold: DiLoCo's two programs and the gathered buckets
def test_at_synchronous_timing_on_the_mlp_with_minibatches_async_diloco_is_diloco():
  """Common random numbers across clocks: on the MLP with mini-batches of 8 (mnist10k), at
  synchronous timing (equal speeds, no stragglers, N = n, c = 0, no weights, the inner
  optimizer kept, ``pull = "instant"``), asynchronous DiLoCo's records equal DiLoCo's at every
  round's end: a worker's k-th gradient reads the same batch on the event clock (its own
  gradient count, ``Events.sample``) as on the lockstep clock (step k). Keyed by the device
  step instead, the event clock's extra pull steps shift every later batch and the records
  part after the first round."""
  base = small_cfg(**MLP_SYNC)
  sync = train.train(config_lib.override(base, {"algorithm": "diloco"}))["history"]
  asyn = train.train(config_lib.override(base, {"algorithm": "async_diloco",
                                                "async_diloco.pull": "instant"}))["history"]
  assert [r["grads_per_worker"] for r in asyn] == [r["grads_per_worker"] for r in sync] == [
      0, 3, 6, 9, 12]
  for key in ("train_loss", "test_loss", "test_accuracy"):
    np.testing.assert_allclose([r[key] for r in asyn], [r[key] for r in sync], rtol=1e-5,
                               err_msg=key)
  assert len({round(r["train_loss"], 5) for r in sync}) == 5  # 4 outer steps moved it


@pytest.mark.parametrize("algorithm", ["ad_psgd", "async_diloco"])
def test_a_worker_s_kth_gradient_reads_draw_k(algorithm):
  """On the event clock, the data index (``Events.sample``) of the gradient each worker
  computes counts its own gradients: along the steps where a worker's gradient is kept
  (AD-PSGD: it starts a computation; asynchronous DiLoCo: an inner step fires), worker i
  reads draws 0, 1, 2, ... in turn, whatever the other workers' speeds (the device step
  reads draw k as the lockstep clock reads step k: ``run.step.data_index``)."""
  cfg = least_squares_cfg(  # the host's draws: a linear model compiles in a blink
      n=4, m=8, dim=5, lr=0.05, momentum=0.0, weight_decay=0.0, slowdown=(1.0, 1.7, 2.9, 4.3),
      time_per_example=1e-3, latency=1e-4, bandwidth=1e9, num_steps=40, eval_every=40,
      algorithm=algorithm, **{"diloco.local_steps": 2, "problem.full_batch": False})
  seen = {i: [] for i in range(4)}
  for _, inputs, _, _ in make_stepper(cfg).steps(40):
    ev = inputs.events
    kept = ev.start if algorithm == "ad_psgd" else ev.fire & ~ev.pull
    for i in np.flatnonzero(kept):
      seen[i].append(int(ev.sample[i]))
  assert all(len(v) >= 3 for v in seen.values())
  assert len({len(v) for v in seen.values()}) > 1  # the workers ran at their own paces
  for i, draws in seen.items():
    assert draws == list(range(len(draws))), (i, draws)
