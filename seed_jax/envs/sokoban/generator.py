"""Sokoban puzzles: a generator in the manner of gym-sokoban, and a BFS solver.

Generation follows gym-sokoban: carve a room by a random walk, put every box on a target,
then play *backwards* from that solved state (the player walks and may pull a box behind it).
Every pull is the reverse of a legal push, so the resulting start state is solvable by
construction; the BFS solver checks it anyway and measures the optimal solution, which lets
the generator reject puzzles too long for the env's turn limit.

A `Board` is immutable and hashable, so the solver can use boards as visited-set keys.
"""

from __future__ import annotations

import collections
import dataclasses
import random

Cell = tuple[int, int]  # (row, col)

# Action name -> (d_row, d_col). The order is the order of the admissible-action list.
MOVES: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


@dataclasses.dataclass(frozen=True)
class Board:
  """A Sokoban state.

  Attributes:
    walls: one string per row, '#' for a wall and ' ' for floor (the border is all wall).
    targets: the target cells.
    boxes: the box cells (same count as targets).
    player: the player's cell.
  """

  walls: tuple[str, ...]
  targets: frozenset[Cell]
  boxes: frozenset[Cell]
  player: Cell

  @property
  def shape(self) -> tuple[int, int]:
    return len(self.walls), len(self.walls[0])

  def is_wall(self, cell: Cell) -> bool:
    row, col = cell
    height, width = self.shape
    if not (0 <= row < height and 0 <= col < width):
      return True
    return self.walls[row][col] == "#"

  @property
  def solved(self) -> bool:
    return self.boxes == self.targets

  def push(self, action: str) -> Board:
    """The board after the player moves in direction `action` (pushing a box if one is in
    the way). A move into a wall, or a push against a wall or a second box, leaves the
    board unchanged, as in gym-sokoban."""
    d_row, d_col = MOVES[action]
    ahead = (self.player[0] + d_row, self.player[1] + d_col)
    if self.is_wall(ahead):
      return self
    if ahead not in self.boxes:
      return dataclasses.replace(self, player=ahead)
    beyond = (ahead[0] + d_row, ahead[1] + d_col)
    if self.is_wall(beyond) or beyond in self.boxes:
      return self
    return dataclasses.replace(self, player=ahead, boxes=(self.boxes - {ahead}) | {beyond})

  def blocked(self, action: str) -> bool:
    """Whether moving in direction `action` leaves the board unchanged (`push` returns the
    board itself then)."""
    return self.push(action) is self


def solve(board: Board, max_states: int = 200_000) -> list[str] | None:
  """Breadth-first search for a shortest action sequence that solves `board`.

  Returns:
    The list of actions (empty if already solved), or None when no solution exists or
    more than `max_states` states were visited (the search gave up).
  """
  if board.solved:
    return []
  parents: dict[Board, tuple[Board, str] | None] = {board: None}
  frontier = collections.deque([board])
  while frontier:
    state = frontier.popleft()
    for action in MOVES:
      nxt = state.push(action)
      if nxt in parents:
        continue
      parents[nxt] = (state, action)
      if nxt.solved:
        return _trace(parents, nxt)
      if len(parents) > max_states:
        return None
      frontier.append(nxt)
  return None


def _trace(parents: dict[Board, tuple[Board, str] | None], end: Board) -> list[str]:
  actions = []
  link = parents[end]
  while link is not None:
    previous, action = link
    actions.append(action)
    link = parents[previous]
  return actions[::-1]


def _carve_room(rng: random.Random, height: int, width: int, walk_steps: int) -> list[list[str]]:
  """A room of walls with floor carved by a random walk (gym-sokoban's topology step)."""
  grid = [["#"] * width for _ in range(height)]
  row, col = rng.randrange(1, height - 1), rng.randrange(1, width - 1)
  directions = list(MOVES.values())
  for _ in range(walk_steps):
    grid[row][col] = " "
    d_row, d_col = rng.choice(directions)
    # Stay inside the border so the room is always enclosed by walls.
    row = min(max(row + d_row, 1), height - 2)
    col = min(max(col + d_col, 1), width - 2)
    # gym-sokoban carves a random 3x3 mask around the walker; widening one side
    # sometimes gives the room enough space for pushes.
    if rng.random() < 0.3:
      side_row = min(max(row + d_col, 1), height - 2)
      side_col = min(max(col + d_row, 1), width - 2)
      grid[side_row][side_col] = " "
  grid[row][col] = " "
  return grid


def _reverse_play(rng: random.Random, board: Board, steps: int) -> Board:
  """Walks the player backwards from `board`, pulling boxes: each reverse move undone is a
  legal forward push, so the returned board can be solved back to `board`."""
  for _ in range(steps):
    action = rng.choice(list(MOVES))
    d_row, d_col = MOVES[action]
    ahead = (board.player[0] + d_row, board.player[1] + d_col)
    if board.is_wall(ahead) or ahead in board.boxes:
      continue
    behind = (board.player[0] - d_row, board.player[1] - d_col)
    boxes = board.boxes
    if behind in boxes and rng.random() < 0.8:
      boxes = (boxes - {behind}) | {board.player}
    board = dataclasses.replace(board, player=ahead, boxes=boxes)
  return board


def _displacement(board: Board) -> int:
  """gym-sokoban's score: how far boxes are from the targets, summed (Manhattan, greedy)."""
  return sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in board.targets) for b in board.boxes)


def generate(seed: int, height: int = 6, width: int = 6, num_boxes: int = 1,
             max_solution_steps: int = 12, min_solution_steps: int = 2,
             max_tries: int = 500) -> tuple[Board, list[str]]:
  """Generates a solvable puzzle, deterministically from `seed`.

  Args:
    seed: the puzzle's seed; the same arguments always give the same puzzle.
    height, width: room size including the wall border.
    num_boxes: boxes (and targets).
    max_solution_steps: reject puzzles whose optimal solution is longer (keeps them within
      the env's turn limit).
    min_solution_steps: reject puzzles that are trivially short.
    max_tries: attempts before giving up.

  Returns:
    (start board, an optimal solution found by BFS).
  """
  if height < 4 or width < 4:
    raise ValueError(f"Sokoban room {height}x{width} is too small (need at least 4x4)")
  rng = random.Random(seed)
  for _ in range(max_tries):
    grid = _carve_room(rng, height, width, walk_steps=int(1.5 * (height + width)) + 4)
    floor = [(r, c) for r in range(height) for c in range(width) if grid[r][c] == " "]
    if len(floor) < 2 * num_boxes + 3:
      continue
    cells = rng.sample(floor, num_boxes + 1)
    targets = frozenset(cells[:num_boxes])
    solved = Board(walls=tuple("".join(row) for row in grid), targets=targets, boxes=targets,
                   player=cells[-1])
    best = None
    for _ in range(16):  # several reverse walks; keep the one that scatters boxes the most
      candidate = _reverse_play(rng, solved, steps=6 * (height + width))
      if best is None or _displacement(candidate) > _displacement(best):
        best = candidate
    if best is None or _displacement(best) == 0:
      continue
    solution = solve(best)
    if solution is not None and min_solution_steps <= len(solution) <= max_solution_steps:
      return best, solution
  raise RuntimeError(f"no Sokoban puzzle found for seed {seed} in {max_tries} tries "
                     f"({height}x{width}, {num_boxes} boxes, "
                     f"{min_solution_steps}-{max_solution_steps} steps)")
