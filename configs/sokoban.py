"""Sokoban 6x6 with one box (the paper's visual setting, here with text observations).

  python -m seed_jax.main --config=configs/sokoban.py          # paper settings
  python -m seed_jax.main --config=configs/sokoban.py:cpu      # minutes on 2 cores
  python -m seed_jax.experiment --config=configs/sokoban.py:learn --out=results/sokoban_learn
                                  # the small-scale comparison (issue 26), skill-reading
"""

from configs import base
from seed_jax.envs import sokoban


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = sokoban.default_config()
  c.env.name = "sokoban"
  c.rollout.max_new_tokens = 512
  c.sft.tasks_per_type = 180  # Sokoban has one task type
  return base.apply_preset(c, preset, cpu=_cpu, learn=_learn)


def _cpu(c):
  base.cpu_preset(c)
  c.env.max_steps = 6
  c.env.num_tasks = {"train": 50, "valid_seen": 8, "valid_unseen": 8}
  c.sft.tasks_per_type = 2


def _learn(c):
  """The setting for the small-scale comparison (issue 26): the `:cpu` model and puzzles, a
  warm start that clones 128 training puzzles once with their oracle plan read at the end
  of the message (each step shown plain and with its plan), RL on the other puzzles, and
  groups without a GRPO signal left out of its terms. Small-model aids, every one of them
  off in the paper presets; every arm of a comparison gets them alike.

  The teacher knows more than the student after this warm start (docs/results.md,
  "Teacher gap", Sokoban): on 16 held-out puzzles the oracle plan wins 11 against 2 plain
  and 0 with another puzzle's plan, and raises the expert's move from p 0.31 to 0.997
  (content score +0.80; 96 puzzles: 7 against 1, p 0.29 to 0.63)."""
  _cpu(c)
  c.skill_placement = "end"
  c.bc.episodes = 128
  c.bc.epochs = 1
  c.bc.skill_fraction = 1.0
  c.bc.disjoint = True
  c.rl.skip_zero_advantage_groups = True
  c.rollout.tasks_per_batch = 4  # 4 puzzles x 4 episodes = 16 episodes an iteration
  c.rollout.group_size = 4
  c.rl.iterations = 8
  c.eval.splits = ("valid_unseen",)
  # 128 cloned, 64 more for RL (8 iterations x 4 puzzles = 32 drawn from them).
  c.env.num_tasks = {"train": 192, "valid_seen": 8, "valid_unseen": 16}
  c.eval.max_episodes = 0  # all 16 held-out puzzles, after the warm start and at the end
