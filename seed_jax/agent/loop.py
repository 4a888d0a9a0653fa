"""The one acting loop: episodes of many tasks in an env pool, a policy choosing the actions.

Training rollouts (a model samples responses, `seed_jax.train.rollout`), expert
demonstrations (`seed_jax.train.expert`) and the `play` command all run episodes here;
only the policy differs (`seed_jax.agent.policies`). Every turn the policy sees the live
episodes and returns one `Decision` each; the loop steps the pool with the decisions'
actions and books what happened, so turn limits, failed envs and the statistics are the
same for every policy.

The loop is deterministic given the pool's results and the policy, so every host of a
multi-host run (each sees every row's result) runs it in lockstep.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

from tqdm.auto import tqdm

from seed_jax.envs.agent_format import AgentFormat, Turn
from seed_jax.envs.base import StepResult, Task


@dataclasses.dataclass
class Decision:
  """A policy's choice for one episode's turn.

  Attributes:
    action: the env command to step with (a format's parse of the response; the no-op
      `INVALID_ACTION` when the response broke the format). None ends the episode here,
      without a step (the expert has nothing more to do, a human quit).
    valid: whether the response followed the format; an invalid step is counted, and the
      trainer charges it the invalid-action penalty.
    prompt: the user message the policy answered ("" when it read none).
    response: the text it wrote ("" when it wrote none).
    record: policy-specific data kept with the step (the model policy: its `StepRecord`).
  """

  action: str | None
  valid: bool = True
  prompt: str = ""
  response: str = ""
  record: Any = None


@dataclasses.dataclass
class StepTaken:
  """One step of an episode: what the agent saw, what it decided, what the env answered."""

  observation: str
  decision: Decision
  reward: float
  info: dict[str, Any]


@dataclasses.dataclass
class Episode:
  """One episode as the loop runs it and a policy sees it.

  Attributes:
    task: the task; group_id / traj_id: its GRPO group and its own id.
    instruction: the task sentence from the reset info.
    observation, info: the env's latest observation and info (admissible actions, the
      expert's next action, ...).
    history: (observation, action) of every step taken, oldest first.
    steps: every step taken, with the policy's decision.
    reward: the sum of the step rewards. won: the last info's "won".
    done: the episode is over; failed: why its env failed ("" when it did not).
    scores: the last value of every `*_score` key the env reported (e.g. WebShop's).
  """

  task: Task
  group_id: str
  traj_id: str
  instruction: str = ""
  observation: str = ""
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  history: list[Turn] = dataclasses.field(default_factory=list)
  steps: list[StepTaken] = dataclasses.field(default_factory=list)
  reward: float = 0.0
  won: bool = False
  done: bool = False
  failed: str = ""
  scores: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def admissible_actions(self) -> list[str] | None:
    return self.info.get("admissible_actions")

  @property
  def step_number(self) -> int:
    """The 1-based number of the step about to be taken."""
    return len(self.history) + 1

  def user_message(self, fmt: AgentFormat, history: Sequence[Turn] | None = None) -> str:
    """The format's user message for the step about to be taken; `history` replaces the
    episode's own (a model policy drops old turns to fit its prompt budget)."""
    turns = self.history if history is None else list(history)
    return fmt.render(self.instruction, turns, self.observation, self.admissible_actions,
                      self.step_number)


class Policy(Protocol):
  """Chooses the next action of every live episode.

  Called once per turn with the live episodes (in row order) and the 0-based turn index;
  returns one `Decision` per episode, in the same order.
  """

  def __call__(self, episodes: list[Episode], turn: int) -> list[Decision]:
    ...


def reset_seeds(seed: int, num_rows: int) -> list[int]:
  """The env seed of every row: distinct per row, and per base seed."""
  return [seed * 1_000_003 + row for row in range(num_rows)]


def start_episodes(pool, tasks: Sequence[Task], *, seed: int, group_size: int = 1,
                   group_prefix: str = "") -> list[Episode]:
  """`group_size` episodes of every task, task-major (task i's form group
  `f"{group_prefix}{i}"`, ids `"{group}.{k}"`), reset in `pool` with `reset_seeds`; an
  episode whose reset failed is done and says why."""
  episodes = [Episode(task, f"{group_prefix}{i}", f"{group_prefix}{i}.{k}")
              for i, task in enumerate(tasks) for k in range(group_size)]
  resets = pool.reset([e.task for e in episodes], reset_seeds(seed, len(episodes)))
  for episode, (observation, info) in zip(episodes, resets):
    episode.observation, episode.info = observation, info
    episode.instruction = info.get("instruction", "")
    if info.get("failed"):
      episode.done, episode.failed = True, str(info["failed"])
  return episodes


def run_episodes(pool, tasks: Sequence[Task], policy: Policy, *, max_turns: int, seed: int,
                 group_size: int = 1, group_prefix: str = "", desc: str | None = None,
                 on_step: Callable[[Episode, StepTaken], None] | None = None
                 ) -> list[Episode]:
  """Plays `group_size` episodes of every task to the end; returns them task-major.

  An episode ends when the env says done, at `max_turns` steps, when its env fails (a
  failed reset or step: `failed` says why, the other episodes go on) or when the policy
  decides no action.

  Args:
    pool: an `EnvPool`, `InProcessPool` or `HostShardedPool` (reset/step API).
    tasks: task i's episodes form group `f"{group_prefix}{i}"`, ids `"{group}.{k}"`.
    policy: see `Policy`.
    seed: base of the env reset seeds (`reset_seeds`).
    desc: label of a progress bar (a tick per turn); None: no bar.
    on_step: called after every step (e.g. to print it).
  """
  episodes = start_episodes(pool, tasks, seed=seed, group_size=group_size,
                            group_prefix=group_prefix)
  bar = tqdm(total=max_turns, desc=desc, unit="turn", leave=False, disable=desc is None)
  for turn in range(max_turns):
    live = [e for e in episodes if not e.done]
    if not live:
      break
    bar.set_postfix(live=len(live))
    decisions = policy(live, turn)
    if len(decisions) != len(live):
      raise ValueError(f"the policy gave {len(decisions)} decisions for {len(live)} episodes")
    chosen = {id(e): d for e, d in zip(live, decisions)}
    actions = [chosen[id(e)].action if id(e) in chosen else None for e in episodes]
    for episode, decision in zip(live, decisions):
      if decision.action is None:
        episode.done = True  # the policy has nothing more to do
    results = pool.step(actions)
    for episode, action, result in zip(episodes, actions, results):
      if action is None:
        continue
      book_step(episode, chosen[id(episode)], result, last_turn=turn == max_turns - 1)
      if on_step is not None:
        on_step(episode, episode.steps[-1])
    bar.update(1)
  bar.close()
  return episodes


def book_step(episode: Episode, decision: Decision, result: StepResult | None,
               last_turn: bool) -> None:
  """Records one step and the env's answer in the episode."""
  if result is None:  # a pool that answers a stepped row with nothing: that env is gone
    result = StepResult("", 0.0, True, {"won": False, "failed": "no step result"})
  episode.steps.append(StepTaken(episode.observation, decision, float(result.reward),
                                 result.info))
  episode.history.append(Turn(episode.observation, decision.action))
  episode.reward += float(result.reward)
  episode.observation, episode.info = result.observation, result.info
  episode.won = bool(result.info.get("won", False))
  episode.scores.update({key: float(value) for key, value in result.info.items()
                         if key.endswith("_score")})
  if result.done or last_turn:
    episode.done = True
    episode.failed = str(result.info.get("failed", ""))


def episode_stats(episodes: Sequence[Episode]) -> dict[str, float]:
  """episodes, steps, success, mean_return, invalid_action_rate (over steps), invalid
  actions, ineffective_action_rate (over steps: valid ones the env said changed nothing),
  ineffective actions, failed_episodes, mean_turns."""
  num_episodes = max(len(episodes), 1)
  num_steps = sum(len(e.steps) for e in episodes)
  invalid = sum(not s.decision.valid for e in episodes for s in e.steps)
  ineffective = sum(s.decision.valid and not s.info.get("action_effective", True)
                    for e in episodes for s in e.steps)
  return {
      "episodes": len(episodes),
      "steps": num_steps,
      "success": sum(e.won for e in episodes) / num_episodes,
      "mean_return": sum(e.reward for e in episodes) / num_episodes,
      "invalid_actions": invalid,
      "invalid_action_rate": invalid / max(num_steps, 1),
      "ineffective_actions": ineffective,
      "ineffective_action_rate": ineffective / max(num_steps, 1),
      "failed_episodes": sum(bool(e.failed) for e in episodes),
      "mean_turns": num_steps / num_episodes,
  }
