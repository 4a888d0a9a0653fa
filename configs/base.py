"""Base configuration: the SEED paper's settings (see ../shared/REFERENCE.md).

Env files (alfworld.py, webshop.py, search.py, sokoban.py) start from `get_base_config`
and fill `config.env` and the env-specific numbers. Presets are chosen after a colon:
`--config=configs/alfworld.py:cpu`. Any key can be overridden from the command line,
e.g. `--config.rl.lambda_opd=0.0`; unknown keys and wrong types fail before anything runs.
"""

from __future__ import annotations

import ml_collections

from seed_jax.parallel.rules import DEFAULT_RULES
from seed_jax.seed.batch import BatchConfig
from seed_jax.seed.losses import LossConfig
from seed_jax.seed.optim import OptimConfig
from seed_jax.seed.train_step import TrainStepConfig

# The components' own defaults are the paper's; the keys below that name them are read
# from there, so each default lives in one place (seed_jax/train/spec.py maps the keys back).
_LOSS, _OPTIM, _STEP, _BATCH = LossConfig(), OptimConfig(), TrainStepConfig(), BatchConfig()


def get_base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.algorithm = "seed"  # one of seed_jax.train.algorithms.ALGORITHMS (README: Algorithms)
  c.seed = 0
  c.workdir = ""  # also --workdir; a stopped run resumes from its last checkpoint here
  # Weights to start a new run from: a checkpoint (a run folder, its checkpoints/ or one
  # step's folder) or an HF folder. Parameters only, the optimizer starts afresh; a workdir
  # holding checkpoints resumes from them instead (seed_jax/train/init_from.py).
  c.init_from = ""

  c.model = ml_collections.ConfigDict(dict(
      name="smollm2-135m-instruct",  # embedded name, HF folder or .gguf file
      dtype="float32",               # compute dtype: float32 | bfloat16
      param_dtype="float32",         # storage dtype of the trained parameters
      # What the backward pass keeps of each layer: full (its input; the layer is
      # recomputed), projections (the weight matmuls' outputs too; attention's scores and
      # elementwise ops recomputed) or none (every residual of every layer).
      # Measure with bench/train_step.py --remat=full,projections,none and read the plan's
      # memory (seed_jax.plan --config.model.remat=...) before choosing on an accelerator.
      # On an H200 (1.5B, 16 x 2560 tokens) projections ran 6% faster than full at 2.5x
      # the memory, 79 GiB against 32 (results/speed/README.md, 2026-12-04).
      remat="full",
      # LoRA (verl's lora_rank / lora_alpha / target_modules): rank > 0 trains low-rank
      # adapters on the named projections (q, k, v, o, gate, up, down) and freezes the base;
      # the policy, analyzer, teacher and KL reference share the one base.
      lora=ml_collections.ConfigDict(dict(rank=0, alpha=16.0,
                                          targets=("q", "k", "v", "o", "gate", "up", "down"))),
  ))
  c.mesh = ml_collections.ConfigDict(dict(
      data=1, fsdp=-1, tensor=1,     # -1: all remaining devices
      rules=tuple((name, axes) for name, axes in DEFAULT_RULES),
  ))

  # Filled by the env file from the env's default_config(); env.max_steps is the turn limit.
  c.env = ml_collections.ConfigDict(dict(name="alfworld"))
  c.pool = ml_collections.ConfigDict(dict(num_workers=8, step_timeout_s=60.0))

  c.rollout = ml_collections.ConfigDict(dict(
      tasks_per_batch=16,       # 16 tasks x 8 = 128 environments per iteration
      group_size=8,             # N trajectories per task (one GRPO group)
      temperature=1.0,
      top_p=1.0,
      max_new_tokens=512,       # response tokens per turn
      max_prompt_tokens=2048,
      # No turn barrier: an episode steps as soon as its response is complete and its next
      # prompt enters a free decode slot (seed_jax/sampling/slots.py); greedy responses
      # equal the turn-synchronous loop's. Off: 1.8x slower on the :compare rollout, whose
      # responses mostly fill their budget (results/speed/README.md, bench/rollout.py).
      continuous=False,
  ))

  c.analyzer = ml_collections.ConfigDict(dict(
      backend="policy",         # policy (theta_old, self-evolving) | openai | oracle
      max_prompt_tokens=16384,  # the transcript is cut to fit (keeping task, outcome, last steps)
      max_new_tokens=512,
      temperature=0.0,          # greedy, as the public code
      max_retries=2,            # a malformed answer is asked again, sampled ...
      retry_temperature=0.7,    # ... at this temperature (greedy would repeat it)
      decode_batch=0,           # prompts per policy-analyzer decode (0: all; bounds the KV cache)
      min_skill_words=5,
      # The policy analyzer's answer starts with this text (stage 1 teaches after it):
      # '{"episode_summary": "' holds a small model to the JSON format. "" (the paper).
      answer_prefix="",
      # Group hindsight (not the paper's; the `seed_group` arm): a failed trajectory whose
      # GRPO group holds a won one reads the won sibling's skill instead of its own, so the
      # teacher of a failure knows a solution the group found (seed_jax/seed/analyzer.py).
      group_hindsight=False,
      openai=ml_collections.ConfigDict(dict(
          base_url="", model="", api_key_env="OPENAI_API_KEY", timeout_s=60.0,
          max_http_retries=3)),
      static_library="",        # JSON file of skills per task type (static_library algo)
  ))
  # Where H puts a skill (OPD teacher, Skill-GRPO's acting prompt): after the task line
  # (the paper's) | end (of the user message, next to the generation) | system (message).
  c.skill_placement = "task_line"

  c.rl = ml_collections.ConfigDict(dict(
      iterations=150,
      learning_rate=_OPTIM.learning_rate,   # 1e-6
      warmup_steps=_OPTIM.warmup_steps,
      weight_decay=_OPTIM.weight_decay,     # AdamW, as verl's actor
      grad_clip=_OPTIM.grad_clip,
      mini_batch_size=256,      # step-samples per optimizer update
      micro_batch_size=16,      # rows per forward/backward (gradient accumulation)
      clip_ratio_low=_LOSS.clip_low,
      clip_ratio_high=_LOSS.clip_high,
      dual_clip=_LOSS.dual_clip,            # 3.0; 0 disables
      kl_coef=_LOSS.kl_coef,                # k3 ("low_var_kl") to the stage-1 reference
      entropy_coef=_LOSS.entropy_coef,
      beta_opd=_LOSS.beta_opd,
      # b in the OPD weight `gate - b`: 0 the paper's; 0.5 pulls a token up only where the
      # teacher prefers it more than the student (seed_jax/seed/losses.py).
      opd_gate_baseline=_LOSS.opd_gate_baseline,
      lambda_opd=_LOSS.lambda_opd,          # 0: plain GRPO, no analysis, no teacher rows
      invalid_penalty=_BATCH.invalid_penalty,
      # Charged to a valid step the env says changed nothing (info "action_effective":
      # a Sokoban move into a wall); 0 in the paper.
      ineffective_penalty=_BATCH.ineffective_penalty,
      teacher_mode=_STEP.teacher_mode,      # precomputed (theta_old, public code) | joint | separate
      advantage_mode=_BATCH.advantage_mode,  # step (public code) | trajectory
      normalize_std=_BATCH.norm_by_std,     # WebShop uses mean-only advantages
      # Take groups whose advantages are all zero out of the outcome terms (PG, entropy,
      # KL) and skip an update left with nothing (OPD keeps its rows); off in the paper.
      skip_zero_advantage_groups=_BATCH.skip_zero_advantage_groups,
      # Deal the rows with an outcome signal round-robin over the mini-batches, so that a
      # run of alike groups does not fill whole mini-batches that GRPO skips and SEED steps
      # on with OPD alone (seed_jax/seed/batch.py: spread_row_order); off in the paper.
      spread_outcome_rows=False,
      # The response tokens the OPD term counts: "response" (every one, the paper's) or
      # "decision" (where the response first names its action: the move itself, not the
      # reasoning before it nor the action block that repeats it; a small-model aid).
      opd_span="response",
      logprob_chunk=512,
      # A turn row's prompt part is the batch's longest prompt rounded up to a multiple of
      # this (few compiled shapes; 128 tiles a TPU's matrix units). Short prompts waste
      # less padding with a smaller bucket (a 160-token prompt: 256 at 128, 160 at 32).
      prompt_bucket=_BATCH.prompt_bucket,
      # 0: one row per turn (prompt left-padded, response right-padded). k > 0: the turns
      # of a mini-batch packed end to end into mini_batch_size / k sequences, so padding
      # costs no FLOPs in the update (seed_jax/seed/packing.py); must divide
      # micro_batch_size.
      pack_rows=0,
  ))

  c.sft = ml_collections.ConfigDict(dict(
      tasks_per_type=30,        # 30 x 6 types x 8 rollouts = 1,440 trajectories
      rollouts_per_task=8,
      temperature=0.4,
      max_turns=30,             # env.max_steps during stage-1 rollouts
      history_length=5,         # env.history_length during stage-1 rollouts
      # The stage-1 external analyzer: openai, or oracle (the env expert's plan written as a
      # skill; privileged, offline; README: "The oracle analyzer").
      analyzer_backend="oracle",
      epochs=3,
      learning_rate=5e-6,
      warmup_fraction=0.1,
      batch_size=8,
      holdout_fraction=0.1,
      max_tokens=16896,         # rows hold a whole analyzer prompt and its answer
      # 0: one row per example, every prompt left-padded to the run's longest. k > 0: each
      # step's examples packed end to end into batch_size / k sequences, so padding costs
      # no FLOPs (seed_jax/train/sft.py); must divide batch_size.
      pack_rows=0,
      # Behaviour-cloning examples (the warm start's: bc.episodes, bc.skill_fraction)
      # trained on beside each analyzer example, so that a small policy learning to write
      # skills does not forget how to act and to read one (0: off, as in the paper).
      rehearsal=0.0,
  ))

  c.bc = ml_collections.ConfigDict(dict(
      enabled=False,            # behaviour cloning from the env expert (on in :cpu presets)
      episodes=0,
      epochs=1,
      learning_rate=1e-5,
      batch_size=8,
      pack_rows=0,              # as sft.pack_rows
      # Small-model aids (issue 24; off in the paper presets): the share of cloned steps
      # shown again with the game's oracle skill through H (a skill-reading warm start), and
      # RL on the training games the warm start did not clone.
      skill_fraction=0.0,
      disjoint=False,
      # env.* settings the cloned games are played with instead (a preset sets them, e.g.
      # Sokoban's max_solution_steps: a warm start on shorter puzzles than RL's); empty:
      # the env's own.
      env_settings={},
  ))

  c.eval = ml_collections.ConfigDict(dict(
      every=10,                 # iterations; 0 disables periodic evaluation
      temperature=0.4,
      splits=("valid_seen", "valid_unseen"),
      max_episodes=0,           # 0: all tasks of each split
      at_end=True,
  ))

  c.checkpoint = ml_collections.ConfigDict(dict(every=1, keep=3, export_hf=True))
  c.log = ml_collections.ConfigDict(dict(
      tensorboard=True, plots=True,
      # Weights & Biases (process 0; the run id kept in the workdir, so a resumed run
      # continues the same W&B run); "" entity / name / group: the default entity, the
      # workdir's name, no group.
      wandb=False, wandb_project="seed_jax", wandb_entity="", wandb_name="", wandb_group=""))
  return c


def cpu_preset(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Scales a paper config down to a 2-core machine: minutes end to end, same code paths.

  bfloat16 compute (float32 parameters) runs the CPU's matrix units; no KL reference (one
  forward pass less per iteration); a behaviour-cloning warm start so a 135M model can
  reach the reward at all.
  """
  c.model.dtype = "bfloat16"
  # Recompute each layer in the backward pass (remat "full"). At 8 x 768 tokens, bf16, a
  # train step on a 2-core CPU with bf16 matrix units (AMX) takes 15.6 s against 22.8 s
  # keeping the projections' outputs: XLA:CPU stacks saved residuals across the layer scan
  # by copying and widens the stack to float32 for the backward pass
  # (results/speed/train_step_remat_2026-12-03_amx.jsonl). On an AVX2-only CPU "projections"
  # was 5% faster (67.3 s against 70.8, train_step_remat_2026-12-02.jsonl); "full" holds a
  # third of its temporaries (1.7 GiB against 5.0) on both.
  c.model.remat = "full"
  c.pool.num_workers = 2
  c.rollout.tasks_per_batch = 2
  c.rollout.group_size = 2
  c.rollout.temperature = 0.7  # a 135M model sampled at 1.0 misspells too many actions
  c.rollout.max_new_tokens = 40
  c.rollout.max_prompt_tokens = 768
  # RL-time skills come from the policy itself (the paper's self-evolving analyzer); the
  # oracle labels only stage 1, standing in for the external analyzer offline.
  c.analyzer.max_prompt_tokens = 768
  # Room for the answers stage 1 teaches (the oracle's summary and skill: over 110 tokens
  # on the :cpu games even without a plan, so 96 cut every one before its JSON closed;
  # stage 1 warns when one is longer), and the answer's start given, so that the 135M
  # analyzer stays in the JSON format (issue 24's item 4).
  c.analyzer.max_new_tokens = 256
  c.analyzer.answer_prefix = '{"episode_summary": "'
  c.rl.iterations = 2
  c.rl.learning_rate = 1e-5
  c.rl.kl_coef = 0.0
  c.rl.mini_batch_size = 16
  c.rl.micro_batch_size = 8
  c.sft.tasks_per_type = 1
  c.sft.rollouts_per_task = 1
  c.sft.max_turns = 3
  c.sft.epochs = 3  # the few annotations must teach the skill format to the analyzer
  c.sft.batch_size = 4
  c.sft.max_tokens = 1024
  c.bc.enabled = True
  c.bc.episodes = 4
  c.bc.epochs = 2
  c.bc.learning_rate = 1.5e-4
  c.eval.every = 0
  c.eval.max_episodes = 3
  c.checkpoint.keep = 2
  return c


def visual_cpu_preset(c):
  """`cpu_preset` for an env that shows images (its splits in `env.num_tasks`): the tiny random VLM (generated on
  first use), and what does not carry images yet left off (behaviour cloning). A random
  model writes no skill, so the oracle stands in for the RL-time analyzer: every
  trajectory gets a skill and the teacher rows (with the same images) are scored and
  distilled, the path this preset exists to run."""
  cpu_preset(c)
  c.model.name = "tiny-random-qwen2.5-vl"
  c.bc.enabled = False
  c.analyzer.backend = "oracle"
  c.env.max_steps = 4
  c.env.num_tasks = {"train": 50, "valid_seen": 4, "valid_unseen": 4}
  c.sft.tasks_per_type = 2


def apply_preset(c: ml_collections.ConfigDict, preset: str, **presets
                 ) -> ml_collections.ConfigDict:
  """Applies the named preset (`file.py:NAME`, or `file.py:MODEL@SLICE` from
  configs/pods.py); an unknown name lists the known ones."""
  if "@" in preset:  # MODEL@SLICE: a model laid out on a TPU slice (configs/pods.py)
    from configs import pods  # pylint: disable=import-outside-toplevel
    pods.apply_pod(c, preset)
  elif preset:
    if preset not in presets:
      raise ValueError(f"unknown config preset {preset!r}; known: {', '.join(sorted(presets))}")
    presets[preset](c)
  c.lock()
  return c
