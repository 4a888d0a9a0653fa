"""Tiny random Hugging Face checkpoints of each family, written by transformers itself."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    # Llama 3 with its rope scaling (tied embeddings, as SmolLM2).
    "llama3": lambda: transformers.LlamaConfig(
        **TINY, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32}),
    # Qwen2.5: q/k/v bias, separate lm_head.
    "qwen2_untied": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=False,
                                                     rope_theta=1000000.0),
    "qwen2_tied": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=True),
    # Qwen3: q/k RMSNorm and a head_dim that is not hidden / heads.
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=24, tie_word_embeddings=False),
}


def hf_logits(folder, tokens: np.ndarray, attention_mask: np.ndarray | None = None
              ) -> np.ndarray:
  """Logits of transformers' PyTorch model loaded from `folder`, float32 `[B, T, V]`."""
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  model.eval()
  kwargs = {}
  if attention_mask is not None:
    kwargs["attention_mask"] = torch.tensor(attention_mask, dtype=torch.long)
    kwargs["position_ids"] = torch.tensor(
        np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0), dtype=torch.long)
  with torch.no_grad():
    return model(torch.tensor(tokens), **kwargs).logits.float().numpy()


@pytest.fixture(scope="session")
def embedded_dir():
  from seed_jax.models.embedded import embedded_model_dir
  return embedded_model_dir()


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def tiny_hf_folder(request, tmp_path_factory, embedded_dir):
  """(family, folder) of a random tiny checkpoint saved by transformers as safetensors."""
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(FAMILIES[request.param]())
  # Random init leaves biases and norms at trivial values; randomise every tensor so that
  # a swapped or missing one cannot go unnoticed.
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
  folder = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(folder)
  for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f"{embedded_dir}/{name}", folder / name)
  return request.param, str(folder)
