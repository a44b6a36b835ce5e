"""The report's figures: training loss and test accuracy (:func:`plot_loss_accuracy`) and the
consensus distance (:func:`plot_consensus`) of the runs compared, as PNGs.

Drawn with matplotlib's object API (no pyplot: no global backend state) and written
atomically. :mod:`nbsgd_jax.report` re-exports these names (the module to import).
"""

from __future__ import annotations

import textwrap
from typing import Sequence

from nbsgd_jax.core import files as files_lib
from nbsgd_jax.report.runs import Run, _num


def _atomic_savefig(fig, path: str) -> None:
  files_lib.atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))


def _style(i: int) -> dict:
  return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":", "-.")[(i // 10) % 4],
          "marker": "o", "markersize": 3, "linewidth": 1.5}


def _series(records: Sequence[dict], xkey: str, ykey: str, xscale: float = 1.0,
            positive: bool = False) -> tuple[list, list]:
  xs, ys = [], []
  for rec in records:
    x, y = _num(rec.get(xkey)), _num(rec.get(ykey))
    if x is None or y is None or (positive and y <= 0):
      continue
    xs.append(x * xscale)
    ys.append(y)
  return xs, ys


def _new_figure(size):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=size, layout="constrained")  # no pyplot: no global backend state
  FigureCanvasAgg(fig)
  return fig


def plot_loss_accuracy(runs: Sequence[Run], labels: Sequence[str], xkey: str, xlabel: str,
                       xscale: float, path: str) -> None:
  """One figure, two panels: ``train_loss`` (log scale) and ``test_accuracy`` against
  ``xkey`` (values times ``xscale``); one line per run, written atomically to ``path``."""
  fig = _new_figure((11, 4.2))
  ax_loss, ax_acc = fig.subplots(1, 2)
  for i, (run, label) in enumerate(zip(runs, labels)):
    ax_loss.plot(*_series(run.records, xkey, "train_loss", xscale, positive=True),
                 label=label, **_style(i))
    ax_acc.plot(*_series(run.records, xkey, "test_accuracy", xscale), label=label,
                **_style(i))
  ax_loss.set_yscale("log")
  ax_loss.set_ylabel("training loss (averaged model)")
  ax_acc.set_ylabel("test accuracy")
  for ax in (ax_loss, ax_acc):
    ax.set_xlabel(xlabel)
    ax.grid(True, which="both", alpha=0.3)
  ax_loss.set_title(f"training loss vs {xlabel}")
  ax_acc.set_title(f"test accuracy vs {xlabel}")
  fig.legend(*ax_acc.get_legend_handles_labels(), fontsize="small",
             loc="outside lower center")  # below the panels: labels can be long
  _atomic_savefig(fig, path)


def plot_consensus(runs: Sequence[Run], labels: Sequence[str], path: str,
                   colors: Sequence[int] | None = None) -> None:
  """Consensus distance Xi against step (log scale), one line per run, written atomically;
  ``colors``: each run's style index (its colour in the loss / accuracy figures)."""
  fig = _new_figure((7.5, 4.6))
  ax = fig.subplots()
  colors = range(len(runs)) if colors is None else colors
  for i, run, label in zip(colors, runs, labels):
    ax.plot(*_series(run.records, "step", "consensus_distance", positive=True),
            label=textwrap.fill(label, 90), **_style(i))
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("consensus distance Xi")
  ax.set_title("consensus distance vs step")
  ax.grid(True, which="both", alpha=0.3)
  fig.legend(fontsize="small", loc="outside lower center")  # below: labels can be long
  _atomic_savefig(fig, path)


def has_consensus(run: Run) -> bool:
  """Whether any evaluation has a positive, finite ``consensus_distance`` (decentralized)."""
  return any((_num(r.get("consensus_distance")) or 0.0) > 0 for r in run.records)
