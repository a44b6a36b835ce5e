"""``train(cfg, workdir)``: one training run (:mod:`nbsgd_jax.run.loop`), ``sweep(cfg,
workdir)``: a grid of runs (:mod:`nbsgd_jax.run.sweep`), and the names of the run's parts in
one place for scripts and tests.

The layers (``docs/design.md``): worker transforms (:mod:`nbsgd_jax.transforms`) and
communications (:mod:`nbsgd_jax.communications`) on the device, composed by recipes
(:mod:`nbsgd_jax.recipes`); host parts (:mod:`nbsgd_jax.host`); the run
(:mod:`nbsgd_jax.run`: set-up, backends, task, the compiled step, evaluation, records, the
loop).
"""

from nbsgd_jax.recipes.optim import make_optimizer, make_schedule
from nbsgd_jax.core.backends import DEVICE_AXIS, Backend, make_backend, workers_per_device
from nbsgd_jax.run.evaluation import TrainingDiverged, make_eval_fn, make_train_loss_fn
from nbsgd_jax.run.loop import Run, Stepper, train
from nbsgd_jax.run.sweep import sweep, train_runs
from nbsgd_jax.run.records import MetricsWriter
from nbsgd_jax.run.setup import Setup, init_state, make_host, setup
from nbsgd_jax.run.step import (Program, TrainState, device_context, device_contexts,
                                gradient_source, make_worker_step)
from nbsgd_jax.run.task import (WorkerData, cross_entropy, data_key, sample_batch_indices,
                                text_batch, worker_batch)

__all__ = [
    "DEVICE_AXIS", "Backend", "MetricsWriter", "Program", "Run", "Setup", "Stepper", "TrainState", "TrainingDiverged",
    "WorkerData", "cross_entropy", "data_key", "device_context", "device_contexts",
    "gradient_source",
    "init_state", "make_backend", "make_eval_fn", "make_host", "make_optimizer",
    "make_schedule", "make_train_loss_fn", "make_worker_step",
    "sample_batch_indices", "setup", "sweep", "text_batch", "train", "train_runs", "worker_batch",
    "workers_per_device",
]
