"""Sokoban: generated puzzles (gym-sokoban's reverse play), text and RGB observations.

The env-module contract of `seed_jax.envs.registry`. Tasks are seeds: generating a puzzle
takes milliseconds, so nothing is cached on disk. Splits use disjoint seed ranges.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from seed_jax.envs import base
from seed_jax.envs.sokoban.env import SokobanEnv, random_action  # noqa: F401  (play uses it)
from seed_jax.envs.sokoban.prompt import PROMPT_STYLES, SokobanFormat

NAME = "sokoban"


def puzzle_settings() -> dict[str, Any]:
  """The settings every Sokoban variant shares (this one and `sokoban_visual`): room size,
  box count, turn limit, split sizes, the size of the RGB rendering and which moves the
  admissible list names."""
  return {
      "height": 6,  # including the wall border, as gym-sokoban's dim_room
      "width": 6,
      "num_boxes": 1,
      "max_steps": 15,  # verl-agent's Sokoban turn limit
      # Puzzles whose optimal solution is longer are rejected, so the turn limit can be met;
      # shorter than the minimum, rejected too (a trivial puzzle, or a band of difficulty).
      "max_solution_steps": 12,
      "min_solution_steps": 2,
      "num_tasks": {"train": 1000, "valid_seen": 100, "valid_unseen": 100},
      "tile": 16,  # pixels per cell of the RGB rendering (gym-sokoban's sprites are 16 px)
      # List only the moves that change the board as admissible (a small-model aid; all
      # four in gym-sokoban and verl-agent).
      "effective_moves_only": False,
  }


def default_config() -> ml_collections.ConfigDict:
  """The puzzle settings, the prompt's history length and style, and whether infos carry
  images."""
  return ml_collections.ConfigDict({
      **puzzle_settings(),
      "history_length": 2,
      "prompt_style": "full",  # one of PROMPT_STYLES; "compact": about half the tokens
      # Say so in the prompt when the last move changed nothing (a small-model aid).
      "blocked_notice": False,
      # After the board, the (row, column) of the player, the boxes and the targets (a
      # small-model aid).
      "board_positions": False,
      "include_image": False,  # put an RGB rendering in every info under "image"
  })


def load_tasks(config: ml_collections.ConfigDict, split: str,
               env_name: str = NAME) -> list[base.Task]:
  """The split's puzzles, as seeds (the puzzle is generated at reset); `env_name` is the
  variant that plays them (`sokoban_visual` plays the same puzzles)."""
  return base.seeded_tasks(
      env_name, split, config.num_tasks,
      task_type=f"sokoban_{config.height}x{config.width}_{config.num_boxes}box",
      height=config.height, width=config.width, num_boxes=config.num_boxes)


def make_env(config: ml_collections.ConfigDict, with_expert: bool = False) -> SokobanEnv:
  """A Sokoban env; with the expert, info["expert_action"] is the next move of a shortest
  solution (BFS)."""
  return puzzle_env(config, with_expert, include_image=config.include_image)


def puzzle_env(config: ml_collections.ConfigDict, with_expert: bool,
               include_image: bool) -> SokobanEnv:
  """A SokobanEnv from the settings every variant shares (`puzzle_settings`)."""
  return SokobanEnv(max_steps=config.max_steps, max_solution_steps=config.max_solution_steps,
                    min_solution_steps=config.min_solution_steps, with_expert=with_expert,
                    include_image=include_image, tile=config.tile,
                    effective_moves_only=config.effective_moves_only)


def make_agent_format(config: ml_collections.ConfigDict) -> SokobanFormat:
  """The Sokoban prompt and the `<think>/<action>` parser."""
  return SokobanFormat(history_length=config.history_length, style=config.prompt_style,
                       blocked_notice=config.blocked_notice,
                       board_positions=config.board_positions)
