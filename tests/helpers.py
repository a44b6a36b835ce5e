"""Helpers shared by several test modules (no test module imports another)."""

import importlib.util
import os

import pytest

from nbsgd_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name):
  """``experiments/NAME.py`` as a module."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments",
                                                                   f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def least_squares_cfg(*, n, m, dim, lr, momentum, weight_decay, slowdown, time_per_example,
                      latency, bandwidth, **kw):
  """The asynchronous family's small set-up: full-batch least squares, ``n`` workers of ``m``
  examples in ``dim`` dimensions (one shard each), AD-PSGD on a ring with the given cluster,
  no progress bar; ``kw`` sets ``num_steps``, ``eval_every`` and overrides any key."""
  over = {"dataset": "least_squares", "problem.shards": n, "problem.examples_per_worker": m,
          "problem.dim": dim, "problem.noise": 1.0, "problem.l2": 0.0, "problem.seed": 0,
          "problem.heterogeneity": 1.0, "problem.full_batch": True, "algorithm": "ad_psgd",
          "num_workers": n, "batch_size": m, "learning_rate": lr, "momentum": momentum,
          "nesterov": True, "weight_decay": weight_decay, "cluster.slowdown": slowdown,
          "cluster.time_per_example": time_per_example, "cluster.latency": latency,
          "cluster.bandwidth": bandwidth, "topology": "ring", "progress": False,
          **kw}
  return config_lib.override(config_lib.default_config(), over)


def slow_except(values, fast):
  """``values`` for ``pytest.mark.parametrize`` with every one not in ``fast`` marked slow
  (tests/conftest.py: the slow tier), so that the fast tier runs a few representative cases
  and the slow tier the rest."""
  missing = [v for v in fast if v not in values]
  if missing:
    raise ValueError(f"slow_except: {missing} not among the values {list(values)}")
  return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]
