"""Checks a run's config before anything is loaded or compiled; errors name the key.

ml_collections already rejects unknown keys and ill-typed overrides on the command line
(`--config.rl.lambda_opd=abc`); this adds the value checks: enums, ranges, and the
consistency between keys.
"""

from __future__ import annotations

from typing import Any, Callable

import ml_collections

from seed_jax.envs.registry import ENV_NAMES, get_env_module
from seed_jax.models.config import DTYPES
from seed_jax.parallel.rules import validate_rules
from seed_jax.seed.train_step import TEACHER_MODES
from seed_jax.train.algorithms import ALGORITHMS


class ConfigError(ValueError):
  """A bad config value; the message starts with the key."""


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  node = config
  for part in key.split("."):
    if part not in node:
      raise ConfigError(f"config.{key}: missing")
    node = node[part]
  return node


def _check(config, key: str, ok: Callable[[Any], bool], want: str) -> None:
  value = _get(config, key)
  if not ok(value):
    raise ConfigError(f"config.{key}: {want}, got {value!r}")


def _one_of(choices):
  return lambda v: v in choices


def _positive(v):
  return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _non_negative(v):
  return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` naming the first bad key."""
  _check(config, "algorithm", _one_of(ALGORITHMS), f"one of {ALGORITHMS}")
  _check(config, "model.dtype", _one_of(DTYPES), f"one of {tuple(DTYPES)}")
  _check(config, "model.param_dtype", _one_of(DTYPES), f"one of {tuple(DTYPES)}")
  _check(config, "model.name", lambda v: isinstance(v, str) and v, "a model name or path")
  for axis in ("data", "fsdp", "tensor"):
    _check(config, f"mesh.{axis}", lambda v: v == -1 or (isinstance(v, int) and v > 0),
           "a positive size or -1")
  try:
    validate_rules(config.mesh.rules)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from e
  _check(config, "env.name", _one_of(ENV_NAMES), f"one of {ENV_NAMES}")
  known = set(get_env_module(config.env.name).default_config().keys()) | {"name"}
  unknown = sorted(set(config.env.keys()) - known)
  if unknown:
    raise ConfigError(f"config.env.{unknown[0]}: not a setting of env {config.env.name!r}")
  _check(config, "env.max_steps", lambda v: isinstance(v, int) and v > 0, "a positive integer")
  if "task_types" in config.env:
    known_types = tuple(get_env_module(config.env.name).TASK_TYPES)
    _check(config, "env.task_types", lambda v: v and all(t in known_types for t in v),
           f"a non-empty selection of {known_types}")
  if "solvable_within" in config.env:
    _check(config, "env.solvable_within", lambda v: isinstance(v, int) and v > 0,
           "a positive number of expert steps")
  _check(config, "pool.num_workers", _positive, "a positive integer")
  _check(config, "pool.step_timeout_s", _positive, "a positive number of seconds")
  for key in ("rollout.tasks_per_batch", "rollout.group_size", "rollout.max_new_tokens",
              "rollout.max_prompt_tokens", "rl.mini_batch_size", "rl.micro_batch_size",
              "rl.logprob_chunk", "sft.rollouts_per_task", "sft.max_turns", "sft.batch_size",
              "sft.max_tokens", "analyzer.max_new_tokens", "checkpoint.keep"):
    _check(config, key, lambda v: isinstance(v, int) and v > 0, "a positive integer")
  for key in ("rl.iterations", "sft.tasks_per_type", "sft.epochs", "bc.episodes",
              "bc.epochs", "eval.every", "eval.max_episodes", "checkpoint.every",
              "rl.warmup_steps", "analyzer.max_retries"):
    _check(config, key, lambda v: isinstance(v, int) and v >= 0, "a non-negative integer")
  for key in ("rl.learning_rate", "sft.learning_rate", "bc.learning_rate"):
    _check(config, key, _positive, "a positive number")
  for key in ("rl.clip_ratio_low", "rl.clip_ratio_high", "rl.kl_coef", "rl.entropy_coef",
              "rl.beta_opd", "rl.lambda_opd", "rl.invalid_penalty", "rl.grad_clip",
              "rl.dual_clip", "rl.weight_decay", "rollout.temperature", "eval.temperature",
              "sft.temperature", "analyzer.temperature"):
    _check(config, key, _non_negative, "a non-negative number")
  _check(config, "rl.dual_clip", lambda v: v == 0 or v > 1, "0 (off) or greater than 1")
  _check(config, "rollout.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
  for key in ("sft.holdout_fraction", "sft.warmup_fraction"):
    _check(config, key, lambda v: 0 <= v < 1, "in [0, 1)")
  _check(config, "rl.teacher_mode", _one_of(TEACHER_MODES), f"one of {TEACHER_MODES}")
  _check(config, "analyzer.backend", _one_of(("policy", "openai", "oracle")),
         "one of ('policy', 'openai', 'oracle')")
  _check(config, "sft.analyzer_backend", _one_of(("openai", "oracle")),
         "one of ('openai', 'oracle') (the stage-1 external analyzer)")
  _check(config, "eval.splits", lambda v: all(s in ("train", "valid_seen", "valid_unseen")
                                              for s in v), "splits among train/valid_*")
  if "openai" in (config.analyzer.backend, config.sft.analyzer_backend):
    _check(config, "analyzer.openai.base_url", lambda v: isinstance(v, str) and v,
           "the endpoint's base URL (the openai backend is selected)")
    _check(config, "analyzer.openai.model", lambda v: isinstance(v, str) and v,
           "the endpoint's model name (the openai backend is selected)")
