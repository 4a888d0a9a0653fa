"""The analyzer prompt builder: the format, and how a long transcript is fitted to a
token budget measured with the real tokenizer in the chat template."""

from __future__ import annotations

import re

import pytest

from seed_jax.seed import transcript as tr
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.models.tokenizer import chat_prompt_ids

TASK = "put a cool apple in countertop"


def _step(i: int, observation: str | None = None, response: str | None = None):
  return StepRecord(
      [1], [2], [-0.1], action_valid=i % 3 != 0,
      observation=observation or f"You arrive at cabinet {i}. On the cabinet {i}, you see a "
                                 f"mug {i}, a plate, and a spoon.",
      response_text=response or f"<think>The apple is not in cabinet {i}.</think>"
                                f"<action>go to cabinet {i + 1}</action>")


def _traj(num_steps: int = 40, won: bool = False, steps=None) -> Trajectory:
  steps = steps if steps is not None else [_step(i) for i in range(1, num_steps + 1)]
  return Trajectory(task_id="t", group_id="g", traj_id="0", won=won,
                    episode_reward=10.0 * won, steps=steps, task=TASK)


def _shown_steps(text: str) -> list[int]:
  return [int(n) for n in re.findall(r"^Step (\d+)$", text, re.MULTILINE)]


def test_prompt_holds_task_outcome_steps_and_answer_format():
  prompt = tr.render(tr.Transcript.of(_traj(num_steps=3)))
  for part in (f"Task: {TASK}", "Outcome: FAILURE (reward 0)", "Steps taken: 3",
               "Step 1", "Observation: You arrive at cabinet 1.",
               "Response: <think>The apple is not in cabinet 1.</think>"
               "<action>go to cabinet 2</action>",
               "Action valid: true", "Step 3", "Action valid: false", "core mistake",
               '{"episode_summary": "<what happened>", "episode_skill": "<the skill>"}'):
    assert part in prompt, part
  won = tr.render(tr.Transcript.of(_traj(num_steps=3, won=True)))
  assert "Outcome: SUCCESS (reward 10)" in won and "reusable workflow" in won


def test_a_prompt_within_budget_is_whole_and_measured_in_the_chat_template(tokenizer):
  traj = _traj(num_steps=3)
  prompt = tr.build_analyzer_prompt(traj, tokenizer, max_tokens=4096)
  assert not prompt.truncated and prompt.omitted_steps == 0
  assert prompt.text == tr.render(tr.Transcript.of(traj))
  assert prompt.ids == chat_prompt_ids(tokenizer, prompt.text)
  # Without a tokenizer (tests, no budget) the text is the same, unmeasured.
  assert tr.build_analyzer_prompt(traj, None, None) == tr.AnalyzerPrompt(prompt.text, None)


@pytest.mark.parametrize("budget", [1024, 600])
def test_middle_steps_go_first_and_the_cut_is_marked(tokenizer, budget):
  prompt = tr.build_analyzer_prompt(_traj(num_steps=40), tokenizer, max_tokens=budget)
  assert prompt.truncated and len(prompt.ids) <= budget
  assert prompt.ids == chat_prompt_ids(tokenizer, prompt.text)
  shown = _shown_steps(prompt.text)
  omitted = 40 - len(shown)
  assert prompt.omitted_steps == omitted > 0
  # The first step and an unbroken run of the last steps, the gap marked in between.
  assert shown == [1] + list(range(40 - len(shown) + 2, 41))
  assert f"[... {omitted} earlier steps omitted ...]" in prompt.text
  for part in (f"Task: {TASK}", "Outcome: FAILURE", "Steps taken: 40",
               "<action>go to cabinet 41</action>", '"episode_skill"'):
    assert part in prompt.text, part
  # Nothing is dropped that fits: one more step would exceed the budget.
  more = tr.render(tr.Transcript.of(_traj(num_steps=40)),
                   tr._Cut(tuple(s - 1 for s in [1] + list(range(shown[1] - 1, 41)))))
  assert len(chat_prompt_ids(tokenizer, more)) > budget


def test_a_larger_budget_never_shows_fewer_steps(tokenizer):
  shown = [len(_shown_steps(tr.build_analyzer_prompt(_traj(40), tokenizer, b).text))
           for b in (300, 500, 800, 1500, 3000)]
  assert shown == sorted(shown) and shown[0] < shown[-1]


def test_a_long_last_step_loses_the_tail_of_its_observation_then_the_head_of_its_response(
    tokenizer):
  page = " ".join(f"item{i} costs {i} dollars [SEP]" for i in range(400))
  steps = [_step(1), _step(2, observation=page)]
  prompt = tr.build_analyzer_prompt(_traj(steps=steps), tokenizer, max_tokens=400)
  assert prompt.truncated and prompt.omitted_steps == 1 and len(prompt.ids) <= 400
  assert _shown_steps(prompt.text) == [2] and "[... 1 earlier step omitted ...]" in prompt.text
  assert "Observation: item0 costs 0 dollars" in prompt.text
  assert f"... {tr.SHORTENED}" in prompt.text and "item399" not in prompt.text
  assert "<action>go to cabinet 3</action>" in prompt.text

  thinking = "<think>" + "I wonder. " * 600 + "</think><action>click[buy now]</action>"
  steps = [_step(1, observation=page, response=thinking)]
  prompt = tr.build_analyzer_prompt(_traj(steps=steps), tokenizer, max_tokens=300)
  assert prompt.truncated and len(prompt.ids) <= 300
  assert f"Response: {tr.SHORTENED} ... " in prompt.text
  assert prompt.text.count("click[buy now]") == 1  # the action, at the tail, survives
  assert f"Task: {TASK}" in prompt.text and "Outcome: FAILURE" in prompt.text


def test_a_budget_below_the_fixed_parts_is_a_configuration_error(tokenizer):
  with pytest.raises(ValueError, match="max_prompt_tokens=50 is too small"):
    tr.build_analyzer_prompt(_traj(5), tokenizer, max_tokens=50)


def test_transcript_records_round_trip():
  transcript = tr.Transcript.of(_traj(num_steps=4, won=True))
  assert tr.Transcript.from_record(transcript.to_record()) == transcript
  assert transcript.steps[2].action_valid is False
