"""Learning-rate schedules against closed forms."""

import numpy as np
import pytest

from nbsgd_jax import config as config_lib
from nbsgd_jax import train


def _rates(steps, **kw):
  cfg = config_lib.override(config_lib.default_config(), {"learning_rate": 1.0, **kw})
  sched = train.make_schedule(cfg)
  return np.array([float(sched(s)) for s in range(steps)])


def test_step_schedule_decays_at_the_milestones():
  r = _rates(100, num_steps=100, lr_schedule="step", lr_milestones=(0.5, 0.75), lr_decay=0.1)
  want = np.where(np.arange(100) < 50, 1.0, np.where(np.arange(100) < 75, 0.1, 0.01))
  np.testing.assert_allclose(r, want, rtol=1e-6)


def test_step_schedule_after_warmup_keeps_absolute_milestones():
  r = _rates(40, num_steps=40, lr_schedule="step", lr_milestones=(0.5,), lr_decay=0.5,
             warmup_steps=10)
  want = [s / 10 for s in range(10)] + [1.0] * 10 + [0.5] * 20
  np.testing.assert_allclose(r, want, rtol=1e-6)


def test_milestones_on_one_step_decay_twice():
  r = _rates(10, num_steps=10, lr_schedule="step", lr_milestones=(0.5, 0.5001), lr_decay=0.5)
  np.testing.assert_allclose(r, [1.0] * 5 + [0.25] * 5, rtol=1e-6)
