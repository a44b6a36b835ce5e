"""Distributed training algorithms, each the program of one worker on a named axis.

An :class:`~nbsgd_jax.algorithms.base.Algorithm` turns one worker's gradient into its next
parameters, communicating with ``lax`` collectives on ``axis_name``; the same program runs
under ``jax.vmap`` (simulate) or ``jax.shard_map`` (mesh).
"""

from nbsgd_jax.algorithms.allreduce import allreduce, allreduce_ring, sparse_allreduce
from nbsgd_jax.algorithms.base import AXIS, Algorithm, StepInputs
from nbsgd_jax.algorithms.dpsgd import (dpsgd, gossip_sgd, matcha_mixer, static_mixer,
                                        time_varying_mixer)
from nbsgd_jax.algorithms.local_sgd import DiLoCoState, diloco, local_sgd, outer_nesterov

__all__ = ["AXIS", "Algorithm", "DiLoCoState", "StepInputs", "allreduce", "allreduce_ring",
           "diloco", "dpsgd", "gossip_sgd", "local_sgd", "matcha_mixer", "outer_nesterov",
           "sparse_allreduce", "static_mixer", "time_varying_mixer"]
