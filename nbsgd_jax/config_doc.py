"""The configuration reference, generated from the code (``docs/config.md``).

    python -m nbsgd_jax.config_doc --out docs/config.md
    python -m nbsgd_jax.config_doc --check docs/config.md   # exit 1 when the file is stale

Every key of :func:`nbsgd_jax.config.default_config` (dotted, nested sections included) with

* **default** and **type**: the value ``default_config()`` holds (``ConfigDict`` is
  type-safe: a key keeps its default's type; an int is accepted where the default is a float);
* **meaning**: the comment beside the key where its default is set (the functions of
  :data:`nbsgd_jax.config.TOP_LEVEL` and each section's ``defaults``), with the comment-only lines
  that continue it (read with :mod:`tokenize`, so the comments are the only
  place the descriptions are written);
* **allowed**: what :func:`nbsgd_jax.config.validate` accepts, in its own words. Each key is
  given a few bad values in turn (``None``, ``-1``, ``""``, NaN; :data:`PROBES`) on an
  otherwise default config, and the part after ``is not allowed:`` of every error that
  ``validate`` reports for that key is kept (``it must be an integer >= 1``,
  ``use one of ['ring', 'torus', ...]``: the choice lists are the tuples of
  :mod:`nbsgd_jax.config`). Keys are probed again in the :data:`CONTEXTS`. Rules between
  keys (``checkpoint_every`` a multiple of ``eval_every``, the combinations the recipe
  registry refuses, ...) are not in the table;
* **unit**: read off the comment by the rules of :data:`UNIT_RULES` (``s``, ``bytes/s``,
  ``steps``, ...; ``-`` when the comment names none).

The output depends only on ``nbsgd_jax/config/`` (and the modules whose tuples it uses),
so ``tests/user/test_docs.py`` regenerates it and compares it with the committed file.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import math
import os
import re
import sys
import textwrap
import tokenize
from typing import Any, Callable, Sequence

import ml_collections

from nbsgd_jax import config as config_lib
from nbsgd_jax.config import renamed as renamed_lib
from nbsgd_jax.core import files as files_lib
from nbsgd_jax import recipes as recipes_lib

# Bad values given to every key in turn; validate's messages for the key say what is allowed.
PROBES = (None, -1, "", float("nan"))
# Settings in which keys that validate checks only conditionally are probed (in this order,
# the first that yields a message wins): a compressor on (compression.*).
CONTEXTS = ({}, {"algorithm": "allreduce", "compression.name": "top_k"})
# (regex on the comment, unit): the first rule that matches names the unit.
UNIT_RULES = (
    (r"^s\b", "s"),
    (r"^bytes/s\b", "bytes/s"),
    (r"\bparameter units\b", "parameter units"),
    (r"^examples per worker per step\b", "examples per worker per step"),
    (r"^training examples\b", "examples"),
    (r"^(?:\w+: )?mini-batches\b", "mini-batches"),
    (r"^(?:\w+, )?coordinates\b", "coordinates"),
    (r"^probability\b", "probability"),
    (r"^workers\b", "workers"),
    (r"^gradient computations per worker\b", "gradients per worker"),
    (r"^(?:\w+: )?(?:training |local |inner |extra gossip )?steps\b|\bthis many steps\b"
     r"|\bsteps < \w+|\bbefore this step\b", "steps"),
)
FINITE = "it must be a finite number"  # validate's check of every float key
OUT = "docs/config.md"
COMMAND = "python -m nbsgd_jax.config_doc --out docs/config.md"


@dataclasses.dataclass
class KeyDoc:
  """One key of the reference.

  Attributes:
    key: dotted name (``"cluster.latency"``).
    default: the value in ``default_config()``.
    type_name: ``type(default).__name__``.
    comment: the source comment (continuation lines joined with spaces); "" if none.
    allowed: what ``validate`` accepts, one entry per distinct message (may be empty).
    unit: from :data:`UNIT_RULES`, or ``"-"``.
    section: True for a nested ``ConfigDict`` (a section heading, no value of its own).
  """
  key: str
  default: Any
  type_name: str
  comment: str
  allowed: list
  unit: str
  section: bool = False


def source_comments(func: Callable = config_lib.default_config) -> dict[str, str]:
  """The comment of every ``ROOT.key... = value  # comment`` statement of ``func``'s source.

  A comment-only line that follows a statement and is indented deeper than it continues the
  statement's comment (joined with a space).

  Args:
    func: a function that builds a ConfigDict in a local variable and returns it.

  Returns:
    ``{dotted key: comment}`` in source order (sections included, e.g. ``"cluster"``).

  Raises:
    ValueError: ``func`` does not end with ``return NAME``.
  """
  src = textwrap.dedent(inspect.getsource(func))
  fdef = ast.parse(src).body[0]
  ret = fdef.body[-1]
  if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name)):
    raise ValueError(f"{func.__name__} must end with 'return NAME'")
  root = ret.value.id

  out: dict[str, str] = {}
  stmt: list = []        # tokens of the current logical line
  last_key, last_col = None, 0  # the previous assignment (for continuation comments)
  for tok in tokenize.generate_tokens(io.StringIO(src).readline):
    if tok.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
      continue
    if tok.type == tokenize.COMMENT and not stmt:  # a comment-only line
      if last_key is not None and tok.start[1] > last_col:
        text = tok.string.lstrip("#").strip()
        out[last_key] = f"{out[last_key]} {text}".strip()
      else:
        last_key = None  # a standalone comment ends the continuation
      continue
    if tok.type == tokenize.NL and not stmt:
      continue
    stmt.append(tok)
    if tok.type not in (tokenize.NEWLINE, tokenize.ENDMARKER):
      continue
    key, col = _assigned_key(stmt, root)
    if key is not None:
      comments = [t.string.lstrip("#").strip() for t in stmt if t.type == tokenize.COMMENT]
      out[key] = " ".join(comments)
      last_key, last_col = key, col
    else:
      last_key = None
    stmt = []
  return out


def _assigned_key(tokens: list, root: str) -> tuple[str | None, int]:
  """``("a.b", column)`` for a statement ``root.a.b = ...``, else ``(None, 0)``."""
  toks = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL)]
  if len(toks) < 4 or toks[0].type != tokenize.NAME or toks[0].string != root:
    return None, 0
  names, i = [], 1
  while i + 1 < len(toks) and toks[i].string == "." and toks[i + 1].type == tokenize.NAME:
    names.append(toks[i + 1].string)
    i += 2
  if not names or i >= len(toks) or toks[i].string != "=":
    return None, 0
  return ".".join(names), toks[0].start[1]


def config_keys(cfg: ml_collections.ConfigDict | None = None) -> list[tuple[str, Any]]:
  """``(dotted key, value)`` of every key of ``cfg`` (default: ``default_config()``),
  depth first (``ConfigDict`` lists keys sorted), sections (``ConfigDict`` values)
  included."""
  cfg = config_lib.default_config() if cfg is None else cfg

  def walk(node, prefix):
    for k, v in node.items():
      yield prefix + k, v
      if isinstance(v, ml_collections.ConfigDict):
        yield from walk(v, f"{prefix}{k}.")
  return list(walk(cfg, ""))


def _set(cfg: ml_collections.ConfigDict, key: str, value: Any) -> None:
  *sections, name = key.split(".")
  node = cfg
  for s in sections:
    node = node[s]
  with node.ignore_type():
    node[name] = value


def allowed_values(key: str, probes: Sequence = PROBES,
                   contexts: Sequence[dict] = CONTEXTS) -> list[str]:
  """What ``validate`` accepts for ``key``, from its messages about bad values.

  For each context (overrides applied to ``default_config()`` first; the key itself is never
  overridden by its context) every probe value is set on ``key`` and ``validate`` run; every
  message ``config.KEY=... is not allowed: WHY`` about this key (not the cross-key ones,
  ``is not allowed with ...``) contributes ``WHY``. The first context that yields a message
  wins; a context that yields only the generic ``it must be a finite number`` (the check
  every float gets, also triggered by a NaN given to a key of another type) does not, and that
  message is kept only for float keys with nothing more specific; one range said twice is
  kept once (:func:`one_per_range`).

  Returns:
    the distinct ``WHY`` texts in the order found; empty when ``validate`` never complains.
  """
  head = f"config.{key}="
  fallback: list[str] = []
  for ctx in contexts:
    found: list[str] = []
    for probe in probes:
      cfg = config_lib.default_config()
      config_lib.override(cfg, {k: v for k, v in ctx.items() if k != key})
      _set(cfg, key, probe)
      try:
        config_lib.validate(cfg)
      except config_lib.ConfigError as e:
        errors = e.errors
      except Exception:  # pylint: disable=broad-except  (a probe validate cannot digest)
        continue
      else:
        continue
      for line in errors:
        if not line.startswith(head) or " is not allowed: " not in line:
          continue
        why = line.split(" is not allowed: ", 1)[1].strip()
        if why not in found:
          found.append(why)
    specific = one_per_range([w for w in found if w != FINITE])
    if specific:
      return specific
    if found and not fallback:
      fallback = found
  return fallback if isinstance(default_of(key), float) else []


_RANGE = re.compile(r"^it must be a (?:finite )?number ([<>]=?) (\S+?)(?: and ([<>]=?) (\S+))?$")


def one_per_range(whys: list[str]) -> list[str]:
  """``whys`` without a later ``it must be a finite number >= 0.0`` when an earlier entry says
  ``it must be a number >= 0``: the same range, written once by the section's check and again
  by the component that refuses the NaN the range check lets through (``cluster.episode_*``:
  ``episodes.check_config`` and ``SlowEpisodes``). Other entries as they are, in order."""
  def bound(text):
    try:
      return float(text)
    except (TypeError, ValueError):
      return text
  seen, out = set(), []
  for why in whys:
    m = _RANGE.match(why)
    key = tuple(bound(g) for g in m.groups()) if m else why
    if key not in seen:
      seen.add(key)
      out.append(why)
  return out


def default_of(key: str) -> Any:
  """The value of dotted ``key`` in ``default_config()``."""
  node = config_lib.default_config()
  for part in key.split("."):
    node = node[part]
  return node


def unit_of(comment: str) -> str:
  """The unit named by a key's comment (:data:`UNIT_RULES`), or ``"-"``."""
  for pattern, unit in UNIT_RULES:
    if re.search(pattern, comment):
      return unit
  return "-"


def config_comments() -> dict[str, str]:
  """The comment of every key of ``default_config()``, in the order of ``docs/config.md``:
  the top-level keys (:data:`nbsgd_jax.config.TOP_LEVEL`), then each section's ``doc`` and
  the comments in the source of its ``defaults`` (:data:`nbsgd_jax.config.SECTIONS`, then
  the algorithms' own, :data:`nbsgd_jax.recipes.SECTIONS`)."""
  out: dict[str, str] = {}
  for part in config_lib.TOP_LEVEL:
    out.update(source_comments(part))
  for name, section in {**config_lib.SECTIONS, **recipes_lib.SECTIONS}.items():
    out[name] = section.doc
    out.update({f"{name}.{k}": v for k, v in source_comments(section.defaults).items()})
  return out


def collect(func: Callable = config_lib.default_config) -> list[KeyDoc]:
  """A :class:`KeyDoc` for every key of ``func()`` (``default_config``), in the order of
  ``func``'s source."""
  comments = config_comments() if func is config_lib.default_config else source_comments(func)
  order = {k: i for i, k in enumerate(comments)}  # source order; keys set elsewhere last
  keys = config_keys(func())
  keys.sort(key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
  docs = []
  for key, value in keys:
    section = isinstance(value, ml_collections.ConfigDict)
    comment = comments.get(key, "")
    docs.append(KeyDoc(
        key=key, default=value, type_name=type(value).__name__, comment=comment,
        allowed=[] if section else allowed_values(key),
        unit="-" if section else unit_of(comment), section=section))
  return docs


def _fmt_default(v: Any) -> str:
  if isinstance(v, float) and math.isfinite(v) and len(repr(v)) > 8:
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "")
                  + m.group(2), f"{v:g}")
  return repr(v)


def _cell(s: str) -> str:
  return s.replace("|", "\\|").replace("\n", " ")


def _code(s: str) -> str:
  return f"`{s}`" if "`" not in s else f"`` {s} ``"


def render(docs: Sequence[KeyDoc]) -> str:
  """The markdown of ``docs/config.md``."""
  out = [
      "# Configuration reference",
      "",
      f"Generated from `nbsgd_jax/config/` by `{COMMAND}`; do not edit by hand "
      "(`tests/user/test_docs.py` fails when this file and the code disagree).",
      "",
      "Every key of `default_config()`. Set a key on the command line with "
      "`--config.KEY=VALUE` (e.g. `--config.num_workers=16`, "
      "`--config.cluster.latency=0.001`, `--config.mlp_hidden=\"(512,256)\"`) or in an "
      "experiment file (`experiments/configs/*.py`, a `get_config()` that starts from "
      "`default_config()`).",
      "",
      "* **default**, **type**: the value in `default_config()`; a key keeps its type (an "
      "integer is accepted for a float).",
      "* **allowed**: what `validate()` accepts, in the words of its error messages (each key "
      "was given bad values and the messages about it collected); `-`: not checked beyond "
      "its type. Rules between keys (e.g. `checkpoint_every` a multiple of `eval_every`, "
      "compressed gossip refused by the recipe registry, `batch_size` divisible by "
      "`nonblocking.num_minibatches` with non-blocking on) are checked too but not listed here; a bad value stops "
      "the run before compilation with one `error:` line per problem.",
      "* **unit**: as the comment names it; `-`: none (a count, a factor, a name).",
      "* **meaning**: the comment beside the key where its default is set (`config.TOP_LEVEL`, "
      "each section's `defaults`).",
      "",
  ]
  header = ["| key | default | type | allowed | unit | meaning |", "|---|---|---|---|---|---|"]
  top = [d for d in docs if "." not in d.key and not d.section]
  sections = [d for d in docs if d.section]
  out += ["## Top-level keys", ""] + header
  out += [_row(d) for d in top]
  for sec in sections:
    title = f"## `{sec.key}`" + (f": {sec.comment}" if sec.comment else "")
    members = [d for d in docs if d.key.startswith(sec.key + ".") and not d.section
               and d.key.count(".") == sec.key.count(".") + 1]
    out += ["", title, ""] + header + [_row(d) for d in members]
  out += renamed_lib.concepts_markdown()
  return "\n".join(out) + "\n"


def _row(d: KeyDoc) -> str:
  allowed = "; ".join(d.allowed) if d.allowed else "-"
  cells = [_code(d.key), _code(_fmt_default(d.default)), d.type_name, allowed, d.unit,
           d.comment or "-"]
  return "| " + " | ".join(_cell(c) for c in cells) + " |"


def generate() -> str:
  """``docs/config.md`` as it should be for the current code."""
  return render(collect())


def main(argv: Sequence[str] | None = None) -> int:
  """Command line; returns the exit status (0; 1 with ``--check`` on a stale file)."""
  p = argparse.ArgumentParser(prog="python -m nbsgd_jax.config_doc",
                              description="Write the configuration reference (markdown).")
  g = p.add_mutually_exclusive_group(required=True)
  g.add_argument("--out", help=f"file to write (the committed one: {OUT})")
  g.add_argument("--check", metavar="FILE",
                 help="compare FILE with the generated text; exit status 1 if they differ")
  a = p.parse_args(argv)
  docs = collect()
  text = render(docs)
  if a.check:
    try:
      with open(a.check) as f:
        current = f.read()
    except OSError as e:
      print(f"error: cannot read {a.check}: {e}", file=sys.stderr)
      return 1
    if current != text:
      print(f"{a.check} is stale: run {COMMAND}", file=sys.stderr)
      return 1
    print(f"{a.check} is up to date")
    return 0
  files_lib.atomic_write(a.out, text)
  print(f"wrote {a.out} ({sum(not d.section for d in docs)} keys)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
