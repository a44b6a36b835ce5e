"""Helpers shared by the reproduction scripts: atomic result files and matplotlib output."""

from __future__ import annotations

import json
import os


def pyplot():
  """``matplotlib.pyplot`` on the non-interactive Agg backend."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save_figure(fig, path: str, dpi: int = 120) -> None:
  """Write ``fig`` to ``path`` through a temporary file (a crash never leaves half a PNG)."""
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=dpi)
  os.replace(tmp, path)
  import matplotlib.pyplot as plt
  plt.close(fig)


def write_atomic(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def write_results(out: str, results: dict, markdown: str) -> None:
  """``out/results.json`` and ``out/results.md``, each written atomically; prints the table."""
  write_atomic(os.path.join(out, "results.json"), json.dumps(results))
  write_atomic(os.path.join(out, "results.md"), markdown)
  print(markdown)
