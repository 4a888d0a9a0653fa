"""The Sokoban prompt (verl-agent's shape, the reference symbols), response parsing and
rendering."""

from __future__ import annotations

from seed_jax.envs.agent_format import (AgentFormat, ParsedAction, Turn, history_window,
                                        parse_action, render_think_action)
from seed_jax.envs.sokoban.env import parse_text
from seed_jax.envs.sokoban.generator import Board, Cell

_RULES = """You are an expert agent playing Sokoban.

# Symbols
#: wall, you cannot walk through it or push a box into it
_: floor
O: target
X: box
√: box on a target
P: you, the player
S: you, standing on a target

# Rules
Walk with up, down, left or right. Walking into a box pushes it one cell the same way,
unless a wall or another box is behind it. Boxes can be pushed, never pulled, so a box in a
corner is stuck for good. The puzzle is solved when every box is on a target.
"""

_ASK = """Your admissible actions are [{actions}].

Now it's your turn to make one move. First reason step by step inside <think> </think>:
where are the boxes and the targets, which box goes where, and how to avoid pushing a box
into a corner. Then give exactly one admissible action inside <action> </action>."""

# The `compact` style (issue 26's cheap iterations): the same legend, rule and goal sentence
# in about half the tokens (159 with the chat template against 296), so that a 2-core run's
# update and prefill read half the positions (`:learn_fast`: an episode 2.4x cheaper). A
# named small-CPU variant: the paper presets keep the full prompt.
_COMPACT_RULES = ("Sokoban. #: wall, _: floor, O: target, X: box, √: box on a target, "
                  "P: you, S: you on a target. Walking into a box pushes it; boxes are "
                  "never pulled. The puzzle is solved when every box is on a target.")

_COMPACT_ASK = ("Think inside <think> </think>, then give one of [{actions}] inside "
                "<action> </action>.")

# Per style: the rules, the current-board line (`{step}`, `{observation}`) and the request
# (`{actions}`).
_STYLES = {
    "full": (_RULES.strip(), "You are now at step {step}. The current observation is:\n"
             "{observation}", _ASK),
    "compact": (_COMPACT_RULES, "Step {step}:\n{observation}", _COMPACT_ASK),
}
PROMPT_STYLES = tuple(_STYLES)

# `blocked_notice`: said before the board when the last move left it as it was, so that a
# policy shown the board alone (`history_length` 0) does not meet the very prompt it just
# answered and repeat its move to the turn limit (ALFWorld says "Nothing happens.").
_BLOCKED_NOTICE = "Your last move, {action}, changed nothing: try another."


# `board_positions`: after the board, where the player, the boxes and the targets are, as
# (row, column) pairs with the rule that relates them to the moves. A model that reads a
# grid token by token must otherwise count symbols along a line and across lines to find
# which way the box lies; with the pairs, comparing two numbers says it.
_POSITIONS = ("Positions as (row, column); down adds 1 to the row, right adds 1 to the "
              "column: {parts}.")


def positions_line(board: Board) -> str:
  """The `board_positions` sentence for `board`: the player, the boxes off a target, the free
  targets and the boxes on a target, each as (row, column) counted from 0 at the top left."""

  def cells(name: str, group: frozenset[Cell] | set[Cell]) -> list[str]:
    return [f"{name} ({row}, {col})" for row, col in sorted(group)]

  parts = (cells("you", {board.player}) + cells("box", board.boxes - board.targets)
           + cells("target", board.targets - board.boxes - {board.player})
           + cells("you on a target", {board.player} & board.targets)
           + cells("box on a target", board.boxes & board.targets))
  return _POSITIONS.format(parts="; ".join(parts))


class SokobanFormat(AgentFormat):
  """Renders the Sokoban prompt and parses `<think>..</think><action>..</action>`."""

  stop_strings: tuple[str, ...] = ("</action>",)
  # Sokoban has no per-task instruction: the rules' goal sentence states the task, and H
  # inserts the skill after it.
  task_line_pattern = r"The puzzle is solved when"

  def __init__(self, history_length: int = 2, style: str = "full",
               blocked_notice: bool = False, board_positions: bool = False):
    """`history_length`: how many past turns the prompt shows; `style`: one of
    `PROMPT_STYLES` ("compact": the rules and the request in about half the tokens);
    `blocked_notice`: say so when the last move changed nothing; `board_positions`: give
    the player's, the boxes' and the targets' (row, column) after the board (both
    small-model aids)."""
    if style not in PROMPT_STYLES:
      raise ValueError(f"prompt style: one of {PROMPT_STYLES}, got {style!r}")
    self._history_length = history_length
    self._rules, self._current, self._ask = _STYLES[style]
    self._blocked_notice = blocked_notice
    self._board_positions = board_positions

  def render(self, instruction: str, history: list[Turn], observation: str,
             admissible_actions: list[str] | None, step: int) -> str:
    """The user message for turn `step` (1-based: the number of the step about to be taken)."""
    del instruction  # the rules say it all
    parts = [self._rules]
    window = history_window(history, self._history_length)
    if window:
      records = "\n".join(f"[Observation {k}:\n{turn.observation}\nAction {k}: '{turn.action}']"
                          for k, turn in window)
      parts.append(f"Prior to this step you have taken {len(history)} step(s). The most "
                   f"recent {len(window)} observations and the actions you took:\n{records}")
    if self._blocked_notice and history and history[-1].observation == observation:
      parts.append(_BLOCKED_NOTICE.format(action=history[-1].action))
    parts.append(self._current.format(step=step, observation=observation))
    if self._board_positions:
      parts.append(positions_line(parse_text(observation)))
    actions = admissible_actions or ["up", "down", "left", "right"]
    parts.append(self._ask.format(actions=", ".join(f'"{a}"' for a in actions)))
    return "\n\n".join(parts)

  def parse(self, response: str) -> ParsedAction:
    """The action inside `<action>`, lower-cased; a think block is required."""
    return parse_action(response, require_think=True)

  def render_response(self, action: str) -> str:
    """A short think block, then the move: what behaviour cloning trains on."""
    return render_think_action(f"Next I should move {action}.", action)
