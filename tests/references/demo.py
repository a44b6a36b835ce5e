"""numpy transcription of DeMo (Decoupled Momentum Optimization).

Reference: github.com/bloc97/DeMo, file ``demo.py`` (classes ``DeMo``, ``TransformDCT``,
``CompressDCT``; functions ``_dct``, ``_idct``, ``_get_prime_divisors``, ``_get_divisors``,
``_get_smaller_split``), commit 0e48145d702b25f83055e11d9585a9c11bcfe154 (identical code is
in ``olmo/demo_utils.py`` / ``olmo/optim.py`` of ``0001-DeMo.patch`` in the same commit).
Paper: Peng, Quesnelle, Kingma, "DeMo: Decoupled Momentum Optimization", arXiv:2411.19870.

Details an implementer can get wrong (all as in the reference):
1. Defaults: ``compression_decay=0.999`` (must be in [0, 1)), ``compression_topk=32`` (> 0),
   ``compression_chunk=64`` (> 0), ``weight_decay=0.0``; ``lr`` is the param group's lr.
2. Chunk size per dimension size ``s``: the LARGEST divisor of ``s`` that is <= the target;
   ``s`` itself if ``s`` < target (e.g. 10 -> 10); a prime ``s`` > target gives 1 (67 -> 1).
3. DCT: orthonormal DCT-II, ``C[k, n] = a_k cos(pi (2n+1) k / (2N))``, ``a_0 = sqrt(1/N)``,
   ``a_k = sqrt(2/N)``. The reference builds it in float32 by FFT of the identity (``_dct``),
   stores ``f = C.T`` (f[n, k]) and separately ``b = _idct(I) = C`` (b[k, n]), cast to p.dtype.
4. 1-D p of length ``Y*w``: rearrange to (Y, w), coefficients ``(Y, w) = x @ f``.
   2-D p of shape ``(Y*h, X*w)``: "(y h) (x w) -> y h x w", then
   einsum("...ijkl, jb, ld -> ...ikbd") giving (Y, X, h, w) = C_h chunk C_w^T per chunk.
   0-D and 3-D+ parameters are NOT supported: the reference crashes on them (IndexError /
   einops error); there is no fallback or flattening. We raise ValueError.
5. Top-k per chunk on |coeff|: 1-D over the w coefficients, 2-D over the flattened h*w
   (row-major, index = b*w + d); ``totalk`` = w or h*w; k = clamp(topk, 1, totalk).
   torch.topk(sorted=False) has no documented tie rule; here: larger |c| first, ties -> lower
   index. Indices are int64 (8 bytes), values are the SIGNED coefficients in p.dtype.
6. Per parameter, in this order: p *= (1 - lr*wd) (only if wd != 0; decoupled, applied to p
   before the step, not to the gradient); delta *= decay; delta += lr * grad (lr enters here
   AND in the final step); compress encode(delta); delta -= decode(scatter of own top-k);
   all_gather idx and val (rank order 0..n-1), concatenate along the chunk axis; scatter_reduce
   "mean", include_self=False into zeros: each coefficient is the mean over the workers that
   sent it (not sum/n), untouched ones stay 0; decode; grad = sign(.) (always; no option;
   sign(0) = 0). After all params: torch SGD (momentum 0, wd 0): p -= lr * grad.
7. State per worker per parameter: ``delta`` (zeros_like(p), p.dtype) and an unused step count.
"""
from __future__ import annotations

import math

import numpy as np

IDX_BYTES = 8  # torch.topk indices are int64


def _prime_divisors(n: int) -> list[int]:
  """Transcribes ``_get_prime_divisors`` (prime factors with multiplicity, ascending)."""
  out = []
  while n % 2 == 0:
    out.append(2)
    n //= 2
  while n % 3 == 0:
    out.append(3)
    n //= 3
  i = 5
  while i * i <= n:
    for k in (i, i + 2):
      while n % k == 0:
        out.append(k)
        n //= k
    i += 6
  if n > 1:
    out.append(n)
  return out


def _divisors(n: int) -> list[int]:
  """Transcribes ``_get_divisors``: all divisors of n, sorted ascending."""
  if n == 1:
    return [1]
  if n < 1:
    return []
  divs, last, factor, slice_len = [1], 0, 0, 0
  for prime in _prime_divisors(n):
    if last != prime:
      slice_len, factor = len(divs), prime
    else:
      factor *= prime
    for i in range(slice_len):
      divs.append(divs[i] * factor)
    last = prime
  return sorted(divs)


def chunk_size(n: int, target: int) -> int:
  """Transcribes ``_get_smaller_split(n, close_to=target)``: largest divisor <= target, else n."""
  divs = _divisors(n)
  for ix, val in enumerate(divs):
    if val == target:
      return val
    if val > target:
      return val if ix == 0 else divs[ix - 1]
  return n


def _dct_ortho(x: np.ndarray) -> np.ndarray:
  """Transcribes ``_dct(x, norm="ortho")`` on a 2-D float32 array (DCT-II over the last axis)."""
  n = x.shape[-1]
  v = np.concatenate([x[:, ::2], x[:, 1::2][:, ::-1]], axis=1)
  vc = np.fft.fft(v, axis=1)
  k = -np.arange(n, dtype=np.float32)[None, :] * np.float32(math.pi / (2 * n))
  out = vc.real * np.cos(k) - vc.imag * np.sin(k)
  out[:, 0] /= np.float32(math.sqrt(n) * 2)
  out[:, 1:] /= np.float32(math.sqrt(n / 2) * 2)
  return (2 * out).astype(np.float32)


def _idct_ortho(xx: np.ndarray) -> np.ndarray:
  """Transcribes ``_idct(X, norm="ortho")`` on a 2-D float32 array (inverse of _dct_ortho)."""
  n = xx.shape[-1]
  xv = xx.astype(np.float32) / np.float32(2)
  xv[:, 0] *= np.float32(math.sqrt(n) * 2)
  xv[:, 1:] *= np.float32(math.sqrt(n / 2) * 2)
  k = np.arange(n, dtype=np.float32)[None, :] * np.float32(math.pi / (2 * n))
  w_r, w_i = np.cos(k), np.sin(k)
  vt_i = np.concatenate([xv[:, :1] * 0, -xv[:, ::-1][:, :-1]], axis=1)
  v_r = xv * w_r - vt_i * w_i
  v_i = xv * w_i + vt_i * w_r
  v = np.fft.irfft(v_r + 1j * v_i, n=n, axis=1).astype(np.float32)
  out = np.zeros_like(v)
  out[:, ::2] += v[:, :n - n // 2]
  out[:, 1::2] += v[:, ::-1][:, :n // 2]
  return out


def dct_basis(size: int, dtype=np.float32) -> np.ndarray:
  """``TransformDCT.f_dict[size]`` = _dct(eye): (size, size), f[n, k] = C[k, n] (ortho DCT-II)."""
  return _dct_ortho(np.eye(size, dtype=np.float32)).astype(dtype)


def idct_basis(size: int, dtype=np.float32) -> np.ndarray:
  """``TransformDCT.b_dict[size]`` = _idct(eye): (size, size), b[k, n] = C[k, n]."""
  return _idct_ortho(np.eye(size, dtype=np.float32)).astype(dtype)


def encode(x: np.ndarray, chunk_target: int) -> np.ndarray:
  """``TransformDCT.encode``. 1-D (Y*w,) -> (Y, w); 2-D (Y*h, X*w) -> (Y, X, h, w)."""
  if x.ndim == 2:
    h, w = chunk_size(x.shape[0], chunk_target), chunk_size(x.shape[1], chunk_target)
    fh, fw = dct_basis(h, x.dtype), dct_basis(w, x.dtype)
    x4 = x.reshape(x.shape[0] // h, h, x.shape[1] // w, w)  # "(y h) (x w) -> y h x w"
    return np.einsum("...ijkl,jb,ld->...ikbd", x4, fh, fw)
  if x.ndim == 1:
    w = chunk_size(x.shape[0], chunk_target)
    return np.einsum("...ij,jb->...ib", x.reshape(-1, w), dct_basis(w, x.dtype))
  raise ValueError(f"DeMo reference supports only 1-D/2-D parameters, got shape {x.shape}")


def decode(c: np.ndarray) -> np.ndarray:
  """``TransformDCT.decode`` (shape taken from c as the reference does): inverse of encode."""
  if c.ndim == 4:
    bh, bw = idct_basis(c.shape[2], c.dtype), idct_basis(c.shape[3], c.dtype)
    y = np.einsum("...ijkl,kb,ld->...ibjd", c, bh, bw)
    return y.reshape(y.shape[0] * y.shape[1], y.shape[2] * y.shape[3])
  y = np.einsum("...ij,jb->...ib", c, idct_basis(c.shape[1], c.dtype))
  return y.reshape(-1)


def topk_indices(a: np.ndarray, k: int) -> np.ndarray:
  """Indices (int64) of the k largest entries of a along the last axis; ties -> lower index."""
  order = np.argsort(-a, axis=-1, kind="stable")
  return order[..., :k].astype(np.int64)


def compress(c: np.ndarray, topk: int):
  """``CompressDCT.compress``: c (Y, w) or (Y, X, h, w) -> idx, val (Y[, X], k), xshape, totalk."""
  xshape = c.shape
  flat = c.reshape(*c.shape[:2], -1) if c.ndim > 2 else c
  totalk = flat.shape[-1]
  k = max(1, min(topk, totalk))  # _clamp_topk
  idx = topk_indices(np.abs(flat), k)
  val = np.take_along_axis(flat, idx, axis=-1)
  return idx, val, xshape, totalk


def decompress(idx: np.ndarray, val: np.ndarray, xshape, dtype=np.float32) -> np.ndarray:
  """``CompressDCT.decompress``: zeros(xshape) then scatter_reduce_(-1, idx, val, "mean",
  include_self=False): mean over the sources hitting each slot, 0 where none."""
  flat_shape = (*xshape[:2], xshape[2] * xshape[3]) if len(xshape) > 2 else tuple(xshape)
  lead = int(np.prod(flat_shape[:-1]))
  rows = np.repeat(np.arange(lead), idx.shape[-1])
  s = np.zeros((lead, flat_shape[-1]), dtype=dtype)
  cnt = np.zeros((lead, flat_shape[-1]), dtype=np.int64)
  np.add.at(s, (rows, idx.reshape(-1)), val.reshape(-1).astype(dtype))
  np.add.at(cnt, (rows, idx.reshape(-1)), 1)
  out = np.where(cnt > 0, s / np.maximum(cnt, 1).astype(dtype), s).astype(dtype)
  return out.reshape(xshape)


def batch_decompress(idx_list, val_list, xshape, dtype=np.float32) -> np.ndarray:
  """``CompressDCT.batch_decompress``: concatenate all workers' idx/val (rank order) on the
  last axis, then ``decompress``."""
  return decompress(np.concatenate(idx_list, axis=-1), np.concatenate(val_list, axis=-1),
                    xshape, dtype)


def demo_step(params, grads, deltas, *, lr, weight_decay=0.0, compression_decay=0.999,
              compression_topk=32, compression_chunk=64):
  """All n workers' ``DeMo.step`` with the all_gather explicit.

  params, grads, deltas: list (worker i = 0..n-1) of lists (parameter j) of 1-D/2-D arrays.
  Returns (new_params, new_deltas), same nesting; inputs are not modified.
  """
  n, dt = len(params), np.float32
  new_p = [[np.array(p, dtype=dt) for p in ps] for ps in params]
  new_d = [[np.array(d, dtype=dt) for d in ds] for ds in deltas]
  for j in range(len(params[0])):
    msgs = []
    for i in range(n):
      if weight_decay != 0.0:
        new_p[i][j] *= dt(1.0 - lr * weight_decay)
      d = new_d[i][j] * dt(compression_decay)
      d = d + dt(lr) * np.asarray(grads[i][j], dtype=dt)
      idx, val, xshape, _ = compress(encode(d, compression_chunk), compression_topk)
      new_d[i][j] = d - decode(decompress(idx, val, xshape, dt))
      msgs.append((idx, val, xshape))
    xshape = msgs[0][2]
    agg = decode(batch_decompress([m[0] for m in msgs], [m[1] for m in msgs], xshape, dt))
    for i in range(n):  # every worker decodes the same gathered list
      new_p[i][j] = new_p[i][j] - dt(lr) * np.sign(agg)  # SGD step on grad = sign(agg)
  return new_p, new_d


def message_bytes(shapes, compression_topk=32, compression_chunk=64, val_bytes=4) -> int:
  """One worker's message for one step: sum over params of chunks * k * (8 + val_bytes).
  This equals the reference's own ``data_transmit`` log."""
  total = 0
  for shape in shapes:
    cs = [chunk_size(s, compression_chunk) for s in shape]
    totalk = int(np.prod(cs))
    chunks = int(np.prod(shape)) // totalk
    total += chunks * max(1, min(compression_topk, totalk)) * (IDX_BYTES + val_bytes)
  return total


def bytes_per_worker(shapes, n, compression_topk=32, compression_chunk=64, val_bytes=4):
  """Bytes each worker sends per step: all_gather delivers its message to the n-1 others,
  i.e. (n - 1) * message_bytes (ring or direct). The reference's ``data_receive`` log is
  n * message_bytes (it counts its own copy)."""
  return float((n - 1) * message_bytes(shapes, compression_topk, compression_chunk, val_bytes))
