"""Every shell command of the README and of the pages of docs/, run as written or checked.

    python scripts/check_docs_commands.py                    # check every command (cheap)
    python scripts/check_docs_commands.py --run --skip-long  # run the quick ones as a new user
    python scripts/check_docs_commands.py --run              # run all but the hardware ones

The commands are the lines of the ```bash blocks of ``README.md`` and of every ``docs/*.md``
but the generated ``docs/config.md`` (:data:`DOCS`: the README, ``docs/guide.md``, then the
other pages in alphabetical order), ``\\`` continuations joined, blank and ``#`` lines left
out, in reading order, and each ```python block whose info string says ``run`` (```` ```python
run````: GitHub shows it as Python) as one command ``python -c CODE`` (checked: it compiles).
A page without such blocks has no commands. Each command is in one
of four classes, given by explicit lists:

* quick (every command not listed below): ``--run`` runs it; ``tests/user/test_docs.py`` runs it;
* :data:`SLOW_IN_TEST` (under a minute, but too slow for the test's budget): ``--run`` runs
  it; the test only checks it;
* :data:`LONG` (minutes, or network installs): ``--run`` runs it unless ``--skip-long``;
* :data:`HARDWARE` (a GPU, a TPU pod or several hosts): never run here, only checked.

``--run`` copies the repository (the files git tracks plus the untracked ones it does not
ignore: what a clone of the working tree holds) into a temporary directory and runs every
command there with ``bash -c``, unchanged, one after the other, in a fresh environment
(``XLA_FLAGS``, ``JAX_*`` and ``VIRTUAL_ENV`` removed; ``python`` is this interpreter, or the
copy's ``.venv`` once the install command has made one). A command that appears twice runs
once.

*Checked* means, without running it: the program exists (``python -m MODULE``: the module
imports; ``python FILE``: the file exists; anything else: on ``PATH``); every ``--flag`` it
uses is listed by the program's ``--help``; for ``nbsgd_jax.main`` (also behind
``nbsgd_jax.launch ... --``) the ``--config`` file loads, the ``--config.KEY=VALUE``
overrides apply (parsed by ``ml_collections.config_flags``, as the program does) and
:func:`nbsgd_jax.config.validate` accepts the result; ``pip install .[EXTRA]``: the extra is in
``pyproject.toml``.

Exit status: 0 when every command ran (status 0) or passed its checks, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The documents read first, in this order; then the other docs/*.md but NOT_SCANNED, sorted.
FIRST_DOCS = ("README.md", "docs/guide.md")
NOT_SCANNED = ("docs/config.md",)  # generated from the code (nbsgd_jax.config_doc): no commands


def default_docs(root: str = ROOT) -> tuple[str, ...]:
  """The documents whose commands are checked (paths relative to ``root``): the README, the
  user guide, then every other ``docs/*.md`` but :data:`NOT_SCANNED`, in alphabetical order."""
  docs_dir = os.path.join(root, "docs")
  pages = sorted(f"docs/{f}" for f in os.listdir(docs_dir)
                 if f.endswith(".md") and os.path.isfile(os.path.join(docs_dir, f)))
  return FIRST_DOCS + tuple(p for p in pages if p not in FIRST_DOCS + NOT_SCANNED)


DOCS = default_docs()
FENCES = ("bash", "sh", "shell")

# (regex searched in the command, why); the lists are tried in the order of CLASSES.
HARDWARE = (
    (r'jax\[(cuda|tpu)', "installs JAX for a GPU / TPU (needs that hardware)"),
    (r"JAX_COORDINATOR_ADDRESS=|--coordinator_address=",
     "one process of a multi-host run (needs the other hosts)"),
    (r"--workdir=runs/(gpu|tpu)\b", "runs on a GPU / TPU"),
    (r"--config=experiments/configs/(cifar10_resnet20|lm_diloco)\.py",
     "a GPU-sized run (on data the user has: an image folder, the CIFAR release, tfds)"),
)
LONG = (
    (r"-m venv .*pip install", "creates a virtual environment and installs (network, minutes)"),
    (r"-m pytest", "the whole test suite (many minutes)"),
    (r"experiments/reproduce_", "a reproduction (5-46 min)"),
    (r"benchmarks/", "a benchmark (minutes)"),
    (r"--config=experiments/configs/mnist\.py", "the main job (600 CNN steps, 2-3 min or more)"),
    (r"--config=experiments/configs/shakespeare_char\.py",
     "nanoGPT's CPU setting, 2,000 transformer steps (about 3 min)"),
    (r"experiments/validate_clock\.py", "the clock validation: 4 processes, 8 runs (about 3 min)"),
    (r"experiments/compare_algorithms\.py", "14 algorithms on two tasks (minutes to an hour)"),
    (r"experiments/tune_seeds\.py", "each run's learning rate tuned, then 3 seeds (40-70 min)"),
    (r"experiments/frontier_eager_check\.py",
     "the language model's prefix (its checkpoint is not committed) and four runs (minutes)"),
)
SLOW_IN_TEST = (
    (r"examples/own_training_loop\.py", "a CNN on 8 devices for 200 steps (about 15 s)"),
    (r"examples/own_model\.py", "1,500 steps of a small MLP (about 25 s)"),
    (r"--config\.imports=examples\.own_model", "your own model by name (about 10 s)"),
    (r"nbsgd_jax\.launch .*quickstart\.py", "two processes of 4 devices (about 35 s)"),
    (r"quickstart\.py .*--config\.backend=mesh", "8 simulated devices (about 25 s)"),
    (r"quickstart\.py .*--config\.checkpoint_every=", "a run with checkpoints (about 10 s)"),
    (r"mnist\.py .*--config\.model=mlp", "the MLP for 600 steps (about 15 s)"),
    (r"experiments/topology_table\.py", "spectra and MATCHA budgets (about 8 s)"),
    (r"--config\.sweep=", "a sweep of 9 runs of 100 steps (about 20 s)"),
    (r"report runs/sweep/", "the report of the sweep's runs (after the sweep)"),
    (r"nbsgd_jax\.study .*--quick", "a study of 17 runs of 100 steps (about 15 s)"),
)
CLASSES = (("hardware", HARDWARE), ("slow", SLOW_IN_TEST), ("long", LONG))
SHELL_BUILTINS = (".", "source", "cd", "export")
# Variables of the caller's environment a new user would not have (the tests set some).
SCRUBBED_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                "JAX_PROCESS_ID", "VIRTUAL_ENV", "PYTHONPATH")


@dataclasses.dataclass
class Command:
  """One command of a document.

  Attributes:
    doc: the document's path relative to the repository (``"docs/guide.md"``).
    line: 1-based line of the command's first line.
    text: the command, continuations joined (``\\`` + newline -> one space).
    kind: ``"quick"``, ``"slow"``, ``"long"`` or ``"hardware"`` (:func:`classify`).
    why: the reason of a non-quick kind.
  """
  doc: str
  line: int
  text: str
  kind: str = "quick"
  why: str = ""

  @property
  def where(self) -> str:
    return f"{self.doc}:{self.line}"


def extract(markdown: str, doc: str = "") -> list[Command]:
  """The commands of the ```bash (or ```sh / ```shell) blocks of ``markdown``, classified.

  Raises:
    ValueError: a block is not closed, or ends inside a ``\\`` continuation.
  """
  out: list[Command] = []
  fence, start, parts, code = None, 0, [], None
  for i, raw in enumerate(markdown.splitlines(), 1):
    line = raw.strip()
    if fence is None:
      m = re.match(r"^(`{3,}|~{3,})\s*([\w+-]*)(.*)$", line)
      if m:
        fence = (m.group(1), m.group(2).lower())
        if fence[1] == "python" and "run" in m.group(3).split():
          code, start = [], i + 1
      continue
    if line.startswith(fence[0]) and not line[len(fence[0]):].strip():
      if parts:
        raise ValueError(f"{doc}:{start}: the block ends inside a '\\' continuation")
      if code is not None:
        out.append(classify(Command(doc, start, "python -c " + shlex.quote("\n".join(code)))))
      fence, code = None, None
      continue
    if code is not None:
      code.append(raw)
      continue
    if fence[1] not in FENCES:
      continue
    if not parts and (not line or line.startswith("#")):
      continue
    if not parts:
      start = i
    if line.endswith("\\"):
      parts.append(line[:-1].strip())
      continue
    parts.append(line)
    out.append(classify(Command(doc, start, " ".join(p for p in parts if p))))
    parts = []
  if fence is not None:
    raise ValueError(f"{doc}: a ``` block is not closed")
  return out


def classify(cmd: Command) -> Command:
  """Set ``cmd.kind`` / ``cmd.why`` from :data:`HARDWARE`, :data:`SLOW_IN_TEST`, :data:`LONG`
  (in this order, the first match wins; none: quick); returns ``cmd``."""
  for kind, rules in CLASSES:
    for pattern, why in rules:
      if re.search(pattern, cmd.text):
        cmd.kind, cmd.why = kind, why
        return cmd
  cmd.kind, cmd.why = "quick", ""
  return cmd


def doc_commands(root: str = ROOT, docs: Sequence[str] = DOCS) -> list[Command]:
  """Every command of ``docs`` (paths relative to ``root``), in order.

  Raises:
    OSError: a document cannot be read. ValueError: see :func:`extract`.
  """
  out = []
  for doc in docs:
    with open(os.path.join(root, doc)) as f:
      out += extract(f.read(), doc)
  return out


# ----------------------------------------------------------------------------- checks


def _simple_commands(tokens: list[str]) -> list[list[str]]:
  out, cur = [], []
  for t in tokens:
    if t in ("&&", "||", ";", "|"):
      out.append(cur)
      cur = []
    else:
      cur.append(t)
  return [c for c in out + [cur] if c]


def _strip_env(tokens: list[str]) -> tuple[dict, list[str]]:
  env = {}
  while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
    k, v = tokens[0].split("=", 1)
    env[k] = v
    tokens = tokens[1:]
  return env, tokens


@functools.lru_cache(maxsize=None)
def help_text(argv: tuple, cwd: str) -> str:
  """stdout + stderr of ``argv + ("--help",)`` run in ``cwd`` (exit status ignored: absl exits
  with 1 after printing its help)."""
  env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
  env["JAX_PLATFORMS"] = "cpu"
  p = subprocess.run(list(argv) + ["--help"], cwd=cwd, env=env, capture_output=True,
                     text=True, timeout=300)
  return p.stdout + p.stderr


def _flags(args: Iterable[str]) -> list[str]:
  out = []
  for a in args:
    if a == "--" or not a.startswith("-") or re.match(r"^-\d", a):
      continue
    out.append(a.split("=", 1)[0])
  return out


def _missing_flags(flags: Iterable[str], text: str) -> list[str]:
  return [f for f in dict.fromkeys(flags)
          if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]


def check_main_args(args: Sequence[str], root: str = ROOT) -> list[str]:
  """Problems of ``nbsgd_jax.main``'s arguments: ``--config`` file, overrides, validation.

  The ``--config`` / ``--config.KEY=VALUE`` arguments are parsed by a fresh absl
  ``FlagValues`` with ``ml_collections.config_flags.DEFINE_config_file`` (as the program
  does), then :func:`nbsgd_jax.config.validate` runs on the result.
  """
  from absl import flags as absl_flags
  from ml_collections import config_flags

  from nbsgd_jax import config as config_lib
  problems, cfg_args = [], []
  for a in args:
    if a.startswith("--config=") or a.startswith("--config."):
      if a.startswith("--config="):
        path = a.split("=", 1)[1]
        if not os.path.isfile(os.path.join(root, path)):
          return [f"--config={path}: no such file"]
        a = "--config=" + os.path.join(root, path)
      cfg_args.append(a)
  if not any(a.startswith("--config=") for a in cfg_args):
    return ["no --config=FILE"]
  imports = [a.split("=", 1)[1] for a in cfg_args if a.startswith("--config.imports=")]
  with _imported(imports[-1] if imports else "", root) as error:
    if error:
      return [f"validate: {error}"]
    fv = absl_flags.FlagValues()
    argv = ["main"] + cfg_args
    try:  # sys_argv: the overrides to define (by default, this process's sys.argv)
      config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                      sys_argv=argv)
      fv(argv)
      cfg = fv["config"].value
      cfg.get("algorithm")
    except Exception as e:  # pylint: disable=broad-except  (absl / ml_collections errors)
      return [f"the config flags do not parse: {' '.join(str(e).split())}"]
    try:
      config_lib.validate(cfg)
    except config_lib.ConfigError as e:
      problems += [f"validate: {line}" for line in e.errors]
  return problems


@contextlib.contextmanager
def _imported(names: str, root: str):
  """``--config.imports`` imported before the config file loads, as the program does (their
  config sections become keys), from ``root``; yields an error line or None. What they
  registered is removed on exit (``recipes.registrations``): the checker's own process keeps
  the built-in registries."""
  from nbsgd_jax import recipes
  from nbsgd_jax import config as config_lib
  import ml_collections
  modules = [m.strip() for m in names.split(",") if m.strip()]
  for m in modules:  # imported afresh: a module imported before registered into the tables
    sys.modules.pop(m, None)
  sys.path.insert(0, root)  # config.imports names modules as the program sees them from root
  try:
    with recipes.registrations():
      try:
        config_lib.import_modules(ml_collections.ConfigDict({"imports": names}))
        error = None
      except config_lib.ConfigError as e:
        error = e.errors[0]
      yield error
  finally:
    sys.path.remove(root)
    for m in modules:
      sys.modules.pop(m, None)


def _pyproject_extras(root: str) -> set[str]:
  import tomllib
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    return set(tomllib.load(f).get("project", {}).get("optional-dependencies", {}))


def check_simple(tokens: list[str], root: str = ROOT) -> list[str]:
  """Problems of one simple command (no ``&&``), given as shell words."""
  env, tokens = _strip_env(tokens)
  if not tokens:
    return []
  prog, args = tokens[0], tokens[1:]
  if prog in SHELL_BUILTINS:
    return []
  if re.fullmatch(r"python(3(\.\d+)?)?", prog):
    exe = sys.executable if prog in ("python", "python3") else shutil.which(prog)
    if exe is None:
      return [f"{prog}: not found on PATH"]
    if args[:1] == ["-c"] and len(args) == 2:  # a ```python run block: it compiles
      try:
        compile(args[1], "<block>", "exec")
      except SyntaxError as e:
        return [f"python -c: {e}"]
      return []
    if args[:1] == ["-m"] and len(args) >= 2:
      module, rest = args[1], args[2:]
      if importlib.util.find_spec(module) is None:
        return [f"python -m {module}: no such module"]
      if module == "venv":
        return []
      argv = (exe, "-m", module)
    elif args and args[0].endswith(".py"):
      script, rest = args[0], args[1:]
      if not os.path.isfile(os.path.join(root, script)):
        return [f"{script}: no such file"]
      argv = (exe, script)
      module = None
    else:
      return [f"{' '.join(tokens)}: not a 'python -m MODULE' or 'python FILE.py' command"]
    problems = []
    own = rest
    if module == "nbsgd_jax.launch":
      if "--" not in rest:
        return ["nbsgd_jax.launch: no '--' before nbsgd_jax.main's arguments"]
      own, main_args = rest[:rest.index("--")], rest[rest.index("--") + 1:]
      problems += check_main_args(main_args, root)
      problems += [f"nbsgd_jax.main --help does not list {f}" for f in _missing_flags(
          [f for f in _flags(main_args) if not f.startswith("--config")],
          help_text((sys.executable, "-m", "nbsgd_jax.main"), root))]
    if module == "nbsgd_jax.main":
      problems += check_main_args(rest, root)
      own = [a for a in rest if not a.startswith("--config")]
    if module == "pytest":  # paths, not the values of options that take one
      valued = ("-n", "--numprocesses", "--maxprocesses", "-k", "-m", "-p", "--durations")
      problems += [f"{a}: no such file or directory" for prev, a in zip([""] + rest, rest)
                   if not a.startswith("-") and prev not in valued
                   and not os.path.exists(os.path.join(root, a))]
    missing = _missing_flags(_flags(own), help_text(argv, root))
    problems += [f"{' '.join(tokens[:1] + list(argv[1:]))} --help does not list {f}"
                 for f in missing]
    return problems
  if prog in ("pip", "pip3"):
    if args[:1] != ["install"]:
      return [f"{prog} {' '.join(args[:1])}: only 'pip install' is checked"]
    problems = [f"pip install --help does not list {f}" for f in _missing_flags(
        _flags(args[1:]), help_text((sys.executable, "-m", "pip", "install"), root))]
    for a in args[1:]:
      m = re.fullmatch(r"\.\[([\w,-]+)\]", a)
      if m:
        extras = _pyproject_extras(root)
        problems += [f"pip install {a}: pyproject.toml has no extra {e!r}"
                     for e in m.group(1).split(",") if e not in extras]
    return problems
  if shutil.which(prog) is None:
    return [f"{prog}: not found on PATH"]
  return [f"{prog} --help does not list {f}"
          for f in _missing_flags(_flags(args), help_text((prog,), root))]


def check(cmd: Command | str, root: str = ROOT) -> list[str]:
  """Problems of a command (empty: it passes), without running it."""
  text = cmd.text if isinstance(cmd, Command) else cmd
  try:
    tokens = shlex.split(text)
  except ValueError as e:
    return [f"not a shell command: {e}"]
  problems = []
  for simple in _simple_commands(tokens):
    problems += check_simple(simple, root)
  return problems


# ----------------------------------------------------------------------------- running


def copy_repo(src: str, dst: str) -> None:
  """Copy the files git lists in ``src`` (tracked, and untracked but not ignored) to ``dst``;
  without git, everything but ``.git``, ``runs`` and virtual environments."""
  try:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=src,
                         capture_output=True, check=True).stdout.decode()
    files = [f for f in out.split("\0") if f]
  except (OSError, subprocess.CalledProcessError):
    files = []
    for d, dirs, names in os.walk(src):
      dirs[:] = [x for x in dirs if x not in (".git", "runs", ".venv", "venv", "__pycache__")]
      files += [os.path.relpath(os.path.join(d, n), src) for n in names]
  for f in files:
    s = os.path.join(src, f)
    if not os.path.isfile(s):  # deleted in the working tree
      continue
    os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
    shutil.copy2(s, os.path.join(dst, f))


def user_env(cwd: str) -> dict:
  """A new user's environment in ``cwd``: ``python`` on ``PATH`` is ``cwd/.venv``'s if it
  exists, else this interpreter's; the variables of :data:`SCRUBBED_ENV` removed."""
  env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
  venv = os.path.join(cwd, ".venv", "bin")
  first = [venv] if os.path.isdir(venv) else []
  bindir = os.path.dirname(sys.executable)
  env["PATH"] = os.pathsep.join(first + [bindir, env.get("PATH", "")])
  return env


@dataclasses.dataclass
class Result:
  """What happened to one command: ``status`` ``"ok"``, ``"failed"``, ``"checked"``,
  ``"problems"`` or ``"duplicate"``; ``seconds`` of running; ``detail`` (output tail or
  problems)."""
  cmd: Command
  status: str
  seconds: float = 0.0
  detail: str = ""


def run_one(cmd: Command, cwd: str, timeout: float) -> Result:
  """Run ``cmd.text`` with ``bash -c`` in ``cwd`` (:func:`user_env`)."""
  t = time.monotonic()
  try:
    p = subprocess.run(["bash", "-c", cmd.text], cwd=cwd, env=user_env(cwd),
                       capture_output=True, text=True, timeout=timeout)
    ok, out = p.returncode == 0, (p.stdout + p.stderr)
    if not ok:
      out += f"\n(exit status {p.returncode})"
  except subprocess.TimeoutExpired as e:
    ok = False
    out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
           else (e.stdout or "")) + f"\n(timeout after {timeout:.0f} s)"
  dt = time.monotonic() - t
  tail = "\n".join(out.strip().splitlines()[-15:])
  return Result(cmd, "ok" if ok else "failed", dt, tail)


def process(commands: Sequence[Command], run: bool, skip_long: bool, cwd: str,
            timeout: float, log=None) -> list[Result]:
  """Run or check every command (see the module docstring); one :class:`Result` each."""
  results, seen = [], {}
  for cmd in commands:
    if cmd.text in seen:
      r = Result(cmd, "duplicate", detail=f"same as {seen[cmd.text]}")
    elif run and (cmd.kind in ("quick", "slow") or (cmd.kind == "long" and not skip_long)):
      r = run_one(cmd, cwd, timeout)
    else:
      t = time.monotonic()
      problems = check(cmd, cwd)
      r = Result(cmd, "problems" if problems else "checked", time.monotonic() - t,
                 "\n".join(problems))
    seen.setdefault(cmd.text, cmd.where)
    results.append(r)
    if log is not None:
      log(format_result(r))
  return results


def format_result(r: Result) -> str:
  head = f"[{r.status:>9}] {r.cmd.kind:>8} {r.seconds:6.1f} s  {r.cmd.where:18s} {r.cmd.text}"
  if r.cmd.why and r.status in ("checked", "problems"):
    head += f"\n{'':30s}({r.cmd.why}: not run)"
  if r.status in ("failed", "problems") and r.detail:
    head += "\n" + "\n".join(f"{'':30s}| {l}" for l in r.detail.splitlines())
  elif r.status == "duplicate":
    head += f"\n{'':30s}({r.detail})"
  return head


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--run", action="store_true",
                  help="run the commands in a temporary copy of the repository")
  ap.add_argument("--skip-long", action="store_true",
                  help="with --run: only check the long commands (installs, reproductions, "
                       "benchmarks, the full main job, the test suite)")
  ap.add_argument("--keep", metavar="DIR", default=None,
                  help="with --run: copy the repository to DIR (must not exist) and keep it")
  ap.add_argument("--timeout", type=float, default=3600, help="seconds per command")
  ap.add_argument("--docs", nargs="+", default=list(DOCS), help="documents to read")
  a = ap.parse_args(argv)
  commands = doc_commands(ROOT, a.docs)
  counts = {k: sum(c.kind == k for c in commands) for k in ("quick", "slow", "long", "hardware")}
  print(f"{len(commands)} commands in {', '.join(a.docs)}: "
        + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
  if a.run:
    if a.keep:
      os.makedirs(a.keep)
      cwd = a.keep
    else:
      tmp = tempfile.TemporaryDirectory(prefix="docs_commands_")
      cwd = tmp.name
    copy_repo(ROOT, cwd)
    print(f"running in a copy of the repository: {cwd}", flush=True)
  else:
    cwd = ROOT
  results = process(commands, a.run, a.skip_long, cwd, a.timeout,
                    log=lambda s: print(s, flush=True))
  bad = [r for r in results if r.status in ("failed", "problems")]
  tally = {s: sum(r.status == s for r in results)
           for s in ("ok", "failed", "checked", "problems", "duplicate")}
  print(", ".join(f"{v} {k}" for k, v in tally.items() if v)
        + f"; {sum(r.seconds for r in results):.0f} s in all")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
