"""The embedded shop: a generated product catalog and the shopping goals drawn from it.

Products mirror the original WebShop records: an ASIN, a title, a category and a category
path, the search query the product was "scraped" under (its product type), attributes
(short phrases such as "gluten free"), option groups (size, color, flavor, ...), a price,
bullet-point features, a description and reviews. A goal is drawn from a target product as
in WebShop: a subset of its attributes, one value per option group, a price bound above its
price, and an instruction sentence in the style of WebShop's synthetic instructions.

Everything is deterministic in the seed; the catalog is cached on disk as JSON.
"""

from __future__ import annotations

import json
import math
import os
import random
import string
from typing import Any

from seed_jax.paths import cache_root

CACHE_VERSION = "v2"

# category -> (category path root, product types, attributes, option groups). Option values
# are disjoint across a category's groups, so a value names its group unambiguously.
CATEGORIES: dict[str, dict[str, Any]] = {
    "beauty": {
        "path": "Beauty & Personal Care",
        "types": {
            "shampoo": "Hair Care", "conditioner": "Hair Care", "face moisturizer": "Skin Care",
            "lip balm": "Skin Care", "nail polish": "Makeup", "eye shadow palette": "Makeup",
            "hair dryer": "Tools & Accessories", "body lotion": "Skin Care"},
        "attributes": [
            "paraben free", "cruelty free", "long lasting", "natural ingredients",
            "sensitive skin", "travel size", "fragrance free", "vegan", "dermatologist tested",
            "easy to apply"],
        "options": {
            "size": ["1 fl oz", "2 fl oz", "4 fl oz", "8 fl oz", "16 fl oz"],
            "scent": ["lavender", "coconut", "unscented", "rose", "citrus", "vanilla"]},
        "price": (4, 60),
    },
    "electronics": {
        "path": "Electronics",
        "types": {
            "wireless earbuds": "Headphones", "bluetooth speaker": "Portable Audio",
            "usb c cable": "Accessories", "power bank": "Accessories",
            "phone case": "Cell Phone Accessories", "hdmi cable": "Accessories",
            "smart watch": "Wearable Technology", "computer mouse": "Computer Accessories"},
        "attributes": [
            "fast charging", "noise cancelling", "water resistant", "high definition",
            "easy to install", "long battery life", "plug and play", "lightweight",
            "aluminum alloy", "high speed"],
        "options": {
            "color": ["black", "white", "silver", "navy blue", "rose gold", "space gray"],
            "style": ["standard", "pro", "mini", "2 pack", "3 pack"]},
        "price": (8, 180),
    },
    "fashion": {
        "path": "Clothing, Shoes & Jewelry",
        "types": {
            "t-shirt": "Men › Clothing › Shirts", "running shoes": "Women › Shoes › Athletic",
            "jeans": "Men › Clothing › Jeans", "hoodie": "Women › Clothing › Fashion Hoodies",
            "summer dress": "Women › Clothing › Dresses", "rain jacket": "Men › Clothing › Coats",
            "yoga pants": "Women › Clothing › Active", "wool socks": "Men › Clothing › Socks"},
        "attributes": [
            "machine wash", "slim fit", "relaxed fit", "quick drying", "moisture wicking",
            "button closure", "elastic waist", "long sleeve", "short sleeve", "polyester cotton"],
        "options": {
            "size": ["x-small", "small", "medium", "large", "x-large", "xx-large"],
            "color": ["black", "white", "heather gray", "red", "olive green", "dark blue", "pink"]},
        "price": (9, 120),
    },
    "grocery": {
        "path": "Grocery & Gourmet Food",
        "types": {
            "coffee beans": "Beverages › Coffee", "green tea": "Beverages › Tea",
            "protein bar": "Snacks › Bars", "olive oil": "Pantry › Oils", "granola": "Breakfast",
            "beef jerky": "Snacks › Jerky", "dark chocolate": "Snacks › Chocolate",
            "sparkling water": "Beverages › Water"},
        "attributes": [
            "gluten free", "sugar free", "low calorie", "non gmo", "keto friendly",
            "certified organic", "caffeine free", "high protein", "dairy free",
            "individually wrapped"],
        "options": {
            "flavor": ["original", "vanilla bean", "sea salt", "mixed berry", "peanut butter",
                       "lemon"],
            "size": ["pack of 1", "pack of 3", "pack of 6", "pack of 12", "12 ounce", "2 pound"]},
        "price": (3, 45),
    },
    "home": {
        "path": "Home & Kitchen",
        "types": {
            "office chair": "Furniture › Home Office", "bookshelf": "Furniture › Living Room",
            "bed sheets": "Bedding", "table lamp": "Lighting", "throw pillow": "Home Decor",
            "area rug": "Home Decor", "storage ottoman": "Furniture › Living Room",
            "shower curtain": "Bath"},
        "attributes": [
            "easy assemble", "solid wood", "space saving", "non slip", "eco friendly",
            "living room", "storage space", "easy clean", "heavy duty", "mid century"],
        "options": {
            "color": ["walnut", "espresso", "ivory", "charcoal", "sage green", "light gray"],
            "size": ["twin", "full", "queen", "king", "small", "large"]},
        "price": (12, 400),
    },
}

# Attributes a product cannot have together.
_EXCLUSIVE = ({"slim fit", "relaxed fit"}, {"long sleeve", "short sleeve"},
              {"sugar free", "high protein"})

_TITLE_ADJECTIVES = ("premium", "classic", "deluxe", "everyday", "essential", "ultra", "modern",
                     "original", "advanced", "signature")
_REVIEW_LINES = ("works as described", "great value for the price", "arrived quickly",
                 "not what I expected", "would buy again", "quality could be better",
                 "my family loves it", "exactly as pictured")


def _brand(rng: random.Random) -> str:
  syllables = ("ve", "lo", "ra", "ko", "ni", "ta", "zen", "mar", "qui", "sol", "dra", "pex", "lu",
               "vin", "or", "ba", "cy", "tor")
  return "".join(rng.choice(syllables) for _ in range(rng.choice((2, 3)))).capitalize()


def _asin(rng: random.Random) -> str:
  return "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))


def _product(rng: random.Random, category: str, asins: set[str]) -> dict[str, Any]:
  spec = CATEGORIES[category]
  product_type = rng.choice(sorted(spec["types"]))
  attributes = rng.sample(spec["attributes"], rng.randint(2, 4))
  for pair in _EXCLUSIVE:
    if pair <= set(attributes):
      attributes.remove(sorted(pair)[0])
  options = {}
  for group in rng.sample(sorted(spec["options"]), rng.randint(1, len(spec["options"]))):
    values = spec["options"][group]
    offered = rng.sample(values, rng.randint(2, min(5, len(values))))
    options[group] = sorted(offered, key=values.index)
  low, high = spec["price"]
  price = round(math.exp(rng.uniform(math.log(low), math.log(high))) - 0.01, 2)
  brand = _brand(rng)
  # Titles carry some attributes, as Amazon titles do, so a search for them finds the item.
  title = (f"{brand} {rng.choice(_TITLE_ADJECTIVES).capitalize()} {product_type.title()}, "
           + ", ".join(a.title() for a in attributes[:rng.randint(1, 2)]))
  asin = _asin(rng)
  while asin in asins:
    asin = _asin(rng)
  asins.add(asin)
  return {
      "asin": asin,
      "title": title,
      "category": category,
      "product_category": " › ".join([spec["path"], spec["types"][product_type],
                                      product_type.title()]),
      "query": product_type,
      "attributes": attributes,
      "options": options,
      "price": price,
      "rating": round(rng.uniform(2.5, 5.0), 1),
      "bullet_points": [f"{a.capitalize()}: a {product_type} made to be {a}." for a in attributes],
      "description": (f"The {brand} {product_type} is a {rng.choice(_TITLE_ADJECTIVES)} choice. "
                      f"It is {', '.join(attributes)}."),
      "reviews": [f"{rng.randint(1, 5)} stars: {rng.choice(_REVIEW_LINES)}"
                  for _ in range(rng.randint(1, 3))],
  }


def _price_bound(rng: random.Random, price: float) -> float:
  # WebShop draws the bound from a few round values above the price.
  for bound in (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0, 150.0, 200.0, 300.0, 500.0):
    if bound >= price * rng.uniform(1.05, 1.6):
      return bound
  return math.ceil(price * 1.5 / 100) * 100.0


def instruction_text(goal: dict[str, Any]) -> str:
  """WebShop's synthetic instruction style: product type, attributes, options, price bound."""
  text = f"i am looking for a {goal['query']}"
  if goal["attributes"]:
    text += " that is " + " and ".join(goal["attributes"])
  if goal["goal_options"]:
    text += ", with " + " and ".join(f"{k}: {v}" for k, v in goal["goal_options"].items())
  return text + f", and price lower than {goal['price_upper']:.2f} dollars"


def make_goal(rng: random.Random, product: dict[str, Any]) -> dict[str, Any]:
  """A shopping goal whose target is `product` (WebShop's goal fields)."""
  attributes = rng.sample(product["attributes"], rng.randint(1, min(3, len(product["attributes"]))))
  goal = {
      "asin": product["asin"],
      "category": product["category"],
      "query": product["query"],
      "name": product["title"],
      "product_category": product["product_category"],
      "attributes": sorted(attributes, key=product["attributes"].index),
      "goal_options": {group: rng.choice(values) for group, values in product["options"].items()},
      "price_upper": _price_bound(rng, product["price"]),
  }
  goal["instruction_text"] = instruction_text(goal)
  return goal


def generate(seed: int = 0, num_products: int = 4000,
             num_goals: int = 6000) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
  """Generates (products, goals) deterministically; goals are shuffled, as WebShop's are."""
  rng = random.Random(seed)
  categories = sorted(CATEGORIES)
  asins: set[str] = set()
  products = [_product(rng, categories[i % len(categories)], asins) for i in range(num_products)]
  goals = [make_goal(rng, rng.choice(products)) for _ in range(num_goals)]
  return products, goals


def load_or_generate(seed: int, num_products: int,
                     num_goals: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
  """The catalog from the disk cache, generating and caching it on first use."""
  path = (cache_root() / "webshop" /
          f"catalog-{CACHE_VERSION}-s{seed}-p{num_products}-g{num_goals}.json")
  if path.exists():
    with open(path) as f:
      data = json.load(f)
    return data["products"], data["goals"]
  products, goals = generate(seed, num_products, num_goals)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  with open(tmp, "w") as f:
    json.dump({"products": products, "goals": goals}, f)
  os.replace(tmp, path)  # atomic: concurrent workers never read a partial file
  return products, goals


def modifier_words() -> frozenset[str]:
  """Words of the catalog that describe rather than name a product (attributes, option
  values, title adjectives): the reward's type match ignores them when comparing titles."""
  words = set(_TITLE_ADJECTIVES)
  for spec in CATEGORIES.values():
    for phrase in spec["attributes"] + [v for values in spec["options"].values() for v in values]:
      words.update(phrase.lower().replace("-", " ").split())
  return frozenset(words)
