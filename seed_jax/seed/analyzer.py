"""The hindsight analyzer: finished trajectory -> {"episode_summary", "episode_skill"}.

One prompt format and one parser for every backend; a backend only turns prompts into
answer texts:
* `policy`: the current parameters through the sampler (an injected
  `generate_fn(prompts) -> texts`, which applies the chat template and decodes).
* `openai`: any OpenAI-compatible `/chat/completions` endpoint (the stage-1 external
  analyzer). The API key is read from the environment variable the config names, at
  request time; it is never logged, stored on an object, or written anywhere.
* `oracle`: privileged env information (`Trajectory.info`: expert plan, goal, task type)
  turned into a skill, for offline runs and tests.
A malformed answer (not JSON, missing keys, a skill under 5 words) is asked again up to
`max_retries` times; after that the trajectory gets no skill (so no OPD) and is counted.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from typing import Callable, Sequence

from seed_jax.seed import skills
from seed_jax.seed.batch import Trajectory

log = logging.getLogger(__name__)

BACKENDS = ("policy", "openai", "oracle")
GenerateFn = Callable[[list[str]], list[str]]


@dataclasses.dataclass(frozen=True)
class AnalyzerConfig:
  """Analyzer settings.

  Attributes:
    backend: "policy" | "openai" | "oracle".
    max_retries: re-asks for a malformed answer (2, as the stage-1 external analyzer; the
      public code's RL-time analyzer uses 0).
    min_skill_words: a valid skill has at least this many words (5).
    max_observation_chars: observations longer than this keep their head in the prompt
      (0 = no limit); the prompt must fit the analyzer's context (16k tokens in the paper).
    base_url, model: the endpoint (`{base_url}/chat/completions`) and model name (openai).
    api_key_env: the environment variable holding the API key (openai).
    temperature, max_tokens: sampling of the external analyzer (paper: temperature 0).
    timeout_s, http_retries, retry_backoff_s: per request; retried on network errors,
      429 and 5xx with exponential back-off.
    concurrency: parallel requests (openai).
  """
  backend: str = "policy"
  max_retries: int = 2
  min_skill_words: int = skills.MIN_SKILL_WORDS
  max_observation_chars: int = 0
  base_url: str = "https://api.openai.com/v1"
  model: str = ""
  api_key_env: str = "OPENAI_API_KEY"
  temperature: float = 0.0
  max_tokens: int = 1024
  timeout_s: float = 60.0
  http_retries: int = 3
  retry_backoff_s: float = 1.0
  concurrency: int = 8


@dataclasses.dataclass(frozen=True)
class Analysis:
  summary: str
  skill: str


def build_prompt(traj: Trajectory, max_observation_chars: int = 0) -> str:
  """The analyzer prompt: task, outcome, every step with observation, response, validity."""
  outcome = "SUCCESS" if traj.won else "FAILURE"
  lines = [
      "You are reviewing one finished episode of an agent acting in a text environment.",
      f"Task: {traj.task}",
      f"Outcome: {outcome}",
      "",
      "Trajectory:",
  ]
  for i, step in enumerate(traj.steps, start=1):
    observation = step.observation
    if max_observation_chars and len(observation) > max_observation_chars:
      observation = observation[:max_observation_chars] + " ..."
    lines += [f"Step {i}", f"Observation: {observation}", f"Response: {step.response_text}",
              f"Action valid: {'true' if step.action_valid else 'false'}", ""]
  if traj.won:
    guidance = ("The episode succeeded. Distil the reusable workflow that made it work: the "
                "decision rule and the order of actions.")
  else:
    guidance = ("The episode failed. Name the core mistake and the warning signs that should "
                "make the agent avoid it.")
  lines += [
      guidance,
      "Write the skill as one short instruction addressed to the agent for its next attempt "
      "at this kind of task (at least 5 words), not as a retrospective.",
      'Answer with JSON only: {"episode_summary": "<what happened>", '
      '"episode_skill": "<the skill>"}',
  ]
  return "\n".join(lines)


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_answer(text: str, min_skill_words: int = skills.MIN_SKILL_WORDS) -> Analysis | None:
  """The first JSON object in `text` with string `episode_summary` and a valid
  `episode_skill`; None when there is none. Tolerates code fences, a think block and prose
  around the object."""
  if not isinstance(text, str):
    return None
  text = _THINK.sub("", text)
  decoder = json.JSONDecoder()
  for match in re.finditer(r"\{", text):
    try:
      obj, _ = decoder.raw_decode(text, match.start())
    except json.JSONDecodeError:
      continue
    if not isinstance(obj, dict):
      continue
    summary, skill = obj.get("episode_summary"), obj.get("episode_skill")
    if isinstance(summary, str) and skills.is_valid_skill(skill, min_skill_words):
      return Analysis(summary=summary.strip(), skill=" ".join(skill.split()))
  return None


# -- backends: (prompts, trajectories) -> answer texts ----------------------------------

Backend = Callable[[list[str], list[Trajectory]], list[str]]


def policy_backend(generate_fn: GenerateFn) -> Backend:
  """The current policy through the sampler; `generate_fn` does templating and decoding."""
  def complete(prompts, trajs):
    del trajs
    answers = list(generate_fn(prompts))
    if len(answers) != len(prompts):
      raise ValueError(f"generate_fn returned {len(answers)} answers for {len(prompts)} prompts")
    return answers
  return complete


def oracle_skill(info: dict, won: bool) -> tuple[str, str]:
  """(summary, skill) from privileged info: `expert_plan` (list of actions), `goal`,
  `task_type`."""
  goal = info.get("goal") or "the task goal"
  task_type = info.get("task_type") or "this"
  plan = [str(a) for a in info.get("expert_plan") or []]
  order = ", then ".join(plan) if plan else "the shortest admissible sequence of actions"
  if won:
    summary = f"The agent achieved '{goal}'."
    skill = (f"For a {task_type} task such as '{goal}', act in this order: {order}; check each "
             f"action is admissible before sending it.")
  else:
    summary = f"The agent did not achieve '{goal}'."
    skill = (f"Do not wander or repeat actions that change nothing; for '{goal}' the working "
             f"order is: {order}.")
  return summary, skill


def oracle_backend() -> Backend:
  def complete(prompts, trajs):
    del prompts
    answers = []
    for traj in trajs:
      summary, skill = oracle_skill(traj.info, traj.won)
      answers.append(json.dumps({"episode_summary": summary, "episode_skill": skill}))
    return answers
  return complete


def openai_backend(cfg: AnalyzerConfig) -> Backend:
  """POSTs each prompt to `{base_url}/chat/completions`, `concurrency` at a time."""
  url = cfg.base_url.rstrip("/") + "/chat/completions"
  if cfg.api_key_env not in os.environ:
    raise ValueError(f"the analyzer's API key variable {cfg.api_key_env} is not set")

  def request(prompt: str) -> str:
    body = json.dumps({
        "model": cfg.model, "temperature": cfg.temperature, "max_tokens": cfg.max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }).encode()
    for attempt in range(cfg.http_retries + 1):
      req = urllib.request.Request(url, data=body, method="POST", headers={
          "Content-Type": "application/json",
          "Authorization": f"Bearer {os.environ.get(cfg.api_key_env, '')}"})
      try:
        with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
          return json.loads(resp.read())["choices"][0]["message"]["content"] or ""
      except urllib.error.HTTPError as err:
        retriable, reason = err.code == 429 or err.code >= 500, f"HTTP {err.code}"
      except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        retriable, reason = True, type(err).__name__
      except (ValueError, KeyError, IndexError, TypeError) as err:
        retriable, reason = False, f"unreadable response ({type(err).__name__})"
      # Only the URL and the reason are logged: never headers, never the key.
      log.warning("analyzer request to %s failed (%s), attempt %d/%d", url, reason,
                  attempt + 1, cfg.http_retries + 1)
      if not retriable or attempt == cfg.http_retries:
        return ""
      time.sleep(cfg.retry_backoff_s * 2**attempt)
    return ""

  def complete(prompts, trajs):
    del trajs
    with concurrent.futures.ThreadPoolExecutor(max(1, cfg.concurrency)) as pool:
      return list(pool.map(request, prompts))
  return complete


# -- the analyzer ----------------------------------------------------------------------

class Analyzer:
  """Builds prompts, calls the backend, validates, retries the malformed answers."""

  def __init__(self, cfg: AnalyzerConfig, backend: Backend):
    self.cfg = cfg
    self.backend = backend

  def analyze(self, trajs: Sequence[Trajectory]) -> tuple[list[Analysis | None], dict]:
    """Returns one Analysis (or None: no OPD for it) per trajectory, and counts:
    `requests`, `retries`, `valid`, `invalid`."""
    trajs = list(trajs)
    prompts = [build_prompt(t, self.cfg.max_observation_chars) for t in trajs]
    results: list[Analysis | None] = [None] * len(trajs)
    pending = list(range(len(trajs)))
    stats = {"requests": 0, "retries": 0}
    for attempt in range(self.cfg.max_retries + 1):
      if not pending:
        break
      if attempt:
        stats["retries"] += len(pending)
      answers = self.backend([prompts[i] for i in pending], [trajs[i] for i in pending])
      stats["requests"] += len(pending)
      for i, answer in zip(pending, answers):
        results[i] = parse_answer(answer, self.cfg.min_skill_words)
      pending = [i for i in pending if results[i] is None]
    stats["valid"] = len(trajs) - len(pending)
    stats["invalid"] = len(pending)
    return results, stats

  def annotate(self, trajs: Sequence[Trajectory]) -> dict:
    """Sets `traj.skill` (None for no valid skill) and returns the counts."""
    results, stats = self.analyze(trajs)
    for traj, analysis in zip(trajs, results):
      traj.skill = analysis.skill if analysis else None
    return stats


def make_analyzer(cfg: AnalyzerConfig, generate_fn: GenerateFn | None = None) -> Analyzer:
  """The analyzer for `cfg.backend`; `policy` needs `generate_fn`."""
  if cfg.backend == "policy":
    if generate_fn is None:
      raise ValueError("analyzer backend 'policy' needs generate_fn (the sampler)")
    return Analyzer(cfg, policy_backend(generate_fn))
  if cfg.backend == "openai":
    return Analyzer(cfg, openai_backend(cfg))
  if cfg.backend == "oracle":
    return Analyzer(cfg, oracle_backend())
  raise ValueError(f"analyzer backend must be one of {BACKENDS}, got {cfg.backend!r}")
