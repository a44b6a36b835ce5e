"""The accuracy tests' runs with a workdir each, so that the figures docs/results.md quotes from
them have committed records.

    python experiments/accuracy_runs.py --out docs/accuracy_runs
    python experiments/accuracy_runs.py --all --out runs/accuracy_all   # about 8 min
    python experiments/accuracy_runs.py --all --only ad_psgd --out runs/accuracy_async


``tests/algorithms/test_train.py::test_mlp_reaches_95_percent_on_mnist10k`` (8 workers, MLP 784-256-10,
batch 32, lr 0.2 cosine, momentum 0.9, weight decay 1e-3, 300 steps) for allreduce,
allreduce_ring and dpsgd, and ``tests/algorithms/test_decentralized.py::
test_mlp_16_workers_reaches_95_percent`` (16 workers on an Erdos-Renyi graph, batch 16, 500
steps) for dpsgd and matcha; each writes ``OUT/NAME/{config.json, metrics.jsonl,
summary.json}``. The tests assert 95% test accuracy; this records what the runs reach.

``--all`` runs the 8-worker MLP for every algorithm (the asynchronous family 1,200 batches of
events, about 340 own steps a worker; DiLoCo 10 inner steps, outer momentum 0.5), which the
slow test tier once asserted reached 95 % and now checks with logistic regression to 88 %
(``tests/algorithms/test_train.py::test_every_algorithm_learns_mnist10k``); it exits 1 if one falls short.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402,F401  (puts the repository on sys.path)

from nbsgd_jax import recipes  # noqa: E402
from nbsgd_jax import config as config_lib  # noqa: E402
from nbsgd_jax import train  # noqa: E402

BASE = {"model": "mlp", "mlp_hidden": (256,), "eval_train_examples": 64, "progress": False,
        "learning_rate": 0.2, "momentum": 0.9, "lr_schedule": "cosine", "weight_decay": 1e-3}
RUNS = {  # name: the test's overrides
    **{f"mlp8_{a}": {"algorithm": a, "num_workers": 8, "batch_size": 32, "num_steps": 300,
                     "eval_every": 300} for a in ("allreduce", "allreduce_ring", "dpsgd")},
    **{f"mlp16_{a}": {"algorithm": a, "num_workers": 16, "batch_size": 16,
                      "topology": "erdos_renyi", "num_steps": 500, "eval_every": 500}
       for a in ("dpsgd", "matcha")},
}


def every_algorithm() -> dict:
  """The 8-worker MLP run of ``RUNS`` for each algorithm (``--all``): name -> overrides."""
  runs = {}
  for a in config_lib.ALGORITHMS:
    steps = 1200 if recipes.is_asynchronous(a) else 300
    diloco = {"diloco.local_steps": 10, "diloco.outer_momentum": 0.5} if "diloco" in a else {}
    runs[f"mlp8_{a}"] = {"algorithm": a, "num_workers": 8, "batch_size": 32,
                         "num_steps": steps, "eval_every": steps, **diloco}
  return runs


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--all", action="store_true",
                  help="the 8-worker MLP for every algorithm; exit 1 below 95%%")
  ap.add_argument("--only", nargs="+", default=None, metavar="ALGORITHM",
                  help="with --all: these algorithms only")
  a = ap.parse_args()
  runs = every_algorithm() if a.all else RUNS
  if a.only:
    runs = {k: v for k, v in runs.items() if v["algorithm"] in a.only}
  cfgs = [config_lib.override(config_lib.default_config(), {**BASE, **kw, "overwrite": True})
          for kw in runs.values()]
  short = []
  for name, s in zip(runs, train.train_runs(cfgs, a.out, list(runs))):  # OUT/<name>/
    print(f"{name:22s} test accuracy {s['test_accuracy']:.4f}  "
          f"{s['bytes_sent'] / 1e6:.1f} MB / worker", flush=True)
    if s["test_accuracy"] < 0.95:
      short.append(name)
  if a.all and short:
    sys.exit(f"below 95%: {', '.join(short)}")


if __name__ == "__main__":
  main()
