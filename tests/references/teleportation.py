"""Numpy reference for Teleportation, transcribed from the SaCS simulator.

Repository: github.com/sacs-epfl/decentralized-learning-simulator
commit bdbc50dbde61ef4894ebee5466d88023d9230461 (the teleportation folder last changed in
677e899aedf358a5b94160decaa4fa9865cf9293). Files read:
  dasklearn/simulation/teleportation/{client,simulation,sample_manager,round,settings}.py
  dasklearn/simulation/{client,asynchronous_client,asynchronous_simulation,simulation}.py,
  dasklearn/simulation/bandwidth_scheduler.py, dasklearn/gradient_aggregation/fedavg.py,
  dasklearn/{functions,model_trainer,model_manager,session_settings}.py,
  dasklearn/optimizer/sgd.py, dasklearn/models/__init__.py, dasklearn/__init__.py,
  args.py, main.py.
Paper: arXiv 2501.15259, "Scalable Decentralized Learning with Teleportation" (Takezawa and
Stich, ICLR 2025). The simulator is by EPFL SaCS; the paper is not theirs.

Details an implementer could get wrong:
* k = `sample_size` (CLI --sample-size, default 10), first clamped to min(k, n), then it
  must be a power of two (so the default only runs with --peers 1, 2, 4 or 8). A k of 1
  gives degree 0: no model is ever sent on, so the run stalls after round 1.
* Which nodes are active in round r (rounds count from 1): sort all n nodes by
  md5(b"%d-%d" % (node, r)).digest() (raw bytes, sort is stable) and take the first k.
  Slot s in round r is node sample_r[s].
* The slot graph G_k = nx.random_regular_graph(int(log2(k)), k) is drawn ONCE when the
  simulation is built (seed=None means networkx uses the global `random`, which was
  seeded with settings.seed, CLI default 42, just before). It is never redrawn.
* Each active node trains the model it received (round 1: the same torch.manual_seed(seed)
  initial model in every slot), sends it to each G_k neighbour (in G_k.neighbors order),
  and, once it holds deg models from neighbours, averages [incoming in arrival order] +
  [own trained model] with FedAvg: weight w = float(1/(deg+1)), center = 0, then
  center += w * p in float32, in that order. Only .parameters() are averaged; buffers
  (e.g. BatchNorm statistics) come from models[0], the first arrival.
* The average of slot s goes to node sample_{r+1}[s] (sent even if that node is itself)
  and is that node's starting model in round r+1. Nodes keep no model between
  activations, but ModelTrainer keeps each node's SGD optimizer state (momentum buffer)
  and reloads it at the node's next activation, whichever slot that is in.
* Local training: torch SGD(lr=0.002, momentum=0.9, weight_decay=0; femnist: lr=0.004,
  momentum=0), local_steps=5 batches of 32 from a new shuffled DataLoader each time (fewer
  steps if the shard has fewer batches).
* Bytes: every transfer has size len(pickle.dumps(state_dict)) (float32 payload 4 bytes a
  weight plus buffers and pickle overhead); per round each active node sends deg+1 models.
* settings.rounds is ignored: the run stops when the simulated time reaches --duration.
* The reference is event driven and does not check that a node's own training is done, nor
  keep early in-sample models when its start-of-round message arrives later (it replaces
  the Round object); under uneven timing it can stall a slot. This module is the intended
  synchronous round, which is what the simulator does when all nodes run in step.
"""
from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from typing import Callable, Sequence

import numpy as np

AUGMENTATION_FACTOR_SIM = 3.0  # dasklearn/__init__.py
MICROSECONDS = 10 ** 6


def md5_draw(round_nr: int, n: int) -> list[bytes]:
  """The reference's sort keys for round `round_nr` (sample_manager.py lines 14-18).

  Returns n md5 digests (16 bytes each), key i = md5(b"%d-%d" % (i, round_nr)).
  """
  return [hashlib.md5(b"%d-%d" % (i, round_nr)).digest() for i in range(n)]


def activate(draw: Sequence, n: int, k: int) -> list[int]:
  """Active nodes of a round, listed by slot (SampleManager.get_sample, lines 13-20).

  draw: n sort keys (md5_draw for the reference's own; any comparable keys otherwise).
  Returns sample (length min(k, n)); slot s is held by node sample[s]. The sort is stable
  on the key alone, so ties go to the lower node id.
  """
  k = min(k, n)  # TeleportationSimulation.__init__ line 15
  order = sorted(range(n), key=lambda i: draw[i])
  return order[:k]


def slot_degree(k: int) -> int:
  """int(log2(k)) after the power-of-two check (simulation.py lines 19-22)."""
  if k & (k - 1) != 0:
    raise ValueError("Sample size must be a power of 2")
  return k.bit_length() - 1


def slot_topology(rng: random.Random, k: int) -> list[list[int]]:
  """G_k = networkx.random_regular_graph(log2 k, k, seed=rng), neighbours in G_k order.

  Transcribes networkx (3.x) random_regular_graph (Steger-Wormald pairing with restarts);
  the reference passes seed=None, i.e. the global `random`, seeded with settings.seed, so
  random.Random(settings.seed) reproduces it. Returns adjacency[s] = list(G_k.neighbors(s)).
  """
  d, n = slot_degree(k), k
  adjacency: list[list[int]] = [[] for _ in range(n)]
  if d == 0:
    return adjacency

  def suitable(edges, potential):
    if not potential:
      return True
    for s1 in potential:
      for s2 in potential:
        if s1 == s2:
          break
        if s1 > s2:
          s1, s2 = s2, s1
        if (s1, s2) not in edges:
          return True
    return False

  def try_creation():
    edges = set()
    stubs = list(range(n)) * d
    while stubs:
      potential = defaultdict(lambda: 0)
      rng.shuffle(stubs)
      it = iter(stubs)
      for s1, s2 in zip(it, it):
        if s1 > s2:
          s1, s2 = s2, s1
        if s1 != s2 and (s1, s2) not in edges:
          edges.add((s1, s2))
        else:
          potential[s1] += 1
          potential[s2] += 1
      if not suitable(edges, potential):
        return None
      stubs = [u for u, c in potential.items() for _ in range(c)]
    return edges

  edges = try_creation()
  while edges is None:
    edges = try_creation()
  for u, v in edges:  # G.add_edges_from(edges): set iteration order fixes neighbour order
    adjacency[u].append(v)
    adjacency[v].append(u)
  return adjacency


def fedavg(models: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
  """FedAvg.aggregate(models, weights=None) (gradient_aggregation/fedavg.py lines 13-26).

  models: m models, each a list of float32 parameter arrays (same shapes). Returns
  sum_i float32(1/m) * models[i][j], accumulated from zero in list order, in float32.
  """
  w = np.float32(float(1. / len(models)))
  center = [np.zeros_like(p, dtype=np.float32) for p in models[0]]
  for m in models:
    for c, p in zip(center, m):
      c += w * np.asarray(p, dtype=np.float32)
  return center


def teleportation_round(slot_models: Sequence[Sequence[np.ndarray]], active_nodes: Sequence[int],
                        adjacency: Sequence[Sequence[int]],
                        local_update: Callable[[int, list[np.ndarray]], list[np.ndarray]],
                        arrival_order: Sequence[Sequence[int]] | None = None) -> list[list[np.ndarray]]:
  """One round (client.py start_round/finish_train/handle_incoming_model_in_sample).

  slot_models[s][j]: slot s's model (parameter j) as received by node active_nodes[s].
  adjacency: G_k neighbour lists over slots. local_update(node_id, model) -> trained model,
  called for s = 0..k-1 (the per-node state, e.g. momentum, lives in the callable).
  arrival_order[s]: the order in which slot s's neighbours' models arrived (set in the
  reference by the bandwidth scheduler); default adjacency[s].
  Returns new_slot_models[s] = fedavg([trained[t] for t in arrival] + [trained[s]]), which
  the reference sends to node sample_{r+1}[s].
  """
  trained = [local_update(int(node), [np.asarray(p, np.float32) for p in model])
             for node, model in zip(active_nodes, slot_models)]
  out = []
  for s in range(len(slot_models)):
    order = adjacency[s] if arrival_order is None else arrival_order[s]
    assert sorted(order) == sorted(adjacency[s])
    out.append(fedavg([trained[t] for t in order] + [trained[s]]))
  return out


def make_sgd_local_update(grad_fn: Callable[[int, int, list[np.ndarray]], list[np.ndarray]],
                          lr: float = 0.002, momentum: float = 0.9, weight_decay: float = 0.0,
                          local_steps: int = 5) -> Callable:
  """ModelTrainer.train (model_trainer.py lines 60-131) with torch.optim.SGD, float32.

  grad_fn(node_id, step, params) -> gradients (the loss on the node's step-th batch).
  The momentum buffer is kept per node across activations (lines 89-92:
  load_state_dict of the node's previous optimizer). Per step, as torch SGD
  (dampening 0, nesterov off): d = g + wd*p; buf = d (first ever) else buf*mu + d;
  p = p + (-lr)*buf (d itself when momentum == 0).
  """
  state: dict[int, list[np.ndarray]] = {}
  f32 = np.float32

  def local_update(node: int, params: list[np.ndarray]) -> list[np.ndarray]:
    params = [np.array(p, dtype=np.float32) for p in params]
    for step in range(local_steps):
      grads = grad_fn(node, step, params)
      bufs = state.get(node)
      new_bufs = []
      for j, (p, g) in enumerate(zip(params, grads)):
        d = np.asarray(g, np.float32)
        if weight_decay != 0:
          d = d + f32(weight_decay) * p
        if momentum != 0:
          d = d.copy() if bufs is None else bufs[j] * f32(momentum) + d
          new_bufs.append(d)
        params[j] = p + f32(-lr) * d
      if momentum != 0:
        state[node] = new_bufs
    return params

  local_update.state = state
  return local_update


def model_bytes(shapes: Sequence[Sequence[int]], dtype_bytes: int = 4) -> int:
  """Float32 payload of one model; the reference sends len(pickle.dumps(state_dict)),
  i.e. this plus buffers and a few hundred bytes of pickle framing."""
  return int(sum(int(np.prod(s)) for s in shapes)) * dtype_bytes


def bytes_per_round(shapes: Sequence[Sequence[int]], k: int, degree: int | None = None) -> dict:
  """Bytes sent in one round (client.py lines 57-60 and 93-94).

  Each active node sends its trained model to its deg = log2(k) slot neighbours and its
  averaged model to the next round's holder of its slot: (deg + 1) models.
  """
  deg = slot_degree(k) if degree is None else degree
  mb = model_bytes(shapes)
  return {"per_active_node": (deg + 1) * mb, "total": k * (deg + 1) * mb,
          "messages_per_active_node": deg + 1}


def round_time_lower_bound_us(model_size: int, k: int, local_steps: int = 5,
                              speed_ms: float = 200.0, bw: int = 1_000_000) -> int:
  """Simulated time of a round when no transfer waits on another's bandwidth.

  Train: int(3.0 * local_steps * speed_ms / 1000 * 1e6) us (BaseClient.get_train_time);
  a transfer: int(model_size / bw * 1e6) us (BWScheduler.schedule_request), bw bytes/s
  (default 1 MB/s, in and out per node). A node's outgoing bandwidth goes wholly to one
  transfer at a time, so its deg in-sample sends and the forward take >= (deg+1) transfers.
  """
  train = int(float(AUGMENTATION_FACTOR_SIM * local_steps * (speed_ms / 1000)) * MICROSECONDS)
  transfer = int(model_size / bw * MICROSECONDS)
  return train + (slot_degree(k) + 1) * transfer
