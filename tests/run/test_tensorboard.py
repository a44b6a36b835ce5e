"""``config.tensorboard``: TensorBoard event files with the scalars of ``metrics.jsonl``.

The event files are read back without TensorFlow or the ``tensorboard`` package: the TFRecord
framing (uint64 length, masked CRC-32C of the length, payload, masked CRC-32C of the payload,
little-endian) is parsed here, with a CRC-32C of its own, and the payloads are decoded with
tensorboardX's ``Event`` protobuf.
"""

import glob
import json
import math
import os
import struct
import sys

import numpy as np
import pytest

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # noqa: E402

from nbsgd_jax import train  # noqa: E402
from nbsgd_jax.core import tensorboard
from tests.helpers import small_cfg  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier: see tests/conftest.py


def _crc32c_table():
  table = []
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli, reflected
    table.append(c)
  return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for b in data:
    crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_crc32c_reference_value():
  crc = 0xFFFFFFFF  # the standard check value of CRC-32C: crc("123456789") = 0xE3069283
  for b in b"123456789":
    crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  assert crc ^ 0xFFFFFFFF == 0xE3069283


def read_events(logdir: str) -> list:
  """Every Event of the one event file in ``logdir``, CRCs checked."""
  files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
  assert len(files) == 1, files
  data = open(files[0], "rb").read()
  events, pos = [], 0
  while pos < len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
    assert header_crc == masked_crc32c(header)
    payload = data[pos + 12:pos + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
    assert len(payload) == length and payload_crc == masked_crc32c(payload)
    event = event_pb2.Event()
    event.ParseFromString(payload)
    events.append(event)
    pos += 16 + length
  assert pos == len(data)
  return events


def scalar_events(logdir: str) -> dict:
  """``{(step, tag): value}`` of the scalar summaries (each written once)."""
  out = {}
  for event in read_events(logdir):
    for v in event.summary.value:
      assert v.WhichOneof("value") == "simple_value", v
      assert (event.step, v.tag) not in out, (event.step, v.tag)
      out[event.step, v.tag] = v.simple_value
  return out


def expected_scalars(record: dict) -> dict:
  """A metrics.jsonl record as ``{tag: value}``: numbers (nested dicts as ``a/b`` tags)."""
  out = {}

  def walk(d, prefix):
    for k, v in d.items():
      if isinstance(v, dict):
        walk(v, f"{prefix}{k}/")
      elif isinstance(v, (int, float)) and not isinstance(v, bool):
        out[prefix + k] = v
  walk({k: v for k, v in record.items() if k != "step"}, "")
  return out


def same_float32(a: float, b: float) -> bool:
  return (math.isnan(a) and math.isnan(b)) or np.float32(a) == np.float32(b)


def test_run_writes_the_metrics_as_tensorboard_scalars(tmp_path):
  cfg = small_cfg(num_steps=20, eval_every=10, tensorboard=True, **{"consensus.per_layer": True})
  train.train(cfg, str(tmp_path))
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 10, 20]
  got = scalar_events(str(tmp_path / "tensorboard"))
  want = {(r["step"], tag): v for r in records for tag, v in expected_scalars(r).items()}
  assert set(got) == set(want)
  for key, v in want.items():
    assert same_float32(got[key], v), (key, got[key], v)
  # what the run records: the evaluation metrics, per layer Xi (flattened), None skipped
  tags = {tag for _, tag in got}
  assert {"train_loss", "test_loss", "test_accuracy", "consensus_distance", "bytes_sent",
          "sim_time", "wall_time", "rounds"} <= tags
  assert any(t.startswith("consensus_distance_layers/") for t in tags)
  assert records[0]["train_batch_loss"] is None and (0, "train_batch_loss") not in got
  assert (10, "train_batch_loss") in got


def test_no_event_files_by_default(tmp_path):
  train.train(small_cfg(num_steps=2, eval_every=2), str(tmp_path))
  assert not (tmp_path / "tensorboard").exists()


def test_writer_with_a_hand_made_record(tmp_path):
  w = tensorboard.TensorBoardWriter(str(tmp_path))
  w.write({"step": 7, "loss": 0.5, "rounds": 3, "missing": None, "name": "dpsgd",
           "flag": True, "layers": {"Dense_0": {"kernel": 0.25, "bias": None}, "Dense_1": 2.0}})
  w.write({"step": 9, "loss": float("inf"), "rounds": 4})
  w.close()
  got = scalar_events(str(tmp_path))
  assert got == {(7, "loss"): 0.5, (7, "rounds"): 3.0, (7, "layers/Dense_0/kernel"): 0.25,
                 (7, "layers/Dense_1"): 2.0, (9, "loss"): float("inf"), (9, "rounds"): 4.0}


def test_missing_tensorboardx_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails
  with pytest.raises(ImportError, match="config.tensorboard=True needs tensorboardX.*pip install"):
    tensorboard.TensorBoardWriter(str(tmp_path))
