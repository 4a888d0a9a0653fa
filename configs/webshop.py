"""WebShop on the embedded shop (or the original, see README)."""

from configs import base
from seed_jax.envs import webshop


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = webshop.default_config()
  c.env.name = "webshop"
  c.env.max_steps = 15
  c.rl.mini_batch_size = 64
  c.rl.normalize_std = False  # the public code's WebShop advantages use the mean only
  c.sft.tasks_per_type = 30
  return base.apply_preset(c, preset, cpu=_cpu)


def _cpu(c):
  base.cpu_preset(c)
  c.env.max_steps = 6
