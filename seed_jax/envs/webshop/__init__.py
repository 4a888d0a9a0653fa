"""WebShop: an embedded shop faithful to WebShop's pages, actions and reward, or the
original environment for users who have it.

The env-module contract of `seed_jax.envs.registry`. Splits follow the paper and WebShop's
own code: goals 0-499 evaluate (valid_seen), goals 500-1499 are the dev set
(valid_unseen), the rest train. A goal's task_type is its product category.
"""

from __future__ import annotations

import ml_collections

from seed_jax.envs import base
from seed_jax.envs.webshop import catalog
from seed_jax.envs.webshop.prompt import WebShopFormat
from seed_jax.envs.webshop.shop import Shop, WebShopEnv, random_action  # noqa: F401  (play uses it)

NAME = "webshop"

# One shop (catalog + BM25 index) per process and catalog: pool workers share it.
_SHOPS: dict[tuple[int, int, int], Shop] = {}


def default_config() -> ml_collections.ConfigDict:
  """Data source, catalog size, turn limit, split sizes, prompt history."""
  return ml_collections.ConfigDict({
      "source": "embedded",  # or "original" (needs the WebShop repo and data; see original.py)
      "max_steps": 15,  # WebShop turn limit in SEED / verl-agent
      "success_reward": 10.0,  # the step reward when the purchase scores 1.0
      "history_length": 2,
      "num_eval_goals": 500,  # valid_seen: the paper's evaluation goals
      "num_dev_goals": 1000,  # valid_unseen
      "embedded": {"seed": 0, "num_products": 4000, "num_goals": 6000},
      "original": {"num_products": 1000, "human_goals": True, "num_goals": 0},  # 0: ask the env
  })


def _split_range(config: ml_collections.ConfigDict, split: str, num_goals: int) -> range:
  eval_end = min(config.num_eval_goals, num_goals)
  dev_end = min(eval_end + config.num_dev_goals, num_goals)
  return {"valid_seen": range(0, eval_end), "valid_unseen": range(eval_end, dev_end),
          "train": range(dev_end, num_goals)}[split]


def _catalog(config: ml_collections.ConfigDict):
  e = config.embedded
  return catalog.load_or_generate(e.seed, e.num_products, e.num_goals)


def load_tasks(config: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  """The split's goals, in the original order."""
  if split not in base.SPLITS:
    raise ValueError(f"webshop: unknown split {split!r}; known: {base.SPLITS}")
  if config.source == "original":
    from seed_jax.envs.webshop import original  # pylint: disable=g-import-not-at-top
    num_goals = config.original.num_goals or original.count_goals(
        config.original.num_products, config.original.human_goals)
    return [base.Task(env=NAME, task_id=f"webshop-{i}", split=split, task_type="webshop",
                      payload={"goal_index": i}) for i in _split_range(config, split, num_goals)]
  _, goals = _catalog(config)
  return [base.Task(env=NAME, task_id=f"webshop-{i}", split=split, task_type=goals[i]["category"],
                    payload={"goal_index": i, "goal": goals[i]})
          for i in _split_range(config, split, len(goals))]


def make_shop(config: ml_collections.ConfigDict) -> Shop:
  """The embedded shop of `config`, built once per process."""
  e = config.embedded
  key = (e.seed, e.num_products, e.num_goals)
  if key not in _SHOPS:
    products, _ = _catalog(config)
    _SHOPS[key] = Shop(products, catalog.modifier_words())
  return _SHOPS[key]


def make_env(config: ml_collections.ConfigDict, with_expert: bool = False) -> base.Env:
  """A WebShop env; with the expert (embedded shop only), info["expert_action"] is the next
  action of a shopper that reaches a purchase scoring 1.0."""
  if config.source == "original":
    if with_expert:
      raise ValueError("webshop: the expert needs the embedded shop (source=embedded)")
    from seed_jax.envs.webshop import original  # pylint: disable=g-import-not-at-top
    return original.OriginalWebShopEnv(config.original.num_products, config.original.human_goals,
                                       config.max_steps, config.success_reward)
  if config.source != "embedded":
    raise ValueError(f"webshop: unknown source {config.source!r} (embedded or original)")
  return WebShopEnv(make_shop(config), max_steps=config.max_steps,
                    success_reward=config.success_reward, with_expert=with_expert)


def make_agent_format(config: ml_collections.ConfigDict) -> WebShopFormat:
  """The WebShop prompt and the `<think>/<action>` parser."""
  return WebShopFormat(history_length=config.history_length)
