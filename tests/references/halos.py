"""numpy transcription of HALoS (Hierarchical Asynchronous Local SGD).

Reference: github.com/utnslab/halos, commit 4b5bf73768c1e039bd1f64c3a310025119f05e20 ("Initial
commit"). Files: ``src/halos/simulation/exec_halos.py`` (``LocalParameterServer``,
``HalosSimulator``), ``src/halos/simulation/common.py`` (``BaseAsyncSimulatior``, ``AsyncEvent``,
``AsyncEventContainer``, ``init_workers``, ``_parse_worker_configs``), ``src/halos/ps.py``
(``ParameterServer``), ``src/halos/opt.py`` (``DelayedNesterovOptimizer``, the LR schedule),
``src/halos/utils.py`` (times, ``TrainingDataDistributor``), ``src/halos/worker.py``,
``examples/run_halos.sh``, ``examples/pythia_70m_commons.sh``, ``examples/env.yaml``.
Paper: Kim et al., "HALoS: Hierarchical Asynchronous Local SGD over Slow Networks for
Geo-Distributed LLM Training", ICML 2025, arXiv:2506.04531 (Algorithm 1).

Details an implementer can get wrong (all as in the reference):
1. Signs: a worker pushes ``pgrad = start - end`` (float32; NOT the paper's end - start); an LPS
   sends ``updates = merged - current`` (its model right after its last global merge minus its
   model now). Both are "gradients": the delayed-Nesterov step SUBTRACTS lr * (...).
2. LPS and GPS are the same ``ParameterServer`` with ``DelayedNesterovOptimizer`` (c = 0,
   no LR schedule). Step t (0-based) with pushed g: ``D += g``; if (t+1) % N == 0:
   ``m = beta m + D / N; x -= lr ((1 - cN + c) beta m + g / N); D = 0`` else
   ``x -= lr (c beta m + g / N)``. Note g / N also on the boundary step (the NEW m is used).
3. LPS on a worker push: DN step, ``version += 1``; if ``version == merged_version + K``
   (equality, K = ``local_updates_accumulation``) it sends ``updates`` to the GPS; then the SAME
   worker pulls the LPS model as it is now (the snapshot it trains on next). So at most one
   LPS<->GPS message is in flight per LPS; pushes applied while it is in flight are never part
   of any ``updates`` (the merge resets the base, they survive only through (1 - alpha)).
4. GPS on ``updates`` from LPS l: DN step (skipped, model unchanged, once its trained-steps
   count >= ``total_steps``), then sends a clone of its model back to LPS l only.
5. LPS on the global model: ``x = x * (1 - alpha); x += x_g * alpha`` (float32; alpha =
   ``model_merge_weight``; the argparse help text states the weights the other way round, the
   code is as written here), then ``merged = copy(x)``, ``merged_version = version``. The LPS's
   DN state (m, D, t) is untouched by the merge.
6. All servers and workers start from the same model (pretrained ``step0`` checkpoint).
7. Event loop: a heap of events ordered ONLY by ``end_time`` (``__lt__``; ties are broken by
   heapq's layout, reproduced here with the same heap). Worker round: ``end = now + 2 *
   comm(model_bytes, bw[lps_region][worker_region]) + local_step_time_ms * H_i / speed_i +
   worker_id * 1e-6`` (ms); LPS->GPS and GPS->LPS messages: ``end = now + comm(model_bytes,
   bw[from][to])``, comm = bytes * 8 / (Gbps * 1e9) * 1e3 ms, no latency term, servers compute in
   zero time. GPS is in region 0. Start: LPSs in order, each schedules its workers in order.
   In a push handler the GPS message is registered before the worker's next round.
8. Speeds: ``env worker_speeds`` (per region) flattened and divided by their max;
   ``--rescale_num_local_steps``: H_i = max(1, ceil(H * speed_i)). LPS l serves workers
   [l W, (l+1) W), W = ``num_workers_per_lps``, and lives in their region.
9. Data: at each pull a worker gets the next ``H_i * micro_batch_size * num_gradient_accumulation``
   samples of one global stream; ``start_steps = start_idx // global_batch_size`` sets its cosine
   schedule: local step j uses lr(start_steps + j + 1); lr(t) = max_lr t / t_warmup (t <=
   t_warmup), else min + (max - min) (1 + cos(pi p)) / 2 (t <= t_max), else min; min = 0.1 max.
10. Worker (not transcribed: ``local_update``): AdamW (betas 0.9/0.95, eps 1e-8, wd 0.1 on
   ndim >= 2 only), clip 1.0, fp16 autocast + GradScaler, optimizer state KEPT across rounds.
11. Bytes: every message is the full float32 model, 4 P bytes (model_bytes = sum numel *
   element_size), on each of the 4 links (worker<->LPS both ways per round, LPS<->GPS per sync).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

Params = list[np.ndarray]
F32 = np.float32
# examples/run_halos.sh (lr already multiplied by buffer_size there: GLR*GMUD, LLR*LMUD)
HALOS_EXAMPLE = dict(
    gps_opt_config=dict(lr=0.15 * 2, beta=0.5, c=0.0, buffer_size=2),
    lps_opt_config=dict(lr=0.2 * 16, beta=0.9, c=0.0, buffer_size=16),
    model_merge_weight=0.25, local_updates_accumulation=32, num_local_steps=8, num_lps=4,
    num_workers_per_lps=4, local_step_time_ms=238.391, global_batch_size=1024,
    micro_batch_size=32, num_gradient_accumulation=2, total_steps=1024 * 6144 // 64)


def dn_init(params: Params) -> dict:
  """``DelayedNesterovOptimizer.__init__``: m = 0, D = 0, t = 0 (per parameter, float32)."""
  return {"m": [np.zeros_like(p, F32) for p in params],
          "delta": [np.zeros_like(p, F32) for p in params], "t": 0}


def dn_step(params: Params, state: dict, grads: Params, *, lr: float, beta: float,
            c: float = 0.0, buffer_size: int = 1) -> tuple[Params, dict]:
  """``DelayedNesterovOptimizer.step`` (opt.py) in float32; python scalars cast to float32 the
  way torch applies them to a float32 tensor. Returns new params and state (inputs untouched)."""
  n, out = buffer_size, []
  m, d = list(state["m"]), [x + g for x, g in zip(state["delta"], grads)]
  boundary = (state["t"] + 1) % n == 0
  for i, (p, g) in enumerate(zip(params, grads)):
    if boundary:
      m[i] = F32(beta) * m[i] + d[i] / F32(n)
      step = F32((1 - c * n + c) * beta) * m[i] + g / F32(n)
      d[i] = np.zeros_like(d[i])
    else:
      step = F32(c * beta) * m[i] + g / F32(n)
    out.append((p - F32(lr) * step).astype(F32))
  return out, {"m": m, "delta": d, "t": state["t"] + 1}


def merge_model(local: Params, glob: Params, merge_weight: float) -> Params:
  """``ParameterServer.merge_model``: ``x *= (1 - w); x += x_g * w`` (float32)."""
  return [(p * F32(1.0 - merge_weight) + g * F32(merge_weight)).astype(F32)
          for p, g in zip(local, glob)]


def _server(params: Params) -> dict:
  return {"x": [np.array(p, F32) for p in params], "opt": dn_init(params)}


def halos_run(init_params: Params, events, local_update, *, num_lps: int,
              num_workers_per_lps: int, lps_opt_config: dict, gps_opt_config: dict,
              model_merge_weight: float, local_updates_accumulation: int,
              total_steps: int = -1, num_local_steps=None) -> list[dict]:
  """HALoS driven by a given event order (exec_halos.py ``LocalParameterServer`` +
  ``HalosSimulator``). ``events``: tuples whose first two items are ``("worker_push", w)``,
  ``("gps_recv", l)`` or ``("lps_recv", l)`` (more items, e.g. the time, are ignored), as
  :func:`event_order` returns them. ``local_update(w, params) -> params`` is called at w's push
  with the model w pulled (so per worker in round order). ``num_local_steps[w]`` (H_i) is only
  needed for the GPS's ``total_steps`` stop. Returns one record per event: the event, copies of
  every LPS model ``lps[l]`` (list of params), the GPS model ``gps``, LPS versions, merged
  versions, GPS step count ``gps_t`` and whether this push made the LPS send (``sent``)."""
  K, n = local_updates_accumulation, num_lps * num_workers_per_lps
  lps = [_server(init_params) for _ in range(num_lps)]
  for s in lps:
    s.update(version=0, merged_version=0, merged=[p.copy() for p in s["x"]], hist=0)
  gps, gps_steps = _server(init_params), 0
  pulled = [[np.array(p, F32) for p in init_params] for _ in range(n)]  # run(): all pull at t = 0
  to_gps, to_lps, trace = [None] * num_lps, [None] * num_lps, []
  for ev in events:
    kind, who, sent = ev[0], int(ev[1]), False
    if kind == "worker_push":
      l, start = who // num_workers_per_lps, pulled[who]
      end = [np.asarray(p, F32) for p in local_update(who, [p.copy() for p in start])]
      s = lps[l]
      s["x"], s["opt"] = dn_step(s["x"], s["opt"], [a - b for a, b in zip(start, end)],
                                 **lps_opt_config)
      s["version"] += 1
      s["hist"] += num_local_steps[who] if num_local_steps is not None else 0
      if s["version"] == s["merged_version"] + K:
        assert to_gps[l] is None and to_lps[l] is None
        to_gps[l] = ([a - b for a, b in zip(s["merged"], s["x"])], s["hist"])
        s["hist"], sent = 0, True
      pulled[who] = [p.copy() for p in s["x"]]
    elif kind == "gps_recv":
      assert to_gps[who] is not None, f"no update of LPS {who} in flight"
      updates, steps = to_gps[who]
      if not (total_steps > 0 and gps_steps >= total_steps):  # ParameterServer.update_model
        gps_steps += steps
        gps["x"], gps["opt"] = dn_step(gps["x"], gps["opt"], updates, **gps_opt_config)
      to_gps[who], to_lps[who] = None, [p.copy() for p in gps["x"]]
    elif kind == "lps_recv":
      assert to_lps[who] is not None, f"no global model for LPS {who} in flight"
      s = lps[who]
      s["x"] = merge_model(s["x"], to_lps[who], model_merge_weight)
      s["merged"], s["merged_version"], to_lps[who] = [p.copy() for p in s["x"]], s["version"], None
    else:
      raise ValueError(f"unknown event {kind!r}")
    trace.append({"event": tuple(ev), "lps": [[p.copy() for p in s["x"]] for s in lps],
                  "gps": [p.copy() for p in gps["x"]], "gps_t": gps["opt"]["t"], "sent": sent,
                  "version": [s["version"] for s in lps],
                  "merged_version": [s["merged_version"] for s in lps]})
  return trace


def worker_configs(worker_speeds, num_local_steps: int, rescale_num_local_steps: bool = True):
  """common.py ``init_workers`` / ``_parse_worker_configs``: ``worker_speeds`` is the env's list
  of per-region lists. Returns (speeds [n] float64 / max, H_i [n] ints, region of each worker)."""
  speeds = np.array([s for ws in worker_speeds for s in ws], dtype=np.float64)
  speeds /= speeds.max()
  steps = [max(1, math.ceil(num_local_steps * s)) if rescale_num_local_steps else num_local_steps
           for s in speeds]
  regions = np.repeat(np.arange(len(worker_speeds)), [len(ws) for ws in worker_speeds]).tolist()
  return speeds, steps, regions


def p2p_comm_time_ms(comm_bytes, gbps) -> float:
  """utils.py ``get_p2p_comm_time_ms`` (same float order)."""
  return comm_bytes * 8 / (gbps * 1e9) * 1e3


class _Ev:
  """``AsyncEvent``: compared ONLY by end_time, so heapq breaks ties as the reference does."""
  __slots__ = ("end", "ev")

  def __init__(self, end, ev):
    self.end, self.ev = end, ev

  def __lt__(self, other):
    return self.end < other.end


def event_order(worker_speeds, network_bandwidths, *, model_bytes: int, num_lps: int,
                num_workers_per_lps: int, local_updates_accumulation: int, num_local_steps: int,
                local_step_time_ms: float, num_events: int, rescale_num_local_steps=True,
                global_batch_size=1024, micro_batch_size=32, num_gradient_accumulation=2):
  """The reference's timing rule (common.py ``BaseAsyncSimulatior.run_local_steps``,
  ``schedule_callback``, ``_register_event``, ``_progress``; exec_halos.py handlers), first
  ``num_events`` events. ``network_bandwidths``: [R, R] Gbps (env.yaml). Returns (events,
  pulls): events ``(kind, who, time_ms)`` for :func:`halos_run`; pulls ``(worker, time_ms,
  start_idx, end_idx, start_steps)`` in the order rounds are assigned (incl. the first ones)."""
  speeds, steps, regions = worker_configs(worker_speeds, num_local_steps, rescale_num_local_steps)
  bw, K, W = np.array(network_bandwidths), local_updates_accumulation, num_workers_per_lps
  lps_region = [regions[l * W] for l in range(num_lps)]
  heap, now, data_idx, events, pulls = [], 0.0, 0, [], []
  version, merged = [0] * num_lps, [0] * num_lps

  def schedule_worker(w):
    nonlocal data_idx
    nb = steps[w] * micro_batch_size * num_gradient_accumulation
    pulls.append((w, float(now), data_idx, data_idx + nb, data_idx // global_batch_size))
    data_idx += nb
    comm = p2p_comm_time_ms(model_bytes, bw[lps_region[w // W]][regions[w]])
    exec_time = 2 * comm + local_step_time_ms * steps[w] / speeds[w]
    exec_time += w * 0.000001
    heapq.heappush(heap, _Ev(now + exec_time, ("worker_push", w)))

  for w in range(num_lps * W):
    schedule_worker(w)
  while len(events) < num_events:
    e = heapq.heappop(heap)
    now, (kind, who) = e.end, e.ev
    events.append((kind, who, float(now)))
    if kind == "worker_push":
      l = who // W
      version[l] += 1
      if version[l] == merged[l] + K:
        t = p2p_comm_time_ms(model_bytes, bw[lps_region[l]][0])
        heapq.heappush(heap, _Ev(now + t, ("gps_recv", l)))
      schedule_worker(who)
    elif kind == "gps_recv":
      t = p2p_comm_time_ms(model_bytes, bw[0][lps_region[who]])
      heapq.heappush(heap, _Ev(now + t, ("lps_recv", who)))
    else:
      merged[who] = version[who]
  return events, pulls


def worker_lr(t: int, max_lr: float, t_warmup: int, t_max: int, min_lr=None) -> float:
  """opt.py ``CosineDecayAfterLinearWarmupLrSchedule.curr_lr`` (min_lr defaults to 0.1 max)."""
  min_lr = 0.1 * max_lr if min_lr is None else min_lr
  if t <= t_warmup:
    return max_lr * (t / t_warmup)
  if t <= t_max:
    p = (t - t_warmup) / (t_max - t_warmup)
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * p))
  return min_lr


def message_bytes(num_params: int) -> dict:
  """Bytes of each message (all full float32 models/deltas, 4 bytes per element): per worker
  round one model down (LPS->worker) and one pgrad up; per LPS sync one update up, one model
  down. The timing rule charges each at ``bytes * 8 / bandwidth`` on its link."""
  b = 4 * num_params
  return {"lps_to_worker": b, "worker_to_lps": b, "lps_to_gps": b, "gps_to_lps": b}
