"""The WebShop purchase reward, as the WebShop paper (Yao et al., 2022) defines it:

  score = r_type * (|attributes hit| + |options hit| + [price <= bound])
                 / (|goal attributes| + |goal options| + 1)

- An attribute is hit when it fuzzy-matches (token-set ratio > 85) one of the product's
  attributes, or else occurs verbatim in its title, features or description.
- An option is hit when a chosen option value fuzzy-matches the goal's (colours are first
  reduced to their base colour).
- r_type compares the product with the goal's target: 1.0 when the search query matches,
  or at least two category-path levels match, or more than 20 % of the target title's nouns
  appear in the product title; else 0.5; it drops to 0.1 under 10 % noun overlap and to 0
  with no overlap at all.

Two stand-ins keep this dependency-free: fuzzy matching is `thefuzz.token_set_ratio` built
on difflib's similarity ratio (the same tokenisation and set logic; subset matches score 100
either way), and "nouns" are the content words of a title (stopwords, numbers and the
catalog's modifier vocabulary removed) instead of spaCy's noun tagger.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

FUZZY_THRESHOLD = 85

_BASE_COLOURS = ("black", "white", "gray", "grey", "red", "blue", "green", "pink", "silver",
                 "gold", "brown", "ivory", "yellow", "orange", "purple", "beige")
_STOPWORDS = frozenset(
    "a an the and or of for with in on to by from is it its this that at as be are x".split())


def _tokens(text: str) -> list[str]:
  return re.sub(r"[^0-9a-z]+", " ", text.lower()).split()


def _ratio(a: str, b: str) -> int:
  return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


def token_set_ratio(a: str, b: str) -> int:
  """Fuzzy similarity in [0, 100] of two strings as token sets (thefuzz's algorithm)."""
  tokens_a, tokens_b = set(_tokens(a)), set(_tokens(b))
  if not tokens_a or not tokens_b:
    return 0
  common = " ".join(sorted(tokens_a & tokens_b))
  only_a = " ".join(sorted(tokens_a - tokens_b))
  only_b = " ".join(sorted(tokens_b - tokens_a))
  with_a = f"{common} {only_a}".strip()
  with_b = f"{common} {only_b}".strip()
  return max(_ratio(common, with_a), _ratio(common, with_b), _ratio(with_a, with_b))


def normalize_colour(text: str) -> str:
  """A colour phrase reduced to its base colour ("navy blue" -> "blue"); other text as is."""
  words = _tokens(text)
  for colour in _BASE_COLOURS:
    if colour in words:
      return colour
  return text


def title_nouns(title: str, modifiers: frozenset[str] = frozenset()) -> list[str]:
  """The content words of a title: no stopwords, numbers or known modifier words."""
  return [t for t in _tokens(title)
          if t not in _STOPWORDS and not t.isdigit() and t not in modifiers and len(t) > 1]


@dataclasses.dataclass(frozen=True)
class RewardBreakdown:
  """A purchase's score and its parts (the original returns these for analysis)."""

  score: float
  r_type: float
  attributes_hit: int
  options_hit: int
  price_ok: bool
  title_score: float


def type_factor(product: dict[str, Any], goal: dict[str, Any],
                modifiers: frozenset[str] = frozenset()) -> tuple[float, float]:
  """(r_type, title_score) of the product against the goal's target."""
  query_match = product["query"] == goal["query"]
  product_path = {p.strip() for p in product["product_category"].split("›")}
  goal_path = {p.strip() for p in goal["product_category"].split("›")}
  category_match = len(product_path & goal_path) >= 2
  desired = set(title_nouns(goal["name"], modifiers))
  bought = set(title_nouns(product["title"], modifiers))
  title_score = len(desired & bought) / len(desired) if desired else 0.2
  r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  return r_type, title_score


def attributes_hit(product: dict[str, Any], goal_attributes: list[str]) -> int:
  """How many goal attributes the product has (fuzzy, or verbatim in its text)."""
  text = " ".join([product["title"], " ".join(product["bullet_points"]),
                   product["description"]]).lower()
  hits = 0
  for wanted in goal_attributes:
    if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product["attributes"]):
      hits += 1
    elif wanted.lower() in text:
      hits += 1
  return hits


def options_hit(chosen_values: list[str], goal_values: list[str]) -> int:
  """How many goal option values some chosen value fuzzy-matches."""
  chosen = [normalize_colour(v) for v in chosen_values]
  return sum(any(token_set_ratio(c, normalize_colour(g)) > FUZZY_THRESHOLD for c in chosen)
             for g in goal_values)


def score_purchase(product: dict[str, Any], goal: dict[str, Any], chosen_options: dict[str, str],
                   modifiers: frozenset[str] = frozenset()) -> RewardBreakdown:
  """The WebShop reward of buying `product` with `chosen_options` ({group: value}) for `goal`.

  Args:
    product: a catalog record (title, query, product_category, attributes, bullet_points,
      description, price).
    goal: WebShop goal fields (name, query, product_category, attributes, goal_options,
      price_upper; a price_upper <= 0 means no price bound and no price term).
    chosen_options: the option values clicked before buying.
    modifiers: catalog words that are not nouns (see `title_nouns`).
  """
  r_type, title_score = type_factor(product, goal, modifiers)
  n_attr = attributes_hit(product, goal["attributes"])
  goal_values = list(goal["goal_options"].values())
  n_opt = options_hit(list(chosen_options.values()), goal_values)
  has_bound = goal["price_upper"] > 0
  price_ok = has_bound and product["price"] <= goal["price_upper"]
  total = len(goal["attributes"]) + len(goal_values) + (1 if has_bound else 0)
  score = r_type * (n_attr + n_opt + int(price_ok)) / total if total else r_type
  return RewardBreakdown(score=score, r_type=r_type, attributes_hit=n_attr, options_hit=n_opt,
                         price_ok=price_ok, title_score=title_score)
