"""The search-QA environment (Search-R1 protocol): search up to the turn limit, then answer.

Actions are the parser's `<search>query</search>` and `<answer>text</answer>`. A search
returns the top-k passages inside `<information> </information>`; an answer ends the
episode with reward 1.0 on an exact match (after normalisation) with a gold answer. Running
out of turns ends it with reward 0.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

from seed_jax.envs import base
from seed_jax.envs.search import retrieval

INVALID_OBSERVATION = (
    "Your previous action is invalid. To search, put the query between <search> and "
    "</search>. To give the final answer, put it between <answer> and </answer>. Try again.")

_ACTION = re.compile(r"^<(search|answer)>(.*)</\1>$", re.DOTALL)


def normalize_answer(text: str) -> str:
  """SQuAD / Search-R1 normalisation: lower-case, drop punctuation and articles, squeeze
  whitespace."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def exact_match(prediction: str, golden_answers: list[str]) -> bool:
  """Whether the normalised prediction equals any normalised gold answer."""
  predicted = normalize_answer(prediction)
  return any(predicted == normalize_answer(gold) for gold in golden_answers)


class SearchEnv(base.Env):
  """One question per episode; `retriever` answers the searches."""

  def __init__(self, retriever: retrieval.Retriever, topk: int, max_turns: int,
               with_expert: bool = False):
    self._retriever = retriever
    self._topk = topk
    self._max_turns = max_turns
    self._with_expert = with_expert
    self._task: base.Task | None = None
    self._turns = 0
    self._searches = 0

  def reset(self, task: base.Task, seed: int) -> tuple[str, dict[str, Any]]:
    """Starts on `task`'s question; the first observation is the question itself."""
    del seed  # the episode is deterministic given the retriever
    self._task, self._turns, self._searches = task, 0, 0
    info = self._info(action_valid=True, won=False)
    info["instruction"] = task.payload["question"]
    return task.payload["question"], info

  def step(self, action: str) -> base.StepResult:
    """Runs a search or scores an answer; anything else is an invalid no-op turn."""
    if self._task is None:
      raise RuntimeError("SearchEnv.step called before reset")
    self._turns += 1
    out_of_turns = self._turns >= self._max_turns
    match = _ACTION.match(action.strip())
    if match is None:
      return base.StepResult(INVALID_OBSERVATION, 0.0, out_of_turns,
                             self._info(action_valid=False, won=False))
    kind, text = match.group(1), match.group(2).strip()
    if kind == "answer":
      won = exact_match(text, self._task.payload["golden_answers"])
      return base.StepResult("", float(won), True, self._info(action_valid=True, won=won))
    self._searches += 1
    docs = self._retriever.retrieve([text], self._topk)[0]
    observation = f"<information>{retrieval.format_passages(docs)}</information>"
    info = self._info(action_valid=True, won=False)
    info["retrieved_titles"] = [retrieval.split_title(doc)[0] for doc in docs]
    return base.StepResult(observation, 0.0, out_of_turns, info)

  def close(self) -> None:
    self._task = None

  def _info(self, action_valid: bool, won: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "won": won,
        "action_valid": action_valid,
        "admissible_actions": None,  # free-form queries and answers
        "task_type": self._task.task_type,
        "data_source": self._task.task_type,
    }
    if self._with_expert:
      info["expert_action"] = self._expert_action()
    return info

  def _expert_action(self) -> str:
    """Searches each gold passage's query in turn, then answers the first gold answer.

    When the turn budget would run out first, it answers at once.
    """
    queries = self._task.payload.get("expert_queries") or [self._task.payload["question"]]
    turns_left = self._max_turns - self._turns
    if self._searches < len(queries) and turns_left > 1:
      return f"<search>{queries[self._searches]}</search>"
    return f"<answer>{self._task.payload['golden_answers'][0]}</answer>"


def random_action(rng: random.Random, observation: str, info: dict[str, Any]) -> str:
  """A random search (words drawn from the observation) or, one time in four, a random
  answer (for the `play` command's random policy)."""
  del info
  words = re.findall(r"[A-Za-z0-9]+", observation) or ["nothing"]
  text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
  return f"<answer>{text}</answer>" if rng.random() < 0.25 else f"<search>{text}</search>"
