"""The base every layer may use, with no algorithm in it: the worker axis (:mod:`~nbsgd_jax.core.
axis`), the backends that run the worker program over the workers (:mod:`~nbsgd_jax.core.
backends`) and JAX's multi-process runtime (:mod:`~nbsgd_jax.core.multihost`), the checks of one
config key (:mod:`~nbsgd_jax.core.checks`), crash-safe files and the workdir lock
(:mod:`~nbsgd_jax.core.files`), checkpoints (:mod:`~nbsgd_jax.core.checkpoint`), the measures of a
decentralized run (:mod:`~nbsgd_jax.core.metrics`), TensorBoard files
(:mod:`~nbsgd_jax.core.tensorboard`) and what produced a record (:mod:`~nbsgd_jax.core.
provenance`). A module here imports nothing else of the package."""
