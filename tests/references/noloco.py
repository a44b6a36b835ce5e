"""NoLoCo reference: numpy transcription of ``SparseOptimizerC`` (the "noloco_mean" configs).

Repository: github.com/jkolehm/noloco, commit 37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08.
Files: ``src/noloco/sparse_optimizer_c.py`` (permutation, ``batched``, ``outer_step``,
``SparseOptimizerC``, ``SparseOptimizerCBuilder``), ``src/noloco/train.py`` (initial averaging,
``clip_grad_norm_(.., 1.0)``, step order), ``src/noloco/schedulers.py`` (``CosineWarmupLR``),
inner optimizer ``torch.optim.Adam`` (torch defaults). Paper: Kolehmainen et al., "NoLoCo:
No-all-reduce Low Communication Training Method for Large Models", arXiv:2506.10911.

Details an implementer can get wrong:
- Config names / defaults (``SparseOptimizerCBuilder``): ``number_of_local_steps`` (H, no
  default; configs 50), ``local_group_size`` (no default; every config 2), ``lr`` (Adam lr, no
  default; 6e-4 / 2e-4 / 1.2e-4), ``outer_lr`` = 0.7, ``outer_momentum`` = 0.9 (every config
  overrides it to 0.5). There is NO separate consensus coefficient: the pull toward the group
  mean uses ``outer_lr`` too.
- Outer step after inner step t when ``t % H == 0`` (t counts from 1: ``_step += 1`` happens
  after ``local_optimizer.step()``). Seed = t itself (= k*H at the k-th outer step);
  permutation = ``np.random.default_rng(seed + 1).permutation(world_size)``, the same on every
  worker (deterministic across runs too).
- Groups are STRIDED, not contiguous: ``n_groups = world_size // group_size``, element i of the
  permutation goes to group ``i % n_groups``; so group j = perm[j], perm[j + n_groups], ... The
  root of a group is its first element; sums run in group-list order (root first).
- Per parameter tensor, each worker sends its slow weights ``p_old`` and ``p - p_old`` (fast minus
  slow: the NEGATIVE of DiLoCo's pseudo-gradient). The root sums each, then multiplies by the
  scalar ``1.0 / len(group)`` (not a division), and sends both means back. Every member gets the
  root's bits.
- Update of worker i (own slow s_i, own momentum m_i, never averaged):
  ``m_ = ((beta - 1) * m + alpha * mean(fast - slow)) + alpha * (mean(slow) - s_i)``;
  ``m = m + m_``; ``s = s + m``; fast = ``0 * fast + s`` (fast restarts from the new slow).
  Scalars: ``beta - 1`` is computed in double then cast to the tensor dtype.
- In exact arithmetic m_new = beta m + alpha (mean_G(fast) - s_i). One group of all n workers
  with equal slow weights = DiLoCo with heavy-ball (NOT Nesterov) SGD, lr = outer_lr, momentum
  = outer_momentum, on pseudo-gradient s - mean(fast) (m = -outer_lr * torch's momentum buffer).
  The root's mean of n equal float32 values is exact for n = 2 and 4 but not in general (n = 3,
  5, 6, 8, 16 leave 1-ulp residuals), so the consensus term is then a few ulps, not 0, and one
  group matches DiLoCo to float rounding, not bitwise.
- Adam state (exp_avg, exp_avg_sq, step) is per worker, never reset or averaged at outer steps.
  train.py: zero_grad, backward, clip_grad_norm_(params, 1.0) over the worker's own parameters,
  optimizer.step() (Adam, then maybe the outer step), scheduler.step().
- Before building the optimizer all dp replicas are averaged (p * (1/n) then all_reduce sum),
  so every worker starts with the same weights; slow = clone, momentum = zeros.
- The reference's model is bfloat16 (``DiPaCoLlama .to(bfloat16)``), so slow, momentum and every
  message are bf16 (2 bytes). This module computes in the inputs' dtype (float32 for the tests).
- Messages: blocking point-to-point ``dist.send``/``recv`` (gloo, via CPU), one parameter tensor
  at a time, slow before delta. Non-root sends 2 P elements; the root sends 2 (g-1) P elements
  (mean and mean_g to each of the other g-1 members). Group size 1: no communication.
"""

from __future__ import annotations

import math

import numpy as np


def create_random_permutation(world_size: int, seed: int) -> np.ndarray:
  """``create_random_permutation``: the reference's draw. ``seed`` is the inner-step count t
  (= k * number_of_local_steps at outer step k = 1, 2, ...). Returns int64 ``[world_size]``."""
  rng = np.random.default_rng(seed + 1)
  return np.asarray([int(x) for x in rng.permutation(world_size)], dtype=np.int64)


def groups_from_permutation(perm: np.ndarray, group_size: int) -> list[list[int]]:
  """``batched(ranks, size)``: strided split of ``perm`` ``[n]`` into n / group_size groups;
  position i goes to group ``i % (n // group_size)``. group[0] is the root. Asserts divisibility
  as the reference does."""
  perm = [int(x) for x in perm]
  assert len(perm) % group_size == 0
  n_groups = len(perm) // group_size
  out: list[list[int]] = [[] for _ in range(n_groups)]
  for i, x in enumerate(perm):
    out[i % n_groups].append(x)
  return out


def _root_mean(values: list[np.ndarray]) -> np.ndarray:
  """Root's reduction in ``outer_step``: sum in group order (root first), then ``mul_(1/len)``."""
  acc = values[0].copy()
  for v in values[1:]:
    acc = acc + v
  return acc * acc.dtype.type(1.0 / len(values))


def noloco_outer_step(slow: list[list[np.ndarray]], fast: list[list[np.ndarray]],
                      momentum: list[list[np.ndarray]], groups: list[list[int]], *,
                      outer_lr: float = 0.7, outer_momentum: float = 0.9):
  """``outer_step`` (sparse_optimizer_c.py) for all workers at once.

  slow[i][j]: worker i's ``step_params`` for parameter j (any shape, float dtype); fast[i][j]:
  its model parameter after the inner steps; momentum[i][j]: its outer momentum buffer.
  ``groups`` must partition range(n) (from :func:`groups_from_permutation`). Returns
  ``(new_slow, new_fast, new_momentum)`` with the same nesting; inputs are not modified.
  """
  n = len(slow)
  assert sorted(i for g in groups for i in g) == list(range(n))
  new_slow = [[None] * len(slow[i]) for i in range(n)]
  new_fast = [[None] * len(slow[i]) for i in range(n)]
  new_mom = [[None] * len(slow[i]) for i in range(n)]
  for group in groups:
    for j in range(len(slow[group[0]])):
      mean = _root_mean([slow[i][j] for i in group])
      mean_g = _root_mean([fast[i][j] - slow[i][j] for i in group])
      for i in group:
        p, p_old, m = fast[i][j], slow[i][j], momentum[i][j]
        t = m.dtype.type
        m_ = (t(outer_momentum - 1.0) * m + t(outer_lr) * mean_g) + t(outer_lr) * (mean - p_old)
        m_new = m + m_
        s_new = p_old + m_new
        new_mom[i][j], new_slow[i][j] = m_new, s_new
        new_fast[i][j] = p * p.dtype.type(0.0) + s_new
  return new_slow, new_fast, new_mom


def diloco_heavy_ball_outer_step(slow: list[np.ndarray], fasts: list[list[np.ndarray]],
                                 buf: list[np.ndarray] | None, *, lr: float, momentum: float):
  """NOT reference code: DiLoCo with torch ``SGD(lr, momentum, nesterov=False)`` on the
  pseudo-gradient ``slow - mean_i(fast_i)``, what one group of all workers reduces to.
  slow[j], buf[j] (None on the first step, as torch) shared; fasts[i][j]. Returns (slow, buf)."""
  out_s, out_b = [], []
  for j, s in enumerate(slow):
    g = s - _root_mean([f[j] for f in fasts])
    b = g.copy() if buf is None else buf[j] * s.dtype.type(momentum) + g
    out_s.append(s - s.dtype.type(lr) * b)
    out_b.append(b)
  return out_s, out_b


def clip_grad_norm(grads: list[np.ndarray], max_norm: float = 1.0) -> list[np.ndarray]:
  """train.py ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)``: total 2-norm of the
  per-tensor 2-norms; coef = max_norm / (total + 1e-6) clamped to <= 1; always multiplied."""
  norms = np.asarray([np.sqrt(np.sum(g.astype(np.float32) ** 2)) for g in grads], np.float32)
  total = np.float32(np.sqrt(np.sum(norms ** 2)))
  coef = min(np.float32(max_norm) / (total + np.float32(1e-6)), np.float32(1.0))
  return [g * g.dtype.type(coef) for g in grads]


def adam_step(params: list[np.ndarray], grads: list[np.ndarray], exp_avg: list[np.ndarray],
              exp_avg_sq: list[np.ndarray], step: int, *, lr: float,
              betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
  """``torch.optim.Adam(params, lr=lr)`` (defaults: betas (0.9, 0.999), eps 1e-8, no weight
  decay, no amsgrad), one worker. ``step`` = state['step'] before this update (0 at start).
  Returns (params, exp_avg, exp_avg_sq, step + 1)."""
  b1, b2 = betas
  step = step + 1
  bc1, bc2 = 1.0 - b1 ** step, 1.0 - b2 ** step
  step_size, bc2_sqrt = lr / bc1, math.sqrt(bc2)
  out_p, out_m, out_v = [], [], []
  for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq):
    t = p.dtype.type
    m = m + t(1.0 - b1) * (g - m)  # lerp_(grad, 1 - beta1), weight < 0.5 branch
    v = v * t(b2) + t(1.0 - b2) * g * g  # mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    denom = np.sqrt(v) / t(bc2_sqrt) + t(eps)
    out_p.append(p + t(-step_size) * (m / denom))
    out_m.append(m)
    out_v.append(v)
  return out_p, out_m, out_v, step


def cosine_warmup_lr(last_epoch: int, base_lr: float, min_lr: float, max_steps: int,
                     warmup_steps: int) -> float:
  """``CosineWarmupLR.get_lr``; inner step t (1-based) runs with last_epoch = t - 1 (scheduler
  stepped after the optimizer). Configs: min_lr = base/10, max_steps 25000, warmup 1000."""
  if last_epoch < warmup_steps:
    return base_lr * (last_epoch + 1) / warmup_steps
  if last_epoch >= max_steps:
    return min_lr
  ratio = (last_epoch - warmup_steps) / (max_steps - warmup_steps)
  return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (base_lr - min_lr)


def bytes_sent(shapes: list[tuple[int, ...]], groups: list[list[int]],
               itemsize: int = 2) -> np.ndarray:
  """Bytes each worker sends in one outer step (``[n]`` int64): non-root 2 P itemsize (slow and
  fast - slow to the root), root 2 (g - 1) P itemsize (both means to each other member).
  P = total elements; itemsize 2 = the reference's bf16 parameters (4 for float32).
  Received bytes are the same numbers. Inner steps send nothing."""
  n_el = sum(int(np.prod(s)) for s in shapes)
  out = np.zeros(sum(len(g) for g in groups), dtype=np.int64)
  for g in groups:
    out[g[0]] = 2 * (len(g) - 1) * n_el * itemsize
    for i in g[1:]:
      out[i] = 2 * n_el * itemsize
  return out


def bytes_per_worker(shapes: list[tuple[int, ...]], n: int, group_size: int,
                     itemsize: int = 2) -> dict[str, float]:
  """Per outer step: ``root`` / ``non_root`` bytes sent (see :func:`bytes_sent`), ``total`` over
  all n workers = 4 P itemsize n (g - 1) / g, and ``mean`` = total / n."""
  assert n % group_size == 0
  n_el = sum(int(np.prod(s)) for s in shapes)
  root = 2 * (group_size - 1) * n_el * itemsize
  non_root = 2 * n_el * itemsize if group_size > 1 else 0
  n_groups = n // group_size
  total = n_groups * root + (n - n_groups) * non_root
  return {"root": root, "non_root": non_root, "total": total, "mean": total / n}
