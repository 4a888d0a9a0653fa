"""The run spec: every config key reaches its component's spec; bad keys and values fail
before anything is loaded, naming the key."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest

from seed_jax.train.spec import ConfigError, build_run_spec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENVS = ("alfworld", "webshop", "search", "sokoban")


def load(env: str, preset: str = ""):
  module = importlib.import_module(f"configs.{env}")
  return module.get_config(preset)


def _set(config, key, value):
  with config.unlocked():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def _field(spec, path):
  for part in path.split("."):
    spec = getattr(spec, part)
  return spec


@pytest.mark.parametrize("env,preset", [(env, preset) for env in ENVS for preset in ("", "cpu")]
                         + [("alfworld", "compare"), ("sokoban", "learn"),
                            ("sokoban", "learn_fast"), ("sokoban", "learn_placed"),
                            ("sokoban", "learn_long")])
def test_every_config_and_preset_validates(env, preset):
  config = load(env, preset)
  spec = build_run_spec(config)
  assert spec.env.name == env and spec.algorithm.name == "seed"


def test_the_learning_preset_gives_every_arm_the_small_model_aids():
  """configs/sokoban.py:learn: a skill-reading warm start on puzzles RL does not train on,
  the skill next to the generation, zero-advantage groups out of GRPO's terms, stage 1
  rehearsing the warm start; the paper preset has none of them."""
  learn, paper = load("sokoban", "learn"), load("sokoban")
  aids = lambda c: (c.bc.enabled, c.bc.skill_fraction, c.bc.disjoint, c.skill_placement,
                    c.rl.skip_zero_advantage_groups, c.sft.rehearsal)
  assert aids(learn) == (True, 1.0, True, "end", True, 2.0)
  assert aids(paper) == (False, 0.0, False, "task_line", False, 0.0)


def test_the_distillation_preset_is_the_learning_preset_with_an_opd_term_that_can_act():
  """configs/sokoban.py:learn_distill: `:learn` with lambda_opd 1 (not the paper's 0.01)
  and the outcome rows spread over the mini-batches; nothing else differs."""
  learn, distill = load("sokoban", "learn"), load("sokoban", "learn_distill")
  assert (distill.rl.lambda_opd, distill.rl.spread_outcome_rows) == (1.0, True)
  assert (learn.rl.lambda_opd, learn.rl.spread_outcome_rows) == (0.01, False)
  with distill.unlocked():
    distill.rl.lambda_opd, distill.rl.spread_outcome_rows = 0.01, False
  assert distill.to_dict() == learn.to_dict()


def test_the_fast_preset_is_the_distillation_preset_with_cheap_and_more_episodes():
  """configs/sokoban.py:learn_fast: `:learn_distill` with the compact prompt, turn rows
  padded to a multiple of 32, 8 puzzles an iteration and 20 iterations; nothing else
  differs, and the paper preset keeps the full prompt and the 128 bucket."""
  distill, fast, paper = (load("sokoban", p) for p in ("learn_distill", "learn_fast", ""))
  cheap = lambda c: (c.env.prompt_style, c.rl.prompt_bucket, c.rollout.tasks_per_batch,
                     c.rl.iterations, c.eval.every)
  assert cheap(fast) == ("compact", 32, 8, 20, 10)
  assert cheap(paper)[:2] == ("full", 128)
  with fast.unlocked():
    (fast.env.prompt_style, fast.rl.prompt_bucket, fast.rollout.tasks_per_batch,
     fast.rl.iterations, fast.eval.every) = cheap(distill)
  assert fast.to_dict() == distill.to_dict()


@pytest.mark.parametrize("parent,preset,aid", [
    ("learn_fast", "learn_unstuck", {"rl.ineffective_penalty": 0.1}),
    ("learn_unstuck", "learn_notice", {"env.blocked_notice": True}),
    ("learn_unstuck", "learn_listed", {"env.effective_moves_only": True}),
    ("learn_listed", "learn_placed", {"env.board_positions": True}),
])
def test_each_later_sokoban_learning_preset_is_its_parent_plus_one_aid(parent, preset, aid):
  base, child, paper = (load("sokoban", p) for p in (parent, preset, ""))
  for path, value in aid.items():
    assert _field(child, path) == value and _field(paper, path) != value
    _set(child, path, _field(base, path))
  assert child.to_dict() == base.to_dict()


def test_the_long_puzzle_preset_clones_short_puzzles_and_learns_longer_ones():
  """configs/sokoban.py:learn_long: `:learn_listed` cloning 512 puzzles of 2-3 moves (the
  warm start and stage 1's rehearsal alike), RL and the held-out games on 4-5 moves within
  8 turns, 64 puzzles left for RL and 32 held out; nothing else differs."""
  listed, long_ = load("sokoban", "learn_listed"), load("sokoban", "learn_long")
  spec = build_run_spec(long_)
  cloned = {"max_solution_steps": 3, "min_solution_steps": 2}
  assert spec.bc.env_settings == spec.stage1.rehearsal_env_settings == cloned
  assert (spec.env.settings.min_solution_steps, spec.env.settings.max_solution_steps,
          spec.env.max_steps, spec.bc.episodes) == (4, 5, 8, 512)
  assert dict(long_.env.num_tasks) == {"train": 576, "valid_seen": 8, "valid_unseen": 32}
  assert build_run_spec(listed).bc.env_settings == {}  # the run's own settings
  for key in ("bc.episodes", "env.max_solution_steps", "env.min_solution_steps",
              "env.max_steps", "env.num_tasks"):
    _set(long_, key, _field(listed, key))
  _set(long_, "bc.env_settings", {})
  assert long_.to_dict() == listed.to_dict()


@pytest.mark.parametrize("key,value,match", [
    ("env.min_solution_steps", 0, "config.env.min_solution_steps: a positive number"),
    ("env.min_solution_steps", 13,
     r"config.env.min_solution_steps \(13\) is above config.env.max_solution_steps \(12\)"),
    ("bc.env_settings", {"max_solution_steps": 1},
     r"config.env.min_solution_steps \(2\) is above "
     r"config.bc.env_settings.max_solution_steps \(1\)"),
    ("bc.env_settings", {"min_solution_steps": 4, "max_solution_steps": 3},
     r"config.bc.env_settings.min_solution_steps \(4\) is above "
     r"config.bc.env_settings.max_solution_steps \(3\)"),
    ("bc.env_settings", {"solution_steps": 3},
     "config.bc.env_settings.solution_steps: not a setting of env 'sokoban'"),
    ("bc.env_settings", {"max_steps": 0}, "config.bc.env_settings.max_steps: a positive"),
    ("bc.env_settings", {"prompt_style": "terse"},
     r"config.bc.env_settings.prompt_style: one of \('full', 'compact'\)"),
])
def test_bad_puzzle_bands_name_the_key(key, value, match):
  """Sokoban's band of solution lengths, the run's and the cloned games' own."""
  config = _set(load("sokoban", "cpu"), key, value)
  with pytest.raises(ConfigError, match=match):
    build_run_spec(config)


def test_paper_defaults():
  c = load("alfworld")
  assert (c.rl.beta_opd, c.rl.lambda_opd, c.rollout.group_size, c.rollout.tasks_per_batch,
          c.rl.learning_rate, c.rl.clip_ratio_low, c.rl.kl_coef, c.rl.invalid_penalty,
          c.env.history_length, c.rollout.max_new_tokens, c.rl.iterations,
          c.eval.temperature) == (5.0, 0.01, 8, 16, 1e-6, 0.2, 0.01, 0.1, 2, 512, 150, 0.4)
  assert c.env.max_steps == 50 and load("search").rl.kl_coef == 0.001


def test_unknown_preset_lists_the_known_ones():
  with pytest.raises(ValueError, match="unknown config preset 'tpu'; known: compare, cpu"):
    load("alfworld", "tpu")


@pytest.mark.parametrize("key,value,match", [
    ("algorithm", "ppo", "config.algorithm: one of"),
    ("rl.teacher_mode", "both", "config.rl.teacher_mode"),
    ("rl.lambda_opd", -1.0, "config.rl.lambda_opd"),
    ("rollout.group_size", 0, "config.rollout.group_size"),
    ("rollout.top_p", 1.5, "config.rollout.top_p"),
    ("model.dtype", "float16", "config.model.dtype"),
    ("mesh.fsdp", 0, "config.mesh.fsdp"),
    ("analyzer.backend", "gpt", "config.analyzer.backend"),
    ("sft.holdout_fraction", 1.0, "config.sft.holdout_fraction"),
    ("rl.dual_clip", 0.5, "config.rl.dual_clip"),
    ("env.max_steps", 0, "config.env.max_steps"),
    ("env.task_types", ("pick_and_place", "make_coffee"), "config.env.task_types"),
    ("env.solvable_within", 0, "config.env.solvable_within"),
    ("rl.advantage_mode", "episode", "config.rl.advantage_mode"),
    ("rl.prompt_bucket", 0, "config.rl.prompt_bucket: a positive integer"),
    ("rl.micro_batch_size", 5, "config.rl.mini_batch_size: a multiple"),
    ("sft.epochs", -1, "config.sft.epochs"),
    ("bc.learning_rate", 0.0, "config.bc.learning_rate"),
    ("eval.temperature", -0.5, "config.eval.temperature"),
    ("analyzer.max_prompt_tokens", 0, "config.analyzer.max_prompt_tokens"),
    ("checkpoint.keep", 0, "config.checkpoint.keep"),
    ("sft.max_tokens", 512, "config.sft.max_tokens: at least"),
    ("analyzer.retry_temperature", 0.0, "config.analyzer.retry_temperature"),
    ("analyzer.decode_batch", -1, "config.analyzer.decode_batch"),
    ("init_from", "/no/such/weights", "config.init_from: no such path"),
    # Rates, sizes and paths that reached a running trainer before (issue 24).
    ("seed", -1, "config.seed: a non-negative integer"),
    ("model.name", "/nonexistent", "config.model.name: an embedded model"),
    ("model.name", "smollm2-135m", "config.model.name: an embedded model"),
    ("model.name", os.path.join(REPO, "README.md"), "config.model.name: an embedded model"),
    ("rl.learning_rate", -1.0, "config.rl.learning_rate: a positive number"),
    ("rl.learning_rate", 0.0, "config.rl.learning_rate: a positive number"),
    ("rl.warmup_steps", -1, "config.rl.warmup_steps: a non-negative integer"),
    ("rl.weight_decay", -0.01, "config.rl.weight_decay: a non-negative number"),
    ("rl.grad_clip", -1.0, "config.rl.grad_clip: a non-negative number"),
    ("rl.clip_ratio_low", 1.5, r"config.rl.clip_ratio_low: in \[0, 1\]"),
    ("rl.clip_ratio_high", -0.2, "config.rl.clip_ratio_high"),
    ("rl.kl_coef", -0.01, "config.rl.kl_coef"),
    ("rl.entropy_coef", -0.001, "config.rl.entropy_coef"),
    ("rl.beta_opd", -5.0, "config.rl.beta_opd"),
    ("rl.invalid_penalty", -0.1, "config.rl.invalid_penalty"),
    ("rl.ineffective_penalty", -0.1, "config.rl.ineffective_penalty"),
    ("rl.iterations", -1, "config.rl.iterations"),
    ("rl.logprob_chunk", 0, "config.rl.logprob_chunk"),
    ("rollout.max_new_tokens", 0, "config.rollout.max_new_tokens"),
    ("rollout.temperature", -1.0, "config.rollout.temperature"),
    ("pool.num_workers", 0, "config.pool.num_workers"),
    ("pool.step_timeout_s", 0.0, "config.pool.step_timeout_s"),
    ("sft.learning_rate", -5e-6, "config.sft.learning_rate"),
    ("sft.warmup_fraction", 1.0, "config.sft.warmup_fraction"),
    ("sft.batch_size", 0, "config.sft.batch_size"),
    ("sft.max_turns", 0, "config.sft.max_turns"),
    ("sft.rollouts_per_task", 0, "config.sft.rollouts_per_task"),
    ("sft.rehearsal", -1.0, "config.sft.rehearsal: a non-negative number"),
    ("bc.episodes", -1, "config.bc.episodes"),
    ("bc.batch_size", 0, "config.bc.batch_size"),
    ("bc.skill_fraction", 1.5, "config.bc.skill_fraction: a fraction in \\[0, 1\\]"),
    ("bc.skill_fraction", -0.1, "config.bc.skill_fraction"),
    ("bc.pack_rows", 3, r"config.bc.pack_rows: a divisor of the batch size \(8\)"),
    ("bc.pack_rows", -1, "config.bc.pack_rows: a non-negative integer"),
    ("sft.pack_rows", 3, r"config.sft.pack_rows: a divisor of the batch size \(4\)"),
    ("skill_placement", "middle", "config.skill_placement: one of"),
    ("analyzer.max_new_tokens", 0, "config.analyzer.max_new_tokens"),
    ("analyzer.min_skill_words", 0, "config.analyzer.min_skill_words"),
    ("analyzer.openai.timeout_s", 0.0, "config.analyzer.openai.timeout_s"),
    ("analyzer.openai.max_http_retries", -1, "config.analyzer.openai.max_http_retries"),
    ("analyzer.static_library", "/no/such/library.json",
     "config.analyzer.static_library: no such file"),
    ("eval.every", -1, "config.eval.every"),
    ("checkpoint.every", -1, "config.checkpoint.every"),
    ("model.lora.rank", -4, "config.model.lora.rank: a non-negative integer"),
    ("model.lora.alpha", 0.0, "config.model.lora.alpha: a positive number"),
    ("model.lora.targets", ("q", "lm_head"), "config.model.lora.targets: a non-empty selection"),
    ("model.lora.targets", (), "config.model.lora.targets"),
])
def test_bad_values_name_the_key(key, value, match):
  config = _set(load("alfworld" if key.startswith("env.") else "sokoban", "cpu"), key, value)
  with pytest.raises(ConfigError, match=match):
    build_run_spec(config)


def test_an_unknown_sokoban_prompt_style_names_the_key_and_the_styles():
  config = _set(load("sokoban", "cpu"), "env.prompt_style", "terse")
  with pytest.raises(ConfigError, match=r"config.env.prompt_style: one of \('full', 'compact'\)"):
    build_run_spec(config)


def test_stage_1_rehearses_only_expert_episodes_the_config_names():
  config = _set(_set(load("sokoban", "cpu"), "sft.rehearsal", 1.0), "bc.episodes", 0)
  with pytest.raises(ConfigError, match="config.sft.rehearsal: rehearses the expert "
                     "episodes of config.bc.episodes, which is 0"):
    build_run_spec(config)


@pytest.mark.parametrize("key,value,field", [
    ("seed", 7, "seed"),
    ("model.dtype", "bfloat16", "model.dtype"),
    ("model.remat", "projections", "model.remat"),
    ("model.lora.rank", 16, "model.lora_rank"),
    ("model.lora.alpha", 32.0, "model.lora_alpha"),
    ("model.lora.targets", ("q", "v"), "model.lora_targets"),
    ("rl.skip_zero_advantage_groups", True, "batch.skip_zero_advantage_groups"),
    ("rl.spread_outcome_rows", True, "rl.spread_outcome_rows"),
    ("rl.prompt_bucket", 32, "batch.prompt_bucket"),
    ("rl.opd_gate_baseline", 0.5, "train_step.loss.opd_gate_baseline"),
    ("log.wandb", True, "output.wandb"),
    ("log.wandb_group", "cmp", "output.wandb_settings.group"),
    ("mesh.tensor", 2, "mesh.tensor"),
    ("pool.num_workers", 3, "env.num_workers"),
    ("env.max_steps", 9, "rollout.max_turns"),
    ("env.max_steps", 9, "eval.rollout.max_turns"),
    ("rollout.tasks_per_batch", 5, "rl.tasks_per_batch"),
    ("rollout.group_size", 3, "rl.group_size"),
    ("rollout.temperature", 0.9, "rollout.temperature"),
    ("rollout.top_p", 0.9, "rollout.top_p"),
    ("rollout.max_new_tokens", 33, "rollout.max_new_tokens"),
    ("rollout.max_new_tokens", 33, "batch.response_len"),
    ("rollout.max_prompt_tokens", 900, "rollout.max_prompt_tokens"),
    ("rollout.continuous", True, "rollout.continuous"),
    ("rl.iterations", 4, "rl.iterations"),
    ("rl.learning_rate", 3e-6, "optim.learning_rate"),
    ("rl.warmup_steps", 2, "optim.warmup_steps"),
    ("rl.weight_decay", 0.1, "optim.weight_decay"),
    ("rl.grad_clip", 0.5, "optim.grad_clip"),
    ("rl.clip_ratio_low", 0.1, "train_step.loss.clip_low"),
    ("rl.clip_ratio_high", 0.28, "train_step.loss.clip_high"),
    ("rl.dual_clip", 0.0, "train_step.loss.dual_clip"),
    ("rl.kl_coef", 0.02, "train_step.loss.kl_coef"),
    ("rl.entropy_coef", 0.0, "train_step.loss.entropy_coef"),
    ("rl.beta_opd", 2.0, "train_step.loss.beta_opd"),
    ("rl.lambda_opd", 0.05, "train_step.loss.lambda_opd"),
    ("rl.teacher_mode", "joint", "train_step.teacher_mode"),
    ("rl.logprob_chunk", 64, "train_step.logprob_chunk"),
    ("rl.invalid_penalty", 0.2, "batch.invalid_penalty"),
    ("rl.ineffective_penalty", 0.3, "batch.ineffective_penalty"),
    ("rl.advantage_mode", "trajectory", "batch.advantage_mode"),
    ("rl.normalize_std", False, "batch.norm_by_std"),
    ("analyzer.backend", "oracle", "analyzer.backend"),
    ("analyzer.max_new_tokens", 77, "analyzer.max_tokens"),
    ("analyzer.temperature", 0.3, "analyzer.temperature"),
    ("analyzer.max_retries", 0, "analyzer.max_retries"),
    ("analyzer.retry_temperature", 0.5, "analyzer.retry_temperature"),
    ("analyzer.decode_batch", 32, "analyzer.decode_batch"),
    ("analyzer.answer_prefix", "{", "analyzer.answer_prefix"),
    ("analyzer.max_prompt_tokens", 700, "analyzer_max_prompt_tokens"),
    ("sft.tasks_per_type", 3, "stage1.tasks_per_type"),
    ("sft.rollouts_per_task", 3, "stage1.rollouts_per_task"),
    ("sft.max_turns", 11, "stage1.rollout.max_turns"),
    ("sft.temperature", 0.6, "stage1.rollout.temperature"),
    ("sft.history_length", 4, "stage1.history_length"),
    ("sft.epochs", 2, "stage1.fine_tune.epochs"),
    ("sft.learning_rate", 1e-5, "stage1.fine_tune.learning_rate"),
    ("sft.batch_size", 2, "stage1.fine_tune.batch_size"),
    ("sft.holdout_fraction", 0.2, "stage1.fine_tune.holdout_fraction"),
    ("sft.max_tokens", 2048, "stage1.fine_tune.max_tokens"),
    ("bc.episodes", 5, "bc.episodes"),
    ("bc.epochs", 4, "bc.fine_tune.epochs"),
    ("bc.learning_rate", 2e-4, "bc.fine_tune.learning_rate"),
    ("bc.skill_fraction", 1.0, "bc.skill_fraction"),
    ("bc.disjoint", True, "bc.disjoint"),
    ("skill_placement", "end", "skill_placement"),
    ("eval.every", 3, "eval.every"),
    ("eval.temperature", 0.2, "eval.rollout.temperature"),
    ("eval.max_episodes", 7, "eval.max_episodes"),
    ("checkpoint.keep", 5, "output.checkpoint_keep"),
    ("log.plots", False, "output.plots"),
])
def test_each_key_reaches_its_spec_field(key, value, field):
  config = _set(load("alfworld", "cpu"), key, value)
  assert _field(build_run_spec(config), field) == value


def hf_folder(path, weights: bool = True) -> str:
  """A folder that is an HF model folder as far as the spec looks: config.json (and the
  weights file unless `weights` is False); nothing in it is read."""
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text("{}")
  if weights:
    (path / "model.safetensors").write_text("")
  return str(path)


def test_model_name_is_an_embedded_model_a_shape_an_hf_folder_or_a_gguf_file(tmp_path):
  (tmp_path / "m.gguf").write_text("")
  for name in ("smollm2-135m-instruct", "qwen2.5-7b-instruct", hf_folder(tmp_path / "hf"),
               hf_folder(tmp_path / "config_only", weights=False), str(tmp_path / "m.gguf")):
    assert build_run_spec(_set(load("alfworld", "cpu"), "model.name", name)).model.name == name


def test_a_folder_without_config_json_is_not_a_model(tmp_path):
  (tmp_path / "model.safetensors").write_text("")
  with pytest.raises(ConfigError, match="config.model.name: an embedded model"):
    build_run_spec(_set(load("alfworld", "cpu"), "model.name", str(tmp_path)))


@pytest.mark.parametrize("name,weights", [
    ("smollm2-135m-instruct", True), ("qwen2.5-7b-instruct", False)])
def test_only_a_model_shape_has_no_weights_among_names(name, weights):
  spec = build_run_spec(_set(load("alfworld", "cpu"), "model.name", name))
  assert (spec.model.weights_error() is None) == weights


def test_a_folder_without_weights_has_a_weights_error_naming_the_key(tmp_path):
  for folder, weights in ((tmp_path / "a", True), (tmp_path / "b", False)):
    config = _set(load("alfworld", "cpu"), "model.name", hf_folder(folder, weights))
    error = build_run_spec(config).model.weights_error()
    assert (error is None) == weights
    assert weights or error.startswith("config.model.name: ")


def test_a_static_library_file_reaches_the_spec_and_a_bad_one_names_the_key(tmp_path):
  library = tmp_path / "library.json"
  library.write_text('{"pick_and_place": "Find the object first."}')
  config = _set(load("alfworld", "cpu"), "analyzer.static_library", str(library))
  assert build_run_spec(config).static_library == str(library)
  library.write_text("[]")
  with pytest.raises(ConfigError, match="config.analyzer.static_library: .*non-empty JSON"):
    build_run_spec(config)
  library.write_text("{not json")
  with pytest.raises(ConfigError, match="config.analyzer.static_library: .*not JSON"):
    build_run_spec(config)


def test_a_static_library_uri_is_left_to_the_run():
  # No network at spec time (plan and experiment build specs anywhere): a URI is read
  # when the run needs its library.
  config = _set(load("alfworld", "cpu"), "analyzer.static_library", "gs://bucket/lib.json")
  assert build_run_spec(config).static_library == "gs://bucket/lib.json"


@pytest.mark.parametrize("fields,match", [
    (dict(learning_rate=0.0), "learning_rate: a positive number"),
    (dict(b2=1.0), "b2: in [0, 1)"),
    (dict(eps=0.0), "eps: a positive number"),
    (dict(schedule="linear"), "schedule: one of"),
    (dict(schedule="cosine", warmup_steps=5, total_steps=5), "total_steps: more than"),
])
def test_the_optimizer_spec_refuses_values_its_schedule_cannot_use(fields, match):
  from seed_jax.checks import SpecError
  from seed_jax.seed.optim import OptimConfig
  with pytest.raises(SpecError, match=re.escape(match)):
    OptimConfig(**fields)


def test_init_from_reaches_the_spec_when_it_holds_weights(tmp_path):
  (tmp_path / "model.safetensors").write_text("")  # an HF folder, as far as the spec looks
  config = _set(load("alfworld", "cpu"), "init_from", str(tmp_path))
  assert build_run_spec(config).init_from == str(tmp_path)
  assert build_run_spec(load("alfworld", "cpu")).init_from == ""  # the default: none


def test_spec_defaults_are_the_paper_settings_of_the_components():
  from seed_jax.seed.losses import LossConfig
  from seed_jax.seed.train_step import TrainStepConfig
  spec = build_run_spec(load("alfworld"))
  assert spec.train_step.loss == LossConfig(kl_coef=0.01)
  assert spec.train_step.teacher_mode == TrainStepConfig().teacher_mode == "precomputed"
  assert spec.stage1.fine_tune.weight_decay == 0.01 and spec.stage1.fine_tune.b2 == 0.95


def test_dual_clip_zero_reaches_the_loss_as_off():
  spec = build_run_spec(_set(load("sokoban", "cpu"), "rl.dual_clip", 0))
  assert spec.train_step.loss.dual_clip == 0


@pytest.mark.parametrize("algorithm,lambda_opd,opd", [
    ("seed", 0.01, True), ("seed", 0.0, False), ("no_sft", 0.0, False),
    ("grpo", 0.01, False), ("no_opd", 0.01, False), ("static_library", 0.01, True),
])
def test_opd_is_on_only_when_the_algorithm_has_it_and_lambda_is_positive(
    algorithm, lambda_opd, opd):
  config = _set(_set(load("sokoban", "cpu"), "algorithm", algorithm), "rl.lambda_opd",
                lambda_opd)
  spec = build_run_spec(config)
  assert spec.rl.opd == opd
  assert spec.train_step.loss.lambda_opd == (lambda_opd if opd else 0.0)
  assert spec.batch.shared_prompt_len is False  # precomputed teacher: no shared P


def test_the_cpu_preset_runs_the_papers_self_evolving_analyzer():
  spec = build_run_spec(load("alfworld", "cpu"))
  assert spec.analyzer.backend == "policy"          # RL-time skills: the policy itself
  assert spec.stage1.annotator.backend == "oracle"  # stage-1 labels: the offline stand-in


def test_openai_backend_needs_an_endpoint():
  config = load("alfworld", "cpu")
  config.sft.analyzer_backend = "openai"
  with pytest.raises(ConfigError, match="config.analyzer.openai.base_url"):
    build_run_spec(config)


@pytest.mark.parametrize("override,match", [
    ("--config.rl.lambda_opdd=0.1", "lambda_opdd"),
    ("--config.rl.lambda_opd=abc", "lambda_opd"),
    ("--config.algorithm=ppo", "config.algorithm"),
])
def test_command_line_overrides_fail_before_anything_runs(override, match, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.main", "--config=configs/sokoban.py:cpu", override,
       f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode != 0
  assert match in result.stderr + result.stdout
  assert not os.path.exists(tmp_path / "checkpoints")
