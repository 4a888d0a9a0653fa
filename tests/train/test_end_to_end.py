"""The whole program, every algorithm switch, with a tiny random model on the fake mesh.

A tiny model (2 layers, width 64) carries the embedded tokenizer's vocabulary so that the
real prompts, chat template and parsing are exercised; Sokoban keeps the envs fast.
Compiled programs are shared through a persistent compilation cache.
"""

from __future__ import annotations

import json
import os

import jax
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
  opd = algorithm in ("seed", "static_library", "no_sft")
  assert ("opd_loss" in train[0]) == opd
  # The teacher gap at theta_old (the default "precomputed" teacher mode), split by where the
  # tokens sit and how their episode ended, in metrics.jsonl and per trajectory.
  assert ("gap_all_tokens" in train[0]) == opd
  if opd:
    gap = {k: v for k, v in train[0].items() if k.startswith("gap_")}
    assert gap["gap_action_tokens"] + gap["gap_rest_tokens"] == gap["gap_all_tokens"]
    assert gap["gap_won_tokens"] + gap["gap_failed_tokens"] == gap["gap_all_tokens"]
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


def test_a_lora_run_trains_the_adapters_on_a_frozen_base(tiny_model, tmp_path):
  """Behaviour cloning (the fine-tuning stage 1 uses too), the KL reference and RL all run
  on one base with adapters; only the adapters change, and the export holds the merged
  model and a PEFT folder."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from seed_jax.models import load_model  # pylint: disable=import-outside-toplevel
  from seed_jax.models.lora import split_trainable  # pylint: disable=import-outside-toplevel
  trainer = Trainer(tiny_spec(tiny_model, "grpo", **{"model.lora.rank": 4, "bc.enabled": True}),
                    str(tmp_path))
  trainer.run()
  adapters, base = split_trainable(trainer.state.params)
  loaded = nnx.split(load_model(tiny_model)[0], nnx.Param)[1]
  for got, want in zip(jax.tree.leaves(base), jax.tree.leaves(loaded), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert all(np.asarray(b).any() for p, b in nnx.to_flat_state(adapters) if p[-1] == "lora_b")
  assert len(final_params(str(tmp_path))[1]) == len(jax.tree.leaves(adapters))
  assert os.path.exists(tmp_path / "export" / "model.safetensors")
  assert os.path.exists(tmp_path / "export" / "adapter" / "adapter_model.safetensors")


def final_params(workdir):
  from seed_jax.checkpoint import Checkpointer
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  step = ckpt.latest_step()
  restored = ckpt._manager.restore(step)  # raw arrays, structure as saved
  return step, jax.tree.leaves(restored["state"]["train"]["params"])


def test_interrupted_then_resumed_equals_uninterrupted(tiny_model, tmp_path):
  straight = str(tmp_path / "straight")
  Trainer(tiny_spec(tiny_model, "no_sft", iterations=2), straight).run()
  resumed = str(tmp_path / "resumed")
  Trainer(tiny_spec(tiny_model, "no_sft", iterations=1), resumed).run()  # "interrupted"
  Trainer(tiny_spec(tiny_model, "no_sft", iterations=2), resumed).run()  # resumed
  (step_a, a), (step_b, b) = final_params(straight), final_params(resumed)
  assert step_a == step_b == 2
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  steps = [r["step"] for r in read_metrics(os.path.join(resumed, "metrics.jsonl"))
           if r["phase"] == "train"]
  assert steps == [1, 2]


def test_a_run_killed_while_saving_resumes_from_the_previous_checkpoint(tiny_model, tmp_path):
  """The child dies inside the save of iteration 1 (after iteration 0's was committed);
  the same command then resumes from iteration 0 and finishes."""
  import subprocess
  import sys
  import textwrap
  workdir = str(tmp_path / "run")
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  child = textwrap.dedent(f"""
      import os, sys
      sys.path.insert(0, {repo!r})
      from orbax.checkpoint._src.path import atomicity
      from seed_jax.checkpoint import Checkpointer
      from seed_jax.train.trainer import Trainer
      from tests.train.conftest import tiny_spec
      saves = []
      original = Checkpointer.save
      def save(self, step, *args):
        saves.append(step)
        if len(saves) == 2:  # the save after RL iteration 1: die before it commits
          self.wait()  # (iteration 0's asynchronous save commits first)
          async def die(*a, **k):
            os._exit(17)
          for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
            cls.finalize = die
        return original(self, step, *args)
      Checkpointer.save = save
      Trainer(tiny_spec({tiny_model!r}, "grpo", iterations=2), {workdir!r}).run()
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=900, env=env, cwd=repo)
  assert result.returncode == 17, result.stdout[-2000:] + result.stderr[-2000:]
  trainer = Trainer(tiny_spec(tiny_model, "grpo", iterations=2), workdir)
  assert trainer.checkpointer.latest_step() == 0  # iteration 1's save never committed
  summary = trainer.run()
  assert summary["iterations"] == 2
  steps = [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
           if r["phase"] == "train"]
  assert steps == [1, 2]


def test_play_with_a_model_uses_the_training_acting_loop(tiny_model):
  from seed_jax import play
  summary = play.run("sokoban", "model", "valid_seen", episodes=2, seed=0, workers=0,
                     batch_size=2, overrides=["max_steps=3"], model=tiny_model,
                     max_new_tokens=8)
  assert summary["episodes"] == 2 and summary["failed"] == 0
  assert 0.0 <= summary["success"] <= 1.0
