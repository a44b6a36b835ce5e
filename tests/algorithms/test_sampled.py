"""Epidemic Learning and Teleportation against numpy transcriptions of their reference codes,
fed the same inner gradients and the framework's draws of each round (a draw, as a seed is,
is an input; the references' rules turn it into receivers, graphs and slots):

* EL: sacs-epfl/decentralizepy tag ``epidemic-neurips-2023``, commit
  ff70eeecf3fd79988ec88dcfcdd0ad7e7d70a44b (``tests/references/epidemic.py``: ``EL_Local``'s
  receivers, ``Regular`` + ``connect_graph``, ``PlainAverageSharing._averaging``);
* Teleportation: sacs-epfl/decentralized-learning-simulator, commit
  bdbc50dbde61ef4894ebee5466d88023d9230461 (``tests/references/teleportation.py``: the round
  of ``dasklearn/simulation/teleportation/client.py``, FedAvg over the slots' graph).

After every round: every node's model and its bytes."""

import random

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train, tx
from nbsgd_jax.communications import random_mixing as RM
from tests.helpers import start_and_gradients, vmapped_steps
from tests.references import epidemic as el_ref
from tests.references import teleportation as tp_ref

N, H, ROUNDS, LR, SEED = 8, 2, 4, 0.1, 3
SHAPES = {"b": (5,), "w": (4, 3)}
NAMES = sorted(SHAPES)


def _data():
  return start_and_gradients(SHAPES, N, H * ROUNDS)


def _framework(face, mixing, x0, grads):
  """SGD then ``face(mixing)`` in a user's vmapped step; the models after every round."""
  opt = optax.chain(optax.sgd(LR), face(mixing, axis_name="w"))
  steps = vmapped_steps(opt, jax.tree.map(jnp.asarray, x0), grads,
                        lambda t: tx.mixing_inputs(mixing, t))
  return [([[np.asarray(p[k][i]) for k in NAMES] for i in range(N)],
           np.asarray(tx.bytes_sent(st))) for t, p, st in steps if (t + 1) % H == 0]


def _sgd(models, grads, rounds, nodes=range(N)):
  """The round's H local SGD steps of ``nodes`` (the others idle)."""
  models = [list(m) for m in models]
  for t in rounds:
    for i in nodes:
      models[i] = [m - np.float32(LR) * grads[t][k][i] for m, k in zip(models[i], NAMES)]
  return models


@pytest.mark.parametrize("variant,s", [("local", 2), ("local", 5), ("oracle", 3),
                                       ("oracle", 2)])
def test_epidemic_learning_equals_the_reference_every_round(variant, s):
  x0, grads = _data()
  mixing = tx.epidemic_mixing(N, H, variant=variant, graph_degree=s, seed=SEED)
  got = _framework(tx.epidemic, mixing, x0, grads)
  models = [[x0[k][0] for k in NAMES] for _ in range(N)]
  sent = np.zeros(N)
  model_bytes = 4 * sum(int(np.prod(v)) for v in SHAPES.values())
  for r, (have, have_sent) in enumerate(got):
    models = _sgd(models, grads, range(r * H, (r + 1) * H))
    if variant == "local":  # the framework's draw: s indices into the other nodes
      rng = np.random.default_rng([SEED, r])
      draws = [rng.choice(N - 1, s, replace=False) for _ in range(N)]
      senders_to = el_ref.el_local_receivers(N, draws)
    else:  # the reference's own draw: networkx with its seed rule
      edges = nx.random_regular_graph(s, N, seed=el_ref.oracle_seed(SEED, r)).edges()
      senders_to = el_ref.el_oracle_graph(N, edges)
    models = el_ref.el_round(models, senders_to)
    sent += np.asarray([len(x) for x in senders_to]) * model_bytes
    for i in range(N):
      for j, k in enumerate(NAMES):
        np.testing.assert_allclose(have[i][j], models[i][j], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{variant} s={s}: node {i} {k}, round {r}")
    np.testing.assert_allclose(have_sent, sent, rtol=1e-6)
  assert np.ptp(np.stack([m[1] for m in got[-1][0]]), axis=0).max() > 0  # several models


def test_teleportation_equals_the_reference_every_round():
  k = 4
  x0, grads = _data()
  mixing = tx.teleportation_mixing(N, H, sample_size=k, seed=SEED)
  got = _framework(tx.teleportation, mixing, x0, grads)
  slots = tp_ref.slot_topology(random.Random(SEED), k)  # the reference's own G_k draw
  assert [sorted(a) for a in slots] == RM.regular_graph(k, 2, SEED)
  sample = lambda r: [int(i) for i in np.random.default_rng([SEED, r]).permutation(N)[:k]]
  held = [[x0[k_][0] for k_ in NAMES] for _ in range(k)]
  sent = np.zeros(N)
  model_bytes = 4 * sum(int(np.prod(v)) for v in SHAPES.values())
  for r, (have, have_sent) in enumerate(got):
    rounds = range(r * H, (r + 1) * H)
    # the framework's draw: the first k of a permutation, the reference's slot order
    now = tp_ref.activate(np.argsort(np.random.default_rng([SEED, r]).permutation(N)), N, k)
    assert now == sample(r)
    update = lambda node, m: _sgd([m] * N, grads, rounds, [node])[node]
    held = tp_ref.teleportation_round(held, now, slots, update)
    sent[now] += (len(slots[0]) + 1) * model_bytes
    for slot, node in enumerate(sample(r + 1)):  # slot s's average went to its next node
      for j, name in enumerate(NAMES):
        np.testing.assert_allclose(have[node][j], held[slot][j], rtol=1e-5, atol=1e-6,
                                   err_msg=f"slot {slot} (node {node}) {name}, round {r}")
    np.testing.assert_allclose(have_sent, sent, rtol=1e-6)


def _cfg(algorithm, **over):
  c = config_lib.default_config()
  c.update(dict(algorithm=algorithm, num_workers=N, dataset="least_squares", num_steps=6,
                eval_every=6, learning_rate=0.05, momentum=0.0, weight_decay=0.0,
                progress=False, batch_size=16, seed=SEED))
  c.problem.update(dict(examples_per_worker=16, dim=6, full_batch=True))
  return config_lib.override(c, over)


def test_teleportation_evaluates_the_mean_of_the_slots_and_idle_nodes_do_not_step():
  cfg = _cfg("teleportation", **{"teleportation.local_steps": 2,
                                 "teleportation.sample_size": 4})
  s = train.setup(cfg)
  stepper = train.Stepper.of(s)
  before = np.asarray(stepper.state.params["w"])
  (_, inputs, _, _), = stepper.steps(1)
  active = np.asarray(inputs.shared["teleportation/active"])
  after = np.asarray(stepper.state.params["w"])
  assert active.sum() == 4
  np.testing.assert_array_equal(after[~active], before[~active])  # idle: no step
  assert np.abs(after[active] - before[active]).max() > 0
  stepper.steps(1)  # the round's end: the slots mix and move
  models = np.asarray(s.recipe.evaluated(stepper.state.opt_state, stepper.state.params)["w"])
  w = np.asarray(stepper.state.params["w"])
  nxt = RM.teleportation(N, 4, SEED).draw(0).active
  np.testing.assert_allclose(models[0], w[nxt].mean(axis=0), rtol=1e-6)
  assert np.abs(models[0] - w.mean(axis=0)).max() > 1e-4  # not the mean of all nodes


@pytest.mark.parametrize("over,match", [
    ({"algorithm": "epidemic", "epidemic.graph_degree": 8},
     r"config\.epidemic\.graph_degree=8 is not allowed with config\.num_workers=8"),
    ({"algorithm": "epidemic", "epidemic.graph_degree": 3, "epidemic.variant": "oracle",
      "num_workers": 5}, r"n s even"),
    ({"algorithm": "teleportation", "teleportation.sample_size": 6},
     r"config\.teleportation\.sample_size=6 is not allowed .* power of two"),
])
def test_a_graph_that_cannot_be_drawn_is_refused_by_name(over, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(_cfg(over.pop("algorithm"), **over))
