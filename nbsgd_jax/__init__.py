"""nbsgd_jax: communication-efficient, straggler-tolerant distributed SGD in JAX.

Every algorithm is a recipe of worker transforms (the program of one worker using
collectives on the named axis ``"workers"``); the same program runs simulated (``jax.vmap``),
on a device mesh (``jax.shard_map``) or across hosts. See ``README.md`` and
``docs/design.md``.
"""

__version__ = "0.1.0"
