"""Algorithms as recipes: ``config.algorithm`` names a short composition in one registry.

A recipe is a function ``build(b: Builder) -> Recipe`` registered with :func:`register`. The
:class:`Builder` hands out the pieces a recipe composes, built from the config: the local
optimizer (with Non-blocking SGD's skip rule when mini-batches may be missing), communications
(all-reduce, gossip over the topology, MATCHA's matchings) and the reducers of gradients and
models (compressed with error feedback when ``config.compression.name`` is set). The
cross-cutting pieces are applied to every recipe by :func:`build`, never by a recipe:

* the gradient source (full batch, or the mean over the finished mini-batches);
* consensus control (Kong et al. 2021) over the recipe's ``gossip``, when it has one;
* compression, wherever the recipe asked for a reducer: a recipe that never does (gossip
  exchanges models) refuses it with the reason it declared.

Adding an algorithm: a communication or wrapper if a new one is needed, then one
registration, from any file (``docs/design.md``, "Adding an algorithm")::

    @recipes.register("my_sgd")
    def my_sgd(b):
      comm = b.allreduce()
      return recipes.Recipe(chain(b.gradient_reducer(comm), b.optimizer("global")),
                            decentralized=False, primary=comm)

An algorithm's own config sections and rules come with its registration (``sections=``,
``check=``): ``config`` derives its defaults, checks and warnings from this registry.

What lives here (the build layer: these modules import the layers below, transforms,
communications, codecs and host parts, never ``run`` or the programs):

* ``registry.py``: :class:`Recipe`, :class:`Section`, :func:`register`, the registry and the
  rules between an algorithm and the shared sections (:func:`combination_errors`);
* ``builder.py``: :class:`Builder` (the pieces a recipe composes) and :func:`build`;
* ``synchronous.py``: the lockstep algorithms and their config sections;
* ``asynchronous.py``: the asynchronous family on the event clock;
* ``lowcomm.py``: DiLoCo's descendants (DeMo, SparseLoCo, NoLoCo);
* ``sampled.py``: a fresh graph each round (Epidemic Learning, Teleportation).

Importing this package registers every built-in algorithm, whatever was imported before.
"""

from nbsgd_jax.recipes.registry import (CLOCKS, GOSSIP_REASON, REGISTRY, SECTIONS, Entry,
                                        Reason, Recipe, Section, combination_errors,
                                        event_clock_errors, gossip_recipes, is_asynchronous,
                                        register, registrations, section_owners)
from nbsgd_jax.recipes.builder import Builder, build
from nbsgd_jax.recipes import synchronous  # noqa: F401  (registers the lockstep algorithms)
from nbsgd_jax.recipes import asynchronous  # noqa: F401  (registers the event-clock family)
from nbsgd_jax.recipes import lowcomm  # noqa: F401  (registers DiLoCo's descendants)
from nbsgd_jax.recipes import sampled  # noqa: F401  (Epidemic Learning, Teleportation)
from nbsgd_jax.recipes.synchronous import (DILOCO, check_dpsgd_config, dpsgd,
                                           dpsgd_defaults)
from nbsgd_jax.recipes.asynchronous import check_sgp, local_steps_per_worker, two_colouring

__all__ = ["CLOCKS", "DILOCO", "GOSSIP_REASON", "REGISTRY", "SECTIONS", "Builder", "Entry",
           "Reason", "Recipe", "Section", "asynchronous", "build", "check_dpsgd_config",
           "check_sgp", "combination_errors", "dpsgd", "dpsgd_defaults", "event_clock_errors",
           "gossip_recipes", "local_steps", "is_asynchronous", "lowcomm", "register",
           "registrations", "sampled", "section_owners",
           "synchronous", "two_colouring"]
