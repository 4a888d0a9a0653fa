"""The host-side acting loop: environments in the pool, responses from the sampler.

Every turn, each live row's user message is rendered by the env's `AgentFormat`, wrapped
in the chat template, tokenized and sampled in one batch; responses are parsed into
actions (a malformed one becomes the no-op action, flagged invalid) and stepped in the
pool. Finished episodes become `seed_jax.seed.batch.Trajectory` records carrying exactly
the token ids and sampler log-probs that the train step re-scores.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tqdm.auto import tqdm

from seed_jax.envs.base import AgentFormat, Task, Turn
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.seed.skills import augment_prompt


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


def chat_prompt_ids(tokenizer: Tokenizer, user_message: str) -> list[int]:
  """Token ids of one user turn in the chat template, with the generation prompt."""
  return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": user_message}]))


@dataclasses.dataclass
class _Row:
  task: Task
  group_id: str
  traj_id: str
  instruction: str = ""
  observation: str = ""
  admissible: list[str] | None = None
  history: list[Turn] = dataclasses.field(default_factory=list)
  steps: list[StepRecord] = dataclasses.field(default_factory=list)
  reward: float = 0.0
  scores: dict[str, float] = dataclasses.field(default_factory=dict)
  won: bool = False
  done: bool = False
  failed: str = ""


def _render(fmt: AgentFormat, row: _Row, skill: str | None) -> str:
  message = fmt.render(row.instruction, row.history, row.observation, row.admissible,
                       len(row.steps) + 1)
  return augment_prompt(message, skill).text if skill else message


def _fit_prompt(fmt: AgentFormat, tokenizer: Tokenizer, row: _Row, skill: str | None,
                limit: int, stats: dict[str, int]) -> tuple[str, list[int]]:
  """The user message and its ids, dropping the oldest history until it fits `limit`."""
  history = row.history
  while True:
    message = _render(fmt, dataclasses.replace(row, history=history), skill)
    ids = chat_prompt_ids(tokenizer, message)
    if len(ids) <= limit:
      return message, ids
    if not history:
      stats["truncated_prompts"] += 1
      return message, ids[-limit:]
    history = history[1:]


def play_episodes(sampler: Sampler, tokenizer: Tokenizer, pool, fmt: AgentFormat,
                  tasks: Sequence[Task], group_size: int, spec: RolloutSpec, *, seed: int,
                  group_prefix: str = "", acting_skills: dict[str, str] | None = None,
                  desc: str = "rollout") -> tuple[list[Trajectory], dict[str, float]]:
  """Plays `group_size` episodes of every task; returns trajectories and statistics.

  Args:
    pool: an `EnvPool` (or anything with its reset/step API) sized for the rows.
    tasks: the batch's tasks; task i's episodes form GRPO group `f"{group_prefix}{i}"`.
    seed: base seed of the env resets and of sampling (each turn draws from its own
      seed derived from `seed` and the turn), so an iteration replays exactly.
    acting_skills: Skill-GRPO: task_type -> skill placed in the acting prompt.
    desc: label of the progress bar (one tick per turn, live episodes shown).
  Returns:
    (trajectories in task-major order, stats: episodes, steps, invalid actions, success,
    failed episodes, truncated prompts).
  """
  rows = [_Row(task, f"{group_prefix}{i}", f"{group_prefix}{i}.{k}")
          for i, task in enumerate(tasks) for k in range(group_size)]
  resets = pool.reset([r.task for r in rows], [seed * 1_000_003 + i for i in range(len(rows))])
  for row, (observation, info) in zip(rows, resets):
    row.observation, row.instruction = observation, info.get("instruction", "")
    row.admissible = info.get("admissible_actions")
    if info.get("failed"):
      row.done, row.failed = True, str(info["failed"])
  sampling = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                            top_p=spec.top_p, stop_strings=tuple(fmt.stop_strings))
  stats = {"truncated_prompts": 0}
  bar = tqdm(total=spec.max_turns, desc=desc, unit="turn", leave=False)
  for turn in range(spec.max_turns):
    live = [i for i, r in enumerate(rows) if not r.done]
    if not live:
      break
    bar.set_postfix(live=len(live))
    prompts = [_fit_prompt(fmt, tokenizer, rows[i], (acting_skills or {}).get(
        rows[i].task.task_type), spec.max_prompt_tokens, stats) for i in live]
    out = sampler.generate([ids for _, ids in prompts], sampling, seed=seed * 7919 + turn)
    parsed = [fmt.parse(text) for text in out.texts]
    actions: list[str | None] = [None] * len(rows)
    for i, p in zip(live, parsed):
      actions[i] = p.action
    results = pool.step(actions)
    for k, i in enumerate(live):
      row, result = rows[i], results[i]
      row.steps.append(StepRecord(
          prompt_ids=prompts[k][1], response_ids=out.tokens[k],
          sampler_logprobs=out.logprobs[k], action_valid=parsed[k].valid,
          observation=row.observation, response_text=out.texts[k],
          prompt_text=prompts[k][0]))
      row.history.append(Turn(row.observation, parsed[k].action))
      row.reward += float(result.reward)
      row.observation = result.observation
      row.admissible = result.info.get("admissible_actions")
      row.won = bool(result.info.get("won", False))
      row.scores.update({key: float(value) for key, value in result.info.items()
                         if key.endswith("_score")})
      if result.done or turn == spec.max_turns - 1:
        row.done = True
        row.failed = str(result.info.get("failed", ""))
    bar.update(1)
  bar.close()
  trajectories = [Trajectory(
      task_id=r.task.task_id, group_id=r.group_id, traj_id=r.traj_id, won=r.won,
      episode_reward=r.reward, steps=r.steps, task=r.instruction,
      info={"goal": r.instruction, "task_type": r.task.task_type, "failed": r.failed,
            **r.scores})
      for r in rows]
  num_steps = sum(len(r.steps) for r in rows)
  stats.update(
      episodes=len(rows), steps=num_steps,
      success=sum(r.won for r in rows) / max(len(rows), 1),
      mean_return=sum(r.reward for r in rows) / max(len(rows), 1),
      invalid_action_rate=sum(not s.action_valid for r in rows for s in r.steps) / max(
          num_steps, 1),
      failed_episodes=sum(bool(r.failed) for r in rows),
      mean_turns=num_steps / max(len(rows), 1))
  return trajectories, stats
