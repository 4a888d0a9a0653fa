"""The hindsight analyzer: finished trajectory -> {"episode_summary", "episode_skill"}.

One prompt builder (`seed_jax.seed.transcript`, fitted to `max_prompt_tokens`) and one
parser for every backend; a backend only turns prompts into answer texts:
* `policy`: the current parameters through the sampler: an injected
  `generate_fn(prompt_ids, *, temperature, seed) -> texts` that decodes the prompts'
  chat-template token ids.
* `openai`: any OpenAI-compatible `/chat/completions` endpoint (the stage-1 external
  analyzer). The API key is read from the environment variable the config names, at
  request time; it is never logged, stored on an object, or written anywhere.
* `oracle`: privileged env information (`Trajectory.info`: expert plan, goal, task type)
  turned into a skill, for offline runs and tests.
A malformed answer (not JSON, missing keys, a skill under 5 words) is asked again up to
`max_retries` times, sampling at `retry_temperature` with a new seed each attempt (a greedy
retry of a greedy answer would only repeat it); after that the trajectory gets no skill
(so no OPD) and is counted.
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
from typing import Any, Callable, Sequence

from seed_jax.checks import non_negative, non_negative_int, one_of, positive, positive_int, require
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.seed import skills
from seed_jax.seed.batch import Trajectory
from seed_jax.seed.transcript import AnalyzerPrompt, build_analyzer_prompts

log = logging.getLogger(__name__)

BACKENDS = ("policy", "openai", "oracle")
# generate_fn(prompt_ids, *, temperature, seed) -> one answer text per prompt.
GenerateFn = Callable[..., list[str]]


@dataclasses.dataclass(frozen=True)
class AnalyzerConfig:
  """Analyzer settings.

  Attributes:
    backend: "policy" | "openai" | "oracle".
    max_retries: re-asks for a malformed answer (2, as the stage-1 external analyzer; the
      public code's RL-time analyzer uses 0).
    retry_temperature: retries sample at this temperature, each with its own seed, so a
      greedy first answer is not merely regenerated.
    min_skill_words: a valid skill has at least this many words (5).
    base_url, model: the endpoint (`{base_url}/chat/completions`) and model name (openai).
    api_key_env: the environment variable holding the API key (openai).
    temperature, max_tokens: decoding of the first attempt (paper: temperature 0).
    timeout_s, http_retries, retry_backoff_s: per request; retried on network errors,
      429 and 5xx with exponential back-off.
    concurrency: parallel requests (openai).
    decode_batch: prompts per decoding request of the policy analyzer (0: all of an
      iteration's at once). Bounds the analysis KV cache: 128 transcripts of 16k tokens of
      a 7B model need 121 GiB of cache at once (`seed_jax.plan` shows it).
    answer_prefix: text the policy analyzer's answer is made to start with (its tokens
      follow the prompt; the decoded text is appended to it), and stage 1 teaches after
      it: e.g. `{"episode_summary": "` holds a small model to the JSON format. "" (the
      paper's): the model writes the whole answer.
    group_hindsight: (not the paper's) after analysis, a failed trajectory whose GRPO
      group holds a won trajectory with a skill takes that sibling's skill
      (`group_hindsight_sources`). A small policy that missed a solution while acting does
      not find it looking back at its own failure, so its own skill of a failure is no
      better informed than its acting; the group's won sibling found one, from the same
      start. The skill is still the policy's own writing and uses no privileged
      information. Where no sibling won, a failure keeps its own skill.
  """
  backend: str = "policy"
  max_retries: int = 2
  retry_temperature: float = 0.7
  min_skill_words: int = skills.MIN_SKILL_WORDS
  base_url: str = "https://api.openai.com/v1"
  model: str = ""
  api_key_env: str = "OPENAI_API_KEY"
  temperature: float = 0.0
  max_tokens: int = 1024
  timeout_s: float = 60.0
  http_retries: int = 3
  retry_backoff_s: float = 1.0
  concurrency: int = 8
  decode_batch: int = 0
  answer_prefix: str = ""
  group_hindsight: bool = False

  def __post_init__(self):
    require(self, "backend", one_of(BACKENDS), f"one of {BACKENDS}")
    require(self, ("max_retries", "http_retries", "decode_batch"), non_negative_int,
            "a non-negative integer")
    require(self, ("min_skill_words", "max_tokens", "concurrency"), positive_int,
            "a positive integer")
    require(self, ("temperature", "retry_backoff_s"), non_negative, "a non-negative number")
    require(self, "retry_temperature", positive,
            "a positive temperature (a greedy retry repeats a greedy answer; set "
            "max_retries to 0 for no retries)")
    require(self, "timeout_s", positive, "a positive number of seconds")


@dataclasses.dataclass(frozen=True)
class Analysis:
  summary: str
  skill: str


@dataclasses.dataclass(frozen=True)
class Decoding:
  """How one attempt decodes: the first at the configured temperature, retries sampled."""
  temperature: float
  seed: int


@dataclasses.dataclass(frozen=True)
class AnalysisReport:
  """One trajectory's analysis: what the analyzer read and wrote, and what came of it.

  Attributes:
    prompt: the prompt (text, ids, whether the transcript was truncated).
    raw: the last answer text.
    analysis: the parsed answer, or None (the trajectory takes no part in OPD).
    reason: why the last answer was rejected ("" when valid).
    attempts: how many times it was asked.
  """
  prompt: AnalyzerPrompt
  raw: str
  analysis: Analysis | None
  reason: str
  attempts: int

  @property
  def skill(self) -> str | None:
    return self.analysis.skill if self.analysis else None


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_answer_with_reason(text: str, min_skill_words: int = skills.MIN_SKILL_WORDS
                             ) -> tuple[Analysis | None, str]:
  """(the first JSON object in `text` with a string `episode_summary` and a valid
  `episode_skill`, "") or (None, why not). Tolerates code fences, a think block and prose
  around the object."""
  if not isinstance(text, str) or not text.strip():
    return None, "empty answer"
  text = _THINK.sub("", text)
  decoder = json.JSONDecoder()
  reason = "no JSON object"
  for match in re.finditer(r"\{", text):
    try:
      obj, _ = decoder.raw_decode(text, match.start())
    except json.JSONDecodeError:
      continue
    if not isinstance(obj, dict):
      continue
    summary, skill = obj.get("episode_summary"), obj.get("episode_skill")
    if not isinstance(summary, str):
      reason = "no string episode_summary"
    elif not isinstance(skill, str):
      reason = "no string episode_skill"
    elif not skills.is_valid_skill(skill, min_skill_words):
      reason = f"episode_skill under {min_skill_words} words"
    else:
      return Analysis(summary=summary.strip(), skill=" ".join(skill.split())), ""
  return None, reason


def parse_answer(text: str, min_skill_words: int = skills.MIN_SKILL_WORDS) -> Analysis | None:
  """The parsed answer, or None when `text` holds no valid one."""
  return parse_answer_with_reason(text, min_skill_words)[0]


# -- backends: (prompts, trajectories, decoding) -> answer texts -------------------------

Backend = Callable[[list[AnalyzerPrompt], list[Trajectory], Decoding], list[str]]


def policy_backend(generate_fn: GenerateFn, prefix: str = "",
                   prefix_ids: Sequence[int] = ()) -> Backend:
  """The current policy through the sampler, decoding the prompts' chat-template ids;
  with an answer prefix, from after its ids, and the answer is `prefix` + the decoded
  text."""
  def complete(prompts, trajs, decoding):
    del trajs
    if any(p.ids is None for p in prompts):
      raise ValueError("the policy analyzer needs token ids: build it with a tokenizer")
    answers = list(generate_fn([list(p.ids) + list(prefix_ids) for p in prompts],
                               temperature=decoding.temperature, seed=decoding.seed))
    if len(answers) != len(prompts):
      raise ValueError(f"generate_fn returned {len(answers)} answers for {len(prompts)} prompts")
    return [prefix + answer for answer in answers]
  return complete


def oracle_skill(info: dict, won: bool) -> tuple[str, str]:
  """(summary, skill) from privileged info: `expert_plan` (list of actions), `goal`,
  `task_type`."""
  goal = info.get("goal") or "the task goal"
  task_type = info.get("task_type") or "this"
  plan = [str(a) for a in info.get("expert_plan") or []]
  # Steps are numbered as the acting prompts number them ("You are now at step 2"), so a
  # reader finds the current action by the step it is at rather than by counting the
  # plan's items (a 135M policy could not count; issue 24).
  order = (", ".join(f"step {k}: {a}" for k, a in enumerate(plan, start=1)) if plan
           else "the shortest admissible sequence of actions")
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
  def complete(prompts, trajs, decoding):
    del prompts, decoding
    answers = []
    for traj in trajs:
      summary, skill = oracle_skill(traj.info, traj.won)
      answers.append(json.dumps({"episode_summary": summary, "episode_skill": skill}))
    return answers
  return complete


def openai_backend(cfg: AnalyzerConfig) -> Backend:
  """POSTs each prompt's text to `{base_url}/chat/completions`, `concurrency` at a time."""
  url = cfg.base_url.rstrip("/") + "/chat/completions"
  if cfg.api_key_env not in os.environ:
    raise ValueError(f"the analyzer's API key variable {cfg.api_key_env} is not set")

  def request(prompt: str, temperature: float) -> str:
    body = json.dumps({
        "model": cfg.model, "temperature": temperature, "max_tokens": cfg.max_tokens,
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

  def complete(prompts, trajs, decoding):
    del trajs
    with concurrent.futures.ThreadPoolExecutor(max(1, cfg.concurrency)) as pool:
      return list(pool.map(lambda p: request(p.text, decoding.temperature), prompts))
  return complete


def group_hindsight_sources(group_ids: Sequence, won: Sequence[bool],
                            num_steps: Sequence[int], has_skill: Sequence[bool]) -> list[int]:
  """Whose skill each trajectory's teacher reads under group hindsight: an index into the
  same lists per trajectory. A failed trajectory whose group holds a won trajectory with a
  skill reads that sibling's (the won one with the fewest steps, its most direct solution;
  the first on ties); every other trajectory reads its own (its own index)."""
  best: dict[Any, int] = {}
  for i, (group, ok, skilled) in enumerate(zip(group_ids, won, has_skill)):
    if ok and skilled and (group not in best or num_steps[i] < num_steps[best[group]]):
      best[group] = i
  return [i if ok else best.get(group, i)
          for i, (group, ok) in enumerate(zip(group_ids, won))]


def skill_sources(trajs: Sequence[Trajectory], skills: Sequence[str | None],
                  group_hindsight: bool, group_of: Callable[[Trajectory], Any] | None = None
                  ) -> list[int]:
  """Whose skill (an index into `skills`, one per trajectory) each trajectory's teacher
  reads: its own, or with `group_hindsight` the sibling `group_hindsight_sources` names
  within its group (`group_of(traj)`, by default its GRPO group)."""
  if not group_hindsight:
    return list(range(len(trajs)))
  group_of = group_of or (lambda traj: traj.group_id)
  return group_hindsight_sources([group_of(t) for t in trajs], [t.won for t in trajs],
                                 [len(t.steps) for t in trajs],
                                 [s is not None for s in skills])


def assign_skills(trajs: Sequence[Trajectory], reports: Sequence[AnalysisReport],
                  group_hindsight: bool = False) -> int:
  """Sets each trajectory's `skill` from its own report or, with `group_hindsight`, from
  the report of the sibling `group_hindsight_sources` names (then `skill_from` is that
  sibling's traj_id, else None). Returns how many trajectories read a sibling's skill."""
  if len(reports) != len(trajs):
    raise ValueError(f"{len(reports)} reports for {len(trajs)} trajectories")
  sources = skill_sources(trajs, [r.skill for r in reports], group_hindsight)
  for i, (traj, k) in enumerate(zip(trajs, sources)):
    traj.skill = reports[k].skill
    traj.skill_from = trajs[k].traj_id if k != i else None
  return sum(k != i for i, k in enumerate(sources))


# -- the analyzer ----------------------------------------------------------------------

class Analyzer:
  """Builds the prompts, calls the backend, validates, retries the malformed answers."""

  def __init__(self, cfg: AnalyzerConfig, backend: Backend, tokenizer: Tokenizer | None = None,
               max_prompt_tokens: int | None = None):
    self.cfg = cfg
    self.backend = backend
    self.tokenizer = tokenizer
    self.max_prompt_tokens = max_prompt_tokens

  def decoding(self, attempt: int, seed: int) -> Decoding:
    """Attempt 0 at `temperature`; retries sample at `retry_temperature`, new seed each."""
    if attempt == 0:
      return Decoding(self.cfg.temperature, seed % 2**31)
    return Decoding(self.cfg.retry_temperature, (seed + 7919 * attempt) % 2**31)

  def analyze(self, trajs: Sequence[Trajectory], *, seed: int = 0
              ) -> tuple[list[AnalysisReport], dict]:
    """One report per trajectory (its `analysis` None: no OPD for it) and the counts
    `requests`, `retries`, `valid`, `invalid`, `truncated` (transcripts cut to fit) and,
    with a tokenizer, `answer_tokens`: the tokens of every answer (retries and the policy's
    answer prefix included) as the tokenizer encodes its text, what the analysis decodes."""
    trajs = list(trajs)
    prompts = build_analyzer_prompts(trajs, self.tokenizer, self.max_prompt_tokens)
    raw, parsed, reasons = [""] * len(trajs), [None] * len(trajs), ["not asked"] * len(trajs)
    attempts = [0] * len(trajs)
    pending = list(range(len(trajs)))
    stats = {"requests": 0, "retries": 0}
    if self.tokenizer is not None:
      stats["answer_tokens"] = 0
    for attempt in range(self.cfg.max_retries + 1):
      if not pending:
        break
      if attempt:
        stats["retries"] += len(pending)
      answers = self.backend([prompts[i] for i in pending], [trajs[i] for i in pending],
                             self.decoding(attempt, seed))
      stats["requests"] += len(pending)
      for i, answer in zip(pending, answers):
        raw[i], attempts[i] = answer, attempts[i] + 1
        parsed[i], reasons[i] = parse_answer_with_reason(answer, self.cfg.min_skill_words)
        if self.tokenizer is not None:
          stats["answer_tokens"] += len(self.tokenizer.encode(answer))
      pending = [i for i in pending if parsed[i] is None]
    stats.update(valid=len(trajs) - len(pending), invalid=len(pending),
                 truncated=sum(p.truncated for p in prompts))
    reports = [AnalysisReport(p, r, a, why, n)
               for p, r, a, why, n in zip(prompts, raw, parsed, reasons, attempts)]
    return reports, stats

  def annotate(self, trajs: Sequence[Trajectory], *, seed: int = 0) -> dict:
    """Sets `traj.skill` (None for no valid skill) and returns the counts."""
    reports, stats = self.analyze(trajs, seed=seed)
    assign_skills(trajs, reports)
    return stats


def make_analyzer(cfg: AnalyzerConfig, generate_fn: GenerateFn | None = None, *,
                  tokenizer: Tokenizer | None = None,
                  max_prompt_tokens: int | None = None) -> Analyzer:
  """The analyzer for `cfg.backend`. Prompts are fitted to `max_prompt_tokens` with
  `tokenizer` (the policy's: the budget counts chat-template tokens); `policy` needs both
  and `generate_fn`. Without a tokenizer (tests) prompts hold whole transcripts."""
  if cfg.backend == "policy":
    if generate_fn is None:
      raise ValueError("analyzer backend 'policy' needs generate_fn (the sampler)")
    if tokenizer is None or not max_prompt_tokens:
      raise ValueError("analyzer backend 'policy' needs the tokenizer and max_prompt_tokens")
    backend = policy_backend(generate_fn, cfg.answer_prefix,
                             tokenizer.encode(cfg.answer_prefix) if cfg.answer_prefix else ())
  elif cfg.backend == "openai":
    backend = openai_backend(cfg)
  elif cfg.backend == "oracle":
    backend = oracle_backend()
  else:
    raise ValueError(f"analyzer backend must be one of {BACKENDS}, got {cfg.backend!r}")
  return Analyzer(cfg, backend, tokenizer, max_prompt_tokens)
