"""Matchings of a graph: the rounds of pairwise exchanges behind MATCHA and gossip.

The host-side graph facts the device's communications need (numpy only, no solver):

* :func:`matching_decomposition`: a graph's edges split into disjoint matchings by the
  Misra-Gries edge colouring (Misra & Gries, "A constructive proof of Vizing's theorem", IPL
  1992), so ``M <= max_degree + 1``; each matching is one round of pairwise exchanges, one
  ``ppermute`` with the involution :func:`matching_permutation`;
* :func:`matching_laplacians`: the Laplacians ``L_j`` (``L_j^2 = 2 L_j``);
* :class:`MatchaPlan` and :func:`sample_activations`: MATCHA's plan (built by
  :func:`nbsgd_jax.topology.matcha.plan`, which solves for the probabilities and ``alpha``) and the
  activations ``B_j ~ Bernoulli(p_j)`` every worker draws alike from a shared seed (Wang et
  al. 2019).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

Edge = tuple[int, int]
Matching = list[Edge]

# --------------------------------------------------------------------------------------
# Validation helpers.


def _check_n(n) -> int:
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise ValueError(f"n={n!r} is not allowed: it must be an integer >= 1")
  return int(n)


def _check_edge(n: int, e) -> Edge:
  try:
    pair = tuple(e)
  except TypeError:
    raise ValueError(f"edge {e!r} is not allowed: an edge is a pair (i, j)") from None
  if len(pair) != 2:
    raise ValueError(f"edge {pair!r} is not allowed: an edge is a pair (i, j)")
  for v in pair:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
      raise ValueError(f"edge {pair!r} is not allowed: endpoints must be integers")
  i, j = int(pair[0]), int(pair[1])
  if not (0 <= i < n and 0 <= j < n):
    raise ValueError(f"edge {(i, j)!r} is out of range: endpoints must lie in [0, {n - 1}]")
  if i == j:
    raise ValueError(f"edge {(i, j)!r} is a self loop: self weights live on the diagonal of W")
  return (min(i, j), max(i, j))


def _normalise_edges(n: int, edges: Sequence[Sequence[int]]) -> list[Edge]:
  """Validated, deduplicated, sorted ``(i, j)`` pairs with ``i < j`` (as topology does)."""
  return sorted({_check_edge(n, e) for e in edges})


def _check_matchings(n: int, matchings: Sequence[Sequence[Sequence[int]]]) -> list[Matching]:
  """Validate a list of matchings: each a set of vertex-disjoint valid edges."""
  out = []
  seen_edges: set[Edge] = set()
  for k, m in enumerate(matchings):
    used: set[int] = set()
    cur = []
    for e in m:
      i, j = _check_edge(n, e)
      if i in used or j in used:
        raise ValueError(f"matchings[{k}]={list(m)!r} is not allowed: edge {(i, j)!r} shares a "
                         "worker with another edge of the same matching")
      if (i, j) in seen_edges:
        raise ValueError(f"matchings[{k}]={list(m)!r} is not allowed: edge {(i, j)!r} already "
                         "belongs to an earlier matching")
      used.update((i, j))
      seen_edges.add((i, j))
      cur.append((i, j))
    out.append(sorted(cur))
  return out


def _check_probs(probs, m: int) -> np.ndarray:
  p = np.asarray(probs, dtype=np.float64)
  if p.shape != (m,):
    raise ValueError(f"probs shape={p.shape} is not allowed: expected ({m},), one per matching")
  if not np.all(np.isfinite(p)) or np.any(p < 0.0) or np.any(p > 1.0):
    raise ValueError(f"probs={p.tolist()!r} is not allowed: every entry must lie in [0, 1]")
  return p


def _check_float(name: str, value, allowed: str, ok) -> float:
  """``float(value)`` if finite and ``ok(value)``, else ValueError naming ``name``."""
  msg = f"{name}={value!r} is not allowed: it must be a {allowed}"
  if isinstance(value, bool):
    raise ValueError(msg)
  try:
    v = float(value)
  except (TypeError, ValueError):
    raise ValueError(msg) from None
  if not math.isfinite(v) or not ok(v):
    raise ValueError(msg)
  return v


def _check_alpha(alpha) -> float:
  return _check_float("alpha", alpha, "finite float >= 0", lambda a: a >= 0.0)


def _check_budget(budget) -> float:
  return _check_float("budget", budget, "float in (0, 1]", lambda x: 0.0 < x <= 1.0)


# --------------------------------------------------------------------------------------
# Step 1: matching decomposition (Misra-Gries edge colouring).


class _Colouring:
  """Partial proper edge colouring: ``colour[u][v]`` and ``at[u][c] = v`` (both ways)."""

  def __init__(self, n: int, num_colours: int):
    self.colour: list[dict[int, int]] = [dict() for _ in range(n)]
    self.at: list[dict[int, int]] = [dict() for _ in range(n)]
    self.num_colours = num_colours

  def get(self, u: int, v: int) -> int | None:
    return self.colour[u].get(v)

  def set(self, u: int, v: int, c: int) -> None:
    old = self.colour[u].get(v)
    if old is not None:
      del self.at[u][old]
      del self.at[v][old]
    assert c not in self.at[u] and c not in self.at[v], "internal error: colouring not proper"
    self.colour[u][v] = self.colour[v][u] = c
    self.at[u][c] = v
    self.at[v][c] = u

  def is_free(self, u: int, c: int) -> bool:
    return c not in self.at[u]

  def free(self, u: int) -> int:
    """Smallest colour free on ``u`` (exists because ``deg(u) <= num_colours - 1``)."""
    for c in range(self.num_colours):
      if c not in self.at[u]:
        return c
    raise AssertionError("internal error: no free colour")  # unreachable by Vizing's bound


def _misra_gries(n: int, edges: list[Edge], adj: list[list[int]], max_deg: int) -> _Colouring:
  """Colour ``edges`` with ``max_deg + 1`` colours (Misra & Gries 1992)."""
  col = _Colouring(n, max_deg + 1)
  for u, v in edges:
    # Maximal fan F of u starting at v: F[0] = v with (u, v) uncoloured; for i >= 1 the edge
    # (u, F[i]) is coloured and its colour is free on F[i - 1]; vertices are distinct.
    fan = [v]
    in_fan = {v}
    extended = True
    while extended:
      extended = False
      last = fan[-1]
      for x in adj[u]:
        if x in in_fan:
          continue
        cx = col.get(u, x)
        if cx is not None and col.is_free(last, cx):
          fan.append(x)
          in_fan.add(x)
          extended = True
          break
    c = col.free(u)
    d = c if col.is_free(fan[-1], c) else col.free(fan[-1])
    if d != c:
      # Invert the cd-path from u: it starts with u's d-edge (c is free on u), alternates
      # d, c, d, ... and is simple. Swapping c <-> d on it frees d on u.
      path = []
      x, want, other = u, d, c
      while want in col.at[x]:
        y = col.at[x][want]
        path.append((x, y, want))
        x, want, other = y, other, want
      for a, b, _ in path:  # uncolour first so that the re-colouring never clashes
        old = col.colour[a].pop(b)
        del col.colour[b][a]
        del col.at[a][old]
        del col.at[b][old]
      for a, b, cc in path:
        col.set(a, b, c if cc == d else d)
    # Find w in F such that F[:w+1] is still a fan and d is free on w (exists: Misra-Gries).
    w_idx = None
    for i, f in enumerate(fan):
      if i > 0:
        ci = col.get(u, f)
        if ci is None or not col.is_free(fan[i - 1], ci):
          break
      if col.is_free(f, d):
        w_idx = i
        break
    if w_idx is None:
      raise AssertionError("internal error: Misra-Gries found no fan vertex")  # unreachable
    # Rotate the fan prefix: (u, F[i]) takes the colour of (u, F[i + 1]); (u, w) gets d.
    for i in range(w_idx):
      nxt = col.get(u, fan[i + 1])
      old = col.colour[u].pop(fan[i + 1])
      del col.colour[fan[i + 1]][u]
      del col.at[u][old]
      del col.at[fan[i + 1]][old]
      col.set(u, fan[i], nxt)
    col.set(u, fan[w_idx], d)
  return col


def matching_decomposition(n: int, edges: Sequence[Sequence[int]]) -> list[list[tuple[int, int]]]:
  """Split a graph's edges into disjoint matchings (step 1 of MATCHA).

  Misra-Gries edge colouring (Misra & Gries, IPL 1992, a constructive proof of Vizing's
  theorem): every edge gets one of ``max_degree + 1`` colours, no two edges of one colour
  share a worker; the non-empty colour classes are the matchings. Deterministic: edges are
  processed in sorted order and the smallest free colours are taken.

  Args:
    n: number of workers, ``>= 1``.
    edges: undirected edges ``(i, j)``, ``0 <= i, j < n``, ``i != j`` (order and duplicates
      ignored, as in :func:`nbsgd_jax.topology.from_edges`).

  Returns:
    ``M <= max_degree + 1`` matchings, each a sorted list of ``(i, j)`` with ``i < j``; they
    are pairwise disjoint and together hold every edge exactly once. ``[]`` when there is no
    edge (in particular for ``n = 1``).

  Raises:
    ValueError: ``n`` not an integer ``>= 1``, or an edge that is not a pair, is out of
      range, or is a self loop (the message names the edge).
  """
  n = _check_n(n)
  es = _normalise_edges(n, edges)
  if not es:
    return []
  adj: list[list[int]] = [[] for _ in range(n)]
  for i, j in es:
    adj[i].append(j)
    adj[j].append(i)
  for a in adj:
    a.sort()
  max_deg = max(len(a) for a in adj)
  col = _misra_gries(n, es, adj, max_deg)
  classes: list[list[Edge]] = [[] for _ in range(max_deg + 1)]
  for i, j in es:
    classes[col.colour[i][j]].append((i, j))
  return [sorted(m) for m in classes if m]


def matching_permutation(n: int, matching: Sequence[Sequence[int]]) -> list[int]:
  """The involution of one matching, for ``lax.ppermute``.

  Args:
    n: number of workers.
    matching: vertex-disjoint edges ``(i, j)``.

  Returns:
    ``perm`` of length ``n`` with ``perm[i]`` the partner of worker ``i`` in the matching, or
    ``i`` itself when ``i`` is unmatched; ``perm[perm[i]] == i``. The ``ppermute`` pairs are
    ``[(i, perm[i]) for i in range(n) if perm[i] != i]``.

  Raises:
    ValueError: bad ``n``, a bad edge, or two edges sharing a worker.
  """
  n = _check_n(n)
  (m,) = _check_matchings(n, [matching])
  perm = list(range(n))
  for i, j in m:
    perm[i], perm[j] = j, i
  return perm


def matching_laplacians(n: int, matchings: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
  """Laplacians of the matchings, float64 ``[M, n, n]``.

  ``L_j = sum_{(i, k) in G_j} (e_i - e_k)(e_i - e_k)^T``; for a matching ``L_j^2 = 2 L_j``.
  ``M = 0`` gives shape ``[0, n, n]``.

  Raises:
    ValueError: bad ``n``, bad edge, an edge in two matchings, or a non-matching.
  """
  n = _check_n(n)
  ms = _check_matchings(n, matchings)
  out = np.zeros((len(ms), n, n), dtype=np.float64)
  for k, m in enumerate(ms):
    for i, j in m:
      out[k, i, i] += 1.0
      out[k, j, j] += 1.0
      out[k, i, j] -= 1.0
      out[k, j, i] -= 1.0
  return out


class MatchaPlan(NamedTuple):
  """Everything the trainer needs, computed once on the host by :func:`plan`.

  Attributes:
    n: number of workers.
    matchings: ``M`` matchings, each a sorted list of ``(i, j)``, ``i < j``.
    probs: activation probabilities, float64 ``[M]`` in ``[0, 1]``.
    alpha: mixing weight of ``W(t) = I - alpha L(t)``.
    rho: ``||E[W^T W] - J||_2`` (spectral norm; dimensionless).
    laplacians: float64 ``[M, n, n]``.
  """

  n: int
  matchings: list[list[tuple[int, int]]]
  probs: np.ndarray
  alpha: float
  rho: float
  laplacians: np.ndarray


def sample_activations(plan: MatchaPlan, seed: int, step: int) -> np.ndarray:
  """MATCHA's activations ``B_j ~ Bernoulli(p_j)`` of one step, bool ``[M]``.

  Drawn on the host from ``np.random.default_rng([seed, step])``, so every worker (and a
  resumed run) sees the same draw; the trainer passes them to the jitted step as an input.
  """
  m = len(plan.matchings)
  return np.random.default_rng([int(seed), int(step)]).random(m) < np.asarray(plan.probs)
