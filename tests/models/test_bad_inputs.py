"""Every bad input is a clear error naming the file and the tensor or key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seed_jax.models import ModelConfig, export_hf, load_model, random_model


@pytest.fixture()
def tiny_folder(tmp_path):
  folder = tmp_path / "tiny"
  export_hf(random_model(ModelConfig.tiny()), folder)
  return folder


def test_missing_model_path():
  with pytest.raises(FileNotFoundError, match="/no/such/model"):
    load_model("/no/such/model")


def test_missing_weights_file(tiny_folder):
  (tiny_folder / "model.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    load_model(str(tiny_folder))


def test_missing_config(tmp_path):
  tmp_path.joinpath("m").mkdir()
  with pytest.raises(FileNotFoundError, match="config.json"):
    ModelConfig.from_hf_file(tmp_path / "m")


def test_unknown_architecture(tiny_folder):
  cfg = json.loads((tiny_folder / "config.json").read_text())
  cfg["model_type"] = "gpt_neox"
  (tiny_folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"config.json: model_type 'gpt_neox' is not supported"):
    ModelConfig.from_hf_file(tiny_folder)


def test_missing_config_key(tiny_folder):
  cfg = json.loads((tiny_folder / "config.json").read_text())
  del cfg["num_hidden_layers"]
  (tiny_folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(KeyError, match="num_hidden_layers"):
    ModelConfig.from_hf_file(tiny_folder)


def test_unsupported_rope_scaling(tiny_folder):
  cfg = json.loads((tiny_folder / "config.json").read_text())
  cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
  (tiny_folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="rope_type 'yarn'"):
    ModelConfig.from_hf_file(tiny_folder)


def _rewrite_tensors(folder, edit):
  from safetensors.numpy import load_file, save_file
  tensors = load_file(str(folder / "model.safetensors"))
  edit(tensors)
  save_file(tensors, str(folder / "model.safetensors"))


def _load_params(folder):
  from seed_jax.models.weights import SafetensorsSource, load_params
  return load_params(ModelConfig.from_hf_file(folder), SafetensorsSource(folder))


def test_missing_tensor_is_named(tiny_folder):
  _rewrite_tensors(tiny_folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(KeyError, match=r"tiny.*'model.layers.1.mlp.up_proj.weight' is missing"):
    _load_params(tiny_folder)


def test_wrong_shape_is_named(tiny_folder):
  def edit(t):
    t["model.norm.weight"] = np.ones((65,), np.float32)
  _rewrite_tensors(tiny_folder, edit)
  with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(65,\), expected \(64,\)"):
    _load_params(tiny_folder)


def test_unexpected_tensor_is_named(tiny_folder):
  def edit(t):
    t["model.layers.0.self_attn.mystery.weight"] = np.ones((2,), np.float32)
  _rewrite_tensors(tiny_folder, edit)
  with pytest.raises(ValueError, match="mystery"):
    _load_params(tiny_folder)


def test_sharded_index_with_missing_shard(tiny_folder):
  (tiny_folder / "model.safetensors.index.json").write_text(
      json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
  with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
    _load_params(tiny_folder)


def test_gguf_file_missing_or_garbage(tmp_path):
  from seed_jax.models.gguf_io import read_gguf
  with pytest.raises(FileNotFoundError, match="nothing.gguf"):
    read_gguf(tmp_path / "nothing.gguf")
  (tmp_path / "garbage.gguf").write_bytes(b"not a gguf file at all")
  with pytest.raises(ValueError, match="garbage.gguf: not a readable GGUF"):
    read_gguf(tmp_path / "garbage.gguf")


def test_unknown_embedded_name_lists_choices():
  with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
    load_model("smollm9-1t")
