"""A LoRA run end to end with the tiny model: behaviour cloning, the KL reference and RL
on one frozen base with adapters, and the export of both the merged model and a PEFT folder."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from seed_jax.train.trainer import Trainer
from tests.train.conftest import final_params, tiny_spec

pytestmark = pytest.mark.slow


def test_a_lora_run_trains_the_adapters_on_a_frozen_base(tiny_model, tmp_path):
  """Behaviour cloning (the fine-tuning stage 1 uses too), the KL reference and RL all run
  on one base with adapters; only the adapters change, and the export holds the merged
  model and a PEFT folder."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from seed_jax.models import load_model  # pylint: disable=import-outside-toplevel
  from seed_jax.models.lora import split_trainable  # pylint: disable=import-outside-toplevel
  trainer = Trainer(tiny_spec(tiny_model, "grpo", **{"model.lora.rank": 4, "bc.enabled": True}),
                    str(tmp_path))
  trainer.run()
  adapters, base = split_trainable(trainer.state.params)
  loaded = nnx.split(load_model(tiny_model)[0], nnx.Param)[1]
  for got, want in zip(jax.tree.leaves(base), jax.tree.leaves(loaded), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert all(np.asarray(b).any() for p, b in nnx.to_flat_state(adapters) if p[-1] == "lora_b")
  assert len(final_params(str(tmp_path))[1]) == len(jax.tree.leaves(adapters))
  assert os.path.exists(tmp_path / "export" / "model.safetensors")
  assert os.path.exists(tmp_path / "export" / "adapter" / "adapter_model.safetensors")
