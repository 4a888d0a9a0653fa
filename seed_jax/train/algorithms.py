"""SEED and its baselines and ablations as configurations of one trainer, not forks.

| algorithm        | stage-1 SFT | skills from                    | skills used as        |
|------------------|-------------|--------------------------------|-----------------------|
| seed (default)   | yes         | theta_old analyzes each batch  | OPD teacher context   |
| grpo             | no          | -                              | -                     |
| skill_grpo       | no          | a fixed library                | the acting prompt     |
| static_library   | yes         | a fixed library                | OPD teacher context   |
| no_sft           | no          | theta_old analyzes each batch  | OPD teacher context   |
| no_opd           | yes         | -                              | -                     |

The fixed library is `analyzer.static_library` (JSON: task_type -> skill) or, when unset,
built from the stage-1 external analyzer's annotations of successful episodes.
"""

from __future__ import annotations

import dataclasses

ALGORITHMS = ("seed", "grpo", "skill_grpo", "static_library", "no_sft", "no_opd")


@dataclasses.dataclass(frozen=True)
class Algorithm:
  name: str
  stage1_sft: bool          # fine-tune the policy to write skills before RL
  skill_source: str | None  # "policy" (on-policy analysis) | "library" | None
  opd: bool                 # skills condition the OPD teacher
  acting_skills: bool       # skills go into the acting prompt (Skill-GRPO)

  @property
  def description(self) -> str:
    """One line saying what the algorithm trains with, read off its fields."""
    warm = "after stage-1 SFT" if self.stage1_sft else "no stage 1"
    if self.skill_source is None:
      return f"GRPO alone, {warm}"
    loss = "GRPO + OPD" if self.opd else "GRPO"
    source = {"policy": "the policy's own analyses", "library": "a fixed library"}[
        self.skill_source]
    used = f"the teacher sees skills from {source}" if self.opd else (
        f"skills from {source} in the acting prompt")
    return f"{loss}, {warm}; {used}"


def get_algorithm(name: str) -> Algorithm:
  table = {
      "seed": Algorithm("seed", True, "policy", True, False),
      "grpo": Algorithm("grpo", False, None, False, False),
      "skill_grpo": Algorithm("skill_grpo", False, "library", False, True),
      "static_library": Algorithm("static_library", True, "library", True, False),
      "no_sft": Algorithm("no_sft", False, "policy", True, False),
      "no_opd": Algorithm("no_opd", True, None, False, False),
  }
  if name not in table:
    raise ValueError(f"algorithm: unknown value {name!r}; choose one of {', '.join(ALGORITHMS)}")
  return table[name]
