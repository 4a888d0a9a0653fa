"""Configs load for every env and preset; bad keys and values fail early, naming the key."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from seed_jax.train.config import ConfigError, validate_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENVS = ("alfworld", "webshop", "search", "sokoban")


def load(env: str, preset: str = ""):
  module = importlib.import_module(f"configs.{env}")
  return module.get_config(preset)


@pytest.mark.parametrize("preset", ["", "cpu"])
@pytest.mark.parametrize("env", ENVS)
def test_every_config_and_preset_validates(env, preset):
  config = load(env, preset)
  validate_config(config)
  assert config.env.name == env and config.algorithm == "seed"


def test_paper_defaults():
  c = load("alfworld")
  assert (c.rl.beta_opd, c.rl.lambda_opd, c.rollout.group_size, c.rollout.tasks_per_batch,
          c.rl.learning_rate, c.rl.clip_ratio_low, c.rl.kl_coef, c.rl.invalid_penalty,
          c.env.history_length, c.rollout.max_new_tokens, c.rl.iterations,
          c.eval.temperature) == (5.0, 0.01, 8, 16, 1e-6, 0.2, 0.01, 0.1, 2, 512, 150, 0.4)
  assert c.env.max_steps == 50 and load("search").rl.kl_coef == 0.001


def test_unknown_preset_lists_the_known_ones():
  with pytest.raises(ValueError, match="unknown config preset 'tpu'; known: cpu"):
    load("alfworld", "tpu")


@pytest.mark.parametrize("key,value,match", [
    ("algorithm", "ppo", "config.algorithm: one of"),
    ("rl.teacher_mode", "both", "config.rl.teacher_mode"),
    ("rl.lambda_opd", -1.0, "config.rl.lambda_opd"),
    ("rollout.group_size", 0, "config.rollout.group_size"),
    ("rollout.top_p", 1.5, "config.rollout.top_p"),
    ("model.dtype", "float16", "config.model.dtype"),
    ("mesh.fsdp", 0, "config.mesh.fsdp"),
    ("analyzer.backend", "gpt", "config.analyzer.backend"),
    ("sft.holdout_fraction", 1.0, "config.sft.holdout_fraction"),
    ("rl.dual_clip", 0.5, "config.rl.dual_clip"),
    ("env.max_steps", 0, "config.env.max_steps"),
    ("env.task_types", ("pick_and_place", "make_coffee"), "config.env.task_types"),
    ("env.solvable_within", 0, "config.env.solvable_within"),
])
def test_bad_values_name_the_key(key, value, match):
  config = load("alfworld" if key.startswith("env.") else "sokoban", "cpu")
  with config.unlocked():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  with pytest.raises(ConfigError, match=match):
    validate_config(config)


def test_openai_backend_needs_an_endpoint():
  config = load("alfworld", "cpu")
  config.sft.analyzer_backend = "openai"
  with pytest.raises(ConfigError, match="config.analyzer.openai.base_url"):
    validate_config(config)


@pytest.mark.parametrize("override,match", [
    ("--config.rl.lambda_opdd=0.1", "lambda_opdd"),
    ("--config.rl.lambda_opd=abc", "lambda_opd"),
    ("--config.algorithm=ppo", "config.algorithm"),
])
def test_command_line_overrides_fail_before_anything_runs(override, match, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.main", "--config=configs/sokoban.py:cpu", override,
       f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode != 0
  assert match in result.stderr + result.stdout
  assert not os.path.exists(tmp_path / "checkpoints")
