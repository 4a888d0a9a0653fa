"""Training rollouts: the acting loop with a model policy, on a fake sampler and fake env.

The fake tokenizer is byte-level (one id per byte of the chat text), so prompt budgets are
counted in characters; the fake sampler writes each response from the prompt it decodes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seed_jax.envs.agent_format import INVALID_ACTION
from seed_jax.envs.pool import InProcessPool
from seed_jax.sampling.sampler import SampleOutput
from seed_jax.seed import advantages
from seed_jax.seed import batch as batch_lib
from seed_jax.seed.skills import SKILL_HEADER
from seed_jax.models.tokenizer import chat_prompt_ids
from seed_jax.train.rollout import RolloutSpec, play_episodes
from tests.agent.fakes import LineFormat, LineWorld, line_task

GOOD = "<think>onward</think><action>forward</action>"


class ByteTokenizer:
  """One id per byte; the chat template wraps the user message in markers."""

  def apply_chat_template(self, messages):
    return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<bot>"

  def encode(self, text):
    return list(text.encode())


@dataclasses.dataclass
class ScriptedSampler:
  """Answers each prompt with `respond(prompt text, seed)`; records every request."""

  respond: object
  requests: list = dataclasses.field(default_factory=list)

  def generate(self, prompt_ids, sampling, seed=0):
    self.requests.append((sampling, seed, [bytes(ids).decode() for ids in prompt_ids]))
    texts = [self.respond(bytes(ids).decode(), seed) for ids in prompt_ids]
    tokens = [list(text.encode()) for text in texts]
    return SampleOutput(tokens=tokens, logprobs=[np.full(len(t), -0.5, np.float32) for t in tokens],
                        lengths=[len(t) for t in tokens], stop_reasons=["stop_string"] * len(texts),
                        texts=texts)


def rollout(respond, tasks, group_size=1, spec=RolloutSpec(max_turns=5), **kwargs):
  sampler = ScriptedSampler(respond)
  pool = InProcessPool(LineWorld)
  trajs, stats = play_episodes(sampler, ByteTokenizer(), pool, LineFormat(), tasks, group_size,
                               spec, seed=kwargs.pop("seed", 3), desc=None, **kwargs)
  return sampler, trajs, stats


def test_trajectories_carry_what_the_train_step_rescores():
  tokenizer = ByteTokenizer()
  sampler, trajs, stats = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=2)],
                                  group_size=2, group_prefix="it1:")
  assert [t.traj_id for t in trajs] == ["it1:0.0", "it1:0.1"]
  traj = trajs[0]
  assert (traj.task_id, traj.group_id, traj.won, traj.episode_reward) == ("line-0", "it1:0",
                                                                          True, 10.0)
  assert traj.task == "walk to 2"
  assert traj.info == {"goal": "walk to 2", "task_type": "goal2", "failed": ""}
  first, second = traj.steps
  assert first.prompt_text.startswith("Task: walk to 2\nStep 1.")
  assert first.prompt_ids == chat_prompt_ids(tokenizer, first.prompt_text)
  assert first.response_text == GOOD and first.response_ids == list(GOOD.encode())
  assert list(first.sampler_logprobs) == [-0.5] * len(GOOD)
  assert first.action_valid and first.observation == "at 0"
  assert second.observation == "at 1" and "at 0 -> forward" in second.prompt_text
  assert stats["episodes"] == 2 and stats["success"] == 1.0 and stats["steps"] == 4


def test_sampling_uses_the_format_stop_strings_and_a_seed_per_turn():
  spec = RolloutSpec(max_turns=5, temperature=0.7, top_p=0.9, max_new_tokens=33)
  sampler, _, _ = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=2)], spec=spec, seed=3)
  sampling, _, _ = sampler.requests[0]
  assert sampling.stop_strings == ("</action>",)
  assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (0.7, 0.9, 33)
  assert [seed for _, seed, _ in sampler.requests] == [3 * 7919, 3 * 7919 + 1]


def test_an_invalid_response_is_flagged_stepped_as_a_no_op_and_charged_the_penalty():
  def first_turn_garbled(prompt, seed):
    return "I will go forward." if "Step 1." in prompt else GOOD

  _, trajs, stats = rollout(first_turn_garbled, [line_task(0, goal=1)])
  steps = trajs[0].steps
  assert [s.action_valid for s in steps] == [False, True]
  assert "Nothing happens." in steps[1].prompt_text  # the env got the no-op
  assert f"-> {INVALID_ACTION}" in steps[1].prompt_text
  assert stats["invalid_action_rate"] == 0.5
  scores = advantages.step_scores(
      [trajs[0].episode_reward],
      advantages.step_penalties([[s.action_valid for s in steps]], invalid_penalty=0.1))
  np.testing.assert_allclose(scores[0], [9.9, 10.0])


def test_a_move_that_changed_nothing_is_marked_and_charged_only_when_asked():
  def back_first(prompt, seed):  # into the wall behind the start, then on to the goal
    return GOOD.replace("forward", "back") if "Step 1." in prompt else GOOD

  _, trajs, stats = rollout(back_first, [line_task(0, goal=1)])
  steps = trajs[0].steps
  assert [(s.action_valid, s.action_effective) for s in steps] == [(True, False), (True, True)]
  assert stats["ineffective_action_rate"] == 0.5 and stats["invalid_action_rate"] == 0.0
  charged = batch_lib.BatchConfig(response_len=64, max_prompt_len=4096, ineffective_penalty=0.1)
  batch, _ = batch_lib.build_batch(trajs, charged)
  scores = [9.9, 10.0]  # reward 10, the blocked step charged 0.1; a group of one trajectory
  mean, std = np.mean(scores), np.std(scores, ddof=1)
  np.testing.assert_allclose(batch["advantages"], [(s - mean) / (std + 1e-6) for s in scores],
                             rtol=1e-5)
  paper = dataclasses.replace(charged, ineffective_penalty=0.0)
  np.testing.assert_allclose(batch_lib.build_batch(trajs, paper)[0]["advantages"], [0.0, 0.0])


def test_long_prompts_drop_their_oldest_turns_first():
  tokenizer, fmt = ByteTokenizer(), LineFormat()
  bare = len(chat_prompt_ids(tokenizer, fmt.render("walk to 9", [], "at 3", ["forward", "back"],
                                                   4)))
  spec = RolloutSpec(max_turns=4, max_prompt_tokens=bare + 20)  # room for one past turn
  _, trajs, stats = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=9)], spec=spec)
  last = trajs[0].steps[3]
  assert "History: at 2 -> forward\n" in last.prompt_text  # turns 1 and 2 dropped
  assert "Step 4." in last.prompt_text  # the step number still counts from the start
  assert len(last.prompt_ids) <= bare + 20 and stats["truncated_prompts"] == 0
  # A roomy budget keeps the whole history.
  _, roomy, _ = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=9)],
                        spec=RolloutSpec(max_turns=4, max_prompt_tokens=10_000))
  assert "History: at 0 -> forward | at 1 -> forward | at 2 -> forward\n" in (
      roomy[0].steps[3].prompt_text)


def test_a_prompt_too_long_without_history_keeps_its_last_tokens_and_is_counted():
  spec = RolloutSpec(max_turns=2, max_prompt_tokens=40)
  sampler, trajs, stats = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=9)], spec=spec)
  step = trajs[0].steps[0]
  assert step.prompt_ids == chat_prompt_ids(ByteTokenizer(), step.prompt_text)[-40:]
  assert stats["truncated_prompts"] == 2  # one per turn
  assert all(len(prompt) == 40 for _, _, prompts in sampler.requests for prompt in prompts)


def test_acting_skills_go_into_the_acting_prompt_after_the_task_line():
  skill = "Always walk forward, never back, until you arrive."
  _, trajs, _ = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=1), line_task(1, goal=2)],
                        acting_skills={"goal2": skill})
  without, with_skill = trajs[0].steps[0].prompt_text, trajs[1].steps[0].prompt_text
  assert SKILL_HEADER not in without
  assert with_skill.startswith(f"Task: walk to 2\n{SKILL_HEADER}\n")
  assert skill in with_skill


def test_a_crashed_env_fails_its_trajectory_only():
  sampler = ScriptedSampler(lambda prompt, seed: GOOD)
  tasks = [line_task(0, goal=2, crash_at=1), line_task(1, goal=2)]
  trajs, stats = play_episodes(sampler, ByteTokenizer(), InProcessPool(LineWorld), LineFormat(),
                               tasks, 1, RolloutSpec(max_turns=5), seed=0, desc=None)
  assert "step crashed" in trajs[0].info["failed"] and not trajs[0].won
  assert len(trajs[0].steps) == 1  # the sampled step is kept
  assert trajs[1].won and stats["failed_episodes"] == 1


@pytest.mark.parametrize("group_size", [1, 3])
def test_stats_keep_the_keys_the_trainer_logs(group_size):
  _, _, stats = rollout(lambda prompt, seed: GOOD, [line_task(0, goal=1)], group_size=group_size)
  assert {"episodes", "steps", "success", "mean_return", "invalid_action_rate",
          "failed_episodes", "mean_turns", "truncated_prompts"} <= set(stats)
