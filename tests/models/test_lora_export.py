"""A trained adapter leaves seed_jax in the two forms users take elsewhere: the merged model
as a Hugging Face folder, and the adapter as a PEFT folder that PEFT loads onto the
transformers base model; both give the logits of the unmerged seed_jax model."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import export_hf, load_model
from seed_jax.models.lora import LoraParam, merged_model, with_adapters
from seed_jax.models.weights import export_peft
from seed_jax.parallel.mesh import param_shardings, single_device_mesh
from tests.models.conftest import FAMILIES, hf_logits, torch
from tests.models.test_parity import TOL, our_logits, random_batch

peft = pytest.importorskip("peft")

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory, embedded_dir):
  """(base folder, LoRA model with trained-looking adapters) on a qwen2 family base."""
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  base = transformers.AutoModelForCausalLM.from_config(FAMILIES["qwen2_untied"]())
  folder = tmp_path_factory.mktemp("base")
  base.save_pretrained(folder)
  shutil.copy(f"{embedded_dir}/tokenizer.json", folder / "tokenizer.json")
  model, _ = load_model(str(folder))
  model = with_adapters(model, rank=4, alpha=8.0, targets=TARGETS,
                        shardings_of=lambda s: param_shardings(s, single_device_mesh()))
  for i, (path, value) in enumerate(nnx.to_flat_state(nnx.state(model, LoraParam))):
    value.set_value(value.get_value()
                    + 0.05 * jax.random.normal(jax.random.key(i), value.get_value().shape))
  return str(folder), model


def test_peft_loads_the_adapter_onto_the_transformers_base(trained_adapter, tmp_path):
  base_folder, model = trained_adapter
  out = export_peft(model, tmp_path / "adapter", base_model=base_folder)
  config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (
      4, 8.0, base_folder)
  import transformers  # pylint: disable=import-outside-toplevel
  base = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
  peft_model = peft.PeftModel.from_pretrained(base, out)
  peft_model.eval()
  tokens = random_batch(model.cfg.vocab_size)
  with torch.no_grad():
    want = peft_model(torch.tensor(tokens)).logits.float().numpy()
  ours = our_logits(model, tokens, np.ones_like(tokens))
  assert np.abs(ours - want).max() <= TOL
  assert np.abs(ours - hf_logits(base_folder, tokens)).max() > 100 * TOL  # it did adapt


def test_the_merged_export_is_the_adapted_model(trained_adapter, tmp_path):
  _, model = trained_adapter
  with pytest.raises(ValueError, match="merge the adapters first"):
    export_hf(model, tmp_path / "unmerged")
  folder = export_hf(merged_model(model), tmp_path / "merged")
  tokens = random_batch(model.cfg.vocab_size, seed=1)
  ours = our_logits(model, tokens, np.ones_like(tokens))
  assert np.abs(ours - hf_logits(folder, tokens)).max() <= TOL
