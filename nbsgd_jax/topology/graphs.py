"""The named communication graphs: each builds a :class:`~nbsgd_jax.topology.base.Topology`.

Static graphs (weights ``WEIGHTS`` of :mod:`nbsgd_jax.topology.base`, Metropolis-Hastings by
default): :func:`ring`, :func:`torus` (shape :func:`torus_shape`), :func:`exponential` (Ying
et al. 2021, "Exponential Graph is Provably Efficient for Decentralized Deep Training",
Sec. 2), :func:`complete`, :func:`star`, :func:`erdos_renyi` (a connected ``G(n, p)``) and
:func:`matcha_graph0` (MATCHA's base graph 0, Wang et al. 2019, Fig. 1(a)). Time-varying:
:func:`one_peer_exponential` (Ying et al. 2021, Sec. 3), ``period`` phase matrices ``W_t``.
:func:`nbsgd_jax.topology.make` builds any of them by name (``config.topology``).

Errors (``ValueError``): ``n < 1`` or not an integer, unknown ``weights``, ``torus`` shape
not matching ``n``, ``erdos_renyi`` ``p`` outside ``(0, 1]`` or no connected sample found.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from nbsgd_jax.topology.base import (WEIGHTS, Topology, _check_n, _normalise_edges,
                                     _num_components, from_edges)


def ring(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Ring ``0 - 1 - ... - (n-1) - 0``. ``n = 1``: no edge; ``n = 2``: one edge.

  With Metropolis-Hastings weights and ``n >= 3`` every worker keeps 1/3 and takes 1/3 from
  each neighbour.
  """
  n = _check_n(n)
  return from_edges(n, [(i, (i + 1) % n) for i in range(n) if n > 1], weights, name="ring")


def torus(rows: int, cols: int, weights: str = "metropolis_hastings") -> Topology:
  """2-D wrap-around grid, ``n = rows * cols``; worker ``r * cols + c`` sits at ``(r, c)``.

  Worker ``(r, c)`` is linked to ``(r, c +- 1 mod cols)`` and ``(r +- 1 mod rows, c)``: degree
  4 when ``rows, cols >= 3``. A side of length 2 gives one link along it (not two), a side
  of length 1 none, so ``torus(1, n)`` is ``ring(n)`` and ``torus(2, 2)`` a 4-cycle.

  Raises:
    ValueError: ``rows`` or ``cols`` not an integer >= 1, unknown ``weights``.
  """
  rows, cols = _check_n(rows, "rows"), _check_n(cols, "cols")
  edges = []
  for r in range(rows):
    for c in range(cols):
      i = r * cols + c
      if cols > 1:
        edges.append((i, r * cols + (c + 1) % cols))
      if rows > 1:
        edges.append((i, ((r + 1) % rows) * cols + c))
  return from_edges(rows * cols, edges, weights, name="torus")


def torus_shape(n: int) -> tuple[int, int]:
  """Most square factorisation ``rows * cols = n`` with ``rows <= cols``.

  E.g. 16 -> (4, 4), 8 -> (2, 4), 12 -> (3, 4); a prime ``n`` gives ``(1, n)``, i.e. a ring.

  Raises:
    ValueError: ``n`` not an integer >= 1.
  """
  n = _check_n(n)
  rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
  return rows, n // rows


def exponential(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Static exponential graph: ``i`` linked to ``i +- 2^k mod n`` for every ``2^k < n``.

  The directed graph of Ying et al. (2021), "Exponential Graph is Provably Efficient for
  Decentralized Deep Training", Sec. 2 (also Assran et al. 2019, SGP), symmetrised so that
  ``W`` is symmetric; duplicate links (e.g. ``+2^k = -2^k`` when ``2^(k+1) = n``) are merged.
  Degree ``2 * ceil(log2 n) - 1`` for ``n`` a power of 2, e.g. ``exponential(8)``: worker 0
  is linked to ``{1, 2, 4, 6, 7}``. ``n = 1``: no edge; ``n = 2``: one edge.

  Raises:
    ValueError: ``n`` not an integer >= 1, unknown ``weights``.
  """
  n = _check_n(n)
  edges = []
  s = 1
  while s < n:
    edges.extend((i, (i + s) % n) for i in range(n))
    s *= 2
  return from_edges(n, edges, weights, name="exponential")


def complete(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Fully connected graph; its mixing matrix is ``J = 11^T / n`` (exact averaging)."""
  n = _check_n(n)
  return from_edges(n, [(i, j) for i in range(n) for j in range(i + 1, n)], weights,
                    name="complete")


def star(n: int, weights: str = "metropolis_hastings") -> Topology:
  """Star: worker 0 is linked to every other worker (``n - 1`` edges).

  The Laplacian has eigenvalues ``0, 1 (n - 2 times), n``. MH and uniform weights both give
  ``W = I - L / n`` with SLEM ``1 - 1/n`` (``n >= 3``); best constant
  ``W = I - 2 L / (n + 1)`` with SLEM ``(n - 1) / (n + 1)``. ``n = 1``: no edge; ``n = 2``:
  one edge, ``W = J``.

  Raises:
    ValueError: ``n`` not an integer >= 1, unknown ``weights``.
  """
  n = _check_n(n)
  return from_edges(n, [(0, i) for i in range(1, n)], weights, name="star")


def _check_p(p, field: str) -> float:
  if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not (0.0 < p <= 1.0):
    raise ValueError(f"{field}={p!r} is not allowed: erdos_renyi needs an edge probability "
                     "in (0, 1]")
  return float(p)


def _check_seed(seed, field: str) -> int:
  if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"{field}={seed!r} is not allowed: it must be an integer >= 0")
  return int(seed)


def _erdos_renyi(n: int, p: float, seed: int, weights: str, max_tries: int,
                 p_field: str, seed_field: str) -> Topology:
  n = _check_n(n)
  p = _check_p(p, p_field)
  seed = _check_seed(seed, seed_field)
  max_tries = _check_n(max_tries, "max_tries")
  if weights not in WEIGHTS:
    raise ValueError(f"weights={weights!r} is not allowed: use one of {WEIGHTS}")
  pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    keep = rng.random(len(pairs)) < p
    edges = [e for e, k in zip(pairs, keep) if k]
    if _num_components(n, edges) == 1:
      return from_edges(n, edges, weights, name="erdos_renyi")
  raise ValueError(
      f"{p_field}={p!r} is not allowed for n={n}: no connected G(n, p) in {max_tries} draws "
      f"(seed {seed}); connectivity needs roughly p > ln(n) / n = {np.log(n) / n:.3g}")


def erdos_renyi(n: int, p: float, seed: int = 0, weights: str = "metropolis_hastings",
                max_tries: int = 1000) -> Topology:
  """Connected Erdos-Renyi graph ``G(n, p)``: every pair is linked with probability ``p``.

  Samples are drawn from ``numpy.random.default_rng(seed)`` until one is connected (at most
  ``max_tries``), so the result is a function of ``(n, p, seed)``: every worker building it
  with the same seed gets the same graph. This is ``G(n, p)`` conditioned on connectivity.
  ``n = 1``: no edge; ``p = 1``: the complete graph.

  Raises:
    ValueError: ``p`` not in ``(0, 1]``, ``seed`` not an integer >= 0, no connected sample in
      ``max_tries`` draws (the message names ``p`` and ``n``), unknown ``weights``.
  """
  return _erdos_renyi(n, p, seed, weights, max_tries, p_field="p", seed_field="seed")


def one_peer_exponential(n: int) -> Topology:
  """Time-varying one-peer exponential graph (Ying et al. 2021, Sec. 3).

  With ``tau = ceil(log2 n)`` and ``s_t = 2^(t mod tau)``, at step ``t`` worker ``i`` sends
  to ``(i + s_t) mod n`` and averages with what it receives: ``W_t = (I + P_t) / 2`` with
  ``P_t[i, (i - s_t) mod n] = 1`` (row ``i`` receives from ``i - s_t``). Every ``W_t`` is
  doubly stochastic, not symmetric in general; one message per worker per step. For ``n`` a
  power of 2 the product over one period is exactly ``J`` (exact averaging in ``tau`` steps).

  The returned :class:`Topology` has ``period = max(tau, 1)``, ``phases = (W_0, ...)``,
  ``mixing_matrix`` the MEAN of the phases (doubly stochastic, not symmetric in general),
  ``edges`` the union over phases (the static :func:`exponential` graph's edges).
  ``n = 1``: one phase ``[[1]]``; ``n = 2``: one phase ``J`` (the peer is always the other
  worker), so ``is_time_varying`` is False for ``n <= 2``. Weights are fixed by
  construction (no ``weights`` argument).

  Raises:
    ValueError: ``n`` not an integer >= 1.
  """
  n = _check_n(n)
  tau = (n - 1).bit_length()  # ceil(log2 n) for n >= 1
  if tau == 0:
    w = np.ones((1, 1))
    return Topology(name="one_peer_exponential", n=1, edges=(), mixing_matrix=w, period=1,
                    phases=(w.copy(),))
  idx = np.arange(n)
  phases, edges = [], []
  for k in range(tau):
    s = 2 ** k
    w = 0.5 * np.eye(n)
    w[idx, (idx - s) % n] += 0.5
    phases.append(w)
    edges.extend((i, (i + s) % n) for i in range(n))
  e = _normalise_edges(n, edges)
  mean = np.mean(phases, axis=0)
  return Topology(name="one_peer_exponential", n=n, edges=e, mixing_matrix=mean,
                  period=tau, phases=tuple(phases))


# JYWa/MATCHA util.py select_graph(0): "8-node erdos-renyi graph as shown in Fig. 1(a) in the
# main paper" (Wang et al. 2019), listed there as its matchings.
MATCHA_GRAPH_0 = ((1, 5), (6, 7), (0, 4), (2, 3), (1, 7), (3, 6), (1, 0), (3, 7), (5, 6),
                  (1, 2), (7, 0), (3, 1))


def matcha_graph0(n: int, weights: str = "metropolis_hastings") -> Topology:
  """MATCHA's base graph 0 (:data:`MATCHA_GRAPH_0`, 8 nodes, 12 edges; Wang et al.,
  "MATCHA", 2019, Fig. 1(a); JYWa/MATCHA ``select_graph(0)``).

  Raises:
    ValueError: ``n != 8`` (named ``num_workers``).
  """
  if n != 8:
    raise ValueError(f"num_workers={n!r} is not allowed with topology='matcha_graph0': "
                     "MATCHA's graph 0 has 8 nodes")
  return from_edges(8, MATCHA_GRAPH_0, weights, name="matcha_graph0")
