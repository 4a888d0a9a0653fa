"""The EZPoints environment: gym_cards' rules and rewards, a formula as text and the table
as an image, and an expert that writes a winning formula.

Rules and rewards, as gym_cards' `EZPointEnv` (its 13 discrete actions become the tokens of
`game.TOKENS`), with where and why we differ:

* A number no card shows, or one already used as often as the cards show it, is refused:
  reward -1, the episode goes on. gym_cards appends a blank to the formula then; we leave
  the formula as it was (a no-op, `action_valid` False): the blank only counts toward the
  length limit below (Python's `eval` skips it), and the turn limit bounds an episode anyway.
* '+' and '*' are appended whatever precedes them; a malformed formula ('6+*6', '+6') is
  judged when '=' comes, as in gym_cards.
* '=' ends the episode: +10 (and `won`) when the formula uses each card's number exactly once
  and makes 12, else -1. gym_cards runs Python's `eval` on the concatenated tokens, so a
  few formulas only Python reads win there: a unary plus ('+6+6', '6++6', '6*+2') or two
  numbers run together ('1' '2' read as 12, though no ace is dealt). We accept a formula
  only as the prompt describes one, numbers and operators taking turns (`game.evaluate`):
  those quirks teach nothing about the game, and no `eval` runs on model output.
* A step taken when the formula already holds more than 5 tokens ends the episode with -1,
  the action unused (gym_cards' "time_limit_reached"; no winning formula is that long).
* A string that is not a token is a no-op with reward 0 and `action_valid` False: what
  verl-agent's gym_cards wrapper does with an unparsable response (action -1).
* The turn limit (`max_steps`, verl-agent's 8) ends the episode with no further reward.
"""

from __future__ import annotations

from typing import Any

from seed_jax.envs import base
from seed_jax.envs.ezpoints import game, render

WIN_REWARD = 10.0
PENALTY = -1.0  # gym_cards' reward for a refused number, a wrong formula, a too-long one
MAX_FORMULA_TOKENS = 5


class EZPointsEnv(base.Env):
  """One deal per episode, from the task's seed.

  The observation is the formula so far as text, its tokens joined ("6+"; "" at the
  start); every info holds the table as an image under "image" (`render.render_table`,
  `[300, 300, 3]` uint8), and "cards", the dealt cards in words. `admissible_actions` is
  the whole token vocabulary, gym_cards' action space: which numbers are on the cards is
  for the agent to see.
  """

  def __init__(self, max_steps: int, with_expert: bool = False):
    self._max_steps = max_steps
    self._with_expert = with_expert
    self._task: base.Task | None = None
    self._cards: tuple[game.Card, game.Card] | None = None
    self._formula: list[str] = []
    self._steps = 0
    self._won = False

  @property
  def cards(self) -> tuple[game.Card, game.Card]:
    if self._cards is None:
      raise RuntimeError("EZPointsEnv.step called before reset")
    return self._cards

  @property
  def formula(self) -> tuple[str, ...]:
    return tuple(self._formula)

  def reset(self, task: base.Task, seed: int) -> tuple[str, dict[str, Any]]:
    """Deals the task's cards (the task payload fixes them; `seed` is not needed)."""
    del seed
    self._task = task
    self._cards = game.deal(task.payload["seed"])
    self._formula, self._steps, self._won = [], 0, False
    info = self._info(action_valid=True)
    # The prompt shows the cards as an image only; the instruction names them, so that the
    # analyzer's text transcript says what the agent saw (seed_jax.seed.transcript).
    first, second = self.cards
    info["instruction"] = (f"write a formula of the two cards' numbers that makes "
                           f"{game.TARGET} (the cards: {first}, {second}; their numbers "
                           f"{first.value} and {second.value})")
    return self._observation(), info

  def step(self, action: str) -> base.StepResult:
    """Appends one token, judges the formula on '=' (module docstring: the rules)."""
    values = [card.value for card in self.cards]
    self._steps += 1
    token = action.strip()
    reward, valid, done = 0.0, True, False
    if len(self._formula) > MAX_FORMULA_TOKENS:
      reward, valid, done = PENALTY, False, True
    elif token not in game.TOKENS:
      valid = False
    elif token == game.EQUALS:
      self._won = game.solves(self._formula, values)
      reward, done = (WIN_REWARD if self._won else PENALTY), True
    elif token in game.NUMBER_TOKENS and self._formula.count(token) >= values.count(int(token)):
      reward, valid = PENALTY, False
    else:
      self._formula.append(token)
    done = done or self._steps >= self._max_steps
    return base.StepResult(self._observation(), reward, done, self._info(action_valid=valid))

  def close(self) -> None:
    self._cards = None

  def _observation(self) -> str:
    return "".join(self._formula)

  def _info(self, action_valid: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "won": self._won,
        "action_valid": action_valid,
        "admissible_actions": list(game.TOKENS),
        "task_type": self._task.task_type,
        "cards": [str(card) for card in self.cards],
        "image": render.render_table(self.cards, self._formula),
    }
    if self._with_expert:
      info["expert_action"] = game.expert_token([card.value for card in self.cards],
                                                self._formula)
    return info
