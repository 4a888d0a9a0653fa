"""What the model taught itself: one `analysis/iter_N.jsonl` per RL iteration.

Each line is one trajectory of the iteration: which task and group it came from, how it
ended, what the analyzer read (whether its transcript was truncated) and wrote (the raw
answer), the skill parsed from it or why there is none (and, under group hindsight, which
sibling's skill its teacher read instead: `skill_from`), and the OPD gate statistics of
its action tokens (`seed_jax.seed.batch.trajectory_gate_stats`). The public SEED code saves
the same (`save_analysis`), so a user can read the skills next to the episodes they came
from.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from etils import epath

from seed_jax import paths
from seed_jax.seed.analyzer import AnalysisReport
from seed_jax.seed.batch import Trajectory
from seed_jax.seed.episodes_file import episode_record


def analysis_path(workdir: paths.PathLike, iteration: int) -> epath.Path:
  """`workdir/analysis/iter_{iteration}.jsonl` (workdir local or a URI such as gs://)."""
  return paths.run_path(workdir) / "analysis" / f"iter_{iteration}.jsonl"


def analysis_record(iteration: int, traj: Trajectory, report: AnalysisReport | None,
                    gate: dict[str, float] | None) -> dict[str, Any]:
  """One JSON line. Without a report (skills from a fixed library) the analyzer fields are
  null and the skill is the trajectory's."""
  if report is not None:
    skill = report.skill
    summary = report.analysis.summary if report.analysis else None
    error = report.reason or None
  else:
    skill, summary = traj.skill, None
    error = None if traj.skill else "no skill for this task type"
  return {
      **episode_record(iteration, traj),
      "task": traj.task,
      "analyzer_output": report.raw if report is not None else None,
      "attempts": report.attempts if report is not None else 0,
      "summary": summary, "skill": skill, "skill_error": error,
      "skill_from": traj.skill_from,
      "truncated": report.prompt.truncated if report is not None else False,
      "omitted_steps": report.prompt.omitted_steps if report is not None else 0,
      "gate": gate,
  }


def write_analysis_file(workdir: paths.PathLike, iteration: int, trajs: Sequence[Trajectory],
                        reports: Sequence[AnalysisReport] | None = None,
                        gate_stats: Sequence[dict[str, float] | None] | None = None) -> str:
  """Writes `workdir/analysis/iter_{iteration}.jsonl` (one line per trajectory, in order)
  atomically and returns its path. `reports` and `gate_stats` align with `trajs`."""
  if reports is not None and len(reports) != len(trajs):
    raise ValueError(f"{len(reports)} reports for {len(trajs)} trajectories")
  if gate_stats is not None and len(gate_stats) != len(trajs):
    raise ValueError(f"{len(gate_stats)} gate statistics for {len(trajs)} trajectories")
  records = [analysis_record(iteration, traj, reports[i] if reports is not None else None,
                             gate_stats[i] if gate_stats is not None else None)
             for i, traj in enumerate(trajs)]
  text = "".join(json.dumps(record) + "\n" for record in records)
  return os.fspath(paths.write_text(analysis_path(workdir, iteration), text))
