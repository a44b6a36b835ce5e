"""Codecs: a compressor with the bytes of its encoding, usable by every reducer and by CHOCO;
one registry of them (:func:`register`: ``config.compression.name`` -> a factory called with
the ``config.compression`` keys it reads; a codec can be registered from outside the package).

A :class:`Codec` maps a flat float vector ``x [d]`` (and a PRNG key) to the vector the
receivers decode, ``C(x) [d]``, and the bytes of the encoded message (float32 scalar). The
device never builds the bit-packed message: a simulation only needs ``C(x)`` and its size,
and the size is a function of the encoding documented per codec. Sparse codecs also carry
their ``(values, indices)`` form, which the sparse all-gather sends as it is.

* ``top_k`` / ``gaussian_k`` / ``random_k`` (:mod:`nbsgd_jax.codecs.sparse`, Shi et al. 2019):
  ``k`` (value, int32 index) pairs, ``k (value_bytes + 4)`` bytes.
* ``qsgd`` (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD", NeurIPS 2017, Sec. 3.1):
  ``Q_s(v_i) = ||v||_2 sgn(v_i) xi_i(v, s)`` per bucket ``v`` of ``bucket_size`` entries, with
  ``l = floor(s |v_i| / ||v||)`` and ``xi_i = (l + 1) / s`` with probability
  ``s |v_i| / ||v|| - l``, else ``l / s``: unbiased, ``E ||Q_s(v) - v||^2 <=
  min(b / s^2, sqrt(b) / s) ||v||^2`` (their Lemma 3.1, ``b`` the bucket size). Encoding: a
  float32 norm per bucket, then per entry one sign bit and ``ceil(log2(s + 1))`` bits of level
  (fixed width; the paper's Elias code is shorter for small ``s`` and is not modelled), i.e.
  ``4 ceil(d / b) + ceil(d (1 + ceil(log2(s + 1))) / 8)`` bytes.
* ``sign`` (scaled sign, Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD",
  ICML 2019, Algorithm 1): ``C(p) = (||p||_1 / d) sgn(p)`` with ``sgn(0) = +1``; one bit per
  entry plus one float32, ``ceil(d / 8) + 4`` bytes.
* ``bf16``: bfloat16 messages: ``C(x) = float32(bfloat16(x))`` (round to nearest even, 8 bits
  of mantissa; Kalamkar et al., "A study of BFLOAT16 for deep learning training", 2019),
  ``2 d`` bytes, counted from the dtype's itemsize. With error feedback the rounding error is
  carried to the next step; CHOCO-SGD with ``bf16`` and gamma = 1 is D-PSGD with bfloat16
  messages.
* ``none``: the identity, ``d value_bytes`` bytes (CHOCO-SGD without compression is D-PSGD).

PowerSGD (Vogels et al. 2019) is not a codec: its message is a rank-r factorisation built in
two all-reduce rounds (:func:`nbsgd_jax.transforms.powersgd`); it is registered here as a
reducer (:attr:`Spec.reducer`), by its module.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
from jax.flatten_util import ravel_pytree

from nbsgd_jax.core import checks
from nbsgd_jax.codecs import quantize, sparse
from nbsgd_jax.codecs.base import Array, Codec
# the codecs' functions, also by their old names (codecs.qsgd, codecs.sparse_codec, ...)
from nbsgd_jax.codecs.quantize import (identity_codec, level_bits, qsgd,  # noqa: F401
                                       qsgd_bytes, scaled_sign)
# the compressors ``(x [d], key) -> (values, indices)`` where users reach for them
# (codecs.top_k, as docs/library.md writes them)
from nbsgd_jax.codecs.sparse import (gaussian_k, random_k, sparse_codec,  # noqa: F401
                                     top_k)


# ----------------------------------------------------------------------------- the registry


class Spec(NamedTuple):
  """A registered codec (:func:`register`).

  Attributes:
    factory: ``(**options) -> Codec``, called with the ``config.compression`` keys of
      :attr:`keys` as keyword arguments; for a reducer, ``(**options) -> make`` with
      ``make(communication, seed, use_residual, weight_by) -> WorkerTransform``.
    keys: the ``config.compression.*`` keys it reads (changed while another codec runs, they
      are named as having no effect).
    reducer: a reducer of its own (PowerSGD: two all-reduce rounds), not a codec the
      all-gather and CHOCO's gossip send.
    check_model: ``(cfg, shapes, errs) -> warning lines or None``, the rules of its keys that
      depend on the model (one worker's parameter ``shapes``): a refusal appended to ``errs``,
      a legal but wasteful value returned as a warning line; run before anything is compiled
      while it is ``config.compression.name`` (:func:`nbsgd_jax.run.setup.check_model_fit`);
      or None.
    options: the keys it adds to ``config.compression`` (:class:`Options`), or None.
  """

  factory: Callable[..., Any]
  keys: tuple[str, ...] = ()
  reducer: bool = False
  check_model: Optional[Callable[[Any, list, list], Optional[list]]] = None
  options: Optional["Options"] = None


class Options(NamedTuple):
  """The ``config.compression.*`` keys a codec registered from outside the package adds
  (the built-in codecs' keys are :func:`compression_defaults`'), as a recipe's
  :class:`~nbsgd_jax.recipes.Section` adds a section.

  Attributes:
    defaults: ``() -> ConfigDict`` of the keys with their defaults (names that
      ``config.compression`` does not have yet).
    check: ``(cfg, errs) -> None``, one line per bad value of these keys (run whatever the
      codec, as every ``compression.*`` check).
  """

  defaults: Callable[[], ml_collections.ConfigDict]
  check: Callable[[ml_collections.ConfigDict, list], None]


NONE = "none"  # config.compression.name of no compression
REGISTRY: dict[str, Spec] = {}


def register(name: str, factory: Callable[..., Any], keys: tuple = (), reducer: bool = False,
             check_model: Optional[Callable[[Any, list, list], Optional[list]]] = None,
             options: Optional[Options] = None) -> None:
  """Register a codec as ``config.compression.name=name`` (also from outside the package).

  Args:
    name: its name in ``config.compression.name``.
    factory: ``(**options) -> Codec`` with the options of ``keys`` (:class:`Spec`).
    keys: the ``config.compression.*`` keys passed to ``factory``; the keys of ``options``
      are passed too.
    reducer: ``factory`` makes a reducer of its own (:class:`Spec`).
    check_model: its model-dependent rules (:class:`Spec`).
    options: keys of its own added to ``config.compression`` (:class:`Options`).

  Raises:
    ValueError: ``name`` registered already with another factory, an option key that
      ``config.compression`` already has, or a key that ``config.compression`` does not have
      asked for by a factory at run time (named).
  """
  if name in REGISTRY and REGISTRY[name].factory is not factory:
    raise ValueError(f"codec {name!r} is already registered")
  own = tuple(options.defaults()) if options is not None else ()
  clash = sorted(set(own) & _taken_keys(name)) if own else []
  if clash:
    raise ValueError(f"codec {name!r}: option config.compression.{clash[0]} exists already; "
                     "name its keys after the codec")
  REGISTRY[name] = Spec(factory, tuple(dict.fromkeys(tuple(keys) + own)), bool(reducer),
                        check_model, options)


def _taken_keys(name: str) -> set:
  """The ``config.compression`` keys there are apart from codec ``name``'s own (a codec
  registered again keeps its keys)."""
  return set(compression_defaults()) - set(getattr(REGISTRY.get(name), "keys", ()))


def names() -> tuple[str, ...]:
  """Every registered ``config.compression.name`` (``"none"`` first)."""
  return tuple(REGISTRY)


def make_codec(name: str, **options) -> Codec:
  """The :class:`Codec` of ``name`` with ``options`` (its :attr:`Spec.keys`; the keys of the
  other codecs are ignored, so one call serves every codec), e.g. ``make_codec("top_k",
  density=0.01)``.

  Raises:
    ValueError: an unknown name, a reducer, an option no codec reads (a typo), or a bad
      option value (named).
  """
  if name not in REGISTRY or REGISTRY[name].reducer:
    codecs = [n for n, s in REGISTRY.items() if not s.reducer]
    raise ValueError(f"compression.name={name!r} is not allowed: use one of {codecs}")
  known = {k for s in REGISTRY.values() for k in s.keys}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ValueError(f"make_codec({name!r}, {unknown[0]}=...) is not allowed: no codec reads "
                     f"{unknown[0]!r}; the options are {sorted(known)}")
  spec = REGISTRY[name]
  return spec.factory(**{k: v for k, v in options.items() if k in spec.keys})


def from_config(c) -> Any:
  """What ``config.compression`` (``c``) names: a :class:`Codec`, or a reducer's ``make``
  (:class:`Spec`).

  Raises:
    ValueError: an unknown name or a bad option (named).
  """
  if c.name not in REGISTRY:
    raise ValueError(f"compression.name={c.name!r} is not allowed: use one of {list(names())}")
  spec = REGISTRY[c.name]
  return spec.factory(**{k: c[k] for k in spec.keys})


register(NONE, identity_codec)
register("top_k", sparse.top_k_codec, ("density",))
register("gaussian_k", sparse.gaussian_k_codec,
         ("density", "gaussian_rounds", "gaussian_correction"))
register("random_k", sparse.random_k_codec, ("density",))
register("qsgd", quantize.qsgd_codec, ("levels", "bucket_size"))
register("sign", quantize.sign_codec)
register("bf16", quantize.bf16_codec)
# PowerSGD registers itself as a reducer (nbsgd_jax.transforms.powersgd)


def compress_tree(codec: Codec, tree: Any, key: Array, flatten: bool = True
                  ) -> tuple[Any, Array]:
  """``C`` applied to a pytree: to the whole raveled tree (``flatten``) or to each leaf with
  its own key. Returns ``(decoded tree, float32 bytes)``."""
  if flatten:
    flat, unravel = ravel_pytree(tree)
    if flat.size == 0:
      return tree, jnp.float32(0.0)
    out, nbytes = codec.compress(flat, key)
    return unravel(out), jnp.asarray(nbytes, jnp.float32)
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, max(len(leaves), 1))
  outs, total = [], jnp.float32(0.0)
  for leaf, k in zip(leaves, keys):
    if leaf.size == 0:
      outs.append(leaf)
      continue
    out, nbytes = codec.compress(leaf.reshape(-1), k)
    outs.append(out.reshape(leaf.shape))
    total = total + nbytes
  return jax.tree.unflatten(treedef, outs), total


# ----------------------------------------------------------------------------- config


def compression_defaults() -> ml_collections.ConfigDict:
  """``config.compression.*`` with their defaults: codecs (nbsgd_jax.codecs), error feedback."""
  s = ml_collections.ConfigDict()
  s.name = "none"                # none | top_k | gaussian_k | random_k | qsgd | sign | bf16 |
                                 # powersgd (allreduce*, local_sgd, diloco only): the
                                 # gradients of allreduce*, the model differences of
                                 # local_sgd / diloco, CHOCO-SGD's x - x_hat
  s.density = 0.01               # k / d of the sparse codecs, in (0, 1]
  s.levels = 16                  # qsgd: levels s per sign (1 + ceil(log2(s + 1)) bits/entry)
  s.bucket_size = 512            # qsgd: entries per norm (one float32 each)
  s.rank = 2                     # powersgd: rank r of each matrix's approximation
  s.error_feedback = True        # keep the unsent residual and add it next step
  s.flatten = True               # one selection over the whole model (False: per layer)
  s.gaussian_rounds = 0          # gaussian_k, 0: the correction's default. bracket: max
                                     # threshold corrections toward k (default 8); paper:
                                     # max thresholds evaluated, GaussianK-SGD's loop bound
                                     # (default 3, its GaussianCompressor)
  s.gaussian_correction = "bracket"  # bracket | paper (GaussianK-SGD's loop:
                                                 # x0.5 / x1.5 steps only)
  for spec in REGISTRY.values():  # the keys of codecs registered with options of their own
    if spec.options is not None:
      for key, value in spec.options.defaults().items():
        s[key] = value
  return s


def check_config(cfg, errs: list) -> None:
  """compression.*, all of them whatever compression.name is."""
  checks.choice(cfg, errs, "compression.name", names())
  checks.number(cfg, errs, "compression.density", 0, lo_open=True, hi=1)
  if checks.integer(cfg, errs, "compression.levels", 1, note="qsgd's s") and (
      cfg.compression.levels > quantize.MAX_LEVELS):
    errs.append(f"config.compression.levels={cfg.compression.levels} is not allowed: it must "
                f"be at most {quantize.MAX_LEVELS} (2^23: float32 resolves no finer levels; more only "
                "cost bits)")
  checks.integer(cfg, errs, "compression.bucket_size", 1)
  checks.integer(cfg, errs, "compression.rank", 1, note="PowerSGD's r")
  # gaussian_rounds 0 is the correction's default (DEFAULT_ROUNDS), so paper's rounds >= 1
  # holds for every allowed value.
  rounds = cfg.compression.get("gaussian_rounds")
  if not (checks.is_int(rounds) and 0 <= rounds <= 64):
    errs.append(f"config.compression.gaussian_rounds={rounds!r} is not allowed: it must be "
                "an int in [0, 64]")
  correction = cfg.compression.get("gaussian_correction")
  if correction not in ("bracket", "paper"):
    errs.append(f"config.compression.gaussian_correction={correction!r} is not allowed: use "
                "'bracket' or 'paper'")
  for key in ("error_feedback", "flatten"):
    checks.boolean(cfg, errs, f"compression.{key}")
  for spec in REGISTRY.values():
    if spec.options is not None:
      spec.options.check(cfg, errs)
