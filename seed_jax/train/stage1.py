"""Before RL: the behaviour-cloning warm start and stage-1 hindsight-skill SFT.

Stage 1 rolls out the base policy on the SFT tasks (K0 each), has the external analyzer
(`openai` or `oracle`) annotate every trajectory, keeps the well-formed annotations and
fine-tunes the policy with NLL on the JSON answer only, so it learns to write skills from
trajectory transcripts. The annotations are written to `workdir/stage1/` (so a resumed
run reuses them) together with the skill library of the `static_library` and
`skill_grpo` baselines.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

from seed_jax.envs.base import Task
from seed_jax.seed.analyzer import build_prompt
from seed_jax.seed.batch import Trajectory
from seed_jax.train.expert import Demonstration, expert_response
from seed_jax.train.rollout import chat_prompt_ids
from seed_jax.train.sft import SFTExample


def tasks_per_type(tasks: Sequence[Task], per_type: int) -> list[Task]:
  """The first `per_type` tasks of each task type, in a stable order."""
  chosen, counts = [], {}
  for task in tasks:
    if counts.get(task.task_type, 0) < per_type:
      counts[task.task_type] = counts.get(task.task_type, 0) + 1
      chosen.append(task)
  return chosen


def bc_examples(tokenizer, demos: Sequence[Demonstration]) -> list[SFTExample]:
  """(acting prompt, expert response) pairs from every expert step: an episode the turn
  limit cut short still shows correct moves."""
  examples = []
  for demo in demos:
    for message, action in zip(demo.messages, demo.actions):
      examples.append(SFTExample(chat_prompt_ids(tokenizer, message),
                                 tokenizer.encode(expert_response(action))))
  return examples


def annotation_record(traj: Trajectory, summary: str, skill: str) -> dict:
  """What stage 1 keeps of an annotated trajectory (JSON-serialisable)."""
  return {"task_id": traj.task_id, "task_type": traj.info.get("task_type", ""),
          "won": traj.won, "analyzer_prompt": build_prompt(traj),
          "answer": json.dumps({"episode_summary": summary, "episode_skill": skill})}


def sft_examples(tokenizer, records: Sequence[dict]) -> list[SFTExample]:
  """(analyzer prompt, JSON answer + end of sequence) pairs; loss on the answer only."""
  eos = tokenizer.eos_ids[0]
  return [SFTExample(chat_prompt_ids(tokenizer, r["analyzer_prompt"]),
                     tokenizer.encode(r["answer"]) + [eos]) for r in records]


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


def save_stage1(folder: str, records: Sequence[dict], library: dict[str, str]) -> None:
  os.makedirs(folder, exist_ok=True)
  tmp = os.path.join(folder, "annotations.jsonl.tmp")
  with open(tmp, "w") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  os.replace(tmp, os.path.join(folder, "annotations.jsonl"))
  with open(os.path.join(folder, "library.json"), "w") as f:
    json.dump(library, f, indent=2)


def load_stage1(folder: str) -> tuple[list[dict], dict[str, str]] | None:
  """The saved annotations and library, or None if stage 1 never finished annotating."""
  path = os.path.join(folder, "annotations.jsonl")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(folder, "library.json")) as f:
    return records, json.load(f)


def load_library_file(path: str) -> dict[str, str]:
  """A user-given skill library: JSON object task_type -> skill (or list of skills)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"config.analyzer.static_library: {path} does not exist")
  with open(path) as f:
    data = json.load(f)
  if not isinstance(data, dict) or not data:
    raise ValueError(f"config.analyzer.static_library: {path} must hold a non-empty JSON "
                     f"object task_type -> skill")
  return {k: (v[0] if isinstance(v, list) else str(v)) for k, v in data.items()}
