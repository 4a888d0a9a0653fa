"""Training rollouts: the acting loop (`seed_jax.agent.loop`) with a model as the policy.

Every turn, each live episode's user message is rendered by the env's `AgentFormat`,
wrapped in the chat template, tokenized and sampled in one batch; responses are parsed
into actions (a malformed one becomes the no-op action, flagged invalid) and stepped in the
pool. Finished episodes become `seed_jax.seed.batch.Trajectory` records carrying exactly
the token ids and sampler log-probs that the train step re-scores.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from seed_jax.agent.loop import Decision, Episode, episode_stats, run_episodes
from seed_jax.checks import non_negative, positive, positive_int, require
from seed_jax.envs.agent_format import AgentFormat
from seed_jax.envs.base import Task
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.seed.skills import skill_prompt_ids


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
  """How episodes are played.

  Attributes:
    max_turns: turn limit (the env may end earlier).
    temperature, top_p, max_new_tokens: sampling of each response.
    max_prompt_tokens: longer prompts drop their oldest history turns, then keep their
      last tokens (counted in the stats).
  """

  max_turns: int
  temperature: float = 1.0
  top_p: float = 1.0
  max_new_tokens: int = 512
  max_prompt_tokens: int = 2048

  def __post_init__(self):
    require(self, ("max_turns", "max_new_tokens", "max_prompt_tokens"), positive_int,
            "a positive integer")
    require(self, "temperature", non_negative, "a non-negative number")
    require(self, "top_p", lambda p: positive(p) and p <= 1, "in (0, 1]")


class ModelPolicy:
  """A `seed_jax.agent.loop.Policy` that samples every live episode's response in one batch.

  Each decision's `record` is the step's `StepRecord` (prompt and response ids, sampler
  log-probs, validity, texts). `truncated_prompts` counts prompts that still exceeded the
  budget with no history left and kept only their last tokens.

  Args:
    sampler, tokenizer: the model and its tokenizer.
    fmt: the env family's format (prompts, stop strings, parsing).
    spec: sampling settings and the prompt budget.
    seed: base of the per-turn sampling seeds (turn t samples with `seed * 7919 + t`).
    acting_skills: Skill-GRPO: task_type -> skill, inserted into the acting prompt by H.
    task_skills: task_id -> skill, which takes precedence (`seed_jax.teacher_gap` acts
      with each task's own skill; "" places the block without a skill).
    skill_placement: where H puts the skill (`seed_jax.seed.skills.PLACEMENTS`).
  """

  def __init__(self, sampler: Sampler, tokenizer: Tokenizer, fmt: AgentFormat,
               spec: RolloutSpec, seed: int, acting_skills: dict[str, str] | None = None,
               task_skills: dict[str, str] | None = None, skill_placement: str = "task_line"):
    self.sampler, self.tokenizer, self.fmt, self.spec = sampler, tokenizer, fmt, spec
    self.seed = seed
    self.acting_skills = acting_skills or {}
    self.task_skills = task_skills or {}
    self.skill_placement = skill_placement
    self.sampling = SamplingParams(max_new_tokens=spec.max_new_tokens,
                                   temperature=spec.temperature, top_p=spec.top_p,
                                   stop_strings=tuple(fmt.stop_strings))
    self.truncated_prompts = 0

  def fit_prompt(self, episode: Episode) -> tuple[str, list[int]]:
    """The user message and its chat ids, dropping the oldest history turns until they fit
    `spec.max_prompt_tokens` (then keeping the last tokens)."""
    task = episode.task
    skill = (self.task_skills[task.task_id] if task.task_id in self.task_skills
             else self.acting_skills.get(task.task_type))
    history = episode.history
    while True:
      message, ids = skill_prompt_ids(self.tokenizer, episode.user_message(self.fmt, history),
                                      skill, self.fmt.task_line_pattern, self.skill_placement)
      if len(ids) <= self.spec.max_prompt_tokens:
        return message, ids
      if not history:
        self.truncated_prompts += 1
        return message, ids[-self.spec.max_prompt_tokens:]
      history = history[1:]

  def __call__(self, episodes: list[Episode], turn: int) -> list[Decision]:
    prompts = [self.fit_prompt(e) for e in episodes]
    out = self.sampler.generate([ids for _, ids in prompts], self.sampling,
                                seed=self.seed * 7919 + turn)
    decisions = []
    for k, episode in enumerate(episodes):
      text, (message, ids) = out.texts[k], prompts[k]
      parsed = self.fmt.parse(text)
      record = StepRecord(prompt_ids=ids, response_ids=out.tokens[k],
                          sampler_logprobs=out.logprobs[k], action_valid=parsed.valid,
                          observation=episode.observation, response_text=text,
                          prompt_text=message)
      decisions.append(Decision(parsed.action, parsed.valid, message, text, record))
    return decisions


def to_trajectory(episode: Episode) -> Trajectory:
  """A finished model episode as the batch builder and the analyzer read it."""
  return Trajectory(
      task_id=episode.task.task_id, group_id=episode.group_id, traj_id=episode.traj_id,
      won=episode.won, episode_reward=episode.reward,
      steps=[step.decision.record for step in episode.steps], task=episode.instruction,
      info={"goal": episode.instruction, "task_type": episode.task.task_type,
            "failed": episode.failed, **episode.scores})


def play_episodes(sampler: Sampler, tokenizer: Tokenizer, pool, fmt: AgentFormat,
                  tasks: Sequence[Task], group_size: int, spec: RolloutSpec, *, seed: int,
                  group_prefix: str = "", acting_skills: dict[str, str] | None = None,
                  task_skills: dict[str, str] | None = None, skill_placement: str = "task_line",
                  desc: str | None = "rollout") -> tuple[list[Trajectory], dict[str, float]]:
  """Plays `group_size` episodes of every task with the model; returns trajectories and
  statistics.

  Args:
    pool: an `EnvPool` (or anything with its reset/step API) sized for the rows.
    tasks: the batch's tasks; task i's episodes form GRPO group `f"{group_prefix}{i}"`.
    seed: base seed of the env resets and of sampling (each turn draws from its own
      seed derived from `seed` and the turn), so an iteration replays exactly.
    acting_skills: Skill-GRPO: task_type -> skill placed in the acting prompt.
    task_skills, skill_placement: per-task skills and where H puts them (ModelPolicy).
    desc: label of the progress bar (one tick per turn, live episodes shown).
  Returns:
    (trajectories in task-major order, stats: episodes, steps, invalid actions and their
    rate, success, mean return and turns, failed episodes, truncated prompts).
  """
  policy = ModelPolicy(sampler, tokenizer, fmt, spec, seed, acting_skills, task_skills,
                       skill_placement)
  episodes = run_episodes(pool, tasks, policy, max_turns=spec.max_turns, seed=seed,
                          group_size=group_size, group_prefix=group_prefix, desc=desc)
  stats = episode_stats(episodes)
  stats["truncated_prompts"] = policy.truncated_prompts
  return [to_trajectory(e) for e in episodes], stats
