"""The whole program, every algorithm switch, with a tiny random model on the fake mesh.

A tiny model (2 layers, width 64) carries the embedded tokenizer's vocabulary so that the
real prompts, chat template and parsing are exercised; Sokoban keeps the envs fast.
Compiled programs are shared through a persistent compilation cache.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from seed_jax.metrics import read_metrics
from seed_jax.train.algorithms import ALGORITHMS
from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_runs_end_to_end(tiny_model, tmp_path, algorithm):
  summary = Trainer(tiny_spec(tiny_model, algorithm), str(tmp_path)).run()
  assert summary["iterations"] == 1 and "valid_seen/success" in summary
  assert summary["train/success_last"] == summary["train/success_first"]  # one iteration
  records = read_metrics(str(tmp_path / "metrics.jsonl"))
  train = [r for r in records if r["phase"] == "train"]
  assert len(train) == 1 and np.isfinite(train[0]["loss"])
  assert train[0]["time_rollout_s"] > 0 and "invalid_action_rate" in train[0]
  # Every arm keeps its episodes, which fold into the iteration's metrics.
  with open(tmp_path / "episodes" / "iter_1.jsonl") as f:
    episodes = [json.loads(line) for line in f]
  assert len(episodes) == train[0]["episodes"]
  assert np.mean([e["won"] for e in episodes]) == pytest.approx(train[0]["success"])
  assert sum(e["num_steps"] for e in episodes) == train[0]["steps"]
  assert sum(e["invalid_steps"] for e in episodes) == train[0]["invalid_actions"]
  assert sum(e["ineffective_steps"] for e in episodes) == train[0]["ineffective_actions"]
  opd = algorithm in ("seed", "static_library", "no_sft")
  assert ("opd_loss" in train[0]) == opd
  # The teacher gap at theta_old (the default "precomputed" teacher mode), split by where the
  # tokens sit and how their episode ended, in metrics.jsonl and per trajectory.
  assert ("gap_all_tokens" in train[0]) == opd
  if opd:
    gap = {k: v for k, v in train[0].items() if k.startswith("gap_")}
    assert gap["gap_action_tokens"] + gap["gap_rest_tokens"] == gap["gap_all_tokens"]
    assert gap["gap_won_tokens"] + gap["gap_failed_tokens"] == gap["gap_all_tokens"]
    assert 0 <= gap["gap_decision_tokens"] <= gap["gap_all_tokens"]
    assert all(np.isfinite(v) for v in gap.values())
    with open(tmp_path / "analysis" / "iter_1.jsonl") as f:
      gates = [g for g in (json.loads(line)["gate"] for line in f) if g is not None]
    assert sum(g["opd_tokens"] for g in gates) == gap["gap_all_tokens"]
    for g in gates:
      assert g["gap_action_tokens"] + g["gap_rest_tokens"] == g["opd_tokens"]
  assert any(r["phase"] == "sft" for r in records) == (
      algorithm in ("seed", "static_library", "no_opd"))
  assert os.path.exists(tmp_path / "export" / "model.safetensors")
  assert json.load(open(tmp_path / "summary.json"))["algorithm"] == algorithm


def test_play_with_a_model_uses_the_training_acting_loop(tiny_model):
  from seed_jax import play
  summary = play.run("sokoban", "model", "valid_seen", episodes=2, seed=0, workers=0,
                     batch_size=2, overrides=["max_steps=3"], model=tiny_model,
                     max_new_tokens=8)
  assert summary["episodes"] == 2 and summary["failed"] == 0
  assert 0.0 <= summary["success"] <= 1.0
