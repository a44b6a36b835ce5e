"""Worker transforms: the device side of every algorithm, composed like optax.

* :mod:`~nbsgd_jax.transforms.base`: the protocol (:class:`WorkerTransform`,
  :class:`StepContext`, :func:`chain`, :func:`from_optax`, :func:`skip_when_idle`);
* :mod:`~nbsgd_jax.transforms.minibatches`: Non-blocking SGD's gradient source (He & Dube
  2022);
* :mod:`~nbsgd_jax.transforms.error_feedback`: compression with error feedback (Shi et al.
  2019);
* :mod:`~nbsgd_jax.transforms.wrappers`: reducers, gossip, periodic synchronisation (local
  SGD, DiLoCo);
* :mod:`~nbsgd_jax.transforms.consensus`: consensus control (Kong et al. 2021).
"""

from nbsgd_jax.transforms.base import (CONTEXT_AXES, StepContext, WorkerTransform,
                                       as_worker_transform, chain, from_optax, is_summed,
                                       injected, merge_reports, no_state, replace_params,
                                       skip_unless, skip_when_idle)
from nbsgd_jax.transforms.error_feedback import ErrorFeedbackState, densify, error_feedback
from nbsgd_jax.transforms.minibatches import (AccumulateState, accumulate_minibatches,
                                              add_minibatch, add_minibatch_with_state,
                                              mean_of_sums, minibatch_mean_gradient,
                                              split_minibatches, stateless, zero_sums)
from nbsgd_jax.transforms.wrappers import (AnchorState, OuterState, PeriodicState,
                                           Synchronisation, average_models, gossip_of,
                                           gossip_step, mean_of, outer_step, periodic,
                                           streaming_outer_step, via_anchor)

__all__ = [
    "CONTEXT_AXES", "AccumulateState", "AnchorState", "ErrorFeedbackState", "OuterState", "PeriodicState",
    "StepContext", "Synchronisation", "WorkerTransform", "accumulate_minibatches",
    "add_minibatch", "add_minibatch_with_state", "mean_of_sums", "zero_sums",
    "as_worker_transform", "average_models", "chain", "densify", "error_feedback",
    "from_optax", "gossip_of", "gossip_step", "is_summed", "mean_of", "merge_reports",
    "minibatch_mean_gradient", "no_state", "outer_step", "periodic", "replace_params",
    "streaming_outer_step",
    "injected", "skip_unless", "skip_when_idle", "split_minibatches", "stateless", "via_anchor",
]
