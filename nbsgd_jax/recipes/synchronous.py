"""The lockstep algorithms as recipes, with their config sections: All-Reduce SGD (psum and
ring), D-PSGD, MATCHA, CHOCO-SGD, gradient tracking, D^2, Gossip-PGA, local SGD, DiLoCo,
streaming DiLoCo and SPARTA (``docs/algorithms.md``)."""

from __future__ import annotations

from typing import Optional

import ml_collections
import optax

from nbsgd_jax import codecs
from nbsgd_jax.core import checks
from nbsgd_jax import transforms as T
from nbsgd_jax.communications import CompressedGossip, MaskedAllReduce
from nbsgd_jax.communications.masked import MASKS
from nbsgd_jax.topology import matcha as matcha_lib
from nbsgd_jax.host import periods as local_sgd_lib
from nbsgd_jax.transforms import algorithms as A
from nbsgd_jax.transforms import asynchronous
from nbsgd_jax.transforms import decentralized as D
from nbsgd_jax.transforms.decentralized import check_d2_mixing
from nbsgd_jax.recipes.builder import Builder
from nbsgd_jax.recipes.registry import GOSSIP_REASON, Recipe, Section, register


# ----------------------------------------------------------- config sections (defaults, checks)


def check_diloco_config(cfg, errs: list) -> None:
  """diloco.*: inner steps and the outer optimizer."""
  checks.integer(cfg, errs, "diloco.local_steps", 1, note="H")
  checks.number(cfg, errs, "diloco.outer_lr", 0, lo_open=True)
  checks.number(cfg, errs, "diloco.outer_momentum", 0, hi=1, hi_open=True)
  checks.boolean(cfg, errs, "diloco.outer_nesterov")
  checks.choice(cfg, errs, "diloco.overlap", T.wrappers.OVERLAPS)


def dpsgd_defaults() -> ml_collections.ConfigDict:
  """``config.dpsgd.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.order = "atc"                # atc: local step, then gossip (the reference codes: MATCHA's
                                 # train_mpi.py, Koloskova et al. 2020) | parallel (Lian et
                                 # al. Eq. 2: gossip x while computing g(x), overlapped)
  return s


def check_dpsgd_config(cfg, errs: list) -> None:
  """dpsgd.order."""
  checks.choice(cfg, errs, "dpsgd.order", T.wrappers.ORDERS)


def _check_diloco_period(cfg, errs: list) -> None:
  """DiLoCo's first round ends within the run; with ``diloco.overlap='delayed'`` so does its
  first outer step, at the second period end ``2 H`` (the first mean lands a period late):
  before it the outer model, the evaluated one, is the initial model."""
  checks.period_within_run(cfg, errs, "diloco.local_steps", True)
  h, steps = cfg.diloco.get("local_steps"), cfg.get("num_steps")
  if (cfg.get("algorithm") == "diloco" and cfg.diloco.get("overlap") == "delayed"
      and checks.is_int(h) and checks.is_int(steps) and 1 <= h <= steps < 2 * h):
    errs.append(f"config.diloco.local_steps={h} is not allowed with config.diloco.overlap="
                f"'delayed' and config.num_steps={steps}: the run would end before its "
                f"evaluated (outer) model first changes, at step {2 * h} (the first mean lands "
                f"a period late); use " + (f"at most {steps // 2}, or " if steps > 1 else "")
                + f"num_steps >= {2 * h}")


def check_streaming_diloco_config(cfg, errs: list) -> None:
  """streaming_diloco.*: fragments P >= 1, overlap tau >= 0, mixing factor alpha in [0, 1]."""
  checks.number(cfg, errs, "streaming_diloco.alpha", 0, hi=1)
  checks.integer(cfg, errs, "streaming_diloco.delay", 0, note="tau")
  checks.integer(cfg, errs, "streaming_diloco.fragments", 1, note="P")


def _check_streaming(cfg, errs: list) -> None:
  """Streaming DiLoCo's first round within the run, P dividing H = diloco.local_steps and
  0 <= tau < H / P (a fragment's all-reduce lands before the next one starts); its overlap is
  its own (``streaming_diloco.delay``), not ``diloco.overlap``."""
  _check_diloco_period(cfg, errs)
  if cfg.diloco.get("overlap", "none") != "none":
    errs.append(f"config.diloco.overlap={cfg.diloco.overlap!r} is not allowed with "
                "algorithm='streaming_diloco': its overlap is streaming_diloco.delay")
  sd, h = cfg.streaming_diloco, cfg.diloco.get("local_steps")
  p, tau = sd.get("fragments"), sd.get("delay")
  if not (checks.is_int(p) and p >= 1 and checks.is_int(h) and h >= 1):
    return
  if h % p:
    errs.append(f"config.streaming_diloco.fragments={p} is not allowed with "
                f"config.diloco.local_steps={h}: it must divide H")
  elif checks.is_int(tau) and tau >= h // p:
    errs.append(f"config.streaming_diloco.delay={tau} is not allowed with H / P = {h // p}: "
                f"a fragment's all-reduce must land before the next one starts "
                f"(0 <= tau < {h // p})")


def check_choco_config(cfg, errs: list) -> None:
  """choco.gamma in (0, 1]; choco.order."""
  checks.number(cfg, errs, "choco.gamma", 0, lo_open=True, hi=1)
  checks.choice(cfg, errs, "choco.order", D.CHOCO_ORDERS)


def check_d2_config(cfg, errs: list) -> None:
  """d2.mixing."""
  checks.choice(cfg, errs, "d2.mixing", D.D2_MIXINGS)


def check_gossip_pga_config(cfg, errs: list) -> None:
  """gossip_pga.period >= 1."""
  checks.integer(cfg, errs, "gossip_pga.period", 1, note="H")


def choco_defaults() -> ml_collections.ConfigDict:
  """``config.choco.*`` with their defaults: CHOCO-SGD (Koloskova et al. 2019)."""
  s = ml_collections.ConfigDict()
  s.gamma = 0.5                  # consensus step size, in (0, 1]; tune it with the codec
  s.order = "paper"              # paper: Algorithm 2 (compress, then consensus) | released:
                                 # epfml/ChocoSGD's codes (consensus on the last copies, then
                                 # compress the new model's difference)
                                 # (smaller for stronger compression)
  return s


def d2_defaults() -> ml_collections.ConfigDict:
  """``config.d2.*`` with their defaults: D^2 (Tang et al. 2018) / Exact Diffusion."""
  s = ml_collections.ConfigDict()
  s.mixing = "lazy"              # lazy: (I + W) / 2 (Exact Diffusion) | w: W itself (needs
                                 # lambda_min(W) > -1/3)
  return s


def gossip_pga_defaults() -> ml_collections.ConfigDict:
  """``config.gossip_pga.*`` with their defaults: Gossip-PGA (Chen et al. 2021)."""
  s = ml_collections.ConfigDict()
  s.period = 8                   # H: a global average instead of the gossip every H steps
  return s


def diloco_defaults() -> ml_collections.ConfigDict:
  """``config.diloco.*`` with their defaults: DiLoCo (Douillard et al. 2023)."""
  s = ml_collections.ConfigDict()
  s.local_steps = 50             # H: inner steps per round
  s.outer_lr = 0.7               # outer SGD learning rate
  s.outer_momentum = 0.9         # outer momentum (0: plain SGD)
  s.outer_nesterov = True        # Nesterov outer momentum
  s.overlap = "none"             # none | delayed: the all-reduce overlaps the next H inner
                                 # steps, the outer step on the mean that landed (one outer
                                 # step late; pccl's async DiLoCo) | eager: the worker's own
                                 # fresh share in place of its stale one (Kale et al. 2025)
  return s


def streaming_diloco_defaults() -> ml_collections.ConfigDict:
  """``config.streaming_diloco.*`` with their defaults: Streaming DiLoCo (Douillard et al. 2025)."""
  s = ml_collections.ConfigDict()
  s.fragments = 2                # P: contiguous groups of parameter arrays, one synchronised
                                    # every diloco.local_steps / P steps (P must divide H)
  s.delay = 0                    # tau: inner steps a fragment's all-reduce overlaps (0: none;
                                 # 0 <= tau < H / P)
  s.alpha = 0.0                  # mixing factor at landing: x <- alpha x + (1 - alpha) global
  return s


DILOCO = Section(diloco_defaults, check_diloco_config, "DiLoCo (Douillard et al. 2023)",
                 hparams=("outer_lr", "outer_momentum"),
                 structure=lambda cfg: {"outer_momentum_on": bool(cfg.diloco.outer_momentum)})
STREAMING_DILOCO = Section(streaming_diloco_defaults, check_streaming_diloco_config,
                           "Streaming DiLoCo (Douillard et al. 2025)")
CHOCO = Section(choco_defaults, check_choco_config, "CHOCO-SGD (Koloskova et al. 2019)",
                hparams=("gamma",))
D2 = Section(d2_defaults, check_d2_config, "D^2 (Tang et al. 2018) / Exact Diffusion")
GOSSIP_PGA = Section(gossip_pga_defaults, check_gossip_pga_config, "Gossip-PGA (Chen et al. 2021)")
LOCAL_SGD = Section(local_sgd_lib.local_sgd_defaults, local_sgd_lib.check_config,
                    "LUPA-SGD (Haddadpour et al. 2019)")
MATCHA = Section(matcha_lib.matcha_defaults, matcha_lib.check_config, "MATCHA (Wang et al. 2019)")


def sparta_defaults() -> ml_collections.ConfigDict:
  """``config.sparta.*`` with their defaults: SPARTA (exo-explore/gym)."""
  s = ml_collections.ConfigDict()
  s.density = 0.005              # k/d: fraction of the coordinates averaged after each step (the
                                 # reference's p_sparta)
  s.mask = "broadcast"           # broadcast (the reference: rank 0's mask sent, d bytes to
                                 # each other worker) | seeded (drawn on every worker from a
                                 # shared seed, none sent)
  return s


def check_sparta_config(cfg, errs: list) -> None:
  """sparta.density in (0, 1]; sparta.mask."""
  checks.number(cfg, errs, "sparta.density", 0, lo_open=True, hi=1)
  checks.choice(cfg, errs, "sparta.mask", MASKS)


SPARTA = Section(sparta_defaults, check_sparta_config, "SPARTA (exo-explore/gym)",
                 hparams=("density",))


# ----------------------------------------------------------------------------- recipes

def _centralized(b: Builder, ring: bool) -> Recipe:
  comm = b.allreduce(ring=ring)
  return Recipe(A.allreduce_sgd(b.optimizer("global"), b.gradient_reducer(comm)),
                decentralized=False, primary=comm)


@register("allreduce", face="allreduce_mean")
def allreduce(b: Builder) -> Recipe:
  """All-Reduce SGD, ``g = (1/n) sum_i g_i`` by ``lax.psum`` (or compressed with EF)."""
  return _centralized(b, ring=False)


def check_allreduce_ring(cfg, errs: list) -> None:
  """The explicit ring is a ring: no tree all-reduce."""
  if cfg.cluster.get("allreduce_algorithm") == "tree":
    errs.append("config.cluster.allreduce_algorithm='tree' is not allowed with "
                "config.algorithm='allreduce_ring': that is the explicit ring")


@register("allreduce_ring", face="allreduce_mean", check=check_allreduce_ring)
def allreduce_ring(b: Builder) -> Recipe:
  """All-Reduce SGD by the explicit ring (reduce-scatter + all-gather of ``ppermute`` s)."""
  return _centralized(b, ring=True)


@register("dpsgd", gossips=True, no_compression=GOSSIP_REASON, face="gossip")
def dpsgd(b: Builder) -> Recipe:
  """D-PSGD (Lian et al. 2017) over the topology's W or W_t."""
  g = b.gossip()
  return Recipe(A.dpsgd(b.optimizer("local"), g, b.cfg.dpsgd.order), decentralized=True,
                gossip=g, primary=g)


@register("matcha", gossips=True, no_compression=GOSSIP_REASON, sections={"matcha": MATCHA},
          check=matcha_lib.check_static_graph, face="matcha")
def matcha(b: Builder) -> Recipe:
  """MATCHA (Wang et al. 2019): gossip over randomly activated matchings; consensus control
  gossips over the static base graph."""
  m = b.matchings()
  return Recipe(A.dpsgd(b.optimizer("local"), m, b.cfg.dpsgd.order), decentralized=True,
                gossip=b.gossip(), primary=m)


def _choco_reason(cfg) -> Optional[str]:
  spec = codecs.REGISTRY.get(cfg.compression.name)
  if spec is not None and spec.reducer:
    return (f"CHOCO-SGD compresses each worker's x - x_hat with a codec; "
            f"{cfg.compression.name!r} is a reducer of its own (PowerSGD's message is built by "
            "two all-reduces over all workers), which gossip does not have")
  return None


@register("choco_sgd", gossips=True, no_compression=_choco_reason, sections={"choco": CHOCO},
          ignores=("compression.error_feedback",), face="choco")
def choco_sgd(b: Builder) -> Recipe:
  """CHOCO-SGD (Koloskova et al. 2019, Algorithm 2): gossip of compressed model differences
  with public copies; consensus control repeats a plain gossip round."""
  c = b.cfg
  g, opt, codec = b.gossip("choco", kind=CompressedGossip), b.optimizer("local"), b.codec()
  t = b.injected(lambda gamma: A.choco_sgd(opt, g, codec, gamma, c.compression.flatten, c.seed,
                                           c.choco.order), "choco.gamma")
  return Recipe(t, decentralized=True, gossip=b.gossip(), primary=g)


@register("gradient_tracking", gossips=True, no_compression=GOSSIP_REASON,
          face="gradient_tracking")
def gradient_tracking(b: Builder) -> Recipe:
  """Gradient tracking, DIGing (Nedic et al. 2017): the optimizer follows the tracked mean
  gradient ``y``; two gossip rounds a step (``y`` and the model)."""
  g = b.gossip()
  t = A.gradient_tracking(b.optimizer("local"), b.gossip("tracking"), g, b.cfg.dpsgd.order)
  return Recipe(t, decentralized=True, gossip=g, primary=g)


@register("d2", gossips=True, no_compression=GOSSIP_REASON, sections={"d2": D2}, face="d2")
def d2(b: Builder) -> Recipe:
  """D^2 (Tang et al. 2018) over W, or Exact Diffusion over (I + W) / 2 (``d2.mixing``)."""
  g = b.gossip(lazy=b.cfg.d2.mixing == "lazy")
  check_d2_mixing(g.phases, b.cfg.d2.mixing)
  return Recipe(A.d2(b.optimizer("local"), g), decentralized=True, gossip=g, primary=g)


@register("gossip_pga", gossips=True, no_compression=GOSSIP_REASON,
          sections={"gossip_pga": GOSSIP_PGA}, face="gossip_pga")
def gossip_pga(b: Builder) -> Recipe:
  """Gossip-PGA (Chen et al. 2021): D-PSGD with a global average every ``gossip_pga.period``
  steps."""
  g, avg = b.gossip(), b.allreduce()
  t = A.gossip_pga(b.optimizer("local"), g, avg, b.cfg.dpsgd.order)
  return Recipe(t, decentralized=True, gossip=g, primary=g,
                planner=b.fixed_periods(b.cfg.gossip_pga.period))


def _local_sgd_reason(cfg) -> Optional[str]:
  if cfg.local_sgd.averaging == "gossip":
    return "config.local_sgd.averaging='gossip' exchanges models by " + GOSSIP_REASON
  return None


@register("local_sgd", no_compression=_local_sgd_reason, sections={"local_sgd": LOCAL_SGD},
          check=local_sgd_lib.check_period, face="local_sgd")
def local_sgd(b: Builder) -> Recipe:
  """Local SGD / LUPA-SGD (Haddadpour et al. 2019): local steps, a model average (or one
  gossip round) at every period end."""
  c, opt = b.cfg.local_sgd, b.optimizer("local")
  comm = b.gossip() if c.averaging == "gossip" else b.allreduce()
  plain = T.gossip_of(comm) if c.averaging == "gossip" else T.mean_of(comm, "alive")
  reducer = plain if c.averaging == "gossip" else b.model_reducer(comm)
  t = A.local_sgd(opt, reducer, c.opt_state, local_init=opt.init, opt_reducer=plain)
  return Recipe(t, decentralized=True, primary=comm,
                planner=lambda offset: local_sgd_lib.make_planner(b.cfg, offset))


def _outer(cfg, lr, momentum) -> optax.GradientTransformation:
  """DiLoCo's outer optimizer: SGD with (Nesterov) momentum; ``lr`` and ``momentum`` the
  step's hparams ``diloco.outer_lr``, ``diloco.outer_momentum`` (on when > 0: structure)."""
  on = bool(cfg.diloco.outer_momentum)
  return optax.sgd(lr, momentum=momentum if on else None, nesterov=on and cfg.diloco.outer_nesterov)


@register("diloco", sections={"diloco": DILOCO}, check=_check_diloco_period, face="diloco")
def diloco(b: Builder) -> Recipe:
  """DiLoCo (Douillard et al. 2023): H inner steps, then an outer optimizer step on the
  averaged pseudo-gradient; an evaluation reads the outer model (``docs/algorithms.md``)."""
  comm = b.allreduce()
  reducer, opt = b.delta_reducer(comm), b.optimizer("local")
  c = b.cfg.diloco
  t = b.injected(lambda lr, m: A.diloco(opt, reducer, _outer(b.cfg, lr, m), c.overlap,
                                        c.local_steps), "diloco.outer_lr", "diloco.outer_momentum")
  return Recipe(t, decentralized=True, primary=comm, evaluated=asynchronous.outer_models,
                planner=b.fixed_periods(b.cfg.diloco.local_steps))


@register("streaming_diloco", sections={"diloco": DILOCO, "streaming_diloco": STREAMING_DILOCO},
          check=_check_streaming, face="streaming_diloco")
def streaming_diloco(b: Builder) -> Recipe:
  """Streaming DiLoCo (Douillard et al. 2025): DiLoCo whose P fragments synchronise in turn,
  one every H / P steps (``diloco.*`` as DiLoCo, ``streaming_diloco.fragments`` = P), each
  all-reduce overlapping ``streaming_diloco.delay`` = tau inner steps, merged with mixing
  factor ``streaming_diloco.alpha``."""
  h, c = b.cfg.diloco.local_steps, b.cfg.streaming_diloco
  comm = b.allreduce()
  reducer, opt = b.delta_reducer(comm), b.optimizer("local")
  t = b.injected(lambda lr, m: A.streaming_diloco(opt, reducer, _outer(b.cfg, lr, m),
                                                  c.fragments, c.delay, c.alpha),
                 "diloco.outer_lr", "diloco.outer_momentum")
  return Recipe(t, decentralized=True, primary=comm,
                planner=lambda offset: local_sgd_lib.FragmentPlanner(h, c.fragments, c.delay))


@register("sparta", no_compression="SPARTA sends a random subset of the coordinates "
          "uncompressed (a codec on that subset is not built)", sections={"sparta": SPARTA},
          face="sparta")
def sparta(b: Builder) -> Recipe:
  """SPARTA (exo-explore/gym): the local step, then the mean over the workers of a random
  fraction ``sparta.density`` of the coordinates, the same on every worker."""
  exchange = MaskedAllReduce(b.n, b.axis_name, "sparta", b.cfg.sparta.mask)
  opt = b.optimizer("local")
  t = b.injected(lambda p, seed: A.sparta(opt, exchange, p, seed), "sparta.density", "seed")
  return Recipe(t, decentralized=True, primary=exchange)
