"""Visual Sokoban: Sokoban's puzzles and rules, the board as an image every turn, and
verl-agent's visual prompt with a legend of the rendered colours."""

from __future__ import annotations

import numpy as np
import pytest

from seed_jax.envs import base, registry
from seed_jax.envs.agent_format import IMAGE_PLACEHOLDER, ParsedAction, Turn
from seed_jax.envs.sokoban import env as sokoban_env
from seed_jax.envs.sokoban import generator
from seed_jax.envs.sokoban_visual import prompt as visual_prompt

visual = registry.get_env_module("sokoban_visual")
sokoban = registry.get_env_module("sokoban")
MOVES = ["up", "down", "left", "right"]


def _env_on(monkeypatch, *rows: str, with_expert: bool = False):
  """A visual env reset to the hand-made board `rows` (reference symbols) instead of the
  task's generated puzzle."""
  board = sokoban_env.parse_text("\n".join(rows))
  monkeypatch.setattr(generator, "generate", lambda seed, **kwargs: (board, []))
  env = visual.make_env(visual.default_config(), with_expert=with_expert)
  _, info = env.reset(visual.load_tasks(visual.default_config(), "train")[0], seed=0)
  return env, info


# ----- tasks -----

def test_the_tasks_are_sokobans_puzzles_under_this_envs_name():
  config = visual.default_config()
  config.num_tasks = {"train": 4, "valid_seen": 4, "valid_unseen": 4}
  for split in base.SPLITS:
    tasks, text_tasks = visual.load_tasks(config, split), sokoban.load_tasks(config, split)
    assert [t.payload for t in tasks] == [t.payload for t in text_tasks]
    assert {t.env for t in tasks} == {"sokoban_visual"}
    assert {t.task_type for t in tasks} == {"sokoban_6x6_1box"}
    assert [t.task_id for t in tasks] == [f"sokoban_visual-{split}-{i}" for i in range(4)]


def test_tasks_are_deterministic_and_splits_disjoint():
  config = visual.default_config()
  seeds = {split: [t.payload["seed"] for t in visual.load_tasks(config, split)]
           for split in base.SPLITS}
  assert seeds["train"] == [t.payload["seed"] for t in visual.load_tasks(config, "train")]
  for a, b in [("train", "valid_seen"), ("train", "valid_unseen"),
               ("valid_seen", "valid_unseen")]:
    assert not set(seeds[a]) & set(seeds[b])


def test_the_settings_are_sokobans_less_the_text_prompt_ones():
  settings = set(visual.default_config().keys())
  assert settings == set(sokoban.default_config().keys()) - {
      "history_length", "prompt_style", "blocked_notice", "board_positions",
      "include_image"}
  assert visual.default_config().max_steps == 15


# ----- images -----

def test_every_info_holds_the_board_as_an_rgb_image(monkeypatch):
  env, info = _env_on(monkeypatch,
                      "######",
                      "#P_XO#",
                      "#____#",
                      "######")
  base.check_info(info, "reset")
  assert info["image"].shape == (4 * 16, 6 * 16, 3) and info["image"].dtype == np.uint8
  np.testing.assert_array_equal(info["image"], sokoban_env.render_rgb(env.board, tile=16))
  moved = env.step("right").info
  base.check_info(moved, "step")
  assert not np.array_equal(moved["image"], info["image"])  # the player moved
  np.testing.assert_array_equal(moved["image"], sokoban_env.render_rgb(env.board, tile=16))
  refused = env.step("jump").info
  np.testing.assert_array_equal(refused["image"], moved["image"])  # a no-op changes nothing


def test_the_tile_setting_scales_the_image():
  config = visual.default_config()
  config.tile = 28
  env = visual.make_env(config)
  _, info = env.reset(visual.load_tasks(config, "train")[0], seed=0)
  assert info["image"].shape == (6 * 28, 6 * 28, 3)


# ----- rules and rewards (Sokoban's, golden) -----

def test_pushing_the_last_box_home_wins_with_the_step_box_and_finish_rewards(monkeypatch):
  env, _ = _env_on(monkeypatch,
                   "######",
                   "#PXO_#",
                   "######")
  result = env.step("right")
  assert result.reward == pytest.approx(-0.1 + 1.0 + 10.0)
  assert result.done and result.info["won"]


def test_a_box_pushed_off_a_target_costs_what_one_pushed_on_earns(monkeypatch):
  env, _ = _env_on(monkeypatch,
                   "######",
                   "#P√_O#",
                   "#__X_#",
                   "######")
  rewards, valid = [], []
  for move in ["right", "right", "up", "jump"]:
    result = env.step(move)
    rewards.append(result.reward)
    valid.append(result.info["action_valid"])
    assert not result.done
  # Off its target, onto the other one, into a wall (a valid move that does nothing), an
  # unknown move (an invalid no-op): every step costs 0.1.
  assert rewards == pytest.approx([-0.1 - 1.0, -0.1 + 1.0, -0.1, -0.1])
  assert valid == [True, True, True, False]


def test_the_turn_limit_ends_the_episode_unsolved():
  config = visual.default_config()
  config.max_steps = 3
  env = visual.make_env(config)
  env.reset(visual.load_tasks(config, "train")[0], seed=0)
  dones = [env.step("jump").done for _ in range(3)]
  assert dones == [False, False, True]


# ----- the expert -----

def test_the_expert_solves_every_sampled_puzzle():
  config = visual.default_config()
  env = visual.make_env(config, with_expert=True)
  tasks = visual.load_tasks(config, "valid_unseen")[:50]
  won = 0
  for task in tasks:
    _, info = env.reset(task, seed=0)
    done = False
    while not done:
      result = env.step(info["expert_action"])
      info, done = result.info, result.done
      base.check_info(info, "step")
    won += info["won"]
  assert won / len(tasks) >= 0.95


# ----- the prompt and parsing -----

def _prompt(observation: str = "######\n#P_XO#\n######", history=()) -> str:
  fmt = visual.make_agent_format(visual.default_config())
  return fmt.render("push boxes", list(history), observation, MOVES, step=len(history) + 1)


def test_the_prompt_shows_the_image_once_and_neither_the_text_board_nor_the_history():
  fmt = visual.make_agent_format(visual.default_config())
  assert fmt.uses_images and fmt.stop_strings == ("</action>",)
  prompt = _prompt(history=[Turn("#S_X_#", "left"), Turn("#_SX_#", "right")])
  assert prompt.count(IMAGE_PLACEHOLDER) == 1
  assert "Your current observation is shown in the image: <image>" in prompt
  assert "#P_XO#" not in prompt and "#S_X_#" not in prompt and "'left'" not in prompt
  assert prompt == _prompt()  # the same message every turn: the image carries the state
  assert '["up", "down", "left", "right"]' in prompt
  assert "<think> </think>" in prompt and "<action> </action>" in prompt


def test_the_legend_names_the_colour_each_element_is_drawn_in():
  tile = 16
  legend = {line.split(":")[0]: line for line in visual_prompt.legend().splitlines()}
  player_off, player_on = "#####\n#PX√#\n#O__#\n#####", "####\n#S_#\n####"
  # (element in the legend, a board showing it, its cell, the symbol drawn at the centre)
  elements = [("Wall", player_off, (0, 0), sokoban_env.WALL),
              ("Floor", player_off, (2, 2), sokoban_env.FLOOR),
              ("Target", player_off, (2, 1), sokoban_env.TARGET),
              ("Box", player_off, (1, 2), sokoban_env.BOX),
              ("Box on target", player_off, (1, 3), sokoban_env.BOX_ON_TARGET),
              ("Player", player_off, (1, 1), sokoban_env.PLAYER),
              ("Player on target", player_on, (1, 1), sokoban_env.PLAYER_ON_TARGET)]
  for element, text, (row, col), symbol in elements:
    image = sokoban_env.render_rgb(sokoban_env.parse_text(text), tile=tile)
    colour = sokoban_env.COLOURS[symbol]
    assert tuple(image[row * tile + tile // 2, col * tile + tile // 2]) == colour.rgb, element
    assert f": a {colour.name} " in legend[element] or f": an {colour.name} " in legend[element]
  assert visual_prompt.legend() in _prompt()


def test_responses_parse_as_sokobans_and_malformed_ones_are_invalid_no_ops(monkeypatch):
  fmt = visual.make_agent_format(visual.default_config())
  assert fmt.parse("<think>the box is right</think><action> Right </action>") == (
      ParsedAction("right", True))
  assert fmt.parse(fmt.render_response("up")) == ParsedAction("up", True)
  env, _ = _env_on(monkeypatch,
                   "######",
                   "#P_XO#",
                   "######")
  before = env.board
  for response in ["<action>right</action>", "right", "<think>hm</think><action>jump</action>",
                   "", "<think></think><action></action>"]:
    result = env.step(fmt.parse(response).action)
    assert not result.info["action_valid"] and result.reward == pytest.approx(-0.1)
    assert env.board == before
