"""ALFWorld: household tasks in text, on the real alfworld / TextWorld engine, offline.

Games come from the official ALFWorld data when present (`config.data_dir`, or the
`ALFWORLD_DATA` folder when it holds `json_2.1.1/`), else from the embedded generator, which
builds games of all six task types from the floor plans the alfworld package ships (train
and valid_seen from one set of floor plans, valid_unseen from held-out ones), checks each
with the expert and caches them on disk.

Module contract: see `seed_jax.envs.registry`.
"""

from __future__ import annotations

import os
from pathlib import Path

import ml_collections

from seed_jax.envs.alfworld import games, generator
from seed_jax.envs.alfworld.engine import AlfWorldEnv
from seed_jax.envs.alfworld.prompts import AlfWorldFormat
from seed_jax.envs.base import Task

NAME = "alfworld"
TASK_TYPES = tuple(games.TASK_TYPES.values())
# config.data_dir value that forces the embedded generator even when ALFWORLD_DATA is set.
EMBEDDED = "embedded"


def default_config() -> ml_collections.ConfigDict:
  """ALFWorld settings; every key can be overridden from the command line."""
  config = ml_collections.ConfigDict()
  # "": official data from $ALFWORLD_DATA if it holds json_2.1.1/, else the generator;
  # "embedded": always the generator; any other value: a folder of official data.
  config.data_dir = ""
  config.cache_dir = ""  # generated games; "": $SEED_JAX_CACHE/alfworld or ~/.cache/seed_jax/alfworld
  config.num_games = ml_collections.ConfigDict(
      {"train": 180, "valid_seen": 60, "valid_unseen": 60})  # generator only
  config.generate_workers = 0  # processes generating games on first use; 0: one per CPU
  config.seed = 0  # generator seed: the same seed gives the same games
  config.task_types = TASK_TYPES  # only tasks of these types (the generator makes only these)
  # generator: keep games the expert wins within this many steps (sets of short games for
  # small models); independent of max_steps, so a set never depends on the turn limit
  config.solvable_within = generator.SOLVABLE_WITHIN
  config.max_steps = 50
  config.history_length = 2
  config.success_reward = 10.0
  config.expert_type = "handcoded"  # or "planner" (fast-downward; slow to load big scenes)
  config.upgrade_grammar = True  # re-embed the installed grammar in games of old releases
  return config


def official_data_dir(config: ml_collections.ConfigDict) -> Path | None:
  """The official data folder to use, or None for the embedded generator."""
  if config.data_dir == EMBEDDED:
    return None
  if config.data_dir:
    return Path(config.data_dir).expanduser()
  env_dir = os.environ.get("ALFWORLD_DATA", "")
  if env_dir and (Path(env_dir).expanduser() / "json_2.1.1").is_dir():
    return Path(env_dir).expanduser()
  return None


def load_tasks(config: ml_collections.ConfigDict, split: str) -> list[Task]:
  """Tasks of a split, in a stable order (generated on first use when embedded)."""
  data_dir = official_data_dir(config)
  if data_dir is not None:
    tasks = games.scan_games(data_dir, split)
  else:
    game_set = generator.GameSet(config.seed, tuple(config.task_types),
                                 config.solvable_within)
    root = generator.games_root(config.cache_dir or None, game_set)
    tasks = generator.generated_tasks(root, game_set, split, config.num_games[split],
                                      config.generate_workers)
  return [t for t in tasks if t.task_type in tuple(config.task_types)]


def make_env(config: ml_collections.ConfigDict, with_expert: bool = False) -> AlfWorldEnv:
  """A fresh env (called inside pool workers)."""
  return AlfWorldEnv(max_steps=config.max_steps, success_reward=config.success_reward,
                     with_expert=with_expert, expert_type=config.expert_type,
                     upgrade_grammar=config.upgrade_grammar)


def make_agent_format(config: ml_collections.ConfigDict) -> AlfWorldFormat:
  """Prompts and parsing for ALFWorld."""
  return AlfWorldFormat(history_length=config.history_length)
