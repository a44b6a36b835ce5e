"""EASGD (examples/easgd.py, an algorithm from outside the package) against D-PSGD and local
SGD on heterogeneous least squares, each tuned on a held-out seed, compared at equal bytes and
equal simulated time. Run: python -m nbsgd_jax.study experiments/studies/easgd_vs_dpsgd.py
--out runs/easgd_study --quick (docs/guide.md, "A study in one file")."""
import ml_collections


def get_study():
  s = ml_collections.ConfigDict()
  s.base = {"imports": "examples.easgd", "dataset": "least_squares", "num_workers": 8,
            "topology": "ring", "batch_size": 8, "momentum": 0.0, "weight_decay": 0.0,
            "lr_schedule": "constant", "eval_every": 25,
            "problem": {"examples_per_worker": 64, "dim": 10, "heterogeneity": 2.0},
            "cluster": {"latency": 0.01}}  # 10 ms a message: communication costs time
  lrs = {"learning_rate": [0.01, 0.03, 0.1]}
  s.methods = {
      "easgd": {"overrides": {"algorithm": "easgd", "easgd": {"local_steps": 4}}, "grid": lrs},
      "dpsgd": {"overrides": {"algorithm": "dpsgd"}, "grid": lrs},
      "local_sgd": {"overrides": {"algorithm": "local_sgd", "local_sgd": {"local_steps": 4}},
                    "grid": lrs}}
  s.tune = {"seeds": 100, "metric": "gap", "extend": True}
  s.seeds = [0, 1, 2]
  s.budget = {"num_steps": 400}
  s.columns = ["final gap", "gap at equal bytes_sent", "gap at equal sim_time",
               "sim_time to gap <= 0.05"]
  s.quick = {"seeds": [0, 1], "budget": {"num_steps": 100}, "overrides": {"eval_every": 10}}
  return s
