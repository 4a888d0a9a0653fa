"""Does the skill-conditioned teacher know more than the plain student? Measured.

SEED's signal is the shift `delta = lp_skill - lp` on the policy's own tokens; where the
teacher (the policy reading a skill through H) is no better informed than the student,
OPD is a uniform pull and SEED is GRPO plus noise. On a split's tasks this module compares
the policy acting from the plain prompt (`plain`) with the policy reading a skill from each
source:

* `oracle`: the env expert's plan for that task, written as the oracle analyzer writes it;
* `policy`: what the policy analyzer (the policy itself) writes about its own plain
  episode of the task (a task whose analysis does not parse acts plain; counted); under
  `analyzer.group_hindsight`, where that episode failed and one of `rl.group_size - 1`
  more plain episodes of the task won, what it writes about the won one;
* `wrong`: another task's oracle skill (a control: content the teacher must not use);
* `empty`: the skill block with no skill (a control: the block's own effect).

Figures per source (`measure`):
* acting gap: success and invalid-action rate acting with the skill, same tasks and seeds;
* decision gap: at every step of the expert's episode, the probability the policy gives
  the expert's action among the admissible ones (each candidate's whole response
  `fmt.render_response(a)` scored, normalised over the candidates: the choice itself,
  whatever reasoning precedes the action tag), and the share of steps where the skill
  raised it over the plain prompt;
* token gap: delta on the plain episodes' sampled tokens, both sides scored now by the
  same parameters, on the action span, on the rest and on the decision (where the
  response first names its action) (`seed_jax.seed.token_gap`);
* `content_score`: oracle's minus wrong's decision probability: above zero only if the
  teacher reads what the skill says;
* `update` (an algorithm with OPD only): whether that knowledge reaches the update, the
  OPD term's share of the gradient on the run's first training iteration
  (`seed_jax.experiments.opd_share`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from seed_jax.agent.loop import Decision, Episode, run_episodes
from seed_jax.agent.policies import expert_policy
from seed_jax.agent.prompts import PromptEncoder
from seed_jax.envs.agent_format import shows_images
from seed_jax.experiments import opd_share
from seed_jax.seed import analyzer as analyzer_lib
from seed_jax.seed.batch import build_batch
from seed_jax.seed.continuations import (candidate_probabilities, continuation_logprobs,
                                         make_continuation_fn)
from seed_jax.seed.skills import skill_prompt_ids
from seed_jax.seed.token_gap import gap_summary, response_span_masks
from seed_jax.train.expert import to_demonstration
from seed_jax.train.rollout import play_episodes

SOURCES = ("plain", "oracle", "policy", "wrong", "empty")
SKILL_SOURCES = SOURCES[1:]


@dataclasses.dataclass(frozen=True)
class DecisionPoint:
  """One step of an expert episode: the plain user message, the admissible actions and
  which of them the expert took."""
  task_id: str
  message: str
  candidates: tuple[str, ...]
  expert: int


def _recording_expert(fmt):
  """The env expert, each decision also keeping the admissible actions it chose among."""
  expert = expert_policy(fmt)

  def policy(episodes: list[Episode], turn: int) -> list[Decision]:
    return [dataclasses.replace(d, record=list(e.admissible_actions or []))
            for d, e in zip(expert(episodes, turn), episodes)]
  return policy


def expert_episodes(pool, fmt, tasks, max_turns: int, seed: int):
  """(demonstrations, decision points) of the expert on every task. A step whose expert
  action is not among the listed admissible actions, or which lists fewer than two, is no
  decision point (envs without such lists have none)."""
  episodes = run_episodes(pool, tasks, _recording_expert(fmt), max_turns=max_turns, seed=seed,
                          desc=None)
  points = []
  for episode in episodes:
    for step in episode.steps:
      decision = step.decision
      candidates = tuple(a for a in (decision.record or []) if a != "help")
      if decision.action in candidates and len(candidates) > 1:
        points.append(DecisionPoint(episode.task.task_id, decision.prompt, candidates,
                                    candidates.index(decision.action)))
  return [to_demonstration(e) for e in episodes], points


def oracle_and_control_skills(demos) -> dict[str, dict[str, str | None]]:
  """task_id -> skill for `oracle`, `wrong` (the next task's oracle skill, in order;
  None with a single task) and `empty` (the block without a skill)."""
  oracle = {d.task_id: d.oracle_skill() for d in demos}
  ids = [d.task_id for d in demos]
  wrong = {tid: (oracle[ids[(i + 1) % len(ids)]] if len(ids) > 1 else None)
           for i, tid in enumerate(ids)}
  return {"oracle": oracle, "wrong": wrong, "empty": {tid: "" for tid in ids}}


def prompt_ids(tokenizer, fmt, message: str, skill: str | None, placement: str) -> list[int]:
  """The plain prompt's ids (`skill` None) or H's with the skill (text envs: the decision
  points are scored on text prompts)."""
  return skill_prompt_ids(PromptEncoder(tokenizer), message, skill, fmt.task_line_pattern,
                          placement)[1]


def decision_probabilities(score_fn, params, tokenizer, fmt, points: Sequence[DecisionPoint],
                           skills: dict[str, str | None] | None, placement: str,
                           pad_id: int) -> np.ndarray:
  """`[len(points)]` the probability of the expert's action among each point's candidates,
  under the plain prompt (`skills` None) or with the point's task skill."""
  prompts = [prompt_ids(tokenizer, fmt, p.message,
                        None if skills is None else skills.get(p.task_id), placement)
             for p in points]
  candidates = [[tokenizer.encode(fmt.render_response(a)) for a in p.candidates]
                for p in points]
  sums = continuation_logprobs(score_fn, params, prompts, candidates, pad_id=pad_id)
  return np.array([candidate_probabilities(s)[p.expert] for s, p in zip(sums, points)])


def token_deltas(trainer, trajs, skills_by_source: dict[str, dict[str, str | None]],
                 placement: str) -> dict[str, dict[str, np.ndarray]]:
  """Per skill source, delta = lp(teacher) - lp(student) on the plain episodes' sampled
  tokens, both scored with the current parameters (the student rows once: they do not
  depend on the skill); split into `action` and `rest` tokens and the `decision` tokens
  (where the response first names its action: `decision_char_span`), 1-D arrays."""
  config = dataclasses.replace(trainer.batch_config,
                               rows_multiple=trainer.spec.rl.micro_batch_size)
  params, student, out = trainer.state.params, None, {}
  for source, skills in skills_by_source.items():
    for traj in trajs:
      skill = skills.get(traj.task_id)
      for step in traj.steps:
        step.teacher_prompt_ids = (None if skill is None else skill_prompt_ids(
            trainer.encoder, step.prompt_text, skill, trainer.fmt.task_line_pattern,
            placement, step.image)[1])
    batch, _ = build_batch(trajs, config, with_teacher=True)
    resp_len = batch["response_mask"].shape[1]
    if student is None:
      student = trainer.score_rows(params, batch, "student")
      action, decision = response_span_masks(trajs, resp_len, trainer.tokenizer, len(student))
    teacher = trainer.score_rows(params, batch, "teacher")
    active = (batch["response_mask"] * batch["opd_mask"][:, None]) > 0
    delta = (teacher - student).astype(np.float64)
    out[source] = {"action": delta[active & action], "rest": delta[active & ~action],
                   "decision": delta[active & decision]}
  return out


def policy_skills(trainer, trajs, seed: int
                  ) -> tuple[dict[str, str | None], float, int]:
  """The policy analyzer's skill for each task from its plain episode (the first episode
  of a task that parses), the share of episodes whose analysis parsed, and how many tasks
  read a sibling's skill. Under the run's `analyzer.group_hindsight` the episodes of one
  task form its group: a failed episode reads the skill of a won episode of the same task
  (`analyzer.group_hindsight_sources`)."""
  cfg = dataclasses.replace(trainer.spec.analyzer, backend="policy")
  reports, _ = analyzer_lib.make_analyzer(
      cfg, trainer.policy_generate, tokenizer=trainer.tokenizer,
      max_prompt_tokens=trainer.spec.analyzer_max_prompt_tokens).analyze(trajs, seed=seed)
  own = [r.skill for r in reports]
  sources = analyzer_lib.skill_sources(trajs, own, cfg.group_hindsight,
                                       group_of=lambda traj: traj.task_id)
  skills: dict[str, str | None] = {}
  from_sibling: set[str] = set()
  for i, (traj, k) in enumerate(zip(trajs, sources)):
    if skills.get(traj.task_id) is None:
      skills[traj.task_id] = own[k]
      if k != i:
        from_sibling.add(traj.task_id)
  return skills, sum(s is not None for s in own) / max(len(own), 1), len(from_sibling)


PARTS = ("acting", "decision", "tokens", "update")
DEFAULT_PARTS = PARTS[:3]  # `update` plays a training iteration: asked for by name


def _source_entry(source: str, acting, p_expert, skills, token_gap, beta: float,
                  plain: dict[str, Any] | None) -> dict[str, Any]:
  """One source's figures (None where its part was not measured); `plain` is the plain
  prompt's entry, which the gaps are taken against (None for `plain` itself)."""
  stats = acting.get(source)
  entry: dict[str, Any] = {
      "success": stats["success"] if stats else None,
      "invalid_action_rate": stats["invalid_action_rate"] if stats else None,
      "ineffective_action_rate": stats["ineffective_action_rate"] if stats else None,
      "p_expert": float(p_expert[source].mean()) if source in p_expert else None,
      "skills": 0 if skills is None else sum(s is not None for s in skills.values())}
  if plain is None:
    return entry
  if stats:
    entry["acting_gap"] = entry["success"] - plain["success"]
  if entry["p_expert"] is not None:
    entry["decision_gap"] = entry["p_expert"] - plain["p_expert"]
    entry["raised"] = float(np.mean(p_expert[source] > p_expert["plain"]))
  if source in token_gap:
    deltas = token_gap[source]
    entry["token_gap"] = {k: v for part in ("action", "rest", "decision")
                          for k, v in gap_summary(deltas[part], beta, f"{part}_").items()}
  return entry


def measure(trainer, split: str, episodes: int = 0, seed: int = 0,
            placement: str | None = None, parts: Sequence[str] = DEFAULT_PARTS,
            log=print) -> dict[str, Any]:
  """The figures of the module docstring for the first `episodes` tasks of `split` (0: all).

  Args:
    trainer: a `seed_jax.train.trainer.Trainer` holding the policy to measure (its pool,
      sampler, scorer and analyzer decoding are used; nothing is trained).
    placement: where H puts the skill (default: the run's `skill_placement`).
    parts: which of `PARTS` to measure. `acting` plays every source; `decision` scores
      the expert's steps; `tokens` scores the plain episodes' tokens. The `policy` source
      needs the plain episodes (played when `acting` or `tokens` is asked for). `update`
      plays the run's first training iteration and splits its gradients (`opd_share`).
  Returns:
    a JSON-serialisable dict: one object per source (`plain`, `oracle`, `policy`,
    `wrong`, `empty`) with at least `success` and `p_expert` (None where not measured),
    and `content_score`.
  """
  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    raise ValueError(f"unknown parts {unknown}; choose among {PARTS}")
  spec, fmt, tokenizer = trainer.spec, trainer.fmt, trainer.tokenizer
  if "decision" in parts and shows_images(fmt):
    raise ValueError(f"--parts=decision scores text prompts; env {spec.env.name!r} shows "
                     f"images: measure acting,tokens")
  placement = placement or spec.skill_placement
  tasks = trainer.tasks(split)
  tasks = tasks[:episodes] if episodes else tasks
  if not tasks:
    raise ValueError(f"split {split!r} has no tasks")
  clock = time.perf_counter()
  seconds: dict[str, float] = {}

  def lap(name: str) -> None:
    nonlocal clock
    now = time.perf_counter()
    seconds[name] = seconds.get(name, 0.0) + now - clock
    clock = now

  demos, points = expert_episodes(trainer.pool(), fmt, tasks, spec.env.max_steps, seed)
  skills = {"plain": None, **oracle_and_control_skills(demos)}
  lap("expert")
  log(f"[teacher_gap] {len(tasks)} {split} tasks, {len(points)} decision points")

  def act(task_skills):
    return play_episodes(trainer.sampler, trainer.encoder, trainer.pool(), fmt, tasks, 1,
                         spec.eval.rollout, seed=seed, group_prefix=f"gap-{split}:",
                         task_skills=task_skills, skill_placement=placement, desc=None)

  acting: dict[str, dict[str, float]] = {}
  plain_trajs, parse_rate, from_sibling = None, None, None
  if "acting" in parts or "tokens" in parts:
    log("[teacher_gap] acting plain")
    plain_trajs, acting["plain"] = act(None)
    analysed = plain_trajs
    if spec.analyzer.group_hindsight and spec.rl.group_size > 1:
      # The rest of each task's group, sampled apart from the plain episode (which alone
      # is the plain acting figure and the token gap's episode).
      analysed = plain_trajs + play_episodes(
          trainer.sampler, trainer.encoder, trainer.pool(), fmt, tasks, spec.rl.group_size - 1,
          spec.eval.rollout, seed=seed + 1, group_prefix=f"gap-{split}-siblings:",
          desc=None)[0]
    lap("acting")
    skills["policy"], parse_rate, from_sibling = policy_skills(trainer, analysed, seed)
    lap("analysis")
  sources = [s for s in SOURCES if skills.get(s) is not None or s == "plain"]
  if "acting" in parts:
    for source in sources[1:]:
      log(f"[teacher_gap] acting with the {source} skill")
      acting[source] = act({t: s for t, s in skills[source].items() if s is not None})[1]
    lap("acting")
  p_expert: dict[str, np.ndarray] = {}
  if "decision" in parts and points:
    score_fn = make_continuation_fn(trainer.graphdef, trainer.mesh,
                                    spec.train_step.logprob_chunk)
    for source in sources:
      log(f"[teacher_gap] decision probabilities, {source}")
      p_expert[source] = decision_probabilities(score_fn, trainer.state.params, tokenizer,
                                                fmt, points, skills[source], placement,
                                                tokenizer.pad_id)
    lap("decisions")
  token_gap = {}
  if "tokens" in parts:
    log("[teacher_gap] token gap on the plain episodes' tokens")
    token_gap = token_deltas(trainer, plain_trajs, {s: skills[s] for s in sources[1:]},
                             placement)
    lap("token_gap")
  update = None
  if "update" in parts:
    log("[teacher_gap] the OPD term's share of the first iteration's gradient")
    update = opd_share.measure(trainer)
    lap("update")
  beta = spec.train_step.loss.beta_opd
  result: dict[str, Any] = {"plain": _source_entry("plain", acting, p_expert, None,
                                                   token_gap, beta, None)}
  for source in SKILL_SOURCES:
    result[source] = _source_entry(source, acting, p_expert, skills.get(source), token_gap,
                                   beta, result["plain"])
  result["policy"].update(parse_rate=parse_rate, from_sibling=from_sibling,
                          group_hindsight=bool(spec.analyzer.group_hindsight))
  oracle, wrong = result["oracle"]["p_expert"], result["wrong"]["p_expert"]
  result["content_score"] = None if oracle is None or wrong is None else oracle - wrong
  result.update(update=update, split=split, tasks=len(tasks), decision_points=len(points),
                placement=placement, beta_opd=beta, parts=list(parts), seconds=seconds)
  return result


def _cell(value, fmt: str = "{:.3f}", signed: bool = False) -> str:
  if value is None:
    return "-"
  return ("{:+.3f}" if signed else fmt).format(value)


def format_table(result: dict[str, Any]) -> str:
  """The figures as one Markdown table (a row per source), with the content score."""
  head = ("| source | skills | success | acting gap | invalid | p(expert) | decision gap | "
          "raised | delta action (q10/q50/q90) | delta rest | gate>0.6 | gate<0.4 |")
  lines = [f"Teacher gap on {result['tasks']} {result['split']} tasks "
           f"({result['decision_points']} decision points; skill placement "
           f"{result['placement']}, beta {result['beta_opd']})", "", head,
           "|" + "---|" * 12]
  for source in SOURCES:
    e = result[source]
    gap = e.get("token_gap", {})
    action = (f"{_cell(gap.get('action_delta_mean'), signed=True)} "
              f"({_cell(gap.get('action_delta_q10'), '{:.2f}')}/"
              f"{_cell(gap.get('action_delta_q50'), '{:.2f}')}/"
              f"{_cell(gap.get('action_delta_q90'), '{:.2f}')})" if gap.get("action_tokens")
              else "-")
    lines.append(
        f"| {source} | {e['skills']} | {_cell(e['success'])} | "
        f"{_cell(e.get('acting_gap'), signed=True)} | {_cell(e['invalid_action_rate'])} | "
        f"{_cell(e['p_expert'])} | {_cell(e.get('decision_gap'), signed=True)} | "
        f"{_cell(e.get('raised'), '{:.0%}')} | {action} | "
        f"{_cell(gap.get('rest_delta_mean'), signed=True) if gap.get('rest_tokens') else '-'} | "
        f"{_cell(gap.get('action_gate_above_0.6'), '{:.0%}')} | "
        f"{_cell(gap.get('action_gate_below_0.4'), '{:.0%}')} |")
  lines += ["", f"content score (oracle minus wrong p(expert)): "
            f"{_cell(result['content_score'], signed=True)}; policy skills parsed: "
            f"{_cell(result['policy']['parse_rate'], '{:.0%}')}"]
  policy = result["policy"]
  if policy.get("group_hindsight") and policy.get("from_sibling") is not None:
    lines[-1] += (f"; group hindsight: {policy['from_sibling']} of {result['tasks']} tasks "
                  f"read a won sibling's skill")
  update = result.get("update")
  if update and update.get("mini_batches"):
    lines += ["", f"OPD term's share of the first training iteration's gradient "
              f"(lambda_opd {update['lambda_opd']}, {update['mini_batches']} mini-batches, "
              f"{update['opd_only']} of them OPD alone): |G_opd| / |G_outcome| "
              f"{_cell(update['opd_share'], '{:.4f}')} (|G_opd| "
              f"{_cell(update['opd_norm'], '{:.4g}')}, |G_outcome| "
              f"{_cell(update['outcome_norm'], '{:.4g}')}), cosine "
              f"{_cell(update['cosine'], signed=True)}; at lambda_opd 1 |G_opd| would be "
              f"{_cell(update['opd_norm_per_lambda'], '{:.4g}')}"]
    if update.get("decision_share") is not None:
      lines += [f"Where OPD pulls: the decision tokens ("
                f"{_cell(update['decision_token_share'], '{:.1%}')} of its tokens) carry "
                f"|G_decision| / |G_opd| {_cell(update['decision_share'], '{:.3f}')} "
                f"(|G_decision| {_cell(update['opd_decision_norm'], '{:.4g}')}, the other "
                f"tokens' {_cell(update['opd_rest_norm'], '{:.4g}')})"]
  return "\n".join(lines)
