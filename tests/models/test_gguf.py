"""GGUF import: names, llama.cpp's Q/K row permutation, quantisation types, the tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from seed_jax.models import load_model
from seed_jax.models.gguf_io import read_gguf, unpermute_rotary_rows
from tests.models.conftest import hf_logits
from tests.models.test_parity import TOL, our_logits, random_batch

gguf = pytest.importorskip("gguf")

_TO_GGUF = {"input_layernorm.weight": "attn_norm.weight",
            "post_attention_layernorm.weight": "ffn_norm.weight",
            "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
            "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight"}


def permute_like_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter (convert_hf_to_gguf.LlamaModel.permute), written independently."""
  return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def write_llama_gguf(folder: str, path: str, qtype=None) -> None:
  """Writes the tiny HF llama checkpoint in `folder` as a GGUF file the way llama.cpp does."""
  from safetensors.numpy import load_file
  import json
  cfg = json.load(open(f"{folder}/config.json"))
  tensors = load_file(f"{folder}/model.safetensors")
  w = gguf.GGUFWriter(path, "llama")
  w.add_block_count(cfg["num_hidden_layers"])
  w.add_context_length(cfg["max_position_embeddings"])
  w.add_embedding_length(cfg["hidden_size"])
  w.add_feed_forward_length(cfg["intermediate_size"])
  w.add_head_count(cfg["num_attention_heads"])
  w.add_head_count_kv(cfg["num_key_value_heads"])
  w.add_rope_freq_base(10000.0)
  w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
  w.add_vocab_size(cfg["vocab_size"])
  for name, value in tensors.items():
    if name == "model.embed_tokens.weight":
      out = "token_embd.weight"
    elif name == "model.norm.weight":
      out = "output_norm.weight"
    else:
      layer, rest = name.split(".")[2], ".".join(name.split(".")[3:])
      out = f"blk.{layer}.{_TO_GGUF[rest]}"
      if rest.startswith("self_attn.q_proj"):
        value = permute_like_llama_cpp(value, cfg["num_attention_heads"])
      if rest.startswith("self_attn.k_proj"):
        value = permute_like_llama_cpp(value, cfg["num_key_value_heads"])
    value = value.astype(np.float32)
    if qtype is not None and value.ndim == 2:
      w.add_tensor(out, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(out, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory, embedded_dir):
  """A tiny random Llama (default rope) saved by transformers."""
  import shutil
  import torch
  import transformers
  from tests.models.conftest import TINY
  torch.manual_seed(1)
  model = transformers.AutoModelForCausalLM.from_config(
      transformers.LlamaConfig(**TINY, tie_word_embeddings=True, rope_theta=10000.0))
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
  folder = tmp_path_factory.mktemp("llama_gguf")
  model.save_pretrained(folder)
  shutil.copy(f"{embedded_dir}/tokenizer.json", folder / "tokenizer.json")
  return str(folder)


def test_unpermute_inverts_llama_cpp_permutation():
  w = np.arange(8 * 64 * 3, dtype=np.float32).reshape(8 * 64 // 8, 3 * 8)
  assert np.array_equal(unpermute_rotary_rows(permute_like_llama_cpp(w, 4), 4), w)


def test_f32_gguf_matches_transformers(llama_folder, tmp_path):
  path = str(tmp_path / "tiny.gguf")
  write_llama_gguf(llama_folder, path)
  cfg, source, _ = read_gguf(path)
  from seed_jax.models.weights import load_params
  model = load_params(cfg, source)
  tokens = random_batch(cfg.vocab_size)
  diff = np.abs(our_logits(model, tokens, np.ones_like(tokens)) - hf_logits(llama_folder, tokens))
  assert diff.max() <= TOL


@pytest.mark.parametrize("qtype", ["Q8_0", "F16"])
def test_quantised_gguf_is_close(llama_folder, tmp_path, qtype):
  from seed_jax.models.weights import load_params
  path = str(tmp_path / f"tiny-{qtype}.gguf")
  write_llama_gguf(llama_folder, path, getattr(gguf.GGMLQuantizationType, qtype))
  cfg, source, _ = read_gguf(path)
  model = load_params(cfg, source)
  tokens = random_batch(cfg.vocab_size)
  ref = hf_logits(llama_folder, tokens)
  diff = np.abs(our_logits(model, tokens, np.ones_like(tokens)) - ref).max()
  assert diff < 0.05 * np.abs(ref).max()


def test_unreadable_quantisation_names_file_and_tensor(llama_folder, tmp_path):
  path = str(tmp_path / "q8_1.gguf")
  w = gguf.GGUFWriter(path, "llama")
  w.add_block_count(1)
  w.add_embedding_length(32)
  w.add_feed_forward_length(32)
  w.add_head_count(2)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_tensor("token_embd.weight", np.zeros((4, 40), np.uint8),
               raw_dtype=gguf.GGMLQuantizationType.Q8_1)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match=r"q8_1\.gguf.*token_embd\.weight.*Q8_1"):
    read_gguf(path)


def test_embedded_gguf_tokenizer_matches_saved_folder(embedded_dir):
  """The tokenizer rebuilt from GGUF metadata (no torch) encodes like the converted one."""
  from seed_jax.models.embedded import embedded_gguf_path
  from seed_jax.models.tokenizer import load_tokenizer, tokenizer_from_gguf
  rebuilt = tokenizer_from_gguf(gguf.GGUFReader(embedded_gguf_path()), "embedded")
  saved = load_tokenizer(embedded_dir)
  text = "Step 12: take apple 3 from countertop 1 <|im_end|> héllo\n  wörld 2024!"
  assert rebuilt.encode(text) == saved.encode(text)
  assert rebuilt.encode("123") == [rebuilt.encode(d)[0] for d in "123"]  # digits split
  assert rebuilt.decode(rebuilt.encode(text)) == text
