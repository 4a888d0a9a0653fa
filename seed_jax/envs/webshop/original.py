"""An adapter to the original WebShop text environment, for users who installed it.

Needs the WebShop repository (https://github.com/princeton-nlp/WebShop) on the Python path
(its `web_agent_site` package), its product data (the 1,000-product small set or the
1.18M full set), spaCy models and its Lucene search index, set up with WebShop's own
`setup.sh`. None of that can be downloaded here, so this module is import-guarded and
untested in this repository. Select it with `--config.source=original`; goal i of the
original is reset with `session=i`, and the paper's split applies (goals 0-499 evaluate).
"""

from __future__ import annotations

from typing import Any

from seed_jax.envs import base

_HEADER_END = " [SEP] "


def _import_text_env():
  try:
    # pylint: disable-next=g-import-not-at-top
    from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
  except ImportError as e:
    raise ImportError(
        "the original WebShop is not installed: clone princeton-nlp/WebShop, run its setup.sh "
        "(product data, spaCy models, search index) and put it on PYTHONPATH; or use the "
        "embedded shop (--config.source=embedded)") from e
  return WebAgentTextEnv


def count_goals(num_products: int | None, human_goals: bool) -> int:
  """How many goals the original environment holds (loads it once)."""
  env = _import_text_env()(observation_mode="text", num_products=num_products,
                           human_goals=human_goals)
  return len(env.server.goals)


class OriginalWebShopEnv(base.Env):
  """The original `WebAgentTextEnv` behind the seed_jax env protocol."""

  def __init__(self, num_products: int | None, human_goals: bool, max_steps: int,
               success_reward: float = 10.0):
    self._env = _import_text_env()(observation_mode="text", num_products=num_products,
                                   human_goals=human_goals)
    self._max_steps = max_steps
    self._success_reward = success_reward
    self._task: base.Task | None = None
    self._steps = 0

  def _strip_header(self, observation: str) -> str:
    # Drop "WebShop [SEP] Instruction: [SEP] <goal> [SEP]": the prompt states the goal.
    instruction = self._env.instruction_text
    at = observation.find(instruction)
    if at < 0:
      return observation
    return observation[at + len(instruction):].lstrip().removeprefix(_HEADER_END.strip()).strip()

  def _admissible(self) -> list[str]:
    available = self._env.get_available_actions()
    actions = ["search[<your query>]"] if available["has_search_bar"] else []
    return actions + [f"click[{c}]" for c in available["clickables"]]

  def _info(self, action_valid: bool, score: float) -> dict[str, Any]:
    return {"won": score >= 1.0, "action_valid": action_valid,
            "admissible_actions": self._admissible(), "task_type": self._task.task_type,
            "webshop_score": score}

  def reset(self, task: base.Task, seed: int) -> tuple[str, dict[str, Any]]:
    del seed
    self._task, self._steps = task, 0
    observation, _ = self._env.reset(session=task.payload["goal_index"])
    info = self._info(action_valid=True, score=0.0)
    info["instruction"] = self._env.instruction_text.removeprefix("Instruction:").strip(" [SEP]")
    return self._strip_header(observation), info

  def step(self, action: str) -> base.StepResult:
    self._steps += 1
    available = self._env.get_available_actions()
    action = action.strip()
    if action.startswith("search["):
      valid = available["has_search_bar"]
    else:
      valid = action.startswith("click[") and action[6:-1] in available["clickables"]
    if valid:
      observation, score, done, _ = self._env.step(action)
    else:
      observation, score, done = self._env.observation, 0.0, False
    done = done or self._steps >= self._max_steps
    won = score >= 1.0
    return base.StepResult(self._strip_header(observation), self._success_reward if won else 0.0,
                           done, self._info(valid, score))

  def close(self) -> None:
    self._env.close()
