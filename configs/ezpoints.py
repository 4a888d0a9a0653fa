"""EZPoints (gym_cards): two cards on a 300 x 300 image, a formula making 12 written one
token a step (the paper's visual setting: Qwen2.5-VL-3B-Instruct, GRPO 86.9 -> SEED 100.0).

  python -m seed_jax.main --config=configs/ezpoints.py \
      --config.model.name=/path/to/Qwen2.5-VL-3B-Instruct     # paper settings
  python -m seed_jax.main --config=configs/ezpoints.py:cpu
      # minutes on 2 cores with tiny-random-qwen2.5-vl: it learns nothing, it proves the path

The policy sees the table and the formula so far, no history; the analyzer reads the
episode as text (the task line names the cards: seed_jax.seed.transcript).
"""

from configs import base
from seed_jax.envs import ezpoints


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = ezpoints.default_config()
  c.env.name = "ezpoints"
  c.model.name = "qwen2.5-vl-3b-instruct"  # a shape: point it at the weights' folder
  c.rollout.max_new_tokens = 512
  c.sft.tasks_per_type = 180  # EZPoints has one task type
  return base.apply_preset(c, preset, cpu=base.visual_cpu_preset)
