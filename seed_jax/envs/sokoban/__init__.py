"""Sokoban: generated puzzles (gym-sokoban's reverse play), text and RGB observations.

The env-module contract of `seed_jax.envs.registry`. Tasks are seeds: generating a puzzle
takes milliseconds, so nothing is cached on disk. Splits use disjoint seed ranges.
"""

from __future__ import annotations

import ml_collections

from seed_jax.envs import base
from seed_jax.envs.sokoban.env import SokobanEnv, random_action  # noqa: F401  (play uses it)
from seed_jax.envs.sokoban.prompt import SokobanFormat

NAME = "sokoban"

# Seeds of split s are SPLIT_SEED_BASE[s] + i, so splits never share a puzzle.
_SPLIT_SEED_BASE = {"train": 0, "valid_seen": 1_000_000, "valid_unseen": 2_000_000}


def default_config() -> ml_collections.ConfigDict:
  """Room size, box count, turn limit and split sizes."""
  return ml_collections.ConfigDict({
      "height": 6,  # including the wall border, as gym-sokoban's dim_room
      "width": 6,
      "num_boxes": 1,
      "max_steps": 15,  # verl-agent's Sokoban turn limit
      # Puzzles whose optimal solution is longer are rejected, so the turn limit can be met.
      "max_solution_steps": 12,
      "num_tasks": {"train": 1000, "valid_seen": 100, "valid_unseen": 100},
      "history_length": 2,
      "include_image": False,  # put an RGB rendering in every info under "image"
  })


def load_tasks(config: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  """The split's puzzles, as seeds (the puzzle is generated at reset)."""
  if split not in _SPLIT_SEED_BASE:
    raise ValueError(f"sokoban: unknown split {split!r}; known: {tuple(_SPLIT_SEED_BASE)}")
  task_type = f"sokoban_{config.height}x{config.width}_{config.num_boxes}box"
  tasks = []
  for index in range(config.num_tasks[split]):
    seed = _SPLIT_SEED_BASE[split] + index
    tasks.append(base.Task(
        env=NAME, task_id=f"sokoban-{split}-{index}", split=split, task_type=task_type,
        payload={"seed": seed, "height": config.height, "width": config.width,
                 "num_boxes": config.num_boxes}))
  return tasks


def make_env(config: ml_collections.ConfigDict, with_expert: bool = False) -> SokobanEnv:
  """A Sokoban env; with the expert, info["expert_action"] is the next move of a shortest
  solution (BFS)."""
  return SokobanEnv(max_steps=config.max_steps, max_solution_steps=config.max_solution_steps,
                    with_expert=with_expert, include_image=config.include_image)


def make_agent_format(config: ml_collections.ConfigDict) -> SokobanFormat:
  """The Sokoban prompt and the `<think>/<action>` parser."""
  return SokobanFormat(history_length=config.history_length)
