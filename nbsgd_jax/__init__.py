"""nbsgd_jax: communication-efficient, straggler-tolerant distributed SGD in JAX.

Every algorithm is a recipe of worker transforms (the program of one worker using
collectives on the named axis ``"workers"``); the same program runs simulated (``jax.vmap``),
on a device mesh (``jax.shard_map``) or across hosts. See ``README.md`` and
``docs/design.md``.
"""

__version__ = "0.1.0"

# the public modules as attributes (``import nbsgd_jax; nbsgd_jax.tx``), imported on first use
# so that ``import nbsgd_jax`` (and the command line's --help) stays free of JAX
_LAZY = ("tx", "train", "codecs", "config", "data", "models", "recipes", "topology", "report")


def __getattr__(name: str):
  if name in _LAZY:
    import importlib
    return importlib.import_module(f"nbsgd_jax.{name}")
  raise AttributeError(f"module 'nbsgd_jax' has no attribute {name!r}")


def __dir__():
  return sorted([*globals(), *_LAZY])
