"""Training rollouts: the acting loop (`seed_jax.agent.loop`) with a model as the policy.

Every turn, each live episode's user message is rendered by the env's `AgentFormat`,
wrapped in the chat template, tokenized and sampled in one batch; responses are parsed
into actions (a malformed one becomes the no-op action, flagged invalid) and stepped in the
pool. Finished episodes become `seed_jax.seed.batch.Trajectory` records carrying exactly
the token ids and sampler log-probs that the train step re-scores.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

from tqdm.auto import tqdm

from seed_jax.agent.loop import (Decision, Episode, book_step, episode_stats, run_episodes,
                                 start_episodes)
from seed_jax.agent.prompts import PromptEncoder
from seed_jax.checks import non_negative, positive, positive_int, require
from seed_jax.envs.agent_format import AgentFormat, shows_images
from seed_jax.envs.base import Task
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.models.vision_language import ImageInputs
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.sampling.slots import SlotDecoder
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
    continuous: no turn barrier (`run_episodes_continuous`): an episode steps as soon as
      its response is complete, and its next prompt enters a free decode slot.
  """

  max_turns: int
  temperature: float = 1.0
  top_p: float = 1.0
  max_new_tokens: int = 512
  max_prompt_tokens: int = 2048
  continuous: bool = False

  def __post_init__(self):
    require(self, ("max_turns", "max_new_tokens", "max_prompt_tokens"), positive_int,
            "a positive integer")
    require(self, "temperature", non_negative, "a non-negative number")
    require(self, "top_p", lambda p: positive(p) and p <= 1, "in (0, 1]")
    require(self, "continuous", lambda v: isinstance(v, bool), "True or False")


class Prompt(NamedTuple):
  """One turn's prompt: the user message, its chat ids and the image it shows (or None)."""
  message: str
  ids: list[int]
  image: ImageInputs | None = None


class ModelPolicy:
  """A `seed_jax.agent.loop.Policy` that samples every live episode's response in one batch.

  Each decision's `record` is the step's `StepRecord` (prompt and response ids, sampler
  log-probs, validity, texts, the turn's image). `truncated_prompts` counts prompts that
  still exceeded the budget with no history left and kept only their last tokens.

  A format that `uses_images` shows each turn the env's info["image"] in its prompt
  (`PromptEncoder`): a vision-language model's `PromptEncoder` must be given.

  Args:
    sampler: the model.
    tokenizer: its `Tokenizer` (text), or its `PromptEncoder` (needed for images).
    fmt: the env family's format (prompts, stop strings, parsing).
    spec: sampling settings and the prompt budget.
    seed: base of the per-turn sampling seeds (turn t samples with `seed * 7919 + t`).
    acting_skills: Skill-GRPO: task_type -> skill, inserted into the acting prompt by H.
    task_skills: task_id -> skill, which takes precedence (`seed_jax.teacher_gap` acts
      with each task's own skill; "" places the block without a skill).
    skill_placement: where H puts the skill (`seed_jax.seed.skills.PLACEMENTS`).
  """

  def __init__(self, sampler: Sampler, tokenizer: Tokenizer | PromptEncoder, fmt: AgentFormat,
               spec: RolloutSpec, seed: int, acting_skills: dict[str, str] | None = None,
               task_skills: dict[str, str] | None = None, skill_placement: str = "task_line"):
    self.encoder = tokenizer if isinstance(tokenizer, PromptEncoder) else PromptEncoder(
        tokenizer)
    if shows_images(fmt) and not self.encoder.sees_images:
      raise ValueError(f"{type(fmt).__name__} shows the agent images; the policy needs a "
                       f"vision-language model (config.model.name)")
    self.sampler, self.fmt, self.spec = sampler, fmt, spec
    self.seed = seed
    self.acting_skills = acting_skills or {}
    self.task_skills = task_skills or {}
    self.skill_placement = skill_placement
    self.sampling = SamplingParams(max_new_tokens=spec.max_new_tokens,
                                   temperature=spec.temperature, top_p=spec.top_p,
                                   stop_strings=tuple(fmt.stop_strings))
    self.truncated_prompts = 0

  def turn_image(self, episode: Episode) -> ImageInputs | None:
    """The image the episode's prompt shows this turn (None for a text format)."""
    if not shows_images(self.fmt):
      return None
    if "image" not in episode.info:
      raise ValueError(f"{type(self.fmt).__name__} shows images but episode "
                       f"{episode.traj_id}'s env gave none (info['image'])")
    return self.encoder.encode_image(episode.info["image"])

  def fit_prompt(self, episode: Episode) -> Prompt:
    """The user message, its chat ids and the turn's image, dropping the oldest history
    turns until the ids fit `spec.max_prompt_tokens` (then keeping the last tokens: a
    prompt with an image must fit whole, since its vision tokens cannot be cut)."""
    task = episode.task
    skill = (self.task_skills[task.task_id] if task.task_id in self.task_skills
             else self.acting_skills.get(task.task_type))
    image = self.turn_image(episode)
    history = episode.history
    while True:
      message, ids = skill_prompt_ids(self.encoder, episode.user_message(self.fmt, history),
                                      skill, self.fmt.task_line_pattern, self.skill_placement,
                                      image)
      if len(ids) <= self.spec.max_prompt_tokens:
        return Prompt(message, ids, image)
      if not history:
        if image is not None:
          raise ValueError(f"rollout.max_prompt_tokens={self.spec.max_prompt_tokens} is too "
                           f"small for a prompt with its image ({len(ids)} tokens)")
        self.truncated_prompts += 1
        return Prompt(message, ids[-self.spec.max_prompt_tokens:], image)
      history = history[1:]

  def __call__(self, episodes: list[Episode], turn: int) -> list[Decision]:
    prompts = [self.fit_prompt(e) for e in episodes]
    images = [p.image for p in prompts]
    with_images = {"images": images} if any(i is not None for i in images) else {}
    out = self.sampler.generate([p.ids for p in prompts], self.sampling,
                                seed=self.seed * 7919 + turn, **with_images)
    return [self.decide(episode, prompts[k], out.tokens[k], out.logprobs[k], out.texts[k])
            for k, episode in enumerate(episodes)]

  def decide(self, episode: Episode, prompt: Prompt, response_ids: list[int], logprobs,
             text: str) -> Decision:
    """The decision of one sampled response: parsed into an action (a malformed one is
    the no-op, flagged invalid), with the step's `StepRecord`."""
    parsed = self.fmt.parse(text)
    record = StepRecord(prompt_ids=prompt.ids, response_ids=response_ids,
                        sampler_logprobs=logprobs, action_valid=parsed.valid,
                        observation=episode.observation, response_text=text,
                        prompt_text=prompt.message, image=prompt.image)
    return Decision(parsed.action, parsed.valid, prompt.message, text, record)


def run_episodes_continuous(pool, tasks: Sequence[Task], policy: ModelPolicy, *,
                            max_turns: int, seed: int, group_size: int = 1,
                            group_prefix: str = "", desc: str | None = None
                            ) -> list[Episode]:
  """`run_episodes` without the turn barrier: every episode's response is decoded in a
  slot of one `SlotDecoder`; the moment it is complete the episode steps, and its next
  prompt takes the next free slot while the other responses go on decoding.

  Episode e's turn t samples from the stream `(seed, e, t)` (`SlotDecoder`), so a run is a
  function of the seeds whatever finishes first; greedy responses equal the
  turn-synchronous loop's.
  """
  if shows_images(policy.fmt):
    raise ValueError("rollout.continuous=True does not yet show images (the slot decoder "
                     "prefills text only); set rollout.continuous=False for this env")
  episodes = start_episodes(pool, tasks, seed=seed, group_size=group_size,
                            group_prefix=group_prefix)
  live = [e for e in episodes if not e.done]
  slots = SlotDecoder(policy.sampler, policy.sampling, num_slots=max(1, len(live)),
                      max_prompt_len=policy.spec.max_prompt_tokens, seed=seed)
  index = {id(e): i for i, e in enumerate(episodes)}
  waiting, in_slot = list(live), {}
  bar = tqdm(total=len(live) * max_turns, desc=desc, unit="step", leave=False,
             disable=desc is None)
  while waiting or in_slot:
    entering = list(zip(slots.free_slots(), waiting))
    waiting = waiting[len(entering):]
    prompts = {slot: policy.fit_prompt(e) for slot, e in entering}
    slots.insert([(slot, prompts[slot].ids, index[id(e)], len(e.steps))
                  for slot, e in entering])
    in_slot.update({slot: (e, prompts[slot]) for slot, e in entering})
    actions: list[str | None] = [None] * len(episodes)
    decided = []
    for slot in slots.run():
      episode, prompt = in_slot.pop(slot)
      tokens, logprobs, _, text = slots.take(slot)
      decision = policy.decide(episode, prompt, tokens, logprobs, text)
      if decision.action is None:
        episode.done = True  # the policy has nothing more to do
      else:
        actions[index[id(episode)]] = decision.action
        decided.append((episode, decision))
    if not decided:
      continue
    results = pool.step(actions)
    for episode, decision in decided:
      book_step(episode, decision, results[index[id(episode)]],
                last_turn=len(episode.steps) == max_turns - 1)
      if not episode.done:
        waiting.append(episode)
      bar.update(1)
  bar.close()
  return episodes


def to_trajectory(episode: Episode) -> Trajectory:
  """A finished model episode as the batch builder and the analyzer read it (each step's
  record with whether the env said its action changed anything)."""
  return Trajectory(
      task_id=episode.task.task_id, group_id=episode.group_id, traj_id=episode.traj_id,
      won=episode.won, episode_reward=episode.reward,
      steps=[dataclasses.replace(step.decision.record,
                                 action_effective=bool(step.info.get("action_effective", True)))
             for step in episode.steps], task=episode.instruction,
      info={"goal": episode.instruction, "task_type": episode.task.task_type,
            "failed": episode.failed, **episode.scores})


def play_episodes(sampler: Sampler, tokenizer: Tokenizer | PromptEncoder, pool,
                  fmt: AgentFormat, tasks: Sequence[Task], group_size: int,
                  spec: RolloutSpec, *, seed: int,
                  group_prefix: str = "", acting_skills: dict[str, str] | None = None,
                  task_skills: dict[str, str] | None = None, skill_placement: str = "task_line",
                  desc: str | None = "rollout") -> tuple[list[Trajectory], dict[str, float]]:
  """Plays `group_size` episodes of every task with the model; returns trajectories and
  statistics.

  Args:
    tokenizer: the model's `Tokenizer`, or its `PromptEncoder` (`ModelPolicy`).
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
  play = run_episodes_continuous if spec.continuous else run_episodes
  episodes = play(pool, tasks, policy, max_turns=spec.max_turns, seed=seed,
                  group_size=group_size, group_prefix=group_prefix, desc=desc)
  stats = episode_stats(episodes)
  stats["truncated_prompts"] = policy.truncated_prompts
  return [to_trajectory(e) for e in episodes], stats
