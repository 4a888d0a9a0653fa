"""The analyzer's prompt: one finished trajectory as a transcript, fitted to a token budget.

One builder serves stage-1 SFT (the prompt the policy learns to answer) and RL-time
analysis (the prompt the policy decodes its skill from), so the analyzer sees one format.
The prompt states the task, the outcome and every step (observation, response, action
validity), then asks for `{"episode_summary", "episode_skill"}` JSON. When it exceeds the
budget (measured in tokens after the chat template, with the real tokenizer), it is cut
where it matters least, in this order:
  1. middle steps go (the first step, which shows the starting state, stays while at least
     the last step fits beside it), replaced by a line "[... k earlier steps omitted ...]";
  2. the one step left keeps the head of its observation;
  3. then the tail of its response (where the action is).
The task line, the outcome line and the answer instructions are never cut.

A `Transcript` is the text-only view of a trajectory: what the prompt needs, and what
stage 1 stores so that SFT prompts can be rebuilt, with the current budget, from disk.

Envs that show the agent images (visual Sokoban, EZPoints) are described, not shown: each
step's observation is the env's text state (Sokoban's board as text; the EZPoints task
line names the cards), not the image. Why: the analyzer reads a whole episode, up to 15
turns, and an image per turn would multiply its prompt (a 3B VLM's board image alone is
over a hundred tokens) and its decode cost; the env's text is exact where a small VLM's
reading of pixels is not, and hindsight analysis may read privileged state anyway (the
oracle reads the expert's plan); and one text format serves stage-1 labels, the policy
analyzer and every env alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from seed_jax.models.tokenizer import Tokenizer
from seed_jax.seed.batch import Trajectory
from seed_jax.models.tokenizer import chat_prompt_ids

SHORTENED = "[shortened]"


@dataclasses.dataclass(frozen=True)
class TranscriptStep:
  observation: str
  response: str
  action_valid: bool


@dataclasses.dataclass(frozen=True)
class Transcript:
  """What the analyzer reads of an episode: task, outcome, and the steps as text."""
  task: str
  won: bool
  reward: float
  steps: tuple[TranscriptStep, ...]

  @classmethod
  def of(cls, traj: Trajectory) -> "Transcript":
    return cls(task=traj.task, won=bool(traj.won), reward=float(traj.episode_reward),
               steps=tuple(TranscriptStep(s.observation, s.response_text, bool(s.action_valid))
                           for s in traj.steps))

  def to_record(self) -> dict[str, Any]:
    """JSON-serialisable; `from_record` inverts it."""
    return {"task": self.task, "won": self.won, "reward": self.reward,
            "steps": [{"observation": s.observation, "response": s.response,
                       "action_valid": s.action_valid} for s in self.steps]}

  @classmethod
  def from_record(cls, record: dict[str, Any]) -> "Transcript":
    return cls(task=record["task"], won=bool(record["won"]), reward=float(record["reward"]),
               steps=tuple(TranscriptStep(s["observation"], s["response"],
                                          bool(s["action_valid"])) for s in record["steps"]))


@dataclasses.dataclass(frozen=True)
class AnalyzerPrompt:
  """The analyzer's user message and what fitting it to the budget did.

  Attributes:
    text: the user message (before the chat template): what an external analyzer is sent
      and what stage 1 stores.
    ids: its token ids in the chat template with the generation prompt (what the policy
      analyzer decodes from and the SFT prompt); None when built without a tokenizer.
    truncated: whether anything was cut to fit the budget.
    omitted_steps: how many middle steps were left out.
  """
  text: str
  ids: list[int] | None
  truncated: bool = False
  omitted_steps: int = 0


@dataclasses.dataclass(frozen=True)
class _Cut:
  """Which steps are shown (0-based, ascending) and how much of the last one."""
  kept: tuple[int, ...]
  observation_chars: int | None = None  # None: whole observations
  response_chars: int | None = None     # None: whole responses


def omitted_line(count: int) -> str:
  return f"[... {count} earlier step{'s' if count != 1 else ''} omitted ...]"


def _guidance(won: bool) -> str:
  if won:
    return ("The episode succeeded. Distil the reusable workflow that made it work: the "
            "decision rule and the order of actions.")
  return ("The episode failed. Name the core mistake and the warning signs that should make "
          "the agent avoid it.")


def _step_lines(number: int, step: TranscriptStep, observation_chars: int | None,
                response_chars: int | None) -> list[str]:
  observation, response = step.observation, step.response
  if observation_chars is not None and len(observation) > observation_chars:
    observation = f"{observation[:observation_chars]} ... {SHORTENED}"
  if response_chars is not None and len(response) > response_chars:
    # The tail holds the action, the part the analyzer must judge.
    response = f"{SHORTENED} ... {response[len(response) - response_chars:]}"
  return [f"Step {number}", f"Observation: {observation}", f"Response: {response}",
          f"Action valid: {'true' if step.action_valid else 'false'}", ""]


def render(transcript: Transcript, cut: _Cut | None = None) -> str:
  """The prompt text showing the steps `cut` keeps (all by default)."""
  steps = transcript.steps
  cut = cut or _Cut(tuple(range(len(steps))))
  outcome = "SUCCESS" if transcript.won else "FAILURE"
  lines = [
      "You are reviewing one finished episode of an agent acting in a text environment.",
      f"Task: {transcript.task}",
      f"Outcome: {outcome} (reward {transcript.reward:g})",
      f"Steps taken: {len(steps)}",
      "",
      "Trajectory:",
  ]
  previous = -1
  for index in cut.kept:
    if index > previous + 1:
      lines += [omitted_line(index - previous - 1), ""]
    lines += _step_lines(index + 1, steps[index], cut.observation_chars, cut.response_chars)
    previous = index
  lines += [
      _guidance(transcript.won),
      "Write the skill as one short instruction addressed to the agent for its next attempt "
      "at this kind of task (at least 5 words), not as a retrospective.",
      'Answer with JSON only: {"episode_summary": "<what happened>", '
      '"episode_skill": "<the skill>"}',
  ]
  return "\n".join(lines)


def _step_ladder(num_steps: int) -> list[tuple[int, ...]]:
  """Kept-step sets from all steps down to the last one alone, each a subset of the one
  before: the middle goes first (the step after the first, then onwards), the first step
  next, the last step never."""
  if num_steps <= 1:
    return [tuple(range(num_steps))]
  ladder = [(0,) + tuple(range(first_tail, num_steps)) for first_tail in range(1, num_steps)]
  return ladder + [(num_steps - 1,)]


def _largest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
  """The largest x in [low, high] with fits(x), for fits monotone (true up to a point)."""
  if not fits(low):
    return None
  while low < high:
    middle = (low + high + 1) // 2
    if fits(middle):
      low = middle
    else:
      high = middle - 1
  return low


def build_analyzer_prompt(trajectory: Trajectory | Transcript, tokenizer: Tokenizer | None,
                          max_tokens: int | None) -> AnalyzerPrompt:
  """The analyzer's prompt for `trajectory`, at most `max_tokens` tokens in the chat template.

  Without a tokenizer (or budget) the whole transcript is returned unmeasured, `ids` None.
  Raises ValueError when even the task, outcome and instructions with the last step cut to
  nothing exceed the budget (a configuration error: the budget is far too small).
  """
  transcript = trajectory if isinstance(trajectory, Transcript) else Transcript.of(trajectory)
  full = render(transcript)
  if tokenizer is None:
    return AnalyzerPrompt(full, None)
  ids = chat_prompt_ids(tokenizer, full)
  if not max_tokens or len(ids) <= max_tokens:
    return AnalyzerPrompt(full, ids)

  measured: dict[_Cut, tuple[str, list[int]]] = {}

  def fits(cut: _Cut) -> bool:
    if cut not in measured:
      text = render(transcript, cut)
      measured[cut] = (text, chat_prompt_ids(tokenizer, text))
    return len(measured[cut][1]) <= max_tokens

  def done(cut: _Cut) -> AnalyzerPrompt:
    text, cut_ids = measured[cut]
    return AnalyzerPrompt(text, cut_ids, truncated=True,
                          omitted_steps=len(transcript.steps) - len(cut.kept))

  ladder = [_Cut(kept) for kept in _step_ladder(len(transcript.steps))]
  # ladder[0] (every step) is known not to fit; the rest shrink step by step.
  rung = _largest_fitting(0, len(ladder) - 2, lambda i: fits(ladder[len(ladder) - 1 - i]))
  if rung is not None:
    return done(ladder[len(ladder) - 1 - rung])
  last = ladder[-1].kept
  if last:
    step = transcript.steps[last[0]]
    chars = _largest_fitting(0, len(step.observation),
                             lambda n: fits(_Cut(last, observation_chars=n)))
    if chars is not None:
      return done(_Cut(last, observation_chars=chars))
    chars = _largest_fitting(0, len(step.response),
                             lambda n: fits(_Cut(last, observation_chars=0, response_chars=n)))
    if chars is not None:
      return done(_Cut(last, observation_chars=0, response_chars=chars))
  floor = len(measured[_Cut(last, 0, 0)][1]) if last else len(ids)
  raise ValueError(f"analyzer.max_prompt_tokens={max_tokens} is too small: the task, outcome "
                   f"and instructions alone take {floor} tokens")


def build_analyzer_prompts(trajectories: Sequence[Trajectory | Transcript],
                           tokenizer: Tokenizer | None, max_tokens: int | None
                           ) -> list[AnalyzerPrompt]:
  return [build_analyzer_prompt(t, tokenizer, max_tokens) for t in trajectories]
