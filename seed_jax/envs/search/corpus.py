"""The embedded search-QA data: encyclopedia-style passages about fictional entities, and
single-hop, bridge and comparison questions over them.

The entities are invented (syllable names), so a model cannot answer from memory: it has to
retrieve. Entities link to each other (a person's birthplace is a city, a company's founder
is a person, a city lies on a river), which gives HotpotQA-style multi-hop questions:
  bridge:      "On which river lies the birthplace of Kovan Dresh?" (person -> city -> river)
  comparison:  "Which was founded earlier, Tessik Works or Brunal Lines?"
Each question records the passages that support it and the queries an expert would send.

Passages follow the wiki-18 jsonl format (`{"id", "contents"}`, the title on the first line
in double quotes). Generation is deterministic in the seed and cached on disk.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
from typing import Any

from seed_jax.paths import cache_root

_ONSETS = ("b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "r", "s", "t", "th",
           "v", "z", "h", "st")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "y")
_CODAS = ("", "n", "r", "l", "s", "th", "m", "k", "x", "nd")
_OCCUPATIONS = ("painter", "architect", "chemist", "novelist", "composer", "astronomer",
                "engineer", "historian", "sculptor", "physician", "poet", "mathematician")
_INDUSTRIES = ("shipbuilding", "textiles", "glassware", "railways", "printing", "pottery",
               "clockmaking", "brewing", "mining", "telegraphy")
_COMPANY_SUFFIXES = ("Works", "Company", "Industries", "Lines", "Guild", "Foundry", "Mills")

CACHE_VERSION = "v1"


def _syllable(rng: random.Random) -> str:
  return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)


def _word(rng: random.Random, syllables: int) -> str:
  return "".join(_syllable(rng) for _ in range(syllables)).capitalize()


class _Names:
  """Draws names that are unique across the whole corpus, so each title is unambiguous."""

  def __init__(self, rng: random.Random):
    self._rng, self._used = rng, set()

  def draw(self, make) -> str:
    while True:
      name = make(self._rng)
      if name.lower() not in self._used:
        self._used.add(name.lower())
        return name


def _entities(rng: random.Random, num_people: int) -> dict[str, list[dict[str, Any]]]:
  names = _Names(rng)
  countries = [{"name": names.draw(lambda r: _word(r, 2) + "ia")}
               for _ in range(max(4, num_people // 40))]
  rivers = [{"name": names.draw(lambda r: _word(r, 2)) + " River",
             "length_km": rng.randrange(80, 3000), "country": rng.choice(countries)["name"]}
            for _ in range(max(6, num_people // 15))]
  cities = []
  for _ in range(max(10, num_people // 4)):
    river = rng.choice(rivers)
    cities.append({"name": names.draw(lambda r: _word(r, rng.choice((2, 3)))),
                   "country": river["country"], "river": river["name"],
                   "founded": rng.randrange(800, 1800), "population": rng.randrange(5, 900) * 1000})
  people = []
  for _ in range(num_people):
    people.append({"name": names.draw(lambda r: f"{_word(r, 2)} {_word(r, 2)}"),
                   "born": rng.randrange(1700, 1990), "birthplace": rng.choice(cities)["name"],
                   "occupation": rng.choice(_OCCUPATIONS)})
  companies = []
  for _ in range(max(8, num_people // 3)):
    founder = rng.choice(people)
    name = names.draw(lambda r: f"{_word(r, 2)} {rng.choice(_COMPANY_SUFFIXES)}")
    companies.append({"name": name,
                      "founded": founder["born"] + rng.randrange(20, 50),
                      "founder": founder["name"], "industry": rng.choice(_INDUSTRIES),
                      "headquarters": rng.choice(cities)["name"]})
  return {"country": countries, "river": rivers, "city": cities, "person": people,
          "company": companies}


def _passage_text(kind: str, e: dict[str, Any]) -> str:
  if kind == "country":
    return f"{e['name']} is a sovereign state with its own rivers, cities and industries."
  if kind == "river":
    return (f"The {e['name']} is a river in {e['country']}. It is {e['length_km']} kilometres "
            f"long and is one of the principal waterways of {e['country']}.")
  if kind == "city":
    return (f"{e['name']} is a city in {e['country']}, founded in {e['founded']}. It lies on "
            f"the {e['river']} and has a population of about {e['population']:,}.")
  if kind == "person":
    return (f"{e['name']} (born {e['born']}) is a {e['occupation']} from {e['birthplace']}. "
            f"{e['name'].split()[0]} grew up in {e['birthplace']} and became known as a "
            f"{e['occupation']} of note.")
  return (f"{e['name']} is a {e['industry']} company founded in {e['founded']} by "
          f"{e['founder']}. Its headquarters are in {e['headquarters']}.")


def _questions(rng: random.Random, ents: dict[str, list[dict[str, Any]]],
               per_kind: int) -> list[dict[str, Any]]:
  by_name = {e["name"]: e for kind in ents.values() for e in kind}
  questions = []

  asked = set()

  def add(kind, question, answer, supports):
    if question in asked:  # small corpora draw the same question twice
      return
    asked.add(question)
    questions.append({"question": question, "golden_answers": [str(answer)], "data_source": kind,
                      "supporting_titles": supports, "expert_queries": list(supports)})

  for _ in range(per_kind):  # single hop: one passage holds the answer
    choice = rng.randrange(4)
    if choice == 0:
      p = rng.choice(ents["person"])
      add("single", f"In which city was {p['name']} born?", p["birthplace"], [p["name"]])
    elif choice == 1:
      c = rng.choice(ents["company"])
      add("single", f"Who founded {c['name']}?", c["founder"], [c["name"]])
    elif choice == 2:
      c = rng.choice(ents["city"])
      add("single", f"In what year was the city of {c['name']} founded?", c["founded"], [c["name"]])
    else:
      p = rng.choice(ents["person"])
      add("single", f"What is the profession of {p['name']}?", p["occupation"], [p["name"]])
  for _ in range(per_kind):  # bridge: the first passage names the entity holding the answer
    choice = rng.randrange(3)
    if choice == 0:
      p = rng.choice(ents["person"])
      city = by_name[p["birthplace"]]
      add("bridge", f"On which river lies the birthplace of {p['name']}?", city["river"],
          [p["name"], city["name"]])
    elif choice == 1:
      c = rng.choice(ents["company"])
      founder = by_name[c["founder"]]
      add("bridge", f"In which city was the founder of {c['name']} born?", founder["birthplace"],
          [c["name"], founder["name"]])
    else:
      c = rng.choice(ents["company"])
      city = by_name[c["headquarters"]]
      add("bridge", f"In which country is {c['name']} headquartered?", city["country"],
          [c["name"], city["name"]])
  for _ in range(per_kind):  # comparison: two passages, compare a number
    kind, attribute, wording = rng.choice((
        ("person", "born", "Who was born first, {a} or {b}?"),
        ("company", "founded", "Which was founded earlier, {a} or {b}?"),
        ("city", "founded", "Which city is older, {a} or {b}?")))
    a, b = rng.sample(ents[kind], 2)
    if a[attribute] == b[attribute]:
      continue  # no well-defined answer
    answer = a if a[attribute] < b[attribute] else b
    add("comparison", wording.format(a=a["name"], b=b["name"]), answer["name"],
        [a["name"], b["name"]])
  return questions


def generate(seed: int = 0, num_people: int = 400,
             questions_per_kind: int = 300) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
  """Generates (passages, questions), deterministically from the arguments.

  Returns:
    passages: wiki-18 records `{"id": str, "contents": '"Title"\\ntext'}`.
    questions: `{"question", "golden_answers", "data_source" ("single" | "bridge" |
      "comparison"), "supporting_titles", "expert_queries"}`, shuffled.
  """
  rng = random.Random(seed)
  ents = _entities(rng, num_people)
  passages = []
  for kind, entities in ents.items():
    for entity in entities:
      passages.append({"id": str(len(passages)),
                       "contents": f"\"{entity['name']}\"\n{_passage_text(kind, entity)}"})
  questions = _questions(rng, ents, questions_per_kind)
  rng.shuffle(questions)
  return passages, questions


def write_jsonl(path: pathlib.Path, records: list[dict[str, Any]]) -> None:
  """Writes records atomically (a temp file then a rename), so concurrent workers never read
  a half-written file."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  with open(tmp, "w") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  os.replace(tmp, path)


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def embedded_paths(seed: int, num_people: int,
                   questions_per_kind: int) -> tuple[pathlib.Path, pathlib.Path]:
  """Generates the embedded data once and returns (corpus.jsonl, questions.jsonl) paths."""
  name = f"embedded-{CACHE_VERSION}-s{seed}-p{num_people}-q{questions_per_kind}"
  folder = cache_root() / "search" / name
  corpus_path, questions_path = folder / "corpus.jsonl", folder / "questions.jsonl"
  if not (corpus_path.exists() and questions_path.exists()):
    passages, questions = generate(seed, num_people, questions_per_kind)
    write_jsonl(corpus_path, passages)
    write_jsonl(questions_path, questions)
  return corpus_path, questions_path
