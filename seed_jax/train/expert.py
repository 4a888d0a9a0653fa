"""Expert demonstrations: the env's expert plays each task once, through the acting loop.

They serve two purposes: privileged information for the `oracle` analyzer (the plan that
solves the task) and the optional behaviour-cloning warm start (the user messages the
agent would have seen, with the expert's action rendered as a response by the env's own
format, so that the format parses it back to that action).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from seed_jax.agent.loop import Episode, run_episodes
from seed_jax.agent.policies import expert_policy
from seed_jax.envs.agent_format import AgentFormat
from seed_jax.envs.base import Task
from seed_jax.seed.analyzer import oracle_skill


@dataclasses.dataclass
class Demonstration:
  """One expert episode.

  Attributes:
    messages: the rendered user message of every turn.
    responses: the response the expert gave at each turn (`fmt.render_response`): the
      behaviour-cloning target for the message.
    actions: the action the env got at each turn (the plan the oracle analyzer reads).
    won: the expert won the episode.
  """

  task_id: str
  task_type: str
  instruction: str
  messages: list[str]
  responses: list[str]
  actions: list[str]
  won: bool

  def oracle_skill(self) -> str:
    """The oracle analyzer's skill for this game: its expert plan, written as a success's
    skill (`seed_jax.seed.analyzer.oracle_skill`)."""
    info = {"goal": self.instruction, "task_type": self.task_type, "expert_plan": self.actions}
    return oracle_skill(info, won=True)[1]

  def cloning_pairs(self) -> list[tuple[str, str]]:
    """(user message, target response) of every step: behaviour cloning's examples (an
    episode the turn limit cut short still shows correct moves)."""
    return list(zip(self.messages, self.responses))


def to_demonstration(episode: Episode) -> Demonstration:
  steps = [s.decision for s in episode.steps]
  return Demonstration(episode.task.task_id, episode.task.task_type, episode.instruction,
                       [d.prompt for d in steps], [d.response for d in steps],
                       [d.action for d in steps], episode.won)


def collect_demonstrations(pool, fmt: AgentFormat, tasks: Sequence[Task], max_turns: int,
                           seed: int = 0, desc: str | None = None) -> list[Demonstration]:
  """Plays every task once with the expert (`pool` must be built `with_expert=True`).

  An episode ends when the env says done, when the expert has no action, or at
  `max_turns`.
  """
  episodes = run_episodes(pool, tasks, expert_policy(fmt), max_turns=max_turns, seed=seed,
                          desc=desc)
  return [to_demonstration(e) for e in episodes]
