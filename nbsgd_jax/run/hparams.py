"""Runs as data: a config split into the structure of its compiled program and the program's
inputs.

A run's compiled step is a function of its *structure* (what changes shapes or code: the
algorithm, the model, n, the topology, the codec and its density, M, steps per dispatch, the
backend, the period plan) and takes its *hyperparameters* as an input: a dict of arrays
(:func:`values`: the schedule's numbers, momentum, weight decay, clipping, the algorithms'
constants declared in their sections' ``hparams``, the seed). Two configs with the same
:func:`structure_key` share compiled programs (:class:`nbsgd_jax.run.step.ProgramCache`);
keys the device never reads (:data:`HOST_KEYS`, the sections' ``host``) do not key them
either. ``docs/design.md``, "Runs as data".
"""

from __future__ import annotations

import json
from typing import Any

import ml_collections
import numpy as np

from nbsgd_jax.core import checks
from nbsgd_jax import config as config_lib
from nbsgd_jax.recipes import optim
from nbsgd_jax import recipes

# top-level keys read as the step's inputs (their structural facts: optim.structure)
TOP_LEVEL = optim.HPARAM_KEYS + ("seed",)
# top-level keys the compiled step never reads (the loop's, the records', the host's)
HOST_KEYS = ("progress", "eval_every", "checkpoint_every", "tensorboard", "stop_sim_time",
             "stop_train_loss", "stop_step", "overwrite", "data_cache", "compilation_cache",
             "sweep", "sweep_runs", "init_from", "budget_unit")


def _sections() -> dict:
  return {**config_lib.SECTIONS, **recipes.SECTIONS}


def keys(cfg: ml_collections.ConfigDict) -> list[str]:
  """The config keys (dotted) whose values are the step's inputs, not its structure."""
  out = list(TOP_LEVEL)
  for name, spec in _sections().items():
    if name in cfg:
      out += [f"{name}.{k}" for k in spec.hparams]
  return out


def values(cfg: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """The step's hyperparameter input: :func:`nbsgd_jax.recipes.optim.hparams` (float32 scalars, the
  step schedule's int32 ``lr_bounds [len(lr_milestones)]``), ``seed`` (int32) and every
  declared section key by its dotted name (``"diloco.outer_lr"``: float32)."""
  out: dict[str, Any] = {**optim.hparams(cfg), "seed": checks.as_input(cfg, "seed")}
  for name, spec in _sections().items():
    if name in cfg:
      out.update({f"{name}.{k}": checks.as_input(cfg, f"{name}.{k}")
                  for k in spec.hparams})
  return out


def structure(cfg: ml_collections.ConfigDict) -> dict:
  """The config without its hyperparameters and host keys, plus what of the hyperparameters
  is structure (:func:`nbsgd_jax.recipes.optim.structure`, the sections' ``structure``)."""
  d = cfg.to_dict()
  for k in TOP_LEVEL + HOST_KEYS:
    d.pop(k, None)
  facts = dict(optim.structure(cfg))
  for name, spec in _sections().items():
    if name in d:
      for k in spec.hparams + spec.host:
        d[name].pop(k, None)
      if spec.structure is not None:
        facts.update(spec.structure(cfg))
  return {**d, "_facts": facts}


def structure_key(cfg: ml_collections.ConfigDict, *given: Any) -> str:
  """A hashable text of :func:`structure`; ``given``: the objects a run was handed (your
  model, your data), named by identity (keep them alive while the key is in use)."""
  ids = [f"{type(g).__name__}@{id(g):x}" for g in given if g is not None]
  return json.dumps({**structure(cfg), "_given": ids}, sort_keys=True, default=repr)


__all__ = ["HOST_KEYS", "TOP_LEVEL", "keys", "structure", "structure_key", "values"]
