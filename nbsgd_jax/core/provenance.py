"""What produced a record: the package's version and git commit, the library versions, the
machine and the command (:func:`provenance`), written under :data:`KEY` into every run's
``config.json`` and ``summary.json`` (:mod:`nbsgd_jax.run.records`) and every study's
``results.json`` (``experiments/common.py``).

The provenance is not configuration: a stored ``config.json`` read back as a config drops it
first (:func:`config_of`), so a run resumed by another commit is the same run. Also
:func:`repo_relative`, the paths of a record made relative to the repository, so that a
committed record names no machine's directories.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from typing import Any, Optional

KEY = "provenance"  # the key of config.json, summary.json and results.json that holds it
# the directory holding the package (nbsgd_jax/..): the repository in a checkout
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIT = "git"  # the git program
GIT_TIMEOUT = 5.0  # s; a git that hangs (a network file system) gives None, not a stall
LIBRARIES = ("jax", "jaxlib", "flax", "optax")
_COMMITS: dict = {}  # (git, root) -> commit or None: HEAD does not move under a process


def _git(root: str, *args: str) -> Optional[str]:
  """``git -C root ARGS``'s standard output, or None (no git, not a checkout, an error)."""
  try:
    out = subprocess.run([GIT, "-C", root, *args], capture_output=True, text=True,
                         timeout=GIT_TIMEOUT, check=False)
  except (OSError, subprocess.SubprocessError, ValueError):
    return None
  return out.stdout if out.returncode == 0 else None


def git_commit(root: Optional[str] = None) -> Optional[str]:
  """The commit checked out (40 hex digits) in the git checkout whose top directory is
  ``root`` (default :data:`ROOT`, the package's parent), or None: no git, not a checkout, or
  a checkout of something else around an installed copy (a virtual environment inside a
  repository). Read once per process and ``root``."""
  root = ROOT if root is None else root
  if (GIT, root) not in _COMMITS:
    lines = (_git(root, "rev-parse", "HEAD", "--show-toplevel") or "").splitlines()
    top = len(lines) == 2 and os.path.realpath(lines[1]) == os.path.realpath(root)
    _COMMITS[GIT, root] = lines[0] if top and re.fullmatch(r"[0-9a-f]{40,64}", lines[0]) else None
  return _COMMITS[GIT, root]


def git_dirty(root: Optional[str] = None) -> Optional[bool]:
  """Whether a tracked file of the checkout ``root`` (default :data:`ROOT`) differs from its
  commit (``git status --porcelain --untracked-files=no``; untracked files do not count),
  read at each call; None when :func:`git_commit` is None or git fails."""
  root = ROOT if root is None else root
  if git_commit(root) is None:
    return None
  out = _git(root, "status", "--porcelain", "--untracked-files=no")
  return None if out is None else bool(out.strip())


def _version(dist: str) -> Optional[str]:
  try:
    return importlib.metadata.version(dist)
  except (importlib.metadata.PackageNotFoundError, ValueError):
    return None


@functools.lru_cache(maxsize=None)
def _versions() -> tuple:
  package = sys.modules.get(__name__.split(".")[0])
  out = {"version": _version("nbsgd_jax") or getattr(package, "__version__", None)}
  out.update({name: _version(name) for name in LIBRARIES})
  out["python"] = platform.python_version()
  return tuple(out.items())


def versions() -> dict:
  """``{"version": the package's, "jax", "jaxlib", "flax", "optax": theirs, "python"}``:
  installed versions as strings (``importlib.metadata``; the package's falls back to
  ``nbsgd_jax.__version__``), None for one not installed. Read once per process."""
  return dict(_versions())


def device() -> Optional[dict]:
  """``{"kind": jax.devices()[0].device_kind, "platform": its platform ("cpu", "gpu",
  "tpu"), "count": len(jax.devices())}``, or None when this process has not started JAX's
  backends (it computed nothing with JAX: asking would start them, and take a GPU's memory)
  or they fail."""
  jax = sys.modules.get("jax")
  if jax is None:
    return None
  try:
    from jax._src import xla_bridge  # private: whether asking would start the backends
    if not xla_bridge.backends_are_initialized():
      return None
  except (ImportError, AttributeError):
    pass  # another JAX: jax is imported, so the process means to use it
  try:
    devices = jax.devices()
    return {"kind": str(devices[0].device_kind), "platform": str(devices[0].platform),
            "count": len(devices)}
  except Exception:  # noqa: BLE001  (a provenance never stops a run)
    return None


# an absolute POSIX path: "/" then a name, at the start of a string or after a space, "=" or
# a quote (a command line's ``--out /abs``, ``--out=/abs``, ``'/abs'``), not "bytes/s" or "1/2"
_ABSOLUTE = re.compile(r"""(?<![^\s='"])/[\w.~+-][^\s'"]*""")


def repo_relative(value: Any, root: Optional[str] = None) -> Any:
  """``value`` (a record's command line, arguments or settings: a string, or a dict, list or
  tuple of them, nested) with each absolute path in its strings made relative to the
  repository ``root`` (default :data:`ROOT`; ``/x/repo/docs/frontier`` -> ``docs/frontier``,
  ``/x/shared/data`` -> ``../shared/data``), so a committed record names no machine's
  directories; other values as they are."""
  root = ROOT if root is None else root
  if isinstance(value, str):
    return _ABSOLUTE.sub(lambda m: os.path.relpath(m.group(0), root), value)
  if isinstance(value, dict):
    return {k: repo_relative(v, root) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(repo_relative(v, root) for v in value)
  return value


def command_line(argv: Optional[list] = None) -> str:
  """This process's command line (``sys.argv``, shell-quoted, its paths relative to the
  repository: :func:`repo_relative`): ``python -m MODULE ARGS`` for a module run with ``-m``
  (``python -m nbsgd_jax.main --config=...``), else ``python ARGV[0] ARGS``."""
  argv = list(sys.argv if argv is None else argv) or [""]
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  name = getattr(spec, "name", None)
  if name:
    head = ["python", "-m", name[:-len(".__main__")] if name.endswith(".__main__") else name]
  else:
    head = ["python", argv[0]] if argv[0] else ["python"]
  return shlex.join(repo_relative(head + [str(a) for a in argv[1:]]))


def provenance(command: Optional[str] = None) -> dict:
  """What produces a record now (a few ms: the commit and versions are read once per process,
  the dirty flag at each call). Never raises: a field it cannot read is None.

  Args:
    command: the command line to record; None: this process's (:func:`command_line`).

  Returns:
    ``{"version": the package's version (str), "commit": the git commit of the package's
    checkout (40 hex digits, str) or None (not a checkout, no git), "dirty": whether tracked
    files differed from that commit (bool) or None, "jax", "jaxlib", "flax", "optax": their
    versions (str, None when not installed), "python": its version (str), "platform":
    ``platform.platform()`` (str: OS, release, machine), "device": ``{"kind": the first JAX
    device's kind (str, e.g. "NVIDIA H100 80GB HBM3", "cpu"), "platform": "cpu", "gpu" or
    "tpu", "count": the number of JAX devices (int)}`` or None (JAX not started), "command":
    the command line (str, paths relative to the repository)}``.
  """
  try:
    plat = platform.platform()
  except Exception:  # noqa: BLE001
    plat = None
  try:
    command = command_line() if command is None else command
  except Exception:  # noqa: BLE001
    command = None
  libraries = versions()
  return {"version": libraries.pop("version"), "commit": git_commit(), "dirty": git_dirty(),
          **libraries, "platform": plat, "device": device(), "command": command}


def config_of(stored: dict) -> dict:
  """A stored config (``config.json`` as a dict) without its provenance (:data:`KEY`): the
  config alone, to compare or load; ``stored`` is not changed."""
  return {k: v for k, v in stored.items() if k != KEY}


def of(record: Any) -> Optional[dict]:
  """The provenance a record (``config.json``, ``summary.json``, ``results.json`` as a dict)
  carries, or None (a record written before provenance existed, or not a dict)."""
  found = record.get(KEY) if isinstance(record, dict) else None
  return found if isinstance(found, dict) else None


def short(prov: Optional[dict]) -> str:
  """The commit in a report: its first 10 hex digits, ``+dirty`` when tracked files
  differed; ``"-"`` for no provenance (an older record) or no commit."""
  commit = (prov or {}).get("commit")
  if not isinstance(commit, str) or not commit:
    return "-"
  return commit[:10] + ("+dirty" if prov.get("dirty") else "")
