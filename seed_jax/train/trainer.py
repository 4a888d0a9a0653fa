"""The training program: warm start, stage-1 SFT, the self-evolving RL loop, evaluation.

One host-side class owns what lives on the host (env pools, sampler, checkpoints, metrics);
everything on device is a pure jitted function of the train state. Every source of
randomness is derived from `(config.seed, iteration)`, and the task iterator's position is
checkpointed, so a run resumed from its last checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from seed_jax import metrics as metrics_lib
from seed_jax.checkpoint import Checkpointer
from seed_jax.envs.pool import EnvPool
from seed_jax.envs.registry import get_env_module
from seed_jax.models import export_hf, load_model
from seed_jax.parallel import MeshConfig, check_sharded_enough, hosts, make_mesh
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed import analyzer as analyzer_lib
from seed_jax.seed.batch import BatchConfig, build_batch
from seed_jax.seed.losses import LossConfig
from seed_jax.seed.optim import OptimConfig
from seed_jax.seed.skills import augment_prompt
from seed_jax.seed.train_step import (TrainStepConfig, init_train_state, make_score_fn,
                                      make_train_step, train_state_shardings)
from seed_jax.train import stage1
from seed_jax.train.algorithms import get_algorithm
from seed_jax.train.config import validate_config
from seed_jax.train.expert import collect_demonstrations
from seed_jax.train.rollout import RolloutSpec, chat_prompt_ids, play_episodes
from seed_jax.train.sft import fine_tune
from seed_jax.train.tasks import TaskIterator
from seed_jax.train.evaluate import split_results

log = logging.getLogger(__name__)


def env_settings(config: ml_collections.ConfigDict, **overrides) -> ml_collections.ConfigDict:
  """The env family's own config (config.env without `name`), with overrides."""
  settings = ml_collections.ConfigDict({k: v for k, v in config.env.items() if k != "name"})
  for key, value in overrides.items():
    settings[key] = value
  return settings


class Trainer:
  """Runs `config` in `workdir`, resuming from the last checkpoint there if any."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    validate_config(config)
    self.config, self.workdir = config, os.path.abspath(workdir)
    self.algorithm = get_algorithm(config.algorithm)
    self.env = get_env_module(config.env.name)
    self.env_config = env_settings(config)
    self.fmt = self.env.make_agent_format(self.env_config)
    os.makedirs(self.workdir, exist_ok=True)
    if hosts.is_primary():
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))

    self.mesh = make_mesh(MeshConfig(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                     tuple(map(tuple, config.mesh.rules))))
    model, self.tokenizer = load_model(config.model.name, dtype=config.model.dtype,
                                       param_dtype=config.model.param_dtype, mesh=self.mesh,
                                       rules=tuple(map(tuple, config.mesh.rules)))
    self.model_cfg = model.cfg
    self.graphdef, params = nnx.split(model, nnx.Param)
    check_sharded_enough(params, self.mesh)
    new_tokens = max(config.rollout.max_new_tokens, config.analyzer.max_new_tokens)
    self.max_prompt = config.rollout.max_prompt_tokens
    self.sampler = Sampler(self.graphdef, params, model.cfg, tokenizer=self.tokenizer,
                           mesh=self.mesh, max_cache_len=self._cache_len(new_tokens))
    rl = config.rl
    self.rl_optim = OptimConfig(learning_rate=rl.learning_rate, warmup_steps=rl.warmup_steps,
                                weight_decay=rl.weight_decay, grad_clip=rl.grad_clip)
    self.state_shardings = train_state_shardings(params, self.mesh, self.rl_optim)
    self.state = init_train_state(params, self.rl_optim, self.state_shardings)
    self.ref_params = None
    self.micro_batches = max(1, rl.mini_batch_size // rl.micro_batch_size)
    self.train_step = make_train_step(self.graphdef, self.rl_optim, TrainStepConfig(
        teacher_mode=rl.teacher_mode if self.algorithm.opd else "precomputed",
        micro_batches=self.micro_batches, logprob_chunk=rl.logprob_chunk,
        loss=self._loss_config()), self.mesh, self.state_shardings)
    self.score = make_score_fn(self.graphdef, rl.logprob_chunk, self.mesh)

    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                     keep=config.checkpoint.keep)
    self.metrics = metrics_lib.MetricsWriter(self.workdir, config.log.tensorboard,
                                             enabled=hosts.is_primary())
    self.timer = metrics_lib.Timer()
    self.host: dict[str, Any] = {"stage": "start", "iteration": 0, "task_cursor": 0}
    self.library: dict[str, str] = {}
    self._pool: EnvPool | hosts.HostShardedPool | None = None
    self._plans: dict[str, list[str]] = {}
    self._tasks: dict[str, list] = {}

  # ------------------------------------------------------------------ setup helpers

  def _cache_len(self, new_tokens: int) -> int:
    return 1 << (self.max_prompt + new_tokens - 1).bit_length()

  def _loss_config(self) -> LossConfig:
    rl = self.config.rl
    return LossConfig(clip_low=rl.clip_ratio_low, clip_high=rl.clip_ratio_high,
                      dual_clip=rl.dual_clip, kl_coef=rl.kl_coef,
                      entropy_coef=rl.entropy_coef, beta_opd=rl.beta_opd,
                      lambda_opd=rl.lambda_opd if self.algorithm.opd else 0.0)

  def tasks(self, split: str) -> list:
    """The split's tasks, loaded (and for generated envs, generated) once per run."""
    if split not in self._tasks:
      self._tasks[split] = self.env.load_tasks(self.env_config, split)
    return self._tasks[split]

  def pool(self) -> EnvPool | hosts.HostShardedPool:
    """The main env pool (with the expert, which the oracle analyzer and BC read)."""
    if self._pool is None:
      self._pool = self._make_pool(self.env_config, with_expert=True)
    return self._pool

  def _make_pool(self, settings, with_expert: bool = False):
    """`pool.num_workers` env processes on this host; with several hosts each steps its
    share of the rows (hosts.HostShardedPool)."""
    pool = EnvPool(self.config.env.name, settings, self.config.pool.num_workers,
                   self.config.pool.step_timeout_s, with_expert=with_expert,
                   seed=self.config.seed)
    return hosts.HostShardedPool(pool) if jax.process_count() > 1 else pool

  def _sync_sampler(self) -> None:
    self.sampler.update_params(self.state.params)

  # ------------------------------------------------------------------ checkpoints

  def _device_state(self) -> dict[str, Any]:
    state = {"train": self.state}
    if self.ref_params is not None:
      state["ref"] = self.ref_params
    return state

  def save(self) -> None:
    host = dict(self.host, library=self.library)
    self.checkpointer.save(self.host["iteration"], self._device_state(), host)

  def maybe_resume(self) -> bool:
    step = self.checkpointer.latest_step()
    if step is None:
      return False
    like = {"train": self.state}
    if self.config.rl.kl_coef > 0:
      like["ref"] = self.state.params
    restored, host = self.checkpointer.restore(step, like)
    self.state, self.ref_params = restored["train"], restored.get("ref")
    self.library = host.pop("library", {})
    self.host = host
    self.metrics.truncate_after(self.host["iteration"])
    self._sync_sampler()
    log.info("resumed from %s at iteration %d", self.checkpointer.directory, step)
    print(f"Resumed from checkpoint {step} in {self.checkpointer.directory}")
    return True

  # ------------------------------------------------------------------ the program

  def run(self) -> dict[str, Any]:
    """Runs (or resumes) the whole program and returns the final summary."""
    try:
      if not self.maybe_resume():
        self.before_rl()
      iterations = self.config.rl.iterations
      tasks = TaskIterator(self.tasks("train"),
                           self.config.seed, self.host["task_cursor"])
      while self.host["iteration"] < iterations:
        self.rl_iteration(tasks)
      final_eval = self.evaluate(self.host["iteration"]) if self.config.eval.at_end else {}
      return self.finish(final_eval)
    finally:
      if self._pool is not None:
        self._pool.close()
      self.metrics.close()

  def before_rl(self) -> None:
    """Warm start and stage 1, then the reference and the iteration-0 checkpoint."""
    if self.config.bc.enabled and self.config.bc.episodes > 0:
      self.behaviour_cloning()
    if self.algorithm.needs_annotations:
      self.stage1()
    elif self.config.analyzer.static_library:
      self.library = stage1.load_library_file(self.config.analyzer.static_library)
    if self.algorithm.skill_source == "library" and not self.library:
      raise ValueError("config.analyzer.static_library: the algorithm "
                       f"{self.algorithm.name!r} needs a skill library, and stage 1 "
                       "produced none")
    if self.config.rl.kl_coef > 0:
      self.ref_params = jax.tree.map(lambda x: x.copy(), self.state.params)
    self.host.update(stage="rl", iteration=0, task_cursor=0)
    self.save()

  def _fine_tune(self, examples, *, phase: str, holdout=(), **hyper) -> None:
    """NLL fine-tuning of the current parameters (sft.fine_tune); the RL optimizer state
    starts afresh afterwards."""
    if not examples:
      print(f"[{phase}] no examples: skipped")
      return
    params = fine_tune(
        self.graphdef, self.state.params, examples, holdout, mesh=self.mesh,
        pad_id=self.tokenizer.pad_id, max_tokens=self.config.sft.max_tokens,
        grad_clip=self.config.rl.grad_clip, chunk=self.config.rl.logprob_chunk,
        seed=self.config.seed, log=lambda step, metrics, suffix="": self.metrics.write(
            step, phase + suffix, metrics), desc=phase, **hyper)
    self.state = init_train_state(params, self.rl_optim, self.state_shardings)
    self._sync_sampler()

  def behaviour_cloning(self) -> None:
    """Clones every step of the env expert's episodes on the first `bc.episodes` training
    tasks (the `:cpu` presets' warm start)."""
    tasks = self.tasks("train")[:self.config.bc.episodes]
    with self.timer("bc"):
      demos = collect_demonstrations(self.pool(), self.fmt, tasks,
                                     self.env_config.max_steps, self.config.seed)
      examples = stage1.bc_examples(self.tokenizer, demos)
      print(f"[bc] {sum(d.won for d in demos)}/{len(demos)} expert episodes won, "
            f"{len(examples)} examples")
      bc = self.config.bc
      self._fine_tune(examples, phase="bc", epochs=bc.epochs, batch_size=bc.batch_size,
                      learning_rate=bc.learning_rate, warmup_fraction=0.0, b2=0.95,
                      weight_decay=0.0)

  def stage1(self) -> None:
    """Rollouts of the base policy, external annotation, skill SFT (module stage1.py)."""
    sft, folder = self.config.sft, os.path.join(self.workdir, "stage1")
    saved = stage1.load_stage1(folder)
    if saved is None:
      tasks = stage1.tasks_per_type(self.tasks("train"),
                                    sft.tasks_per_type)
      settings = env_settings(self.config, max_steps=sft.max_turns,
                              history_length=sft.history_length)
      spec = RolloutSpec(max_turns=sft.max_turns, temperature=sft.temperature, top_p=1.0,
                         max_new_tokens=self.config.rollout.max_new_tokens,
                         max_prompt_tokens=self.max_prompt)
      with self.timer("stage1_rollout"), self._make_pool(settings) as pool:
        trajs, stats = play_episodes(
            self.sampler, self.tokenizer, pool, self.env.make_agent_format(settings), tasks,
            sft.rollouts_per_task, spec, seed=self.config.seed, group_prefix="sft:",
            desc="stage1 rollout")
      with self.timer("stage1_analysis"):
        analyzer = self._analyzer(sft.analyzer_backend, trajs)
        analyses, astats = analyzer.analyze(trajs)
      records = [stage1.annotation_record(t, a.summary, a.skill)
                 for t, a in zip(trajs, analyses) if a is not None]
      saved = (records, stage1.skill_library(records))
      if hosts.is_primary():
        stage1.save_stage1(folder, *saved)
      self.metrics.write(0, "stage1", {**stats, **{f"analyzer_{k}": v for k, v in
                                                   astats.items()}})
    records, self.library = saved
    print(f"[stage1] {len(records)} well-formed annotations; library for "
          f"{sorted(self.library)}")
    if self.algorithm.stage1_sft:
      examples = stage1.sft_examples(self.tokenizer, records)
      train, holdout = stage1.split_holdout(examples, sft.holdout_fraction, self.config.seed)
      with self.timer("stage1_sft"):
        self._fine_tune(train, phase="sft", epochs=sft.epochs, batch_size=sft.batch_size,
                        learning_rate=sft.learning_rate,
                        warmup_fraction=sft.warmup_fraction, b2=0.95, weight_decay=0.01,
                        holdout=holdout)

  # ------------------------------------------------------------------ analysis

  def _analyzer(self, backend: str, trajs) -> analyzer_lib.Analyzer:
    a = self.config.analyzer
    cfg = analyzer_lib.AnalyzerConfig(
        backend=backend, max_retries=a.max_retries, min_skill_words=a.min_skill_words,
        base_url=a.openai.base_url, model=a.openai.model, api_key_env=a.openai.api_key_env,
        timeout_s=a.openai.timeout_s, http_retries=a.openai.max_http_retries,
        temperature=a.temperature, max_tokens=a.max_new_tokens)
    if backend == "oracle":
      self._attach_plans(trajs)
    return analyzer_lib.make_analyzer(cfg, self._policy_generate if backend == "policy"
                                      else None)

  def _attach_plans(self, trajs) -> None:
    """Privileged info for the oracle analyzer: the expert's plan for each task."""
    missing = {t.task_id for t in trajs} - set(self._plans)
    if missing:
      tasks = {t.task_id: t for t in self.tasks("train")}
      demos = collect_demonstrations(self.pool(), self.fmt, [tasks[i] for i in sorted(missing)],
                                     self.env_config.max_steps, self.config.seed)
      self._plans.update({d.task_id: d.actions for d in demos})
    for traj in trajs:
      traj.info["expert_plan"] = self._plans.get(traj.task_id, [])

  def _policy_generate(self, prompts: list[str]) -> list[str]:
    """The analyzer's decoding with the current (theta_old) parameters; over-long
    transcripts keep their head and tail."""
    limit = self.max_prompt
    ids = []
    for prompt in prompts:
      p = chat_prompt_ids(self.tokenizer, prompt)
      ids.append(p if len(p) <= limit else p[:limit // 4] + p[-(limit - limit // 4):])
    a = self.config.analyzer
    out = self.sampler.generate(ids, SamplingParams(max_new_tokens=a.max_new_tokens,
                                                    temperature=a.temperature),
                                seed=self.config.seed + self.host["iteration"])
    return out.texts

  def attach_skills(self, trajs) -> dict[str, float]:
    """Sets each trajectory's skill (on-policy analysis or the library) and the teacher
    prompt ids H(h_t, s) of its steps."""
    source = self.algorithm.skill_source if self.algorithm.opd else None
    stats: dict[str, float] = {}
    if source == "policy":
      analyzer = self._analyzer(self.config.analyzer.backend, trajs)
      stats = analyzer.annotate(trajs)
    elif source == "library":
      for traj in trajs:
        traj.skill = self.library.get(traj.info.get("task_type", ""))
    skills = [t.skill for t in trajs if t.skill]
    stats.update(skill_parse_rate=len(skills) / max(len(trajs), 1),
                 mean_skill_words=float(np.mean([len(s.split()) for s in skills]))
                 if skills else 0.0)
    for traj in trajs:
      for step in traj.steps:
        step.teacher_prompt_ids = (chat_prompt_ids(
            self.tokenizer, augment_prompt(step.prompt_text, traj.skill).text)
            if traj.skill else None)
    return stats

  # ------------------------------------------------------------------ RL

  def rl_iteration(self, tasks: TaskIterator) -> None:
    it, cfg = self.host["iteration"], self.config
    seed = cfg.seed * 100_003 + it
    self.timer.seconds = {}
    spec = RolloutSpec(max_turns=self.env_config.max_steps,
                       temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                       max_new_tokens=cfg.rollout.max_new_tokens,
                       max_prompt_tokens=self.max_prompt)
    batch_tasks = tasks.take(cfg.rollout.tasks_per_batch)
    with self.timer("rollout"):
      trajs, stats = play_episodes(
          self.sampler, self.tokenizer, self.pool(), self.fmt, batch_tasks,
          cfg.rollout.group_size, spec, seed=seed, group_prefix=f"{it}:",
          acting_skills=self.library if self.algorithm.acting_skills else None,
          desc=f"iter {it + 1} rollout")
    with self.timer("analysis"):
      stats.update(self.attach_skills(trajs))
    with self.timer("update"):
      stats.update(self.update(trajs))
    self._sync_sampler()
    self.host.update(iteration=it + 1, task_cursor=tasks.cursor,
                     train_success=self.host.get("train_success", []) + [stats["success"]])
    stats.update({f"time_{k}_s": v for k, v in self.timer.seconds.items()})
    self.metrics.write(it + 1, "train", stats)
    print(f"[iter {it + 1}/{cfg.rl.iterations}] success {stats['success']:.3f} "
          f"return {stats['mean_return']:.2f} invalid {stats['invalid_action_rate']:.2f} "
          f"loss {stats.get('loss', float('nan')):.4f} "
          f"skills {stats['skill_parse_rate']:.2f}")
    if cfg.eval.every and (it + 1) % cfg.eval.every == 0 and it + 1 < cfg.rl.iterations:
      self.evaluate(it + 1)
    if (it + 1) % cfg.checkpoint.every == 0 or it + 1 == cfg.rl.iterations:
      self.save()

  def update(self, trajs) -> dict[str, float]:
    """Builds the batch, scores teacher/reference log-probs once, runs the mini-batches."""
    cfg = self.config
    opd = self.algorithm.opd
    batch, bstats = build_batch(trajs, BatchConfig(
        response_len=cfg.rollout.max_new_tokens, prompt_bucket=128,
        max_prompt_len=self.max_prompt + 256, rows_multiple=cfg.rl.mini_batch_size,
        shared_prompt_len=opd and cfg.rl.teacher_mode == "joint",
        pad_id=self.tokenizer.pad_id, invalid_penalty=cfg.rl.invalid_penalty,
        norm_by_std=cfg.rl.normalize_std), with_teacher=opd)
    resp_len = cfg.rollout.max_new_tokens
    if opd and cfg.rl.teacher_mode == "precomputed":
      batch["teacher_logprobs"] = self._score_rows(self.state.params, batch["teacher_tokens"],
                                                   batch["teacher_mask"], resp_len)
    if cfg.rl.kl_coef > 0:
      batch["ref_logprobs"] = self._score_rows(self.ref_params, batch["student_tokens"],
                                               batch["student_mask"], resp_len)
    sums: dict[str, list[float]] = {}
    size = cfg.rl.mini_batch_size
    rows = batch["advantages"].shape[0]
    for start in tqdm(range(0, rows, size), desc="update", unit="mini-batch", leave=False):
      mini = {k: v[start:start + size] for k, v in batch.items()}
      self.state, m = self.train_step(self.state, hosts.put_rows(mini, self.mesh))
      for k, v in hosts.fetch(m).items():
        sums.setdefault(k, []).append(np.asarray(v))
    out = {k: (np.mean(v, axis=0).tolist() if np.ndim(v[0]) else float(np.mean(v)))
           for k, v in sums.items()}
    out.update({f"batch_{k}": v for k, v in bstats.items()})
    return out

  def _score_rows(self, params, tokens, mask, resp_len) -> np.ndarray:
    """Log-probs `[B, R]` in chunks of mini-batch rows (the shapes the step compiles)."""
    size = self.config.rl.mini_batch_size
    parts = []
    for s in range(0, tokens.shape[0], size):
      rows = hosts.put_rows({"tokens": tokens[s:s + size], "mask": mask[s:s + size]},
                            self.mesh)
      parts.append(hosts.fetch(self.score(params, rows["tokens"], rows["mask"], resp_len)))
    return np.concatenate(parts)

  # ------------------------------------------------------------------ evaluation

  def evaluate(self, step: int) -> dict[str, float]:
    """Success per task type (and overall) on each eval split, at eval temperature."""
    cfg = self.config
    results: dict[str, float] = {}
    spec = RolloutSpec(max_turns=self.env_config.max_steps, temperature=cfg.eval.temperature,
                       top_p=1.0,
                       max_new_tokens=cfg.rollout.max_new_tokens,
                       max_prompt_tokens=self.max_prompt)
    for split in cfg.eval.splits:
      tasks = self.tasks(split)
      if cfg.eval.max_episodes:
        tasks = tasks[:cfg.eval.max_episodes]
      if not tasks:
        continue
      with self.timer("eval"):
        trajs, stats = play_episodes(self.sampler, self.tokenizer, self.pool(), self.fmt,
                                     tasks, 1, spec, seed=10_007 + step,
                                     group_prefix=f"eval-{split}:", desc=f"eval {split}")
      results.update(split_results(split, tasks, trajs, stats))
    self.metrics.write(step, "eval", results)
    print(metrics_lib.format_table(sorted(results.items()), f"evaluation at iteration {step}"))
    return results

  def finish(self, final_eval: dict[str, float]) -> dict[str, Any]:
    """Export, plots and the summary table."""
    if self.config.checkpoint.export_hf:
      model = nnx.merge(self.graphdef, self.state.params)
      export_hf(model, os.path.join(self.workdir, "export"), self.tokenizer)
    summary = {"algorithm": self.config.algorithm, "env": self.config.env.name,
               "iterations": self.host["iteration"]}
    train = self.host.get("train_success", [])
    if train:  # the training rollouts' success: first and last iteration, and the best
      summary.update({"train/success_first": train[0], "train/success_last": train[-1],
                      "train/success_best": max(train)})
    summary.update(final_eval)
    if not hosts.is_primary():
      return summary
    if self.config.log.plots:
      metrics_lib.plot_curves(self.workdir, {
          "train": ["success", "mean_return", "invalid_action_rate", "loss", "pg_loss",
                    "opd_loss", "kl", "entropy", "gate_mean", "grad_norm",
                    "skill_parse_rate", "time_rollout_s"],
          "eval": sorted(final_eval)})
    print(metrics_lib.write_summary(self.workdir, summary))
    return summary
