"""The asynchronous family on the event clock (``nbsgd_jax/recipes/asynchronous.py``) against
independent references.

AD-PSGD's reference is a plain sequential event loop in numpy float64, written from the paper
and the reference code, not from the package: Lian, Zhang, Zhang, Liu, "Asynchronous
Decentralized Parallel Stochastic Gradient Descent", ICML 2018, Algorithm 1 (a worker computes
its gradient on its read of its model; at its event it averages with a neighbour drawn
uniformly, (x_i + x_j) / 2 for both, then applies the stale gradient), with the local step of
the reference's gossip process (facebookresearch/stochastic_gradient_push,
``gossip/ad_psgd.py``, ``BilatGossipDataParallel._gossip_target``, commit
ac9af237e195c812ebad08fc4697e3de1fa96ff8: ``torch.optim.SGD(lr, momentum, weight_decay,
nesterov)``, i.e. ``d = g + wd x; buf = m buf + d; d = d + m buf; x -= lr d``) and the
cluster's times written out (the peer of worker i's event k is the seeded draw
``draw_index(seed, i, k, degree)``, an input of the run like its seed): worker i computes for ``batch * time_per_example * slowdown_i``
seconds, and after an exchange it sends one model (``latency + 4 d / bandwidth``) before its
next computation.
"""

import heapq

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax.models import problems
from nbsgd_jax import train
from nbsgd_jax.host.events import draw_index  # the seeded draw: an input, like a seed
from tests.helpers import least_squares_cfg, make_stepper

N, M, DIM = 8, 16, 4
SLOW = (1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 5.0, 5.0)  # 3 speeds
LR, MOM, WD, TPE, LAT, BW = 0.05, 0.9, 1e-3, 1e-3, 1e-4, 1e6


def _cfg(**kw):
  return least_squares_cfg(n=N, m=M, dim=DIM, lr=LR, momentum=MOM, weight_decay=WD,
                           slowdown=SLOW, time_per_example=TPE, latency=LAT, bandwidth=BW,
                           **{"num_steps": 30, "eval_every": 30, **kw})


def sequential(x0, keep, seed=0, every=1, swarm=False):
  """AD-PSGD (or SwarmSGD: ``swarm``, a local step at every event and an average after every
  ``every``-th) event by event (module docstring): the events ``(worker, own step)`` of
  ``keep`` applied in time order (ties by worker). Returns ``(x [n, d], mean staleness)``."""
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  grad = lambda i, x: a[i].T @ (a[i] @ x - b[i]) / M
  nbrs = [sorted({(i - 1) % N, (i + 1) % N}) for i in range(N)]
  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  buf, held = np.zeros_like(x), np.stack([grad(i, x[i]) for i in range(N)])
  changes, read, stale = np.zeros(N, int), np.zeros(N, int), []
  heap = [(M * TPE * SLOW[i], i, 0) for i in range(N)]
  heapq.heapify(heap)
  while heap:
    t, i, k = heapq.heappop(heap)
    if (i, k) not in keep:
      continue
    pairs = (k + 1) % every == 0
    j = nbrs[i][draw_index(seed, i, k, len(nbrs[i]))] if pairs else i
    stale.append(changes[i] - read[i])
    if not swarm:
      x[i] = x[j] = (x[i] + x[j]) / 2
    d = held[i] + WD * x[i]
    buf[i] = MOM * buf[i] + d
    x[i] -= LR * (d + MOM * buf[i])
    if swarm:
      x[i] = x[j] = (x[i] + x[j]) / 2
    changes[list({i, j})] += 1
    held[i], read[i] = grad(i, x[i]), changes[i]
    send = LAT + 4 * DIM / BW if j != i else 0.0
    heapq.heappush(heap, (t + send + M * TPE * SLOW[i], i, k + 1))
  return x, float(np.mean(stale))


@pytest.mark.parametrize("algorithm, over, ref", [
    ("ad_psgd", {}, {}),
    ("swarm_sgd", {"swarm_sgd.local_steps": 3}, {"every": 3, "swarm": True})])
def test_equals_the_sequential_event_loop(algorithm, over, ref):
  """30 device steps (batches of events) equal the events they applied, run one by one by the
  numpy loop, to 1e-6 relative; the logged mean staleness is the loop's."""
  s = train.setup(_cfg(algorithm=algorithm, **over))
  stepper = train.Stepper.of(s)
  x0 = np.asarray(stepper.state.params["w"][0])
  steps = stepper.steps(30)
  clock = stepper.runs[0].host.part("clock")
  done = clock.clock.steps
  assert sum(int(inputs.events.fire.sum()) for _, inputs, _, _ in steps) == done.sum()
  keep = {(i, k) for i in range(N) for k in range(int(done[i]))}
  want, stale = sequential(x0, keep, **ref)
  got = np.asarray(stepper.state.params["w"], np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
  rec = clock.record()
  assert rec["events"] == done.sum() > 30  # batches of several events
  assert rec["staleness_own_steps"] == pytest.approx(stale) and stale > 0
  assert done[0] > done[7]  # the fast workers made more steps


def test_bipartite_pairing_pairs_an_active_with_a_passive_worker():
  from nbsgd_jax import recipes
  s = train.setup(_cfg(**{"ad_psgd.pairing": "bipartite"}))
  side = recipes.two_colouring(N, s.topology.edges)
  pairs = 0
  for _, inputs, _, _ in train.Stepper.of(s).steps(20):
    peer = inputs.events.peer
    for i in np.flatnonzero(peer != np.arange(N)):
      assert side[i] != side[peer[i]]
      pairs += 1
  assert pairs > 0


@pytest.mark.parametrize("over, named", [
    ({"ad_psgd.pairing": "bipartite", "num_workers": 7, "problem.shards": 7,
      "cluster.slowdown": ()},
     "config.ad_psgd.pairing='bipartite' is not allowed"),
    ({"ad_psgd.pairing": "pairs"}, "ad_psgd.pairing"),
    ({"nonblocking.enabled": True}, "config.nonblocking.enabled=True is not allowed"),
    ({"cluster.failures": "1:0:5"}, "config.cluster.failures"),
    ({"algorithm": "sgp", "sgp.synch_freq": -1}, "config.sgp.synch_freq=-1 is not allowed"),
    ({"algorithm": "async_diloco", "async_diloco.staleness_weight": "linear"},
     "config.async_diloco.staleness_weight='linear' is not allowed"),
    ({"algorithm": "async_diloco", "diloco.outer_nesterov": False},
     "config.diloco.outer_nesterov=False is not allowed"),
    ({"algorithm": "sgp", "sgp.synch_freq": 2},
     "config.sgp.synch_freq=2 is not allowed with config.sgp.overlap=False"),
])
def test_bad_input_is_one_line_naming_the_key(over, named):
  with pytest.raises(config_lib.ConfigError, match=named.replace("[", r"\[")):
    train.setup(_cfg(**over))


# ----------------------------------------------------------------------------- SGP


def reference_sgp(x0, steps, overlap, synch_freq):
  """SGP as facebookresearch/stochastic_gradient_push ``gossip/distributed.py`` runs it
  (commit e682064; ``GossipDataParallel(push_sum=True, overlap, synch_freq)``), all workers
  in lockstep, in numpy float64. Per iteration: with ``overlap``, the forward pre-hook
  (``__make_forward_pre_hook``, lines 574-584): ``non_blocking = num_updates < synch_freq``;
  ``_query_gossip_queue(non_blocking)`` (lines 336-387) returns False when no round is in
  flight, and otherwise lands the round (adds the received residuals) only when it blocks: the
  limit of slow communication, where a non-blocking query never finds the round arrived (it
  then returns None); ``num_updates = 0`` after a landing, ``+= 1`` otherwise (iteration 0
  included); then ``transfer_params`` (lines 389-435) sends a round only when none is in flight:
  keep half of the numerator and weight, send half to the peer. Then the gradient at the
  de-biased ``z = x / w`` and ``torch.optim.SGD``'s step on the numerator; without overlap,
  after the step, one blocking push-sum round. Round r goes to ``i + 2^(r mod log2 n)`` (the
  package's one-peer exponential graph; the reference's DynamicDirectedExponentialGraph also
  alternates the backward peers ``i - 2^r``). Returns the de-biased models after ``steps``
  iterations (and a round the next pre-hook would land, landed)."""
  prob = problems.least_squares(N, M, DIM, noise=1.0, heterogeneity=1.0, seed=0)
  a, b = prob.features.astype(np.float64), prob.targets.astype(np.float64)
  levels = (N - 1).bit_length()
  x = np.repeat(np.asarray(x0, np.float64)[None], N, 0)
  w, buf = np.ones(N), np.zeros_like(x)
  flight, num_updates, r = None, 0, 0

  def query(non_blocking):
    nonlocal flight, x, w
    if flight is None:
      return False  # "not gossiping right now"
    if non_blocking:
      return None  # the flag is not set yet: slow communication
    to, part_x, part_w = flight
    np.add.at(x, to, part_x)
    np.add.at(w, to, part_w)
    flight = None
    return True

  def pre_hook():
    nonlocal num_updates, flight, x, w, r
    if query(num_updates < synch_freq):
      num_updates = 0
    else:
      num_updates += 1
    if flight is None:  # transfer_params: only when the last round was mixed
      to = (np.arange(N) + 2 ** (r % levels)) % N
      r += 1
      x, w = x / 2, w / 2
      flight = (to, x.copy(), w.copy())

  for k in range(steps):
    if overlap:
      pre_hook()
    z = x / w[:, None]
    g = np.stack([a[i].T @ (a[i] @ z[i] - b[i]) / M for i in range(N)])
    d = g + WD * x
    buf = MOM * buf + d
    x = x - LR * (d + MOM * buf)
    if not overlap:
      src = (np.arange(N) - 2 ** (k % levels)) % N
      x, w = (x + x[src]) / 2, (w + w[src]) / 2
  if overlap and flight is not None and num_updates >= synch_freq:
    query(False)
  return x / w[:, None]


@pytest.mark.parametrize("overlap, synch_freq", [(False, 0), (True, 0), (True, 1), (True, 2)])
@pytest.mark.parametrize("steps", [1, 2, 3, 25])
def test_sgp_equals_the_reference_s_iterations(overlap, synch_freq, steps):
  """``steps`` steps of ``sgp`` equal the numpy transcription of the reference's iterations to
  1e-6 relative: SGP; Overlap-SGP landing each round at the end of its step (synch_freq 0),
  and with synch_freq s = 1, 2 the first round after s steps and every later one after s + 1
  (the pre-hook counts iteration 0)."""
  s = train.setup(_cfg(algorithm="sgp", topology="one_peer_exponential", **{
      "sgp.overlap": overlap, "sgp.synch_freq": synch_freq}))
  stepper = train.Stepper.of(s)
  x0 = np.asarray(stepper.state.params["w"][0])
  stepper.steps(steps)
  want = reference_sgp(x0, steps, overlap, synch_freq)
  got = np.asarray(stepper.state.params["w"], np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_sgp_without_overlap_is_dpsgd_over_the_same_graph():
  """Every phase of the one-peer exponential graph, (I + P_t) / 2, is doubly stochastic: the
  push-sum weights stay 1 and SGP is D-PSGD over W_t (local step, then gossip)."""
  out = {}
  for algorithm in ("sgp", "dpsgd"):
    stepper = make_stepper(_cfg(algorithm=algorithm,
                                topology="one_peer_exponential"))
    stepper.steps(25)
    out[algorithm] = np.asarray(stepper.state.params["w"])
  np.testing.assert_allclose(out["sgp"], out["dpsgd"], rtol=1e-6, atol=1e-7)
