"""The pieces a recipe composes (:class:`Builder`), built from the config on request, and
:func:`build`: the registered recipe of ``config.algorithm`` with the cross-cutting pieces
(the gradient source, consensus control, compression) applied."""

from __future__ import annotations

from typing import Any, Callable, Optional

import ml_collections
import numpy as np

from nbsgd_jax import codecs
from nbsgd_jax.core import checks
from nbsgd_jax.transforms import consensus
from nbsgd_jax.recipes import optim
from nbsgd_jax import transforms as T
from nbsgd_jax.core.axis import AXIS
from nbsgd_jax.communications import (AllReduce, Gossip, Matchings, MessageAllGather,
                                      SparseAllGather)
from nbsgd_jax.communications.allreduce import HierarchicalAllReduce
from nbsgd_jax.host import cluster_config
from nbsgd_jax.topology import matcha as matcha_lib
from nbsgd_jax.host import periods as local_sgd_lib
from nbsgd_jax.transforms import powersgd  # noqa: F401  (its reducer)
from nbsgd_jax.transforms.consensus import consensus_control, log_consensus_distance
from nbsgd_jax.recipes.registry import REGISTRY, SECTIONS, Recipe, combination_errors


class Builder:
  """The pieces of a recipe, built from the config on request.

  Args:
    cfg: the run's config.
    topology: the :class:`~nbsgd_jax.topology.Topology`.
    axis_name: the worker axis of the backend.
  """

  def __init__(self, cfg: ml_collections.ConfigDict, topology=None, axis_name: Any = AXIS):
    self.cfg, self.topology, self.axis_name = cfg, topology, axis_name
    self.n = cfg.num_workers
    # mini-batches may be missing (Non-blocking SGD, failures): count-weighted means, skips
    self.weighted = cluster_config.counted_steps(cfg)
    self.compressed = cfg.compression.name != codecs.NONE
    self.compression_used = False

  # ------------------------------------------------------------------ optimizers

  def optimizer(self, skip: Optional[str] = None) -> T.WorkerTransform:
    """The local optimizer (weight decay, SGD with momentum), its numbers read from the
    step's hparams (:func:`nbsgd_jax.recipes.optim.hparams`); ``skip`` = ``"local"`` / ``"global"``
    adds the no-step rule of :func:`~nbsgd_jax.transforms.skip_when_idle` when mini-batches
    may be missing."""
    opt = T.injected(lambda hp: T.from_optax(optim.make_optimizer(self.cfg, hp)),
                     optim.hparams(self.cfg))
    return T.skip_when_idle(opt, skip) if skip and self.weighted else opt

  def injected(self, factory: Callable, *keys: str) -> T.WorkerTransform:
    """``factory(*values)`` (a transform) built at each step from the step's hparams of the
    config keys ``keys`` (each declared in its section's ``hparams``, or ``"seed"``):
    :func:`~nbsgd_jax.transforms.injected`.

    Raises:
      ValueError: a key not declared as a hyperparameter (it would key the program).
    """
    for key in keys:
      section, _, name = key.rpartition(".")
      spec = SECTIONS.get(section)
      if key != "seed" and (spec is None or name not in spec.hparams):
        raise ValueError(f"config.{key} is not declared as a hyperparameter: add it to the "
                         f"hparams of config section {section!r}")
    return T.injected(lambda v: factory(*(v[k] for k in keys)),
                      {k: checks.as_input(self.cfg, k) for k in keys})

  # ------------------------------------------------------------------ communications

  def allreduce(self, ring: bool = False, key: str = "allreduce") -> AllReduce:
    """An all-reduce; with ``cluster.allreduce_group_size`` = g, the hierarchical one over groups
    of g consecutive workers (:class:`~nbsgd_jax.communications.HierarchicalAllReduce`);
    ``cluster.allreduce_algorithm='tree'`` charges the double binary tree;
    ``cluster.rebuild_collectives`` charges it over the live workers after a failure."""
    g, tree = self.cfg.cluster.allreduce_group_size, self.cfg.cluster.allreduce_algorithm == "tree"
    if g:
      return HierarchicalAllReduce(self.n, g, self.axis_name, key, self.weighted, ring,
                                   tree=tree)
    return AllReduce(self.n, self.axis_name, key, self.weighted, ring, tree=tree,
                     rebuild=self.cfg.cluster.rebuild_collectives)

  def gossip(self, key: str = "gossip", lazy: bool = False, kind=Gossip) -> Gossip:
    """Gossip over the topology's W (or its period of W_t); ``lazy``: over ``(I + W) / 2``;
    ``kind``: the class (:class:`~nbsgd_jax.communications.CompressedGossip` for CHOCO)."""
    g = kind.of_topology(self.topology, self.axis_name, key)
    if lazy:
      g = kind([(w + np.eye(self.n)) / 2 for w in g.phases], self.axis_name, key)
    return g

  def matchings(self) -> Matchings:
    """MATCHA's matchings of the topology's graph (:func:`nbsgd_jax.topology.matcha.plan`: the
    decomposition, probabilities and alpha, solved with cvxpy)."""
    plan = matcha_lib.plan(self.n, self.topology.edges, self.cfg.matcha.budget)
    return Matchings(plan, self.n, self.cfg.matcha.seed, self.axis_name)

  def fixed_periods(self, tau: int) -> Callable[[float], Any]:
    """A :attr:`Recipe.planner` of periods of ``tau`` steps."""
    return lambda offset: local_sgd_lib.SyncPlanner("fixed", tau)

  # ------------------------------------------------------------------ reducers

  def codec(self):
    """The :class:`~nbsgd_jax.codecs.Codec` of ``config.compression`` (marks compression as
    used by the recipe)."""
    self.compression_used = True
    return codecs.from_config(self.cfg.compression)

  def _compressed(self, by: str) -> T.WorkerTransform:
    c = self.cfg.compression
    if codecs.REGISTRY[c.name].reducer:  # a reducer of its own (PowerSGD), not a codec
      self.compression_used = True
      comm = AllReduce(self.n, self.axis_name, c.name, self.weighted)
      return codecs.from_config(c)(comm, seed=self.cfg.seed, use_residual=c.error_feedback,
                                   weight_by=by)
    codec = self.codec()
    comm = (SparseAllGather if codec.sparse else MessageAllGather)(
        self.n, self.axis_name, "sparse_allgather" if codec.sparse else "allgather",
        self.weighted)
    return T.error_feedback(codec, axis_name=self.axis_name, flatten=c.flatten,
                            seed=self.cfg.seed, use_residual=c.error_feedback,
                            communication=comm, weight_by=by)

  def gradient_reducer(self, allreduce: AllReduce) -> T.WorkerTransform:
    """The mean gradient: ``allreduce`` (count-weighted under Non-blocking SGD), or the
    compressed mean with error feedback when compression is on."""
    if self.compressed:
      return self._compressed("count")
    return T.mean_of(allreduce, "count")

  def delta_reducer(self, allreduce: AllReduce) -> T.WorkerTransform:
    """The mean of model differences (pseudo-gradients) over the live workers: ``allreduce``,
    or compressed with error feedback."""
    if self.compressed:
      return self._compressed("alive")
    return T.mean_of(allreduce, "alive")

  def model_reducer(self, allreduce: AllReduce) -> T.WorkerTransform:
    """The model average over the live workers: ``allreduce`` of the models, or, compressed,
    the compressed mean of the differences to the last average
    (:func:`~nbsgd_jax.transforms.via_anchor`)."""
    if self.compressed:
      return T.via_anchor(self.delta_reducer(allreduce))
    return T.mean_of(allreduce, "alive")


def build(cfg: ml_collections.ConfigDict, topology=None, axis_name: Any = AXIS) -> Recipe:
  """The recipe of ``cfg.algorithm`` with the cross-cutting pieces applied (module docstring).

  Raises:
    ValueError: an unknown algorithm or an undefined combination (:func:`combination_errors`),
      or a recipe that declares compression but never asks for a reducer.
  """
  errs = combination_errors(cfg)
  if errs:
    raise ValueError("\n".join(errs))
  b = Builder(cfg, topology, axis_name)
  recipe = REGISTRY[cfg.algorithm].build(b)
  if b.compressed and not b.compression_used:
    raise ValueError(f"recipe {cfg.algorithm!r} accepts compression but asked for no reducer")
  cs = cfg.consensus
  if cs.control:
    if recipe.gossip is None:
      raise ValueError(f"recipe {cfg.algorithm!r} is registered with gossips=True but returned "
                       "no Recipe.gossip for consensus control")
    inner = recipe.transform
    control = lambda seed: consensus.Control(cs.max_gossip_steps, cs.measure, cs.sketch_size,
                                             seed, gradient_stats=cs.critical)
    recipe = recipe._replace(transform=b.injected(lambda seed: consensus_control(
        inner, recipe.gossip, control(seed), cfg.num_workers, cs.log_every_step), "seed"))
  elif cs.log_every_step and recipe.decentralized:
    recipe = recipe._replace(transform=log_consensus_distance(recipe.transform, axis_name))
  return recipe
