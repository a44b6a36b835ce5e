"""Simulated workers: n per-worker CNNs (jax.vmap) against one CNN on n b examples.

Faster ways to simulate n per-worker convolutions than the grouped convolution of
``jax.vmap``::

    python benchmarks/simulated_workers.py            # n = 8, b = 32, about 1.5 min on 2 cores
    python benchmarks/simulated_workers.py --profile  # where the time goes (XLA op times)
    python benchmarks/simulated_workers.py --framework simulate   # the framework's own step

The framework simulates n workers on one device by ``jax.vmap`` over per-worker parameters;
a vmapped convolution whose kernel is batched too becomes one grouped convolution
(``feature_group_count = n``). This script times one training step's jitted
``value_and_grad`` (forward + backward of the softmax cross-entropy) of the LeNet-5 CNN
(:class:`nbsgd_jax.models.CNN`) for n workers x b examples, several ways, against the
baseline ``a``, one worker on n b examples (``build_variants`` lists them all):

* ``a``: baseline, ``jax.value_and_grad(loss)(params, x[n b])`` (the flax model);
* ``b``: ``jax.vmap(jax.value_and_grad(loss))`` over per-worker params and batches (the
  framework: grouped convolutions);
* ``c``: ``lax.map`` over workers (sequential ordinary convolutions of b examples);
* ``d``: convolution as im2col (patches of all n b images by
  ``lax.conv_general_dilated_patches``, which needs no weights) and a batched matmul
  ``einsum('nbpk,nkc->nbpc')`` with the per-worker kernels;
* ``e1``-``e10``: im2col by shifted slices; an im2col CNN under the framework's vmap; NCHW
  layout; the worker axis folded into the channels with a block-diagonal kernel (one ordinary
  convolution doing n times the arithmetic); n ordinary convolutions unrolled in the graph;
  the same under the framework's vmap through a convolution with a custom vmap rule
  (:func:`nbsgd_jax.models.per_worker.conv_general_dilated`, a drop-in ``conv_general_dilated`` for
  flax's ``nn.Conv``: ``config.conv_impl="per_worker"``); and some of these with max-pooling
  as reshape + max instead of ``reduce_window`` (``config.pool_impl="reshape"``; compared with
  the baseline ``a2``, which pools that way too);
* ``x1``-``x4`` (``--variants all``): the im2col one-worker baseline, differentiating through
  a vmapped convolution (grad outside vmap), the grouped convolution on the folded layout,
  the all-pairs convolution.

Variants use the flax model or a small functional CNN with explicit weights (the flax
model's parameter tree, the same math). Before timing, the script checks that every variant
gives the same per-worker losses and gradients as ``c`` on distinct per-worker weights, and
that the one-worker baselines equal the mean of ``c``'s losses and gradients when all workers
hold the same weights (``allclose``, rtol 1e-4, atol 1e-5). Timing: all variants are compiled
first (the compile column: the first call); then ``--reps`` rounds, each timing every variant
(in a fresh random order) over enough calls to last about ``--round_s`` seconds. A time is
the median (and min) over rounds of the time per call; a ratio is the median over rounds of
the ratio of two variants' times in the same round (robust to a shared machine's load
drifting between rounds).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import re
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--profile" in sys.argv:  # XLA:CPU emits per-op trace events only with this flag
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_cpu_enable_xprof_traceme=true").strip()
if "mesh" in sys.argv and "--framework" in sys.argv:  # one host device per worker
  _n = sys.argv[sys.argv.index("--n") + 1] if "--n" in sys.argv else "8"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={_n}").strip()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from nbsgd_jax import models  # noqa: E402
from nbsgd_jax.models.per_worker import (  # noqa: E402
    conv_general_dilated as per_worker_conv_general_dilated)
from nbsgd_jax.models.per_worker import max_pool as pool_reshape  # noqa: E402

NHWC = ("NHWC", "HWIO", "NHWC")
RTOL, ATOL = 1e-4, 1e-5


def xent(logits, y):
  """Mean softmax cross-entropy of integer labels."""
  logp = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


# --------------------------------------------------------------------------------------------
# One worker's convolution, x [b, H, W, C], k [kh, kw, C, O] (HWIO, the flax kernel) -> [b, H',
# W', O]. Under jax.vmap over workers (x and k batched), lax.conv becomes a grouped convolution
# and the im2col matmuls become batched matmuls (dot_general with a batch dimension).
# --------------------------------------------------------------------------------------------

def conv_lax(x, k, padding):
  """Ordinary convolution (what flax's nn.Conv does)."""
  return lax.conv_general_dilated(x, k, (1, 1), padding, dimension_numbers=NHWC)


def conv_nchw(x, k, padding):
  """The same in NCHW / OIHW layout."""
  y = lax.conv_general_dilated(x.transpose(0, 3, 1, 2), k.transpose(3, 2, 0, 1), (1, 1),
                               padding, dimension_numbers=("NCHW", "OIHW", "NCHW"))
  return y.transpose(0, 2, 3, 1)


class CNNOpt(nn.Module):
  """:class:`nbsgd_jax.models.CNN` (same layers, same parameter tree) with two options: the
  convolution function of ``nn.Conv`` and the max-pool."""

  conv_general_dilated: Any = None
  pool: Any = None

  @nn.compact
  def __call__(self, x):
    pool = self.pool or (lambda h: nn.max_pool(h, (2, 2), strides=(2, 2)))
    conv = lambda c, pad: nn.Conv(c, (5, 5), padding=pad,
                                  conv_general_dilated=self.conv_general_dilated)
    x = pool(nn.relu(conv(6, "SAME")(x)))
    x = pool(nn.relu(conv(16, "VALID")(x)))
    x = x.reshape((x.shape[0], -1))
    for h in (120, 84):
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(10)(x)


def _pad_same(x, kh, kw):
  cfg = [(0, 0)] * (x.ndim - 3) + [((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2), (0, 0)]
  return jnp.pad(x, cfg)


def patches_slices(x, kh, kw, padding):
  """im2col by kh kw shifted slices: [..., H, W, C] -> [..., H', W', kh kw C], feature order
  (kh, kw, C) (the HWIO kernel's own order)."""
  if padding == "SAME":
    x = _pad_same(x, kh, kw)
  ho, wo = x.shape[-3] - kh + 1, x.shape[-2] - kw + 1
  p = jnp.stack([x[..., i:i + ho, j:j + wo, :] for i in range(kh) for j in range(kw)], axis=-2)
  return p.reshape(*p.shape[:-2], kh * kw * x.shape[-1])


def patches_xla(x, kh, kw, padding):
  """im2col by lax.conv_general_dilated_patches, [b, H, W, C] -> [b, H', W', C kh kw],
  feature order (C, kh, kw). (It is itself a convolution with a 0/1 kernel and
  feature_group_count = C: an ordinary one only when C = 1.)"""
  return lax.conv_general_dilated_patches(x, (kh, kw), (1, 1), padding, dimension_numbers=NHWC)


def kernel_matrix(k, order):
  """HWIO kernel [..., kh, kw, C, O] as a matrix [..., K, O] in the patches' feature order."""
  *lead, kh, kw, c, o = k.shape
  if order == "CHW":
    nd = len(lead)
    k = k.transpose(*range(nd), nd + 2, nd, nd + 1, nd + 3)
  return k.reshape(*lead, kh * kw * c, o)


def conv_im2col(x, k, padding, how="slices"):
  """Convolution as patches [b, P, K] @ kernel [K, O]."""
  kh, kw = k.shape[:2]
  if how == "slices":
    p, order = patches_slices(x, kh, kw, padding), "HWC"
  else:
    p, order = patches_xla(x, kh, kw, padding), "CHW"
  b, ho, wo, kk = p.shape
  y = p.reshape(b, ho * wo, kk) @ kernel_matrix(k, order)
  return y.reshape(b, ho, wo, -1)


def conv_im2col_mixed(x, k, padding):
  """conv_general_dilated_patches when C = 1 (an ordinary convolution), shifted slices
  otherwise (C > 1 would make the patches op a grouped convolution)."""
  return conv_im2col(x, k, padding, "xla" if x.shape[-1] == 1 else "slices")


def pool_window(x):
  """2x2 max-pool, stride 2 (flax's nn.max_pool: lax.reduce_window)."""
  win = (1,) * (x.ndim - 3) + (2, 2, 1)
  return lax.reduce_window(x, -jnp.inf, lax.max, win, win, "VALID")


def forward_one(conv, pool=pool_window):
  """One worker's CNN, ``params`` the flax model's tree, x [b, 28, 28, 1] -> logits [b, 10]."""
  def f(params, x):
    p = params["params"]
    h = pool(jax.nn.relu(conv(x, p["Conv_0"]["kernel"], "SAME") + p["Conv_0"]["bias"]))
    h = pool(jax.nn.relu(conv(h, p["Conv_1"]["kernel"], "VALID") + p["Conv_1"]["bias"]))
    h = h.reshape(h.shape[0], -1)
    for i, name in enumerate(("Dense_0", "Dense_1", "Dense_2")):
      h = h @ p[name]["kernel"] + p[name]["bias"]
      h = jax.nn.relu(h) if i < 2 else h
    return h
  return f


# --------------------------------------------------------------------------------------------
# n workers at once: params with a leading worker axis [n, ...], images [n, b, H, W, C],
# differentiated as a whole (the gradient of the sum of the per-worker losses is each worker's
# own gradient: workers share no weights).
# --------------------------------------------------------------------------------------------

def sconv_einsum(x, k, padding, how="xla"):
  """im2col of all n b images (the patches need no weights), then einsum('nbpk,nkc->nbpc')
  with each worker's kernel matrix."""
  n, b, h, w, c = x.shape
  kh, kw = k.shape[1:3]
  if how == "xla":
    p, order = patches_xla(x.reshape(n * b, h, w, c), kh, kw, padding), "CHW"
  else:
    p, order = patches_slices(x, kh, kw, padding), "HWC"
  ho, wo, kk = p.shape[-3:]
  p = p.reshape(n, b, ho * wo, kk)
  y = jnp.einsum("nbpk,nkc->nbpc", p, kernel_matrix(k, order))
  return y.reshape(n, b, ho, wo, -1)


def sconv_vmap(x, k, padding):
  """jax.vmap of conv_lax, differentiated from outside (grad of vmap): the weight gradient
  is a convolution with batch_group_count = n."""
  return jax.vmap(lambda xi, ki: conv_lax(xi, ki, padding))(x, k)


def sconv_unrolled(x, k, padding):
  """n ordinary convolutions of b images, one per worker, unrolled in the graph (no loop)."""
  return jnp.stack([conv_lax(x[i], k[i], padding) for i in range(x.shape[0])])


def sconv_allpairs(x, k, padding):
  """One ordinary convolution of all n b images with all n kernels ([kh, kw, C, n O]); keep
  each image's own worker's channels (n times the arithmetic)."""
  n, b, h, w, c = x.shape
  _, kh, kw, _, o = k.shape
  y = conv_lax(x.reshape(n * b, h, w, c), k.transpose(1, 2, 3, 0, 4).reshape(kh, kw, c, n * o),
               padding)
  y = y.reshape(n, b, *y.shape[1:3], n, o)
  return jnp.einsum("nbhwno->nbhwo", y)  # the diagonal worker of image = worker of kernel


def fold(x):
  """[n, b, H, W, C] -> [b, H, W, n C] (worker-major channels)."""
  n, b, h, w, c = x.shape
  return x.transpose(1, 2, 3, 0, 4).reshape(b, h, w, n * c)


def unfold(x, n):
  b, h, w, nc = x.shape
  return x.reshape(b, h, w, n, nc // n).transpose(3, 0, 1, 2, 4)


def fconv_grouped(xf, k, padding):
  """Folded layout [b, H, W, n C]; grouped convolution, kernel [kh, kw, C, n O]."""
  n, kh, kw, c, o = k.shape
  kk = k.transpose(1, 2, 3, 0, 4).reshape(kh, kw, c, n * o)
  return lax.conv_general_dilated(xf, kk, (1, 1), padding, dimension_numbers=NHWC,
                                  feature_group_count=n)


def fconv_blockdiag(xf, k, padding):
  """Folded layout [b, H, W, n C]; ordinary convolution with the block-diagonal kernel
  [kh, kw, n C, n O] (n times the arithmetic; the zero blocks get no gradient)."""
  n, kh, kw, c, o = k.shape
  kk = jnp.einsum("ij,ihwco->hwicjo", jnp.eye(n, dtype=k.dtype), k).reshape(kh, kw, n * c, n * o)
  return conv_lax(xf, kk, padding)


def dense_tail(p, h):
  """h [n, b, features] through the three dense layers (batched matmuls)."""
  for i, name in enumerate(("Dense_0", "Dense_1", "Dense_2")):
    h = jnp.einsum("nbi,nio->nbo", h, p[name]["kernel"]) + p[name]["bias"][:, None, :]
    h = jax.nn.relu(h) if i < 2 else h
  return h


def forward_stacked(conv, pool=pool_window):
  """n workers' logits [n, b, 10]; conv on [n, b, H, W, C] with kernels [n, kh, kw, C, O]."""
  def f(params, x):
    p = params["params"]
    bias = lambda name: p[name]["bias"][:, None, None, None]
    h = pool(jax.nn.relu(conv(x, p["Conv_0"]["kernel"], "SAME") + bias("Conv_0")))
    h = pool(jax.nn.relu(conv(h, p["Conv_1"]["kernel"], "VALID") + bias("Conv_1")))
    return dense_tail(p, h.reshape(*h.shape[:2], -1))
  return f


def forward_folded(conv, pool=pool_window):
  """n workers' logits [n, b, 10]; both convolutions on the folded layout [b, H, W, n C]."""
  def f(params, x):
    p = params["params"]
    n = x.shape[0]
    bias = lambda name: p[name]["bias"].reshape(-1)  # [n O], worker-major like the channels
    h = fold(x)
    h = pool(jax.nn.relu(conv(h, p["Conv_0"]["kernel"], "SAME") + bias("Conv_0")))
    h = pool(jax.nn.relu(conv(h, p["Conv_1"]["kernel"], "VALID") + bias("Conv_1")))
    h = unfold(h, n)
    return dense_tail(p, h.reshape(n, h.shape[1], -1))
  return f


# --------------------------------------------------------------------------------------------
# The variants. kind "one": fn(params, x [n b, ...], y [n b]) -> (loss, grads), one worker
# on all examples; any other kind: fn(params [n, ...], x [n, b, ...], y [n, b]) ->
# (losses [n], grads [n, ...]).
# --------------------------------------------------------------------------------------------

def vg_one(forward):
  return jax.value_and_grad(lambda p, x, y: xent(forward(p, x), y))


def vg_vmap(forward):
  """The framework's way: vmap the per-worker value_and_grad."""
  return jax.vmap(vg_one(forward))


def vg_stacked(forward):
  """value_and_grad of the sum of the per-worker losses of a stacked forward."""
  def f(params, x, y):
    def total(p):
      losses = jax.vmap(xent)(forward(p, x), y)
      return losses.sum(), losses
    (_, losses), g = jax.value_and_grad(total, has_aux=True)(params)
    return losses, g
  return f


def build_variants(model):
  """name -> (kind, description, fn, ref): ref is the one-worker baseline with the same
  max-pool (``a``: flax's ``reduce_window``; ``a2``: reshape + max). ``DEFAULT`` are timed by
  default, the others with ``--variants all``."""
  vg1 = vg_one(model.apply)
  vg1_rpool = vg_one(CNNOpt(pool=pool_reshape).apply)
  unrolled = CNNOpt(per_worker_conv_general_dilated)
  unrolled_rpool = CNNOpt(per_worker_conv_general_dilated, pool_reshape)
  mixed = lambda pool: forward_one(conv_im2col_mixed, pool)
  return {
      "a": ("one", "baseline: 1 worker x n b examples (flax CNN)", vg1, "a"),
      "a2": ("one", "baseline with max-pool as reshape + max", vg1_rpool, "a2"),
      "b": ("vmap", "**the framework's default** (conv_impl=batched): jax.vmap(value_and_grad), grouped convs", jax.vmap(vg1),
            "a"),
      "c": ("map", "lax.map over workers (sequential convs of b examples)",
            lambda p, x, y: lax.map(lambda a: vg1(*a), (p, x, y)), "a"),
      "d": ("stacked", "im2col by conv_general_dilated_patches + einsum nbpk,nkc->nbpc",
            vg_stacked(forward_stacked(sconv_einsum)), "a"),
      "e1": ("stacked", "im2col by 25 shifted slices + einsum",
             vg_stacked(forward_stacked(lambda x, k, pd: sconv_einsum(x, k, pd, "slices"))), "a"),
      "e2": ("vmap", "vmap(value_and_grad) of an im2col CNN (patches conv1, slices conv2)",
             vg_vmap(mixed(pool_window)), "a"),
      "e3": ("vmap", "vmap(value_and_grad), convs in NCHW / OIHW layout (grouped)",
             vg_vmap(forward_one(conv_nchw)), "a"),
      "e4": ("stacked", "workers folded into channels, block-diagonal kernel (n x arithmetic)",
             vg_stacked(forward_folded(fconv_blockdiag)), "a"),
      "e5": ("stacked", "n ordinary convs, one per worker, unrolled in the graph",
             vg_stacked(forward_stacked(sconv_unrolled)), "a"),
      "e6": ("vmap", "**conv_impl=per_worker**: vmap(value_and_grad), nn.Conv(conv_general_"
             "dilated=per_worker.conv_general_dilated): n unrolled convs",
             jax.vmap(vg_one(unrolled.apply)), "a"),
      "e7": ("vmap", "as b, max-pool as reshape + max", jax.vmap(vg1_rpool), "a2"),
      "e8": ("vmap", "as e2, max-pool as reshape + max", vg_vmap(mixed(pool_reshape)), "a2"),
      "e9": ("stacked", "as e4, max-pool as reshape + max",
             vg_stacked(forward_folded(fconv_blockdiag, pool_reshape)), "a2"),
      "e10": ("vmap", "**conv_impl=per_worker, pool_impl=reshape**: as e6, max-pool as "
              "reshape + max", jax.vmap(vg_one(unrolled_rpool.apply)),
              "a2"),
      # --variants all:
      "x1": ("one", "baseline, im2col CNN as e2, max-pool as reshape + max",
             vg_one(mixed(pool_reshape)), "a2"),
      "x2": ("stacked", "grad of vmap(conv) (grad outside vmap): weight grad batch_group_count",
             vg_stacked(forward_stacked(sconv_vmap)), "a"),
      "x3": ("stacked", "workers folded into channels, grouped conv (grad outside)",
             vg_stacked(forward_folded(fconv_grouped)), "a"),
      "x4": ("stacked", "all-pairs conv: n b images x n kernels, keep the diagonal",
             vg_stacked(forward_stacked(sconv_allpairs)), "a"),
  }


DEFAULT = ("a", "a2", "b", "c", "d", "e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9", "e10")


# --------------------------------------------------------------------------------------------

def make_data(model, n, b, seed=0):
  """Images x [n, b, 28, 28, 1], labels y [n, b], one worker's params, n workers' distinct
  params, and the one worker's params replicated n times."""
  kx, ky, kp = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(kx, (n, b, 28, 28, 1), jnp.float32)
  y = jax.random.randint(ky, (n, b), 0, 10)
  init = lambda k: models.init(model, k, x[0, :1])[0]
  p1 = init(kp)
  pstack = jax.vmap(init)(jax.random.split(kp, n))
  prep = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), p1)
  return x, y, p1, pstack, prep


def _close(u, v):
  lu, lv = jax.tree.leaves(u), jax.tree.leaves(v)
  return len(lu) == len(lv) and all(np.allclose(a, b, RTOL, ATOL) for a, b in zip(lu, lv))


def check(variants, fns, data):
  """Failures (empty: all close): stacked variants against c on distinct weights, one-worker
  variants against the mean of c's losses and gradients on replicated weights."""
  x, y, p1, pstack, prep = data
  n, b = y.shape
  bad = []
  ref = fns["c"](pstack, x, y)
  rep = fns["c"](prep, x, y)
  rep = (rep[0].mean(), jax.tree.map(lambda a: a.mean(0), rep[1]))
  for name, (kind, *_) in variants.items():
    if name == "c" or name not in fns:
      continue
    if kind == "one":
      out, want = fns[name](p1, x.reshape(n * b, 28, 28, 1), y.reshape(n * b)), rep
    else:
      out, want = fns[name](pstack, x, y), ref
    if not _close(out, want):
      err = max(float(jnp.max(jnp.abs(u - v)))
                for u, v in zip(jax.tree.leaves(out), jax.tree.leaves(want)))
      bad.append(f"{name}: max abs difference {err:.2e}")
  return bad


def _categories(hlo_text: str) -> dict:
  """HLO instruction name -> "conv", "dot", "max-pool" (reduce-window, iota, scatter: the
  reduce_window max-pool and its gradient) or "other", by what it (or its fusion) computes."""
  bodies, cur = {}, None
  for line in hlo_text.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
    if m:
      cur = bodies.setdefault(m.group(1), [])
    elif cur is not None:
      cur.append(line)
  cats = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
    if not m:
      continue
    called = re.search(r"calls=%([\w.\-]+)", line)
    body = m.group(2) + ("\n".join(bodies.get(called.group(1), [])) if called else "")
    cats.setdefault(m.group(1), "conv" if "convolution(" in body else "dot" if "dot(" in body
                    else "max-pool" if re.search(r"reduce-window\(|iota\(|scatter\(", body)
                    else "other")
  return cats


def profile(fns, inputs, names, calls: int) -> list:
  """Markdown rows: per step, the time of XLA's ops summed over threads (jax.profiler; XLA:CPU
  trace events), by category."""
  import glob
  import tempfile
  from jax.profiler import ProfileData
  rows = ["| variant | op time, all threads (ms / step) | conv | dot | max-pool (+ grad) | other |",
          "|---|---:|---:|---:|---:|---:|"]
  for k in names:
    cats = _categories(fns[k].lower(*inputs[k]).compile().as_text())
    with tempfile.TemporaryDirectory() as d:
      with jax.profiler.trace(d):
        for _ in range(calls):
          out = fns[k](*inputs[k])
        jax.block_until_ready(out)
      pd = ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
      agg = {c: 0.0 for c in ("conv", "dot", "max-pool", "other")}
      for plane in pd.planes:
        for line in plane.lines:
          if line.name == "python":
            continue
          for ev in line.events:
            if "ThunkExecutor" not in ev.name and "Await" not in ev.name:
              agg[cats.get(ev.name, "other")] += ev.duration_ns / calls / 1e6
    rows.append(f"| {k} | {sum(agg.values()):.1f} | " + " | ".join(f"{v:.1f}" for v in agg.values())
                + " |")
    print(rows[-1], flush=True)
  return rows


def framework(backend: str, n: int, b: int, steps: int, reps: int) -> list:
  """The framework's training step (default config: D-PSGD on a ring, the CNN, mnist10k) with
  the default CNN and with ``conv_impl="per_worker"`` (and ``pool_impl="reshape"``): markdown
  rows, ms / step median of ``reps`` runs of ``steps`` steps, interleaved, after a
  compile run; and the largest state difference after the compile run."""
  from nbsgd_jax import config as config_lib
  from nbsgd_jax import train
  cfg = config_lib.override(config_lib.default_config(), {
      "model": "cnn", "num_workers": n, "batch_size": b, "num_steps": steps,
      "eval_every": steps, "progress": False, "backend": backend})
  kinds = {"models.CNN (grouped convs)": {},
           "conv_impl=per_worker": {"conv_impl": "per_worker"},
           "conv_impl=per_worker, pool_impl=reshape": {"conv_impl": "per_worker",
                                                       "pool_impl": "reshape"}}
  built = {name: train.setup(config_lib.override(cfg, over)) for name, over in kinds.items()}

  def run(s):
    stepper = train.Stepper.of(s)
    jax.block_until_ready(stepper.state)
    t0 = time.perf_counter()
    stepper.steps(steps, read_each_dispatch=False)
    jax.block_until_ready(stepper.state)
    return (time.perf_counter() - t0) / steps, stepper.state

  finals = [run(built[k])[1] for k in built]  # compile
  diff = [max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(jax.tree.leaves(finals[0]),
                                                              jax.tree.leaves(f))
              if jnp.issubdtype(u.dtype, jnp.floating) and u.size) for f in finals]
  times = {k: [] for k in built}
  rng = random.Random(0)
  for _ in range(reps):
    for k in rng.sample(list(built), len(built)):
      times[k].append(run(built[k])[0])
  base = times[next(iter(times))]
  rows = [f"Framework step, backend {backend}, {n} workers x {b} examples, {steps} steps x "
          f"{reps} runs (ratio: median over runs of the ratio to the models.CNN run beside it); "
          f"train state after the {steps} compile-run steps against models.CNN's: max abs "
          "difference.", "",
          "| model | ms / step (median) | x models.CNN | state difference |",
          "|---|---:|---:|---:|"]
  for (k, v), d in zip(times.items(), diff):
    ratio = statistics.median(u / w for u, w in zip(v, base))
    rows.append(f"| {k} | {1e3 * statistics.median(v):.1f} | {ratio:.2f}x | {d:.1e} |")
  return rows


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as fh:
      return next(l.split(":", 1)[1].strip() for l in fh if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or "CPU"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=8, help="workers")
  ap.add_argument("--b", type=int, default=32, help="examples per worker")
  ap.add_argument("--reps", type=int, default=7, help="timed rounds (median)")
  ap.add_argument("--round_s", type=float, default=0.3,
                  help="seconds per variant per round (at least one call)")
  ap.add_argument("--variants", default="",
                  help="comma-separated names, or 'all' (default: " + ",".join(DEFAULT) + "); "
                  "the baselines they are compared with are added")
  ap.add_argument("--device", default=f"{jax.devices()[0].device_kind} ({_cpu_name()}, "
                  f"{os.cpu_count()} cores)", help="a note on the device, for the table")
  ap.add_argument("--profile", action="store_true",
                  help="instead of timing: XLA op time per step by category (jax.profiler)")
  ap.add_argument("--framework", default="", choices=["", "simulate", "mesh"],
                  help="instead: time the framework's own training step with each CNN")
  ap.add_argument("--steps", type=int, default=10, help="--framework: steps per run")
  ap.add_argument("--out", default="", help="also write the result block (markdown) here")
  args = ap.parse_args()

  model = models.CNN()
  n, b = args.n, args.b
  if args.framework:
    rows = framework(args.framework, n, b, args.steps, args.reps)
    text = "\n".join([f"Command: `python benchmarks/simulated_workers.py {' '.join(sys.argv[1:])}`"
                      f". Device: {args.device}, jax {jax.__version__}. Date: "
                      f"{datetime.date.today()}.", "", *rows, ""])
    print(text)
    if args.out:
      with open(args.out, "w") as fh:
        fh.write(text)
    return
  variants = build_variants(model)
  if args.variants == "all":
    names = list(variants)
  else:
    names = [s for s in args.variants.split(",") if s] or list(DEFAULT)
  for k in names:
    if k not in variants:
      raise SystemExit(f"unknown variant {k!r}: use some of {list(variants)}")
  refs = ["a"] + [variants[k][3] for k in names]
  names = [k for k in variants if k in names or k in refs]  # table order, baselines included
  fns = {k: jax.jit(variants[k][2]) for k in variants if k in names or k == "c"}
  data = make_data(model, n, b)
  x, y, p1, pstack, _ = data
  inputs = {k: ((p1, x.reshape(n * b, 28, 28, 1), y.reshape(n * b))
                if variants[k][0] == "one" else (pstack, x, y)) for k in fns}

  t0 = time.perf_counter()
  iters, compile_s = {}, {}
  for k in fns:  # compile (first call), warm up, size the rounds
    t = time.perf_counter()
    jax.block_until_ready(fns[k](*inputs[k]))
    compile_s[k] = time.perf_counter() - t
    t = time.perf_counter()
    jax.block_until_ready(fns[k](*inputs[k]))
    iters[k] = max(1, round(args.round_s / (time.perf_counter() - t)))
  print(f"compiled {len(fns)} variants in {time.perf_counter() - t0:.1f} s", flush=True)
  bad = check({k: variants[k] for k in names}, fns, data)
  verdict = (f"all variants allclose (rtol {RTOL:g}, atol {ATOL:g})" if not bad
             else "NOT CLOSE: " + "; ".join(bad))
  print("numerical check:", verdict, flush=True)

  if args.profile:
    rows = profile(fns, inputs, names, calls=10)
    text = "\n".join([f"Command: `python benchmarks/simulated_workers.py {' '.join(sys.argv[1:])}`"
                      f". Device: {args.device}, jax {jax.__version__}. Date: "
                      f"{datetime.date.today()}.", "", *rows, ""])
    print(text)
    if args.out:
      with open(args.out, "w") as fh:
        fh.write(text)
    return

  times = {k: [] for k in names}
  rng = random.Random(0)
  for r in range(args.reps):
    order = names[:]
    rng.shuffle(order)
    for k in order:
      f, inp = fns[k], inputs[k]
      t = time.perf_counter()
      for _ in range(iters[k]):
        out = f(*inp)
      jax.block_until_ready(out)
      times[k].append((time.perf_counter() - t) / iters[k])
    print(f"round {r + 1}/{args.reps}: " + " ".join(f"{k}={1e3 * times[k][-1]:.1f}"
                                                    for k in names), flush=True)

  med = {k: statistics.median(v) for k, v in times.items()}
  # Ratios: the median over rounds of (variant / baseline) in the same round, robust to the
  # load of a shared machine drifting between rounds.
  ratio = lambda k, ref: statistics.median(u / v for u, v in zip(times[k], times[ref]))
  rows = ["| variant | method | ms / step (median) | min | compile s | x a | "
          "x same-pool baseline |", "|---|---|---:|---:|---:|---:|---:|"]
  for k in names:
    ref = variants[k][3]
    rows.append(f"| {k} | {variants[k][1]} | {1e3 * med[k]:.1f} | {1e3 * min(times[k]):.1f} | "
                f"{compile_s[k]:.1f} | {ratio(k, 'a'):.2f}x | "
                + ("-" if ref == k else f"{ratio(k, ref):.2f}x ({ref})") + " |")
  cmd = " ".join(["python benchmarks/simulated_workers.py", *sys.argv[1:]])
  flags = os.environ.get("XLA_FLAGS")
  text = "\n".join([
      f"Command: `{(f'XLA_FLAGS={flags} ' if flags else '') + cmd}`. "
      f"Device: {args.device}, jax {jax.__version__}. Date: {datetime.date.today()}.",
      f"n = {n} workers x b = {b} examples; jitted value_and_grad of the CNN's "
      f"cross-entropy; ms: median (and min) of {args.reps} interleaved rounds; ratios: median "
      f"over rounds of the ratio within a round. Numerical check: {verdict}.",
      "", *rows, ""])
  print(text)
  if args.out:
    with open(args.out, "w") as fh:
      fh.write(text)


if __name__ == "__main__":
  main()
