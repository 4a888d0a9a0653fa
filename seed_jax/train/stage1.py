"""Before RL: the behaviour-cloning warm start and stage-1 hindsight-skill SFT.

Stage 1 rolls out the base policy on the SFT tasks (K0 each), has the external analyzer
(`openai` or `oracle`) annotate every trajectory, keeps the well-formed annotations and
fine-tunes the policy with NLL on the JSON answer only, so it learns to write skills from
trajectory transcripts. The analyzer's prompt comes from the one builder of
`seed_jax.seed.transcript`, with the same token budget (`analyzer.max_prompt_tokens`) the
policy analyzer decodes from at RL time, so stage 1 teaches the format RL uses. The
annotations, each with its transcript (so SFT prompts are rebuilt with the current budget),
are written to `workdir/stage1/` (so a resumed run reuses them) together with the skill
library of the `static_library` and `skill_grpo` baselines.
"""

from __future__ import annotations

import json
import logging
from typing import Sequence

import numpy as np

from seed_jax import paths
from seed_jax.agent.prompts import PromptEncoder
from seed_jax.envs.base import Task
from seed_jax.seed.analyzer import AnalysisReport
from seed_jax.seed.batch import Trajectory
from seed_jax.seed.skills import skill_prompt_ids
from seed_jax.seed.transcript import Transcript, build_analyzer_prompt
from seed_jax.train.expert import Demonstration
from seed_jax.models.tokenizer import chat_prompt_ids
from seed_jax.train.sft import SFTExample, padded_lengths

log = logging.getLogger(__name__)


def tasks_per_type(tasks: Sequence[Task], per_type: int) -> list[Task]:
  """The first `per_type` tasks of each task type, in a stable order."""
  chosen, counts = [], {}
  for task in tasks:
    if counts.get(task.task_type, 0) < per_type:
      counts[task.task_type] = counts.get(task.task_type, 0) + 1
      chosen.append(task)
  return chosen


def bc_examples(tokenizer, demos: Sequence[Demonstration], *, skill_fraction: float = 0.0,
                task_line_pattern: str = "", placement: str = "task_line", seed: int = 0
                ) -> list[SFTExample]:
  """(acting prompt, expert response) pairs from every expert step: an episode the turn
  limit cut short still shows correct moves.

  A skill-reading warm start (`bc.skill_fraction` > 0): a seeded choice of that share of
  the steps is added again with the game's oracle skill placed by H
  (`task_line_pattern`, `placement`), after the plain examples, so the policy learns to act
  on a skill in its prompt instead of learning that the block is off-distribution.
  """
  pairs = [(demo, message, response) for demo in demos
           for message, response in demo.cloning_pairs()]
  examples = [SFTExample(chat_prompt_ids(tokenizer, message), tokenizer.encode(response))
              for _, message, response in pairs]
  chosen = np.random.default_rng(seed).permutation(len(pairs))[
      :round(skill_fraction * len(pairs))]
  for index in sorted(chosen):
    demo, message, response = pairs[index]
    ids = skill_prompt_ids(PromptEncoder(tokenizer), message, demo.oracle_skill(),
                           task_line_pattern, placement)[1]
    examples.append(SFTExample(ids, tokenizer.encode(response)))
  return examples


def annotation_record(traj: Trajectory, report: AnalysisReport) -> dict:
  """What stage 1 keeps of a well-annotated trajectory (JSON-serialisable): the transcript,
  the prompt the external analyzer read, and its answer (the SFT target)."""
  if report.analysis is None:
    raise ValueError(f"trajectory {traj.traj_id} has no valid analysis to keep")
  return {"task_id": traj.task_id, "task_type": traj.info.get("task_type", ""),
          "won": traj.won, "transcript": Transcript.of(traj).to_record(),
          "analyzer_prompt": report.prompt.text, "truncated": report.prompt.truncated,
          "answer": json.dumps({"episode_summary": report.analysis.summary,
                                "episode_skill": report.analysis.skill})}


def annotation_records(trajs: Sequence[Trajectory], reports: Sequence[AnalysisReport]
                       ) -> list[dict]:
  """The records of the trajectories whose analysis is well-formed (the rest are dropped)."""
  return [annotation_record(t, r) for t, r in zip(trajs, reports) if r.analysis is not None]


def sft_examples(tokenizer, records: Sequence[dict], max_prompt_tokens: int,
                 answer_prefix: str = "") -> list[SFTExample]:
  """(analyzer prompt, JSON answer + end of sequence) pairs; loss on the answer only.

  The prompt is rebuilt from the stored transcript by the analyzer's builder with the
  analyzer's budget: the very ids the policy analyzer decodes from at RL time. (The SFT
  rows must hold them whole: `check_rows_hold_prompts`.) With `answer_prefix`
  (`analyzer.answer_prefix`), an answer that starts with it is split as the policy
  analyzer decodes: the prefix's ids follow the prompt, the target is the rest.
  """
  eos = tokenizer.eos_ids[0]
  prefix_ids = tokenizer.encode(answer_prefix) if answer_prefix else []
  examples = []
  for record in records:
    prompt = build_analyzer_prompt(Transcript.from_record(record["transcript"]), tokenizer,
                                   max_prompt_tokens).ids
    answer = record["answer"]
    if answer_prefix and answer.startswith(answer_prefix):
      prompt, answer = list(prompt) + prefix_ids, answer[len(answer_prefix):]
    examples.append(SFTExample(prompt, tokenizer.encode(answer) + [eos]))
  return examples


def answers_over_budget(examples: Sequence[SFTExample], max_new_tokens: int) -> int:
  """How many stage-1 targets (answer + end of sequence) the policy analyzer could not
  finish within `max_new_tokens` (`analyzer.max_new_tokens`): what it is taught to write
  would be cut before its JSON closes, and never parse."""
  return sum(len(e.target_ids) > max_new_tokens for e in examples)


def check_rows_hold_prompts(examples: Sequence[SFTExample], max_tokens: int) -> None:
  """Raises when SFT rows of `max_tokens` (`sft.max_tokens`) would cut an analyzer prompt:
  a cut prompt loses its head (the task and outcome lines), the bug this stage avoids."""
  if not examples:
    return
  prompt_len, answer_len = padded_lengths(examples, max_len=max_tokens)
  longest = max(len(e.prompt_ids) for e in examples)
  if longest > prompt_len:
    raise ValueError(
        f"sft.max_tokens={max_tokens} leaves {prompt_len} tokens for analyzer prompts of up "
        f"to {longest} (analyzer.max_prompt_tokens) beside {answer_len} for the answers: "
        f"raise sft.max_tokens to at least {longest + answer_len}")


def skill_library(records: Sequence[dict]) -> dict[str, str]:
  """task_type -> one skill: from a successful episode when there is one."""
  library: dict[str, str] = {}
  for record in sorted(records, key=lambda r: not r["won"]):
    library.setdefault(record["task_type"], json.loads(record["answer"])["episode_skill"])
  return library


def split_holdout(examples: list, fraction: float, seed: int) -> tuple[list, list]:
  """(train, held out): a seeded shuffle; the held-out part is empty for tiny sets."""
  order = np.random.default_rng(seed).permutation(len(examples))
  held = int(len(examples) * fraction)
  return [examples[i] for i in order[held:]], [examples[i] for i in order[:held]]


def save_stage1(folder: paths.PathLike, records: Sequence[dict], library: dict[str, str]
                ) -> None:
  """Writes `folder/library.json` and `folder/annotations.jsonl` (one record a line), the
  annotations last: `load_stage1` takes them as the sign that stage 1 finished annotating."""
  folder = paths.run_path(folder)
  paths.write_text(folder / "library.json", json.dumps(library, indent=2))
  paths.write_text(folder / "annotations.jsonl",
                   "".join(json.dumps(record) + "\n" for record in records))


def load_stage1(folder: paths.PathLike) -> tuple[list[dict], dict[str, str]] | None:
  """The saved annotations and library, or None if stage 1 never finished annotating (or
  annotated in an older format, without transcripts: then it annotates again)."""
  folder = paths.run_path(folder)
  path, library = folder / "annotations.jsonl", folder / "library.json"
  if not path.exists() or not library.exists():
    return None
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  if any("transcript" not in r for r in records):
    log.warning("%s holds annotations without transcripts (an older format); stage 1 "
                "annotates again", path)
    return None
  return records, json.loads(library.read_text())


def load_library_file(path: paths.PathLike) -> dict[str, str]:
  """A user-given skill library (a local file or a URI such as gs://): JSON object
  task_type -> skill (or list of skills)."""
  if not paths.run_path(path).exists():
    raise FileNotFoundError(f"config.analyzer.static_library: {path} does not exist")
  data = json.loads(paths.run_path(path).read_text())
  if not isinstance(data, dict) or not data:
    raise ValueError(f"config.analyzer.static_library: {path} must hold a non-empty JSON "
                     f"object task_type -> skill")
  return {k: (v[0] if isinstance(v, list) else str(v)) for k, v in data.items()}
