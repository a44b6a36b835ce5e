"""Mean and spread over seeds of reproduction results.

    python experiments/aggregate_seeds.py docs/consensus/targets docs/consensus/targets/seed1 \\
        docs/consensus/targets/seed2 --out docs/consensus/targets/seeds.md

Reads each directory's ``results.json`` (written by ``experiments/reproduce_consensus.py``
with a different ``--seed``) and writes a markdown table, per setting and run name present in
every directory: test accuracy mean +- sample standard deviation (and each seed's value), the final
training loss of the averaged model (mean +- std), MB sent per worker and simulated seconds (means), and the share of the mean allreduce - dpsgd gap
that the mean accuracy closes, and of the mean dpsgd - allreduce training-loss gap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (experiments/common.py)


def load(dirs: list[str]) -> list[dict]:
  out = []
  for d in dirs:
    with open(os.path.join(d, "results.json")) as f:
      out.append(json.load(f))
  return out


def aggregate(results: list[dict]) -> list[dict]:
  """Per setting ``(num_workers, partition)`` found in every result: ``{"num_workers",
  "partition", "seeds", "runs": {name: {"acc": [per seed], "mb": [...], "sim": [...]}}}``,
  run names in the first result's order, kept only when present in all."""
  settings = []
  for st in results[0]["settings"]:
    key = (st["num_workers"], st["partition"])
    matches = [next((s for s in r["settings"] if (s["num_workers"], s["partition"]) == key),
                    None) for r in results]
    if any(m is None for m in matches):
      continue
    names = [k for k in st["runs"] if all(k in m["runs"] for m in matches)]
    runs = {k: {"acc": [m["runs"][k]["test_accuracy"] for m in matches],
                "loss": [m["runs"][k]["train_loss"] for m in matches],
                "mb": [m["runs"][k]["bytes_sent"] / 1e6 for m in matches],
                "sim": [m["runs"][k]["sim_time"] for m in matches]} for k in names}
    settings.append({"num_workers": key[0], "partition": key[1],
                     "seeds": [r["args"]["seed"] for r in results], "runs": runs})
  return settings


def markdown(settings: list[dict]) -> str:
  lines = []
  for st in settings:
    runs = st["runs"]
    both = "allreduce" in runs and "dpsgd" in runs
    gap = np.mean(runs["allreduce"]["acc"]) - np.mean(runs["dpsgd"]["acc"]) if both else None
    lgap = np.mean(runs["dpsgd"]["loss"]) - np.mean(runs["allreduce"]["loss"]) if both else None
    lines += [f"n = {st['num_workers']}, {st['partition']}, seeds {st['seeds']}"
              + (f" (mean allreduce - dpsgd gap {100 * gap:.2f} points)" if gap is not None
                 else "") + ":", "",
              "| run | test acc. mean +- std | per seed | train loss mean +- std | MB / worker "
              "| sim time (s) | acc. gap closed | loss gap closed |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
      acc = 100 * np.array(r["acc"])
      std = acc.std(ddof=1) if len(acc) > 1 else 0.0
      closed = "-"
      if gap and gap > 0 and name != "allreduce":
        closed = f"{100 * (acc.mean() / 100 - np.mean(runs['dpsgd']['acc'])) / gap:.0f}%"
      loss = np.array(r["loss"])
      lstd = loss.std(ddof=1) if len(loss) > 1 else 0.0
      lclosed = "-"
      if lgap and lgap > 0 and name != "allreduce":
        lclosed = f"{100 * (np.mean(runs['dpsgd']['loss']) - loss.mean()) / lgap:.0f}%"
      lines.append(f"| {name} | {acc.mean():.2f}% +- {std:.2f} | "
                   f"{', '.join(f'{v:.2f}' for v in acc)} | {loss.mean():.4f} +- {lstd:.4f} | "
                   f"{np.mean(r['mb']):.1f} | "
                   f"{np.mean(r['sim']):.2f} | {closed} | {lclosed} |")
    lines.append("")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("dirs", nargs="+", help="directories holding results.json")
  ap.add_argument("--out", required=True, help="markdown file to write")
  a = ap.parse_args()
  text = markdown(aggregate(load(a.dirs)))
  common.write_atomic(a.out, text)
  print(text)


if __name__ == "__main__":
  main()
