"""EASGD, elastic averaging SGD (Zhang, Choromanska, LeCun, NeurIPS 2015), added from outside
the package: one registration with its own config section, trained by the command line.

    python -m nbsgd_jax.main --config=experiments/configs/quickstart.py \\
        --config.imports=examples.easgd --config.algorithm=easgd \\
        --config.easgd.beta=0.9 --config.easgd.local_steps=4 --workdir=runs/easgd

(``examples.easgd`` is a module name: found on ``sys.path`` when run from the repository root,
which ``python -m`` puts there; from elsewhere give the file's path,
``--config.imports=path/to/easgd.py``, ``docs/extending.md``.)

Synchronous EASGD with communication period tau (the paper's equations (5)-(6), the
elastic step taken every tau steps as in its Algorithm 1): each worker takes tau local
steps of the local optimizer; then, with the center variable c (the same on every worker)
and the models' mean x_bar (one all-reduce),

    x_i <- x_i - alpha (x_i - c),    c <- c + beta (x_bar - c),    beta = n alpha,

``easgd.beta`` the center's moving rate (the paper's 0.9) and ``easgd.local_steps`` the
period (the paper's tau; docs/config.md, "One name per concept").
Evaluations read the workers' average, as for local SGD. ``beta`` is a hyperparameter
input of the compiled step (another value compiles nothing); ``local_steps`` is the host's.
"""
from typing import Any, NamedTuple

import jax
import ml_collections

from nbsgd_jax import recipes
from nbsgd_jax.core import checks
from nbsgd_jax import transforms as T


def easgd_defaults() -> ml_collections.ConfigDict:
  """``config.easgd.*`` with their defaults."""
  s = ml_collections.ConfigDict()
  s.beta = 0.9                   # moving rate of the center variable, beta = n alpha
  s.local_steps = 4              # H, steps: communication period (one elastic step each)
  return s


def check_easgd(cfg, errs: list) -> None:
  """easgd.*: a moving rate in (0, 1], a period of at least one step."""
  checks.number(cfg, errs, "easgd.beta", 0, lo_open=True, hi=1)
  checks.integer(cfg, errs, "easgd.local_steps", 1, note="tau")


class CenterState(NamedTuple):
  """The center variable c (the same on every worker) and the model reducer's state."""

  center: Any
  reducer: Any


def elastic_averaging(reducer: T.WorkerTransform, beta, n: int) -> T.Synchronisation:
  """The elastic step at a period's end: ``reducer`` averages the models (x_bar), then
  ``x_i <- x_i - (beta / n) (x_i - c)`` and ``c <- c + beta (x_bar - c)``."""
  alpha = beta / n

  def init(params):
    return CenterState(params, reducer.init(params))

  def apply(x, local_state, state, ctx):
    mean, red, report = reducer.update(x, state.reducer, None, ctx)
    x = jax.tree.map(lambda xi, c: xi - alpha * (xi - c), x, state.center)
    center = jax.tree.map(lambda c, m: c + beta * (m - c), state.center, mean)
    return x, local_state, CenterState(center, red), report

  return T.Synchronisation(init, apply, reducer.communications)


EASGD = recipes.Section(easgd_defaults, check_easgd, "EASGD (Zhang et al. 2015)",
                        hparams=("beta",), host=("local_steps",))


@recipes.register("easgd", sections={"easgd": EASGD})
def easgd(b: recipes.Builder) -> recipes.Recipe:
  """tau local steps, then the elastic step between each worker and the center."""
  comm, opt = b.allreduce(), b.optimizer("local")
  reducer = b.model_reducer(comm)  # a mean, or compressed with config.compression.name
  t = b.injected(lambda beta: T.periodic(opt, elastic_averaging(reducer, beta, b.n)),
                 "easgd.beta")
  return recipes.Recipe(t, decentralized=True, primary=comm,
                        planner=b.fixed_periods(b.cfg.easgd.local_steps))
