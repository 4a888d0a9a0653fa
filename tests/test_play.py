"""`python -m seed_jax.play`: every policy plays through the one acting loop (Sokoban: fast)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from seed_jax import play
from seed_jax.models import ModelConfig
from seed_jax.sampling.sampler import SampleOutput

SOKOBAN = ["max_steps=15"]


def test_the_expert_wins_every_episode_in_process():
  summary = play.run("sokoban", "expert", "valid_seen", episodes=5, seed=0, workers=0,
                     batch_size=2, overrides=SOKOBAN)
  assert summary["episodes"] == 5 and summary["success"] == 1.0
  assert summary["failed"] == 0 and summary["invalid_action_rate"] == 0.0
  assert summary["ineffective_action_rate"] == 0.0  # a shortest plan never bumps a wall
  assert list(summary["success_per_type"]) == ["sokoban_6x6_1box"]


def test_random_play_bumps_into_walls():
  summary = play.run("sokoban", "random", "valid_seen", episodes=5, seed=0, workers=0,
                     batch_size=5, overrides=SOKOBAN)
  assert summary["invalid_action_rate"] == 0.0 and summary["ineffective_action_rate"] > 0.1


def test_the_expert_wins_through_a_pool_of_worker_processes():
  summary = play.run("sokoban", "expert", "valid_seen", episodes=3, seed=0, workers=2,
                     batch_size=3, overrides=SOKOBAN)
  assert summary["success"] == 1.0 and summary["failed"] == 0


@pytest.mark.parametrize("env_name", ["sokoban_visual", "ezpoints"])
def test_the_expert_wins_the_visual_envs(env_name):
  summary = play.run(env_name, "expert", "valid_unseen", episodes=20, seed=0, workers=0,
                     batch_size=10, overrides=[])
  assert summary["episodes"] == 20 and summary["success"] >= 0.95
  assert summary["failed"] == 0 and summary["invalid_action_rate"] == 0.0


def test_verbose_play_prints_an_image_as_its_shape(capsys):
  play.run("ezpoints", "expert", "valid_seen", episodes=1, seed=0, workers=0, batch_size=1,
           overrides=[], verbose=True)
  out = capsys.readouterr().out
  assert "[image 300x300x3]" in out and "array(" not in out and "[[" not in out


def test_the_random_policy_honours_the_turn_limit():
  summary = play.run("sokoban", "random", "valid_seen", episodes=4, seed=1, workers=0,
                     batch_size=4, overrides=["max_steps=3"])
  assert summary["episodes"] == 4 and summary["mean_turns"] <= 3


def test_a_human_plays_by_typing(monkeypatch):
  typed = iter(["up", "quit"])
  monkeypatch.setattr("builtins.input", lambda prompt: next(typed))
  summary = play.run("sokoban", "human", "valid_seen", episodes=1, seed=0, workers=0,
                     batch_size=8, overrides=SOKOBAN)
  assert summary["episodes"] == 1 and summary["mean_turns"] == 1


class _Tokenizer:
  def apply_chat_template(self, messages):
    return messages[0]["content"]

  def encode(self, text):
    return list(text.encode())[-200:]


class _AlwaysUp:
  """Stands in for a model: writes a well-formed "up" to every prompt."""

  tokenizer = _Tokenizer()
  cfg = ModelConfig.tiny()  # a text model

  def __init__(self):
    self.calls = 0

  def generate(self, prompt_ids, sampling, seed=0):
    self.calls += 1
    text = "<think>up we go</think><action>up</action>"
    tokens = [list(text.encode())] * len(prompt_ids)
    return SampleOutput(tokens, [np.zeros(len(text), np.float32)] * len(prompt_ids),
                        [len(text)] * len(prompt_ids), ["stop_string"] * len(prompt_ids),
                        [text] * len(prompt_ids))


def test_the_model_policy_acts_through_the_training_rollout_policy(monkeypatch):
  sampler = _AlwaysUp()
  monkeypatch.setattr("seed_jax.sampling.sampler.sampler_for", lambda name, **kw: sampler)
  summary = play.run("sokoban", "model", "valid_seen", episodes=2, seed=0, workers=0,
                     batch_size=2, overrides=["max_steps=3"], model="fake")
  assert summary["episodes"] == 2 and summary["invalid_action_rate"] == 0.0
  assert 1 <= sampler.calls <= 3  # one batched call per turn


def test_the_command_prints_a_table_then_the_json_summary(capsys):
  flags.FLAGS(["play", "--env=sokoban", "--policy=expert", "--split=valid_seen",
               "--episodes=2", "--set=max_steps=15"])
  try:
    play.main(["play"])
  finally:
    flags.FLAGS.unparse_flags()
  out = capsys.readouterr().out
  summary = json.loads(out.strip().splitlines()[-1])
  assert summary["success"] == 1.0 and "overall" in out and "100.0%" in out


def test_an_unknown_override_is_named():
  with pytest.raises(KeyError, match="max_stepz"):
    play.run("sokoban", "expert", "valid_seen", episodes=1, seed=0, workers=0, batch_size=1,
             overrides=["max_stepz=3"])
