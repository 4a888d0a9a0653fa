"""How an env family talks to the model: the `AgentFormat` protocol and its shared parts.

Each env family ships its format next to its env (`seed_jax/envs/<name>/prompt*.py`,
returned by the family's `make_agent_format`): it renders the user message of a turn,
parses a response into an env action, renders a response from an action (the target that
behaviour cloning trains on) and names the line that states the task (where H inserts a
skill). This module holds the vocabulary those formats share and the verl-agent
`<think>...</think><action>...</action>` convention that all but the search env use.

Why here, in `seed_jax.envs`, and not in `seed_jax.agent`: the formats are per env, so the
env layer owns them and imports nothing from the agent layer; `seed_jax.agent` (the acting
loop and its policies) sits on top and imports from here, never the reverse.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol, Sequence, runtime_checkable

# Sent to the env when a response is invalid: no env command looks like it, so every env
# treats it as a no-op ("Nothing happens.") rather than guessing what the model meant.
INVALID_ACTION = "invalid action"

# Where the turn's image goes in the prompt of a format that `uses_images`: its `render`
# writes this literal exactly once, and the model side replaces it with the vision tokens of
# the current info's "image" (`seed_jax.envs.base`). Only the current turn's image is shown.
IMAGE_PLACEHOLDER = "<image>"


def shows_images(fmt) -> bool:
  """Whether `fmt`'s prompts show the turn's image (`AgentFormat.uses_images`; a format
  that does not declare it is text-only)."""
  return bool(getattr(fmt, "uses_images", False))

# CJK Unified Ideographs (and extension A): verl-agent rejects responses that drift into
# Chinese, a common failure of Qwen models under RL.
_CHINESE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ACTION_OPEN, _ACTION_CLOSE = "<action>", "</action>"
# The tags that hold a response's env action across the env families: `<action>` (ALFWorld,
# WebShop, Sokoban) and the search env's `<search>` / `<answer>`.
_ACTION_BLOCK_OPEN = re.compile(r"<(action|search|answer)>", re.IGNORECASE)


def _last_action_block(text: str) -> tuple[re.Match, re.Match | None] | None:
  """The last action block's opening tag and its closing tag (None: unclosed), or None
  without a block (`action_char_span` says which block and why the last)."""
  opens = list(_ACTION_BLOCK_OPEN.finditer(text))
  if not opens:
    return None
  last = opens[-1]
  return last, re.compile(rf"</{last.group(1)}>", re.IGNORECASE).search(text, last.end())


def action_char_span(text: str) -> tuple[int, int] | None:
  """The character span `[start, end)` of the response's action block, or None.

  The block runs from the LAST `<action>`, `<search>` or `<answer>` opening tag (any case)
  through its closing tag, both tags included; an unclosed block runs to the end of the
  text (samplers stop on the closing tag and may drop it). The last one, because a response
  that names a tag in its reasoning before acting still acts with its final block.
  """
  block = _last_action_block(text)
  if block is None:
    return None
  opening, closing = block
  return opening.start(), closing.end() if closing else len(text)


def decision_char_span(text: str) -> tuple[int, int] | None:
  """Where the response first names the action it takes: the character span `[start,
  end)` of the first occurrence (any case, as a whole word) of its action block's content,
  or None without a block or with an empty one.

  A response that thinks before it acts (`<think>Next I should move left.</think>
  <action>left</action>`) decides at the think's "left"; the block then copies it, with
  probability near 1 for student and teacher alike. Without an earlier mention the span is
  the block's content itself.
  """
  block = _last_action_block(text)
  if block is None:
    return None
  opening, closing = block
  content = text[opening.end():closing.start() if closing else len(text)].strip()
  if not content:
    return None
  first = re.search(rf"(?<!\w){re.escape(content)}(?!\w)", text, re.IGNORECASE)
  return first.start(), first.end()


@dataclasses.dataclass(frozen=True)
class Turn:
  """One past turn as the agent's prompt shows it: what it saw, and the action it took."""

  observation: str
  action: str


@dataclasses.dataclass(frozen=True)
class ParsedAction:
  """A model response turned into an env action.

  `valid` is False when the response breaks the format (missing tags, missing think block,
  ...); the acting loop then still steps the env with `action` (the no-op
  `INVALID_ACTION`) and the trainer charges the invalid-action penalty. `reason` says why,
  for metrics and debugging.
  """

  action: str
  valid: bool
  reason: str = ""


@runtime_checkable
class AgentFormat(Protocol):
  """Prompt rendering, response parsing and response rendering of one env family.

  Attributes:
    stop_strings: the sampler stops a response at any of them.
    task_line_pattern: a regex matching the line of a rendered prompt that states the
      task; H (`seed_jax.seed.skills.augment_prompt`) inserts the skill right after it.
    uses_images: the agent sees the env's info["image"]: `render` writes
      `IMAGE_PLACEHOLDER` exactly once, where the image goes. False (the default that
      formats inherit by subclassing this protocol) for text-only formats.

  `render` returns the user message of turn `step` (1-based: the step about to be taken);
  the chat template is applied later. `parse` never raises, whatever string it gets.
  `render_response(action)` is a response that `parse` turns back into `action`.
  """

  stop_strings: tuple[str, ...]
  task_line_pattern: str
  uses_images: bool = False

  def render(self, instruction: str, history: list[Turn], observation: str,
             admissible_actions: list[str] | None, step: int) -> str:
    ...

  def parse(self, response: str) -> ParsedAction:
    ...

  def render_response(self, action: str) -> str:
    ...


def invalid(reason: str) -> ParsedAction:
  """The no-op action, flagged invalid for `reason`."""
  return ParsedAction(action=INVALID_ACTION, valid=False, reason=reason)


def has_chinese(text: str) -> bool:
  return bool(_CHINESE.search(text))


def parse_action(response: str, require_think: bool = True) -> ParsedAction:
  """Parses a `<think>...</think><action>...</action>` response into an action; never raises.

  The response is lower-cased (env commands are lower-case) and the text inside the first
  action block, whitespace collapsed, becomes the action.

  Args:
    response: the raw text the model wrote for this turn (a stop string such as
      `</action>` may have been cut off by the sampler; a missing final `</action>` is
      tolerated only when the response ends inside the action block).
    require_think: when True (every env but search) a `<think>...</think>` block must
      precede the action.

  Returns:
    ParsedAction: the action; on a format error `INVALID_ACTION`, `valid` False and
    `reason` naming the error.
  """
  if not isinstance(response, str):
    return invalid(f"response is {type(response).__name__}, not str")
  text = response.lower()
  if has_chinese(text):
    return invalid("response holds chinese characters")

  action_start = text.find(_ACTION_OPEN)
  if action_start < 0:
    return invalid("missing <action> tag")
  if require_think:
    think_start = text.find(_THINK_OPEN)
    think_end = text.find(_THINK_CLOSE, think_start + len(_THINK_OPEN))
    if think_start < 0 or think_end < 0:
      return invalid("missing <think>...</think> block")
    if think_end > action_start:
      return invalid("<think> block does not precede <action>")

  body_start = action_start + len(_ACTION_OPEN)
  body_end = text.find(_ACTION_CLOSE, body_start)
  if body_end < 0:
    # Samplers stop on "</action>" and may drop it; accept the tail as the action body.
    body_end = len(text)
  action = " ".join(text[body_start:body_end].split())
  if not action:
    return invalid("empty action")
  return ParsedAction(action=action, valid=True)


def render_think_action(thought: str, action: str) -> str:
  """`<think>thought</think><action>action</action>`, the response `parse_action` reads.

  Raises:
    ValueError: when the action or the thought holds a tag of the convention, so that the
      response would not parse back to the action.
  """
  tags = (_THINK_OPEN, _THINK_CLOSE, _ACTION_OPEN, _ACTION_CLOSE)
  if any(tag in text.lower() for text in (thought, action) for tag in tags):
    raise ValueError(f"cannot render a response for {action!r}: it or {thought!r} holds a tag")
  return f"{_THINK_OPEN}{thought}{_THINK_CLOSE}{_ACTION_OPEN}{action}{_ACTION_CLOSE}"


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
  first = 0 if history_length < 0 else max(0, len(turns) - history_length)
  return [(index + 1, turns[index]) for index in range(first, len(turns))]


def format_history(numbered_turns: Sequence[tuple[int, Turn]]) -> str:
  """`[Observation k: '...', Action k: '...']` lines, oldest first (verl-agent's layout)."""
  return "\n".join(f"[Observation {k}: '{turn.observation}', Action {k}: '{turn.action}']"
                   for k, turn in numbered_turns)
