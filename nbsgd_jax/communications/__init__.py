"""Communications that know their cost: each primitive is one object with a device half
(apply on the worker axis, bytes this worker sent) and a host half (the step's pattern for the
simulated clock). See :mod:`nbsgd_jax.communications.base`."""

from nbsgd_jax.communications.allreduce import AllReduce, HierarchicalAllReduce
from nbsgd_jax.communications.base import Communication, Pattern, Round
from nbsgd_jax.communications.gossip import CompressedGossip, Gossip, Matchings
from nbsgd_jax.communications.masked import MaskedAllReduce
from nbsgd_jax.communications.sparse import (ContributorAllGather, MessageAllGather,
                                             SparseAllGather)

__all__ = ["AllReduce", "Communication", "CompressedGossip", "ContributorAllGather", "Gossip",
           "HierarchicalAllReduce", "MaskedAllReduce",
           "Matchings", "MessageAllGather", "Pattern", "Round", "SparseAllGather"]
