"""ALFWorld on its real engine: TextWorld's PDDL environment, driven one episode at a time.

`AlfWorldEnv` implements `seed_jax.envs.base.Env`. The engine (textworld + fast-downward)
applies the PDDL domain shipped with alfworld; the handcoded ALFWorld expert (or the
fast-downward planner) proposes an action for every state when asked, for oracle analysis
and tests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from seed_jax.envs.alfworld import games
from seed_jax.envs.base import StepResult, Task

_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
EXPERT_TYPES = ("handcoded", "planner")


class HandcodedExpert:
  """alfworld's handcoded expert, patched to follow the 0.4.2 command set and seeded.

  The 0.4.2 expert proposes "move X to Y" but only updates its inventory on actions that
  start with "put", so after one "move" it goes astray (pick-two then fails most games): the
  last action is translated back to the "put" form before the expert sees it. The expert
  draws from the module-level `random`; each episode gets its own seeded generator so that
  several envs in one process stay reproducible.
  """

  def __init__(self):
    from alfworld.agents.expert import handcoded_expert  # pylint: disable=g-import-not-at-top
    from alfworld.agents.expert import HandCodedTWAgent  # pylint: disable=g-import-not-at-top
    self._module = handcoded_expert
    self._agent = HandCodedTWAgent(max_steps=200)
    self._rng = random.Random(0)

  def reset(self, game_file: str, state: Any, seed: int) -> str:
    """Starts an episode from the initial game state; returns the first action ("look")."""
    self._rng = random.Random(seed)
    self._agent.reset(game_file)  # reads traj_data.json beside the game file
    self._agent.observe(state["feedback"])
    return "look"

  def act(self, state: Any, last_action: str) -> str:
    """The expert's next action after `last_action` led to `state`."""
    if last_action.startswith("move "):
      last_action = "put " + last_action[len("move "):].replace(" to ", " in ", 1)
    self._module.random = self._rng
    try:
      action = self._agent.act(state, 0, state["won"], last_action)
    except Exception:  # pylint: disable=broad-except  (the expert gave up: timeout / failed)
      return "look"
    return action if action in state["admissible_commands"] else "look"


class AlfWorldEnv:
  """One ALFWorld game at a time on the TextWorld PDDL engine (see `seed_jax.envs.base.Env`).

  Args:
    max_steps: the episode ends (done, not won) after this many steps.
    success_reward: reward of the step that wins (verl-agent uses 10).
    with_expert: every info also holds "expert_action".
    expert_type: "handcoded" (fast, heuristic) or "planner" (fast-downward replans each
      step; slow on large kitchens).
    upgrade_grammar: re-embed the installed domain and grammar in games made for older
      alfworld releases (see `games.embed_installed_logic`).
  """

  def __init__(self, max_steps: int = 50, success_reward: float = 10.0,
               with_expert: bool = False, expert_type: str = "handcoded",
               upgrade_grammar: bool = True):
    if expert_type not in EXPERT_TYPES:
      raise ValueError(f"expert_type {expert_type!r} is not one of {EXPERT_TYPES}")
    import textworld  # pylint: disable=g-import-not-at-top  (heavy; only inside workers)
    from textworld.envs.pddl import PddlEnv  # pylint: disable=g-import-not-at-top
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler  # pylint: disable=g-import-not-at-top
    self.max_steps = max_steps
    self.success_reward = success_reward
    self.with_expert = with_expert
    self.expert_type = expert_type
    self.upgrade_grammar = upgrade_grammar
    request_infos = textworld.EnvInfos(
        won=True, admissible_commands=True,
        facts=with_expert and expert_type == "handcoded",
        policy_commands=with_expert and expert_type == "planner")
    # The demangler turns ids such as Apple_bar__plus_00_dot_12... into "apple 1".
    self._engine = AlfredDemangler(PddlEnv(request_infos), shuffle=False)
    self._expert = HandcodedExpert() if with_expert and expert_type == "handcoded" else None
    self._task: Task | None = None
    self._state: Any = None
    self._steps = 0
    self._done = True
    self._expert_action = ""

  def reset(self, task: Task, seed: int) -> tuple[str, dict[str, Any]]:
    """Loads the task's game and starts it. Info holds "instruction" (the task sentence)."""
    game_file = task.payload["game_file"]
    game_data = json.loads(Path(game_file).read_text())
    if self.upgrade_grammar:
      game_data = games.embed_installed_logic(game_data)
    self._engine.load(game_data)
    self._state = self._engine.reset()
    self._task, self._steps, self._done = task, 0, False
    if self._expert is not None:
      self._expert_action = self._expert.reset(game_file, self._state, seed)
    info = self._info(action_valid=True)
    info["instruction"] = games.task_sentence(game_data["grammar"])
    return self._observation(), info

  def step(self, action: str) -> StepResult:
    """Applies one command; an inadmissible one is a no-op ("Nothing happens.")."""
    if self._task is None or self._done:
      raise RuntimeError("step() called before reset() or after the episode ended")
    action = " ".join(str(action).lower().split())
    action_valid = action in self._state["admissible_commands"]
    self._state, _, _ = self._engine.step(action)
    self._steps += 1
    won = bool(self._state["won"])
    self._done = won or self._steps >= self.max_steps
    if self._expert is not None and not self._done:
      self._expert_action = self._expert.act(self._state, action)
    return StepResult(
        observation=self._observation(),
        reward=self.success_reward if won else 0.0,
        done=self._done,
        info=self._info(action_valid=action_valid),
    )

  def close(self) -> None:
    self._engine.close()

  def _observation(self) -> str:
    # The banner is the same in every game and tells the agent nothing.
    return self._state["feedback"].replace(_BANNER, "").strip()

  def _info(self, action_valid: bool) -> dict[str, Any]:
    info = {
        "won": bool(self._state["won"]),
        "action_valid": action_valid,
        "admissible_actions": list(self._state["admissible_commands"]),
        "task_type": self._task.task_type,
        "steps": self._steps,
    }
    if self.with_expert:
      if self.expert_type == "planner":
        plan = self._state.get("policy_commands") or ["look"]
        self._expert_action = plan[0]
      info["expert_action"] = self._expert_action
    return info
