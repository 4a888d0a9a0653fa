"""The embedded WebShop: the original's pages as `[SEP]`-separated text, its actions, its
reward, and an expert shopper.

Pages, as in WebShop's text mode (the "WebShop [SEP] Instruction: [SEP] <goal>" header is
left out: the prompt states the goal already):
  search     "Search"                                         actions: search[query]
  results    "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP]
              <ASIN> [SEP] <title> [SEP] $<price> [SEP] ..."  10 a page, top 50 by BM25
  item       "Back to Search [SEP] < Prev [SEP] <option group> [SEP] <value> ... [SEP]
              <title> [SEP] Price: $<p> [SEP] Rating: <r> [SEP] Description [SEP]
              Features [SEP] Reviews [SEP] Buy Now"
  description / features / reviews   "Back to Search [SEP] < Prev [SEP] <text>"
  done       "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] <s>"
Buttons are clicked with `click[<button text, lower-cased>]` (a result by its ASIN).
"""

from __future__ import annotations

import random
import re
from typing import Any

from seed_jax.envs import base
from seed_jax.envs.search.retrieval import BM25Index
from seed_jax.envs.webshop import reward as reward_lib

SEP = " [SEP] "
RESULTS_PER_PAGE = 10
SEARCH_RETURN_N = 50  # WebShop's search engine returns the top 50
SEARCH_PLACEHOLDER = "search[<your query>]"
_SUB_PAGES = ("description", "features", "reviews")
_ACTION = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL)


class Shop:
  """The catalog and its BM25 index; read-only, shared by every env of a process."""

  def __init__(self, products: list[dict[str, Any]], modifiers: frozenset[str] = frozenset()):
    self.products = {p["asin"]: p for p in products}
    self._asins = [p["asin"] for p in products]
    self._index = BM25Index([self.product_text(p) for p in products])
    self.modifiers = modifiers

  @staticmethod
  def product_text(product: dict[str, Any]) -> str:
    """What the search engine indexes: the page text a shopper could read."""
    return " ".join([product["title"], product["product_category"],
                     " ".join(product["bullet_points"]), product["description"]])

  def search(self, query: str) -> list[str]:
    """The ASINs of the top results for `query`, best first; like WebShop's search engine,
    only products that share a word with the query are results."""
    indices, scores = self._index.search([query], SEARCH_RETURN_N)
    return [self._asins[i] for i, score in zip(indices[0], scores[0]) if score > 0]

  def score(self, asin: str, goal: dict[str, Any],
            options: dict[str, str]) -> reward_lib.RewardBreakdown:
    """The WebShop reward of buying `asin` with `options` for `goal`."""
    return reward_lib.score_purchase(self.products[asin], goal, options, self.modifiers)


class WebShopEnv(base.Env):
  """One shopping goal per episode; rewards `success_reward` when the purchase scores 1.0."""

  def __init__(self, shop: Shop, max_steps: int, success_reward: float = 10.0,
               with_expert: bool = False):
    self._shop = shop
    self._max_steps = max_steps
    self._success_reward = success_reward
    self._with_expert = with_expert
    self._task: base.Task | None = None

  # ----- episode -----

  def reset(self, task: base.Task, seed: int) -> tuple[str, dict[str, Any]]:
    """Opens the search page for the task's goal."""
    del seed  # the shop is deterministic
    self._task = task
    self._goal: dict[str, Any] = task.payload["goal"]
    self._steps = 0
    self._page = "search"
    self._results: list[str] = []
    self._result_page = 1
    self._asin: str | None = None
    self._options: dict[str, str] = {}
    self._score: reward_lib.RewardBreakdown | None = None
    self._expert_search_title = False
    info = self._info(action_valid=True)
    info["instruction"] = self._goal["instruction_text"]
    return self._observation(), info

  def step(self, action: str) -> base.StepResult:
    """Applies `search[...]` or `click[...]`; anything not possible on this page is an
    invalid no-op."""
    if self._task is None:
      raise RuntimeError("WebShopEnv.step called before reset")
    self._steps += 1
    valid = self._apply(action.strip())
    won = self._score is not None and self._score.score >= 1.0
    reward = self._success_reward if won else 0.0
    done = self._page == "done" or self._steps >= self._max_steps
    return base.StepResult(self._observation(), reward, done, self._info(action_valid=valid))

  def close(self) -> None:
    self._task = None

  def _apply(self, action: str) -> bool:
    match = _ACTION.match(action)
    if match is None or self._page == "done":
      return False
    kind, argument = match.group(1), " ".join(match.group(2).split())
    if kind == "search":
      if self._page != "search" or not argument:
        return False
      self._results, self._result_page, self._page = self._shop.search(argument), 1, "results"
      return True
    button = argument.lower()
    if button not in self._clickables():
      return False
    if button == "back to search":
      self._page, self._asin, self._options = "search", None, {}
    elif button == "next >":
      self._result_page += 1
    elif button == "< prev":
      if self._page == "results":
        self._result_page -= 1
      elif self._page == "item":
        self._page, self._asin, self._options = "results", None, {}
      else:  # a description / features / reviews page goes back to its item
        self._page = "item"
    elif self._page == "results":
      self._page, self._asin, self._options = "item", button.upper(), {}
    elif button in _SUB_PAGES:
      self._page = button
    elif button == "buy now":
      self._score = self._shop.score(self._asin, self._goal, self._options)
      self._page = "done"
    else:  # an option value: it selects that value of its group
      product = self._shop.products[self._asin]
      group = next(g for g, values in product["options"].items()
                   if button in [v.lower() for v in values])
      self._options[group] = next(v for v in product["options"][group] if v.lower() == button)
    return True

  # ----- pages -----

  def _page_asins(self) -> list[str]:
    start = (self._result_page - 1) * RESULTS_PER_PAGE
    return self._results[start:start + RESULTS_PER_PAGE]

  def _clickables(self) -> list[str]:
    if self._page == "results":
      buttons = ["back to search"]
      if self._result_page > 1:
        buttons.append("< prev")
      if self._result_page * RESULTS_PER_PAGE < len(self._results):
        buttons.append("next >")
      return buttons + [asin.lower() for asin in self._page_asins()]
    if self._page == "item":
      product = self._shop.products[self._asin]
      values = [v.lower() for vs in product["options"].values() for v in vs]
      return ["back to search", "< prev"] + values + list(_SUB_PAGES) + ["buy now"]
    if self._page in _SUB_PAGES:
      return ["back to search", "< prev"]
    return []

  def _observation(self) -> str:
    if self._page == "search":
      return "Search"
    if self._page == "done":
      return SEP.join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)",
                       f"{self._score.score:.4g}"])
    parts = ["Back to Search"]
    if self._page == "results":
      if self._result_page > 1:
        parts.append("< Prev")
      parts.append(f"Page {self._result_page} (Total results: {len(self._results)})")
      if self._result_page * RESULTS_PER_PAGE < len(self._results):
        parts.append("Next >")
      for asin in self._page_asins():
        product = self._shop.products[asin]
        parts += [asin, product["title"], f"${product['price']:.2f}"]
      return SEP.join(parts)
    product = self._shop.products[self._asin]
    parts.append("< Prev")
    if self._page == "item":
      for group, values in product["options"].items():
        parts += [group] + values
      parts += [product["title"], f"Price: ${product['price']:.2f}", f"Rating: {product['rating']}",
                "Description", "Features", "Reviews", "Buy Now"]
    elif self._page == "description":
      parts.append(product["description"])
    elif self._page == "features":
      parts += product["bullet_points"]
    else:
      parts += product["reviews"]
    return SEP.join(parts)

  def _info(self, action_valid: bool) -> dict[str, Any]:
    score = self._score.score if self._score is not None else 0.0
    if self._page == "search":
      admissible = [SEARCH_PLACEHOLDER]
    else:
      admissible = [f"click[{button}]" for button in self._clickables()]
    info: dict[str, Any] = {
        "won": score >= 1.0,
        "action_valid": action_valid,
        "admissible_actions": admissible,
        "task_type": self._task.task_type,
        "webshop_score": score,  # the raw WebShop reward of the purchase (0 before it)
    }
    if self._with_expert:
      info["expert_action"] = self._expert_action()
    return info

  # ----- expert -----

  def _best_options(self, asin: str) -> dict[str, str]:
    """Per option group of the product, the goal's value if offered, else a value that
    fuzzy-matches a goal option (the reward accepts near misses such as "1 fl oz" for
    "4 fl oz", as WebShop's does)."""
    goal_values = list(self._goal["goal_options"].values())
    chosen = {}
    for group, values in self._shop.products[asin]["options"].items():
      exact = [v for v in values if v in goal_values]
      fuzzy = [v for v in values if reward_lib.options_hit([v], goal_values)]
      if exact or fuzzy:
        chosen[group] = (exact or fuzzy)[0]
    return chosen

  def _perfect(self, asin: str) -> bool:
    return self._shop.score(asin, self._goal, self._best_options(asin)).score >= 1.0

  def _expert_action(self) -> str:
    """The next action of a shopper who can read the reward: search the goal's product type
    and attributes, open the first result that can score 1.0 (looking at two result
    pages), else search the target's exact title; choose the goal's options; buy."""
    goal = self._goal
    if self._page == "search":
      if self._expert_search_title:
        return f"search[{goal['name']}]"
      return f"search[{' '.join([goal['query']] + goal['attributes'])}]"
    if self._page == "results":
      for asin in self._page_asins():
        if self._perfect(asin):
          return f"click[{asin.lower()}]"
      if "next >" in self._clickables() and self._result_page < 2:
        return "click[next >]"
      self._expert_search_title = True
      return "click[back to search]"
    if self._page == "item":
      if not self._perfect(self._asin):
        return "click[< prev]"
      for group, value in self._best_options(self._asin).items():
        if self._options.get(group) != value:
          return f"click[{value.lower()}]"
      return "click[buy now]"
    if self._page in _SUB_PAGES:
      return "click[< prev]"
    return "click[back to search]"  # done: no action matters


def random_action(rng: random.Random, observation: str, info: dict[str, Any]) -> str:
  """A random admissible action; on the search page a search for a few random words of
  the instruction (for the `play` command's random policy)."""
  admissible = info.get("admissible_actions") or [SEARCH_PLACEHOLDER]
  action = rng.choice(admissible)
  if action == SEARCH_PLACEHOLDER:
    words = re.findall(r"[a-z]+", info.get("instruction", observation).lower()) or ["item"]
    action = f"search[{' '.join(rng.sample(words, min(3, len(words))))}]"
  return action
