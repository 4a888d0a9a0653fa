"""Scripted policies of the acting loop: the env's expert, a random agent, a human.

The model policy, which samples responses from an LLM, lives with the trainer's rollouts
(`seed_jax.train.rollout.ModelPolicy`). Each policy here is a `seed_jax.agent.loop.Policy`.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from seed_jax.agent.loop import Decision, Episode, Policy
from seed_jax.envs.agent_format import INVALID_ACTION, AgentFormat

# An env family's random agent: (rng, observation, info) -> action, for envs whose
# admissible actions are not a list (search queries, WebShop's search box).
EnvRandomAction = Callable[[random.Random, str, dict[str, Any]], str]


def expert_policy(fmt: AgentFormat) -> Policy:
  """The env's expert (`info["expert_action"]`; the pool must be built `with_expert`),
  acting through the format as a model would.

  The expert's action is rendered into a response (`fmt.render_response`) and parsed back;
  the env gets the parsed action. So a demonstration's (user message, response) pairs are
  exactly what behaviour cloning trains on, and an action the format cannot carry shows up
  as an invalid step instead of a silently wrong target. An episode without an expert
  action ends.
  """

  def policy(episodes: list[Episode], turn: int) -> list[Decision]:
    del turn
    decisions = []
    for episode in episodes:
      action = episode.info.get("expert_action")
      if not action:
        decisions.append(Decision(None))
        continue
      response = fmt.render_response(action)
      parsed = fmt.parse(response)
      decisions.append(Decision(parsed.action, parsed.valid, episode.user_message(fmt),
                                response))
    return decisions
  return policy


def random_policy(seed: int, env_random_action: EnvRandomAction | None = None) -> Policy:
  """A uniformly random admissible action ("help" left out), or the env's own random
  action where it lists none; the no-op `INVALID_ACTION` when it has neither."""
  rng = random.Random(seed)

  def policy(episodes: list[Episode], turn: int) -> list[Decision]:
    del turn
    decisions = []
    for episode in episodes:
      admissible = [a for a in episode.admissible_actions or [] if a != "help"]
      if admissible:
        decisions.append(Decision(rng.choice(admissible)))
      elif env_random_action is not None:
        decisions.append(Decision(env_random_action(rng, episode.observation, episode.info)))
      else:
        decisions.append(Decision(INVALID_ACTION, valid=False))
    return decisions
  return policy


def human_policy(ask: Callable[[str], str] | None = None,
                 show: Callable[[str], None] | None = None, quit_word: str = "quit") -> Policy:
  """You type the action of each episode in turn (an env command as the env takes it).

  Typing `quit_word` (or end of input) ends that episode; an empty line is an invalid
  no-op, as a response without an action would be.

  Args:
    ask, show: read a line and print text (default: `input` and `print`, looked up at each
      call).
  """
  ask = ask or (lambda prompt: input(prompt))  # pylint: disable=unnecessary-lambda
  show = show or (lambda text: print(text))  # pylint: disable=unnecessary-lambda

  def policy(episodes: list[Episode], turn: int) -> list[Decision]:
    del turn
    decisions = []
    for episode in episodes:
      show(f"\n[{episode.task.task_id}] step {episode.step_number}\n{episode.observation}")
      if episode.admissible_actions:
        show("admissible: " + "; ".join(episode.admissible_actions))
      try:
        typed = ask("action> ").strip()
      except EOFError:
        typed = quit_word
      if typed == quit_word:
        decisions.append(Decision(None))
      else:
        decisions.append(Decision(typed or INVALID_ACTION, valid=bool(typed), response=typed))
    return decisions
  return policy
