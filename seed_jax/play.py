"""Plays episodes of an environment with a policy and prints success per task type.

  python -m seed_jax.play --env=alfworld --policy=expert --split=valid_seen --episodes=12
  python -m seed_jax.play --env=alfworld --policy=human --episodes=1
  python -m seed_jax.play --env=alfworld --policy=model --model=SmolLM2-135M-Instruct
  python -m seed_jax.play --env=alfworld --policy=random --set=data_dir=embedded --set=max_steps=30

Policies: "expert" (the env's oracle, `info["expert_action"]`), "random" (a uniformly random
admissible action), "human" (you type), "model" (an LLM through the acting prompt and the
action parser, as in training). Episodes run in this process (`--workers=0`) or in an
`EnvPool` of worker processes.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import json
import random
import sys
from typing import Any, Callable

from absl import app, flags

from seed_jax.agent.parsing import INVALID_ACTION
from seed_jax.envs.base import SPLITS, StepResult, Task, Turn
from seed_jax.envs.registry import ENV_NAMES, get_env_module

POLICIES = ("expert", "random", "human", "model")

_ENV = flags.DEFINE_enum("env", "alfworld", ENV_NAMES, "Environment family.")
_POLICY = flags.DEFINE_enum("policy", "expert", POLICIES, "Who acts.")
_SPLIT = flags.DEFINE_enum("split", "train", SPLITS, "Task split.")
_EPISODES = flags.DEFINE_integer("episodes", 0, "Episodes to play (0: every task of the split).")
_MODEL = flags.DEFINE_string("model", "", "Model name or directory, for --policy=model.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the episodes and of the random policy.")
_WORKERS = flags.DEFINE_integer("workers", 0, "Env worker processes (0: play in this process).")
_BATCH = flags.DEFINE_integer("batch", 8, "Episodes played at once.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.4, "Sampling temperature of the model.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 512, "Response budget of the model.")
_SET = flags.DEFINE_multi_string("set", [], "Env config override key=value, e.g. max_steps=30.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Print every step.")


@dataclasses.dataclass
class EpisodeState:
  """What a policy sees of one running episode."""

  task: Task
  instruction: str
  observation: str
  info: dict[str, Any]
  history: list[Turn] = dataclasses.field(default_factory=list)
  done: bool = False

  @property
  def step(self) -> int:
    return len(self.history) + 1


Policy = Callable[[list[EpisodeState]], list[str]]


class LocalBatch:
  """In-process stand-in for `EnvPool` (same reset/step interface), for play and tests."""

  def __init__(self, env_module, config, with_expert: bool):
    self._make = lambda: env_module.make_env(config, with_expert=with_expert)
    self._envs: list[Any] = []

  def reset(self, tasks: list[Task], seeds: list[int]):
    while len(self._envs) < len(tasks):
      self._envs.append(self._make())
    return [env.reset(task, seed) for env, task, seed in zip(self._envs, tasks, seeds)]

  def step(self, actions: list[str | None]) -> list[StepResult | None]:
    return [None if a is None else env.step(a) for env, a in zip(self._envs, actions)]

  def close(self) -> None:
    for env in self._envs:
      env.close()


def expert_policy(states: list[EpisodeState]) -> list[str]:
  return [s.info["expert_action"] for s in states]


def make_random_policy(env_module, seed: int) -> Policy:
  """A uniformly random admissible action, or the env's own `random_action` where it has
  no admissible list (search, WebShop's search page)."""
  rng = random.Random(seed)
  env_random = getattr(env_module, "random_action", None)

  def policy(states: list[EpisodeState]) -> list[str]:
    actions = []
    for s in states:
      admissible = [a for a in s.info.get("admissible_actions") or [] if a != "help"]
      if admissible:
        actions.append(rng.choice(admissible))
      elif env_random is not None:
        actions.append(env_random(rng, s.observation, s.info))
      else:
        actions.append(INVALID_ACTION)
    return actions
  return policy


def human_policy(states: list[EpisodeState]) -> list[str]:
  actions = []
  for s in states:
    print(f"\n[{s.task.task_id}] step {s.step}\n{s.observation}")
    admissible = s.info.get("admissible_actions")
    if admissible:
      print("admissible:", "; ".join(admissible))
    actions.append(input("action> ").strip())
  return actions


def play_with_model(batch_env, env_module, config, tasks: list[Task], model: str, seed: int,
                    batch_size: int, temperature: float, max_new_tokens: int,
                    max_cache_len: int = 4096) -> list[dict[str, Any]]:
  """Plays every task once with a model through the training acting loop
  (`seed_jax.train.rollout.play_episodes`: same prompts, sampler and parsing, a malformed
  response is an invalid no-op), `batch_size` episodes at a time."""
  from seed_jax.sampling.sampler import sampler_for  # pylint: disable=g-import-not-at-top
  from seed_jax.train import rollout  # pylint: disable=g-import-not-at-top
  sampler = sampler_for(model, max_cache_len=max_cache_len)
  spec = rollout.RolloutSpec(max_turns=config.max_steps, temperature=temperature,
                             max_new_tokens=max_new_tokens,
                             max_prompt_tokens=max_cache_len - max_new_tokens)
  fmt = env_module.make_agent_format(config)
  records = []
  for start in range(0, len(tasks), batch_size):
    trajectories, _ = rollout.play_episodes(
        sampler, sampler.tokenizer, batch_env, fmt, tasks[start:start + batch_size], 1, spec,
        seed=seed + start, desc=f"episodes {start + 1}-{min(start + batch_size, len(tasks))}")
    records += [{"task_id": t.task_id, "task_type": t.info["task_type"], "won": t.won,
                 "steps": len(t.steps), "failed": t.info["failed"]} for t in trajectories]
  return records


def apply_overrides(config, overrides: list[str]):
  """Applies `key=value` overrides (dotted keys; values parsed as Python literals if they can)."""
  for item in overrides:
    key, _, text = item.partition("=")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    if leaf not in node:
      raise KeyError(f"unknown env config key {key!r}")
    node[leaf] = value
  return config


def play_episodes(batch_env, tasks: list[Task], policy: Policy, seed: int, batch_size: int,
                  verbose: bool = False) -> list[dict[str, Any]]:
  """Plays every task once with a scripted policy (expert, random, human), `batch_size` at
  a time; returns one record per episode. Models act through `play_with_model`."""
  records = []
  for start in range(0, len(tasks), batch_size):
    chunk = tasks[start:start + batch_size]
    seeds = [seed + start + i for i in range(len(chunk))]
    states = []
    for task, (observation, info) in zip(chunk, batch_env.reset(chunk, seeds)):
      states.append(EpisodeState(task, info.get("instruction", ""), observation, info,
                                 done="failed" in info))
    while not all(s.done for s in states):
      active = [s for s in states if not s.done]
      chosen = dict(zip(map(id, active), policy(active)))
      actions = [chosen.get(id(s)) for s in states]
      for state, action, result in zip(states, actions, batch_env.step(actions)):
        if result is None:
          continue
        if verbose:
          print(f"[{state.task.task_id}] {state.step}> {action}\n  {result.observation}")
        state.history.append(Turn(state.observation, action))
        state.observation, state.info, state.done = result.observation, result.info, result.done
    for s in states:
      records.append({"task_id": s.task.task_id, "task_type": s.task.task_type,
                      "won": bool(s.info.get("won")), "steps": len(s.history),
                      "failed": s.info.get("failed", "")})
  return records


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
  """Success rate per task type and overall (mean of `won`)."""
  by_type = collections.defaultdict(list)
  for record in records:
    by_type[record["task_type"]].append(record["won"])
  per_type = {t: sum(w) / len(w) for t, w in sorted(by_type.items())}
  overall = sum(r["won"] for r in records) / max(1, len(records))
  return {"episodes": len(records), "success": overall, "success_per_type": per_type,
          "episodes_per_type": {t: len(w) for t, w in sorted(by_type.items())},
          "failed": sum(bool(r["failed"]) for r in records)}


def run(env_name: str, policy_name: str, split: str, episodes: int, seed: int, workers: int,
        batch_size: int, overrides: list[str], model: str = "", verbose: bool = False,
        temperature: float = 0.4, max_new_tokens: int = 512) -> dict[str, Any]:
  """Loads tasks, plays them with the named policy, returns the summary."""
  env_module = get_env_module(env_name)
  config = apply_overrides(env_module.default_config(), overrides)
  if episodes and "num_games" in config and split in config.num_games:
    config.num_games[split] = min(config.num_games[split], episodes)  # generate no more
  tasks = env_module.load_tasks(config, split)
  if not tasks:
    raise ValueError(f"{env_name} has no {split} tasks")
  if episodes:
    tasks = [tasks[i % len(tasks)] for i in range(episodes)]
  scripted = {"expert": lambda: expert_policy,
              "random": lambda: make_random_policy(env_module, seed),
              "human": lambda: human_policy}
  with_expert = policy_name == "expert"
  if workers > 0:
    from seed_jax.envs.pool import EnvPool  # pylint: disable=g-import-not-at-top
    batch_env = EnvPool(env_name, config, num_workers=workers, with_expert=with_expert, seed=seed)
  else:
    batch_env = LocalBatch(env_module, config, with_expert)
  try:
    if policy_name == "model":
      records = play_with_model(batch_env, env_module, config, tasks, model, seed, batch_size,
                                temperature, max_new_tokens)
    else:
      batch = 1 if policy_name == "human" else batch_size
      records = play_episodes(batch_env, tasks, scripted[policy_name](), seed, batch, verbose)
  finally:
    batch_env.close()
  return summarize(records)


def print_summary(env_name: str, policy_name: str, split: str, summary: dict[str, Any]) -> None:
  print(f"\n{env_name} / {split} / policy={policy_name}: {summary['episodes']} episodes")
  for task_type, rate in summary["success_per_type"].items():
    count = summary["episodes_per_type"][task_type]
    print(f"  {task_type:<24s} {rate * 100:6.1f}%  ({round(rate * count)}/{count})")
  print(f"  {'overall':<24s} {summary['success'] * 100:6.1f}%")
  print(json.dumps(summary))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _POLICY.value == "model" and not _MODEL.value:
    raise app.UsageError("--policy=model needs --model")
  env_name, policy_name, split = _ENV.value, _POLICY.value, _SPLIT.value
  summary = run(env_name, policy_name, split, _EPISODES.value, _SEED.value, _WORKERS.value,
                _BATCH.value, _SET.value, _MODEL.value, _VERBOSE.value, _TEMPERATURE.value,
                _MAX_NEW_TOKENS.value)
  print_summary(env_name, policy_name, split, summary)  # its last line is the JSON summary
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
