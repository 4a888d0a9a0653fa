"""Shared fixtures of the trainer tests: a tiny random model with the embedded tokenizer's
vocabulary (so the real prompts, chat template and parsing run) and a small Sokoban run."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from seed_jax.train.spec import RunSpec, build_run_spec


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
  from seed_jax.models import ModelConfig, export_hf, random_model
  from seed_jax.models.embedded import embedded_model_dir
  from seed_jax.models.tokenizer import load_tokenizer
  cache = tmp_path_factory.mktemp("xla_cache")
  jax.config.update("jax_compilation_cache_dir", str(cache))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  cfg = ModelConfig.tiny(vocab_size=49152, eos_token_id=2, pad_token_id=2,
                         max_position_embeddings=4096)
  folder = tmp_path_factory.mktemp("tiny") / "model"
  export_hf(random_model(cfg, seed=0), folder, load_tokenizer(embedded_model_dir()))
  yield str(folder)
  jax.config.update("jax_compilation_cache_dir", None)


def tiny_config(model: str, algorithm: str, iterations: int = 1):
  from configs import sokoban
  c = sokoban.get_config("cpu")
  with c.unlocked():
    c.model.name = model
    c.algorithm = algorithm
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    c.rollout.max_new_tokens = 16
    c.rollout.max_prompt_tokens = 512
    c.analyzer.max_new_tokens = 16
    c.analyzer.backend = "policy" if algorithm in ("seed", "no_sft") else "oracle"
    c.rl.iterations = iterations
    c.rl.mini_batch_size = 16
    c.rl.micro_batch_size = 8
    c.rl.kl_coef = 0.01
    c.pool.num_workers = 2
    c.bc.enabled = algorithm == "seed"
    c.bc.episodes = 2
    c.sft.tasks_per_type = 2
    c.eval.splits = ("valid_seen",)
    c.eval.max_episodes = 2
    c.log.plots = algorithm == "seed"
  return c



def tiny_spec(model: str, algorithm: str, iterations: int = 1, **overrides) -> RunSpec:
  """The run spec of `tiny_config` with `overrides` ({"rl.lambda_opd": 0.0, ...})."""
  config = tiny_config(model, algorithm, iterations)
  with config.unlocked():
    for key, value in overrides.items():
      *parents, leaf = key.split(".")
      node = config
      for part in parents:
        node = node[part]
      node[leaf] = value
  return build_run_spec(config)


def final_params(workdir: str) -> tuple[int, list[np.ndarray]]:
  """(the latest checkpoint's step, its saved parameter leaves as numpy arrays)."""
  from seed_jax.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  step = ckpt.latest_step()
  restored = ckpt._manager.restore(step)  # pylint: disable=protected-access
  return step, [np.asarray(x) for x in jax.tree.leaves(restored["state"]["train"]["params"])]
