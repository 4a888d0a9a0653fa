"""The embedded ALFWorld game set: generated on first use, checked by the expert, cached.

A game set is named by a `GameSet` (seed, task types, expert bound). Game `index` of a
split is a pure function of the set and (split, index): its task type cycles through the
set's types, its floor plan and layout come from a generator seeded with (seed, split,
index). Each candidate game is played by the handcoded expert in the real engine and kept
only when the expert wins within `solvable_within` steps (50, the paper's turn limit, for
the default set; smaller for sets of short games); otherwise the next attempt is drawn.
Games are written atomically to
`<cache_dir>/<GENERATOR_VERSION>/<GameSet.folder>/json_2.1.1/<split>/<task folder>/trial_<split>_<index>/`
in ALFWorld's own layout, so `games.scan_games` and the official loader rules apply to them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import tempfile
from pathlib import Path

from seed_jax import paths
from seed_jax.envs.alfworld import games, scenes
from seed_jax.envs.base import SPLITS, Task

# Bump when generated games change, so stale caches are not reused.
GENERATOR_VERSION = "v2"  # v2: games checked within SOLVABLE_WITHIN steps, not the run's limit
_MAX_ATTEMPTS = 40
ALL_TYPES = tuple(games.TASK_TYPES.values())  # short names, in ALFWorld's order
# The paper's ALFWorld turn limit: the default set's games are solvable within it.
SOLVABLE_WITHIN = 50


@dataclasses.dataclass(frozen=True)
class GameSet:
  """Which games are generated.

  Attributes:
    seed: the same seed gives the same games.
    task_types: short type names (games.TASK_TYPES values); game i has type i mod len.
    solvable_within: a game is kept when the expert wins it within this many steps, a
      bound independent of any run's turn limit so a set never depends on run settings.
  """
  seed: int = 0
  task_types: tuple[str, ...] = ALL_TYPES
  solvable_within: int = SOLVABLE_WITHIN

  def __post_init__(self):
    unknown = [t for t in self.task_types if t not in ALL_TYPES]
    if unknown or not self.task_types:
      raise ValueError(f"task_types {list(self.task_types)}: unknown {unknown}; known: "
                       f"{', '.join(ALL_TYPES)}")
    if self.solvable_within < 1:
      raise ValueError(f"solvable_within must be >= 1, got {self.solvable_within}")

  @property
  def folder(self) -> str:
    """`seed0` for the default set; other sets add their bound and types."""
    name = f"seed{self.seed}"
    if self.solvable_within != SOLVABLE_WITHIN:
      name += f"-within{self.solvable_within}"
    if tuple(self.task_types) != ALL_TYPES:
      name += "-" + "+".join(self.task_types)
    return name


def default_cache_dir() -> Path:
  """`$SEED_JAX_CACHE/alfworld`, else `~/.cache/seed_jax/alfworld`."""
  return paths.cache_root() / "alfworld"


def games_root(cache_dir: str | os.PathLike[str] | None, game_set: GameSet) -> Path:
  """The folder holding `json_2.1.1/` for the generated games of `game_set`."""
  base = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
  return base / GENERATOR_VERSION / game_set.folder


def _split_dir(root: Path, split: str) -> Path:
  if split not in SPLITS:
    raise ValueError(f"split {split!r} is not one of {SPLITS}")
  return root / "json_2.1.1" / split


def _trial_name(split: str, index: int) -> str:
  return f"trial_{split}_{index:05d}"


def _game_rng(seed: int, split: str, index: int, attempt: int) -> random.Random:
  digest = hashlib.sha256(f"{seed}/{split}/{index}/{attempt}".encode()).digest()
  return random.Random(int.from_bytes(digest[:8], "little"))


def expert_wins(game_dir: Path, task_type: str, max_steps: int = 50, seed: int = 0) -> bool:
  """Plays the handcoded expert on a game folder in the real engine; True when it wins."""
  from seed_jax.envs.alfworld.engine import AlfWorldEnv  # pylint: disable=g-import-not-at-top
  env = AlfWorldEnv(max_steps=max_steps, with_expert=True)
  task = Task(env="alfworld", task_id=str(game_dir), split="train", task_type=task_type,
              payload={"game_file": str(game_dir / games.GAME_FILE)})
  try:
    _, info = env.reset(task, seed)
    done = False
    while not done:
      result = env.step(info["expert_action"])
      done, info = result.done, result.info
    return bool(info["won"])
  except Exception as error:  # pylint: disable=broad-except  (a broken game is just rejected)
    logging.info("generated game %s rejected: %r", game_dir, error)
    return False
  finally:
    env.close()


def _max_attempts(game_set: GameSet) -> int:
  # Short bounds reject most layouts (the object must lie on the expert's first stops).
  return _MAX_ATTEMPTS * max(1, SOLVABLE_WITHIN // (4 * game_set.solvable_within))


def generate_game(root: Path, game_set: GameSet, split: str, index: int) -> Path:
  """Generates (or finds in the cache under `root`) game `index` of `split`; returns its
  folder."""
  split_dir = _split_dir(root, split)
  existing = sorted(split_dir.glob(f"*/{_trial_name(split, index)}"))
  if existing:
    return existing[0]
  seed = game_set.seed
  task_type = games.ALFWORLD_TASK_TYPE[game_set.task_types[index % len(game_set.task_types)]]
  plans = scenes.floor_plans_for(task_type, held_out=(split == "valid_unseen"))
  domain, grammar = games.installed_logic()
  attempts = _max_attempts(game_set)
  for attempt in range(attempts):
    rng = _game_rng(seed, split, index, attempt)
    spec = scenes.sample_game(scenes.load_floor_plan(rng.choice(plans)), task_type, rng)
    if spec is None:
      continue
    final_dir = split_dir / spec.folder_name / _trial_name(split, index)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp_", dir=final_dir.parent))
    game = {"pddl_domain": domain, "grammar": grammar.replace("UNKNOWN GOAL", spec.task_sentence),
            "pddl_problem": spec.problem, "solvable": True}
    (staging / games.GAME_FILE).write_text(json.dumps(game))
    traj = spec.traj_data(task_id=_trial_name(split, index),
                          extra={"version": GENERATOR_VERSION, "seed": seed, "attempt": attempt})
    (staging / games.TRAJ_FILE).write_text(json.dumps(traj, indent=1))
    if expert_wins(staging, games.TASK_TYPES[task_type], game_set.solvable_within):
      try:
        staging.rename(final_dir)
      except OSError:  # another process cached the same game first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)
      return final_dir
    shutil.rmtree(staging, ignore_errors=True)
    try:
      final_dir.parent.rmdir()  # leave no empty task folder behind (kept if not empty)
    except OSError:
      pass
  raise RuntimeError(f"no {task_type} game for {split}[{index}] that the expert wins within "
                     f"{game_set.solvable_within} steps after {attempts} tries; raise "
                     "solvable_within or leave this type out of task_types")


def _generate_one(args: tuple) -> str:
  return str(generate_game(*args))


def ensure_games(root: Path, game_set: GameSet, split: str, num_games: int,
                 num_workers: int = 0) -> list[Path]:
  """Makes sure games 0..num_games-1 of `split` exist under `root`; returns their folders.

  Missing games are generated in `num_workers` processes (0: one per CPU), which takes a
  second or a few per game, once.
  """
  jobs = [(root, game_set, split, i) for i in range(num_games)]
  split_dir = _split_dir(root, split)
  missing = [j for j in jobs if not list(split_dir.glob(f"*/{_trial_name(split, j[3])}"))]
  num_workers = num_workers or os.cpu_count() or 1
  if missing:
    logging.warning("generating %d ALFWorld %s games under %s (once; cached)",
                    len(missing), split, root)
  if len(missing) > 1 and num_workers > 1:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(min(num_workers, len(missing)),
                                                mp_context=context) as pool:
      list(pool.map(_generate_one, missing))
  else:
    for job in missing:
      generate_game(*job)
  return [generate_game(*job) for job in jobs]  # all cached now: cheap look-ups


def generated_tasks(root: Path, game_set: GameSet, split: str, num_games: int,
                    num_workers: int = 0) -> list[Task]:
  """Tasks of the first `num_games` generated games of a split, in index order."""
  tasks = []
  for game_dir in ensure_games(root, game_set, split, num_games, num_workers):
    traj = json.loads((game_dir / games.TRAJ_FILE).read_text())
    tasks.append(Task(
        env="alfworld",
        task_id=f"{split}/{game_dir.parent.name}/{game_dir.name}",
        split=split,
        task_type=games.TASK_TYPES[traj["task_type"]],
        payload={"game_file": str(game_dir / games.GAME_FILE),
                 "floor_plan": traj["scene"]["floor_plan"]},
    ))
  return tasks
