"""The training program: warm start, stage-1 SFT, the self-evolving RL loop, evaluation.

One host-side class owns what lives on the host (env pools, sampler, checkpoints, metrics);
everything on device is a pure jitted function of the train state. Every source of
randomness is derived from `(config.seed, iteration)`, and the task iterator's position is
checkpointed, so a run resumed from its last checkpoint continues exactly where it stopped.

The workdir may be a local folder or a URI such as `gs://bucket/run`: checkpoints go
through orbax and every other file through `etils.epath` (`seed_jax.paths`). A SIGTERM
(a preempted TPU VM) stops the run at the next safe point with its last completed
iteration checkpointed, and `run()` returns normally (see `Trainer.run`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx

from seed_jax import metrics as metrics_lib
from seed_jax import paths, provenance
from seed_jax.agent.prompts import PromptEncoder
from seed_jax.checkpoint import Checkpointer
from seed_jax.envs.agent_format import decision_char_span
from seed_jax.envs.pool import EnvPool
from seed_jax.envs.registry import get_env_module
from seed_jax.models import export_hf, load_model, resolve_model_path
from seed_jax.models.lora import merge_trainable, merged_model, split_trainable
from seed_jax.models.weights import export_peft
from seed_jax.parallel import check_sharded_enough, hosts, make_mesh
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed import analyzer as analyzer_lib
from seed_jax.seed import losses
from seed_jax.seed.analysis_file import write_analysis_file
from seed_jax.seed.batch import (BatchConfig, build_batch, spread_row_order,
                                  trajectory_gate_stats)
from seed_jax.seed.episodes_file import write_episodes_file
from seed_jax.seed.packing import (max_segment_len, pack_batch, packed_widths, plan_packing,
                                   token_fill)
from seed_jax.seed.skills import skill_prompt_ids
from seed_jax.seed.token_gap import (response_span_masks, token_gap_stats,
                                     trajectory_token_gaps)
from seed_jax.seed.train_step import (init_train_state, make_score_fn, make_train_step,
                                      micro_batch_row_order, side_inputs,
                                      train_state_shardings, update_metrics)
from seed_jax.train import stage1
from seed_jax.train.results import split_results
from seed_jax.train.expert import collect_demonstrations
from seed_jax.train.init_from import initial_params
from seed_jax.train.rollout import play_episodes
from seed_jax.train.sft import FineTuneSpec, fine_tune
from seed_jax.train.spec import RunSpec
from seed_jax.train.tasks import TaskIterator
from seed_jax.wandb_sink import WandbSink

log = logging.getLogger(__name__)


class Preempted(Exception):
  """Raised at a safe point after a SIGTERM; `Trainer.run` turns it into a clean return."""


class Trainer:
  """Runs `spec` (see `seed_jax.train.spec.build_run_spec`) in `workdir`, resuming from the
  last checkpoint there if any. `checkpoint_dir` (default `workdir/checkpoints`) lets an
  evaluation (seed_jax/train/evaluate.py) write into its own folder and restore a run's
  checkpoints."""

  def __init__(self, spec: RunSpec, workdir: str, checkpoint_dir: str | None = None):
    self.spec, self.workdir = spec, paths.run_path(workdir)  # absolute; gs:// as given
    self.algorithm = spec.algorithm
    self.env = get_env_module(spec.env.name)
    self.env_config = spec.env.with_settings()
    self.fmt = self.env.make_agent_format(self.env_config)
    self.workdir.mkdir(parents=True, exist_ok=True)
    if hosts.is_primary():
      paths.write_text(self.workdir / "config.json", spec.config_json)

    self.mesh = make_mesh(spec.mesh)
    model, self.tokenizer = load_model(spec.model.name, mesh=self.mesh, seed=spec.seed,
                                       **spec.model.load_kwargs)
    self.model_cfg = model.cfg
    # How prompts become ids: the chat template, and a vision-language model's images.
    self.encoder = PromptEncoder.for_model(self.tokenizer, model.cfg, spec.model.name)
    self.graphdef, params = nnx.split(model, nnx.Param)
    self.checkpointer = Checkpointer(checkpoint_dir or self.workdir / "checkpoints",
                                     keep=spec.output.checkpoint_keep)
    # Another run's or an HF folder's weights, before anything uses them; a run that will
    # resume from its own checkpoints does not read them, except with LoRA, whose
    # checkpoints hold the adapters only: the frozen base comes from here on every start.
    resuming = self.checkpointer.latest_step() is not None
    if spec.init_from and (not resuming or model.cfg.lora_rank):
      params = initial_params(spec.init_from, params, model.cfg, self.mesh)
    check_sharded_enough(params, self.mesh)
    self.sampler = Sampler(self.graphdef, params, model.cfg, tokenizer=self.tokenizer,
                           mesh=self.mesh, max_cache_len=spec.max_cache_len)
    self.state_shardings = train_state_shardings(params, self.mesh, spec.optim)
    self.state = init_train_state(params, spec.optim, self.state_shardings)
    # The KL reference: the trainable part at the start of RL (with LoRA the adapters only;
    # the frozen base is shared with the policy, `_reference_params`).
    self.ref_trainable = None
    self.train_step = make_train_step(self.graphdef, spec.optim, spec.train_step, self.mesh,
                                      self.state_shardings)
    self.score = make_score_fn(self.graphdef, spec.train_step.logprob_chunk, self.mesh)

    sinks = ()
    if spec.output.wandb and hosts.is_primary():
      sinks = (WandbSink(self.workdir, spec.output.wandb_settings,
                         json.loads(spec.config_json)),)
    self.metrics = metrics_lib.MetricsWriter(self.workdir, spec.output.tensorboard,
                                             enabled=hosts.is_primary(), sinks=sinks)
    self.timer = metrics_lib.Timer()
    self.host: dict[str, Any] = {"stage": "start", "iteration": 0, "task_cursor": 0}
    self.library: dict[str, str] = {}
    self._pool: EnvPool | hosts.HostShardedPool | None = None
    self._plans: dict[str, list[str]] = {}
    self._tasks: dict[str, list] = {}
    self._saved_iteration: int | None = None  # the iteration of the last checkpoint
    self._guard: hosts.PreemptionGuard | None = None  # installed by run()

  # ------------------------------------------------------------------ setup helpers

  def tasks(self, split: str) -> list:
    """The split's tasks, loaded (and for generated envs, generated) once per run."""
    if split not in self._tasks:
      self._tasks[split] = self.env.load_tasks(self.env_config, split)
    return self._tasks[split]

  def rl_tasks(self) -> list:
    """The games RL trains on: every training game, or with `bc.disjoint` those the warm
    start did not clone (the first `bc.episodes`)."""
    tasks, bc = self.tasks("train"), self.spec.bc
    if bc is None or not bc.disjoint or not bc.episodes:
      return tasks
    if len(tasks) <= bc.episodes:
      raise ValueError(f"config.bc.disjoint: the warm start clones all {len(tasks)} training "
                       f"games (bc.episodes={bc.episodes}); none is left for RL")
    return tasks[bc.episodes:]

  def pool(self) -> EnvPool | hosts.HostShardedPool:
    """The main env pool (with the expert, which the oracle analyzer and BC read)."""
    if self._pool is None:
      self._pool = self._make_pool(self.env_config, with_expert=True)
    return self._pool

  def _make_pool(self, settings, with_expert: bool = False):
    """`pool.num_workers` env processes on this host; with several hosts each steps its
    share of the rows (hosts.HostShardedPool)."""
    env = self.spec.env
    pool = EnvPool(env.name, settings, env.num_workers, env.step_timeout_s,
                   with_expert=with_expert, seed=self.spec.seed)
    return hosts.HostShardedPool(pool) if jax.process_count() > 1 else pool

  def _sync_sampler(self) -> None:
    self.sampler.update_params(self.state.params)

  # ------------------------------------------------------------------ checkpoints

  def _reference_params(self):
    return merge_trainable(self.ref_trainable, split_trainable(self.state.params)[1])

  def _device_state(self) -> dict[str, Any]:
    """What a checkpoint holds: the train state with the trainable parameters only (with
    LoRA the adapters; the frozen base is reloaded on every start) and the reference."""
    state = {"train": self.state.replace(params=split_trainable(self.state.params)[0])}
    if self.ref_trainable is not None:
      state["ref"] = self.ref_trainable
    return state

  def _base(self) -> dict[str, str] | None:
    """The frozen base a LoRA checkpoint's adapters belong to (None without LoRA)."""
    if not self.model_cfg.lora_rank:
      return None
    return {"model": self.spec.model.name, "init_from": self.spec.init_from}

  def save(self) -> None:
    """Checkpoints the last completed iteration (asynchronously) and flushes the metrics
    (a no-op for a local workdir), so a resumed run finds both."""
    host = dict(self.host, library=self.library, lora_base=self._base())
    self.checkpointer.save(self.host["iteration"], self._device_state(), host)
    self._saved_iteration = self.host["iteration"]
    self.metrics.flush()

  def restore(self, step: int) -> None:
    """Loads checkpoint `step`: the train state (and reference), the host state and the
    skill library (Skill-GRPO acts with it, in evaluation too)."""
    trainable, frozen = split_trainable(self.state.params)
    like = {"train": self.state.replace(params=trainable)}
    if self.spec.rl.kl:
      like["ref"] = trainable
    restored, host = self.checkpointer.restore(step, like)
    base = host.pop("lora_base", None)
    if base != self._base():
      raise ValueError(f"checkpoint {step} in {self.checkpointer.directory} was trained on "
                       f"the base {base}, this run has {self._base()}: resume with the "
                       f"run's own config.model.name, config.model.lora.* and init_from")
    self.state = restored["train"].replace(params=merge_trainable(restored["train"].params,
                                                                  frozen))
    self.ref_trainable = restored.get("ref")
    self.library = host.pop("library", {})
    self.host = host
    self._sync_sampler()

  def maybe_resume(self) -> bool:
    step = self.checkpointer.latest_step()
    if step is None:
      return False
    self.restore(step)
    self._saved_iteration = step
    self.metrics.truncate_after(self.host["iteration"])
    log.info("resumed from %s at iteration %d", self.checkpointer.directory, step)
    hosts.print0(f"Resumed from checkpoint {step} in {self.checkpointer.directory}")
    return True

  # ------------------------------------------------------------------ preemption

  def _should_stop(self) -> bool:
    """Whether a SIGTERM asks to stop (agreed by all hosts: call at the same points)."""
    return self._guard is not None and self._guard.should_stop()

  def _stop_if_preempted(self) -> None:
    """A safe point where everything since the last checkpoint may be thrown away: before
    the first checkpoint (a restart redoes it all), or while the last checkpoint is the
    start of the current iteration (a restart redoes the iteration, with the same seeds
    and tasks). Elsewhere the iteration runs to its end, where `rl_iteration` saves it."""
    restartable = self._saved_iteration in (None, self.host["iteration"])
    if restartable and self._should_stop():
      raise Preempted

  def _preempted_summary(self) -> dict[str, Any]:
    iteration = self._saved_iteration
    where = (f"checkpoint {iteration} in {self.checkpointer.directory}"
             if iteration is not None else "no checkpoint yet: the next start begins again")
    hosts.print0(f"[preempted] SIGTERM: stopped at a safe point; {where}. The same command "
                 "resumes.")
    return {"algorithm": self.algorithm.name, "env": self.spec.env.name,
            "iterations": iteration, "preempted": True}

  # ------------------------------------------------------------------ the program

  def run(self) -> dict[str, Any]:
    """Runs (or resumes) the whole program and returns the final summary.

    A SIGTERM (a preempted TPU VM) is held back until the next safe point, where the run
    stops with its last completed RL iteration checkpointed and returns
    `{"preempted": True, "iterations": <that iteration>, ...}` (the command exits 0); the
    next start resumes from it. The checkpoint holds iteration boundaries only, so:
    - mid-iteration (after the rollout, the analysis and every update mini-batch) the
      iteration is abandoned when its start is checkpointed (`checkpoint.every=1`, the
      default) and redone identically on resume; otherwise it runs to its end;
    - at an iteration's end that iteration is saved (if not yet) and the run stops; a
      periodic evaluation due there is skipped, the final evaluation is not started;
    - before the iteration-0 checkpoint (warm start, stage 1) the run stops after the
      phase in progress and the next start begins again (reusing saved stage-1
      annotations).
    The last save is committed before `run` returns, however it ends.
    """
    try:
      with hosts.PreemptionGuard() as self._guard:
        resumed = self.maybe_resume()
        self._record_start(resumed)
        if not resumed:
          self.before_rl()
        tasks = TaskIterator(self.rl_tasks(), self.spec.seed, self.host["task_cursor"])
        while self.host["iteration"] < self.spec.rl.iterations:
          self.rl_iteration(tasks)
        if self._should_stop():
          raise Preempted
        final_eval = self.evaluate(self.host["iteration"]) if self.spec.eval.at_end else {}
        return self.finish(final_eval)
    except Preempted:
      return self._preempted_summary()
    finally:
      self._guard = None
      self.close()

  def _record_start(self, resumed: bool) -> None:
    """provenance.json: this start's machine and the fingerprint of the weights it starts
    from (the model's, `init_from`'s or, resuming, its checkpoint's)."""
    fingerprint = provenance.params_fingerprint(self.state.params)  # every host
    if hosts.is_primary():
      provenance.record_start(self.workdir, self.host["iteration"] if resumed else None,
                              fingerprint)

  def before_rl(self) -> None:
    """Warm start and stage 1, then the reference and the iteration-0 checkpoint."""
    if self.spec.bc is not None and self.spec.bc.episodes > 0:
      self.behaviour_cloning()
      self._stop_if_preempted()
    library_file = self.spec.static_library if self._uses_library else ""
    if library_file:  # the file takes precedence over the stage-1 library
      self.library = stage1.load_library_file(library_file)
    if self.algorithm.stage1_sft or (self._uses_library and not library_file):
      self.stage1(keep_library=not library_file)
      self._stop_if_preempted()
    if self._uses_library and not self.library:
      raise ValueError("config.analyzer.static_library: the algorithm "
                       f"{self.algorithm.name!r} needs a skill library, and stage 1 "
                       "produced none")
    if self.spec.rl.kl:
      self.take_reference()
    self.host.update(stage="rl", iteration=0, task_cursor=0)
    self.save()

  def take_reference(self) -> None:
    """The KL term's reference: a copy of the trainable parameters as they are now."""
    self.ref_trainable = jax.tree.map(lambda x: x.copy(), split_trainable(self.state.params)[0])

  @property
  def _uses_library(self) -> bool:
    """Skills come from a fixed library (OPD teacher or acting prompt)."""
    return self.algorithm.skill_source == "library" and (self.spec.rl.opd or
                                                         self.algorithm.acting_skills)

  def _fine_tune(self, examples, spec: FineTuneSpec, *, phase: str, holdout=()) -> None:
    """NLL fine-tuning of the current parameters (sft.fine_tune); the RL optimizer state
    starts afresh afterwards."""
    if not examples:
      hosts.print0(f"[{phase}] no examples: skipped")
      return
    params = self.state.params
    # The RL moments start afresh afterwards anyway: free them for the fine-tuning phase's
    # own optimizer (`seed_jax.plan` counts the RL weights alone as held during it).
    self.state = None
    params = fine_tune(
        self.graphdef, params, examples, holdout, spec=spec, mesh=self.mesh,
        pad_id=self.tokenizer.pad_id, seed=self.spec.seed,
        log=lambda step, metrics, suffix="": self.metrics.write(step, phase + suffix, metrics),
        desc=phase)
    self.state = init_train_state(params, self.spec.optim, self.state_shardings)
    self._sync_sampler()

  def behaviour_cloning(self) -> None:
    """Clones every step of the env expert's episodes on the first `bc.episodes` training
    tasks (the `:cpu` presets' warm start); with `bc.skill_fraction` that share of the
    steps is shown again with the game's oracle skill through H."""
    with self.timer("bc"):
      demos, examples = self.behaviour_cloning_examples()
      hosts.print0(f"[bc] {sum(d.won for d in demos)}/{len(demos)} expert episodes won, "
            f"{len(examples)} examples")
      self._fine_tune(examples, self.spec.bc.fine_tune, phase="bc")

  def behaviour_cloning_examples(self, episodes: int | None = None,
                                 skill_fraction: float | None = None,
                                 env_settings: Mapping[str, Any] | None = None
                                 ) -> tuple[list, list]:
    """(demonstrations, examples): the env expert's episodes on the first `episodes`
    (`bc.episodes`) training tasks, played with `env_settings` (`bc.env_settings`), and the
    warm start's examples made from them."""
    bc = self.spec.bc
    episodes = bc.episodes if episodes is None else episodes
    skill_fraction = bc.skill_fraction if skill_fraction is None else skill_fraction
    env_settings = bc.env_settings if env_settings is None else env_settings
    if env_settings:  # the cloned games are played with settings of their own
      settings = self.spec.env.with_settings(**env_settings)
      games, pool = (self.env.load_tasks(settings, "train"),
                     self._make_pool(settings, with_expert=True))
    else:  # the run's games and pool, which stays open for RL
      settings, games, pool = (self.env_config, self.tasks("train"),
                               contextlib.nullcontext(self.pool()))
    with pool as cloning_pool:
      demos = collect_demonstrations(cloning_pool, self.env.make_agent_format(settings),
                                     games[:episodes], settings.max_steps, self.spec.seed)
    examples = stage1.bc_examples(
        self.tokenizer, demos, skill_fraction=skill_fraction,
        task_line_pattern=self.fmt.task_line_pattern, placement=self.spec.skill_placement,
        seed=self.spec.seed)
    return demos, examples

  def rehearsal_examples(self, count: int) -> list:
    """`count` of the warm start's behaviour-cloning examples, a seeded choice, for stage 1
    to train on beside the analyzer's (`sft.rehearsal`)."""
    spec = self.spec.stage1
    _, examples = self.behaviour_cloning_examples(spec.rehearsal_episodes,
                                                  spec.rehearsal_skill_fraction,
                                                  spec.rehearsal_env_settings)
    chosen = np.random.default_rng([self.spec.seed, 1]).permutation(len(examples))[:count]
    return [examples[i] for i in sorted(chosen)]

  def stage1(self, keep_library: bool = True) -> None:
    """Rollouts of the base policy, external annotation, skill SFT (module stage1.py).

    Args:
      keep_library: take the library built from the annotations (False when the
        `analyzer.static_library` file gives it).
    """
    spec, folder = self.spec.stage1, self.workdir / "stage1"
    saved = stage1.load_stage1(folder)
    if saved is None:
      tasks = stage1.tasks_per_type(self.tasks("train"), spec.tasks_per_type)
      settings = self.spec.env.with_settings(max_steps=spec.rollout.max_turns,
                                             history_length=spec.history_length)
      with self.timer("stage1_rollout"), self._make_pool(settings) as pool:
        trajs, stats = play_episodes(
            self.sampler, self.encoder, pool, self.env.make_agent_format(settings), tasks,
            spec.rollouts_per_task, spec.rollout, seed=self.spec.seed, group_prefix="sft:",
            desc=hosts.primary_label("stage1 rollout"))
      with self.timer("stage1_analysis"):
        reports, astats = self._analyzer(spec.annotator, trajs).analyze(trajs,
                                                                         seed=self.spec.seed)
      records = stage1.annotation_records(trajs, reports)
      saved = (records, stage1.skill_library(records))
      if hosts.is_primary():
        stage1.save_stage1(folder, *saved)
      self.metrics.write(0, "stage1", {**stats, **{f"analyzer_{k}": v for k, v in
                                                   astats.items()}})
    records, library = saved
    if keep_library:
      self.library = library
    hosts.print0(f"[stage1] {len(records)} well-formed annotations; library for "
          f"{sorted(self.library)}")
    if self.algorithm.stage1_sft:
      analyzer = self.spec.analyzer
      examples = stage1.sft_examples(self.tokenizer, records,
                                     self.spec.analyzer_max_prompt_tokens,
                                     analyzer.answer_prefix)
      stage1.check_rows_hold_prompts(examples, spec.fine_tune.max_tokens)
      over = stage1.answers_over_budget(examples, analyzer.max_tokens)
      if over:
        longest = max(len(e.target_ids) for e in examples)
        hosts.print0(f"[stage1] warning: {over} of {len(examples)} taught answers are longer "
                     f"than config.analyzer.max_new_tokens={analyzer.max_tokens} (the longest "
                     f"{longest} tokens): the policy analyzer would be cut off before they "
                     "close; raise it")
      self.metrics.write(0, "stage1_sft", {"sft_answers_over_budget": over})
      train, holdout = stage1.split_holdout(examples, spec.fine_tune.holdout_fraction,
                                            self.spec.seed)
      if spec.rehearsal:
        rehearsed = self.rehearsal_examples(round(spec.rehearsal * len(train)))
        hosts.print0(f"[stage1] {len(train)} analyzer examples and {len(rehearsed)} "
                     "behaviour-cloning examples rehearsed beside them (sft.rehearsal)")
        train = train + rehearsed
      with self.timer("stage1_sft"):
        self._fine_tune(train, spec.fine_tune, phase="sft", holdout=holdout)

  # ------------------------------------------------------------------ analysis

  def _analyzer(self, cfg: analyzer_lib.AnalyzerConfig, trajs) -> analyzer_lib.Analyzer:
    if cfg.backend == "oracle":
      self._attach_plans(trajs)
    return analyzer_lib.make_analyzer(
        cfg, self.policy_generate if cfg.backend == "policy" else None,
        tokenizer=self.tokenizer, max_prompt_tokens=self.spec.analyzer_max_prompt_tokens)

  def _attach_plans(self, trajs) -> None:
    """Privileged info for the oracle analyzer: the expert's plan for each task."""
    missing = {t.task_id for t in trajs} - set(self._plans)
    if missing:
      tasks = {t.task_id: t for t in self.tasks("train")}
      demos = collect_demonstrations(self.pool(), self.fmt, [tasks[i] for i in sorted(missing)],
                                     self.env_config.max_steps, self.spec.seed)
      self._plans.update({d.task_id: d.actions for d in demos})
    for traj in trajs:
      traj.info["expert_plan"] = self._plans.get(traj.task_id, [])

  def policy_generate(self, prompt_ids: list[list[int]], *, temperature: float,
                       seed: int) -> list[str]:
    """The analyzer's decoding with theta_old. Prompts arrive fitted to
    `analyzer.max_prompt_tokens` by the analyzer's transcript builder (stage 1's format);
    retries arrive with a sampling temperature and their own seed. At most
    `analyzer.decode_batch` prompts are decoded at a time (the KV cache's bound)."""
    sampling = SamplingParams(max_new_tokens=self.spec.analyzer.max_tokens,
                              temperature=temperature)
    size = self.spec.analyzer.decode_batch or len(prompt_ids)
    texts: list[str] = []
    for part, start in enumerate(range(0, len(prompt_ids), size)):
      texts += self.sampler.generate(prompt_ids[start:start + size], sampling,
                                     seed=seed + part).texts
    return texts

  def attach_skills(self, trajs) -> tuple[dict[str, float], list | None]:
    """Sets each trajectory's skill (on-policy analysis or the library) and the teacher
    prompt ids H(h_t, s) of its steps. Called only when OPD is on.

    Returns:
      (stats, the analyzer's report per trajectory, or None for library skills).
    """
    stats: dict[str, float] = {}
    reports = None
    if self.algorithm.skill_source == "policy":
      reports, astats = self._analyzer(self.spec.analyzer, trajs).analyze(
          trajs, seed=self.spec.seed * 100_003 + self.host["iteration"])
      shared = analyzer_lib.assign_skills(trajs, reports, self.spec.analyzer.group_hindsight)
      stats = {f"analyzer_{k}": v for k, v in astats.items()}
      if self.spec.analyzer.group_hindsight:
        stats["skill_from_sibling"] = shared / max(len(trajs), 1)
    else:
      for traj in trajs:
        traj.skill = self.library.get(traj.info.get("task_type", ""))
    # The parse rate counts each trajectory's own analysis (a sibling's skill shared under
    # group hindsight is not a parse).
    skills = ([r.skill for r in reports if r.skill] if reports is not None
              else [t.skill for t in trajs if t.skill])
    stats.update(skill_parse_rate=len(skills) / max(len(trajs), 1),
                 mean_skill_words=float(np.mean([len(s.split()) for s in skills]))
                 if skills else 0.0)
    for traj in trajs:
      for step in traj.steps:
        step.teacher_prompt_ids = (skill_prompt_ids(
            self.encoder, step.prompt_text, traj.skill, self.fmt.task_line_pattern,
            self.spec.skill_placement, step.image)[1] if traj.skill else None)
    return stats, reports

  # ------------------------------------------------------------------ RL

  @property
  def _acting_skills(self) -> dict[str, str] | None:
    """Skill-GRPO's library, placed in the acting prompt in training and evaluation."""
    return self.library if self.algorithm.acting_skills else None

  def rollout(self, batch_tasks, iteration: int) -> tuple[list, dict[str, float]]:
    """Iteration `iteration`'s (0-based) episodes: `rl.group_size` of each task, sampled
    with that iteration's seed (the same games and sampling seeds for every arm)."""
    spec = self.spec
    return play_episodes(
        self.sampler, self.encoder, self.pool(), self.fmt, batch_tasks,
        spec.rl.group_size, spec.rollout, seed=spec.seed * 100_003 + iteration,
        group_prefix=f"{iteration}:", acting_skills=self._acting_skills,
        skill_placement=spec.skill_placement,
        desc=hosts.primary_label(f"iter {iteration + 1} rollout"))

  def rl_iteration(self, tasks: TaskIterator) -> None:
    it, spec = self.host["iteration"], self.spec
    self.timer.seconds = {}
    batch_tasks = tasks.take(spec.rl.tasks_per_batch)
    with self.timer("rollout"):
      trajs, stats = self.rollout(batch_tasks, it)
    self._stop_if_preempted()
    reports = None
    if spec.rl.opd:
      with self.timer("analysis"):
        astats, reports = self.attach_skills(trajs)
        stats.update(astats)
      self._stop_if_preempted()
    with self.timer("update"):
      ustats, gates = self.update(trajs)
      stats.update(ustats)
    if hosts.is_primary():
      write_episodes_file(self.workdir, it + 1, trajs)
      if spec.rl.opd:
        write_analysis_file(self.workdir, it + 1, trajs, reports, gates)
    self._sync_sampler()
    self.host.update(iteration=it + 1, task_cursor=tasks.cursor,
                     train_success=self.host.get("train_success", []) + [stats["success"]])
    stats.update({f"time_{k}_s": v for k, v in self.timer.seconds.items()})
    self.metrics.write(it + 1, "train", stats)
    skills = f" skills {stats['skill_parse_rate']:.2f}" if spec.rl.opd else ""
    if "gap_all_tokens" in stats:  # the teacher gap at theta_old: action block vs the rest
      skills += "".join(f" gap {part} {stats.get(f'gap_{part}_delta_mean', float('nan')):+.3f}"
                        for part in ("action", "rest"))
    hosts.print0(f"[iter {it + 1}/{spec.rl.iterations}] success {stats['success']:.3f} "
          f"return {stats['mean_return']:.2f} invalid {stats['invalid_action_rate']:.2f} "
          f"loss {stats.get('loss', float('nan')):.4f}{skills}")
    if self._should_stop():  # the iteration is complete: keep it and stop
      self.save()
      raise Preempted
    every, last = spec.eval.every, it + 1 == spec.rl.iterations
    if every and (it + 1) % every == 0 and not last:
      self.evaluate(it + 1)
    if last or (spec.output.checkpoint_every and (it + 1) % spec.output.checkpoint_every == 0):
      self.save()

  def update(self, trajs) -> tuple[dict[str, float], list | None]:
    """Builds the batch, scores teacher/reference log-probs once, runs the mini-batches.

    Returns:
      (metrics: the update's (`update_metrics`) plus, with the teacher scored at theta_old,
      the teacher gap (`token_gap.token_gap_stats`, keys `gap_*`); per trajectory, its OPD
      gate statistics at theta_old with the gap on its action block and the rest, or None
      where the teacher is scored inside the step).
    """
    spec = self.spec
    batch, bstats = self.scored_batch(trajs)
    resp_len = spec.batch.response_len
    gates, gaps = None, {}
    if "teacher_logprobs" in batch:  # at theta_old: the "precomputed" teacher mode only
      beta, teacher = spec.train_step.loss.beta_opd, batch["teacher_logprobs"]
      rows = batch["advantages"].shape[0]
      actions, decisions = response_span_masks(trajs, resp_len, self.tokenizer, num_rows=rows)
      gaps = token_gap_stats(trajs, batch, teacher, beta, actions, decisions)
      gates = [None if gate is None else {**gate, **split} for gate, split in zip(
          trajectory_gate_stats(trajs, batch, teacher, beta),
          trajectory_token_gaps(trajs, batch, teacher, beta, actions))]
    steps: list[dict[str, Any]] = []
    minis, window = self.mini_batches(batch)
    fill = [token_fill(mini) for mini in minis]
    silent = 0  # mini-batches with no row any loss term counts: the step would not update
    for mini in hosts.progress(minis, desc="update", unit="mini-batch", leave=False):
      if not _has_signal(mini, self._opd_counts):
        silent += 1
        continue
      self.state, m = self.train_step(self.state, hosts.put_rows(mini, self.mesh), window)
      steps.append(hosts.fetch(m))
      self._stop_if_preempted()
    out = update_metrics(steps, spec.train_step.loss) if steps else {}
    out["update_empty"] = out.get("update_empty", 0.0) + silent
    out.update(gaps)
    out.update({f"batch_{k}": v for k, v in bstats.items()})
    out.update({f"batch_{k}": float(np.mean([f[k] for f in fill])) for k in fill[0]})
    return out, gates

  def scored_batch(self, trajs) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The update's rows (`build_batch`) with what is scored once before the steps: the
    teacher's log-probs at theta_old (OPD in the "precomputed" teacher mode) and the
    reference's (with the KL term); with `rl.opd_span` "decision", the tokens the OPD term
    counts (`losses.OPD_SPAN_KEY`). Returns (batch, build_batch's stats)."""
    spec = self.spec
    batch, bstats = build_batch(trajs, self.batch_config, with_teacher=spec.rl.opd)
    if spec.rl.opd and spec.rl.opd_span == "decision":
      (decisions,) = response_span_masks(trajs, spec.batch.response_len, self.tokenizer,
                                         num_rows=batch["advantages"].shape[0],
                                         spans=(decision_char_span,))
      batch[losses.OPD_SPAN_KEY] = decisions.astype(np.float32)
    if spec.rl.opd and spec.train_step.teacher_mode == "precomputed":
      batch["teacher_logprobs"] = self.score_rows(self.state.params, batch, "teacher")
    if spec.rl.kl:
      batch["ref_logprobs"] = self.score_rows(self._reference_params(), batch, "student")
    return batch, bstats

  def mini_batches(self, batch: dict[str, np.ndarray]
                   ) -> tuple[list[dict[str, np.ndarray]], int | None]:
    """The optimizer steps' batches and the train step's attention window.

    Returns:
      (mini_batches, window). mini_batches: `rl.mini_batch_size` rows each (with
      `rl.spread_outcome_rows` taken in `spread_row_order`), or with `rl.pack_rows` those
      rows packed into sequences (`seed_jax.seed.packing`), every mini-batch at the same
      widths so that the step compiles once an iteration. window: how far back a packed
      turn's keys reach (`max_segment_len`); None for unpacked rows.
    """
    size = self.spec.rl.mini_batch_size
    rows = batch["advantages"].shape[0]
    if self.spec.rl.spread_outcome_rows:
      order = spread_row_order(batch["outcome_mask"], size)
      batch = {k: v[order] for k, v in batch.items()}
    minis = [{k: v[start:start + size] for k, v in batch.items()}
             for start in range(0, rows, size)]
    window = None
    if self.spec.rl.pack_rows:
      plans = [plan_packing(mini, self.spec.rl.sequences_per_mini_batch) for mini in minis]
      widths = packed_widths(plans, self.spec.batch.prompt_bucket,
                             shared=self.spec.batch.shared_prompt_len)
      minis = [pack_batch(mini, plan, widths, self.tokenizer.pad_id)
               for mini, plan in zip(minis, plans)]
      window = max_segment_len(batch)
    return [self._live_rows_first(mini) for mini in minis], window

  def _live_rows_first(self, mini: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The mini-batch with the rows a loss term counts in its first micro-batches
    (`micro_batch_row_order`), so that the step skips the rest."""
    live = np.asarray(losses.signal_token_mask(mini, self._opd_counts).sum(-1) > 0)
    order = micro_batch_row_order(live, self.spec.train_step.micro_batches)
    return {k: v[order] for k, v in mini.items()}

  @property
  def _opd_counts(self) -> bool:
    """Whether the OPD term counts in the loss (its rows carry signal of their own)."""
    return self.spec.rl.opd and self.spec.train_step.loss.lambda_opd > 0

  @property
  def batch_config(self) -> BatchConfig:
    """`batch.*` with the tokenizer's pad id and the model's image placeholder."""
    vision = self.model_cfg.vision
    return dataclasses.replace(
        self.spec.batch, pad_id=self.tokenizer.pad_id,
        image_token_id=self.model_cfg.image_token_id,
        spatial_merge_size=vision.spatial_merge_size if vision is not None else 2)

  def score_rows(self, params, batch: dict[str, np.ndarray], side: str) -> np.ndarray:
    """Log-probs `[B, R]` of one side's rows ("teacher" or "student", with the rows'
    images), in chunks of micro-batch rows: the rows the step itself runs at once (B is
    padded to a multiple of the mini-batch, so every chunk has one shape). A whole
    mini-batch at once needs far more memory: 15.3 GiB a v5e chip for Qwen2.5-1.5B at
    256 x 2,560 tokens (python -m seed_jax.plan)."""
    size = self.spec.rl.micro_batch_size
    rows, resp_len = batch["response_mask"].shape
    inputs = side_inputs(batch, side)
    if "image_patches" in batch:
      inputs["image_patches"] = batch["image_patches"]
    parts = []
    for s in range(0, rows, size):
      chunk = hosts.put_rows({k: v[s:s + size] for k, v in inputs.items()}, self.mesh)
      parts.append(hosts.fetch(self.score(params, chunk, resp_len)))
    return np.concatenate(parts)

  # ------------------------------------------------------------------ evaluation

  def evaluate(self, step: int) -> dict[str, float]:
    """Success per task type (and overall) on each eval split, at eval temperature."""
    spec = self.spec.eval
    results: dict[str, float] = {}
    for split in spec.splits:
      tasks = self.tasks(split)
      if spec.max_episodes:
        tasks = tasks[:spec.max_episodes]
      if not tasks:
        continue
      with self.timer("eval"):
        trajs, stats = play_episodes(self.sampler, self.encoder, self.pool(), self.fmt,
                                     tasks, 1, spec.rollout, seed=10_007 + step,
                                     group_prefix=f"eval-{split}:",
                                     acting_skills=self._acting_skills,
                                     skill_placement=self.spec.skill_placement,
                                     desc=hosts.primary_label(f"eval {split}"))
      results.update(split_results(split, tasks, trajs, stats))
    self.metrics.write(step, "eval", results)
    hosts.print0(metrics_lib.format_table(sorted(results.items()),
                                          f"evaluation at iteration {step}"))
    return results

  def export(self, folder: paths.PathLike) -> str:
    """Writes the current parameters and the tokenizer as a Hugging Face folder (local,
    or written locally and copied up to a gs:// folder). With LoRA the folder holds the
    merged model, and `adapter/` in it the adapters as a PEFT folder for their base."""
    model = nnx.merge(self.graphdef, self.state.params)
    with paths.local_folder(folder) as local:
      # A vision-language model's folder carries its image processor's sizes too.
      processor = self.encoder.processor
      if not self.model_cfg.lora_rank:
        export_hf(model, local, self.tokenizer, image_processor=processor)
      else:
        export_hf(merged_model(model), local, self.tokenizer, image_processor=processor)
        base = self.spec.init_from or resolve_model_path(self.spec.model.name)
        export_peft(model, os.path.join(local, "adapter"), base_model=base)
    return os.fspath(paths.run_path(folder))

  def finish(self, final_eval: dict[str, float]) -> dict[str, Any]:
    """Export, plots and the summary table."""
    if self.spec.output.export_hf:
      self.export(self.workdir / "export")
    summary = {"algorithm": self.algorithm.name, "env": self.spec.env.name,
               "iterations": self.host["iteration"]}
    train = self.host.get("train_success", [])
    if train:  # the training rollouts' success: first and last iteration, and the best
      summary.update({"train/success_first": train[0], "train/success_last": train[-1],
                      "train/success_best": max(train)})
    summary.update(final_eval)
    final_fingerprint = provenance.params_fingerprint(self.state.params)  # every host
    if not hosts.is_primary():
      return summary
    provenance.record_end(self.workdir, final_fingerprint)
    if self.spec.output.plots:
      metrics_lib.plot_curves(self.workdir, {
          "train": ["success", "mean_return", "invalid_action_rate",
                    "ineffective_action_rate", "loss", "pg_loss",
                    "opd_loss", "kl", "entropy", "gate_mean", "gap_action_delta_mean",
                    "gap_rest_delta_mean", "grad_norm",
                    "skill_parse_rate", "time_rollout_s"],
          "eval": sorted(final_eval)})
    hosts.print0(metrics_lib.write_summary(self.workdir, summary))
    return summary

  def close(self) -> None:
    """Stops the env workers, waits for the pending checkpoint save and closes the
    metrics (run() does it when it ends)."""
    if self._pool is not None:
      self._pool.close()
    self.checkpointer.wait()
    self.metrics.close()


def _has_signal(mini: dict[str, np.ndarray], opd: bool) -> bool:
  """Whether a mini-batch has a response token that some loss term counts (the train
  step's own rule, `losses.signal_tokens`). Without one the step would leave the
  parameters as they are, so it is not run at all."""
  return bool(losses.signal_tokens(mini, opd) > 0)
