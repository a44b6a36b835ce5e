"""The algorithm as run: a run's name, composed from its recipe and the cross-cutting pieces
that are on, e.g. ``dpsgd + non-blocking (M = 4)``, ``ad_psgd (event clock)``,
``allreduce + top_k (density 0.01, error feedback)``, ``dpsgd + consensus control``.

Each piece (:data:`PIECES`) is ``(cfg, active keys) -> Part``: the words it adds (none while
it is off) and the config keys they state (while it is off, its switch: ``dpsgd`` says that
``nonblocking.enabled`` is False). What a piece says comes from the registries, never from a
list of algorithm or codec names: the event clock from :func:`nbsgd_jax.recipes.
is_asynchronous`, a codec's options from :data:`nbsgd_jax.codecs.REGISTRY`, and a key is
stated only while the run reads it (:func:`nbsgd_jax.config.inactive_keys`: CHOCO-SGD's codec
has no error feedback). The
progress bar and ``summary.json`` (``algorithm_as_run``) carry the name, the report labels its
runs with it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import ml_collections

from nbsgd_jax import codecs, recipes
from nbsgd_jax import config as config_lib

EVENT_CLOCK = "event clock"


class Part(NamedTuple):
  """A piece of a run's name.

  Attributes:
    text: its words, e.g. ``"non-blocking (M = 4)"``; ``""`` for a piece that is off.
    keys: the dotted config keys whose values the words (or their absence) state.
  """

  text: str
  keys: tuple[str, ...]


def _recipe(cfg, active: set) -> Part:
  """The algorithm, ``(event clock)`` for the asynchronous family."""
  del active
  name = str(cfg.get("algorithm"))
  clock = f" ({EVENT_CLOCK})" if recipes.is_asynchronous(name) else ""
  return Part(name + clock, ("algorithm",))


def _nonblocking(cfg, active: set) -> Part:
  """Non-blocking SGD (He & Dube 2022) with its M mini-batches per worker batch."""
  del active
  if cfg.get("nonblocking.enabled") is not True:
    return Part("", ("nonblocking.enabled",))
  m = cfg.get("nonblocking.num_minibatches")
  return Part(f"non-blocking (M = {m})", ("nonblocking.enabled", "nonblocking.num_minibatches"))


def _compression(cfg, active: set) -> Part:
  """The codec with the options it reads, and whether the residual is fed back (when the
  recipe feeds it back at all) or the selection is per layer."""
  name = cfg.get("compression.name")
  if name is None or name == codecs.NONE:
    return Part("", ("compression.name",))
  spec = codecs.REGISTRY.get(name)
  keys = [f"compression.{k}" for k in (spec.keys if spec else ()) if f"compression.{k}" in active]
  words = [f"{k.split('.', 1)[1]} {cfg.get(k)}" for k in keys]
  ef, flat = "compression.error_feedback", "compression.flatten"
  if ef in active:
    words.append("error feedback" if cfg.get(ef) else "no error feedback")
    keys.append(ef)
  if flat in active and cfg.get(flat) is False:
    words.append("per layer")
    keys.append(flat)
  return Part(f"{name} ({', '.join(words)})" if words else str(name),
              ("compression.name", *keys))


def _consensus_control(cfg, active: set) -> Part:
  """Consensus control (Kong et al. 2021)."""
  del active
  on = cfg.get("consensus.control") is True
  return Part("consensus control" if on else "", ("consensus.control",))


def _failures(cfg, active: set) -> Part:
  """Simulated failures, as ``cluster.failures`` writes them (worker:start:duration), and
  failures at a rate (``cluster.failure_mtbf``: the mean up time in hours)."""
  del active
  fails = str(cfg.get("cluster.failures") or "").strip()
  mtbf = cfg.get("cluster.failure_mtbf") or 0
  named = ([fails] if fails else []) + ([f"MTBF {mtbf:g} h"] if mtbf else [])
  if named and cfg.get("cluster.failure_policy") == "restart":
    named.append("restarts")
  return Part(f"failures ({', '.join(named)})" if named else "",
              ("cluster.failures", "cluster.failure_mtbf", "cluster.failure_policy"))


# the pieces in the order of the name: ``(cfg, active keys) -> Part``
PIECES: tuple[Callable[[ml_collections.ConfigDict, set], Part], ...] = (
    _recipe, _nonblocking, _compression, _consensus_control, _failures)


def parts(cfg: ml_collections.ConfigDict | dict) -> list[Part]:
  """The pieces of the run's name, in order (the recipe first; those that are off too).

  Args:
    cfg: the run's config, or its ``config.json`` as a dict (a key it lacks reads as off).
  """
  if not isinstance(cfg, ml_collections.ConfigDict):
    cfg = ml_collections.ConfigDict(cfg)
  active = set(config_lib.flatten_dict(cfg.to_dict())) - config_lib.inactive_keys(cfg)
  return [piece(cfg, active) for piece in PIECES]


def algorithm_as_run(cfg: ml_collections.ConfigDict | dict) -> str:
  """The algorithm as run (module docstring): the pieces of :func:`parts` joined by
  ``" + "``, e.g. ``"dpsgd + non-blocking (M = 4) + consensus control"``."""
  return " + ".join(p.text for p in parts(cfg) if p.text)


def named_keys(cfg: ml_collections.ConfigDict | dict) -> set[str]:
  """The dotted config keys whose values :func:`algorithm_as_run` states (by its words, or
  by their absence: the switch of a piece that is off)."""
  return {k for p in parts(cfg) for k in p.keys}


__all__ = ["EVENT_CLOCK", "PIECES", "Part", "algorithm_as_run", "named_keys", "parts"]
