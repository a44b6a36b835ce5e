"""One name per concept: the configuration keys that were renamed, old -> new.

Each concept has one key name across the algorithms (``docs/config.md``, "One name per
concept"): local steps H are ``local_steps``, the outer optimizer's rate ``outer_lr``, a
count kept per chunk ``top_k``, a chunk's length ``chunk_size``, an error-feedback buffer's
decay ``error_decay``, a fraction of the coordinates ``density``, the workers of a group
``group_size``, the steps a communication overlaps ``delay``. The references' own names are
in that table beside ours. An old name given as an override is refused with its new name
(:func:`nbsgd_jax.config.unknown_key_errors`); a stored ``config.json`` written before the
rename reads under the new names (:func:`upgrade`), so old runs resume and report.
"""

from __future__ import annotations

from typing import NamedTuple

RENAMED = {  # old dotted key -> new dotted key
    "diloco.inner_steps": "diloco.local_steps",
    "sparseloco.inner_steps": "sparseloco.local_steps",
    "noloco.number_of_local_steps": "noloco.local_steps",
    "halos.inner_steps": "halos.local_steps",
    "async_diloco.min_inner_steps": "async_diloco.min_local_steps",
    "local_sgd.tau": "local_sgd.local_steps",
    "local_sgd.max_tau": "local_sgd.max_local_steps",
    "sparseloco.outer_learning_rate": "sparseloco.outer_lr",
    "demo.compression_topk": "demo.top_k",
    "demo.compression_chunk": "demo.chunk_size",
    "demo.compression_decay": "demo.error_decay",
    "noloco.local_group_size": "noloco.group_size",
    "cluster.allreduce_group": "cluster.allreduce_group_size",
    "sparta.p": "sparta.density",
    "sgp.synch_freq": "sgp.delay",
}


def renamed_error(key: str) -> str | None:
  """The refusal of an old dotted ``key`` (``"diloco.inner_steps"``): one line naming its new
  key, or None when ``key`` was not renamed."""
  new = RENAMED.get(key)
  if new is None:
    return None
  return (f"config.{key} was renamed config.{new} (one name per concept: docs/config.md, "
          "'One name per concept')")


def upgrade(stored: dict) -> dict:
  """A stored config (``config.json`` as a nested dict) under today's names: each old key in
  :data:`RENAMED` moved to its new key (a new key already present wins). Returns a new dict;
  ``stored`` is not changed."""
  out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in stored.items()}
  for old, new in RENAMED.items():
    (osec, okey), (nsec, nkey) = old.split("."), new.split(".")
    section = out.get(osec)
    if isinstance(section, dict) and okey in section:
      value = section.pop(okey)
      out.setdefault(nsec, {}).setdefault(nkey, value)
  return out


class Concept(NamedTuple):
  """One concept and its one name: ``name`` is the leaf of every key in ``keys`` (a key may
  qualify it, ``cluster.allreduce_group_size``); ``references`` names it as each source
  does."""
  concept: str
  name: str
  keys: tuple
  references: str


CONCEPTS = (
    Concept("local steps H: a worker's steps between two communications", "local_steps",
            ("diloco.local_steps", "sparseloco.local_steps", "noloco.local_steps",
             "halos.local_steps", "swarm_sgd.local_steps", "teleportation.local_steps",
             "local_sgd.local_steps", "async_diloco.min_local_steps",
             "local_sgd.max_local_steps"),
            "DiLoCo: H, inner steps; SparseLoCo: inner_steps; NoLoCo: number_of_local_steps; "
            "HALoS, SwarmSGD: H; local SGD: tau (Wang & Joshi), H (Lin et al.); asynchronous "
            "DiLoCo: min_inner_steps (DyLU's floor)"),
    Concept("the outer optimizer's learning rate", "outer_lr",
            ("diloco.outer_lr", "sparseloco.outer_lr", "noloco.outer_lr"),
            "DiLoCo: outer learning rate; SparseLoCo: outer_learning_rate; NoLoCo: outer_lr. "
            "HALoS has an outer optimizer at each server level, named by the level: "
            "halos.lps_lr, halos.gps_lr"),
    Concept("the outer optimizer's momentum", "outer_momentum",
            ("diloco.outer_momentum", "sparseloco.outer_momentum", "noloco.outer_momentum"),
            "DiLoCo: Nesterov momentum 0.9; SparseLoCo, NoLoCo: outer_momentum; HALoS: "
            "halos.lps_momentum, halos.gps_momentum"),
    Concept("coordinates kept per chunk (top-k)", "top_k", ("demo.top_k", "sparseloco.top_k"),
            "DeMo: compression_topk; SparseLoCo: top_k"),
    Concept("density k/d: the fraction of the coordinates sent", "density",
            ("compression.density", "sparta.density"),
            "SPARTA: p_sparta; Top-k / Random-k papers: k/d"),
    Concept("a chunk's length", "chunk_size", ("demo.chunk_size", "sparseloco.chunk_size"),
            "DeMo: compression_chunk; SparseLoCo: chunk_size"),
    Concept("the error-feedback buffer's decay beta", "error_decay",
            ("demo.error_decay", "sparseloco.error_decay"),
            "DeMo: compression_decay (its decoupled momentum); SparseLoCo: error_decay"),
    Concept("workers per group", "group_size",
            ("noloco.group_size", "cluster.allreduce_group_size"),
            "NoLoCo: local_group_size; the hierarchical all-reduce: g"),
    Concept("steps a communication overlaps (tau)", "delay",
            ("streaming_diloco.delay", "sgp.delay"),
            "Streaming DiLoCo: tau; SGP: synch_freq"),
)


def concepts_markdown() -> list[str]:
  """The "One name per concept" section of ``docs/config.md``: a table of :data:`CONCEPTS`
  and the old names refused (:data:`RENAMED`)."""
  out = ["", "## One name per concept", "",
         "A concept has one key name in every algorithm's section; the sources' own names "
         "are beside it. An old name is refused with its new one "
         "(`nbsgd_jax/config/renamed.py`); a `config.json` written before a rename resumes "
         "and reports under the new names.", "",
         "| concept | name | keys | the sources' names |", "|---|---|---|---|"]
  out += [f"| {c.concept} | `{c.name}` | {', '.join(f'`{k}`' for k in c.keys)} | "
          f"{c.references} |" for c in CONCEPTS]
  out += ["", "| old key (refused) | key |", "|---|---|"]
  out += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
  return out
