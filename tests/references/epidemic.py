"""numpy transcription of Epidemic Learning (EL-Local and EL-Oracle).

Reference: github.com/sacs-epfl/decentralizepy, tag ``epidemic-neurips-2023`` = commit
ff70eeecf3fd79988ec88dcfcdd0ad7e7d70a44b ("Add Epidemic Learning"). Files:
``src/decentralizepy/node/EpidemicLearning/EL_Local.py`` (``EL_Local.get_neighbors``, ``run``),
``src/decentralizepy/sharing/PlainAverageSharing.py`` (``_averaging``, ``get_data_to_send``),
``src/decentralizepy/sharing/Sharing.py`` (``serialized_model``), ``node/DPSGDNode.py``
(``run``, used by ``EL_Oracle_Client`` via ``DPSGDWithPeerSampler``),
``node/PeerSamplerDynamic.py`` (``get_neighbors``), ``graphs/Regular.py``, ``graphs/Graph.py``
(``connect_graph``), ``training/Training.py`` (``train``), ``communication/TCP.py`` (``encrypt``,
``send``), ``tutorial/EpidemicLearning/config_EL.ini``.
Paper: de Vos, Farhadkhani, Guerraoui, Kermarrec, Pires, Sharma, "Epidemic Learning: Boosting
Decentralized Learning with Randomized Communication", NeurIPS 2023, arXiv:2310.01972.

Details an implementer can get wrong (all as in the reference):
1. Config (config_EL.ini): ``[NODE] graph_degree = 7`` is s (EL-Local: receivers per node;
   EL-Oracle: degree of the regular graph); EL_Local defaults it to 2 if absent.
   ``[TRAIN_PARAMS] rounds = 10`` local SGD steps per round (``full_epochs = False``: a round =
   ``rounds`` minibatches), ``batch_size = 5``, ``shuffle = True``, CrossEntropyLoss;
   ``[OPTIMIZER_PARAMS]`` torch SGD ``lr = 0.05`` (no momentum, no weight decay);
   ``[DATASET] random_seed = 90`` (default 97). Tutorial: n = 16 nodes, 80 iterations, ``-ro 0``.
2. All nodes start from the SAME model (``torch.manual_seed(random_seed)`` before building it).
3. Round t, per node: (a) ``rounds`` local SGD steps (a fresh shuffled DataLoader each round,
   restarted if exhausted); (b) pick receivers; (c) send the post-training model; (d) wait for
   one message per peer for round t; (e) average; (f) optimizer re-created iff reset_optimizer.
4. EL-Local receivers: ``set(rng.sample(my_neighbors, s))`` with ``rng = random.Random(
   random_seed + uid)`` (one rng per node, seeded once, consumed once per round);
   ``my_neighbors`` = the static graph file's neighbour set (the tutorial's complete graph:
   all n-1 others, which a Python set of small ints iterates in ascending order). Non-receivers
   get a small ``{"CHANNEL","iteration","NotWorking": True}`` message (keeps rounds synchronous).
   ``random.sample`` on a set fails on Python >= 3.11; on <= 3.10 it samples ``tuple(set)``.
5. EL-Oracle graph of round t: ``nx.random_regular_graph(s, n, seed=random_seed*100000 + t)``
   (a fresh graph per round, same for all nodes, built by the peer-sampler process); if that
   graph is NOT connected, ``connect_graph`` adds ring edges i<->(i+-1 mod n) to EVERY node, so
   degrees then differ (no longer s-regular). Each node sends to all its neighbours.
6. Aggregation (PlainAverageSharing._averaging, not Metropolis-Hastings): with k = number of
   models received this round, ``w = 1/(k+1)`` (Python double, applied by torch to float32
   tensors as float32); ``total = x_j1*w; total += x_j2*w; ...; total += x_own*w`` in float32,
   senders in the node's neighbour-set order (ascending uid here), own model LAST. No division
   by a sum. EL-Local with k = 0: no averaging at all (model unchanged).
7. What is sent: every ``state_dict`` entry (parameters AND buffers) flattened and concatenated
   in state_dict order into one float32 numpy vector (``torch.cat``), pickled with the dict
   keys ``params``, ``iteration``, ``CHANNEL`` (no degree). Bytes counted per send =
   ``len(pickle.dumps(msg))``; ``total_data`` counts the pickled params alone.
"""
from __future__ import annotations

import math
import pickle

import numpy as np

F32_BYTES = 4  # params travel as a float32 numpy vector


def python_sample_indices(pop_size: int, k: int, randbelow_draws) -> list[int]:
  """CPython ``random.Random.sample(population, k)`` index rule (3.8-3.12, no ``counts``).

  ``randbelow_draws``: iterable of the successive ``rng._randbelow(m)`` outcomes. Pool branch
  (pop_size <= setsize): draw i is in [0, pop_size - i), a partial Fisher-Yates with
  swap-from-end. Set branch: draws in [0, pop_size), repeats rejected (consume another draw).
  Returns k indices into the population, in selection order.
  """
  draws = iter(randbelow_draws)
  setsize = 21
  if k > 5:
    setsize += 4 ** math.ceil(math.log(k * 3, 4))
  if not 0 <= k <= pop_size:
    raise ValueError("sample larger than population")
  out = []
  if pop_size <= setsize:
    pool = list(range(pop_size))
    for i in range(k):
      j = int(next(draws))
      assert 0 <= j < pop_size - i
      out.append(pool[j])
      pool[j] = pool[pop_size - i - 1]
  else:
    selected = set()
    for _ in range(k):
      j = int(next(draws))
      while j in selected:
        j = int(next(draws))
      selected.add(j)
      out.append(j)
  return out


def el_local_receivers(n: int, index_draws) -> list[list[int]]:
  """EL-Local targets: ``EL_Local.get_neighbors`` on the complete graph.

  ``index_draws[i]``: s DISTINCT indices in [0, n-1) into node i's population, the other n-1
  nodes in ascending order (what ``python_sample_indices`` returns). Returns
  ``senders_to[i]`` = sorted receivers of node i (the reference keeps them in a set).
  """
  out = []
  for i in range(n):
    others = [j for j in range(n) if j != i]
    idx = [int(v) for v in index_draws[i]]
    assert len(set(idx)) == len(idx) and all(0 <= v < n - 1 for v in idx)
    out.append(sorted(others[v] for v in idx))
  return out


def oracle_seed(random_seed: int, t: int) -> int:
  """Seed of round t's graph: ``PeerSamplerDynamic.get_neighbors``, ``random_seed*100000+t``."""
  return random_seed * 100000 + t


def _connected(adj: list[set[int]]) -> bool:
  seen, stack = {0}, [0]
  while stack:
    for j in adj[stack.pop()]:
      if j not in seen:
        seen.add(j)
        stack.append(j)
  return len(seen) == len(adj)


def el_oracle_graph(n: int, edges) -> list[list[int]]:
  """EL-Oracle topology of one round: ``graphs/Regular.__init__`` + ``Graph.connect_graph``.

  ``edges``: the undirected edges (u, v) of ``nx.random_regular_graph(s, n, seed)`` (the draw,
  an input here). If the graph is not connected, a ring (i, i+1 mod n) is added to all nodes.
  Returns sorted neighbour lists, which are also ``senders_to`` (each node sends to all).
  """
  adj = [set() for _ in range(n)]
  for u, v in edges:
    adj[int(u)].add(int(v))
    adj[int(v)].add(int(u))
  if not _connected(adj):
    for i in range(n):
      adj[i].add((i + 1) % n)
      adj[i].add((i - 1) % n)
  return [sorted(a) for a in adj]


def el_round(models, senders_to, skip_if_none: bool = True):
  """One EL aggregation: ``PlainAverageSharing._averaging`` as driven by ``EL_Local.run`` /
  ``DPSGDNode.run``.

  models[i][p]: node i's parameter p AFTER its local steps (float32 arrays, same shapes across
  nodes). senders_to[i]: who node i sends its model to. Node i receives from
  R_i = sorted{j : i in senders_to[j]}; w = float32(1/(|R_i|+1)); new = sum_j x_j*w (ascending
  j) then += x_i*w, each product and sum in float32. |R_i| = 0 keeps x_i (EL-Local guard).
  Returns new_models with the same nesting.
  """
  n = len(models)
  received = [[] for _ in range(n)]
  for j in range(n):
    for i in senders_to[j]:
      assert i != j
      received[i].append(j)
  new = []
  for i in range(n):
    r = sorted(received[i])
    if not r and skip_if_none:
      new.append([np.array(x, dtype=np.float32) for x in models[i]])
      continue
    w = np.float32(1.0 / (len(r) + 1))
    out = []
    for p in range(len(models[i])):
      total = None
      for j in r + [i]:
        term = np.asarray(models[j][p], dtype=np.float32) * w
        total = term if total is None else total + term
      out.append(total.astype(np.float32))
    new.append(out)
  return new


def bytes_per_node(shapes, s: int) -> int:
  """Model payload bytes one node sends per round: s messages of the full state vector in
  float32 (EL-Local: exactly s; EL-Oracle: its degree, s unless the ring was added).
  shapes: state_dict shapes (parameters and buffers). = s * 4 * P.
  """
  p = sum(int(np.prod(sh, dtype=np.int64)) for sh in shapes)
  return s * F32_BYTES * p


def tcp_bytes_el_local(p: int, n: int, s: int, iteration: int) -> int:
  """Exact ``TCP.send`` byte count of one EL-Local node in one round (``total_bytes`` delta):
  s pickled model messages + (n-1-s) pickled NotWorking messages (pickle default protocol,
  numpy's ndarray pickling; the sizes depend slightly on the Python/numpy versions).
  """
  msg = {"params": np.zeros(p, np.float32), "iteration": iteration, "CHANNEL": "DPSGD"}
  nw = {"CHANNEL": "DPSGD", "iteration": iteration, "NotWorking": True}
  return s * len(pickle.dumps(msg)) + (n - 1 - s) * len(pickle.dumps(nw))


def tcp_bytes_el_oracle(p: int, degree: int, uid: int, iteration: int) -> int:
  """Exact ``TCP.send`` byte count of one EL-Oracle client in one round: one neighbour request
  to the peer sampler (``DPSGDWithPeerSampler.get_neighbors``) + ``degree`` model messages
  (``DPSGDNode.run``; PlainAverageSharing ignores the ``degree`` argument, nothing extra sent).
  """
  req = {"REQUEST_NEIGHBORS": uid, "iteration": iteration, "CHANNEL": "SERVER_REQUEST"}
  msg = {"params": np.zeros(p, np.float32), "iteration": iteration, "CHANNEL": "DPSGD"}
  return len(pickle.dumps(req)) + degree * len(pickle.dumps(msg))
