"""The paper's models as shapes without weights: exact architectures, no allocation.

Memory planning trusts these shapes, so each one must give the published parameter count,
and transformers must build the very same model from the shipped config.json.
"""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from seed_jax.models import (MODEL_SHAPES, ModelConfig, Transformer, export_hf, load_model,
                             model_config, random_model, shape_config)
from seed_jax.models.shapes import shape_hf_dict

# Parameter totals of the published safetensors checkpoints (a tied head counts once).
PUBLISHED_PARAMETERS = {
    "qwen2.5-1.5b-instruct": 1_543_714_304,
    "qwen2.5-3b-instruct": 3_085_938_688,
    "qwen2.5-7b-instruct": 7_615_616_512,
    "qwen3-8b": 8_190_735_360,
    "llama-3.1-8b-instruct": 8_030_261_248,
}

# (vocab, hidden, intermediate, layers, heads, kv heads, head_dim, tied head, context)
ARCHITECTURES = {
    "qwen2.5-1.5b-instruct": (151936, 1536, 8960, 28, 12, 2, 128, True, 32768),
    "qwen2.5-3b-instruct": (151936, 2048, 11008, 36, 16, 2, 128, True, 32768),
    "qwen2.5-7b-instruct": (152064, 3584, 18944, 28, 28, 4, 128, False, 32768),
    "qwen3-8b": (151936, 4096, 12288, 36, 32, 8, 128, False, 40960),
    "llama-3.1-8b-instruct": (128256, 4096, 14336, 32, 32, 8, 128, False, 131072),
}


def abstract_parameter_count(cfg: ModelConfig) -> int:
  """Parameters of the model `cfg` describes, from shapes only (nothing is allocated)."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
  return sum(leaf.size for leaf in leaves)


def test_the_papers_models_are_shapes():
  assert set(PUBLISHED_PARAMETERS) <= set(MODEL_SHAPES)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_parameter_count_matches_the_published_checkpoint(name):
  assert abstract_parameter_count(shape_config(name)) == PUBLISHED_PARAMETERS[name]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_shape_holds_the_published_architecture(name):
  cfg = shape_config(name)
  assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers,
          cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings,
          cfg.max_position_embeddings) == ARCHITECTURES[name]


def test_family_flags_and_rope():
  qwen25, qwen3, llama = (shape_config(n) for n in
                          ("qwen2.5-7b-instruct", "qwen3-8b", "llama-3.1-8b-instruct"))
  assert (qwen25.model_type, qwen25.qkv_bias, qwen25.qk_norm) == ("qwen2", True, False)
  assert (qwen3.model_type, qwen3.qkv_bias, qwen3.qk_norm) == ("qwen3", False, True)
  assert (qwen25.rope_theta, qwen25.rope_scaling, qwen25.rms_norm_eps) == (1e6, None, 1e-6)
  assert (llama.rope_theta, llama.rms_norm_eps) == (500000.0, 1e-5)
  assert llama.rope_scaling_dict == {"rope_type": "llama3", "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192}
  assert (llama.bos_token_id, llama.eos_token_ids) == (128000, (128001, 128008, 128009))
  assert (qwen3.bos_token_id, qwen3.eos_token_ids) == (151643, (151645,))


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_transformers_builds_the_same_model_from_the_shipped_config(name):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_config = transformers.AutoConfig.for_model(**shape_hf_dict(name))
  with torch.device("meta"):  # shapes only, like nnx.eval_shape
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
  assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS[name]


def test_overrides_replace_fields():
  cfg = shape_config("qwen2.5-7b-instruct", num_layers=2, dtype="bfloat16")
  assert (cfg.num_layers, cfg.dtype, cfg.hidden_size) == (2, "bfloat16", 3584)


def test_model_config_of_a_shape_and_of_a_folder(tmp_path):
  assert model_config("qwen3-8b", dtype="bfloat16") == shape_config("qwen3-8b",
                                                                     dtype="bfloat16")
  cfg = ModelConfig.tiny(tie_word_embeddings=False)
  export_hf(random_model(cfg), tmp_path / "tiny")
  assert model_config(str(tmp_path / "tiny")) == cfg


@pytest.mark.slow
def test_model_config_of_the_embedded_model_and_of_a_gguf_file():
  from seed_jax.models.embedded import embedded_gguf_path, embedded_model_dir
  expected = ModelConfig.from_hf_file(embedded_model_dir())
  assert model_config("smollm2-135m-instruct") == expected
  assert model_config(embedded_gguf_path()) == expected


def test_loading_a_shape_says_it_has_no_weights():
  with pytest.raises(FileNotFoundError, match=r"'qwen2.5-7b-instruct' is a shape without "
                     r"weights .* config.model.name at a local Hugging Face folder"):
    load_model("qwen2.5-7b-instruct")


@pytest.mark.parametrize("lookup", [load_model, model_config])
def test_unknown_names_list_every_known_one(lookup):
  with pytest.raises(FileNotFoundError) as error:
    lookup("qwen9-1t")
  for known in ("smollm2-135m-instruct", *PUBLISHED_PARAMETERS):
    assert known in str(error.value)


def test_unknown_shape_lists_the_shapes():
  with pytest.raises(ValueError, match="known: .*qwen2.5-7b-instruct"):
    shape_config("qwen9-1t")
