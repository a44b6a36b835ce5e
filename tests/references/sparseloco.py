"""Numpy transcription of SparseLoCo's outer step (Sarfi, Therien, Lidin, Belilovsky,
"Communication Efficient LLM Pre-training with SparseLoCo", arXiv:2508.15706).

Reference: github.com/tplr-ai/SparseLoCo, "Initial commit: SparseLoCo", commit
276fa59977f84a601fb81f3a7e9379b204b4e91c (read from the fork QErywan/RobustDiLoCo, which keeps
that commit unchanged for these files; tplr-ai/SparseLoCo itself could not be mirrored here).
Files: src/tplr/sparseloco.py (ChunkingTransform, TopKCompressor, SparseLoCo.step),
src/tplr/strategies.py (Diloco.outer_step), train.py (optimizer construction, strategy flags),
hparams/512M/sweeps/sparseloco.yaml (the paper's run).

Details an implementer could get wrong:
- Pseudo-gradient: ``grad = anchor - local`` (Diloco.outer_step), the model is reset to the
  anchor, then SGD does ``anchor -= lr * aggregate``.
- EF: ``e *= error_decay`` (skipped when it is exactly 1.0), then ``e += lr * grad``: the outer
  lr enters the EF AND the SGD step (lr**2 overall; the sweep uses lr=1).
- No DCT: strategy "sparseloco" forces use_dct=False (DCT is the DeMo baseline only).
- Chunking: each dim s gets the largest divisor of s that is <= chunk_size (s itself if
  s <= chunk_size), same rule per dim. 2-D: "(y h) (x w) -> y x (h w)", chunk index
  i*w + j; 1-D: "(c s) -> c s". Only 1-D/2-D tensors are supported by the reference.
- k per chunk: ``int(max(1, round(chunk_len * top_k / chunk_size**2)))`` with Python's
  round (half to even), chunk_len = h*w (2-D) or s (1-D), then clamped to [1, chunk_len].
- Top-k by |e| per chunk (torch.topk, sorted=False: tie order unspecified; here ties go to
  the lower index); the SIGNED values are kept.
- Quantiser: ONE shift/scale/lookup per parameter tensor (over all chunks' kept values):
  shift = mean(v); c = v - shift; std = ||c||_2 / sqrt(numel - 1) (0 if numel <= 1);
  scale = range * std / n_bins (-> 1.0 if 0/nan/inf); code = clip(round_half_even(
  c / scale + n_bins // 2), 0, n_bins - 1) as uint8; lookup[b] = mean of c over code b (0 if
  empty), float32. Decoded value = lookup[code] + shift (bin MEAN, not bin centre).
- EF keeps the POST-quantisation residual: e -= decode(dequant(codes)).
- Sent per tensor: indices int64, codes uint8 (2-bit codes NOT packed), and
  cat([shift], lookup) as 1 + n_bins float32; scale/offset are not sent. All-gather.
- Aggregate: scatter_reduce "mean", include_self=False, over the concatenation of all
  workers' (idx, value): a MEAN OVER THE CONTRIBUTORS at each position (not / n), 0 where
  nobody sent. No outer momentum (outer_momentum default 0.0), use_sign False,
  decoupled weight decay 0.0 for DiLoCo runs (train.py: outer_weight_decay = 0 if is_diloco).
- Defaults: SparseLoCo class / train.py argparse: error_decay=0.999, top_k=32, chunk_size=64,
  use_quantization=False, quantization_bins=256, quantization_range=6, outer lr 0.7 (argparse),
  outer_momentum 0.0. The paper's sweep (used as defaults here): outer_learning_rate=1,
  error_decay=0.95, top_k=128, chunk_size=64, use_quantization=True, quantization_bins=4,
  quantization_range=6, inner_steps=15 (inner AdamW lr 1e-3, betas (0.9, 0.95), wd 0.1, clip 1).
- No random draws (use_randomk=False); only the top-k tie rule is implementation-defined.
"""
from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def chunk_dim(s: int, chunk_size: int) -> int:
  """Largest divisor of ``s`` that is <= ``chunk_size`` (``_get_smaller_split``)."""
  divisors = [d for d in range(1, s + 1) if s % d == 0]
  for ix, val in enumerate(divisors):
    if val == chunk_size:
      return val
    if val > chunk_size:
      return val if ix == 0 else divisors[ix - 1]
  return s


def chunk_layout(shape: tuple, chunk_size: int) -> tuple[tuple[int, ...], int]:
  """(chunk dims, chunk_len): ((h, w), h*w) for 2-D, ((s1,), s1) for 1-D (ChunkingTransform)."""
  if len(shape) not in (1, 2):
    raise ValueError("reference ChunkingTransform handles 1-D and 2-D tensors only")
  dims = tuple(chunk_dim(int(s), chunk_size) for s in shape)
  return dims, int(np.prod(dims))


def topk_per_chunk(chunk_len: int, top_k: int, chunk_size: int) -> int:
  """k of SparseLoCo.step (use_dct=False) then TopKCompressor._clamp_topk."""
  k = int(max(1, round(chunk_len * top_k / (chunk_size ** 2))))
  return min(max(k, 1), chunk_len)


def encode_chunks(x: np.ndarray, chunk_size: int) -> np.ndarray:
  """Param (R, C) -> (Y*X, h*w) or (S,) -> (S/s1, s1); rows are chunks in (y, x) order."""
  (dims, _) = chunk_layout(x.shape, chunk_size)
  if x.ndim == 1:
    return x.reshape(-1, dims[0])
  (h, w) = dims
  y, xx = x.shape[0] // h, x.shape[1] // w
  return x.reshape(y, h, xx, w).transpose(0, 2, 1, 3).reshape(y * xx, h * w)


def decode_chunks(chunks: np.ndarray, shape: tuple, chunk_size: int) -> np.ndarray:
  """Inverse of :func:`encode_chunks` (ChunkingTransform.decode without DCT)."""
  (dims, _) = chunk_layout(shape, chunk_size)
  if len(shape) == 1:
    return chunks.reshape(shape)
  (h, w) = dims
  y, xx = shape[0] // h, shape[1] // w
  return chunks.reshape(y, xx, h, w).transpose(0, 2, 1, 3).reshape(shape)


def topk_select(chunks: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """(idx int64 (C, k), signed values (C, k)) by largest |x| per chunk (TopKCompressor.compress).

  Ties: lower index first (torch.topk sorted=False leaves this unspecified)."""
  idx = np.argsort(-np.abs(chunks), axis=-1, kind="stable")[:, :k].astype(np.int64)
  return idx, np.take_along_axis(chunks, idx, axis=-1)


def quantize(val: np.ndarray, n_bins: int = 4, range_in_sigmas: float = 6
             ) -> tuple[np.ndarray, np.float32, np.ndarray, np.float32]:
  """TopKCompressor._quantize: val (any shape, float32) -> (codes uint8 same shape,
  shift float32, lookup float32 (n_bins,), scale float32 (not transmitted)).

  Bin edges: code b is chosen where c/scale + n_bins//2 rounds (half to even) to b, i.e. edges
  at c/scale = b - n_bins//2 + 0.5; for n_bins=4: c/scale = -1.5, -0.5, +0.5 (scale = 1.5 std,
  so c = -2.25, -0.75, +0.75 std). Exactly on an edge: round-half-even picks the even code."""
  val = val.astype(F32)
  offset = n_bins // 2
  shift = F32(val.mean(dtype=F32))
  centered = (val - shift).astype(F32)
  if centered.size <= 1:
    std = F32(0.0)
  else:
    std = F32(F32(np.linalg.norm(centered.ravel())) / F32(math.sqrt(centered.size - 1)))
  scale = F32(F32(F32(range_in_sigmas) * std) / F32(n_bins))
  if scale == 0 or np.isnan(scale) or np.isinf(scale):
    scale = F32(1.0)
  q = np.round(centered / scale + F32(offset))
  codes = np.clip(q, 0, n_bins - 1).astype(np.uint8)
  sums = np.zeros(n_bins, F32)
  counts = np.zeros(n_bins, F32)
  np.add.at(sums, codes.ravel().astype(np.int64), centered.ravel())
  np.add.at(counts, codes.ravel().astype(np.int64), F32(1.0))
  with np.errstate(invalid="ignore", divide="ignore"):
    lookup = np.where(counts > 0, sums / counts, F32(0.0)).astype(F32)
  return codes, shift, lookup, scale


def dequantize(codes: np.ndarray, shift: np.float32, lookup: np.ndarray) -> np.ndarray:
  """TopKCompressor._dequantize: lookup[codes] + shift (float32, same shape as codes)."""
  return (lookup[codes.astype(np.int64)] + F32(shift)).astype(F32)


def scatter_mean(idx_list: list[np.ndarray], val_list: list[np.ndarray], chunk_len: int
                 ) -> np.ndarray:
  """TopKCompressor.batch_decompress: cat along last dim, scatter_reduce('mean',
  include_self=False). idx/val (C, k) each -> (C, chunk_len); mean over contributors, 0 else."""
  idx = np.concatenate(idx_list, axis=-1)
  val = np.concatenate([v.astype(F32) for v in val_list], axis=-1)
  rows = np.broadcast_to(np.arange(idx.shape[0])[:, None], idx.shape)
  sums = np.zeros((idx.shape[0], chunk_len), F32)
  counts = np.zeros((idx.shape[0], chunk_len), F32)
  np.add.at(sums, (rows, idx), val)
  np.add.at(counts, (rows, idx), F32(1.0))
  return (sums / np.maximum(counts, F32(1.0))).astype(F32)


def compress(e: np.ndarray, *, top_k: int = 128, chunk_size: int = 64,
             use_quantization: bool = True, quantization_bins: int = 4,
             quantization_range: float = 6) -> dict:
  """One worker's message for one tensor e (the EF buffer after adding lr*grad).

  Returns {"idx": int64 (C, k), "val": uint8 codes or float32 values (C, k),
  "shift": float32 | None, "lookup": float32 (n_bins,) | None, "deq": float32 (C, k) (the
  values the receivers reconstruct)}."""
  chunks = encode_chunks(e.astype(F32), chunk_size)
  k = topk_per_chunk(chunks.shape[1], top_k, chunk_size)
  idx, val = topk_select(chunks, k)
  msg = {"idx": idx, "val": val, "shift": None, "lookup": None, "deq": val}
  if use_quantization:
    codes, shift, lookup, _ = quantize(val, quantization_bins, quantization_range)
    msg.update(val=codes, shift=shift, lookup=lookup, deq=dequantize(codes, shift, lookup))
  return msg


def decode(msgs: list[dict], shape: tuple, chunk_size: int = 64) -> np.ndarray:
  """Mean-over-contributors decode of a list of messages into a param-shaped float32 array
  (used with one message for the local EF reconstruction, with all n for the aggregate)."""
  (_, chunk_len) = chunk_layout(shape, chunk_size)
  dense = scatter_mean([m["idx"] for m in msgs], [m["deq"] for m in msgs], chunk_len)
  return decode_chunks(dense, tuple(shape), chunk_size)


def sparseloco_outer_step(anchor: list[np.ndarray], models: list[list[np.ndarray]],
                          ef: list[list[np.ndarray]], *, lr: float = 1.0,
                          error_decay: float = 0.95, top_k: int = 128, chunk_size: int = 64,
                          use_quantization: bool = True, quantization_bins: int = 4,
                          quantization_range: float = 6, weight_decay: float = 0.0,
                          use_sign: bool = False
                          ) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
  """One outer step of all n workers (Diloco.outer_step + SparseLoCo.step, all-gather explicit).

  anchor[j]: parameter j (1-D or 2-D, float32); models[i][j], ef[i][j]: worker i's local model
  and EF buffer. Returns (new_anchor[j], new_ef[i][j]); inputs are not modified."""
  n = len(models)
  new_ef = [[None] * len(anchor) for _ in range(n)]
  new_anchor = []
  for j, a in enumerate(anchor):
    a = a.astype(F32)
    msgs = []
    for i in range(n):
      grad = (a - models[i][j].astype(F32)).astype(F32)
      e = ef[i][j].astype(F32)
      if error_decay != 1.0:
        e = (e * F32(error_decay)).astype(F32)
      e = (e + F32(lr) * grad).astype(F32)
      msg = compress(e, top_k=top_k, chunk_size=chunk_size, use_quantization=use_quantization,
                     quantization_bins=quantization_bins, quantization_range=quantization_range)
      new_ef[i][j] = (e - decode([msg], a.shape, chunk_size)).astype(F32)
      msgs.append(msg)
    agg = decode(msgs, a.shape, chunk_size)
    if use_sign:
      agg = np.sign(agg).astype(F32)
    p = a if weight_decay == 0.0 else (a * F32(1.0 - lr * weight_decay)).astype(F32)
    new_anchor.append((p - F32(lr) * agg).astype(F32))
  return new_anchor, new_ef


def message_bytes(shapes: list[tuple], *, top_k: int = 128, chunk_size: int = 64,
                  use_quantization: bool = True, quantization_bins: int = 4,
                  param_bytes: int = 4) -> int:
  """Bytes of one worker's message per outer step, reference format: per tensor C*k int64
  indices (8 B) + C*k values (uint8 codes, 1 B each, unpacked; param dtype if unquantised)
  + (1 + n_bins) float32 (shift, lookup) when quantised."""
  total = 0
  for shape in shapes:
    (_, chunk_len) = chunk_layout(tuple(shape), chunk_size)
    n_chunks = int(np.prod(shape)) // chunk_len
    nk = n_chunks * topk_per_chunk(chunk_len, top_k, chunk_size)
    if use_quantization:
      total += 8 * nk + 1 * nk + 4 * (1 + quantization_bins)
    else:
      total += 8 * nk + param_bytes * nk
  return total


def bytes_per_worker(shapes: list[tuple], n: int, **kw) -> int:
  """Bytes each worker sends per outer step: dist.all_gather -> its message to the n-1 others."""
  return (n - 1) * message_bytes(shapes, **kw)
