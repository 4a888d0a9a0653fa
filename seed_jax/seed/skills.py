"""H, the skill-augmented context, and the validity rule for skills.

H works on the user-message text before the chat template. It inserts a block headed
"Episode-Level Skill", which tells the agent to refer to the skill when it chooses its
action, as whole lines right after the task line. Which line states the task is the env's
business: each `AgentFormat` names it (`fmt.task_line_pattern`), so this module holds no
env wording. The text before and after the block is left byte-for-byte unchanged, so a
tokenizer that splits at line breaks (byte-level BPE pre-tokenizers do) gives identical ids
outside the block.
"""

from __future__ import annotations

import dataclasses
import re

MIN_SKILL_WORDS = 5

SKILL_HEADER = "## Episode-Level Skill"
SKILL_INSTRUCTION = ("Refer to the following skill, distilled from experience on this task, "
                     "when choosing your action:")


@dataclasses.dataclass(frozen=True)
class AugmentedPrompt:
  """The augmented text and where the block sits: `text[start:end]` is the inserted block."""
  text: str
  start: int
  end: int


def skill_block(skill: str) -> str:
  """The inserted lines, each ending in a newline."""
  return f"{SKILL_HEADER}\n{SKILL_INSTRUCTION}\n{skill.strip()}\n"


def is_valid_skill(skill: object, min_words: int = MIN_SKILL_WORDS) -> bool:
  """A skill is a string of at least `min_words` whitespace-separated words."""
  return isinstance(skill, str) and len(skill.split()) >= min_words


def augment_prompt(prompt: str, skill: str, task_line_pattern: str) -> AugmentedPrompt:
  """H(h_t, s): inserts the skill block after the first line matching the pattern.

  Deterministic: without a matching line the block goes after the first line; when the
  task line is the last line (no trailing newline) the block is preceded by a newline.

  Args:
    prompt: the user message h_t (before the chat template).
    skill: the skill text s (already validated).
    task_line_pattern: a regex matching the task line: the acting format's
      `task_line_pattern`.
  Returns:
    the augmented text with the block's character span.
  """
  match = re.search(task_line_pattern, prompt)
  line_start = prompt.rfind("\n", 0, match.start()) + 1 if match else 0
  newline = prompt.find("\n", line_start)
  block = skill_block(skill)
  if newline == -1:  # the task line ends the text
    start = len(prompt)
    block = "\n" + block.rstrip("\n")
  else:
    start = newline + 1
  return AugmentedPrompt(text=prompt[:start] + block + prompt[start:], start=start,
                         end=start + len(block))
