"""Weights & Biases: what an offline run wrote, read back from its `.wandb` file, and the
failures that must stay warnings."""

from __future__ import annotations

import glob
import json
import logging
import struct
import sys
import time

import pytest

from seed_jax.experiments.arms import get_arm
from seed_jax.experiments.jobs import plan_jobs
from seed_jax.metrics import MetricsWriter, read_metrics
from seed_jax.wandb_sink import RUN_ID_FILE, WandbSettings, WandbSink

wandb = pytest.importorskip("wandb")


def _records(path: str) -> list:
  """The protobuf records of a `.wandb` file: a 7-byte W&B header, then LevelDB's log
  format (32 KiB blocks of chunks with a 7-byte header: crc, length, type)."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  block, pos, chunks, pending = 32768, 7, [], b""
  while pos + 7 <= len(data):
    room = block - pos % block
    length, kind = struct.unpack("<HB", data[pos + 4:pos + 7]) if room >= 7 else (0, 0)
    if room < 7 or (length == 0 and kind == 0):  # the block's zero-filled tail
      pos += room
      continue
    if pos + 7 + length > len(data):  # a chunk still being written
      break
    chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
    if kind == 1:  # full
      chunks.append(chunk)
    elif kind in (2, 3):  # first, middle
      pending += chunk
    else:  # last
      chunks.append(pending + chunk)
      pending = b""
  records = []
  for raw in chunks:
    record = wandb_internal_pb2.Record()
    record.ParseFromString(raw)
    records.append(record)
  return records


def _finished_records(path: str, timeout_s: float = 60.0) -> list:
  """The records of a run's `.wandb` file once it ends with the run's exit record: W&B's
  service process writes the file and may still be flushing it when `finish()` returns
  (seen in CI: the last run's history row missing)."""
  deadline = time.monotonic() + timeout_s
  while True:
    records = _records(path)
    if (records and records[-1].WhichOneof("record_type") == "exit"
        or time.monotonic() > deadline):
      return records
    time.sleep(0.2)


def _offline_run(workdir) -> dict:
  """The runs (by id) of `workdir/wandb`: config, group, name and history rows."""
  runs = {}
  for path in sorted(glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb"))):
    for record in _finished_records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run = runs.setdefault(record.run.run_id, {"history": []})
        run.update(group=record.run.run_group, name=record.run.display_name,
                   project=record.run.project,
                   config={item.key: json.loads(item.value_json)
                           for item in record.run.config.update})
      elif kind == "history":
        row = {"/".join(item.nested_key) or item.key: json.loads(item.value_json)
               for item in record.history.item}
        runs[next(reversed(runs))]["history"].append(row)
  return runs


@pytest.fixture
def offline(monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")


def test_an_offline_run_holds_the_config_and_every_scalar_against_its_phase_step(
    tmp_path, offline):
  settings = WandbSettings(project="p", name="grpo/seed0", group="cmp")
  writer = MetricsWriter(tmp_path, tensorboard=False,
                         sinks=(WandbSink(tmp_path, settings, {"algorithm": "grpo"}),))
  writer.write(3, "bc", {"nll": 0.5})
  writer.write(1, "train", {"loss": 0.25, "gate_hist": [0.5, 0.5], "opd": True})
  writer.close()

  (run_id, run), = _offline_run(tmp_path).items()
  assert (tmp_path / RUN_ID_FILE).read_text().strip() == run_id
  assert (run["project"], run["name"], run["group"]) == ("p", "grpo/seed0", "cmp")
  assert run["config"]["algorithm"] == "grpo"
  bc, train = run["history"]
  assert bc["bc/step"] == 3 and bc["bc/nll"] == 0.5
  assert train["train/step"] == 1 and train["train/loss"] == 0.25
  assert train["train/gate_hist/bins"] == [0.0, 0.5, 1.0]  # the gate's bins on [0, 1]
  assert train["train/gate_hist/values"] == [0.5, 0.5]
  assert "train/opd" not in train  # booleans are not scalars
  assert [r["phase"] for r in read_metrics(tmp_path / "metrics.jsonl")] == ["bc", "train"]


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, offline):
  for step in (1, 2):
    sink = WandbSink(tmp_path, WandbSettings())
    sink.log({"step": step, "phase": "train", "loss": float(step)})
    sink.close()
  runs = _offline_run(tmp_path)
  assert len(runs) == 1
  (run,) = runs.values()
  assert run["name"] == tmp_path.name
  assert sorted(row["train/step"] for row in run["history"]) == [1, 2]


def test_a_missing_package_is_one_warning_and_the_metrics_still_written(
    tmp_path, monkeypatch, caplog):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  with caplog.at_level(logging.WARNING):
    sink = WandbSink(tmp_path, WandbSettings())
  assert not sink.active and "not installed" in caplog.text
  writer = MetricsWriter(tmp_path, tensorboard=False, sinks=(sink,))
  writer.write(0, "train", {"loss": 1.0})
  writer.close()
  assert read_metrics(tmp_path / "metrics.jsonl")[0]["loss"] == 1.0


def test_an_unreachable_server_is_one_warning(tmp_path, monkeypatch, caplog):
  def unreachable(**kwargs):
    raise ConnectionError("api.wandb.ai unreachable")
  monkeypatch.setattr(wandb, "init", unreachable)
  with caplog.at_level(logging.WARNING):
    sink = WandbSink(tmp_path, WandbSettings())
  assert not sink.active and "unreachable" in caplog.text
  sink.log({"step": 0, "phase": "train", "loss": 1.0})  # a no-op, not a crash
  sink.close()


def test_the_experiment_runner_groups_its_runs_and_names_them_by_job():
  jobs = plan_jobs("runs/exp", [get_arm("grpo"), get_arm("seed")], [0], 2,
                   [("log.wandb", "True")])
  names = {job.name: dict(job.overrides) for job in jobs}
  assert all(o["log.wandb_group"] == "exp" and o["log.wandb_name"] == name
             for name, o in names.items())
  grouped = plan_jobs("runs/exp", [get_arm("grpo")], [0], 2, [("log.wandb_group", "mine")])
  assert {dict(job.overrides)["log.wandb_group"] for job in grouped} == {"mine"}
