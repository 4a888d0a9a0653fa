"""What the policy played: one `episodes/iter_N.jsonl` per RL iteration, in every arm.

Each line is one episode of the iteration: its task and GRPO group, whether it was won,
its return, and how many of its steps were invalid or changed nothing. The iteration's
metrics fold these into rates; the file keeps which task each came from, so a run can be
read per task: does a task that recurs in later iterations go better than at its first
draw (`seed_jax.experiments.recurrence`)? That question pairs each task with itself, so
the draw of easier or harder tasks in an iteration does not enter it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from etils import epath

from seed_jax import paths
from seed_jax.seed.batch import Trajectory


def episodes_path(workdir: paths.PathLike, iteration: int) -> epath.Path:
  """`workdir/episodes/iter_{iteration}.jsonl` (workdir local or a URI such as gs://)."""
  return paths.run_path(workdir) / "episodes" / f"iter_{iteration}.jsonl"


def episode_record(iteration: int, traj: Trajectory) -> dict[str, Any]:
  """One episode's outcome as a JSON-able dict (also the head of its analysis record)."""
  return {
      "iteration": iteration, "traj_id": traj.traj_id, "group_id": traj.group_id,
      "task_id": traj.task_id, "task_type": traj.info.get("task_type", ""),
      "won": bool(traj.won), "reward": float(traj.episode_reward),
      "num_steps": len(traj.steps),
      "invalid_steps": sum(not s.action_valid for s in traj.steps),
      "ineffective_steps": sum(s.action_valid and not s.action_effective
                               for s in traj.steps),
  }


def write_episodes_file(workdir: paths.PathLike, iteration: int,
                        trajs: Sequence[Trajectory]) -> str:
  """Writes iteration `iteration`'s episodes (one line each, in order) atomically and
  returns the file's path."""
  text = "".join(json.dumps(episode_record(iteration, traj)) + "\n" for traj in trajs)
  return os.fspath(paths.write_text(episodes_path(workdir, iteration), text))
