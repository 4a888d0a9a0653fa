"""WebShop: the reward (golden values computed by hand), the pages and actions, the splits,
the expert, prompts and parsing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from seed_jax.envs import base, registry
from seed_jax.envs.agent_format import Turn
from seed_jax.envs.webshop import catalog, reward, shop

webshop = registry.get_env_module("webshop")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
  """A small shop, cached in a private folder for the module's duration."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("SEED_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
    config = webshop.default_config()
    config.embedded.num_products = 300
    config.embedded.num_goals = 260
    config.num_eval_goals = 60
    config.num_dev_goals = 100
    yield config


@pytest.fixture(scope="module")
def env(config):
  return webshop.make_env(config, with_expert=True)


# ----- the reward, against hand-computed values -----

GOAL = {
    "name": "Acme Classic Running Shoes, Quick Drying",
    "query": "running shoes",
    "product_category": "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running Shoes",
    "attributes": ["quick drying", "machine wash"],
    "goal_options": {"size": "large", "color": "black"},
    "price_upper": 50.0,
}
MODIFIERS = frozenset({"classic", "modern", "quick", "drying", "deluxe", "gluten", "free"})


def _product(**overrides):
  product = {
      "title": "Zeta Modern Running Shoes, Quick Drying",
      "query": "running shoes",
      "product_category": GOAL["product_category"],
      "attributes": ["quick drying", "machine wash", "slim fit"],
      "bullet_points": [], "description": "", "price": 40.0,
  }
  product.update(overrides)
  return product


def _score(product, options):
  return reward.score_purchase(product, GOAL, options, MODIFIERS)


def test_reward_perfect_purchase_scores_one():
  # (2 attributes + 2 options + price) / (2 + 2 + 1) = 1, type factor 1.
  breakdown = _score(_product(), {"size": "large", "color": "black"})
  assert breakdown == reward.RewardBreakdown(score=1.0, r_type=1.0, attributes_hit=2,
                                             options_hit=2, price_ok=True, title_score=2 / 3)


def test_reward_partial_purchase():
  # 1 attribute (quick drying) + 1 option (black; "medium" is not "large") + price over the
  # bound (60 > 50) -> (1 + 1 + 0) / 5 = 0.4.
  product = _product(attributes=["quick drying"], price=60.0)
  breakdown = _score(product, {"size": "medium", "color": "black"})
  assert breakdown.score == pytest.approx(0.4)
  assert (breakdown.attributes_hit, breakdown.options_hit, breakdown.price_ok) == (1, 1, False)


def test_reward_attributes_found_in_title_and_description():
  # No attribute list, but "quick drying" is in the title and "machine wash" in the
  # description: both count. No option chosen; price ok -> (2 + 0 + 1) / 5 = 0.6.
  product = _product(attributes=[], description="Soft mesh. Machine wash cold.")
  assert _score(product, {}).score == pytest.approx(0.6)


def test_reward_price_equal_to_the_bound_is_within_it():
  assert _score(_product(price=50.0), {"size": "large", "color": "black"}).score == 1.0


def test_reward_colours_match_by_base_colour():
  goal = dict(GOAL, goal_options={"color": "navy blue"})
  product = _product()
  # dark blue ~ navy blue (both "blue"): (2 + 1 + 1) / (2 + 1 + 1) = 1.
  assert reward.score_purchase(product, goal, {"color": "dark blue"}, MODIFIERS).score == 1.0
  # red is not blue: 3 / 4.
  assert reward.score_purchase(product, goal, {"color": "red"}, MODIFIERS).score == 0.75


def test_reward_wrong_product_type_scores_zero():
  # Nouns: goal {acme, running, shoes}, bought {zeta, coffee, beans}: no overlap -> r_type 0.
  product = _product(title="Zeta Deluxe Coffee Beans, Gluten Free", query="coffee beans",
                     product_category="Grocery & Gourmet Food › Beverages › Coffee")
  breakdown = _score(product, {"size": "large", "color": "black"})
  assert (breakdown.r_type, breakdown.score) == (0.0, 0.0)


@pytest.mark.parametrize("goal_name, bought_title, query, category, r_type", [
    # 1 of 5 goal nouns (0.2, not above 0.2), no query or category match -> 0.5
    ("Acme Trail Running Shoes Sneakers", "Acme Coffee Beans", "coffee", "A › B", 0.5),
    # 1 of 11 goal nouns (< 0.1) -> 0.1
    ("acme bb cc dd ee ff gg hh jj kk ll", "acme zz", "coffee", "A › B", 0.1),
    # the same query -> 1.0 even with little title overlap
    ("Acme Trail Running Shoes Sneakers", "Acme Coffee Beans", "running shoes", "A › B", 1.0),
    # two category levels in common -> 1.0
    ("Acme Trail Running Shoes Sneakers", "Acme Coffee Beans", "coffee",
     "Clothing, Shoes & Jewelry › Women › Other", 1.0),
    # more than 20 % of the nouns (1 of 3) -> 1.0
    ("Acme Running Shoes", "Acme Coffee Beans", "coffee", "A › B", 1.0),
])
def test_type_factor(goal_name, bought_title, query, category, r_type):
  goal = dict(GOAL, name=goal_name)
  product = _product(title=bought_title, query=query, product_category=category)
  assert reward.type_factor(product, goal)[0] == r_type


@pytest.mark.parametrize("a, b, expected", [
    ("red", "dark red", 100),  # a token subset matches fully
    ("x-large", "large", 100),
    ("black", "white", 0),
    ("medium", "large", 18),
])
def test_token_set_ratio(a, b, expected):
  assert reward.token_set_ratio(a, b) == expected


# ----- catalog and tasks -----

def test_catalog_is_deterministic_and_goals_come_from_products():
  products, goals = catalog.generate(seed=1, num_products=50, num_goals=40)
  assert (products, goals) == catalog.generate(seed=1, num_products=50, num_goals=40)
  assert len({p["asin"] for p in products}) == 50
  assert {p["category"] for p in products} == set(catalog.CATEGORIES)
  by_asin = {p["asin"]: p for p in products}
  for goal in goals:
    target = by_asin[goal["asin"]]
    assert set(goal["attributes"]) <= set(target["attributes"])
    assert all(v in target["options"][g] for g, v in goal["goal_options"].items())
    assert target["price"] <= goal["price_upper"]
    assert goal["instruction_text"].endswith(f"price lower than {goal['price_upper']:.2f} dollars")


def test_splits_follow_the_paper(config):
  tasks = {split: webshop.load_tasks(config, split) for split in base.SPLITS}
  assert [t.payload["goal_index"] for t in tasks["valid_seen"]] == list(range(60))
  assert [t.payload["goal_index"] for t in tasks["valid_unseen"]] == list(range(60, 160))
  assert [t.payload["goal_index"] for t in tasks["train"]] == list(range(160, 260))
  assert webshop.default_config().num_eval_goals == 500


# ----- pages and actions -----

def test_search_page_and_invalid_actions(config, env):
  task = webshop.load_tasks(config, "valid_seen")[0]
  observation, info = env.reset(task, seed=0)
  base.check_info(info, "reset")
  assert observation == "Search"
  assert info["instruction"] == task.payload["goal"]["instruction_text"]
  assert info["admissible_actions"] == ["search[<your query>]"]
  for action in ("click[buy now]", "search[]", "buy it", "click[search]"):
    result = env.step(action)
    assert not result.info["action_valid"] and result.observation == "Search"


def test_results_paging_item_and_purchase(config, env):
  task = webshop.load_tasks(config, "valid_seen")[1]
  env.reset(task, seed=0)
  result = env.step("search[choice]")  # every product description says "choice"
  page = result.observation.split(" [SEP] ")
  assert page[:3] == ["Back to Search", "Page 1 (Total results: 50)", "Next >"]
  assert len(page) == 3 + 3 * shop.RESULTS_PER_PAGE  # ASIN, title, price per result
  assert not env.step(f"search[anything]").info["action_valid"]  # no search bar here
  result = env.step("click[next >]")
  assert result.observation.split(" [SEP] ")[1:3] == ["< Prev", "Page 2 (Total results: 50)"]
  result = env.step("click[< prev]")
  assert "Page 1 (" in result.observation
  asin = page[3]
  result = env.step(f"click[{asin.lower()}]")
  item = result.observation.split(" [SEP] ")
  assert item[:2] == ["Back to Search", "< Prev"]
  assert item[-4:] == ["Description", "Features", "Reviews", "Buy Now"]
  assert "click[buy now]" in result.info["admissible_actions"]
  for sub_page in ("description", "features", "reviews"):
    sub = env.step(f"click[{sub_page}]")
    assert sub.observation.startswith("Back to Search [SEP] < Prev [SEP] ")
    assert env.step("click[< prev]").observation == result.observation
  result = env.step("click[Buy Now]")  # buttons are case-insensitive
  assert result.done and result.observation.startswith("Thank you for shopping with us!")
  score = result.info["webshop_score"]
  assert result.observation.endswith(f"{score:.4g}")
  assert result.reward == (10.0 if score == 1.0 else 0.0)
  assert result.info["won"] == (score == 1.0)


def test_a_search_without_matches_shows_no_results(config, env):
  env.reset(webshop.load_tasks(config, "train")[0], seed=0)
  result = env.step("search[qwxzyv]")
  assert result.observation == "Back to Search [SEP] Page 1 (Total results: 0)"
  assert result.info["admissible_actions"] == ["click[back to search]"]


def test_turn_limit_is_fifteen(config, env):
  env.reset(webshop.load_tasks(config, "train")[0], seed=0)
  dones = [env.step("click[nothing]").done for _ in range(15)]
  assert dones == [False] * 14 + [True]


def test_expert_succeeds_on_every_eval_goal(config, env):
  won = 0
  tasks = webshop.load_tasks(config, "valid_seen")
  for task in tasks:
    _, info = env.reset(task, seed=0)
    while True:
      result = env.step(info["expert_action"])
      info = result.info
      assert info["action_valid"]
      if result.done:
        break
    won += info["won"]
  assert won == len(tasks)


def test_random_policy_only_takes_valid_actions(config, env):
  rng = random.Random(0)
  for task in webshop.load_tasks(config, "train")[:10]:
    observation, info = env.reset(task, seed=0)
    done = False
    while not done:
      result = env.step(shop.random_action(rng, observation, info))
      assert result.info["action_valid"]
      base.check_info(result.info, "step")
      observation, info, done = result.observation, result.info, result.done


# ----- prompt and parsing -----

def test_prompt_lists_goal_history_and_actions(config):
  agent_format = webshop.make_agent_format(config)
  history = [Turn("Search", "search[tea]"),
             Turn("Back to Search [SEP] Page 1", "click[b01]")]
  prompt = agent_format.render("buy green tea", history, "item page",
                               ["click[buy now]", "click[< prev]"], 3)
  assert "Your shopping goal: buy green tea." in prompt
  assert "[Observation 1: 'Search', Action 1: 'search[tea]']" in prompt
  assert "'click[buy now]',\n'click[< prev]'," in prompt
  assert "step 3" in prompt and "<think> </think>" in prompt
  assert agent_format.stop_strings == ("</action>",)


@settings(max_examples=150, deadline=None)
@given(st.text() | st.builds(lambda body: f"<think>t</think><action>{body}</action>", st.text()))
def test_any_response_parses_and_steps_without_raising(config, env, response):
  parsed = webshop.make_agent_format(config).parse(response)
  env.reset(webshop.load_tasks(config, "valid_seen")[2], seed=0)
  result = env.step(parsed.action)
  base.check_info(result.info, "step")
  if not parsed.valid:
    assert not result.info["action_valid"]
