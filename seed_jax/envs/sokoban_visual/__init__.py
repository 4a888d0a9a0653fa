"""Visual Sokoban: the Sokoban puzzles, seen as an image each turn (verl-agent's visual
Sokoban).

The env-module contract of `seed_jax.envs.registry`. Everything but the observation is
`seed_jax.envs.sokoban`'s: the same puzzles per seed (tasks carry env "sokoban_visual"),
rules, rewards (-0.1 a step, +1 for a box pushed onto a target and -1 off it, +10 when
solved), turn limit and BFS expert. Every info holds the board as an RGB image
(`sokoban.env.render_rgb`, under "image"); the prompt shows that image only: no text board,
no history.
"""

from __future__ import annotations

import ml_collections

from seed_jax.envs import base, sokoban
from seed_jax.envs.sokoban.env import SokobanEnv
from seed_jax.envs.sokoban_visual.prompt import SokobanVisualFormat

NAME = "sokoban_visual"


def default_config() -> ml_collections.ConfigDict:
  """Sokoban's puzzle settings (room size, boxes, turn limit, split sizes, pixels per cell)."""
  return ml_collections.ConfigDict(sokoban.puzzle_settings())


def load_tasks(config: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  """Sokoban's puzzles of the split (the same seeds), as tasks of this env."""
  return sokoban.load_tasks(config, split, env_name=NAME)


def make_env(config: ml_collections.ConfigDict, with_expert: bool = False) -> SokobanEnv:
  """A Sokoban env whose every info holds "image": the board, `[H * tile, W * tile, 3]`
  uint8; with the expert, info["expert_action"] is the next move of a shortest solution."""
  return sokoban.puzzle_env(config, with_expert, include_image=True)


def make_agent_format(config: ml_collections.ConfigDict) -> SokobanVisualFormat:
  """verl-agent's visual Sokoban prompt, with a legend of this rendering's colours."""
  del config  # the prompt has no settings: no history, one image
  return SokobanVisualFormat()
