"""Expert demonstrations: the env's expert plays each task once, through the env pool.

They serve two purposes: privileged information for the `oracle` analyzer (the plan that
solves the task) and the optional behaviour-cloning warm start (the user messages the
agent would have seen, with the expert's action as the target response).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from seed_jax.envs.base import AgentFormat, Task, Turn


@dataclasses.dataclass
class Demonstration:
  """One expert episode: the rendered user message of every turn and the expert's action."""

  task_id: str
  task_type: str
  instruction: str
  messages: list[str]
  actions: list[str]
  won: bool


def expert_response(action: str) -> str:
  """The response text the agent is cloned on: a short think block, then the action."""
  return f"<think>Next I should {action}.</think><action>{action}</action>"


def collect_demonstrations(pool, fmt: AgentFormat, tasks: Sequence[Task], max_turns: int,
                           seed: int = 0) -> list[Demonstration]:
  """Plays every task with the expert (`pool` must be built `with_expert=True`).

  An episode ends when the env says done, when the expert has no action, or at
  `max_turns`.
  """
  resets = pool.reset(list(tasks), [seed * 1_000_003 + i for i in range(len(tasks))])
  demos = [Demonstration(t.task_id, t.task_type, info.get("instruction", ""), [], [], False)
           for t, (_, info) in zip(tasks, resets)]
  observations = [obs for obs, _ in resets]
  infos = [info for _, info in resets]
  histories: list[list[Turn]] = [[] for _ in tasks]
  live = [not info.get("failed") for info in infos]
  for turn in range(max_turns):
    actions = [infos[i].get("expert_action") or None if live[i] else None
               for i in range(len(tasks))]
    if not any(actions):
      break
    for i, action in enumerate(actions):
      if action is not None:
        demos[i].messages.append(fmt.render(demos[i].instruction, histories[i],
                                            observations[i],
                                            infos[i].get("admissible_actions"), turn + 1))
        demos[i].actions.append(action)
      else:
        live[i] = False
    for i, result in enumerate(pool.step(actions)):
      if result is None:
        continue
      histories[i].append(Turn(observations[i], actions[i]))
      observations[i], infos[i] = result.observation, result.info
      demos[i].won = bool(result.info.get("won", False))
      live[i] = not result.done
  return demos
