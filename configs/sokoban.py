"""Sokoban 6x6 with one box (the paper's visual setting, here with text observations)."""

from configs import base
from seed_jax.envs import sokoban


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = sokoban.default_config()
  c.env.name = "sokoban"
  c.rollout.max_new_tokens = 512
  c.sft.tasks_per_type = 180  # Sokoban has one task type
  return base.apply_preset(c, preset, cpu=_cpu)


def _cpu(c):
  base.cpu_preset(c)
  c.env.max_steps = 6
  c.env.num_tasks = {"train": 50, "valid_seen": 8, "valid_unseen": 8}
  c.sft.tasks_per_type = 2
