"""The asynchronous family as recipes on the event clock (``docs/algorithms.md``,
"Asynchronous training"): each recipe's ``Recipe.clock`` is :class:`~nbsgd_jax.host.events.
EventTimes` (one device step applies one batch of events) and its transform reads the batch's
masks (:mod:`nbsgd_jax.transforms.asynchronous`).

* ``ad_psgd``: AD-PSGD (Lian, Zhang, Zhang, Liu, ICML 2018, Algorithm 1);
* ``swarm_sgd``: SwarmSGD (Nadiradze, Sabour, Davies, Li, Alistarh, NeurIPS 2021): H local
  steps, then an average with a neighbour drawn uniformly;
* ``async_diloco``: asynchronous DiLoCo (Liu, Douillard et al. 2024): a worker pushes its
  pseudo-gradient when its inner steps end and the server steps at once (delayed Nesterov,
  dynamic local updates, the notebook's staleness weights);
* ``sgp``: Stochastic Gradient Push and Overlap-SGP (Assran et al., ICML 2019), push-sum over
  the topology's W_t (the time-varying directed exponential graph: ``one_peer_exponential``),
  on the lockstep clock: with ``sgp.overlap`` its rounds overlap the computation and land
  ``sgp.delay`` steps late.

The event-clock recipes (``ad_psgd``, ``swarm_sgd``, ``async_diloco``) are registered with
``clock="event"``, so the registry holds the event clock's rules for them
(:func:`~nbsgd_jax.recipes.registry.event_clock_errors`: no Non-blocking SGD deadline, no
simulated failures, no wall clock); they refuse compression (SwarmSGD's quantized averaging
and a compressed push are not built).
"""

from __future__ import annotations

from collections import deque

import ml_collections
import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax.communications.pairwise import PairwiseAverage
from nbsgd_jax.communications.server import ParameterServer
from nbsgd_jax.host import async_orders
from nbsgd_jax.host import regional_servers
from nbsgd_jax.host import events as events_lib
from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host import network as network_lib
from nbsgd_jax.transforms import asynchronous as A
from nbsgd_jax.transforms import algorithms
from nbsgd_jax.transforms import hierarchical
from nbsgd_jax.recipes.builder import Builder
from nbsgd_jax.recipes.registry import GOSSIP_REASON, Recipe, Section, register
from nbsgd_jax.recipes.synchronous import DILOCO

PAIRINGS = ("random", "bipartite")
AD_PSGD_ORDERS = ("paper", "released")
NO_COMPRESSION = ("the asynchronous recipes average models: a compressed average needs "
                  "CHOCO-SGD's public copies (SwarmSGD's quantized averaging is not built)")
EVENT_NO_FACE = ("a device step applies a batch of events that the host's event clock draws "
                 "for all workers; a user's loop has no event clock")


def ad_psgd_defaults() -> ml_collections.ConfigDict:
  """``config.ad_psgd.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.pairing = "random"  # random: every worker averages with a neighbour drawn uniformly (Lian
                        # et al. 2018, Alg. 1) | bipartite: the graph's two sides are active /
                        # passive, only active workers initiate (the reference's roles)
  s.seed = 0            # seed of the peer draws (per worker and event)
  s.order = "paper"     # paper: at an event average, then apply the stale gradient (Lian et
                        # al. 2018, Alg. 1) | released: the reference code's gossip loop,
                        # gradient first and back-to-back averages, one per message time
                        # (facebookresearch/stochastic_gradient_push gossip/ad_psgd.py)
  return s


def check_ad_psgd_config(cfg, errs: list) -> None:
  """ad_psgd.pairing, ad_psgd.seed, ad_psgd.order."""
  checks.choice(cfg, errs, "ad_psgd.pairing", PAIRINGS)
  checks.choice(cfg, errs, "ad_psgd.order", AD_PSGD_ORDERS)
  checks.integer(cfg, errs, "ad_psgd.seed", 0)
  if (cfg.get("algorithm") == "ad_psgd" and cfg.ad_psgd.get("order") == "released"
      and failures_lib.drops_workers(cfg)):
    errs.append(f"{failures_lib.failures_named(cfg)} is not allowed with "
                "config.ad_psgd.order='released': its gradients overlap its gossip "
                "iterations, and a crash's lost work is not modelled there (use 'paper')")


def swarm_sgd_defaults() -> ml_collections.ConfigDict:
  """``config.swarm_sgd.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.local_steps = 2  # H: a worker's local SGD steps between two averages it starts
  s.seed = 0         # seed of the peer draws (per worker and event)
  s.averaging = "symmetric"  # symmetric: both take the average (Nadiradze et al. 2021,
                             # Alg. 1) | one_sided: the initiator averages with the partner's
                             # copy published after its last local step, the partner unchanged
                             # (ICLR-PopSGD/PopSGD worker.py)
  return s


def check_swarm_sgd_config(cfg, errs: list) -> None:
  """swarm_sgd.local_steps, swarm_sgd.seed, swarm_sgd.averaging."""
  checks.integer(cfg, errs, "swarm_sgd.local_steps", 1, note="H")
  checks.choice(cfg, errs, "swarm_sgd.averaging", A.AVERAGING)
  checks.integer(cfg, errs, "swarm_sgd.seed", 0)


def sgp_defaults() -> ml_collections.ConfigDict:
  """``config.sgp.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.overlap = False  # Overlap-SGP: a round is sent before the step's gradient and lands
                     # after it (the reference's overlap=True)
  s.delay = 0        # with overlap, the steps s a worker goes on before it waits for its round
                     # in flight (the reference's synch_freq: the first round lands after s
                     # steps, every later one after s + 1)
  return s


def check_sgp_config(cfg, errs: list) -> None:
  """sgp.overlap, sgp.delay."""
  checks.boolean(cfg, errs, "sgp.overlap")
  if checks.integer(cfg, errs, "sgp.delay", 0) and cfg.sgp.delay \
      and cfg.sgp.get("overlap") is False:
    errs.append(f"config.sgp.delay={cfg.sgp.delay} is not allowed with "
                "config.sgp.overlap=False: a worker waits for every round it sends")


def check_sgp(cfg, errs: list) -> None:
  """SGP's rules: no simulated failures (push-sum over failed workers is not built)."""
  if failures_lib.drops_workers(cfg):
    errs.append(f"{failures_lib.failures_named(cfg)} is not allowed with "
                "config.algorithm='sgp': push-sum over failed workers is not built")


def async_diloco_defaults() -> ml_collections.ConfigDict:
  """``config.async_diloco.*`` with their defaults (H, the outer lr and momentum are
  ``config.diloco``'s)."""
  s = ml_collections.ConfigDict()
  s.buffer = 0                  # N: pushes per outer momentum update (delayed Nesterov); 0: n
  s.activation = 0.0            # c: momentum applied between updates (delayed Nesterov)
  s.staleness_weight = "none"   # none | constant: sqrt(n)/n | polynomial: sqrt(n)/n /
                                # sqrt(1 + staleness) (the asyncdiloco notebook)
  s.dynamic_local_updates = False  # DyLU: H_i = max(floor(H t_min / t_i), min(min_local_steps,
                                   # H)): slower workers run fewer inner steps
  s.min_local_steps = 5         # DyLU's floor: 5 is the asyncdiloco notebook's
                                # (sample_train_task); 1: the paper's formula, which has none
  s.reset_inner = True          # a read starts a fresh inner optimizer (the notebook's)
  s.pull = "arrival"            # when a worker reads the server model: arrival (at the end of
                                # its pull's transfer) | instant (when it asks, right after its
                                # push, with the pushes of that time: the notebook's)
  return s


def check_async_diloco_config(cfg, errs: list) -> None:
  """async_diloco.*."""
  a = "async_diloco."
  checks.integer(cfg, errs, a + "buffer", 0)
  checks.number(cfg, errs, a + "activation", 0, hi=1)
  checks.choice(cfg, errs, a + "staleness_weight", A.WEIGHTS)
  checks.boolean(cfg, errs, a + "dynamic_local_updates")
  checks.integer(cfg, errs, a + "min_local_steps", 1)
  checks.boolean(cfg, errs, a + "reset_inner")
  checks.choice(cfg, errs, a + "pull", events_lib.PULLS)


def check_async_diloco(cfg, errs: list) -> None:
  """Asynchronous DiLoCo's rules beyond the event clock's: an outer step that is Nesterov's,
  and a server model (the evaluated one) that can change within the run
  (:func:`first_change`)."""
  if cfg.diloco.get("outer_nesterov") is False:
    errs.append("config.diloco.outer_nesterov=False is not allowed with "
                "config.algorithm='async_diloco': its outer step is delayed Nesterov")
  _check_first_change(cfg, errs)


def first_change(cfg) -> tuple[int, str, str] | None:
  """``(step, key, why)``: the earliest device step after which the evaluated model of an
  event-clock DiLoCo (``async_diloco``: the server's; ``halos``: the global server's) can
  differ from the initial one, the key that sets it most and how it is counted; None for
  another algorithm, a budget in gradients per worker (its device steps are the clock's), or
  values the section checks refuse.

  The step is a lower bound, counted from the clock's rules alone, whatever the speeds and
  message times: a device step applies at most one event of a worker and at most one push (a
  push touches the server), and worker i's events cycle through a pull and ``H`` local steps,
  the last one pushing (:class:`~nbsgd_jax.host.events.ServerEventTimes`,
  :class:`~nbsgd_jax.host.regional_servers.RegionalServerTimes`). So asynchronous DiLoCo's
  first push, which steps the server, comes at step ``H + 1`` at the earliest (``H`` the
  smallest H_i: ``min(min_local_steps, H)`` with dynamic local updates). HALoS's global server
  first steps when the update an LPS sends after its K-th push lands, applied with the first
  push after it: with ``n / L`` workers a region one of them pushed ``ceil(K L / n)`` times,
  ``ceil(K L / n) (H + 1)`` of its events, and the K pushes each took a step of their own, so
  ``max(K, ceil(K L / n) (H + 1)) + 1``. When it comes exactly depends on the event clock's
  times (speeds, stragglers, the model's message bytes), known only while running: a run
  shorter than the bound is refused (its evaluated model cannot change), and one that is not
  gets a warning when it evaluates before the bound (:func:`nbsgd_jax.config.switches.
  odd_warnings`); its records count the server steps (HALoS: ``global_updates``).
  """
  algorithm, ok = cfg.get("algorithm"), checks.is_int
  if cfg.get("budget_unit", "steps") != "steps":
    return None
  if algorithm == "async_diloco":
    h, a = cfg.diloco.get("local_steps"), cfg.async_diloco
    if not (ok(h) and h >= 1):
      return None
    key, low = "diloco.local_steps", h
    floor = a.get("min_local_steps")
    if a.get("dynamic_local_updates") is True and ok(floor) and 1 <= floor < h:
      key, low = "async_diloco.min_local_steps", floor
    return low + 1, key, (f"the server's model: a worker's pull, then {low} local steps, the "
                          "last one pushing")
  h, n = cfg.get("halos"), cfg.get("num_workers")
  if algorithm != "halos" or h is None or not all(
      ok(v) and v >= 1 for v in (h.get("regions"), h.get("local_steps"), h.get("accumulation"),
                                 n)) or n % h.regions:
    return None
  k, per = h.accumulation, n // h.regions
  rounds = -(-k // per)
  return max(k, rounds * (h.local_steps + 1)) + 1, "halos.accumulation", (
      f"the global server's model: an LPS sends after {k} pushes, {rounds} rounds of "
      f"{h.local_steps + 1} events of one of its {per} workers at least, and its update lands "
      "with a later push")


def _check_first_change(cfg, errs: list) -> None:
  """A run that would end before its evaluated model can first change (:func:`first_change`)
  is refused, as SparseLoCo's that would end before its first communication
  (:func:`nbsgd_jax.core.checks.period_within_run`)."""
  first, steps = first_change(cfg), cfg.get("num_steps")
  if first and checks.is_int(steps) and 1 <= steps < first[0]:
    step, key, why = first
    errs.append(f"config.{key}={cfg.get(key)} is not allowed with config.num_steps={steps}: "
                f"the run would end before its evaluated model first changes, at step {step} "
                f"at the earliest ({why}); use num_steps >= {step} or a smaller "
                f"{key.split('.')[-1]}")


def halos_defaults() -> ml_collections.ConfigDict:
  """``config.halos.*`` with their defaults: utnslab/halos ``examples/run_halos.sh`` (commit
  4b5bf73; its learning rates already multiplied by the buffer sizes, as the script does)."""
  s = ml_collections.ConfigDict()
  s.regions = 4              # L: regions, each with its local parameter server (LPS); region
                             # l holds workers [l n / L, (l + 1) n / L); with cluster.levels
                             # it must be their top-level groups, n / (the sizes multiplied)
                             # (refused otherwise, not overridden)
  s.local_steps = 8          # H: a worker's local steps between two pushes to its LPS
  s.accumulation = 32        # K: pushes an LPS takes before it sends its update to the GPS
  s.merge_weight = 0.25      # alpha: the global model's weight when an LPS merges it
  s.lps_lr = 3.2             # the LPS's delayed Nesterov: lr (0.2 x its buffer 16)
  s.lps_momentum = 0.9       # beta
  s.lps_buffer = 16          # N: pushes per momentum update
  s.gps_lr = 0.3             # the GPS's delayed Nesterov: lr (0.15 x its buffer 2)
  s.gps_momentum = 0.5       # beta
  s.gps_buffer = 2           # N: LPS updates per momentum update
  return s


def check_halos_config(cfg, errs: list) -> None:
  """halos.*; with ``algorithm=halos``, regions that divide the workers and agree with
  ``cluster.levels`` (:func:`_check_regions_levels`), and a global model that can change
  within the run (:func:`first_change`)."""
  for key in ("regions", "local_steps", "accumulation", "lps_buffer", "gps_buffer"):
    checks.integer(cfg, errs, "halos." + key, 1)
  checks.number(cfg, errs, "halos.merge_weight", 0, hi=1)
  for key in ("lps_lr", "gps_lr"):
    checks.number(cfg, errs, "halos." + key, 0)
  for key in ("lps_momentum", "gps_momentum"):
    checks.number(cfg, errs, "halos." + key, 0, hi=1)
  h, n = cfg.get("halos"), cfg.get("num_workers")
  if h is None or cfg.get("algorithm") != "halos" or not (
      checks.is_int(h.get("regions")) and h.regions >= 1 and checks.is_int(n) and n >= 1):
    return
  if n % h.regions:
    errs.append(f"config.halos.regions={h.regions} is not allowed with "
                f"config.num_workers={n}: a divisor of the workers (equal contiguous regions)")
  else:
    _check_regions_levels(cfg, errs)
    _check_first_change(cfg, errs)


def _check_regions_levels(cfg, errs: list) -> None:
  """With ``cluster.levels``, HALoS's regions must be the network's top-level groups, ``L = n /
  (the product of the level sizes)``: the groups the cluster's own (wide-area) link joins, so
  that an LPS reaches its workers inside its group and the GPS over that link.

  A disagreement is refused rather than ``halos.regions`` following the levels: the key keeps
  one meaning with or without levels (the run uses the L the config states), no value is
  overridden in silence (a config that sets both states L twice, and a disagreement is a
  mistake in one of them), and the line gives the value that agrees. Only the count is
  compared: regions hold consecutive workers, and ``cluster.placement`` may seat them
  elsewhere on purpose."""
  levels, n, regions = cfg.cluster.get("levels"), cfg.get("num_workers"), cfg.halos.regions
  if not levels or not checks.is_int(n) or n < 1:
    return
  try:
    sizes = [size for size, _, _ in network_lib.parse_levels(levels, n)]
  except (TypeError, ValueError):
    return  # the cluster's checks name it
  top = n // int(np.prod(sizes))
  if regions != top:
    errs.append(f"config.halos.regions={regions} is not allowed with config.cluster.levels="
                f"{tuple(levels)!r} and config.num_workers={n}: the regions are the network's "
                f"{top} top-level groups (n / {int(np.prod(sizes))}, the groups the cluster's "
                f"own link joins); use halos.regions={top}")


def two_colouring(n: int, edges) -> np.ndarray | None:
  """bool ``[n]``, a side of each worker such that every edge joins the two sides (breadth
  first from the lowest worker of each component, which gets True), or None when the graph has
  an odd cycle (not bipartite)."""
  adj = [[] for _ in range(n)]
  for i, j in edges:
    adj[i].append(j)
    adj[j].append(i)
  side = np.full(n, -1)
  for root in range(n):
    if side[root] >= 0:
      continue
    side[root], queue = 1, deque([root])
    while queue:
      i = queue.popleft()
      for j in adj[i]:
        if side[j] < 0:
          side[j] = 1 - side[i]
          queue.append(j)
        elif side[j] == side[i]:
          return None
  return side.astype(bool)


def _event_clock(cfg, pairwise: PairwiseAverage, seed: int, active=None, every: int = 1,
                 times=events_lib.EventTimes):
  """``Recipe.clock``: ``times`` (:class:`~nbsgd_jax.host.events.EventTimes` or a subclass,
  :mod:`nbsgd_jax.host.async_orders`) with a random pairing
  (:func:`~nbsgd_jax.host.events.random_peer`)."""
  touch = events_lib.random_peer(pairwise.neighbours, seed, active, every)
  reach = lambda i: (i,) + (pairwise.neighbours(i) if active is None or active[i] else ())
  return lambda cluster, comms, params: times(
      cluster, touch, pairwise.message_bytes(params), cfg.cluster.step_overhead, reach=reach)


AD_PSGD = Section(ad_psgd_defaults, check_ad_psgd_config,
                  "AD-PSGD (Lian et al. 2018)", host=("pairing", "seed"))
ASYNC_DILOCO = Section(async_diloco_defaults, check_async_diloco_config,
                       "asynchronous DiLoCo (Liu, Douillard et al. 2024)",
                       host=("dynamic_local_updates", "min_local_steps", "pull"))
HALOS = Section(halos_defaults, check_halos_config,
                "HALoS (Kim et al., ICML 2025)",
                hparams=("merge_weight", "lps_lr", "lps_momentum", "gps_lr", "gps_momentum"),
                host=("local_steps", "accumulation"))
SGP = Section(sgp_defaults, check_sgp_config, "SGP (Assran et al. 2019)")
SWARM_SGD = Section(swarm_sgd_defaults, check_swarm_sgd_config,
                    "SwarmSGD (Nadiradze et al. 2021)", host=("local_steps", "seed"))


@register("ad_psgd", no_compression=NO_COMPRESSION, sections={"ad_psgd": AD_PSGD},
          clock="event", no_face=EVENT_NO_FACE)
def ad_psgd(b: Builder) -> Recipe:
  """AD-PSGD (Lian et al. 2018, Algorithm 1) on the event clock over the topology's graph;
  ``ad_psgd.order='released'``: the reference code's gossip loop, gradient first
  (:class:`~nbsgd_jax.host.async_orders.GossipLoopTimes`).

  Raises:
    ValueError: ``ad_psgd.pairing='bipartite'`` on a graph that is not bipartite (named).
  """
  cfg, topo = b.cfg, b.topology
  pairwise = PairwiseAverage(b.n, topo.edges, b.axis_name)
  active = None
  if cfg.ad_psgd.pairing == "bipartite":
    active = two_colouring(b.n, topo.edges)
    if active is None:
      raise ValueError(f"config.ad_psgd.pairing='bipartite' is not allowed with "
                       f"config.topology={cfg.topology!r} and num_workers={b.n}: the graph "
                       "has an odd cycle (not bipartite); use pairing='random' or a bipartite "
                       "graph (a ring of even n, a torus of even sides)")
  if cfg.ad_psgd.order == "released":  # gradient first, on the gossip loop's cadence
    return Recipe(A.pairwise_events(b.optimizer(), pairwise, "gradient_first"),
                  decentralized=True, primary=pairwise,
                  clock=_event_clock(cfg, pairwise, cfg.ad_psgd.seed, active,
                                     times=async_orders.GossipLoopTimes))
  return Recipe(A.pairwise_events(b.optimizer(), pairwise, "average_first"),
                decentralized=True, primary=pairwise,
                clock=_event_clock(cfg, pairwise, cfg.ad_psgd.seed, active))


@register("swarm_sgd", no_compression=NO_COMPRESSION,
          sections={"swarm_sgd": SWARM_SGD}, clock="event", no_face=EVENT_NO_FACE)
def swarm_sgd(b: Builder) -> Recipe:
  """SwarmSGD (Nadiradze et al. 2021) on the event clock: each event is one local SGD step of
  a worker; after every H-th (``swarm_sgd.local_steps``) it averages with a neighbour drawn
  uniformly, ``x_i, x_j <- (x_i + x_j) / 2`` (the peer keeps computing: its in-flight step
  lands on the average); ``swarm_sgd.averaging='one_sided'``: ``x_i <- (x_i + p_j) / 2`` with
  the copy p_j the peer published after its last local step, the peer unchanged (the released
  PopSGD code; :class:`~nbsgd_jax.host.async_orders.OneSidedTimes`)."""
  pairwise = PairwiseAverage(b.n, b.topology.edges, b.axis_name)
  sw = b.cfg.swarm_sgd
  times = async_orders.OneSidedTimes if sw.averaging == "one_sided" else events_lib.EventTimes
  return Recipe(A.pairwise_events(b.optimizer(), pairwise, "gradient_first",
                                  sw.averaging),
                decentralized=True, primary=pairwise,
                clock=_event_clock(b.cfg, pairwise, sw.seed, every=sw.local_steps,
                                   times=times))


def local_steps_per_worker(cfg, cluster) -> np.ndarray:
  """Each worker's H_i: ``diloco.local_steps``, or with dynamic local updates (DyLU)
  ``max(int(H t_min / t_i), min(min_local_steps, H))`` for a worker whose step takes t_i.
  ``int(H t_min / t_i)`` is the paper's (Liu, Douillard et al. 2024, arXiv 2401.09135,
  dynamic local updates: local steps in proportion to the worker's speed, the fastest's H);
  the floor is google-deepmind/asyncdiloco's toy notebook's (commit e783a30,
  ``sample_train_task(scale_steps=True)``: ``max(int(train_steps * c), 5)``), capped at H
  here (the notebook's 5 exceeds an H below 5); ``min_local_steps = 1`` is the paper's
  formula alone (H_i >= 1 always)."""
  h, a = cfg.diloco.local_steps, cfg.async_diloco
  if not a.dynamic_local_updates:
    return np.full(cluster.n, h, np.int64)
  t = np.asarray(cluster.minibatch_time, np.float64)
  return np.maximum((h * t.min() / t).astype(np.int64), min(a.min_local_steps, h))


@register("async_diloco", no_compression="a compressed push (with its error feedback "
          "across asynchronous rounds) is not built",
          sections={"diloco": DILOCO, "async_diloco": ASYNC_DILOCO},
          check=check_async_diloco, clock="event", no_face=EVENT_NO_FACE)
def async_diloco(b: Builder) -> Recipe:
  """Asynchronous DiLoCo (Liu, Douillard et al. 2024) on the event clock (module
  docstring); an evaluation reads the server's model, as DiLoCo's reads its outer model
  (:func:`~nbsgd_jax.transforms.asynchronous.outer_models`)."""
  cfg, server = b.cfg, ParameterServer(b.n, b.axis_name)
  a = cfg.async_diloco
  buffer = a.buffer or b.n
  t = b.injected(lambda lr, m: A.server_rounds(b.optimizer(), server, lr, m, buffer,
                                               a.activation, a.staleness_weight, a.reset_inner),
                 "diloco.outer_lr", "diloco.outer_momentum")
  clock = lambda cluster, comms, params: events_lib.ServerEventTimes(
      cluster, server.message_bytes(params), local_steps_per_worker(cfg, cluster),
      cfg.cluster.step_overhead, a.pull)
  return Recipe(t, decentralized=True, primary=server, clock=clock,
                evaluated=A.outer_models)


@register("halos", no_compression="the reference's messages are full float32 models",
          sections={"halos": HALOS}, clock="event", no_face=EVENT_NO_FACE)
def halos(b: Builder) -> Recipe:
  """HALoS (Kim et al., ICML 2025, Algorithm 1; utnslab/halos, commit 4b5bf73): a local
  parameter server per region, a global one, delayed Nesterov on both, the LPS's merge of the
  global model (:mod:`~nbsgd_jax.transforms.hierarchical`,
  :mod:`~nbsgd_jax.host.regional_servers`); an evaluation reads the global model."""
  cfg, server = b.cfg, ParameterServer(b.n, b.axis_name)
  h = cfg.halos
  t = b.injected(lambda a, llr, lm, glr, gm: hierarchical.regional_servers(
      b.optimizer(), server, h.regions, hierarchical.Optimizer(llr, lm, h.lps_buffer),
      hierarchical.Optimizer(glr, gm, h.gps_buffer), a),
      "halos.merge_weight", "halos.lps_lr", "halos.lps_momentum", "halos.gps_lr",
      "halos.gps_momentum")
  clock = lambda cluster, comms, params: regional_servers.RegionalServerTimes(
      cluster, server.message_bytes(params), np.full(cluster.n, h.local_steps), h.regions,
      h.accumulation, cfg.cluster.step_overhead)
  return Recipe(t, decentralized=True, primary=server, clock=clock,
                evaluated=hierarchical.global_models)


@register("sgp", no_compression=GOSSIP_REASON, sections={"sgp": SGP},
          check=check_sgp, face="sgp")
def sgp(b: Builder) -> Recipe:
  """SGP / Overlap-SGP (Assran et al. 2019) over the topology's W_t (``one_peer_exponential``
  is the paper's graph: every phase (I + P_t) / 2, doubly stochastic, so without overlap SGP
  is D-PSGD over the same W_t)."""
  sg = b.cfg.sgp
  t = algorithms.sgp(b.optimizer("local"), b.gossip(), sg.overlap, sg.delay)
  return Recipe(t, decentralized=True, primary=t.communications[-1])


__all__ = ["AD_PSGD", "AD_PSGD_ORDERS", "ASYNC_DILOCO", "HALOS", "PAIRINGS", "SGP", "SWARM_SGD",
           "ad_psgd", "async_diloco", "check_async_diloco", "halos", "local_steps_per_worker",
           "sgp", "swarm_sgd", "two_colouring"]
