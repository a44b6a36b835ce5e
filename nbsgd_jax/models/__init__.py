"""Flax (linen) models: image classifiers and a decoder-only language model.

Every image model maps images ``[B, H, W, C]`` (float32, preprocessed) to logits
``[B, num_classes]``; the language model maps tokens int32 ``[B, T]`` to next-token logits
``[B, T, vocab]``. Parameters are a plain pytree, so a stack of per-worker models is the same
pytree with a leading worker axis ``[n, ...]`` on every leaf.

Model state other than parameters (BatchNorm's running statistics, flax collection
``batch_stats``) is split off at :func:`init` and threaded by :func:`apply_train` /
:func:`apply_eval`: the trainer keeps it per worker, outside the communicated parameters.
Logits are float32 whatever the compute ``dtype`` (bfloat16 compute keeps float32 params).

* ``"logreg"``: multinomial logistic regression (one dense layer).
* ``"mlp"``: ReLU multi-layer perceptron, hidden sizes ``(256,)`` by default.
* ``"cnn"``: LeNet-style CNN (LeCun et al. 1998, "Gradient-based learning applied to document
  recognition", LeNet-5): 5x5 conv (6) - max-pool - 5x5 conv (16) - max-pool - dense 120 -
  dense 84 - logits. Channel counts are configurable.
* ``"resnet"``: the CIFAR ResNet-(6 k + 2) of He, Zhang, Ren, Sun, "Deep residual learning
  for image recognition", CVPR 2016, Sec. 4.2; depth 20 (ResNet-20) by default: 3x3 conv 16,
  three stages of k basic blocks (16, 32, 64 channels, stride 2 at stages 2 and 3), global
  average pooling, dense; shortcut option A (identity, strided and zero-padded in channels:
  no parameters). ResNet-20 (k = 3) has 269,722 parameters (the paper's 0.27 M) for 10
  classes. Normalisation ``"batch"`` (BatchNorm, momentum 0.9, running statistics as model
  state) or ``"group"`` (GroupNorm, Wu & He 2018; no state).
* ``"transformer"``: a decoder-only (GPT-style, pre-LayerNorm) transformer language model:
  token and learned position embeddings, ``num_layers`` blocks of causal multi-head
  self-attention and a 4x GELU MLP, final LayerNorm, dense to the vocabulary. ``config.lm``'s
  options (``bias``, ``tie_embeddings``, ``init``, ``gelu``, ``layernorm_eps``) make it
  karpathy/nanoGPT's ``GPT`` (``model.py``) exactly; their defaults keep the original model.

The convolutions of ``"cnn"`` and ``"resnet"`` and the max-pools of ``"cnn"`` have a second
implementation for many simulated workers on one device (``conv_impl="per_worker"``,
``pool_impl="reshape"``: :mod:`nbsgd_jax.models.per_worker`); the parameters and values are the same.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax import lax

from nbsgd_jax.core import checks
from nbsgd_jax.models import forms
from nbsgd_jax.models import per_worker


class LogisticRegression(nn.Module):
  """Multinomial logistic regression: ``logits = W vec(x) + b``."""

  num_classes: int = 10
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1)).astype(self.dtype)
    return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


class MLP(nn.Module):
  """Fully connected ReLU network with the given hidden sizes."""

  num_classes: int = 10
  hidden: Sequence[int] = (256,)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1)).astype(self.dtype)
    for h in self.hidden:
      x = nn.relu(nn.Dense(h, dtype=self.dtype)(x))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


class CNN(nn.Module):
  """LeNet-style convolutional network (LeNet-5 layout with ReLU and max-pooling)."""

  num_classes: int = 10
  channels: Sequence[int] = (6, 16)
  hidden: Sequence[int] = (120, 84)
  dtype: Any = jnp.float32
  conv: Any = lax.conv_general_dilated  # nn.Conv's convolution (per_worker.CONV_IMPLS)
  pool: Any = None  # 2x2 max-pool x -> x (None: nn.max_pool; per_worker.max_pool; _any_pool)

  @nn.compact
  def __call__(self, x):
    c1, c2 = self.channels
    conv = functools.partial(nn.Conv, kernel_size=(5, 5), dtype=self.dtype,
                             conv_general_dilated=self.conv)
    pool = self.pool or _window_pool
    x = x.astype(self.dtype)
    x = pool(nn.relu(conv(c1, padding="SAME")(x)))
    x = pool(nn.relu(conv(c2, padding="VALID")(x)))
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h, dtype=self.dtype)(x))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


NORMS = ("batch", "group")


def _norm(kind: str, groups: int, train: bool, dtype, name: str | None = None) -> nn.Module:
  """BatchNorm (running statistics in ``batch_stats``; batch statistics when ``train``) or
  GroupNorm with ``groups`` groups."""
  if kind == "batch":
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=dtype,
                        name=name)
  return nn.GroupNorm(num_groups=groups, epsilon=1e-5, dtype=dtype, name=name)


def _window_pool(x):
  return nn.max_pool(x, (2, 2), strides=(2, 2))


def _any_pool(x):
  """2x2 max-pool (``pool_impl="auto"``): reshape + max where the sizes are even, else
  ``nn.max_pool`` (the same values)."""
  if x.shape[-3] % 2 or x.shape[-2] % 2:
    return _window_pool(x)
  return per_worker.max_pool(x)


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with normalisation; shortcut option A (He et al. 2016, Sec. 4.2):
  identity, subsampled by ``stride`` and zero-padded to ``channels``. ``materialize``: the
  block's output stored once (:func:`nbsgd_jax.models.forms.materialize`, ``residuals=
  "materialized"``)."""

  channels: int
  stride: int = 1
  norm: str = "batch"
  groups: int = 2
  dtype: Any = jnp.float32
  conv: Any = lax.conv_general_dilated
  materialize: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False):
    conv = lambda s: nn.Conv(self.channels, (3, 3), strides=(s, s), padding=((1, 1), (1, 1)),
                             use_bias=False, dtype=self.dtype, conv_general_dilated=self.conv)
    y = nn.relu(_norm(self.norm, self.groups, train, self.dtype)(conv(self.stride)(x)))
    y = _norm(self.norm, self.groups, train, self.dtype)(conv(1)(y))
    if self.stride != 1 or x.shape[-1] != self.channels:
      x = x[:, ::self.stride, ::self.stride, :]
      extra = self.channels - x.shape[-1]
      x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
    out = nn.relu(x + y)
    return forms.materialize(out) if self.materialize else out


class ResNetCifar(nn.Module):
  """ResNet-(6 k + 2) for 32x32 images (He et al. 2016, Sec. 4.2); ``blocks=3``: ResNet-20."""

  num_classes: int = 10
  blocks: int = 3
  widths: Sequence[int] = (16, 32, 64)
  norm: str = "batch"
  groups: int = 2
  dtype: Any = jnp.float32
  conv: Any = lax.conv_general_dilated
  materialize: bool = False  # each block's output stored once (BasicBlock)

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.astype(self.dtype)
    x = nn.Conv(self.widths[0], (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                dtype=self.dtype, conv_general_dilated=self.conv)(x)
    x = nn.relu(_norm(self.norm, self.groups, train, self.dtype)(x))
    for stage, width in enumerate(self.widths):
      for b in range(self.blocks):
        stride = 2 if stage > 0 and b == 0 else 1
        x = BasicBlock(width, stride, self.norm, self.groups, self.dtype, self.conv,
                       self.materialize)(x, train)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


LM_INITS = ("flax", "nanogpt")  # config.lm.init
LM_GELUS = ("tanh", "exact")    # config.lm.gelu


def _lm_inits(init: str, num_layers: int) -> dict:
  """The initialisers of the language model's layers for ``lm.init``.

  ``"flax"``: Flax's defaults (no arguments). ``"nanogpt"``: karpathy/nanoGPT ``model.py``,
  ``GPT._init_weights``: every Linear and Embedding weight N(0, 0.02), biases zero (Flax's
  default too), and the residual projections (``c_proj``: the attention output and the MLP
  output) N(0, 0.02 / sqrt(2 num_layers)) (GPT-2's scaled init).

  Returns:
    ``{"dense", "proj", "attn", "embed"}``: keyword arguments of ``nn.Dense`` (an ordinary
    Linear), ``nn.Dense`` (a residual projection), ``nn.MultiHeadDotProductAttention`` and
    ``nn.Embed``.
  """
  if init == "flax":
    return {"dense": {}, "proj": {}, "attn": {}, "embed": {}}
  w = nn.initializers.normal(0.02)
  proj = nn.initializers.normal(0.02 / math.sqrt(2 * num_layers))
  return {"dense": {"kernel_init": w}, "proj": {"kernel_init": proj},
          "attn": {"kernel_init": w, "out_kernel_init": proj}, "embed": {"embedding_init": w}}


class DecoderBlock(nn.Module):
  """Pre-LayerNorm transformer block: causal self-attention, then a 4x GELU MLP.

  ``x [B, T, d] -> x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``, ``mlp(h) = c_proj(gelu(
  c_fc(h)))`` with ``c_fc: d -> 4 d``: nanoGPT's ``Block`` (karpathy/nanoGPT ``model.py``).
  Parameters: ``LayerNorm_0`` / ``LayerNorm_1`` (``ln_1`` / ``ln_2``),
  ``MultiHeadDotProductAttention_0``, whose ``query`` / ``key`` / ``value`` kernels
  ``[d, heads, d / heads]`` are the three thirds of nanoGPT's fused ``attn.c_attn`` and whose
  ``out`` kernel ``[heads, d / heads, d]`` is ``attn.c_proj``, ``Dense_1`` (``mlp.c_fc``) and
  ``Dense_0`` (``mlp.c_proj``). ``bias=False``: no bias in the Dense layers and LayerNorms
  (scale only); ``gelu``: ``"tanh"`` (approximate) or ``"exact"`` (erf); ``weight_init``:
  :func:`_lm_inits` with ``num_layers`` blocks in the model.
  """

  num_heads: int
  dtype: Any = jnp.float32
  bias: bool = True
  gelu: str = "tanh"
  layernorm_eps: float = 1e-6
  weight_init: str = "flax"  # lm.init ("init" would hide nn.Module.init)
  num_layers: int = 1

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    ini = _lm_inits(self.weight_init, self.num_layers)
    norm = functools.partial(nn.LayerNorm, epsilon=self.layernorm_eps, use_bias=self.bias,
                             dtype=self.dtype)
    dense = functools.partial(nn.Dense, use_bias=self.bias, dtype=self.dtype)
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
    h = norm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype,
                                            use_bias=self.bias, **ini["attn"])(h, h, mask=mask)
    h = norm()(x)
    # built c_proj first (named Dense_0, c_fc Dense_1): the original model's parameter names
    c_proj, c_fc = dense(d, **ini["proj"]), dense(4 * d, **ini["dense"])
    return x + c_proj(nn.gelu(c_fc(h), approximate=self.gelu == "tanh"))


class TransformerLM(nn.Module):
  """Decoder-only transformer language model: tokens int32 ``[B, T]`` (``T <= context``) ->
  next-token logits float32 ``[B, T, vocab_size]``.

  Token embedding plus a learned position embedding ``[context, d_model]`` (N(0, 0.02)),
  ``num_layers`` :class:`DecoderBlock`, a final LayerNorm, then the output layer: a Dense
  layer (with a bias when ``bias``), or with ``tie_embeddings`` the token embedding
  transposed (``x @ wte.T``, no bias). The defaults are this framework's original model;
  ``bias=False, tie_embeddings=True, weight_init="nanogpt", gelu="exact", layernorm_eps=1e-5``
  (``config.lm.init`` is ``weight_init``) is
  karpathy/nanoGPT's ``GPT`` (``model.py``) with ``bias=False``, dropout 0.
  """

  vocab_size: int
  context: int = 64
  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  dtype: Any = jnp.float32
  bias: bool = True
  tie_embeddings: bool = False
  weight_init: str = "flax"  # lm.init
  gelu: str = "tanh"
  layernorm_eps: float = 1e-6

  @nn.compact
  def __call__(self, tokens):
    t = tokens.shape[1]
    ini = _lm_inits(self.weight_init, self.num_layers)
    embed = nn.Embed(self.vocab_size, self.d_model, **ini["embed"])
    x = embed(tokens)
    pos = self.param("position", nn.initializers.normal(0.02), (self.context, self.d_model))
    x = (x + pos[:t]).astype(self.dtype)
    for _ in range(self.num_layers):
      x = DecoderBlock(self.num_heads, self.dtype, self.bias, self.gelu, self.layernorm_eps,
                       self.weight_init, self.num_layers)(x)
    x = nn.LayerNorm(epsilon=self.layernorm_eps, use_bias=self.bias, dtype=self.dtype)(x)
    if self.tie_embeddings:
      logits = x @ embed.embedding.astype(self.dtype).T
    else:
      logits = nn.Dense(self.vocab_size, use_bias=self.bias, dtype=self.dtype,
                        **ini["dense"])(x)
    return logits.astype(jnp.float32)


MODELS = ("logreg", "mlp", "cnn", "resnet", "transformer")
COMPUTE_DTYPES = ("float32", "bfloat16")  # config.compute_dtype
IMAGE_MODELS = ("logreg", "mlp", "cnn", "resnet")
GIVEN = "module"  # config.model of a flax module given to train(model=...)
REGISTRY: dict = {}  # config.model name -> factory(num_classes, cfg) -> nn.Module


def register_model(name: str, factory) -> None:
  """Make ``config.model=name`` build ``factory(num_classes, cfg)``, a flax ``nn.Module``
  mapping a batch of inputs ``[B, ...]`` to logits ``[B, num_classes]`` (``[B, T, vocab]``
  for a token model); ``num_classes`` is the data set's (its vocabulary size for text). From
  the CLI, name the module that calls this in ``config.imports``.

  Raises:
    ValueError: ``name`` is a built-in model or ``"module"``, or not a non-empty string;
      ``factory`` is not callable.
  """
  checks.register(REGISTRY, "model", name, factory, MODELS + (GIVEN,), "factory",
                  "factory(num_classes, cfg)")


def model_names() -> tuple:
  """Every allowed ``config.model``: the built-in ones, the registered ones and ``"module"``."""
  return MODELS + tuple(REGISTRY) + (GIVEN,)


class LMSizes(NamedTuple):
  """The language model's sizes and options (``config.lm``'s keys and defaults)."""

  context: int = 64
  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  bias: bool = True
  tie_embeddings: bool = False
  init: str = "flax"
  gelu: str = "tanh"
  layernorm_eps: float = 1e-6


LM_OPTIONS = ("bias", "tie_embeddings", "init", "gelu", "layernorm_eps")


def _lm_options(lm: Any) -> dict:
  """``lm``'s options (:data:`LM_OPTIONS`; an absent one takes :class:`LMSizes`' default).

  Raises:
    ValueError: a bad value, naming ``lm.<field>``, the value and what is allowed.
  """
  opts = {k: getattr(lm, k, LMSizes._field_defaults[k]) for k in LM_OPTIONS}
  for k in ("bias", "tie_embeddings"):
    if not isinstance(opts[k], bool):
      raise checks.not_allowed(f"lm.{k}", opts[k], "use True or False")
  for k, allowed in (("init", LM_INITS), ("gelu", LM_GELUS)):
    if opts[k] not in allowed:
      raise checks.not_allowed(f"lm.{k}", opts[k], f"use one of {list(allowed)}")
  eps = opts["layernorm_eps"]
  if not (checks.is_num(eps) and 0 < eps < math.inf):
    raise checks.not_allowed("lm.layernorm_eps", eps, "it must be a finite number > 0")
  return opts
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def make_model(name: str, num_classes: int, mlp_hidden: Sequence[int] = (256,),
               cnn_channels: Sequence[int] = (6, 16), norm: str = "batch",
               norm_groups: int = 2, dtype: str = "float32", lm: Any = None,
               depth: int = 20, conv_impl: str = "batched",
               pool_impl: str = "auto", residuals: str = "fused") -> nn.Module:
  """Build a model by name (``config.model``).

  Args:
    name: one of ``MODELS``.
    num_classes: number of output logits (the vocabulary size of ``"transformer"``).
    mlp_hidden: hidden layer sizes of ``"mlp"``.
    cnn_channels: the two convolution widths of ``"cnn"``.
    norm: ``"batch"`` or ``"group"``, the normalisation of ``"resnet"``.
    depth: ``"resnet"``'s depth ``6 k + 2`` (20: ResNet-20).
    norm_groups: groups of ``norm="group"`` (divides 16).
    dtype: compute dtype, ``"float32"`` or ``"bfloat16"`` (parameters stay float32).
    lm: ``"transformer"``'s sizes and options: an object with ``context``, ``num_layers``,
      ``d_model``, ``num_heads`` and optionally :data:`LM_OPTIONS` (``config.lm``; None or an
      absent option: :class:`LMSizes`' defaults).
    conv_impl: ``"batched"`` (``lax.conv_general_dilated``: a grouped convolution under
      ``vmap``) or ``"per_worker"`` (:func:`nbsgd_jax.models.per_worker.conv_general_dilated`), the
      convolutions of ``"cnn"`` and ``"resnet"``.
    pool_impl: ``"window"`` (``nn.max_pool``), ``"reshape"``
      (:func:`nbsgd_jax.models.per_worker.max_pool`) or ``"auto"`` (reshape where the sizes are
      even, else window), the max-pools of ``"cnn"``.
    residuals: ``"fused"`` or ``"materialized"`` (:func:`nbsgd_jax.models.forms.materialize` on
      each block's output), the residual stream of ``"resnet"``
      (:mod:`nbsgd_jax.models.forms`: ``"materialized"`` on a CPU).

  Raises:
    ValueError: an unknown name, norm or dtype, or bad sizes or ``lm`` options (named).
  """
  if dtype not in DTYPES:
    raise ValueError(f"compute_dtype={dtype!r} is not allowed: use one of {list(DTYPES)}")
  dt = DTYPES[dtype]
  if conv_impl not in per_worker.CONV_IMPLS:
    raise ValueError(f"conv_impl={conv_impl!r} is not allowed: use one of "
                     f"{list(per_worker.CONV_IMPLS)} (a run resolves 'auto' with "
                     "nbsgd_jax.models.forms.resolve)")
  if pool_impl not in forms.POOL_CHOICES:
    raise ValueError(f"pool_impl={pool_impl!r} is not allowed: use one of "
                     f"{list(forms.POOL_CHOICES)}")
  if residuals not in forms.RESIDUALS:
    raise ValueError(f"residuals={residuals!r} is not allowed: use one of "
                     f"{list(forms.RESIDUALS)}")
  conv = (per_worker.conv_general_dilated if conv_impl == "per_worker"
          else lax.conv_general_dilated)
  pool = {"reshape": per_worker.max_pool, "auto": _any_pool}.get(pool_impl, _window_pool)
  if name == "logreg":
    return LogisticRegression(num_classes=num_classes, dtype=dt)
  if name == "mlp":
    return MLP(num_classes=num_classes, hidden=tuple(mlp_hidden), dtype=dt)
  if name == "cnn":
    if len(cnn_channels) != 2:
      raise ValueError(f"cnn_channels={tuple(cnn_channels)!r} is not allowed: give two widths")
    return CNN(num_classes=num_classes, channels=tuple(cnn_channels), dtype=dt, conv=conv,
               pool=pool)
  if name == "resnet":
    if depth < 8 or (depth - 2) % 6:
      raise ValueError(f"resnet_depth={depth} is not allowed: it must be 6 k + 2, k >= 1")
    if norm not in NORMS:
      raise ValueError(f"norm={norm!r} is not allowed: use one of {list(NORMS)}")
    if norm == "group" and 16 % norm_groups:
      raise ValueError(f"norm_groups={norm_groups} is not allowed: it must divide 16")
    return ResNetCifar(num_classes=num_classes, blocks=(depth - 2) // 6, norm=norm,
                       groups=norm_groups, dtype=dt, conv=conv,
                       materialize=residuals == "materialized")
  if name == "transformer":
    lm = LMSizes() if lm is None else lm
    if lm.d_model % lm.num_heads:
      raise ValueError(f"lm.d_model={lm.d_model} is not allowed with lm.num_heads="
                       f"{lm.num_heads}: the heads must divide it")
    opts = _lm_options(lm)
    opts["weight_init"] = opts.pop("init")
    return TransformerLM(vocab_size=num_classes, context=lm.context, num_layers=lm.num_layers,
                         d_model=lm.d_model, num_heads=lm.num_heads, dtype=dt, **opts)
  raise ValueError(f"model={name!r} is not allowed: use one of {list(MODELS)}")


def lm_defaults() -> ml_collections.ConfigDict:
  """``config.lm.*`` with their defaults: model=transformer: sizes and options of the language
  model (the options' defaults keep the original model; ``experiments/configs/
  shakespeare_char.py`` sets nanoGPT's)."""
  s = ml_collections.ConfigDict()
  s.context = 64                 # tokens per training sequence T (and positions learned)
  s.num_layers = 2               # transformer blocks
  s.d_model = 128                # width
  s.num_heads = 4                # attention heads (divide d_model)
  s.bias = True                  # biases in the Dense layers and LayerNorms (False: none, the
                                 # LayerNorms scale only: nanoGPT's bias=False)
  s.tie_embeddings = False       # output layer = the token embedding transposed, no bias
                                 # (nanoGPT's weight tying); False: its own Dense layer
  s.init = "flax"                # flax (Flax's default initialisers) | nanogpt (nanoGPT's
                                 # _init_weights: weights N(0, 0.02), the residual projections
                                 # N(0, 0.02 / sqrt(2 num_layers)), biases zero)
  s.gelu = "tanh"                # the MLP's GELU: tanh (approximate) | exact (erf, nanoGPT's)
  s.layernorm_eps = 1e-6         # the LayerNorms' epsilon (nanoGPT: 1e-5)
  return s


def check_lm_config(cfg, errs: list) -> None:
  """lm.*: the language model's sizes and options."""
  ok = [checks.integer(cfg, errs, f"lm.{k}", 1) for k in ("context", "num_layers", "d_model",
                                                          "num_heads")]
  if all(ok) and cfg.lm.d_model % cfg.lm.num_heads:
    errs.append(f"config.lm.num_heads={cfg.lm.num_heads} is not allowed with config.lm."
                f"d_model={cfg.lm.d_model}: the heads must divide the width")
  for k in ("bias", "tie_embeddings"):
    checks.boolean(cfg, errs, f"lm.{k}")
  checks.choice(cfg, errs, "lm.init", LM_INITS)
  checks.choice(cfg, errs, "lm.gelu", LM_GELUS)
  checks.number(cfg, errs, "lm.layernorm_eps", 0.0, lo_open=True)


def init(model: nn.Module, key: jax.Array, sample: jax.Array) -> tuple[dict, dict]:
  """``(params, model_state)`` of a fresh model: ``params = {"params": ...}`` (what is
  trained and communicated) and the other flax collections (``{"batch_stats": ...}`` with
  BatchNorm; ``{}`` for a stateless model)."""
  variables = model.init(key, sample)
  params = {"params": variables["params"]}
  return params, {k: v for k, v in variables.items() if k != "params"}


def apply_train(model: nn.Module, params: dict, model_state: dict, x: jax.Array):
  """``(logits, model_state)`` in training mode: BatchNorm normalises with the batch's
  statistics and updates its running averages; a stateless model returns ``model_state``
  (``{}``) unchanged."""
  if not model_state:
    return model.apply(params, x), model_state
  return model.apply({**params, **model_state}, x, train=True, mutable=list(model_state))


def apply_eval(model: nn.Module, params: dict, model_state: dict, x: jax.Array) -> jax.Array:
  """Logits in evaluation mode (BatchNorm with its running statistics)."""
  if not model_state:
    return model.apply(params, x)
  return model.apply({**params, **model_state}, x, train=False)


def num_params(params) -> int:
  """Number of scalars in a parameter pytree (one worker's model)."""
  return int(sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(params)))
