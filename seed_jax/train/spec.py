"""The run spec: the config file's ConfigDict turned into frozen, typed specs, once.

Every component takes its own spec (`LossConfig`, `OptimConfig`, `TrainStepConfig`,
`BatchConfig`, `RolloutSpec`, `AnalyzerConfig`, `FineTuneSpec`, `MeshConfig`) and validates
it in its constructor. This module is the only place that reads config keys: each spec is
built by `_build` from a table {spec field: config key}, so a value the constructor rejects
is reported as a `ConfigError` naming the config key, before anything is loaded or compiled.
The trainer receives a `RunSpec` and copies nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

import ml_collections

from seed_jax import paths
from seed_jax.checks import (SpecError, fraction, non_negative, non_negative_int, one_of,
                             positive, positive_int, require, unit_interval)
from seed_jax.envs.agent_format import shows_images
from seed_jax.envs.registry import ENV_NAMES, get_env_module
from seed_jax.models.config import DTYPES, LORA_TARGETS, REMAT_POLICIES
from seed_jax.models.embedded import EMBEDDED_MODELS
from seed_jax.models.shapes import MODEL_SHAPES
from seed_jax.parallel.mesh import MeshConfig
from seed_jax.parallel.rules import validate_rules
from seed_jax.seed.analyzer import AnalyzerConfig
from seed_jax.seed.batch import BatchConfig
from seed_jax.wandb_sink import WandbSettings
from seed_jax.seed.losses import OPD_SPANS, LossConfig
from seed_jax.seed.skills import PLACEMENTS
from seed_jax.seed.optim import OptimConfig
from seed_jax.seed.train_step import TrainStepConfig
from seed_jax.train.algorithms import ALGORITHMS, Algorithm, get_algorithm
from seed_jax.train.rollout import RolloutSpec
from seed_jax.train.sft import FineTuneSpec

SPLITS = ("train", "valid_seen", "valid_unseen")


class ConfigError(ValueError):
  """A bad config value; the message starts with the key."""


# What an HF folder's weights are stored as (seed_jax.models.weights.SafetensorsSource).
_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def is_model_name(name: Any) -> bool:
  """Whether `name` is a model `seed_jax.models.model_config` can read without loading any
  weights: an embedded model, a model shape, an HF folder (its config.json) or a .gguf file.
  """
  if not isinstance(name, str) or not name:
    return False
  if name in EMBEDDED_MODELS or name in MODEL_SHAPES:
    return True
  path = os.path.expanduser(name)  # as seed_jax.models.shapes.existing_model_path
  if os.path.isdir(path):
    return os.path.isfile(os.path.join(path, "config.json"))
  return path.endswith(".gguf") and os.path.isfile(path)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Which weights, in which dtypes (`model.*`).

  `name` is checked to exist, not read: a model shape (no weights) is a valid name for
  planning (`--dry_run`, seed_jax.plan), and `weights_error` says why a run cannot train it.
  """
  name: str
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "full"
  lora_rank: int = 0  # model.lora.*: low-rank adapters train, the base stays frozen
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = LORA_TARGETS

  def __post_init__(self):
    require(self, "name", is_model_name,
            f"an embedded model ({', '.join(EMBEDDED_MODELS)}), a model shape "
            f"({', '.join(MODEL_SHAPES)}), a Hugging Face folder (with config.json) or a "
            f".gguf file")
    require(self, ("dtype", "param_dtype"), one_of(DTYPES), f"one of {tuple(DTYPES)}")
    require(self, "remat", one_of(REMAT_POLICIES), f"one of {REMAT_POLICIES}")
    require(self, "lora_rank", non_negative_int, "a non-negative integer (0: no LoRA)")
    require(self, "lora_alpha", positive, "a positive number")
    require(self, "lora_targets",
            lambda t: bool(t) and not isinstance(t, str) and set(t) <= set(LORA_TARGETS),
            f"a non-empty selection of {LORA_TARGETS}")

  @property
  def load_kwargs(self) -> dict[str, Any]:
    """`load_model`'s keyword arguments for these weights."""
    return dict(dtype=self.dtype, param_dtype=self.param_dtype, remat=self.remat,
                lora_rank=self.lora_rank, lora_alpha=float(self.lora_alpha),
                lora_targets=tuple(self.lora_targets))

  def weights_error(self) -> str | None:
    """Why `name` has no weights to train or evaluate, as one line naming the key; None
    when it has (an embedded model, a .gguf file, an HF folder with safetensors)."""
    if self.name in MODEL_SHAPES:
      return (f"config.model.name: {self.name!r} is a model shape without weights (for "
              f"--dry_run and seed_jax.plan); point it at a Hugging Face folder of its weights")
    path = os.path.expanduser(self.name)
    if os.path.isdir(path) and not any(
        os.path.exists(os.path.join(path, file)) for file in _HF_WEIGHTS):
      return f"config.model.name: {self.name} holds no {' or '.join(_HF_WEIGHTS)}"
    return None


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """The env family, its own settings (`env.*` without `name`) and its worker pool."""
  name: str
  settings: ml_collections.FrozenConfigDict
  num_workers: int = 8
  step_timeout_s: float = 60.0

  def __post_init__(self):
    require(self, "num_workers", positive_int, "a positive integer")
    require(self, "step_timeout_s", positive, "a positive number of seconds")

  @property
  def max_steps(self) -> int:
    return self.settings.max_steps

  def with_settings(self, **overrides) -> ml_collections.ConfigDict:
    """A mutable copy of the settings with `overrides` (e.g. stage 1's turn limit)."""
    settings = ml_collections.ConfigDict(self.settings.as_configdict().to_dict())
    for key, value in overrides.items():
      settings[key] = value
    return settings


@dataclasses.dataclass(frozen=True)
class RLSpec:
  """Stage 2: what an iteration plays and how its update is split (`rl.*`, `rollout.*`).

  Attributes:
    opd: the OPD term is on: the algorithm has it and `rl.lambda_opd > 0`. Off, no skill
      is analysed and no teacher row is built or scored.
    kl: a reference model is kept (`rl.kl_coef > 0`).
    spread_outcome_rows: the rows with an outcome signal dealt round-robin over the
      mini-batches (`batch.spread_row_order`) instead of slicing in batch order.
    opd_span: the response tokens the OPD term counts (`OPD_SPANS`): "response", every
      one (the paper's); "decision", only where the response first names its action
      (`agent_format.decision_char_span`), so that the teacher's other opinions (on the
      reasoning's wording, given a skill to follow) do not enter the term.
  """
  iterations: int
  tasks_per_batch: int
  group_size: int
  mini_batch_size: int
  micro_batch_size: int
  opd: bool
  kl: bool
  pack_rows: int = 0
  spread_outcome_rows: bool = False
  opd_span: str = "response"

  def __post_init__(self):
    require(self, ("iterations", "pack_rows"), non_negative_int, "a non-negative integer")
    require(self, "opd_span", one_of(OPD_SPANS), f"one of {OPD_SPANS}")
    require(self, ("tasks_per_batch", "group_size", "mini_batch_size", "micro_batch_size"),
            positive_int, "a positive integer")
    require(self, "mini_batch_size", lambda v: v % self.micro_batch_size == 0,
            f"a multiple of rl.micro_batch_size ({self.micro_batch_size})")
    require(self, "pack_rows", lambda v: v == 0 or self.micro_batch_size % v == 0,
            f"0 or a divisor of rl.micro_batch_size ({self.micro_batch_size})")

  @property
  def sequences_per_mini_batch(self) -> int:
    """Forward rows of one optimizer step: the mini-batch's turns, or its packed
    sequences."""
    return self.mini_batch_size // (self.pack_rows or 1)


@dataclasses.dataclass(frozen=True)
class Stage1Spec:
  """Stage 1 (`sft.*`): rollouts of the base policy, external labels, skill SFT."""
  tasks_per_type: int
  rollouts_per_task: int
  history_length: int
  rollout: RolloutSpec
  annotator: AnalyzerConfig
  fine_tune: FineTuneSpec
  # Behaviour-cloning examples trained on beside each analyzer example (`sft.rehearsal`;
  # a small-model aid, 0 in the paper presets): the expert's steps on the first
  # `rehearsal_episodes` training tasks (`bc.episodes`), played with
  # `rehearsal_env_settings` (`bc.env_settings`), a `rehearsal_skill_fraction`
  # (`bc.skill_fraction`) of them shown with the oracle skill, as the warm start made them.
  rehearsal: float = 0.0
  rehearsal_episodes: int = 0
  rehearsal_skill_fraction: float = 0.0
  rehearsal_env_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    require(self, "tasks_per_type", non_negative_int, "a non-negative integer")
    require(self, "rollouts_per_task", positive_int, "a positive integer")
    require(self, "rehearsal", non_negative, "a non-negative number")
    if self.rehearsal > 0 and not self.rehearsal_episodes:
      raise SpecError("rehearsal", "rehearses the expert episodes of config.bc.episodes, "
                      "which is 0")
    require(self, "annotator", lambda a: a.backend in ("openai", "oracle"),
            "an external analyzer backend, one of ('openai', 'oracle')")


@dataclasses.dataclass(frozen=True)
class BehaviourCloningSpec:
  """The optional warm start (`bc.*`): clone the env expert on the first `episodes` tasks.

  Attributes:
    skill_fraction: the share of the cloned steps shown a second time with that game's
      oracle skill through H, so the policy learns to act on a skill in its prompt (a
      small-model aid of issue 24; 0 in the paper presets).
    disjoint: RL trains on the training games the warm start did not clone (cloning the
      very games RL trains on leaves the teacher nothing to teach).
    env_settings: env settings the cloned games are played with instead of `env.*` (e.g.
      Sokoban's `max_solution_steps`: a warm start on shorter puzzles than RL's, whose
      longer ones leave it room to learn); empty, the env's own.
  """
  episodes: int
  fine_tune: FineTuneSpec
  skill_fraction: float = 0.0
  disjoint: bool = False
  env_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    require(self, "episodes", non_negative_int, "a non-negative integer")
    require(self, "skill_fraction", unit_interval, "a fraction in [0, 1]")


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """Held-out evaluation (`eval.*`)."""
  every: int
  splits: tuple[str, ...]
  max_episodes: int
  at_end: bool
  rollout: RolloutSpec

  def __post_init__(self):
    require(self, ("every", "max_episodes"), non_negative_int, "a non-negative integer")
    require(self, "splits", lambda v: all(s in SPLITS for s in v), f"splits among {SPLITS}")


@dataclasses.dataclass(frozen=True)
class OutputSpec:
  """What the run writes (`checkpoint.*`, `log.*`)."""
  checkpoint_every: int
  checkpoint_keep: int
  export_hf: bool
  tensorboard: bool
  plots: bool
  wandb: bool = False
  wandb_settings: WandbSettings = WandbSettings()

  def __post_init__(self):
    require(self, "checkpoint_every", non_negative_int, "a non-negative integer")
    require(self, "checkpoint_keep", positive_int, "a positive integer")
    require(self, "wandb", lambda v: isinstance(v, bool), "True or False")


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything a run decides, typed and validated."""
  algorithm: Algorithm
  seed: int
  model: ModelSpec
  init_from: str  # weights replacing the model's at the start ("": none); train/init_from.py
  mesh: MeshConfig
  env: EnvSpec
  rl: RLSpec
  rollout: RolloutSpec
  optim: OptimConfig
  train_step: TrainStepConfig
  batch: BatchConfig
  analyzer: AnalyzerConfig
  analyzer_max_prompt_tokens: int
  static_library: str
  skill_placement: str  # where H puts a skill (seed_jax.seed.skills.PLACEMENTS)
  stage1: Stage1Spec
  bc: BehaviourCloningSpec | None
  eval: EvalSpec
  output: OutputSpec
  config_json: str  # the config as given, saved as workdir/config.json

  @property
  def max_cache_len(self) -> int:
    """The sampler's cache bound: the longest prompt (acting or analysing) plus the longest
    response, rounded up to a power of two (each call sizes its own cache below it)."""
    prompt = max(self.rollout.max_prompt_tokens, self.analyzer_max_prompt_tokens)
    new = max(self.rollout.max_new_tokens, self.analyzer.max_tokens)
    return 1 << (prompt + new - 1).bit_length()


# ------------------------------------------------------------------ building


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  node = config
  for part in key.split("."):
    if part not in node:
      raise ConfigError(f"config.{key}: missing")
    node = node[part]
  return node


def _build(cls, config: ml_collections.ConfigDict, keys: Mapping[str, str], **derived):
  """`cls(**{field: config[key]}, **derived)`; a rejected field is named by its key."""
  values = {field: _get(config, key) for field, key in keys.items()}
  try:
    return cls(**values, **derived)
  except SpecError as e:
    where = f"config.{keys[e.field]}" if e.field in keys else f"{cls.__name__}.{e.field}"
    raise ConfigError(f"{where}: {e.problem}") from None


def _env_spec(config: ml_collections.ConfigDict) -> EnvSpec:
  name = _get(config, "env.name")
  if name not in ENV_NAMES:
    raise ConfigError(f"config.env.name: one of {ENV_NAMES}, got {name!r}")
  module = get_env_module(name)
  unknown = sorted(set(config.env.keys()) - set(module.default_config().keys()) - {"name"})
  if unknown:
    raise ConfigError(f"config.env.{unknown[0]}: not a setting of env {name!r}")
  env = config.env
  _check_env_settings(env, module, lambda key: f"config.env.{key}")
  settings = ml_collections.FrozenConfigDict({k: v for k, v in env.items() if k != "name"})
  return _build(EnvSpec, config, {"num_workers": "pool.num_workers",
                                  "step_timeout_s": "pool.step_timeout_s"},
                name=name, settings=settings)


def _check_env_settings(env, module, where: Callable[[str], str]) -> None:
  """The values of an env's settings (the run's `env.*`, or with `bc.env_settings` over
  them); `where(key)` names the config key a value came from."""
  if not positive_int(env.max_steps):
    raise ConfigError(f"{where('max_steps')}: a positive integer, got {env.max_steps!r}")
  if "task_types" in env:
    known = tuple(module.TASK_TYPES)
    if not (env.task_types and all(t in known for t in env.task_types)):
      raise ConfigError(f"{where('task_types')}: a non-empty selection of {known}, "
                        f"got {env.task_types!r}")
  if "prompt_style" in env and env.prompt_style not in module.PROMPT_STYLES:
    raise ConfigError(f"{where('prompt_style')}: one of {tuple(module.PROMPT_STYLES)}, got "
                      f"{env.prompt_style!r}")
  if "solvable_within" in env and not positive_int(env.solvable_within):
    raise ConfigError(f"{where('solvable_within')}: a positive number of expert steps, got "
                      f"{env.solvable_within!r}")
  if "max_solution_steps" in env:
    _check_solution_steps(env, where)


def _check_solution_steps(settings, where: Callable[[str], str]) -> None:
  """Sokoban's band of puzzle lengths: positive, the minimum not above the maximum."""
  for key in ("min_solution_steps", "max_solution_steps"):
    if not positive_int(settings[key]):
      raise ConfigError(f"{where(key)}: a positive number of moves, got {settings[key]!r}")
  if settings.min_solution_steps > settings.max_solution_steps:
    raise ConfigError(f"{where('min_solution_steps')} ({settings.min_solution_steps}) is above "
                      f"{where('max_solution_steps')} ({settings.max_solution_steps})")


def _bc_env_settings(config: ml_collections.ConfigDict, env: EnvSpec) -> dict[str, Any]:
  """`bc.env_settings` as a dict, each key a setting of the env and the settings it makes
  valid by the run's own checks (a bad one named by its key)."""
  overrides = _get(config, "bc.env_settings").to_dict()
  unknown = sorted(set(overrides) - set(env.settings.keys()))
  if unknown:
    raise ConfigError(f"config.bc.env_settings.{unknown[0]}: not a setting of env "
                      f"{env.name!r}")
  _check_env_settings(env.with_settings(**overrides), get_env_module(env.name), lambda key: (
      f"config.bc.env_settings.{key}" if key in overrides else f"config.env.{key}"))
  return overrides


def _mesh(config: ml_collections.ConfigDict) -> MeshConfig:
  for axis in ("data", "fsdp", "tensor"):
    size = _get(config, f"mesh.{axis}")
    if not (size == -1 or positive_int(size)):
      raise ConfigError(f"config.mesh.{axis}: a positive size or -1, got {size!r}")
  try:
    rules = validate_rules(config.mesh.rules)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  return MeshConfig(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, rules)


def _analyzer(config, backend_key: str) -> AnalyzerConfig:
  backend = _get(config, backend_key)
  choices = ("policy", "openai", "oracle")
  if backend not in choices:
    raise ConfigError(f"config.{backend_key}: one of {choices}, got {backend!r}")
  if backend == "openai":
    for key in ("analyzer.openai.base_url", "analyzer.openai.model"):
      if not _get(config, key):
        raise ConfigError(f"config.{key}: needed by the openai backend ({backend_key})")
  return _build(AnalyzerConfig, config, {
      "backend": backend_key, "max_retries": "analyzer.max_retries",
      "retry_temperature": "analyzer.retry_temperature",
      "min_skill_words": "analyzer.min_skill_words", "base_url": "analyzer.openai.base_url",
      "model": "analyzer.openai.model", "api_key_env": "analyzer.openai.api_key_env",
      "timeout_s": "analyzer.openai.timeout_s",
      "http_retries": "analyzer.openai.max_http_retries",
      "temperature": "analyzer.temperature", "max_tokens": "analyzer.max_new_tokens",
      "decode_batch": "analyzer.decode_batch", "answer_prefix": "analyzer.answer_prefix",
      "group_hindsight": "analyzer.group_hindsight"})


def _rollout(config, *, max_turns: int, temperature_key: str, top_p_key: str | None
             ) -> RolloutSpec:
  keys = {"temperature": temperature_key, "max_new_tokens": "rollout.max_new_tokens",
          "max_prompt_tokens": "rollout.max_prompt_tokens", "continuous": "rollout.continuous"}
  if top_p_key:
    keys["top_p"] = top_p_key
  return _build(RolloutSpec, config, keys, max_turns=max_turns)


def build_run_spec(config: ml_collections.ConfigDict) -> RunSpec:
  """Reads and checks every key of `config`; raises `ConfigError` naming the first bad one."""
  name = _get(config, "algorithm")
  if name not in ALGORITHMS:
    raise ConfigError(f"config.algorithm: one of {ALGORITHMS}, got {name!r}")
  algorithm = get_algorithm(name)
  model = _build(ModelSpec, config, {"name": "model.name", "dtype": "model.dtype",
                                     "param_dtype": "model.param_dtype",
                                     "remat": "model.remat", "lora_rank": "model.lora.rank",
                                     "lora_alpha": "model.lora.alpha",
                                     "lora_targets": "model.lora.targets"})
  mesh = _mesh(config)
  env = _env_spec(config)
  loss = _build(LossConfig, config, {
      "clip_low": "rl.clip_ratio_low", "clip_high": "rl.clip_ratio_high",
      "dual_clip": "rl.dual_clip", "kl_coef": "rl.kl_coef",
      "entropy_coef": "rl.entropy_coef", "beta_opd": "rl.beta_opd",
      "opd_gate_baseline": "rl.opd_gate_baseline",
      "lambda_opd": "rl.lambda_opd"})
  opd = algorithm.opd and loss.lambda_opd > 0
  rl = _build(RLSpec, config, {
      "iterations": "rl.iterations", "tasks_per_batch": "rollout.tasks_per_batch",
      "group_size": "rollout.group_size", "mini_batch_size": "rl.mini_batch_size",
      "micro_batch_size": "rl.micro_batch_size", "pack_rows": "rl.pack_rows",
      "spread_outcome_rows": "rl.spread_outcome_rows", "opd_span": "rl.opd_span"},
      opd=opd, kl=loss.kl_coef > 0)
  if not opd:  # no teacher: the loss has no OPD term
    loss = dataclasses.replace(loss, lambda_opd=0.0)
  optim = _build(OptimConfig, config, {
      "learning_rate": "rl.learning_rate", "warmup_steps": "rl.warmup_steps",
      "weight_decay": "rl.weight_decay", "grad_clip": "rl.grad_clip"})
  train_step = _build(TrainStepConfig, config, {
      "teacher_mode": "rl.teacher_mode", "logprob_chunk": "rl.logprob_chunk"},
      micro_batches=rl.mini_batch_size // rl.micro_batch_size, loss=loss)
  rollout = _rollout(config, max_turns=env.max_steps, temperature_key="rollout.temperature",
                     top_p_key="rollout.top_p")
  batch = _build(BatchConfig, config, {
      "response_len": "rollout.max_new_tokens", "invalid_penalty": "rl.invalid_penalty",
      "ineffective_penalty": "rl.ineffective_penalty",
      "norm_by_std": "rl.normalize_std", "advantage_mode": "rl.advantage_mode",
      "skip_zero_advantage_groups": "rl.skip_zero_advantage_groups",
      "prompt_bucket": "rl.prompt_bucket"},
      # Teacher prompts are longer by the skill block: room for it beyond the prompt cut.
      max_prompt_len=rollout.max_prompt_tokens + 256, rows_multiple=rl.mini_batch_size,
      shared_prompt_len=opd and train_step.teacher_mode == "joint")
  analyzer = _analyzer(config, "analyzer.backend")
  analyzer_prompt = _get(config, "analyzer.max_prompt_tokens")
  if not positive_int(analyzer_prompt):
    raise ConfigError(f"config.analyzer.max_prompt_tokens: a positive integer, got "
                      f"{analyzer_prompt!r}")

  sft_keys = {"epochs": "sft.epochs", "batch_size": "sft.batch_size",
              "learning_rate": "sft.learning_rate", "warmup_fraction": "sft.warmup_fraction",
              "max_tokens": "sft.max_tokens", "holdout_fraction": "sft.holdout_fraction",
              "grad_clip": "rl.grad_clip", "chunk": "rl.logprob_chunk",
              "pack_rows": "sft.pack_rows"}
  cloned_env_settings = _bc_env_settings(config, env)
  stage1 = _build(Stage1Spec, config, {
      "tasks_per_type": "sft.tasks_per_type", "rollouts_per_task": "sft.rollouts_per_task",
      "history_length": "sft.history_length", "rehearsal": "sft.rehearsal",
      "rehearsal_episodes": "bc.episodes", "rehearsal_skill_fraction": "bc.skill_fraction"},
      rollout=_rollout(config, max_turns=_positive_key(config, "sft.max_turns"),
                       temperature_key="sft.temperature", top_p_key=None),
      annotator=_analyzer(config, "sft.analyzer_backend"),
      rehearsal_env_settings=cloned_env_settings,
      fine_tune=_build(FineTuneSpec, config, sft_keys, b2=0.95, weight_decay=0.01))
  analyzer_row = analyzer_prompt + analyzer.max_tokens
  if algorithm.stage1_sft and stage1.fine_tune.max_tokens < analyzer_row:
    raise ConfigError(
        f"config.sft.max_tokens: at least analyzer.max_prompt_tokens + "
        f"analyzer.max_new_tokens ({analyzer_row}) so that skill SFT sees whole analyzer "
        f"prompts, got {stage1.fine_tune.max_tokens}")
  bc = None
  if _get(config, "bc.enabled"):
    bc = _build(BehaviourCloningSpec, config, {"episodes": "bc.episodes",
                                               "skill_fraction": "bc.skill_fraction",
                                               "disjoint": "bc.disjoint"},
                fine_tune=_build(FineTuneSpec, config, {
                    "epochs": "bc.epochs", "batch_size": "bc.batch_size",
                    "learning_rate": "bc.learning_rate", "max_tokens": "sft.max_tokens",
                    "grad_clip": "rl.grad_clip", "chunk": "rl.logprob_chunk",
                    "pack_rows": "bc.pack_rows"},
                    warmup_fraction=0.0, b2=0.95, weight_decay=0.0),
                env_settings=cloned_env_settings)
  evaluation = _build(EvalSpec, config, {
      "every": "eval.every", "splits": "eval.splits", "max_episodes": "eval.max_episodes",
      "at_end": "eval.at_end"},
      rollout=_rollout(config, max_turns=env.max_steps, temperature_key="eval.temperature",
                       top_p_key=None))
  output = _build(OutputSpec, config, {
      "checkpoint_every": "checkpoint.every", "checkpoint_keep": "checkpoint.keep",
      "export_hf": "checkpoint.export_hf", "tensorboard": "log.tensorboard",
      "plots": "log.plots", "wandb": "log.wandb"},
      wandb_settings=_build(WandbSettings, config, {
          "project": "log.wandb_project", "entity": "log.wandb_entity",
          "name": "log.wandb_name", "group": "log.wandb_group"}))
  _check_visual(env, model, rl, rollout, stage1, bc)
  return RunSpec(
      algorithm=algorithm, seed=_key(config, "seed", non_negative_int, "a non-negative integer"),
      model=model,
      init_from=_init_from(config), mesh=mesh, env=env, rl=rl,
      rollout=rollout, optim=optim, train_step=train_step, batch=batch, analyzer=analyzer,
      analyzer_max_prompt_tokens=analyzer_prompt,
      static_library=_static_library(config),
      skill_placement=_skill_placement(config), stage1=stage1, bc=bc,
      eval=evaluation, output=output, config_json=config.to_json_best_effort(indent=2))


def _check_visual(env: EnvSpec, model: ModelSpec, rl: RLSpec, rollout: RolloutSpec,
                  stage1: Stage1Spec, bc: BehaviourCloningSpec | None) -> None:
  """An env whose prompts show images (`AgentFormat.uses_images`) needs a vision-language
  model, and the paths that do not yet carry images off."""
  fmt = get_env_module(env.name).make_agent_format(env.with_settings())
  if not shows_images(fmt):
    return
  # Imported here: reading a model's config.json needs the model stack.
  from seed_jax.models import model_config  # pylint: disable=import-outside-toplevel
  if model_config(model.name).vision is None:
    raise ConfigError(f"config.model.name: env {env.name!r} shows the agent images; "
                      f"{model.name!r} has no vision tower (use a Qwen2.5-VL folder or "
                      f"tiny-random-qwen2.5-vl)")
  if rl.pack_rows:
    raise ConfigError(f"config.rl.pack_rows: packing does not carry images yet; 0 for env "
                      f"{env.name!r}")
  if rollout.continuous or stage1.rollout.continuous:
    raise ConfigError(f"config.rollout.continuous: the slot decoder does not show images "
                      f"yet; False for env {env.name!r}")
  if bc is not None:
    raise ConfigError(f"config.bc.enabled: behaviour cloning does not show images yet; "
                      f"False for env {env.name!r}")


def _skill_placement(config) -> str:
  placement = _get(config, "skill_placement")
  if placement not in PLACEMENTS:
    raise ConfigError(f"config.skill_placement: one of {PLACEMENTS}, got {placement!r}")
  return placement


def _init_from(config) -> str:
  """`config.init_from`, checked to hold weights now rather than after the model loads."""
  path = _get(config, "init_from")
  if path:
    # Only when set: the weights' readers (orbax) stay out of a command's quick failures.
    from seed_jax.train.init_from import find_weights  # pylint: disable=import-outside-toplevel
    try:
      find_weights(path)
    except ValueError as e:
      raise ConfigError(f"config.init_from: {e}") from None
  return path


def _static_library(config) -> str:
  """`config.analyzer.static_library`, read now (a small JSON file) rather than after the
  model loads and the warm start ran. A URI (gs://) is left to the run: building a spec
  needs no network (seed_jax.plan and seed_jax.experiment build them anywhere)."""
  path = _get(config, "analyzer.static_library")
  if not path or paths.is_remote(path):
    return path
  key = "config.analyzer.static_library"
  if not os.path.isfile(path):  # the run reads it as given (stage1.load_library_file)
    raise ConfigError(f"{key}: no such file {path!r}")
  # Imported here: stage 1's readers stay out of the spec's imports until a file is given.
  from seed_jax.train.stage1 import load_library_file  # pylint: disable=import-outside-toplevel
  try:
    load_library_file(path)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{key}: {path} is not JSON ({e})") from None
  except ValueError as e:  # its message already names the key
    raise ConfigError(str(e)) from None
  return path


def _key(config, key: str, ok, want: str) -> Any:
  """`config.KEY`, refused as "config.KEY: <want>, got <value>" unless `ok(value)`."""
  value = _get(config, key)
  if not ok(value):
    raise ConfigError(f"config.{key}: {want}, got {value!r}")
  return value


def _positive_key(config, key: str) -> int:
  return _key(config, key, positive_int, "a positive integer")
