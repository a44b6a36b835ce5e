"""The main job's times are named where a user reads them (issue 70, item 6c): the printed
summary labels ``wall_time`` (the training steps) and ``run_seconds`` (all of ``train()``) and
says what the progress bar and the whole command count; the guide explains the four."""

import os
import re

from tests.helpers import ROOT


def test_the_printed_summary_names_each_time():
  from nbsgd_jax import main as main_lib
  table = main_lib._summary_table({"algorithm": "dpsgd", "sim_time": 3.5, "wall_time": 21.6,
                                   "run_seconds": 27.25, "test_accuracy": 0.98})
  rows = dict(re.findall(r"^\| (.+?) \| (.+?) \|$", table, re.M))
  wall = next(k for k, v in rows.items() if v == "21.6")
  run = next(k for k, v in rows.items() if v == "27.25")
  sim = next(k for k, v in rows.items() if v == "3.5")
  assert wall.startswith("wall_time") and "training steps" in wall and "compilation" in wall
  assert run.startswith("run_seconds") and "train()" in run and "data" in run
  assert sim.startswith("sim_time") and "simulated" in sim
  assert rows["test_accuracy"] == "0.98"
  note = main_lib.TIMES_NOTE
  assert "progress bar" in note and "evaluations" in note and "imports" in note


def test_the_guide_explains_the_three_times():
  with open(os.path.join(ROOT, "docs", "guide.md")) as f:
    text = f.read()
  i = text.index("**Three times.**")
  para = text[i:text.index("\n\n", text.index("\n* the command", i))]
  for words in ("`wall_time`", "compilation", "progress bar", "`run_seconds`",
                "data loading", "evaluation at step 0", "imports", "checkpoints"):
    assert words in para, words
