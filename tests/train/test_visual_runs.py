"""The visual presets run SEED end to end with the tiny random VLM (`configs/*.py:cpu`, cut
to one or two iterations): stage 1, rollouts with images, oracle skills, teacher rows with
the same images, the update, checkpoints, evaluation, an export that loads with its image
processor, and a resume from the last checkpoint."""

from __future__ import annotations

import importlib
import os

import pytest

from seed_jax.metrics import read_metrics
from seed_jax.models import resolve_model_path
from seed_jax.models.embedded import TINY_VLM
from seed_jax.models.vision import ImageProcessorConfig
from seed_jax.train.spec import build_run_spec
from seed_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow


def _spec(env: str, iterations: int):
  config = importlib.import_module(f"configs.{env}").get_config("cpu")
  with config.unlocked():
    config.rl.iterations = iterations
    config.env.max_steps = 2
    config.sft.tasks_per_type = 1
    config.eval.splits = ("valid_seen",)
    config.eval.max_episodes = 2
    config.log.plots = False
  return build_run_spec(config)


def _train_records(workdir):
  return [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
          if r["phase"] == "train"]


# One preset end to end (about 3 minutes in CI); configs/ezpoints.py:cpu shares its
# preset (base.visual_cpu_preset) and every code path but the env, whose rollouts, rows and
# re-scoring tests/train/test_visual_rollout.py runs.
@pytest.mark.parametrize("env", ["sokoban_visual"])
def test_a_visual_preset_runs_with_images_in_every_row(env, tmp_path):
  workdir = str(tmp_path / env)
  summary = Trainer(_spec(env, iterations=1), workdir).run()
  (record,) = _train_records(workdir)
  assert record["skill_parse_rate"] == 1.0  # the oracle: every trajectory has a skill
  assert record["batch_opd_rows"] == record["batch_rows"] > 0
  assert record["opd_tokens"] > 0 and record["update_skipped"] == 0
  assert "valid_seen/success" in summary
  # The export carries the image sizes the policy was trained with.
  assert ImageProcessorConfig.from_file(os.path.join(workdir, "export")) == (
      ImageProcessorConfig.from_file(resolve_model_path(TINY_VLM)))
  # Resumes from its checkpoint for a second iteration.
  Trainer(_spec(env, iterations=2), workdir).run()
  assert [r["step"] for r in _train_records(workdir)] == [1, 2]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[-1] == "2"
