"""H, the skill-augmented context, and the validity rule for skills.

H inserts a block headed "Episode-Level Skill", which tells the agent to refer to the skill
when it chooses its action. Where the block goes is `placement` (config key
`skill_placement`):
* `task_line` (the paper's, the default): whole lines right after the task line of the
  user message. Which line states the task is the env's business: each `AgentFormat` names
  it (`fmt.task_line_pattern`), so this module holds no env wording.
* `end`: at the end of the user message, next to where the response is generated. Small
  models follow in-context instructions weakly and read a hint next to the generation
  more (REFERENCE.md, "Self-distillation ... at small scale"); a small-model aid.
* `system`: the block is the chat's system message; the user message is untouched.
In the user message the text before and after the block is left byte-for-byte unchanged,
so a tokenizer that splits at line breaks (byte-level BPE pre-tokenizers do) gives
identical ids outside the block.
"""

from __future__ import annotations

import dataclasses
import re

MIN_SKILL_WORDS = 5

SKILL_HEADER = "## Episode-Level Skill"
SKILL_INSTRUCTION = ("Refer to the following skill, distilled from experience on this task, "
                     "when choosing your action:")


PLACEMENTS = ("task_line", "end", "system")


@dataclasses.dataclass(frozen=True)
class AugmentedPrompt:
  """The augmented user message and where the block sits: `text[start:end]` is the
  inserted block (an empty span when the block is the `system` message instead)."""
  text: str
  start: int
  end: int
  system: str | None = None


def skill_block(skill: str) -> str:
  """The inserted lines, each ending in a newline ("" gives the block without a skill:
  the `empty` control of `seed_jax.teacher_gap`)."""
  return f"{SKILL_HEADER}\n{SKILL_INSTRUCTION}\n{skill.strip()}\n"


def is_valid_skill(skill: object, min_words: int = MIN_SKILL_WORDS) -> bool:
  """A skill is a string of at least `min_words` whitespace-separated words."""
  return isinstance(skill, str) and len(skill.split()) >= min_words


def augment_prompt(prompt: str, skill: str, task_line_pattern: str,
                   placement: str = "task_line") -> AugmentedPrompt:
  """H(h_t, s): places the skill block as `placement` says (module docstring).

  Deterministic. `task_line`: after the first line matching the pattern; without a
  matching line the block goes after the first line; when the task line is the last line
  (no trailing newline) the block is preceded by a newline. `end`: after the message,
  separated by a blank line.

  Args:
    prompt: the user message h_t (before the chat template).
    skill: the skill text s (already validated; "" gives the block without a skill).
    task_line_pattern: a regex matching the task line: the acting format's
      `task_line_pattern`.
    placement: one of `PLACEMENTS`.
  Returns:
    the augmented text with the block's character span (and the system message).
  """
  if placement == "system":
    return AugmentedPrompt(text=prompt, start=len(prompt), end=len(prompt),
                           system=skill_block(skill).rstrip("\n"))
  if placement == "end":
    block = "\n\n" + skill_block(skill).rstrip("\n")
    return AugmentedPrompt(text=prompt + block, start=len(prompt), end=len(prompt) + len(block))
  if placement != "task_line":
    raise ValueError(f"skill placement {placement!r}: expected one of {PLACEMENTS}")
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


def skill_prompt_ids(encoder, message: str, skill: str | None, task_line_pattern: str,
                     placement: str = "task_line", image=None) -> tuple[str, list[int]]:
  """H(h_t, s) through the chat template: (the augmented user message, its prompt ids);
  with `skill` None, the plain message and its ids.

  The one way a skill reaches a prompt (the OPD teacher, Skill-GRPO's acting prompt, the
  skill-reading warm start, `seed_jax.teacher_gap`).

  Args:
    encoder: a `seed_jax.agent.prompts.PromptEncoder` (the policy's tokenizer and images).
    image: the turn's `ImageInputs`, where the message holds the image placeholder (H
      edits only the text around it).
  """
  if skill is None:
    return message, encoder.chat_ids(message, image=image)
  augmented = augment_prompt(message, skill, task_line_pattern, placement)
  return augmented.text, encoder.chat_ids(augmented.text, augmented.system, image)
