"""Two JAX processes (4 CPU devices each, gloo collectives) train one tiny model on a mesh
that spans both, as hosts of a pod do: the same program on every host, env rows split."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from seed_jax.metrics import read_metrics

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_hosts_train_one_model_and_split_the_environments(tiny_model, tmp_path):
  workdir, port = str(tmp_path / "run"), free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  procs = [subprocess.Popen(
      [sys.executable, "-m", "tests.train.multihost_worker", str(i), str(port), tiny_model,
       workdir, str(tmp_path / f"host{i}.json")], cwd=REPO, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=900)[0] for p in procs]
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  hosts = [json.load(open(tmp_path / f"host{i}.json")) for i in range(2)]
  assert [h["devices"] for h in hosts] == [8, 8] and [h["local_devices"] for h in hosts] == [4, 4]
  # One model: both hosts end with the same parameters and the same evaluation.
  assert hosts[0]["checksum"] == hosts[1]["checksum"]
  assert hosts[0]["summary"] == hosts[1]["summary"]
  # The env rows were split: each host stepped some, together every step of the run.
  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  train = [r for r in records if r["phase"] == "train"]
  assert len(train) == 1  # written once, by the primary host
  assert all(h["stepped"] > 0 for h in hosts)
  assert hosts[0]["stepped"] + hosts[1]["stepped"] >= train[0]["steps"]
  assert os.path.exists(os.path.join(workdir, "export", "model.safetensors"))
  # What a person reads comes from the primary host only: lines, tables, progress bars.
  shown = ("[bc]", "[stage1]", "[iter 1/1]", "evaluation at iteration 1", "turn/s",
           "mini-batch/s")
  assert all(text in outputs[0] for text in shown), outputs[0][-4000:]
  assert not any(text in outputs[1] for text in shown), outputs[1][-4000:]
