"""Why DiLoCo with eager overlapped outer steps diverges in the frontier study (issue 57's
flaw check): on the study's tuning seed and its inner rate pick (0.004), the outer step's
momentum and overlap varied one at a time. Writes ``OUT/eager_check.json``.

    python experiments/frontier_eager_check.py --out docs/frontier

Variants (every other setting the study's, ``frontier_lm.continuation``): blocking DiLoCo with
outer SGD (momentum 0), eager with momentum 0, eager with Nesterov 0.5, and the naive delayed
variant (PCCL's one-outer-step delay) at the study's Nesterov 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import frontier_lm  # noqa: E402

from nbsgd_jax import config as config_lib  # noqa: E402

VARIANTS = {
    "eager_m0": {"diloco.overlap": "eager", "diloco.outer_momentum": 0.0,
                 "diloco.outer_nesterov": False},
    "delayed": {"diloco.overlap": "delayed"},
    "eager_mom0.5": {"diloco.overlap": "eager", "diloco.outer_momentum": 0.5},
    "none_m0": {"diloco.outer_momentum": 0.0, "diloco.outer_nesterov": False},
}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--rate", type=float, default=0.004)
  args = p.parse_args()
  with open(os.path.join(args.out, "results.json")) as f:
    a = argparse.Namespace(**{**json.load(f)["settings"], "out": args.out})
  a.prefixes_done, a.methods = {}, None
  cfgs = {k: config_lib.override(frontier_lm.continuation(a, a.tune_seed, "diloco", args.rate,
                                                          "datacenter"), v)
          for k, v in VARIANTS.items()}
  out = {"command": common.repo_relative("python experiments/frontier_eager_check.py "
                                         + " ".join(sys.argv[1:])),
         "seed": a.tune_seed, "rate": args.rate, "variants": {}}
  for k, r in zip(cfgs, common.run_histories(list(cfgs.values()), frontier_lm.KEEP)):
    r.pop("summary", None)
    out["variants"][k] = {"overrides": VARIANTS[k], **r}
    print(k, [(h["step"], round(h["train_loss"], 3), round(h["test_loss"], 3))
              for h in r["history"]], flush=True)
  common.write_atomic(os.path.join(args.out, "eager_check.json"), json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
