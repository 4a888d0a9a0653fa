"""The Sokoban environment: text observations with the reference symbols, an RGB rendering,
gym-sokoban rewards, and a BFS expert."""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import numpy as np

from seed_jax.envs import base
from seed_jax.envs.sokoban import generator
from seed_jax.envs.sokoban.generator import Board

ACTIONS = tuple(generator.MOVES)

# The text symbols of the reference (verl-agent) prompt.
WALL, FLOOR, TARGET, BOX = "#", "_", "O", "X"
BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "√", "P", "S"

# gym-sokoban's reward scheme.
STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
FINISHED_REWARD = 10.0


class Colour(NamedTuple):
  """A colour of the RGB rendering: its name (what the visual prompt's legend calls it, so
  the legend cannot drift from the pixels) and its RGB value."""

  name: str
  rgb: tuple[int, int, int]


# The rendering's colour of each symbol.
COLOURS = {
    WALL: Colour("dark brown", (90, 60, 40)),
    FLOOR: Colour("light beige", (230, 220, 200)),
    TARGET: Colour("red", (230, 80, 80)),
    BOX: Colour("mustard yellow", (200, 150, 50)),
    BOX_ON_TARGET: Colour("green", (90, 180, 90)),
    PLAYER: Colour("blue", (60, 90, 220)),
    PLAYER_ON_TARGET: Colour("purple", (150, 60, 200)),
}


def board_symbols(board: Board) -> list[list[str]]:
  """The board as a grid of reference symbols, row by row."""
  height, width = board.shape
  grid = []
  for row in range(height):
    line = []
    for col in range(width):
      cell = (row, col)
      on_target = cell in board.targets
      if board.is_wall(cell):
        line.append(WALL)
      elif cell == board.player:
        line.append(PLAYER_ON_TARGET if on_target else PLAYER)
      elif cell in board.boxes:
        line.append(BOX_ON_TARGET if on_target else BOX)
      else:
        line.append(TARGET if on_target else FLOOR)
    grid.append(line)
  return grid


def render_text(board: Board) -> str:
  """The board as the text observation: one line per row, one symbol per cell."""
  return "\n".join("".join(line) for line in board_symbols(board))


def parse_text(text: str) -> Board:
  """The board a text observation shows: the inverse of `render_text` (hand-made puzzles,
  tests). Any symbol but a wall is floor underneath."""
  walls, targets, boxes, player = [], set(), set(), None
  for row, line in enumerate(text.split("\n")):
    walls.append("".join("#" if symbol == WALL else " " for symbol in line))
    for col, symbol in enumerate(line):
      if symbol not in COLOURS:
        raise ValueError(f"not a Sokoban symbol: {symbol!r} at row {row}, column {col}")
      if symbol in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
        targets.add((row, col))
      if symbol in (BOX, BOX_ON_TARGET):
        boxes.add((row, col))
      if symbol in (PLAYER, PLAYER_ON_TARGET):
        player = (row, col)
  if player is None:
    raise ValueError(f"no player (P or S) on the board:\n{text}")
  return Board(tuple(walls), frozenset(targets), frozenset(boxes), player)


def render_rgb(board: Board, tile: int = 16) -> np.ndarray:
  """The board as an RGB image `[H * tile, W * tile, 3]` uint8, for vision-language policies.

  Boxes and the player are drawn as inset squares over the floor or target colour, so a box
  on a target and the player on a target stay distinguishable.
  """
  height, width = board.shape
  image = np.zeros((height * tile, width * tile, 3), dtype=np.uint8)
  inset = max(1, tile // 5)
  for row, line in enumerate(board_symbols(board)):
    for col, symbol in enumerate(line):
      cell = image[row * tile:(row + 1) * tile, col * tile:(col + 1) * tile]
      background = TARGET if (row, col) in board.targets else (WALL if symbol == WALL else FLOOR)
      cell[:] = COLOURS[background].rgb
      if symbol in (BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET):
        cell[inset:tile - inset, inset:tile - inset] = COLOURS[symbol].rgb
  return image


class SokobanEnv(base.Env):
  """One Sokoban puzzle per episode, generated from the task's seed.

  Rewards are gym-sokoban's: -0.1 a step, +1 for a box pushed onto a target (-1 off it),
  +10 when every box is on a target (which ends the episode, `won`).
  """

  def __init__(self, max_steps: int, max_solution_steps: int, with_expert: bool = False,
               include_image: bool = False, tile: int = 16, effective_moves_only: bool = False,
               min_solution_steps: int = 2):
    """`include_image`: every info also holds "image", `render_rgb(board, tile)`;
    `effective_moves_only`: the admissible actions are the moves that change the board
    (not a wall ahead, nor a box that cannot move), as ALFWorld lists the commands that do
    something; otherwise all four (gym-sokoban, verl-agent). Either way any move may be
    taken. A task's puzzle is the first its seed generates whose shortest solution takes
    `min_solution_steps` to `max_solution_steps` moves."""
    self._effective_moves_only = effective_moves_only
    self._max_steps = max_steps
    self._max_solution_steps = max_solution_steps
    self._min_solution_steps = min_solution_steps
    self._with_expert = with_expert
    self._include_image = include_image
    self._tile = tile
    self._board: Board | None = None
    self._task: base.Task | None = None
    self._steps = 0

  @property
  def board(self) -> Board:
    if self._board is None:
      raise RuntimeError("SokobanEnv.step called before reset")
    return self._board

  def reset(self, task: base.Task, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates the task's puzzle (the task payload fixes it; `seed` is not needed)."""
    payload = task.payload
    self._board, _ = generator.generate(
        payload["seed"], height=payload["height"], width=payload["width"],
        num_boxes=payload["num_boxes"], max_solution_steps=self._max_solution_steps,
        min_solution_steps=self._min_solution_steps)
    self._task = task
    self._steps = 0
    info = self._info(action_valid=True)
    info["instruction"] = "push every box (X) onto a target (O)"
    return render_text(self._board), info

  def step(self, action: str) -> base.StepResult:
    """Moves the player; an action other than up/down/left/right is a no-op. The info's
    "action_effective" says whether the board changed (False for a blocked move)."""
    board = self.board
    self._steps += 1
    move = action.strip().lower()
    valid = move in generator.MOVES
    reward = STEP_PENALTY
    if valid:
      new_board = board.push(move)
      on_before = len(board.boxes & board.targets)
      on_after = len(new_board.boxes & new_board.targets)
      reward += BOX_ON_TARGET_REWARD * (on_after - on_before)
      if new_board.solved:
        reward += FINISHED_REWARD
      self._board = new_board
    info = self._info(action_valid=valid)
    info["action_effective"] = valid and not board.blocked(move)
    done = self._board.solved or self._steps >= self._max_steps
    return base.StepResult(render_text(self._board), reward, done, info)

  def close(self) -> None:
    self._board = None

  def _info(self, action_valid: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "won": self.board.solved,
        "action_valid": action_valid,
        "admissible_actions": self._admissible_actions(),
        "task_type": self._task.task_type,
        "boxes_on_target": len(self.board.boxes & self.board.targets),
    }
    if self._with_expert:
      plan = generator.solve(self.board)
      # A dead-locked board has no plan: any move is as good as another then.
      info["expert_action"] = plan[0] if plan else ACTIONS[0]
    if self._include_image:
      info["image"] = render_rgb(self.board, self._tile)
    return info

  def _admissible_actions(self) -> list[str]:
    # A board with no effective move (boxed in) lists all four rather than none.
    return (self._effective_moves_only and effective_moves(self.board)) or list(ACTIONS)


def effective_moves(board: Board) -> list[str]:
  """The moves that change `board`, in the order of `ACTIONS`."""
  return [move for move in ACTIONS if not board.blocked(move)]


def random_action(rng: random.Random, observation: str, info: dict[str, Any]) -> str:
  """A uniformly random move (for the `play` command's random policy)."""
  del observation, info
  return rng.choice(ACTIONS)
