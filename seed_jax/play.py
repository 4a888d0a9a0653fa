"""Plays episodes of an environment with a policy and prints success per task type.

  python -m seed_jax.play --env=alfworld --policy=expert --split=valid_seen --episodes=12
  python -m seed_jax.play --env=alfworld --policy=human --episodes=1
  python -m seed_jax.play --env=alfworld --policy=model --model=SmolLM2-135M-Instruct
  python -m seed_jax.play --env=alfworld --policy=random --set=data_dir=embedded --set=max_steps=30
  python -m seed_jax.play --env=ezpoints --policy=expert --episodes=50 --verbose

Policies: "expert" (the env's oracle, `info["expert_action"]`, acting through the env's
format), "random" (a uniformly random admissible action), "human" (you type), "model" (an
LLM through the acting prompt and the action parser, as in training). Every policy plays
through the training acting loop (`seed_jax.agent.loop`), with the env's turn limit
(`--set=max_steps=N`). Episodes run in this process (`--workers=0`, an `InProcessPool`) or
in an `EnvPool` of worker processes.
"""

from __future__ import annotations

from seed_jax import cli

if __name__ == "__main__":  # before jax and transformers load
  cli.quiet_startup()

# pylint: disable=wrong-import-position

import ast
import collections
import json
import sys
from typing import Any

from absl import app, flags

from seed_jax.agent import policies
from seed_jax.agent.loop import Episode, Policy, StepTaken, episode_stats, run_episodes
from seed_jax.envs.base import SPLITS, Task
from seed_jax.envs.pool import EnvPool, InProcessPool
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


def model_policy(env_module, config, model: str, seed: int, temperature: float,
                 max_new_tokens: int, max_cache_len: int = 4096) -> Policy:
  """The training rollouts' model policy (`seed_jax.train.rollout.ModelPolicy`: same
  prompts, sampler and parsing; a malformed response is an invalid no-op)."""
  # pylint: disable=g-import-not-at-top
  from seed_jax.agent.prompts import PromptEncoder
  from seed_jax.sampling.sampler import sampler_for
  from seed_jax.train import rollout
  sampler = sampler_for(model, max_cache_len=max_cache_len)
  encoder = PromptEncoder.for_model(sampler.tokenizer, sampler.cfg, model)
  spec = rollout.RolloutSpec(max_turns=config.max_steps, temperature=temperature,
                             max_new_tokens=max_new_tokens,
                             max_prompt_tokens=max_cache_len - max_new_tokens)
  return rollout.ModelPolicy(sampler, encoder, env_module.make_agent_format(config), spec, seed)


def make_policy(policy_name: str, env_module, config, seed: int, model: str = "",
                temperature: float = 0.4, max_new_tokens: int = 512) -> Policy:
  """The named policy for this env family."""
  if policy_name == "expert":
    return policies.expert_policy(env_module.make_agent_format(config))
  if policy_name == "random":
    return policies.random_policy(seed, getattr(env_module, "random_action", None))
  if policy_name == "human":
    return policies.human_policy()
  if policy_name == "model":
    return model_policy(env_module, config, model, seed, temperature, max_new_tokens)
  raise ValueError(f"unknown policy {policy_name!r}; known: {POLICIES}")


def image_note(info: dict[str, Any]) -> str:
  """What stands for the info's image in printed text, e.g. " [image 300x300x3]" ("" when
  the info has none): an array's digits tell a reader nothing."""
  image = info.get("image")
  return "" if image is None else f" [image {'x'.join(map(str, image.shape))}]"


def print_step(episode: Episode, step: StepTaken) -> None:
  """--verbose: one line per step, then what the env answered (an image as its shape)."""
  invalid = "" if step.decision.valid else " (invalid)"
  print(f"[{episode.task.task_id}] {len(episode.steps)}> {step.decision.action}{invalid}\n"
        f"  {episode.observation}{image_note(episode.info)}")


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


def play_tasks(pool, tasks: list[Task], policy: Policy, max_turns: int, seed: int,
               batch_size: int, verbose: bool = False, progress: bool = True
               ) -> list[Episode]:
  """Plays every task once with `policy` through the acting loop, `batch_size` episodes at
  a time (the chunk starting at task i resets with seed `seed + i`); `verbose` prints every
  step, `progress` shows a bar (neither for a human, who sees every step anyway)."""
  episodes = []
  for start in range(0, len(tasks), batch_size):
    chunk = tasks[start:start + batch_size]
    # Later chunks see later turn numbers, so a model samples them with fresh seeds even
    # when a task comes back (more episodes than tasks).
    turn_offset = start // batch_size * max_turns
    episodes += run_episodes(
        pool, chunk, lambda live, turn, offset=turn_offset: policy(live, turn + offset),
        max_turns=max_turns, seed=seed + start,
        desc=f"episodes {start + 1}-{start + len(chunk)}" if progress and not verbose else None,
        on_step=print_step if verbose else None)
  return episodes


def summarize(episodes: list[Episode]) -> dict[str, Any]:
  """Success rate per task type and overall, failed episodes, the invalid-action rate and
  the rate of valid moves that changed nothing."""
  by_type = collections.defaultdict(list)
  for episode in episodes:
    by_type[episode.task.task_type].append(episode.won)
  stats = episode_stats(episodes)
  return {"episodes": len(episodes), "success": stats["success"],
          "success_per_type": {t: sum(w) / len(w) for t, w in sorted(by_type.items())},
          "episodes_per_type": {t: len(w) for t, w in sorted(by_type.items())},
          "failed": stats["failed_episodes"], "mean_turns": stats["mean_turns"],
          "invalid_action_rate": stats["invalid_action_rate"],
          "ineffective_action_rate": stats["ineffective_action_rate"]}


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
  policy = make_policy(policy_name, env_module, config, seed, model, temperature,
                       max_new_tokens)
  with_expert = policy_name == "expert"
  if workers > 0:
    pool = EnvPool(env_name, config, num_workers=workers, with_expert=with_expert, seed=seed)
  else:
    pool = InProcessPool(lambda: env_module.make_env(config, with_expert=with_expert))
  with pool:
    human = policy_name == "human"
    episodes = play_tasks(pool, tasks, policy, config.max_steps, seed,
                          1 if human else batch_size, verbose, progress=not human)
  return summarize(episodes)


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
  cli.run(main)
