"""Overlapped DiLoCo reference: the outer all-reduce of step t hidden behind the H inner steps of
step t+1, in two forms: (a) the naive 1-outer-step delay and (b) eager updates.

(a) Repository github.com/PrimeIntellect-ai/pccl, commit 7815195c4fe29f9dd4448f67afe8f48e93393428,
    ``python/examples/nanogpt_diloco/async_diloco.py`` (main loop, lines ~405-621: "await previous
    all reduce", ``outer_grads``, ``can_outer_step``, ``run_all_reduce``) and
    ``docs/md/07-DiLoCo - Distributed Low-Communication/03-AsyncDiloco.md`` ("Async DiLoCo ... an
    N=2 pipeline"); AVG finalization ``dst[i] / world_size`` in
    ``ccoip/src/cpp/reduce_kernels.cpp``.
(b) Kale, Douillard, Donchev, "Eager Updates For Overlapped Communication and Computation in
    DiLoCo", arXiv:2502.12996 (Algorithm 2 = naive delayed, Algorithm 3 = eager). No public code
    exists; the update rule is taken from secondary transcriptions of the paper (the paper's own
    text was not readable here): Delta~_m(t) = Delta(t-H) + (Delta_m(t) - Delta_m(t-H)) / M
    = (Delta_m(t) + sum_{m' != m} Delta_m'(t-H)) / M, theta_m(t) = OuterOpt(theta_m(t-H), Delta~_m).

Details an implementer can get wrong:
- Pseudo-gradient sign and base: ``outer_param - local_param`` (anchor minus trained weights),
  computed against the anchor the phase STARTED from, BEFORE this call's outer update.
- Delayed (a), per outer iteration k = 0, 1, ... (after the k-th block of H inner steps):
  1. join the all-reduce launched at iteration k-1 (none at k = 0);
  2. Delta_i(k) = anchor - local_i;  3. if k >= 1: anchor = SGD(anchor, grad = mean_i Delta_i(k-1));
  4. local_i = anchor (a copy; at k = 0 the UNCHANGED anchor: the first block's progress is only
  kept through its in-flight pseudo-gradient, and block 1 restarts from theta_0 too);
  5. launch AVG all-reduce of Delta_i(k), joined after the next H inner steps.
  So anchor(k) = OuterOpt(anchor(k-1), Delta(k-1)), Delta(k-1) measured from anchor(k-2).
- PCCL's example outer optimizer is ``torch.optim.SGD(lr=config["outer_learning_rate"] = 0.7)``
  with NO momentum (momentum=0, nesterov=False) despite its comment; ``inner_steps`` = 8. The
  paper/DiLoCo use Nesterov SGD (DiLoCo: lr 0.7, momentum 0.9). Both are ``sgd_step`` below.
  PCCL runs a dummy zero-grad step at init, so a momentum buffer exists (zeros) from the start;
  with dampening 0 that equals torch's lazy ``buf = grad.clone()`` first step.
- Eager (b): every worker keeps its OWN anchor and momentum (they drift apart: each applies a
  different Delta~), and its own previous pseudo-gradient. First step: nothing in flight, taken
  as Delta(0) = Delta_m(0) = 0, so Delta~_m = Delta_m / M (each contribution is then applied
  exactly once: own share at once, the others' one outer step later).
- AVG = sum over the ring, then ``/ world_size`` (division, float32). Ring order differs per
  chunk, so n > 2 matches to rounding only; here the sum runs in worker order.
- What is sent: one all-reduce per parameter tensor (``all_reduce_multiple_with_retry``,
  tag = index, max_in_flight 16). PCCL's example quantizes on the wire: float32 -> uint8 min-max
  (1 byte/element + one de-quantization metadata packet per ring step); not transcribed here.
- Bytes per worker per outer step (ring all-reduce, reduce-scatter + all-gather):
  2 (n-1)/n * P * bytes_per_element; the all-reduce of step k has H inner steps to hide behind.
- Test identities (momentum 0, calls k = 0..K-1, avg(k) = mean_i Delta_i(k)): delayed
  anchor = theta_0 - lr sum_{k<K-1} avg(k); eager anchor_m = theta_0 - lr (sum_{k<K-1} avg(k)
  + Delta_m(K-1) / M). Eager with M = 1 equals blocking DiLoCo (``sync_outer_step``) up to the
  rounding of a + (b - a).
- Out of scope (not reproduced): topology changes / late joiners ("eavesdrop" shared-state
  sync). Also NOT transcribed: PrimeIntellect-ai/prime ``src/zeroband/train.py``
  ``run_async_outer_step`` (commit f9e37eaf24ec17bb2c70c004ff4551cfe05788e5) overwrites
  ``outer_p.grad`` with the fresh LOCAL pseudo-gradient before ``outer_optimizer.step()`` and
  its ``nonlocal last_pseudo_grads`` never reaches the caller, so the average is never applied.
"""

from __future__ import annotations

import numpy as np

Models = list[list[np.ndarray]]  # models[i][j]: worker i, parameter j


def pseudo_gradients(anchor: Models, local: Models) -> Models:
  """``pseudo_grad = outer_param - local_param`` (async_diloco.py, "Compute current pseudo
  grads"). anchor[i][j], local[i][j] any shape, float32. Returns delta[i][j]."""
  return [[a - x for a, x in zip(ai, xi)] for ai, xi in zip(anchor, local)]


def allreduce_avg(sent: Models) -> list[np.ndarray]:
  """PCCL ``ReduceOp.AVG``: sum of the n workers' tensors, then ``/ float(n)``
  (``performAvgFinalization``). sent[i][j] -> mean[j], the tensor every worker receives."""
  n = len(sent)
  out = []
  for j in range(len(sent[0])):
    acc = sent[0][j].copy()
    for i in range(1, n):
      acc = acc + sent[i][j]
    out.append(acc / acc.dtype.type(n))
  return out


def sgd_step(p: np.ndarray, g: np.ndarray, buf: np.ndarray | None, *, lr: float,
             momentum: float = 0.0, nesterov: bool = False, dampening: float = 0.0,
             weight_decay: float = 0.0) -> tuple[np.ndarray, np.ndarray | None]:
  """``torch.optim.SGD`` single-tensor step (torch/optim/sgd.py ``_single_tensor_sgd``):
  d = g + wd p; buf = d if buf is None else momentum buf + (1 - dampening) d;
  d = d + momentum buf (nesterov) or buf; p = p - lr d. Returns (p, buf); buf None if momentum 0."""
  t = p.dtype.type
  d = g if weight_decay == 0 else g + t(weight_decay) * p
  if momentum != 0:
    buf = d.copy() if buf is None else buf * t(momentum) + t(1.0 - dampening) * d
    d = d + t(momentum) * buf if nesterov else buf
  return p - t(lr) * d, buf


def init_state(params: list[np.ndarray], n: int, momentum: float = 0.0):
  """Start of training: every worker holds the same anchor theta_0 (PCCL: shared-state sync then
  ``inner_param.copy_(outer_param)``) and local model; zero momentum buffers (the dummy step) or
  None when momentum is 0; nothing in flight. Returns (local, anchor, buf, inflight=None)."""
  anchor = [[p.copy() for p in params] for _ in range(n)]
  local = [[p.copy() for p in params] for _ in range(n)]
  buf = [[np.zeros_like(p) for p in params] for _ in range(n)] if momentum != 0 else None
  return local, anchor, buf, None


def _apply(anchor: Models, grads: Models, buf: Models | None, opt: dict):
  new_a, new_b = [], []
  for i in range(len(anchor)):
    row_a, row_b = [], []
    for j in range(len(anchor[i])):
      p, b = sgd_step(anchor[i][j], grads[i][j], None if buf is None else buf[i][j], **opt)
      row_a.append(p)
      row_b.append(b)
    new_a.append(row_a)
    new_b.append(row_b)
  return new_a, (new_b if buf is not None else None)


def delayed_outer_step(local: Models, anchor: Models, buf: Models | None,
                       inflight: list[np.ndarray] | None, **opt):
  """Form (a), PCCL async_diloco.py lines ~524-621, called after each block of H inner steps.

  local[i][j]: worker i's weights after the block; anchor[i][j]: its outer params (equal on
  all workers); buf[i][j]: outer SGD momentum (or None); inflight[j]: mean pseudo-gradient
  launched at the previous call (None at the first). opt: ``sgd_step`` keywords (lr, ...).
  Returns (next_local, anchor, buf, new_inflight, sent): next_local = the new anchor, where the
  next block starts; sent[i][j] = Delta_i, what worker i all-reduces (received next call)."""
  sent = pseudo_gradients(anchor, local)
  if inflight is not None:
    anchor, buf = _apply(anchor, [inflight] * len(anchor), buf, opt)
  next_local = [[a.copy() for a in ai] for ai in anchor]
  return next_local, anchor, buf, allreduce_avg(sent), sent


def eager_gradient(inflight: list[np.ndarray] | None, own_new: list[np.ndarray],
                   own_prev: list[np.ndarray] | None, n: int) -> list[np.ndarray]:
  """arXiv:2502.12996 Algorithm 3: Delta~_m = Delta(t-H) + (Delta_m(t) - Delta_m(t-H)) / M;
  inflight None (first step) means Delta(t-H) = Delta_m(t-H) = 0. Per parameter j."""
  out = []
  for j, d in enumerate(own_new):
    t = d.dtype.type
    if inflight is None:
      out.append(d / t(n))
    else:
      out.append(inflight[j] + (d - own_prev[j]) / t(n))
  return out


def eager_outer_step(local: Models, anchor: Models, buf: Models | None,
                     inflight: list[np.ndarray] | None, own_prev: Models | None, **opt):
  """Form (b), eager updates, for all n workers at once (after each block of H inner steps).

  Worker m: Delta_m = anchor_m - local_m; launch AVG all-reduce of Delta_m; join the previous
  one (inflight = Delta(t-H), None at the first step); anchor_m = SGD(anchor_m, eager_gradient)
  with its own buf_m; next block starts from anchor_m. own_prev[m][j] = Delta_m(t-H).
  Returns (next_local, anchor, buf, new_inflight, new_own_prev = sent, sent)."""
  n = len(local)
  sent = pseudo_gradients(anchor, local)
  grads = [eager_gradient(inflight, sent[m], None if own_prev is None else own_prev[m], n)
           for m in range(n)]
  anchor, buf = _apply(anchor, grads, buf, opt)
  next_local = [[a.copy() for a in ai] for ai in anchor]
  return next_local, anchor, buf, allreduce_avg(sent), sent, sent


def sync_outer_step(local: Models, anchor: Models, buf: Models | None, **opt):
  """Blocking DiLoCo baseline (PCCL sync_diloco.py / prime ``run_sync_outer_step``): all-reduce
  now, anchor = SGD(anchor, mean Delta), next block from the anchor.
  Returns (local, anchor, buf)."""
  mean = allreduce_avg(pseudo_gradients(anchor, local))
  anchor, buf = _apply(anchor, [mean] * len(anchor), buf, opt)
  return [[a.copy() for a in ai] for ai in anchor], anchor, buf


def ring_allreduce_bytes_per_worker(numels: list[int], n: int, bytes_per_element: int = 4) -> float:
  """Bytes one worker sends per outer step: ring reduce-scatter + all-gather of every tensor,
  2 (n-1)/n * numel * bytes (PCCL chunks: numel // n, +1 for the first numel % n ranks).
  float32 = 4; PCCL's example sends uint8 (1) plus small metadata. The same for (a) and (b);
  either all-reduce overlaps the next H inner steps."""
  if n <= 1:
    return 0.0
  return 2.0 * (n - 1) / n * float(sum(numels)) * bytes_per_element
