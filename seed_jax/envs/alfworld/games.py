"""ALFWorld game folders: discovery, splits, task types and the grammar upgrade.

A game is a folder holding `game.tw-pddl` (JSON: PDDL domain, text grammar with the task
sentence, PDDL problem, `solvable`) and `traj_data.json` (task type and `pddl_params`, read
by the handcoded expert). Official data lies under `json_2.1.1/<split>/<task folder>/trial_*/`;
the embedded generator writes the same layout, so one loader serves both.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from seed_jax.envs.base import SPLITS, Task

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"

# ALFWorld's long task-type names (folder prefixes, traj_data) -> seed_jax task types.
TASK_TYPES = {
    "pick_and_place_simple": "pick_and_place",
    "pick_two_obj_and_place": "pick_two_obj_and_place",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_heat_then_place_in_recep": "pick_heat_then_place",
    "pick_cool_then_place_in_recep": "pick_cool_then_place",
    "pick_clean_then_place_in_recep": "pick_clean_then_place",
}
ALFWORLD_TASK_TYPE = {short: long for long, short in TASK_TYPES.items()}

_TASK_SENTENCE = re.compile(r'"rhs":\s*"Your task is to: ([^"]*?)\.?"')


def task_type_of_folder(folder_name: str) -> str | None:
  """The seed_jax task type of an ALFWorld task folder name, None if not one of the six."""
  prefix = folder_name.split("-", 1)[0]
  return TASK_TYPES.get(prefix)


@functools.lru_cache(maxsize=1)
def installed_logic() -> tuple[str, str]:
  """(PDDL domain text, grammar text) shipped with the installed alfworld package."""
  import alfworld.info  # pylint: disable=g-import-not-at-top  (heavy; only where games load)
  domain = Path(alfworld.info.ALFRED_PDDL_PATH).read_text()
  grammar = Path(alfworld.info.ALFRED_TWL2_PATH).read_text()
  return domain, grammar


def task_sentence(grammar: str) -> str:
  """The task sentence embedded in a game's grammar ("put a hot potato in countertop")."""
  match = _TASK_SENTENCE.search(grammar)
  if match is None:
    raise ValueError("game grammar holds no 'Your task is to: ...' rule")
  return match.group(1).strip()


def embed_installed_logic(game_data: dict[str, Any]) -> dict[str, Any]:
  """Returns the game with the installed domain and grammar, keeping its task sentence.

  Games made for older alfworld releases embed a grammar whose commands ("put X in/on Y")
  the 0.4.2 engine and experts no longer drive; re-embedding the installed logic makes them
  playable (the expert then wins 10 of 12 official samples instead of 5). Games that already
  embed the installed logic come back unchanged.
  """
  domain, grammar = installed_logic()
  embedded = grammar.replace("UNKNOWN GOAL", task_sentence(game_data["grammar"]))
  if game_data.get("pddl_domain") == domain and game_data.get("grammar") == embedded:
    return game_data
  return dict(game_data, pddl_domain=domain, grammar=embedded)


def is_marked_solvable(game_path: Path) -> bool:
  """Whether a game file says `"solvable": true` (games without the key are skipped)."""
  # The key closes the official files (150 kB each, 3.5k of them): read the tail first.
  with open(game_path, "rb") as f:
    f.seek(max(0, game_path.stat().st_size - 200))
    tail = f.read().decode("utf-8", errors="ignore")
  if '"solvable": true' in tail:
    return True
  if '"solvable": false' in tail:
    return False
  return bool(json.loads(game_path.read_text()).get("solvable", False))


def split_root(data_dir: str | os.PathLike[str], split: str) -> Path:
  """`<data_dir>/json_2.1.1/<split>`, also accepting data_dir = the json_2.1.1 folder itself."""
  if split not in SPLITS:
    raise ValueError(f"split {split!r} is not one of {SPLITS}")
  root = Path(data_dir).expanduser()
  if (root / "json_2.1.1").is_dir():
    root = root / "json_2.1.1"
  return root / split


def scan_games(data_dir: str | os.PathLike[str], split: str) -> list[Task]:
  """All playable games of a split under an ALFWorld data folder, in a stable order.

  Follows the rules of alfworld's own loader: a game needs `traj_data.json` and a
  `game.tw-pddl` marked solvable; paths holding "movable" or "Sliced" are skipped, and so
  are task types outside the six.
  """
  root = split_root(data_dir, split)
  if not root.is_dir():
    raise FileNotFoundError(f"ALFWorld split folder {root} does not exist")
  tasks = []
  for traj_path in sorted(root.glob(f"*/*/{TRAJ_FILE}")):
    game_dir = traj_path.parent
    task_folder = game_dir.parent.name
    task_type = task_type_of_folder(task_folder)
    game_path = game_dir / GAME_FILE
    if task_type is None or "movable" in str(game_dir) or "Sliced" in str(game_dir):
      continue
    if not game_path.is_file() or not is_marked_solvable(game_path):
      continue
    scene = task_folder.rsplit("-", 1)[-1]
    tasks.append(Task(
        env="alfworld",
        task_id=f"{split}/{task_folder}/{game_dir.name}",
        split=split,
        task_type=task_type,
        payload={"game_file": str(game_path), "floor_plan": f"FloorPlan{scene}"},
    ))
  return tasks
