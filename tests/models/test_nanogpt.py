"""nanoGPT's model, exactly (issue 43, item 1): ``config.lm``'s options and
``text_unknown_id=False`` make ``model="transformer"`` karpathy/nanoGPT's ``GPT``.

The reference is a numpy transcription, written from the source and not from our code, of
repository karpathy/nanoGPT, file ``model.py`` at commit
``f08abb45bd2285627d17da16daea14dda7e7253e`` (the last commit to touch ``model.py``; the
repository's head was ``3adf61e154c3fe3fca428ad6bc3818b27a3b8291``): ``GPT.forward`` (with
targets: logits at every position), ``Block``, ``CausalSelfAttention`` (the manual branch:
``att = (q @ k^T) / sqrt(hs)``, causal mask, softmax), ``MLP`` (``nn.GELU()``: exact, erf),
``LayerNorm`` (``F.layer_norm``, eps 1e-5, optional bias), ``nn.Linear`` (``x W^T + b``,
``W [out, in]``), the weight tying ``wte.weight = lm_head.weight`` and ``_init_weights``; and
``data/shakespeare_char/prepare.py`` (``chars = sorted(list(set(data)))``, ``stoi``, the 90 %
split). Our parameters are mapped into arrays named and shaped like nanoGPT's ``state_dict``.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from nbsgd_jax import config as config_lib
from nbsgd_jax import data
from nbsgd_jax.data import disk as disk_data
from nbsgd_jax import models
from nbsgd_jax.data import text as text_data

from tests.helpers import ROOT, experiment_config

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py

NANOGPT_PARAMS = 804_096  # wte 65*128 + wpe 64*128 + 4 x 196,864 + ln_f 128
ORIGINAL_PARAMS = 818_498  # the original model (config.lm defaults, 66 ids) at these sizes
DEFAULTS = {"lm.bias": True, "lm.tie_embeddings": False, "lm.init": "flax", "lm.gelu": "tanh",
            "lm.layernorm_eps": 1e-6, "text_unknown_id": True}


def _config(**overrides):
  """``experiments/configs/shakespeare_char.py``'s config with dotted ``overrides``."""
  cfg = experiment_config("shakespeare_char")
  for key, value in overrides.items():
    *sections, name = key.split(".")
    node = cfg
    for s in sections:
      node = node[s]
    node[name] = value
  return cfg


def _build(cfg, seed=0, batch=2):
  """The run's model (vocabulary from the data, as a run builds it), its params and tokens
  int32 ``[batch, context]``."""
  ds = data.load_text_dataset(cfg.dataset, unknown_id=cfg.text_unknown_id)
  model = models.make_model("transformer", ds.vocab_size, lm=cfg.lm)
  tokens = jax.random.randint(jax.random.key(seed + 1), (batch, cfg.lm.context), 0,
                              ds.vocab_size)
  params, _ = models.init(model, jax.random.key(seed), tokens)
  return model, params, np.asarray(tokens)


# ------------------------------------------------------------ nanoGPT model.py, in numpy


def _layer_norm(x, weight, bias):
  """``F.layer_norm(x, weight.shape, weight, bias, 1e-5)``: biased variance, ``[..., C]``."""
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(var + 1e-5) * weight
  return y if bias is None else y + bias


def _linear(x, sd, name):
  """``nn.Linear``: ``x [..., in] @ W.T + b``, ``W = sd[name.weight] [out, in]``."""
  y = x @ sd[f"{name}.weight"].T
  return y + sd[f"{name}.bias"] if f"{name}.bias" in sd else y


def _attention(x, sd, name, n_head):
  """``CausalSelfAttention.forward`` (manual branch, dropout 0): ``[B, T, C] -> [B, T, C]``."""
  b, t, c = x.shape
  q, k, v = np.split(_linear(x, sd, f"{name}.c_attn"), 3, axis=2)
  heads = lambda a: a.reshape(b, t, n_head, c // n_head).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
  q, k, v = heads(q), heads(k), heads(v)
  att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(k.shape[-1]))
  att = np.where(np.tril(np.ones((t, t))) == 0, -np.inf, att)
  att = np.exp(att - att.max(-1, keepdims=True))
  att = att / att.sum(-1, keepdims=True)
  y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
  return _linear(y, sd, f"{name}.c_proj")


def _mlp(x, sd, name):
  """``MLP.forward``: ``c_proj(GELU(c_fc(x)))``, ``nn.GELU()`` exact: ``x Phi(x)``."""
  h = _linear(x, sd, f"{name}.c_fc")
  return _linear(0.5 * h * (1.0 + erf(h / math.sqrt(2.0))), sd, f"{name}.c_proj")


def nanogpt_forward(sd, idx, n_layer, n_head):
  """``GPT.forward(idx, targets)``'s logits ``[B, T, vocab]`` from a ``state_dict`` ``sd``."""
  t = idx.shape[1]
  x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][np.arange(t)]
  for i in range(n_layer):
    h = f"transformer.h.{i}"
    x = x + _attention(_layer_norm(x, sd[f"{h}.ln_1.weight"], sd.get(f"{h}.ln_1.bias")), sd,
                       f"{h}.attn", n_head)
    x = x + _mlp(_layer_norm(x, sd[f"{h}.ln_2.weight"], sd.get(f"{h}.ln_2.bias")), sd,
                 f"{h}.mlp")
  x = _layer_norm(x, sd["transformer.ln_f.weight"], sd.get("transformer.ln_f.bias"))
  return _linear(x, sd, "lm_head")


# ------------------------------------------------------------ our params as nanoGPT's


def _state_dict(params):
  """Our ``TransformerLM`` params as nanoGPT's ``state_dict`` (float64 numpy; ``lm_head.weight``
  is ``transformer.wte.weight``, tied). Every leaf is used once (checked)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
  used = []

  def take(*path):
    node = p
    for k in path:
      node = node[k]
    used.append(path)
    return node

  def opt(*path):  # a bias: absent when bias=False
    node = p
    for k in path[:-1]:
      node = node[k]
    return take(*path) if path[-1] in node else None

  sd = {"transformer.wte.weight": take("Embed_0", "embedding"),
        "transformer.wpe.weight": take("position"),
        "transformer.ln_f.weight": take("LayerNorm_0", "scale"),
        "transformer.ln_f.bias": opt("LayerNorm_0", "bias")}
  n_layer = sum(k.startswith("DecoderBlock_") for k in p)
  for i in range(n_layer):
    blk, h = f"DecoderBlock_{i}", f"transformer.h.{i}"
    att = (blk, "MultiHeadDotProductAttention_0")
    d = p[blk]["LayerNorm_0"]["scale"].shape[0]
    sd.update({
        f"{h}.ln_1.weight": take(blk, "LayerNorm_0", "scale"),
        f"{h}.ln_1.bias": opt(blk, "LayerNorm_0", "bias"),
        f"{h}.ln_2.weight": take(blk, "LayerNorm_1", "scale"),
        f"{h}.ln_2.bias": opt(blk, "LayerNorm_1", "bias"),
        # query/key/value kernels [d, heads, hs] -> c_attn.weight [3d, d] (q | k | v rows)
        f"{h}.attn.c_attn.weight": np.concatenate(
            [take(*att, n, "kernel").reshape(d, d) for n in ("query", "key", "value")], 1).T,
        f"{h}.attn.c_proj.weight": take(*att, "out", "kernel").reshape(d, d).T,
        f"{h}.mlp.c_fc.weight": take(blk, "Dense_1", "kernel").T,
        f"{h}.mlp.c_proj.weight": take(blk, "Dense_0", "kernel").T,
    })
    biases = [opt(*att, n, "bias") for n in ("query", "key", "value")]
    sd[f"{h}.attn.c_attn.bias"] = (None if biases[0] is None else
                                   np.concatenate([b.reshape(d) for b in biases]))
    sd[f"{h}.attn.c_proj.bias"] = opt(*att, "out", "bias")
    sd[f"{h}.mlp.c_fc.bias"] = opt(blk, "Dense_1", "bias")
    sd[f"{h}.mlp.c_proj.bias"] = opt(blk, "Dense_0", "bias")
  sd = {k: v for k, v in sd.items() if v is not None}
  assert len(used) == len(jax.tree.leaves(p)), "a parameter has no nanoGPT name"
  sd["lm_head.weight"] = sd["transformer.wte.weight"]
  return sd


def _nanogpt_shapes(vocab, block, n_layer, d, bias):
  """nanoGPT's ``state_dict`` shapes (``nn.Linear``: ``[out, in]``)."""
  s = {"transformer.wte.weight": (vocab, d), "transformer.wpe.weight": (block, d),
       "transformer.ln_f.weight": (d,), "lm_head.weight": (vocab, d)}
  for i in range(n_layer):
    h = f"transformer.h.{i}"
    s.update({f"{h}.ln_1.weight": (d,), f"{h}.ln_2.weight": (d,),
              f"{h}.attn.c_attn.weight": (3 * d, d), f"{h}.attn.c_proj.weight": (d, d),
              f"{h}.mlp.c_fc.weight": (4 * d, d), f"{h}.mlp.c_proj.weight": (d, 4 * d)})
    if bias:
      s.update({f"{h}.ln_1.bias": (d,), f"{h}.ln_2.bias": (d,),
                f"{h}.attn.c_attn.bias": (3 * d,), f"{h}.attn.c_proj.bias": (d,),
                f"{h}.mlp.c_fc.bias": (4 * d,), f"{h}.mlp.c_proj.bias": (d,)})
  if bias:
    s["transformer.ln_f.bias"] = (d,)
  return s


# ------------------------------------------------------------ tests


@pytest.mark.parametrize("bias", [False, pytest.param(True, marks=pytest.mark.long)])
def test_logits_match_nanogpt_model_py(bias):
  """nanoGPT's forward pass on our (perturbed) weights gives our logits: bias=False (the
  shakespeare_char setting) and nanoGPT's bias=True."""
  cfg = _config(**{"lm.bias": bias})
  model, params, tokens = _build(cfg)
  leaves, tree = jax.tree.flatten(params)  # move every weight off its init (LN scales too)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  params = jax.tree.unflatten(tree, [w + 0.05 * jax.random.normal(k, w.shape)
                                     for w, k in zip(leaves, keys)])
  sd = _state_dict(params)
  want_shapes = _nanogpt_shapes(65, cfg.lm.context, cfg.lm.num_layers, cfg.lm.d_model, bias)
  assert {k: v.shape for k, v in sd.items()} == want_shapes
  want = nanogpt_forward(sd, tokens, cfg.lm.num_layers, cfg.lm.num_heads)
  got = np.asarray(model.apply(params, jnp.asarray(tokens)))
  assert got.shape == (2, cfg.lm.context, 65) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_shakespeare_char_has_nanogpts_parameter_count():
  _, params, _ = _build(_config())
  assert models.num_params(params) == NANOGPT_PARAMS
  sd = _state_dict(params)  # the same count as nanoGPT's sum(p.numel() for p in parameters())
  assert sum(v.size for k, v in sd.items() if k != "lm_head.weight") == NANOGPT_PARAMS


def test_nanogpt_init_statistics():
  """``_init_weights``: weights N(0, 0.02), ``c_proj`` N(0, 0.02 / sqrt(2 n_layer)); LayerNorm
  weights one; no biases (bias=False)."""
  cfg = _config()
  _, params, _ = _build(cfg)
  sd = _state_dict(params)
  assert not any(k.endswith(".bias") for k in sd)
  proj = [v for k, v in sd.items() if k.endswith("c_proj.weight")]
  assert len(proj) == 2 * cfg.lm.num_layers
  pooled = np.concatenate([v.ravel() for v in proj])
  np.testing.assert_allclose(pooled.std(), 0.02 / math.sqrt(2 * cfg.lm.num_layers), rtol=0.02)
  assert abs(pooled.mean()) < 1e-4
  for k, v in sd.items():
    if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") or k.endswith("ln_f.weight"):
      np.testing.assert_array_equal(v, 1.0)
    elif not k.endswith("c_proj.weight"):
      np.testing.assert_allclose(v.std(), 0.02, rtol=0.05, err_msg=k)
      assert abs(v.mean()) < 2e-3, k


@pytest.mark.long
def test_tied_output_layer_is_the_token_embedding():
  """One array: no output layer of its own, and the gradient of the output reaches the
  embedding rows that no input token uses."""
  cfg = _config()
  model, params, _ = _build(cfg)
  assert set(params["params"]) == {"Embed_0", "position", "LayerNorm_0"} | {
      f"DecoderBlock_{i}" for i in range(cfg.lm.num_layers)}
  tokens = jnp.zeros((2, 8), jnp.int32).at[:, ::2].set(1)  # inputs use rows 0 and 1 only
  weights = jax.random.normal(jax.random.key(3), (2, 8, 65))
  grad = jax.grad(lambda p: jnp.sum(model.apply(p, tokens) * weights))(params)
  g = np.asarray(grad["params"]["Embed_0"]["embedding"])
  assert np.all(np.abs(g[2:]).sum(-1) > 0)
  untied = models.make_model("transformer", 65, lm=_config(**{"lm.tie_embeddings": False}).lm)
  p_untied, _ = models.init(untied, jax.random.key(0), tokens)
  assert models.num_params(p_untied) == NANOGPT_PARAMS + 65 * cfg.lm.d_model  # bias=False
  assert "Dense_0" in p_untied["params"]


def test_defaults_keep_the_original_model():
  """The new knobs at their defaults: the original 66-id model, 818,498 parameters."""
  cfg = _config(**DEFAULTS)
  flat = config_lib.flatten_dict(config_lib.default_config().to_dict())
  assert {k: flat[k] for k in DEFAULTS} == DEFAULTS
  _, params, _ = _build(cfg)
  assert models.num_params(params) == ORIGINAL_PARAMS
  blk = params["params"]["DecoderBlock_0"]
  assert blk["Dense_0"]["kernel"].shape == (4 * 128, 128)  # the original names: c_proj first
  assert "bias" in blk["MultiHeadDotProductAttention_0"]["out"]
  assert "Dense_0" in params["params"]  # the untied output layer


class DecoderBlock(models.nn.Module):  # named so: flax names the blocks DecoderBlock_<i>
  """The original ``DecoderBlock`` (nbsgd_jax/models.py at commit 9509caad), verbatim."""

  num_heads: int
  dtype: object = jnp.float32

  @models.nn.compact
  def __call__(self, x):
    nn = models.nn
    d = x.shape[-1]
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
    h = nn.LayerNorm(dtype=self.dtype)(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype)(
        h, h, mask=mask)
    h = nn.LayerNorm(dtype=self.dtype)(x)
    h = nn.Dense(d, dtype=self.dtype)(nn.gelu(nn.Dense(4 * d, dtype=self.dtype)(h)))
    return x + h


class _OriginalLM(models.nn.Module):
  """The original ``TransformerLM`` (nbsgd_jax/models.py at commit 9509caad), verbatim."""

  vocab_size: int
  context: int = 64
  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  dtype: object = jnp.float32

  @models.nn.compact
  def __call__(self, tokens):
    nn = models.nn
    t = tokens.shape[1]
    x = nn.Embed(self.vocab_size, self.d_model)(tokens)
    pos = self.param("position", nn.initializers.normal(0.02), (self.context, self.d_model))
    x = (x + pos[:t]).astype(self.dtype)
    for _ in range(self.num_layers):
      x = DecoderBlock(self.num_heads, self.dtype)(x)
    x = nn.LayerNorm(dtype=self.dtype)(x)
    return nn.Dense(self.vocab_size, dtype=self.dtype)(x).astype(jnp.float32)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.long)])
def test_defaults_are_bit_for_bit_the_original_model(dtype):
  """Same parameter names, same initial values, same logits: old records reproduce."""
  lm = models.LMSizes(context=16, num_layers=2, d_model=32, num_heads=4)
  new = models.make_model("transformer", 11, lm=lm, dtype=dtype)
  old = _OriginalLM(vocab_size=11, context=16, num_layers=2, d_model=32, num_heads=4,
                    dtype=models.DTYPES[dtype])
  x = jax.random.randint(jax.random.key(1), (3, 16), 0, 11)
  p_new, p_old = new.init(jax.random.key(0), x), old.init(jax.random.key(0), x)
  assert jax.tree.structure(p_new) == jax.tree.structure(p_old)
  for a, b in zip(jax.tree.leaves(p_new), jax.tree.leaves(p_old)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(new.apply(p_new, x), old.apply(p_old, x))


def test_vocabulary_is_nanogpts_stoi():
  """``text_unknown_id=False``: ``prepare.py``'s 65 ids; the default keeps the reserved id."""
  path = os.path.join(ROOT, "nbsgd_jax", "assets", "tiny_shakespeare.txt.gz")
  text = disk_data.read_text(path)
  chars = sorted(list(set(text)))
  stoi = {ch: i for i, ch in enumerate(chars)}
  n = len(text)
  ds = data.load_text_dataset("tiny_shakespeare", unknown_id=False)
  assert ds.vocab_size == len(chars) == 65 and ds.vocab == "".join(chars)
  np.testing.assert_array_equal(ds.train_tokens, [stoi[c] for c in text[:int(n * 0.9)]])
  np.testing.assert_array_equal(ds.test_tokens, [stoi[c] for c in text[int(n * 0.9):]])
  default = data.load_text_dataset("tiny_shakespeare")
  assert default.vocab_size == 66
  np.testing.assert_array_equal(default.train_tokens, ds.train_tokens)


def test_no_unknown_id_refuses_unknown_test_characters(monkeypatch):
  monkeypatch.setattr(text_data.tfds_data, "read_text_splits",
                      lambda name, short, data_dir: ("abca", "abz"))
  assert data.load_text_dataset("tfds:fake").vocab_size == 4
  with pytest.raises(ValueError, match=r"unknown_id=False is not allowed with "
                                       r"dataset='tfds:fake'.*\['z'\]"):
    data.load_text_dataset("tfds:fake", unknown_id=False)
  monkeypatch.setattr(text_data.tfds_data, "read_text_splits",
                      lambda name, short, data_dir: ("abca", "ab"))
  assert data.load_text_dataset("tfds:fake", unknown_id=False).vocab_size == 3


def test_a_run_builds_nanogpts_model():
  """Through the run's own set-up (``text_unknown_id`` reaches the data)."""
  from nbsgd_jax.run import setup as setup_lib
  s = setup_lib.setup(_config())
  assert s.dataset.vocab_size == 65
  params = jax.eval_shape(lambda: models.init(
      s.model, jax.random.key(0), jnp.zeros((1, 64), jnp.int32))[0])
  assert models.num_params(params) == NANOGPT_PARAMS


BAD = [("bias", "yes", "use True or False"), ("tie_embeddings", 1, "use True or False"),
       ("init", "torch", r"use one of \['flax', 'nanogpt'\]"),
       ("gelu", "relu", r"use one of \['tanh', 'exact'\]"),
       ("layernorm_eps", 0.0, "> 0"), ("layernorm_eps", -1e-5, "> 0")]


@pytest.mark.parametrize("field, value, allowed", BAD)
def test_bad_lm_option_is_named(field, value, allowed):
  with pytest.raises(ValueError, match=rf"^lm\.{field}={value!r} is not allowed: .*{allowed}"):
    models.make_model("transformer", 65, lm=models.LMSizes()._replace(**{field: value}))
  cfg = config_lib.default_config()
  cfg.model, cfg.dataset = "transformer", "tiny_shakespeare"
  with cfg.ignore_type():
    cfg.lm[field] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert any(line.startswith(f"config.lm.{field}={value!r} is not allowed") and
             allowed.replace("\\", "") in line for line in e.value.errors), e.value.errors


def test_bad_text_unknown_id_is_named():
  cfg = config_lib.default_config()
  with cfg.ignore_type():
    cfg.text_unknown_id = "no"
  with pytest.raises(config_lib.ConfigError, match=r"config\.text_unknown_id='no' is not "
                                                   r"allowed: use True or False"):
    config_lib.validate(cfg)
