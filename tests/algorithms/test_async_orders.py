"""Both update orders of AD-PSGD and SwarmSGD (``ad_psgd.order``, ``swarm_sgd.averaging``),
each against its own sequential event loop in numpy float64, written from the paper or the
released code (not from the package), on least squares with 3 worker speeds.

* ``ad_psgd.order='paper'``: Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel
  Stochastic Gradient Descent", ICML 2018, Algorithm 1: at worker i's event, lines 2-3
  average with a neighbour drawn uniformly, ``x_i, x_j <- (x_i + x_j) / 2``, line 4 applies
  the gradient of its read.
* ``ad_psgd.order='released'``: facebookresearch/stochastic_gradient_push, ``gossip/
  ad_psgd.py``, commit e682064, ``BilatGossipDataParallel._gossip_target``: the gossip
  process loops "if the training process wrote a gradient, apply it (torch SGD); then one
  bilateral mix (``gossiper.py`` ``BilatPushPull.mix``, ``(x + x_peer) / 2`` on both)". Each
  loop iteration takes one message's time; a gradient computed from the model read after the
  iteration that applied the previous one is applied at the first iteration ending at or after
  its computation's end (the modelling of ``nbsgd_jax/host/async_orders.py``).
* ``swarm_sgd.averaging='symmetric'``: Nadiradze, Sabour, Davies, Li, Alistarh, "Asynchronous
  Decentralized SGD with Quantized and Local Updates", NeurIPS 2021, Algorithm 1: H local
  steps, then ``x_i, x_j <- (x_i + x_j) / 2``.
* ``swarm_sgd.averaging='one_sided'``: ICLR-PopSGD/PopSGD, ``worker.py``, commit 4f0c6f0 (the
  training loop from "Perform one SGD step"): a local step, ``model_to_copy`` (the published
  copy), then with a drawn partner ``partner_model = (partner's published copy + model_copy) /
  2`` copied into the worker's own model; the partner's model is not written.

Every local step is torch's SGD as the reference's gossip process runs it (``d = g + wd x;
buf = m buf + d; d = d + m buf; x -= lr d``). The inputs shared with the package: the seeded
peer draw ``draw_index(seed, i, k, degree)`` (an input of the run, like its seed) and the
cluster's times written out (worker i computes for ``batch * time_per_example * slowdown_i``
s, a message takes ``latency + 4 d / bandwidth`` s).
"""

import heapq
import json
import types

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.models import problems
from nbsgd_jax import train
from nbsgd_jax.host.events import draw_index  # the seeded draw: an input, like a seed
from tests.helpers import least_squares_cfg, make_stepper

N, M, DIM = 8, 16, 4
SLOW = (1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0)  # 3 speeds
LR, MOM, WD, TPE, LAT, BW = 0.05, 0.9, 1e-3, 1e-3, 5e-3, 1e6
MSG = LAT + 4 * DIM / BW  # s, one model (float32 [DIM])
STEPS = (1, 4, 12, 30)  # compared after these device steps


def _cfg(**kw):
  return least_squares_cfg(n=N, m=M, dim=DIM, lr=LR, momentum=MOM, weight_decay=WD,
                           slowdown=SLOW, time_per_example=TPE, latency=LAT, bandwidth=BW,
                           **{"num_steps": 200, "eval_every": 200, **kw})


class Problem:
  """Least squares as the package's problem draws it (data are an input), float64."""

  def __init__(self):
    prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
    self.a, self.b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
    self.nbrs = [sorted({(i - 1) % N, (i + 1) % N}) for i in range(N)]  # the ring

  def grad(self, i, x):
    return self.a[i].T @ (self.a[i] @ x - self.b[i]) / M

  def peer(self, seed, i, k):
    return self.nbrs[i][draw_index(seed, i, k, len(self.nbrs[i]))]


def torch_sgd(x, buf, g):
  """torch.optim.SGD(lr, momentum, weight_decay, nesterov=True).step() on one worker."""
  d = g + WD * x
  buf = MOM * buf + d
  return x - LR * (d + MOM * buf), buf


def per_gradient_loop(x0, keep, mode, every=1, seed=0):
  """AD-PSGD as its paper (``mode='paper'``) or SwarmSGD (``'symmetric'``, the paper;
  ``'one_sided'``, PopSGD's worker.py): every event of a worker applies the gradient of its
  read, the events ``(worker, own step)`` of ``keep`` in time order (ties by worker); an event
  pairs every ``every``-th (SwarmSGD's H). Returns x ``[N, DIM]``."""
  p = Problem()
  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  buf, pub = np.zeros_like(x), x.copy()
  held = np.stack([p.grad(i, x[i]) for i in range(N)])
  heap = [(M * TPE * SLOW[i], i, 0) for i in range(N)]
  heapq.heapify(heap)
  while heap:
    t, i, k = heapq.heappop(heap)
    if (i, k) not in keep:
      continue
    j = p.peer(seed, i, k) if (k + 1) % every == 0 else i
    if mode == "paper":  # Lian et al., Alg. 1: line 3, the average, then line 4, the gradient
      x[i] = x[j] = (x[i] + x[j]) / 2
      x[i], buf[i] = torch_sgd(x[i], buf[i], held[i])
    elif mode == "symmetric":  # Nadiradze et al., Alg. 1: the local step, then the average
      x[i], buf[i] = torch_sgd(x[i], buf[i], held[i])
      x[i] = x[j] = (x[i] + x[j]) / 2
    else:  # PopSGD worker.py: model_update; model_to_copy; Get the partner's copy; average
      x[i], buf[i] = torch_sgd(x[i], buf[i], held[i])
      pub[i] = x[i].copy()
      if j != i:
        x[i] = (pub[j] + pub[i]) / 2
    held[i] = p.grad(i, x[i])
    heapq.heappush(heap, (t + (MSG if j != i else 0.0) + M * TPE * SLOW[i], i, k + 1))
  return x


def gossip_loop(x0, keep, seed=0):
  """The released AD-PSGD (stochastic_gradient_push gossip/ad_psgd.py, e682064): worker i's
  gossip iterations ``(i, k)`` of ``keep`` in time order (ties by worker), each ending one
  message after the last. Returns ``(x [N, DIM], gradients applied [N], mean s from a
  gradient's read to its application, mean changes to the worker's model in between)``."""
  p = Problem()
  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  buf = np.zeros_like(x)
  held = np.stack([p.grad(i, x[i]) for i in range(N)])
  written = np.asarray([M * TPE * s for s in SLOW])  # s: when the training process wrote it
  read_at, changes, read_changes = np.zeros(N), np.zeros(N, int), np.zeros(N, int)
  applied, ages, own = np.zeros(N, int), [], []
  heap = [(MSG, i, 0) for i in range(N)]
  heapq.heapify(heap)
  while heap:
    t, i, k = heapq.heappop(heap)
    if (i, k) not in keep:
      continue
    grad_ready = written[i] <= t  # train_write_flag.is_set()
    if grad_ready:  # gossip_optimizer.step() with the written gradient
      ages.append(t - read_at[i])
      own.append(changes[i] - read_changes[i])
      x[i], buf[i] = torch_sgd(x[i], buf[i], held[i])
      applied[i] += 1
    j = p.peer(seed, i, k)  # gossiper.mix(out_msg): one bilateral average
    x[i] = x[j] = (x[i] + x[j]) / 2
    changes[list({i, j})] += 1
    if grad_ready:  # the training process pulls the model and computes its next gradient
      held[i], read_at[i], read_changes[i] = p.grad(i, x[i]), t, changes[i]
      written[i] = t + M * TPE * SLOW[i]
    heapq.heappush(heap, (t + MSG, i, k + 1))
  mean = lambda v: float(np.mean(v)) if v else float("nan")
  return x, applied, mean(ages), mean(own)


def _compare(cfg, reference, steps=STEPS):
  """Steps the run and compares its models with ``reference(x0, keep)`` after each of
  ``steps``; checks the device's bytes against the clock's at every step. Returns the
  clock and the reference's last output."""
  stepper = make_stepper(cfg)
  x0 = np.asarray(stepper.state.params["w"][0])
  clock, done_steps, out = stepper.runs[0].host.part("clock"), 0, None
  for target in steps:
    for t, inputs, _, report in stepper.steps(target - done_steps):
      charged = sum(r.num_bytes for r in clock.rounds(t, inputs, report))
      np.testing.assert_allclose(charged, report["bytes_sent"], rtol=1e-6, err_msg=f"step {t}")
    done_steps = target
    done = clock.clock.steps
    keep = {(i, k) for i in range(N) for k in range(int(done[i]))}
    out = reference(x0, keep)
    want = out[0] if isinstance(out, tuple) else out
    got = np.asarray(stepper.state.params["w"], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                               err_msg=f"after {target} device steps")
  return clock, out


@pytest.mark.parametrize("over, mode, every", [
    ({"ad_psgd.order": "paper"}, "paper", 1),
    ({"algorithm": "swarm_sgd", "swarm_sgd.local_steps": 2}, "symmetric", 2),
    ({"algorithm": "swarm_sgd", "swarm_sgd.local_steps": 2,
      "swarm_sgd.averaging": "one_sided"}, "one_sided", 2),
    ({"algorithm": "swarm_sgd", "swarm_sgd.local_steps": 1,
      "swarm_sgd.averaging": "one_sided"}, "one_sided", 1)])
def test_one_gradient_per_event_equals_its_transcription(over, mode, every):
  """AD-PSGD's paper order and SwarmSGD's two averagings equal their event loops after 1, 4,
  12 and 30 device steps, to 1e-6 relative; the bytes the device reports are the clock's."""
  clock, _ = _compare(_cfg(**over), lambda x0, keep: per_gradient_loop(x0, keep, mode, every))
  assert clock.clock.steps.sum() > 30  # batches of several events


def test_one_sided_leaves_the_partner_unchanged_and_differs_from_symmetric():
  """The orders are not the same computation: after 30 device steps one-sided and symmetric
  averaging give models more than 1 % apart (relative), from the same events."""
  x0 = np.asarray(make_stepper(_cfg(algorithm="swarm_sgd")).state
                  .params["w"][0])
  keep = {(i, k) for i in range(N) for k in range(12)}
  a = per_gradient_loop(x0, keep, "symmetric", 2)
  b = per_gradient_loop(x0, keep, "one_sided", 2)
  assert np.abs(a - b).max() > 1e-2 * np.abs(a).max()


def test_released_ad_psgd_equals_the_gossip_loop():
  """``ad_psgd.order='released'`` equals the released code's gossip loop after 1, 4, 12, 30,
  80 and 160 device steps (1e-6 relative); the clock's gradients per worker, their mean age from the
  read and the changes to the worker's own model in between are the loop's; a mix takes a
  third of the fastest gradient, so there are several averages per gradient."""
  clock, (_, applied, age, own) = _compare(_cfg(**{"ad_psgd.order": "released"}), gossip_loop,
                                           STEPS + (80, 160))
  rec = clock.record()
  assert rec["grads_per_worker"] == pytest.approx(applied.mean()) and applied.min() >= 1
  assert rec["events"] == clock.clock.steps.sum() > 2 * applied.sum()
  assert rec["staleness_s"] == pytest.approx(age)
  assert rec["staleness_own_steps"] == pytest.approx(own) and own > 1
  assert rec["staleness_tau_max"] >= rec["staleness_own_steps_max"] >= 1
  np.testing.assert_array_equal(clock.computed(clock.clock.steps), applied)


def test_released_budget_counts_gradients():
  """A budget in gradients per worker (``steps_for``) ends within one batch of it: the
  gossip iterations that apply no gradient do not count."""
  s = train.setup(_cfg(**{"ad_psgd.order": "released"}))
  stepper = train.Stepper.of(s)
  clock = stepper.runs[0].host.part("clock")
  (end,) = clock.steps_for([3])
  stepper.steps(end)
  assert clock.computed(clock.clock.steps).mean() >= 3
  assert end > 3 * N / 4  # several batches (of gossip iterations) per gradient


@pytest.mark.parametrize("over, named", [
    ({"ad_psgd.order": "reference"},
     "config.ad_psgd.order='reference' is not allowed: use one of ['paper', 'released']"),
    ({"algorithm": "swarm_sgd", "swarm_sgd.averaging": "both"},
     "config.swarm_sgd.averaging='both' is not allowed: use one of ['symmetric', 'one_sided']")])
def test_bad_order_is_one_line_naming_the_key(over, named):
  with pytest.raises(config_lib.ConfigError) as e:
    train.setup(_cfg(**over))
  assert any(line == named for line in e.value.errors), e.value.errors


def test_released_clock_resumes_from_its_state():
  """The released order's clock continued from its JSON state draws the same masks and
  records as the clock it came from."""
  clocks = [make_stepper(_cfg(**{"ad_psgd.order": "released"})).runs[0]
            .host.part("clock") for _ in range(2)]
  for _ in range(60):
    clocks[0].inputs(0, types.SimpleNamespace(events=None), None)
  clocks[1].load_state_dict(json.loads(json.dumps(clocks[0].state_dict())))
  for _ in range(60):
    got = [types.SimpleNamespace(events=None) for _ in clocks]
    for c, inputs in zip(clocks, got):
      c.inputs(0, inputs, None)
    for key in ("start", "fire", "peer", "apply"):
      np.testing.assert_array_equal(getattr(got[0].events, key), getattr(got[1].events, key))
  assert clocks[0].record() == clocks[1].record() and clocks[0].record()["grads_per_worker"] > 0
