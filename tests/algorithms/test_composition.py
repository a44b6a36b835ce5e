"""The composition matrix: every recipe x non-blocking x compression x failures x consensus
control trains, with the device's bytes equal to the bytes the clock charges, or is refused
with its mathematical reason; a subset runs on the mesh and equals simulate; a new algorithm
defined in this file alone trains through ``train()``."""

import itertools

import chex
import jax
import numpy as np
import optax
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import recipes, train
from nbsgd_jax import transforms as T
from nbsgd_jax.communications import AllReduce, Communication, Pattern

from tests.helpers import ROOT, cell_cfg, run_cell, slow_except

# the registry's lists: every built-in algorithm, those that gossip every step, and of those
# the ones that exchange plain models (a codec needs CHOCO-SGD's public copies)
ALGORITHMS = config_lib.ALGORITHMS
GOSSIP = tuple(recipes.gossip_recipes())
UNCOMPRESSED_GOSSIP = tuple(n for n in GOSSIP if recipes.REGISTRY[n].no_compression
                            == recipes.GOSSIP_REASON)
# the asynchronous family (the event clock): no deadline, no simulated failures, no codec
ASYNC = tuple(n for n in ALGORITHMS if recipes.is_asynchronous(n))
PUSH_SUM = tuple(n for n in ALGORITHMS if recipes.REGISTRY[n].check is recipes.check_sgp)


CELLS = [cell for cell in itertools.product(ALGORITHMS, (False, True), (False, True),
                                            (False, True), (False, True))
         if (not cell[4] or cell[0] in GOSSIP)
         and (cell[2] or cell[0] != "choco_sgd")]  # CHOCO without a codec is D-PSGD


def refusal(algorithm, compression, nonblocking=False, failures=False):
  """The reason a cell is refused, or None."""
  if compression and algorithm in UNCOMPRESSED_GOSSIP + PUSH_SUM:
    return "gossip exchanges models, not gradients"
  if algorithm in PUSH_SUM and failures:
    return "push-sum over failed workers is not built"
  if algorithm in ASYNC and nonblocking:
    return "an asynchronous worker waits for nobody"
  if algorithm in ASYNC and compression:
    return recipes.REGISTRY[algorithm].no_compression
  if algorithm == "sparta" and compression:
    return "SPARTA sends a random subset of the coordinates uncompressed"
  if algorithm == "demo" and compression:
    return "DeMo's message is its own codec"
  if algorithm == "sparseloco" and compression:
    return "SparseLoCo's message is its own codec"
  if algorithm == "noloco" and compression:
    return "NoLoCo exchanges models within random groups uncompressed"
  if algorithm in ("epidemic", "teleportation") and compression:
    return "it exchanges whole models"
  return None


def covering(cells):
  """The cells by tier: the fast tier's are the refused ones (no training) and, for each
  algorithm, the cell that trains with the most of its allowed features on at once (so each
  feature meets each algorithm in the fast tier); the long tier's are the rest (each feature
  alone, two or three at once). The slow tier's composition tests are the mesh cells and the
  other codecs."""
  runs = [c for c in cells if not refusal(c[0], c[2], c[1], c[3])]
  fullest = {a: max((c for c in runs if c[0] == a), key=lambda c: sum(c[1:]))
             for a in {c[0] for c in runs}}

  def tier(c):
    if c in fullest.values() or refusal(c[0], c[2], c[1], c[3]):
      return c
    return pytest.param(*c, marks=pytest.mark.long)

  return [tier(c) for c in cells]


@pytest.mark.parametrize("algorithm,nonblocking,compression,failures,control",
                         covering(CELLS))
def test_composition_cell(algorithm, nonblocking, compression, failures, control):
  cfg = cell_cfg(algorithm, nonblocking, compression, failures, control)
  reason = refusal(algorithm, compression, nonblocking, failures)
  if reason:
    with pytest.raises(config_lib.ConfigError) as e:
      train.setup(cfg)
    assert any(reason in line for line in e.value.errors), e.value.errors
    return
  state, host = run_cell(cfg)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
  rec = host.record()
  assert rec["sim_time"] > 0 and rec["bytes_sent"] > 0, rec
  if control:
    assert rec["extra_gossip_steps"] > 0  # the unreachable target binds


@pytest.mark.parametrize("algorithm,codec", slow_except(
    [*[(a, c) for a in ("allreduce", "local_sgd", "diloco") for c in ("qsgd", "sign", "powersgd")],
     ("streaming_diloco", "qsgd"), ("choco_sgd", "qsgd"), ("choco_sgd", "sign")],
    fast=(), slow=(("local_sgd", "sign"), ("diloco", "powersgd"), ("choco_sgd", "qsgd"))))
def test_every_codec_composes_with_nonblocking_and_failures(algorithm, codec):
  """The other codecs in the places top_k goes (and in CHOCO), under Non-blocking SGD and
  failures: device bytes == clock bytes at every step (run_cell)."""
  overlap = ({"diloco.local_steps": 4, "streaming_diloco.delay": 1}
             if algorithm == "streaming_diloco" else {})  # launch, land, launch, land
  cfg = cell_cfg(algorithm, True, True, True, False, **{"compression.name": codec,
                                                        "compression.rank": 1,
                                                        "compression.bucket_size": 64},
                 **overlap)
  state, host = run_cell(cfg)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
  assert host.record()["bytes_sent"] > 0


@pytest.mark.slow  # the overlap's reference tests are fast
@pytest.mark.parametrize("overlap", ["delayed", "eager"])
def test_diloco_overlap_composes_with_nonblocking_compression_and_failures(overlap):
  """DiLoCo's overlapped outer steps with every feature on: the deferred all-reduce's bytes on
  the device equal the clock's at every step (run_cell), over 3 outer steps."""
  cfg = cell_cfg("diloco", True, True, True, False, **{"diloco.overlap": overlap,
                                                       "num_steps": 6})
  state, host = run_cell(cfg, steps=6)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
  assert host.record()["bytes_sent"] > 0


def test_refused_cells_are_only_compressed_gossip():
  """No combination is refused as "not combined yet": only compressed gossip, whose reason
  is mathematical (it needs CHOCO-SGD's public copies)."""
  for algorithm, nb, comp, fail, ctl in CELLS:
    cfg = cell_cfg(algorithm, nb, comp, fail, ctl)
    errs = recipes.combination_errors(cfg)  # the registration's check and clock included
    assert bool(errs) == bool(refusal(algorithm, comp, nb, fail)), (algorithm, nb, comp, fail,
                                                                     ctl, errs)
    assert not any("not combined yet" in e for e in errs)


MESH_CELLS = [("allreduce", True, True, False, False), ("dpsgd", True, False, True, True),
              ("local_sgd", True, True, False, False), ("diloco", False, False, True, False),
              ("matcha", False, False, True, True), ("ad_psgd", False, False, False, False)]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,nonblocking,compression,failures,control", MESH_CELLS)
def test_mesh_equals_simulate(algorithm, nonblocking, compression, failures, control):
  out = {}
  for backend in ("simulate", "mesh"):
    cfg = cell_cfg(algorithm, nonblocking, compression, failures, control, backend=backend)
    out[backend], _ = run_cell(cfg)
  chex.assert_trees_all_close(jax.device_get(out["simulate"].params),
                              jax.device_get(out["mesh"].params), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ a new algorithm, from outside


class Broadcast(Communication):
  """A toy communication: worker 0's tree to everyone (one all-gather; worker 0 sends
  ``(n - 1) S`` bytes, the others nothing; everyone waits for worker 0)."""

  def pattern(self, step, active):
    adj = np.eye(self.n, dtype=bool)
    adj[:, 0] = True
    return Pattern(adj, np.where(np.arange(self.n) == 0, self.n - 1.0, 0.0))

  def send(self, tree, ctx):
    from nbsgd_jax.communications import collectives
    from nbsgd_jax.core.axis import tree_bytes
    out = jax.tree.map(lambda x: collectives.all_gather(x, self.axis_name)[0], tree)
    me = self.index()
    sent = (me == 0).astype(np.float32) * (self.n - 1) * tree_bytes(tree)
    return out, self.report(self.charge(sent, ctx))


def leader_sgd(b: recipes.Builder) -> recipes.Recipe:
  """Everyone takes worker 0's gradient step (a worse All-Reduce SGD, for the test)."""
  comm = Broadcast(b.n, b.axis_name, "broadcast")

  def update(grads, state, params, ctx):
    del state, params
    out, report = comm.send(grads, ctx)
    return out, (), report

  follow = T.WorkerTransform(T.no_state, update, (comm,))
  return recipes.Recipe(T.chain(follow, b.optimizer("global")), decentralized=False,
                        primary=comm)


@pytest.fixture
def leader_registered():
  recipes.register("leader_sgd")(leader_sgd)
  yield
  del recipes.REGISTRY["leader_sgd"]


def test_new_algorithm_from_outside_trains(leader_registered):
  cfg = cell_cfg("leader_sgd", False, False, False, False, num_steps=6, eval_every=3)
  out = train.train(cfg)
  assert np.isfinite(out["train_loss"]) and out["train_loss"] < out["history"][0]["train_loss"]
  # worker 0 sends (n - 1) S per step, the others nothing: the mean over workers is (n - 1)/n S
  s_bytes = 4 * out["model_params"]
  assert out["bytes_sent"] == pytest.approx(6 * (4 - 1) / 4 * s_bytes)
  assert out["consensus_distance"] == pytest.approx(0.0, abs=1e-6)
  # and the clock: each step the workers wait for worker 0, which sends 3 messages of S
  cl = cfg.cluster
  _, host = run_cell(cfg, steps=1)
  assert host.part("clock").sim_time > cl.latency * 3 + 3 * s_bytes / cl.bandwidth


def test_error_feedback_api_as_written():
  """The issue's API: ``error_feedback(partial(top_k, density=0.01))`` composed with optax
  transforms in ``chain``; against a numpy transcription of p = g + e, s = Top_k(p),
  e <- p - s, u = sgd(s + wd x)."""
  import functools
  from nbsgd_jax.codecs.sparse import top_k
  wd, lr = 0.1, 0.5
  tx = T.chain(T.error_feedback(functools.partial(top_k, density=0.25)),
               optax.add_decayed_weights(wd), optax.sgd(lr))
  rng = np.random.default_rng(0)
  x = {"w": rng.normal(size=8).astype(np.float32)}
  state = tx.init(x)
  e = np.zeros(8)
  for _ in range(3):
    g = rng.normal(size=8).astype(np.float32)
    u, state, report = tx.update({"w": g}, state, x, None)
    p = g + e
    keep = np.argsort(-np.abs(p))[:2]
    sent = np.zeros(8)
    sent[keep] = p[keep]
    e = p - sent
    np.testing.assert_allclose(np.asarray(u["w"]), -lr * (sent + wd * x["w"]), rtol=1e-5,
                               atol=1e-6)
    x = {"w": np.asarray(optax.apply_updates(x, u)["w"])}
  assert report == {}  # no axis: nothing sent


def test_unknown_report_key_twice_is_an_error():
  def t(name):
    return T.WorkerTransform(T.no_state, lambda u, s, p, c: (u, s, {name: 1.0}))
  with pytest.raises(ValueError, match="written by two transforms"):
    T.chain(t("x"), t("x")).update({"w": np.zeros(2)}, ((), ()), None, None)
  _, _, rep = T.chain(t("bytes_sent"), t("bytes_sent")).update({"w": np.zeros(2)}, ((), ()),
                                                               None, None)
  assert rep == {"bytes_sent": 2.0}


def test_allreduce_weights_written_once():
  """``Communication.weight``: count weights under non-blocking, live-worker weights for
  models, against closed forms."""
  comm = AllReduce(4, weighted=True)
  ctx = T.StepContext(0, np.int32(3), np.int32(6), np.zeros(1, bool),
                      alive=np.array([True, False, True, True]))
  assert float(comm.weight(ctx, "count")) == pytest.approx(0.5)
  assert AllReduce(4).weight(ctx, "count") is None


def test_design_page_states_the_matrix_as_the_test_runs_it():
  """docs/design.md's figures of the matrix are this file's."""
  import os
  import re
  with open(os.path.join(ROOT, "docs", "design.md")) as f:
    text = " ".join(f.read().split())
  refused = sum(1 for cell in CELLS if refusal(cell[0], cell[2], cell[1], cell[3]))
  m = re.search(r"(\d+) cells, of which (\d+) are refused", text)
  assert m and [int(g) for g in m.groups()] == [len(CELLS), refused], m
