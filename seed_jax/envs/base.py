"""The environment protocol every seed_jax environment implements.

An environment is host-side Python state: it is reset to a `Task`, then stepped with the
action string the agent's response parsed to. Environments know nothing about prompts or
models; each family's `AgentFormat` (`seed_jax.envs.agent_format`) turns observations into
prompts and responses into actions, and `seed_jax.agent` runs the acting loop.

Each step returns a `StepResult`; its `info` always carries the keys in `REQUIRED_INFO_KEYS`
so the rollout loop, the analyzer and the metrics can treat every environment alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, runtime_checkable

SPLITS = ("train", "valid_seen", "valid_unseen")

# Keys every `StepResult.info` (and the info returned by `reset`) must hold.
#   won: bool                  the task is accomplished (success)
#   action_valid: bool         the env understood the action (False: a no-op was taken)
#   admissible_actions: list[str] | None   actions the env accepts now, where it knows them
#   task_type: str             the task family, for per-type success rates
REQUIRED_INFO_KEYS = ("won", "action_valid", "admissible_actions", "task_type")

# Optional info keys with one meaning across envs:
#   instruction: str           (reset info) the task sentence
#   expert_action: str         (envs built `with_expert`) the expert's next action
#   action_effective: bool     (step info) the action changed the env's state (False: a
#       Sokoban move into a wall or an immovable box); read by `rl.ineffective_penalty`
#   image: np.ndarray          uint8 `[H, W, 3]`, RGB: what an agent with vision sees now.
#       An env that has it puts it in every info (reset and step), one image per turn; its
#       format's prompt marks where it goes with `agent_format.IMAGE_PLACEHOLDER`.

# Procedurally generated envs (Sokoban, EZPoints) make a task from a seed. The seeds of
# split s are SPLIT_SEED_BASE[s] + i, so splits never share a task.
SPLIT_SEED_BASE = {"train": 0, "valid_seen": 1_000_000, "valid_unseen": 2_000_000}


@dataclasses.dataclass(frozen=True)
class Task:
  """One task an agent can be reset to.

  Attributes:
    env: name of the environment family (one of `seed_jax.envs.registry.ENV_NAMES`).
    task_id: unique, stable id within the env (e.g. the game folder); used for GRPO groups.
    split: one of `SPLITS`.
    task_type: the task family, e.g. "pick_and_place" or "hotpotqa".
    payload: env-specific, JSON-serialisable data needed to reset (paths, seeds, goals).
  """

  env: str
  task_id: str
  split: str
  task_type: str
  payload: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)

  def __post_init__(self):
    if self.split not in SPLITS:
      raise ValueError(f"Task {self.task_id!r}: split {self.split!r} is not one of {SPLITS}")


@dataclasses.dataclass
class StepResult:
  """What one `Env.step` returns."""

  observation: str
  reward: float
  done: bool
  info: dict[str, Any]


@runtime_checkable
class Env(Protocol):
  """A single episode-at-a-time environment, driven from the host."""

  def reset(self, task: Task, seed: int) -> tuple[str, dict[str, Any]]:
    """Starts an episode of `task`. Returns (first observation, info).

    The info holds `REQUIRED_INFO_KEYS` plus "instruction": the task sentence shown to the
    agent (e.g. "put a hot potato in countertop").
    """
    ...

  def step(self, action: str) -> StepResult:
    """Applies one action string. An action the env does not understand is a no-op step
    with `info["action_valid"] = False`, never an exception."""
    ...

  def close(self) -> None:
    ...


def seeded_tasks(env: str, split: str, num_tasks: Mapping[str, int], task_type: str,
                 **payload: Any) -> list[Task]:
  """The tasks of `split` of a procedurally generated env, in seed order.

  Args:
    env: the env family the tasks are for.
    split: one of `SPLITS`.
    num_tasks: how many tasks each split has (the env config's "num_tasks").
    task_type: every task's type.
    **payload: the generator's settings, stored in every task's payload.

  Returns:
    `num_tasks[split]` tasks; task i has id f"{env}-{split}-{i}" and payload
    `{"seed": SPLIT_SEED_BASE[split] + i, **payload}`.
  """
  if split not in SPLIT_SEED_BASE:
    raise ValueError(f"{env}: unknown split {split!r}; known: {tuple(SPLIT_SEED_BASE)}")
  return [Task(env=env, task_id=f"{env}-{split}-{index}", split=split, task_type=task_type,
               payload={"seed": SPLIT_SEED_BASE[split] + index, **payload})
          for index in range(num_tasks[split])]


def check_info(info: dict[str, Any], where: str) -> dict[str, Any]:
  """Raises a clear error when an env forgot one of the required info keys."""
  missing = [k for k in REQUIRED_INFO_KEYS if k not in info]
  if missing:
    raise KeyError(f"{where}: info lacks required keys {missing}; has {sorted(info)}")
  return info
