"""Distributed training algorithms, each the program of one worker on a named axis.

An :class:`~nbsgd_jax.algorithms.base.Algorithm` turns one worker's gradient into its next
parameters, communicating with ``lax`` collectives on ``axis_name``; the same program runs
under ``jax.vmap`` (simulate) or ``jax.shard_map`` (mesh).
"""

from nbsgd_jax.algorithms.allreduce import allreduce, allreduce_ring, sparse_allreduce
from nbsgd_jax.algorithms.base import AXIS, Algorithm, StepInputs
from nbsgd_jax.algorithms.dpsgd import (dpsgd, gossip_sgd, matcha_mixer, static_mixer,
                                        time_varying_mixer)

__all__ = ["AXIS", "Algorithm", "StepInputs", "allreduce", "allreduce_ring", "dpsgd", "gossip_sgd",
           "matcha_mixer", "sparse_allreduce", "static_mixer", "time_varying_mixer"]
