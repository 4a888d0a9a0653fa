"""Visual Sokoban 6x6 with one box, the board seen as an image (the paper's visual setting:
Qwen2.5-VL-3B-Instruct, GRPO 67.1 -> SEED 82.0).

  python -m seed_jax.main --config=configs/sokoban_visual.py \
      --config.model.name=/path/to/Qwen2.5-VL-3B-Instruct     # paper settings
  python -m seed_jax.main --config=configs/sokoban_visual.py:cpu
      # minutes on 2 cores with tiny-random-qwen2.5-vl: it learns nothing, it proves the path

The policy sees one image a turn and no history (verl-agent's visual prompt); the analyzer
reads the episode as text (the env's text board at each step: seed_jax.seed.transcript).
"""

from configs import base
from seed_jax.envs import sokoban_visual


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = sokoban_visual.default_config()
  c.env.name = "sokoban_visual"
  # 42 px a cell: a 252 x 252 board, 81 image tokens, what verl-agent's rendering gives
  # (16 px sprites, 96 px upscaled to 256, resized by the processor to 252).
  c.env.tile = 42
  c.model.name = "qwen2.5-vl-3b-instruct"  # a shape: point it at the weights' folder
  c.rollout.max_new_tokens = 512
  c.sft.tasks_per_type = 180  # Sokoban has one task type
  return base.apply_preset(c, preset, cpu=_cpu)


def _cpu(c):
  base.visual_cpu_preset(c)
  c.env.tile = 16  # 96 x 96 px: 9 image tokens for the tiny model's processor
