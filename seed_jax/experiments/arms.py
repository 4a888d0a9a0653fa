"""The arms of an experiment: what each compared run is, and which warm start it shares.

An arm is an algorithm name (seed_jax/train/algorithms.py: it runs as that algorithm with
the config as given) or one of the named variants below. Every arm of one seed starts RL
from a warm start computed once for that seed (seed_jax/experiments/jobs.py):

| arm              | algorithm      | RL-time overrides       | starts RL from              |
|------------------|----------------|-------------------------|-----------------------------|
| `seed`           | seed           | analyzer.backend=policy | stage 1                     |
| `seed_oracle`    | seed           | analyzer.backend=oracle | stage 1                     |
| `seed_group`     | seed           | analyzer.backend=policy, analyzer.group_hindsight | stage 1 |
| `seed_centered`  | seed           | analyzer.backend=policy, rl.opd_gate_baseline=0.5 | stage 1 |
| `seed_oracle_centered` | seed     | analyzer.backend=oracle, rl.opd_gate_baseline=0.5 | stage 1 |
| `grpo`           | grpo           | -                       | behaviour cloning           |
| `no_sft`         | no_sft         | -                       | behaviour cloning           |
| `no_opd`         | no_opd         | -                       | stage 1                     |
| `static_library` | static_library | -                       | stage 1                     |
| `skill_grpo`     | skill_grpo     | -                       | BC weights, stage-1 library |

`seed` is the paper's self-evolving setting: after stage 1 the policy analyses its own
trajectories into skills. `seed_oracle` takes its skills from the oracle analyzer at RL time
(the env expert's plan written as a skill): an upper bound on skill quality. `seed_group`
is `seed` with group hindsight (not the paper's): a failed trajectory's teacher reads the
skill the policy wrote for a won sibling of its group (seed_jax/seed/analyzer.py). The
`_centered` arms weigh each token's OPD pull by `gate - 0.5` instead of `gate` (not the
paper's; seed_jax/seed/losses.py): the paper's term also pulls up every sampled token by
about 0.5 where the teacher agrees, a policy gradient without a baseline; centred, it moves
a token only by what the teacher prefers beyond the student.

Warm starts: `bc` is behaviour cloning (`bc.*`), the same for every arm; `stage1` is stage 1
(`sft.*`: rollouts of the BC policy, oracle annotations, skill SFT) on top of it, for the
algorithms with stage-1 SFT; `library` is the BC weights with the skill library stage 1
built (Skill-GRPO acts with it and fine-tunes nothing).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seed_jax.train.algorithms import ALGORITHMS, get_algorithm

BC, STAGE1, LIBRARY = "bc", "stage1", "library"

# Keys an arm may not change: they shape the warm-start checkpoint every arm of a seed
# restores (parameters, optimizer, reference model), or are set per run by the experiment.
CHECKPOINT_SHAPING_KEYS = ("model", "mesh", "rl.kl_coef", "rl.weight_decay", "rl.grad_clip",
                           "algorithm", "seed", "init_from", "workdir")


@dataclasses.dataclass(frozen=True)
class Arm:
  """One compared run per seed.

  Attributes:
    name: the arm's name, also its folder under the experiment's `--out`.
    algorithm: `config.algorithm` of its runs.
    overrides: config keys set for its RL (after the shared warm start), as Python values.
    description: one line for the results page.
  """
  name: str
  algorithm: str
  overrides: tuple[tuple[str, Any], ...] = ()
  description: str = ""

  @property
  def warm_start(self) -> str:
    """Which shared warm start the arm's RL begins from (BC, STAGE1 or LIBRARY)."""
    algorithm = get_algorithm(self.algorithm)
    if algorithm.stage1_sft:
      return STAGE1
    if algorithm.skill_source == "library":
      return LIBRARY
    return BC


VARIANTS = {
    "seed": Arm("seed", "seed", (("analyzer.backend", "policy"),),
                "SEED: after stage 1 the policy analyses its own trajectories into skills"),
    "seed_oracle": Arm("seed_oracle", "seed", (("analyzer.backend", "oracle"),),
                       "SEED with the oracle analyzer at RL time (the expert's plan as the "
                       "skill): an upper bound on skill quality"),
    "seed_group": Arm("seed_group", "seed", (("analyzer.backend", "policy"),
                                             ("analyzer.group_hindsight", True)),
                      "SEED with group hindsight: a failed trajectory's teacher reads the "
                      "policy's skill of a won sibling in its group"),
    "seed_centered": Arm("seed_centered", "seed", (("analyzer.backend", "policy"),
                                                   ("rl.opd_gate_baseline", 0.5)),
                         "SEED with the OPD pull centred: each token weighed by gate - 0.5"),
    "seed_oracle_centered": Arm("seed_oracle_centered", "seed",
                                (("analyzer.backend", "oracle"), ("rl.opd_gate_baseline", 0.5)),
                                "SEED with the oracle analyzer and the OPD pull centred "
                                "(gate - 0.5)"),
}

ARM_NAMES = tuple(VARIANTS) + tuple(a for a in ALGORITHMS if a not in VARIANTS)


def get_arm(name: str) -> Arm:
  """The named variant, or the algorithm `name` as configured."""
  if name in VARIANTS:
    return VARIANTS[name]
  if name in ALGORITHMS:
    return Arm(name, name, (), get_algorithm(name).description)
  raise ValueError(f"unknown arm {name!r}; choose among {', '.join(ARM_NAMES)}")


def check_arm_overrides(arm: Arm) -> None:
  """An arm changes what RL does, never what its warm-start checkpoint holds."""
  for key, _ in arm.overrides:
    if any(key == k or key.startswith(k + ".") for k in CHECKPOINT_SHAPING_KEYS):
      raise ValueError(f"arm {arm.name!r}: {key} shapes the shared warm-start checkpoint")
