"""A hierarchical network (``nbsgd_jax/host/network.py``) against closed forms on two levels:
16 workers, 4 a node (1 us, 100 GB/s), 2 nodes a region (10 us, 10 GB/s), regions over the
cluster's own link (50 ms, 100 MB/s); through the lockstep clock of train()."""

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train
from nbsgd_jax.communications.adjacency import Group, Neighbours
from nbsgd_jax.host.network import Network, parse_levels

LEVELS = ("4:1e-6:1e11", "2:1e-5:1e10")
LAT = [1e-6, 1e-5, 0.05]
BW = [1e11, 1e10, 1e8]
NET = Network(16, parse_levels(LEVELS), LAT[2], BW[2])


def test_a_message_crosses_the_innermost_level_that_holds_both():
  np.testing.assert_array_equal(NET.level(0, [1, 3, 4, 7, 8, 15]), [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(NET.level(9, [8, 11, 12, 15]), [0, 0, 1, 1])


@pytest.mark.parametrize("members,level", [(range(16), 2), (range(8), 1), (range(4, 8), 0),
                                           ([4, 5], 0), ([3, 4], 1), ([7, 8], 2)])
def test_a_collective_runs_at_the_slowest_link_its_group_spans(members, level):
  """A flat ring: comm_i = latency_L messages_i + bytes_i / bandwidth_L."""
  mask = np.zeros(16, bool)
  mask[list(members)] = True
  got = NET.round_time(6.0, 3e6, Group(mask), True)
  np.testing.assert_allclose(got, LAT[level] * 6 + 3e6 / BW[level])


def test_gossip_charges_each_neighbour_at_its_link():
  """A ring: worker 0's neighbours are 15 (across regions) and 1 (in its node); worker 3's
  are 2 (its node) and 4 (the next node of its region); worker 7's 6 and 8 (the next region)."""
  ring = Neighbours.of_lists([[(i - 1) % 16, (i + 1) % 16] for i in range(16)])
  got = NET.round_time(2.0, 2e6, ring, False)
  per = lambda a, b: 2 * (LAT[a] + LAT[b]) / 2 + 2e6 * (1 / BW[a] + 1 / BW[b]) / 2  # noqa
  np.testing.assert_allclose(got[[0, 1, 3, 7]], [per(2, 0), per(0, 0), per(0, 1), per(0, 2)])


def _cfg(algorithm, **over):
  c = config_lib.default_config()
  c.update(dict(num_workers=16, dataset="least_squares", num_steps=3, eval_every=3,
                progress=False, batch_size=16, algorithm=algorithm, topology="ring"))
  c.problem.update(dict(examples_per_worker=16, dim=250, full_batch=True))
  return config_lib.override(c, {"cluster.levels": LEVELS, "cluster.latency": LAT[2],
                                 "cluster.bandwidth": BW[2], **over})


def test_the_clock_charges_an_all_reduce_at_the_wide_area_link():
  """16 x 1 ms compute, then a ring all-reduce of 1,000 bytes over the regions' link."""
  out = train.train(_cfg("allreduce"), None)
  comm = 2 * 15 * LAT[2] + 2 * 15 / 16 * 1000 / BW[2]
  assert out["sim_time"] == pytest.approx(3 * (16e-3 + comm), rel=1e-9)


def test_a_bad_level_is_refused_by_name():
  with pytest.raises(config_lib.ConfigError, match=r"config\.cluster\.levels=.* is not "
                                                   r"allowed: entry '1:0:1' needs size >= 2"):
    config_lib.validate(_cfg("allreduce", **{"cluster.levels": ("1:0:1",)}))


def test_the_clock_charges_gossip_by_the_slowest_neighbour_it_waits_for():
  """D-PSGD on the ring: a worker waits for its neighbours' messages; the ones at a region's
  edge send one of their two messages over the wide-area link, so every step lasts their
  time (``c_i = max_j (r_j + comm_j)`` for the edge's neighbours)."""
  out = train.train(_cfg("dpsgd"), None)
  edge = 2 * (LAT[2] + LAT[0]) / 2 + 2 * 1000 * (1 / BW[2] + 1 / BW[0]) / 2
  assert out["sim_time"] == pytest.approx(3 * (16e-3 + edge), rel=1e-9)


def test_the_hierarchical_all_reduce_pays_the_wide_area_link_once_for_a_quarter():
  """Groups of 4 (the nodes): a reduce-scatter and an all-gather inside the node, 3 messages
  and 3/4 of the message each at the node's link, and across the 4 nodes an all-reduce of
  a quarter of it, 6 messages at the regions' link (each worker's rank group spans them)."""
  out = train.train(_cfg("allreduce", **{"cluster.allreduce_group_size": 4}), None)
  s = 1000.0
  inside = 3 * LAT[0] + 0.75 * s / BW[0]
  across = 6 * LAT[2] + 2 * 3 / 4 * s / 4 / BW[2]
  assert out["sim_time"] == pytest.approx(3 * (16e-3 + 2 * inside + across), rel=1e-9)
  assert out["bytes_sent"] == pytest.approx(3 * (2 * 0.75 * s + 2 * 3 / 4 * s / 4), rel=1e-9)
  flat = train.train(_cfg("allreduce"), None)
  assert out["sim_time"] < flat["sim_time"] / 4  # the same bytes over faster links:
  assert out["bytes_sent"] == pytest.approx(flat["bytes_sent"], rel=1e-9)  # 2 (n - 1) / n S


def test_the_tree_all_reduce_pays_log_n_latencies_and_two_messages_of_bytes():
  """The double binary tree (``cluster.allreduce_algorithm='tree'``): flat over 16 workers,
  2 log2 16 = 8 messages and the busiest worker's 2 S at the regions' link; hierarchical
  (groups of 4), the across phase a tree of 4 nodes: 2 log2 4 = 4 messages and 2 S / 4.
  With these latency-bound links the tree beats the ring (30 messages). ``bytes_sent`` is
  the mean per worker: the trees' 2 x 15 edges carry S / 2 each way, 2 (n - 1) / n S over
  16 workers (the ring's), 2 (m - 1) / m S / 4 across 4 groups."""
  s, tree = 1000.0, {"cluster.allreduce_algorithm": "tree"}
  flat = train.train(_cfg("allreduce", **tree), None)
  assert flat["sim_time"] == pytest.approx(3 * (16e-3 + 8 * LAT[2] + 2 * s / BW[2]), rel=1e-9)
  assert flat["bytes_sent"] == pytest.approx(3 * 2 * 15 / 16 * s, rel=1e-9)
  hier = train.train(_cfg("allreduce", **tree, **{"cluster.allreduce_group_size": 4}), None)
  inside = 3 * LAT[0] + 0.75 * s / BW[0]
  across = 4 * LAT[2] + 2 * s / 4 / BW[2]
  assert hier["sim_time"] == pytest.approx(3 * (16e-3 + 2 * inside + across), rel=1e-9)
  assert hier["bytes_sent"] == pytest.approx(3 * (2 * 0.75 * s + 2 * 3 / 4 * s / 4), rel=1e-9)
  ring = train.train(_cfg("allreduce"), None)
  assert flat["sim_time"] < ring["sim_time"] / 3
  assert flat["bytes_sent"] == pytest.approx(ring["bytes_sent"], rel=1e-9)
  with pytest.raises(config_lib.ConfigError, match=r"allreduce_algorithm='tree' is not "
                                                   r"allowed with config\.algorithm="):
    config_lib.validate(_cfg("allreduce_ring", **tree))


def _flat(n, **over):
  """n workers on one link (1 ms a message, 1,000 bytes/s) and a 16-byte model (4 float32):
  a byte is a millisecond; one step of 16 ms compute."""
  c = config_lib.default_config()
  c.update(dict(num_workers=n, dataset="least_squares", num_steps=1, eval_every=1,
                progress=False, batch_size=16, algorithm="allreduce"))
  c.problem.update(dict(examples_per_worker=16, dim=4, full_batch=True))
  return train.train(config_lib.override(c, {"cluster.latency": 1e-3, "cluster.bandwidth": 1e3,
                                             "cluster.allreduce_algorithm": "tree", **over}),
                     None)


# NCCL's trees (src/graph/trees.cc, ncclGetDtree), S = 16 bytes, each tree S / 2 = 8 bytes
# up to the parent and down to each child:
# * n = 2: tree 0 is 0 -> 1, tree 1 (mirrored) 1 -> 0: each rank the root of one (8 down) and
#   the leaf of the other (8 up): 16 bytes each, 1 level: 2 messages, 2 + 16 = 18 ms;
# * n = 3: tree 0 is the chain 0 -> 2 -> 1, tree 1 (shifted by one) 1 -> 0 -> 2: ranks 0 and
#   2 are the middle of one (8 up, 8 down) and an end of the other (8): 24 bytes, rank 1 16;
#   2 levels: 4 messages, 4 + 24 = 28 ms; the mean 64 / 3 = 2 (3 - 1) / 3 16;
# * n = 8: tree 0 is 0 -> 4 -> {2, 6}, 2 -> {1, 3}, 6 -> {5, 7}; rank 2 is interior with two
#   children there (8 + 16) and a leaf of the mirrored tree (8): 32 bytes; 3 levels: 6
#   messages, 6 + 32 = 38 ms; the mean 2 (8 - 1) / 8 16 = 28 (7 edges a tree, 8 + 8 each).
@pytest.mark.parametrize("n,comm,mean", [(2, 2 + 16, 16.0), (3, 4 + 24, 64 / 3),
                                         (8, 6 + 32, 28.0)])
def test_the_tree_charges_its_busiest_rank_and_reports_the_mean(n, comm, mean):
  out = _flat(n)
  assert out["sim_time"] == pytest.approx(16e-3 + comm * 1e-3, rel=1e-6)
  assert out["bytes_sent"] == pytest.approx(mean, rel=1e-6)


def test_the_tree_across_two_groups_sends_a_group_share_each_way():
  """2 groups of 4 (the hierarchical all-reduce, its across phase the tree over 2 ranks): in
  a group 3 messages and 3 / 4 16 = 12 bytes each way (15 ms twice); across, each rank sends
  its share, 16 / 4 = 4 bytes, to the other (root of one tree, leaf of the other): 2
  messages, 6 ms, not 2 x 4 = 8 bytes (10 ms). The step: 16 + 30 + 6 = 52 ms; bytes: 12 +
  12 + 4 = 28 per worker, the flat ring's 2 (8 - 1) / 8 16."""
  out = _flat(8, **{"cluster.allreduce_group_size": 4})
  assert out["sim_time"] == pytest.approx((16 + 2 * (3 + 12) + (2 + 4)) * 1e-3, rel=1e-6)
  assert out["bytes_sent"] == pytest.approx(28.0, rel=1e-6)


def _nccl_btree(n, rank):
  """(parent, children) of ``rank`` in NCCL's binary tree (``ncclGetBtree``, trees.cc)."""
  bit = 1
  while bit < n and not bit & rank:
    bit <<= 1
  if rank == 0:
    return -1, [bit >> 1] if n > 1 else []
  up = (rank ^ bit) | (bit << 1)
  up = rank ^ bit if up >= n else up
  low = bit >> 1
  down0, down1 = (-1, -1) if low == 0 else (rank - low, rank + low)
  while down1 >= n:
    down1 = -1 if low == 0 else rank + low
    low >>= 1
  return up, [d for d in (down0, down1) if d != -1]


def _nccl_dtree(n, rank):
  """Both trees of ``rank`` (``ncclGetDtree``: the second mirrored for even n, shifted by one
  for odd n)."""
  if n % 2:
    u, ds = _nccl_btree(n, (rank - 1) % n)
    second = (-1 if u == -1 else (u + 1) % n, [(d + 1) % n for d in ds])
  else:
    u, ds = _nccl_btree(n, n - 1 - rank)
    second = (-1 if u == -1 else n - 1 - u, [n - 1 - d for d in ds])
  return _nccl_btree(n, rank), second


def test_nccl_s_double_binary_tree_gives_the_busiest_and_mean_bytes_charged():
  """For 2..64 ranks, each rank's bytes in NCCL's own trees (S / 2 per tree to its parent and
  to each child): the busiest is what the clock charges, the mean what ``bytes_sent``
  reports, and the deeper tree's levels up and down are the messages."""
  from nbsgd_jax.communications import allreduce
  for n in range(2, 65):
    trees = [_nccl_dtree(n, r) for r in range(n)]
    sent = [sum(0.5 * ((up != -1) + len(down)) for up, down in t) for t in trees]
    assert allreduce.busiest(n, tree=True) == max(sent), n
    assert allreduce.fraction(n, tree=True) == pytest.approx(sum(sent) / n), n

    def depth(r, which):
      up = trees[r][which][0]
      return 0 if up == -1 else 1 + depth(up, which)
    levels = max(depth(r, w) for r in range(n) for w in (0, 1))
    assert allreduce.messages(n, tree=True) == 2 * levels, n


@pytest.mark.slow  # composition (the closed forms are fast)
def test_the_hierarchical_all_reduce_composes_device_bytes_equal_clock_bytes():
  """Under Non-blocking SGD and failures (run_cell: the device's bytes = the clock's three
  rounds' at every step, a failed worker charged nothing), and DiLoCo's deferred outer
  all-reduce; a group size that does not divide the workers is refused by name."""
  from tests.helpers import cell_cfg, run_cell
  for algorithm, over in (("allreduce", {}), ("diloco", {"diloco.overlap": "delayed"})):
    cfg = cell_cfg(algorithm, True, False, True, False,
                   **{"cluster.allreduce_group_size": 2, **over})
    run_cell(cfg)
  with pytest.raises(config_lib.ConfigError, match=r"config\.cluster\.allreduce_group_size=3 is "
                                                   r"not allowed with config\.num_workers=16"):
    config_lib.validate(_cfg("allreduce", **{"cluster.allreduce_group_size": 3}))


@pytest.mark.parametrize("algorithm", ["ad_psgd", "async_diloco"])
def test_the_event_clock_charges_a_message_at_the_link_between_its_ends(algorithm):
  """AD-PSGD's exchange with a peer, asynchronous DiLoCo's push to the server (which sits
  with worker 0): one model's bytes at the link the pair crosses."""
  from tests.helpers import make_stepper
  stepper = make_stepper(_cfg(algorithm, **{"diloco.local_steps": 2}))
  clock = stepper.hosts[0].part("clock")
  model = clock.message_bytes
  cost = lambda lv: LAT[lv] + model / BW[lv]  # noqa: E731
  assert clock.pair_s(0, 1) == pytest.approx(cost(0)) and clock.pair_s(5, 1) == pytest.approx(
      cost(1))
  assert clock.pair_s(9, 16) == pytest.approx(cost(2))  # 16 = n: the server, by worker 0
  assert clock.pair_s(2, 16) == pytest.approx(cost(0))


def test_a_placement_moves_workers_between_nodes_and_regions():
  """Workers 0 and 8 swapped: worker 0 sits in the second region, so its links to 1 cross
  the regions and to 9 stay in a node; an all-reduce of workers 0..7 now spans the regions."""
  place = list(range(16))
  place[0], place[8] = 8, 0
  net = Network(16, parse_levels(LEVELS), LAT[2], BW[2], place)
  np.testing.assert_array_equal(net.level(0, [1, 9, 8]), [2, 0, 2])
  members = np.zeros(16, bool)
  members[:8] = True
  np.testing.assert_allclose(net.round_time(1.0, 0.0, Group(members), True), LAT[2])
  with pytest.raises(ValueError, match=r"cluster\.placement=.* a permutation"):
    Network(16, parse_levels(LEVELS), LAT[2], BW[2], [0] * 16)
  with pytest.raises(config_lib.ConfigError, match=r"config\.cluster\.placement=\(1, 0\)"):
    config_lib.validate(_cfg("allreduce", **{"cluster.placement": (1, 0)}))
