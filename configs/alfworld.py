"""ALFWorld, the paper's headline setting (Qwen2.5 / Qwen3 backbones on TPU).

  python -m seed_jax.main --config=configs/alfworld.py          # paper settings
  python -m seed_jax.main --config=configs/alfworld.py:cpu      # a few minutes on 2 cores
"""

from configs import base
from seed_jax.envs import alfworld


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = alfworld.default_config()
  c.env.name = "alfworld"
  c.rollout.max_new_tokens = 512
  c.rl.invalid_penalty = 0.1
  c.rl.mini_batch_size = 256
  c.rl.kl_coef = 0.01
  return base.apply_preset(c, preset, cpu=_cpu)


def _cpu(c):
  base.cpu_preset(c)
  # A set of short games a 135M model can win after the warm start: the three
  # single-object types, each generated so that the expert wins within 7 steps (its
  # first action is a free "look"), with a turn limit of 8. Few games, so the first run
  # generates and checks them in about half a minute.
  c.env.task_types = ("pick_and_place", "look_at_obj_in_light", "pick_clean_then_place")
  c.env.solvable_within = 7
  c.env.num_games = {"train": 6, "valid_seen": 3, "valid_unseen": 3}
  c.env.max_steps = 8
  c.env.history_length = 1
  c.bc.episodes = 6  # every training game
