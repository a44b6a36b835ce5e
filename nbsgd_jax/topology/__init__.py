"""Communication graphs and their mixing matrices.

A :class:`Topology` is an undirected graph on ``n`` workers plus a doubly stochastic mixing
matrix ``W`` (numpy ``[n, n]``) used by gossip averaging (D-PSGD, Lian et al., NeurIPS 2017,
Eq. (2): ``x_i <- sum_j W_ij x_j``; row ``i`` is the receiver). Static topologies have one
symmetric ``W``; time-varying ones (:func:`one_peer_exponential`) have ``period`` phase
matrices ``W_t`` (:meth:`Topology.mixing_matrix_at`), each doubly stochastic but not
necessarily symmetric.

Graphs: :func:`ring`, :func:`torus`, :func:`exponential`, :func:`complete`, :func:`star`,
:func:`erdos_renyi`, :func:`one_peer_exponential`, :func:`from_edges`; :func:`make` builds
any of them by name (``config.topology``).

Where it lives (every name is importable from here):

* :mod:`nbsgd_jax.topology.base`: the :class:`Topology` type, the weights of a mixing matrix
  (``WEIGHTS``: Metropolis-Hastings, uniform, best constant; Xiao & Boyd 2004),
  :func:`from_edges`, :func:`laplacian`, :func:`slem` and :func:`spectral_gap` (Boyd et al.
  2004), and the defined results of degenerate inputs (``n = 1``, ``n = 2``, duplicate
  edges, disconnected edge lists);
* :mod:`nbsgd_jax.topology.graphs`: the named graphs above (Ying et al. 2021 for the
  exponential ones, MATCHA's graph 0);
* here: ``TOPOLOGIES`` (name -> builder), :func:`make` and the config check
  :func:`check_config`;
* :mod:`nbsgd_jax.topology.matchings` and :mod:`nbsgd_jax.topology.matcha`: MATCHA's
  matchings and its plan (Wang et al. 2019).

Errors (``ValueError``): those of the builders (see their modules), an unknown topology name,
a ``torus`` shape not matching ``n``.
"""

from __future__ import annotations

from typing import Callable, Optional

from nbsgd_jax.core import checks
from nbsgd_jax.topology.base import (MIXING_WEIGHTS, WEIGHTS, Topology, from_edges,  # noqa: F401
                                     is_connected, laplacian, metropolis_hastings, mixing_matrix,
                                     slem, spectral_gap)
from nbsgd_jax.topology.graphs import (MATCHA_GRAPH_0, complete, erdos_renyi,  # noqa: F401
                                       exponential, matcha_graph0, one_peer_exponential, ring,
                                       star, torus, torus_shape)
# the private helpers, importable from here as before
from nbsgd_jax.topology.base import (_as_index, _best_constant_alpha, _check_n,  # noqa: F401
                                     _normalise_edges, _num_components)
from nbsgd_jax.topology.graphs import _check_p, _check_seed, _erdos_renyi  # noqa: F401


# name -> builder. Signatures differ (torus takes rows, cols; erdos_renyi p and seed;
# one_peer_exponential no weights): use :func:`make` for one uniform call.
TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "ring": ring,
    "torus": torus,
    "exponential": exponential,
    "one_peer_exponential": one_peer_exponential,
    "complete": complete,
    "star": star,
    "erdos_renyi": erdos_renyi,
    "matcha_graph0": matcha_graph0,
}
FIXED_SIZE = {"matcha_graph0": 8}  # graphs with one number of workers


def _torus_dims(n: int, rows: Optional[int], cols: Optional[int]) -> tuple[int, int]:
  if rows is None and cols is None:
    return torus_shape(n)
  if rows is not None:
    rows = _check_n(rows, "topology_rows")
  if cols is not None:
    cols = _check_n(cols, "topology_cols")
  if cols is None:
    if n % rows:
      raise ValueError(f"topology_rows={rows!r} is not allowed: it must divide n={n}")
    return rows, n // rows
  if rows is None:
    if n % cols:
      raise ValueError(f"topology_cols={cols!r} is not allowed: it must divide n={n}")
    return n // cols, cols
  if rows * cols != n:
    raise ValueError(f"topology_rows={rows!r} is not allowed with topology_cols={cols!r}: "
                     f"rows * cols = {rows * cols} must equal n={n}")
  return rows, cols


def make(name: str, n: int, weights: str = "metropolis_hastings", p: Optional[float] = None,
         seed: int = 0, rows: Optional[int] = None, cols: Optional[int] = None) -> Topology:
  """Build a topology by name (``config.topology``) on ``n`` workers.

  Args:
    name: a key of ``TOPOLOGIES``.
    n: number of workers.
    weights: one of ``WEIGHTS``; checked for every name, but ``one_peer_exponential`` has
      fixed weights and ignores it.
    p: edge probability for ``"erdos_renyi"`` (required there, in ``(0, 1]``).
    seed: sampling seed for ``"erdos_renyi"``.
    rows, cols: shape for ``"torus"``, ``rows * cols == n``; one of them may be given and
      the other is ``n / it``; both None: the most square factorisation
      (:func:`torus_shape`; a prime ``n`` gives ``1 x n``, which is a ring).
    Arguments that do not apply to ``name`` are ignored.

  Raises:
    ValueError: unknown name (the message lists the allowed ones), unknown weights, bad
      ``n``, torus shape (names ``topology_rows``/``topology_cols``), erdos_renyi ``p`` or
      seed (names ``topology_p``/``topology_seed``).
  """
  if name not in TOPOLOGIES:
    raise ValueError(f"topology={name!r} is not allowed: use one of {sorted(TOPOLOGIES)}")
  n = _check_n(n)
  if weights not in WEIGHTS:
    raise ValueError(f"weights={weights!r} is not allowed: use one of {WEIGHTS}")
  if name == "torus":
    r, c = _torus_dims(n, rows, cols)
    return torus(r, c, weights=weights)
  if name == "erdos_renyi":
    return _erdos_renyi(n, p, seed, weights, 1000, p_field="topology_p",
                        seed_field="topology_seed")
  if name == "one_peer_exponential":
    return one_peer_exponential(n)
  return TOPOLOGIES[name](n, weights=weights)


# ----------------------------------------------------------------------------- config


def check_config(cfg, errs: list) -> None:
  """Config check of topology, mixing_weights, topology_* (torus: rows x cols = num_workers)."""
  checks.choice(cfg, errs, "topology", tuple(TOPOLOGIES))
  checks.choice(cfg, errs, "mixing_weights", MIXING_WEIGHTS)
  checks.number(cfg, errs, "topology_p", 0, lo_open=True, hi=1)
  checks.integer(cfg, errs, "topology_seed", 0)
  rows_ok = checks.integer(cfg, errs, "topology_rows", 0)
  cols_ok = checks.integer(cfg, errs, "topology_cols", 0)
  n, r, c = cfg.get("num_workers"), cfg.get("topology_rows"), cfg.get("topology_cols")
  if cfg.get("topology") == "matcha_graph0" and n != 8:
    errs.append(f"config.topology='matcha_graph0' is not allowed with config.num_workers={n}: "
                "MATCHA's graph 0 has 8 nodes")
  if cfg.get("topology") != "torus" or not (rows_ok and cols_ok and checks.is_int(n)) or not (r or c):
    return
  if r and c and r * c != n:
    errs.append(f"config.topology_rows={r} x config.topology_cols={c} is not allowed with "
                f"config.num_workers={n}: rows x cols must equal num_workers")
  elif n % (r or c):
    errs.append(f"config.topology_{'rows' if r else 'cols'}={r or c} is not allowed: it must "
                f"divide config.num_workers={n}")
