"""A fake env family for the acting-loop tests: walk `forward` to the goal, no model.

`LineWorld` is reset to a task whose payload says how far the goal is ("goal") and,
optionally, at which step its env raises ("crash_at"; 0: at reset). `forward` moves one
cell toward the goal, `back` one away, except at the start, where a wall stands behind
(the move changes nothing: info "action_effective" false); anything else is an invalid
no-op. Reaching the goal
wins 10 and ends the episode. The expert always says `forward`.
"""

from __future__ import annotations

from seed_jax.envs.agent_format import (AgentFormat, ParsedAction, Turn, parse_action,
                                        render_think_action)
from seed_jax.envs.base import StepResult, Task

ACTIONS = ["forward", "back"]


def line_task(index: int, goal: int, crash_at: int | None = None) -> Task:
  payload = {"goal": goal} if crash_at is None else {"goal": goal, "crash_at": crash_at}
  return Task(env="line", task_id=f"line-{index}", split="train", task_type=f"goal{goal}",
              payload=payload)


class LineWorld:
  """The fake env (see the module docstring); `seeds` records every reset's seed."""

  def __init__(self, with_expert: bool = True):
    self.with_expert = with_expert
    self.seeds: list[int] = []

  def reset(self, task: Task, seed: int):
    self.task, self.position, self.steps = task, 0, 0
    self.seeds.append(seed)
    if task.payload.get("crash_at") == 0:
      raise RuntimeError("reset crashed")
    return "at 0", self._info(valid=True)

  def step(self, action: str) -> StepResult:
    self.steps += 1
    if self.task.payload.get("crash_at") == self.steps:
      raise RuntimeError("step crashed")
    valid = action in ACTIONS
    before = self.position
    if valid:
      self.position = self.position + 1 if action == "forward" else max(self.position - 1, 0)
    won = self.position == self.task.payload["goal"]
    observation = f"at {self.position}" if valid else "Nothing happens."
    info = self._info(valid, won)
    info["action_effective"] = self.position != before
    return StepResult(observation, 10.0 if won else 0.0, won, info)

  def _info(self, valid: bool, won: bool = False) -> dict:
    info = {"won": won, "action_valid": valid, "admissible_actions": list(ACTIONS),
            "task_type": self.task.task_type,
            "instruction": f"walk to {self.task.payload['goal']}"}
    if self.with_expert:
      info["expert_action"] = "forward"
    return info

  def close(self) -> None:
    pass


class LineFormat(AgentFormat):
  """A minimal `AgentFormat` for LineWorld: the think/action convention."""

  stop_strings = ("</action>",)
  task_line_pattern = r"Task:"

  def render(self, instruction: str, history: list[Turn], observation: str,
             admissible_actions: list[str] | None, step: int) -> str:
    past = " | ".join(f"{t.observation} -> {t.action}" for t in history)
    return (f"Task: {instruction}\nStep {step}. History: {past}\nNow: {observation}\n"
            f"Actions: {admissible_actions}")

  def parse(self, response: str) -> ParsedAction:
    return parse_action(response)

  def render_response(self, action: str) -> str:
    return render_think_action(f"I go {action}.", action)
