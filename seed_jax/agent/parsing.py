"""Turns model responses into env actions (the verl-agent `<think>/<action>` convention).

A response is expected to look like `<think> reasoning </think><action> go to fridge 1 </action>`.
The response is lower-cased (env commands are lower-case) and the text inside the action tags
becomes the action. A response that breaks the format still yields an action: the no-op
`INVALID_ACTION`, which every env answers with "Nothing happens." and which the trainer
charges the invalid-action penalty for. Parsing never raises, whatever string it gets.
"""

from __future__ import annotations

import re
from typing import Sequence

from seed_jax.envs.base import ParsedAction, Turn

# Sent to the env when a response is invalid: no env command looks like it, so every env
# treats it as a no-op ("Nothing happens.") rather than guessing what the model meant.
INVALID_ACTION = "invalid action"

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ACTION_OPEN, _ACTION_CLOSE = "<action>", "</action>"
# CJK Unified Ideographs (and extension A): verl-agent rejects responses that drift into
# Chinese, a common failure of Qwen models under RL.
_CHINESE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _invalid(reason: str) -> ParsedAction:
  return ParsedAction(action=INVALID_ACTION, valid=False, reason=reason)


def parse_action(response: str, require_think: bool = True) -> ParsedAction:
  """Parses one model response into an action; never raises.

  Args:
    response: the raw text the model wrote for this turn (a stop string such as
      `</action>` may have been cut off by the sampler; a missing final `</action>` is
      tolerated only when the response ends inside the action block).
    require_think: when True (ALFWorld, WebShop, Sokoban) a `<think>...</think>` block must
      precede the action.

  Returns:
    ParsedAction: `action` is the stripped, lower-cased text inside the first
    `<action>...</action>`; on a format error it is `INVALID_ACTION`, `valid` is False and
    `reason` names the error.
  """
  if not isinstance(response, str):
    return _invalid(f"response is {type(response).__name__}, not str")
  text = response.lower()
  if _CHINESE.search(text):
    return _invalid("response holds chinese characters")

  action_start = text.find(_ACTION_OPEN)
  if action_start < 0:
    return _invalid("missing <action> tag")
  if require_think:
    think_start = text.find(_THINK_OPEN)
    think_end = text.find(_THINK_CLOSE, think_start + len(_THINK_OPEN))
    if think_start < 0 or think_end < 0:
      return _invalid("missing <think>...</think> block")
    if think_end > action_start:
      return _invalid("<think> block does not precede <action>")

  body_start = action_start + len(_ACTION_OPEN)
  body_end = text.find(_ACTION_CLOSE, body_start)
  if body_end < 0:
    # Samplers stop on "</action>" and may drop it; accept the tail as the action body.
    body_end = len(text)
  action = " ".join(text[body_start:body_end].split())
  if not action:
    return _invalid("empty action")
  return ParsedAction(action=action, valid=True)


def history_window(turns: Sequence[Turn], history_length: int) -> list[tuple[int, Turn]]:
  """The last `history_length` turns, in order, each with its 1-based step number.

  Args:
    turns: every past turn of the episode, oldest first.
    history_length: how many of the most recent turns the prompt shows (0: none;
      negative: all of them, as the search env does).

  Returns:
    list of (step number, turn), oldest first; step numbers count from the episode start
    so the prompt can say "Observation 7" even when only two turns are shown.
  """
  if history_length < 0:
    first = 0
  else:
    first = max(0, len(turns) - history_length)
  return [(index + 1, turns[index]) for index in range(first, len(turns))]


def format_history(numbered_turns: Sequence[tuple[int, Turn]]) -> str:
  """`[Observation k: '...', Action k: '...']` lines, oldest first (verl-agent's layout)."""
  return "\n".join(f"[Observation {k}: '{turn.observation}', Action {k}: '{turn.action}']"
                   for k, turn in numbered_turns)
