"""Sokoban: generation, rules, rendering, the expert, prompts and parsing."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from seed_jax.envs import base, registry
from seed_jax.envs.agent_format import ParsedAction, Turn
from seed_jax.envs.sokoban import env as sokoban_env
from seed_jax.envs.sokoban import generator, prompt
from seed_jax.envs.sokoban.generator import Board
from seed_jax.envs.sokoban.prompt import SokobanFormat

sokoban = registry.get_env_module("sokoban")


def _board(*rows: str) -> Board:
  """A board from reference symbols (P player, X box, O target, √ box on target...)."""
  return sokoban_env.parse_text("\n".join(rows))


def test_generation_is_deterministic_and_solvable_within_the_limit():
  for seed in range(30):
    board, solution = generator.generate(seed, num_boxes=1, max_solution_steps=12)
    again, _ = generator.generate(seed, num_boxes=1, max_solution_steps=12)
    assert board == again
    assert not board.solved
    assert 2 <= len(solution) <= 12
    for action in solution:
      board = board.push(action)
    assert board.solved


def test_generation_keeps_the_shortest_solution_within_the_band():
  """`min_solution_steps`..`max_solution_steps`: a seed's puzzle is the first whose BFS
  solution has a length in the band (checked here by solving it again)."""
  for seed in range(20):
    board, solution = generator.generate(seed, max_solution_steps=5, min_solution_steps=4)
    assert len(solution) in (4, 5) and len(generator.solve(board)) == len(solution)


def test_the_env_plays_the_puzzles_of_its_band():
  task = base.seeded_tasks("sokoban", "train", {"train": 1}, task_type="t", height=6,
                           width=6, num_boxes=1)[0]
  for band in ((2, 3), (4, 5)):
    env = sokoban_env.SokobanEnv(max_steps=8, max_solution_steps=band[1],
                                 min_solution_steps=band[0])
    env.reset(task, seed=0)
    assert band[0] <= len(generator.solve(env.board)) <= band[1]
  with pytest.raises(RuntimeError, match="4-3 steps"):
    generator.generate(0, max_solution_steps=3, min_solution_steps=4, max_tries=5)


def test_generation_honours_size_and_box_count():
  board, solution = generator.generate(7, height=8, width=7, num_boxes=2, max_solution_steps=40)
  assert board.shape == (8, 7)
  assert len(board.boxes) == len(board.targets) == 2
  assert all(board.is_wall((r, c)) for r in range(8) for c in (0, 6))
  assert solution == generator.solve(board)


def test_push_rules():
  board = _board("#####",
                 "#PXO#",
                 "#####")
  pushed = board.push("right")
  assert pushed.player == (1, 2) and pushed.boxes == {(1, 3)} and pushed.solved
  assert pushed.push("right") == pushed  # box against the wall: nothing moves
  assert board.push("up") == board  # into a wall
  two_boxes = _board("######",
                     "#PXXO#",
                     "######")
  assert two_boxes.push("right") == two_boxes  # two boxes cannot be pushed at once


def test_solver_reports_dead_locks():
  cornered = _board("#####",
                    "#X_O#",
                    "#_P_#",
                    "#####")
  assert generator.solve(cornered) is None


def test_text_observation_uses_reference_symbols():
  board = _board("######",
                 "#S_X_#",
                 "#√_O_#",
                 "######")
  assert sokoban_env.render_text(board) == "######\n#S_X_#\n#√_O_#\n######"


def test_parsing_a_text_observation_gives_back_its_board():
  for seed in range(10):
    board, _ = generator.generate(seed)
    assert sokoban_env.parse_text(sokoban_env.render_text(board)) == board
  with pytest.raises(ValueError, match="not a Sokoban symbol"):
    sokoban_env.parse_text("#P?#")


def test_rgb_rendering_shape_and_distinct_cells():
  board, _ = generator.generate(0)
  image = sokoban_env.render_rgb(board, tile=8)
  assert image.shape == (6 * 8, 6 * 8, 3) and image.dtype == np.uint8
  row, col = board.player
  box_row, box_col = next(iter(board.boxes))
  player_pixel = image[row * 8 + 4, col * 8 + 4]
  assert not np.array_equal(player_pixel, image[box_row * 8 + 4, box_col * 8 + 4])


def test_tasks_are_stable_and_splits_disjoint():
  config = sokoban.default_config()
  config.num_tasks = {"train": 5, "valid_seen": 5, "valid_unseen": 5}
  seeds = {split: [t.payload["seed"] for t in sokoban.load_tasks(config, split)]
           for split in base.SPLITS}
  assert seeds["train"] == [t.payload["seed"] for t in sokoban.load_tasks(config, "train")]
  assert not set(seeds["train"]) & set(seeds["valid_seen"])
  assert not set(seeds["valid_seen"]) & set(seeds["valid_unseen"])


def test_episode_infos_and_rewards():
  config = sokoban.default_config()
  env = sokoban.make_env(config, with_expert=True)
  pickle.dumps(env)  # pool workers may receive envs by pickling
  task = sokoban.load_tasks(config, "train")[0]
  _, info = env.reset(task, seed=0)
  base.check_info(info, "reset")
  assert info["instruction"] and info["admissible_actions"] == ["up", "down", "left", "right"]
  result = env.step("jump")
  assert not result.info["action_valid"] and result.reward == pytest.approx(-0.1)
  total, steps = 0.0, 0
  while not result.done:
    result = env.step(result.info["expert_action"])
    base.check_info(result.info, "step")
    total += result.reward
    steps += 1
  assert result.info["won"]
  # -0.1 a step, +1 for the box landing on its target, +10 for finishing.
  assert total == pytest.approx(-0.1 * steps + 1.0 + 10.0)


def test_a_move_is_effective_exactly_when_the_board_changes():
  config = sokoban.default_config()
  env = sokoban.make_env(config)
  for task in sokoban.load_tasks(config, "train")[:5]:
    observation, _ = env.reset(task, seed=0)
    blocked = 0
    for move in ["jump"] + ["up"] * 8 + ["left"] * 8:  # on into the walls
      result = env.step(move)
      assert result.info["action_effective"] == (result.observation != observation)
      blocked += not result.info["action_effective"]
      observation = result.observation
      if result.done:
        break
    assert blocked >= 2  # "jump", and at least one move into a wall


def test_the_admissible_list_can_name_only_the_moves_that_change_the_board():
  config = sokoban.default_config()
  listing_all = sokoban.make_env(config)
  config.effective_moves_only = True
  listing_effective = sokoban.make_env(config)
  for task in sokoban.load_tasks(config, "train")[:10]:
    observation, info = listing_effective.reset(task, seed=0)
    assert listing_all.reset(task, seed=0)[1]["admissible_actions"] == [
        "up", "down", "left", "right"]
    for move in ["up", "down", "left", "right"]:  # each from the same board
      listing_effective.reset(task, seed=0)
      changed = listing_effective.step(move).observation != observation
      assert (move in info["admissible_actions"]) == changed
  corridor = _board("#####",
                    "#PXO#",
                    "#####")
  assert sokoban_env.effective_moves(corridor) == ["right"]
  assert corridor.blocked("left") and not corridor.blocked("right")
  assert sokoban_env.effective_moves(corridor.push("right")) == ["left"]  # box against wall


def test_expert_solves_every_sampled_task():
  config = sokoban.default_config()
  env = sokoban.make_env(config, with_expert=True)
  tasks = sokoban.load_tasks(config, "valid_unseen")[:50]
  won = 0
  for task in tasks:
    _, info = env.reset(task, seed=0)
    done = False
    while not done:
      result = env.step(info["expert_action"])
      info, done = result.info, result.done
    won += info["won"]
  assert won == len(tasks)


def test_prompt_shows_rules_history_and_actions():
  agent_format = sokoban.make_agent_format(sokoban.default_config())
  history = [Turn("#P#", "up"), Turn("#_P#", "left"), Turn("#S#", "down")]
  prompt = agent_format.render("push boxes", history, "######", ["up", "down", "left", "right"], 4)
  assert "√: box on a target" in prompt and "S: you, standing on a target" in prompt
  assert "Observation 2" in prompt and "Observation 3" in prompt and "Observation 1" not in prompt
  assert "step 4" in prompt and '"left"' in prompt and "<action>" in prompt
  assert agent_format.stop_strings == ("</action>",)


def test_the_compact_prompt_says_the_same_in_under_half_the_text():
  """The compact style keeps the board, the legend of every symbol, the rule that boxes
  are never pulled, the goal sentence H puts a skill after, the step and the actions."""
  settings = sokoban.default_config()
  full = sokoban.make_agent_format(settings)
  settings.prompt_style = "compact"
  compact = sokoban.make_agent_format(settings)
  board = "######\n#_P###\n#_X###\n#____#\n#_O#_#\n######"
  args = ("", [], board, ["up", "down", "left", "right"], 3)
  short, long = compact.render(*args), full.render(*args)
  for symbol in ("#: wall", "_: floor", "O: target", "X: box", "√: box on a target", "P: you",
                 "S: you on a target"):
    assert symbol in short
  assert board in short and "Step 3" in short and '"left"' in short and "<action>" in short
  assert "never pulled" in short
  assert re.search(compact.task_line_pattern, short)
  assert len(short) < len(long) / 2


def _compact_formats(aid: str):
  """The compact board-only settings, and their prompt format without and with `aid` on."""
  settings = sokoban.default_config()
  settings.update(history_length=0, prompt_style="compact")
  plain = sokoban.make_agent_format(settings)
  settings[aid] = True
  return settings, plain, sokoban.make_agent_format(settings)


def test_the_blocked_notice_appears_only_after_a_move_that_changed_nothing():
  settings, plain, noticing = _compact_formats("blocked_notice")
  env = sokoban.make_env(settings)
  task = sokoban.load_tasks(settings, "train")[0]
  observation, _ = env.reset(task, seed=0)
  history, blocked = [], 0
  for move in ["up"] * 6:  # on into the wall above
    result = env.step(move)
    history.append(Turn(observation, move))
    observation = result.observation
    args = ("", history, observation, ["up", "down", "left", "right"], len(history) + 1)
    said = "Your last move, up, changed nothing" in noticing.render(*args)
    assert said == (not result.info["action_effective"])
    blocked += said
    # the rest of the prompt is the plain one
    assert noticing.render(*args).replace(
        "Your last move, up, changed nothing: try another.\n\n", "") == plain.render(*args)
    if result.done:
      break
  assert blocked


def test_an_unknown_prompt_style_is_refused():
  with pytest.raises(ValueError, match="prompt style: one of"):
    SokobanFormat(style="terse")


def test_parse_takes_the_action_and_requires_think():
  agent_format = sokoban.make_agent_format(sokoban.default_config())
  assert agent_format.parse("<think>box right</think><action> Right </action>") == (
      ParsedAction("right", True))
  assert not agent_format.parse("<action>right</action>").valid


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_never_raises_and_invalid_moves_are_noops(response):
  agent_format = sokoban.make_agent_format(sokoban.default_config())
  parsed = agent_format.parse(response)
  env = sokoban.make_env(sokoban.default_config())
  _, info = env.reset(sokoban.load_tasks(sokoban.default_config(), "train")[0], seed=0)
  before = env.board
  result = env.step(parsed.action)
  assert result.info["action_valid"] == (parsed.action in generator.MOVES)
  if not result.info["action_valid"]:
    assert env.board == before


def test_the_positions_line_gives_every_piece_as_row_and_column():
  board = _board("######",
                 "#_P__#",
                 "#_X__#",
                 "#_O_√#",
                 "######")
  assert prompt.positions_line(board) == (
      "Positions as (row, column); down adds 1 to the row, right adds 1 to the column: "
      "you (1, 2); box (2, 2); target (3, 2); box on a target (3, 4).")
  on_target = _board("####",
                     "#S_#",
                     "#X_#",
                     "####")
  # the player standing on the target: that target is named as "you on a target", not
  # listed among the free ones
  assert prompt.positions_line(on_target).endswith(": you (1, 1); box (2, 1); "
                                                   "you on a target (1, 1).")


def test_board_positions_adds_the_line_after_the_board_and_nothing_else():
  settings, plain, with_positions = _compact_formats("board_positions")
  observation, _ = sokoban.make_env(settings).reset(sokoban.load_tasks(settings, "train")[0],
                                                    seed=0)
  args = ("", [], observation, ["up", "left"], 1)
  line = prompt.positions_line(sokoban_env.parse_text(observation))
  assert with_positions.render(*args) == plain.render(*args).replace(
      observation, f"{observation}\n\n{line}")
