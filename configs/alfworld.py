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
  # Few generated games, so that the first run generates and checks them in about a minute;
  # a turn limit the expert meets on most pick / look / clean games.
  c.env.num_games = {"train": 12, "valid_seen": 6, "valid_unseen": 6}
  c.env.max_steps = 8
  c.env.history_length = 1
