"""Search-based QA (Search-R1 protocol) on the embedded corpus or wiki-18 (see README)."""

from configs import base
from seed_jax.envs import search


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = search.default_config()
  c.env.name = "search"
  c.env.max_steps = 4
  c.rollout.group_size = 5
  c.rl.mini_batch_size = 512
  c.rl.kl_coef = 0.001
  c.rl.entropy_coef = 0.0
  c.rl.invalid_penalty = 0.01
  return base.apply_preset(c, preset, cpu=_cpu)


def _cpu(c):
  base.cpu_preset(c)
  c.env.max_steps = 3
