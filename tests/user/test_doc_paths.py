"""No committed doc names a machine's directories (issue 70, item 6a): the docs, their records
(JSON, logs) and the README hold paths relative to the repository, and the study scripts
write them so (``experiments/common.py::repo_relative``), so a regeneration keeps it so."""

import os
import re
import subprocess

from tests.helpers import ROOT, load_script

# /work/, /home/, /tmp/, /Users/ at the start of a path (not "../../tmp/x"), or a drive "C:\"
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|Users)/|(?<![\w])[A-Za-z]:\\")


def committed_docs() -> list[str]:
  """``git ls-files docs README.md`` (the files under docs/ when this is not a checkout)."""
  try:
    out = subprocess.run(["git", "ls-files", "docs", "README.md"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    out = [os.path.relpath(os.path.join(d, f), ROOT)
           for d, _, fs in os.walk(os.path.join(ROOT, "docs")) for f in fs] + ["README.md"]
  return sorted(out)


def absolute_paths(path: str) -> list[str]:
  """``FILE:LINE: text`` for each line of ``path`` (repository-relative) naming an absolute
  path; a binary file (not UTF-8) has none."""
  try:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      lines = f.read().splitlines()
  except (UnicodeDecodeError, FileNotFoundError):
    return []
  found = []
  for i, line in enumerate(lines, 1):
    for m in ABSOLUTE.finditer(line):
      found.append(f"{path}:{i}: ...{line[max(m.start() - 40, 0):m.end() + 40]}...")
  return found


def test_the_pattern_finds_absolute_paths_only():
  assert ABSOLUTE.search("`python x.py --out /work/main/docs/frontier`")
  assert ABSOLUTE.search('{"out": "/tmp/studies/s"}') and ABSOLUTE.search("--out=/home/u/x")
  assert ABSOLUTE.search("/Users/me/data") and ABSOLUTE.search(r'"C:\\data\\x"')
  for fine in ("../../tmp/studies/s", "runs/tmp/x", "bytes/s over /s", "~/work/x",
               "docs/frontier", "e.g.: x", "a/work/b"):
    assert not ABSOLUTE.search(fine), fine


def test_no_committed_doc_names_an_absolute_path():
  docs = committed_docs()
  assert "README.md" in docs and "docs/guide.md" in docs and len(docs) > 50
  found = [hit for path in docs for hit in absolute_paths(path)]
  assert not found, ("absolute paths (write them relative to the repository):\n"
                     + "\n".join(found[:40]))


def test_a_study_records_its_paths_relative_to_the_repository():
  """``repo_relative`` on what a study records: its command line and its arguments."""
  common = load_script("common")
  root = "/x/repo"
  assert common.repo_relative("python experiments/frontier_lm.py --out /x/repo/docs/frontier "
                              "--data=/x/shared/d.tar.xz", root) == (
      "python experiments/frontier_lm.py --out docs/frontier --data=../shared/d.tar.xz")
  assert common.repo_relative({"out": "/x/repo/runs/a", "lrs": [0.1, 0.2], "seeds": (0, 1),
                               "note": "bytes/s, 1/2", "paths": ["/x/repo", "rel/p"]},
                              root) == {"out": "runs/a", "lrs": [0.1, 0.2], "seeds": (0, 1),
                                        "note": "bytes/s, 1/2", "paths": [".", "rel/p"]}
  assert common.ROOT == ROOT

