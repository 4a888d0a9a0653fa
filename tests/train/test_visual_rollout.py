"""An agent that sees images: rollouts show each turn's image in the prompt, H puts the skill
in the text around it, and the rows the train step re-scores are what the policy sampled.

The tiny random Qwen2.5-VL (`tiny-random-qwen2.5-vl`) acts in visual Sokoban: it learns
nothing, and plays as well as any random policy; the path is what is tested.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from configs import sokoban_visual as sokoban_visual_config
from seed_jax.agent.prompts import PromptEncoder
from seed_jax.envs import ezpoints, sokoban_visual
from seed_jax.envs.agent_format import IMAGE_PLACEHOLDER
from seed_jax.envs.pool import InProcessPool
from seed_jax.models import load_model
from seed_jax.models.embedded import TINY_VLM
from seed_jax.sampling import Sampler
from seed_jax.seed import batch as batch_lib
from seed_jax.seed import train_step as ts
from seed_jax.seed.skills import SKILL_HEADER, skill_prompt_ids
from seed_jax.train.rollout import RolloutSpec, play_episodes
from seed_jax.train.spec import ConfigError, build_run_spec

SKILL = "Push the box toward the target only when you stand behind it."
BOARD_TOKENS = 9  # a 96 x 96 board (16 px cells): 3 x 3 merged tokens for the tiny model


@pytest.fixture(scope="module")
def policy():
  model, tokenizer = load_model(TINY_VLM)
  encoder = PromptEncoder.for_model(tokenizer, model.cfg, TINY_VLM)
  return model, encoder


def _play(policy, env_module):
  """Two episodes of two turns of `env_module`, sampled by the tiny VLM."""
  model, encoder = policy
  config = env_module.default_config()
  config.max_steps = 2
  tasks = env_module.load_tasks(config, "valid_seen")[:2]
  sampler = Sampler.from_model(model, tokenizer=encoder.tokenizer, max_cache_len=768)
  pool = InProcessPool(lambda: env_module.make_env(config))
  return play_episodes(
      sampler, encoder, pool, env_module.make_agent_format(config), tasks, 1,
      RolloutSpec(max_turns=2, max_new_tokens=12, max_prompt_tokens=720), seed=0, desc=None)


@pytest.fixture(scope="module")
def played(policy):
  return _play(policy, sokoban_visual)


def test_each_turn_shows_its_board_as_image_tokens(policy, played):
  model, _ = policy
  trajs, stats = played
  assert stats["steps"] == 4
  for step in (s for t in trajs for s in t.steps):
    assert step.image.grids == ((1, 6, 6),)
    assert step.prompt_ids.count(model.cfg.image_token_id) == BOARD_TOKENS
    assert IMAGE_PLACEHOLDER in step.prompt_text  # the message, before the image goes in
    assert step.observation.count("\n") >= 5  # the text board, for the analyzer


def test_h_puts_the_skill_in_the_text_and_keeps_the_same_image_tokens(policy, played):
  model, encoder = policy
  step = played[0][0].steps[0]
  text, teacher = skill_prompt_ids(encoder, step.prompt_text, SKILL, sokoban_visual
                                   .make_agent_format(None).task_line_pattern, "task_line",
                                   step.image)
  assert SKILL_HEADER in text and SKILL in encoder.tokenizer.decode(teacher)
  image_id = model.cfg.image_token_id
  image_span = lambda ids: ids[ids.index(image_id) - 1:ids.index(image_id) + BOARD_TOKENS + 1]
  assert image_span(teacher) == image_span(step.prompt_ids)  # start, 9 pads, end
  without_skill = skill_prompt_ids(encoder, step.prompt_text, None, "", "task_line",
                                   step.image)[1]
  assert without_skill == step.prompt_ids


@pytest.mark.parametrize("env", ["sokoban_visual", "ezpoints"])
def test_the_train_step_rescores_what_the_policy_sampled(policy, played, env):
  """The student rows, their images and multimodal positions give the sampler's log-probs
  back at the parameters that acted (float32): Sokoban's 96 px boards, EZPoints' 300 px
  tables."""
  model, _ = policy
  trajs = played[0] if env == "sokoban_visual" else _play(policy, ezpoints)[0]
  config = batch_lib.BatchConfig(response_len=12, prompt_bucket=32,
                                 image_token_id=model.cfg.image_token_id)
  batch, _ = batch_lib.build_batch(trajs, config, with_teacher=False)
  graphdef, params = nnx.split(model, nnx.Param)
  inputs = {**ts.side_inputs(batch, "student"), "image_patches": batch["image_patches"]}
  scored = np.asarray(ts.make_score_fn(graphdef, chunk=4)(params, inputs, 12))
  active = batch["response_mask"] > 0
  assert active.sum() > 0
  np.testing.assert_allclose(scored[active], batch["old_logprobs"][active], atol=2e-4)


def test_a_text_model_in_a_visual_env_fails_naming_the_model_key():
  config = sokoban_visual_config.get_config("cpu")
  with config.unlocked():
    config.model.name = "smollm2-135m-instruct"
  with pytest.raises(ConfigError, match=r"^config\.model\.name: .*no vision tower"):
    build_run_spec(config)


@pytest.mark.parametrize("key,value", [("rl.pack_rows", 4), ("rollout.continuous", True),
                                       ("bc.enabled", True)])
def test_paths_that_do_not_carry_images_yet_are_refused_by_key(key, value):
  config = sokoban_visual_config.get_config("cpu")
  with config.unlocked():
    section, leaf = key.split(".")
    config[section][leaf] = value
  with pytest.raises(ConfigError, match=rf"^config\.{key}: "):
    build_run_spec(config)
