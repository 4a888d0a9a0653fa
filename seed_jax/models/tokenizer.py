"""Tokenizers: transformers' fast tokenizer from a local folder, or rebuilt from a GGUF vocab.

Nothing here touches the network: folders are read with `local_files_only`, and a GGUF
tokenizer is rebuilt with the `tokenizers` library (no torch) from the vocabulary, merges
and chat template embedded in the file.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

# GGUF `tokenizer.ggml.pre` -> the regex that splits text before byte-level BPE.
_GPT2_SPLIT = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                 r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {"smollm": ("digits", None), "gpt-2": ("regex", _GPT2_SPLIT),
                   "default": ("regex", _GPT2_SPLIT), "llama-bpe": ("regex", _LLAMA3_SPLIT),
                   "qwen2": ("regex", _QWEN2_SPLIT)}
_GGUF_CONTROL_TOKEN = 3


class Tokenizer:
  """The few operations the project needs, over a transformers fast tokenizer (`.hf`)."""

  def __init__(self, hf_tokenizer, eos_ids: Sequence[int] | None = None):
    self.hf = hf_tokenizer
    ids = list(eos_ids or ())
    if hf_tokenizer.eos_token_id is not None and hf_tokenizer.eos_token_id not in ids:
      ids.append(hf_tokenizer.eos_token_id)
    if not ids:
      raise ValueError("tokenizer defines no end-of-sequence token")
    self.eos_ids: tuple[int, ...] = tuple(ids)
    self.pad_id: int = (hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None
                        else self.eos_ids[0])

  @property
  def vocab_size(self) -> int:
    return len(self.hf)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without adding special tokens (templates carry their own)."""
    return self.hf.encode(text, add_special_tokens=False)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict[str, str]],
                          add_generation_prompt: bool = True) -> str:
    """The chat-formatted prompt text for `messages` ([{"role", "content"}, ...])."""
    if not self.hf.chat_template:
      raise ValueError("this tokenizer has no chat template; use plain prompts")
    return self.hf.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)

  def save(self, folder: str | os.PathLike) -> None:
    self.hf.save_pretrained(os.fspath(folder))


def chat_prompt_ids(tokenizer: Tokenizer, user_message: str, system: str | None = None
                    ) -> list[int]:
  """Token ids of one user turn in the chat template, with the generation prompt: how
  every prompt the policy answers (acting, analysing, fine-tuning) is tokenized. `system`
  (H's `system` placement of a skill) is sent as a system message before it; without one
  the template's own default (if any) applies."""
  messages = [{"role": "user", "content": user_message}]
  if system is not None:
    messages.insert(0, {"role": "system", "content": system})
  return tokenizer.encode(tokenizer.apply_chat_template(messages))


def load_tokenizer(folder: str | os.PathLike, eos_ids: Sequence[int] | None = None
                   ) -> Tokenizer:
  """Loads the tokenizer files of a local HF folder (never the network)."""
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
  folder = os.fspath(folder)
  if not os.path.exists(os.path.join(folder, "tokenizer.json")) and not os.path.exists(
      os.path.join(folder, "tokenizer.model")):
    raise FileNotFoundError(f"{folder}: no tokenizer.json or tokenizer.model")
  return Tokenizer(AutoTokenizer.from_pretrained(folder, local_files_only=True), eos_ids)


def tokenizer_from_gguf(reader, path: str) -> Tokenizer:
  """Rebuilds a byte-level BPE tokenizer (GGUF model "gpt2") from a GGUF file's metadata."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers import decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  from seed_jax.models.gguf_io import gguf_field  # pylint: disable=import-outside-toplevel

  def field(key, default: Any = ...):
    return gguf_field(reader, key, path, default)

  kind = field("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{path}: tokenizer.ggml.model {kind!r} is not supported "
                     f"(only byte-level BPE, 'gpt2')")
  pre = field("tokenizer.ggml.pre", "default")
  if pre not in _PRE_TOKENIZERS:
    raise ValueError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported; "
                     f"supported: {', '.join(_PRE_TOKENIZERS)}")
  tokens = field("tokenizer.ggml.tokens")
  types = field("tokenizer.ggml.token_type", [1] * len(tokens))
  merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
  vocab = {tok: i for i, tok in enumerate(tokens)}
  bpe = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                        byte_fallback=False))
  split_kind, pattern = _PRE_TOKENIZERS[pre]
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                        use_regex=split_kind == "digits")
  if split_kind == "digits":
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), byte_level])
  else:
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
  bpe.decoder = decoders.ByteLevel()
  specials = [tokenizers.AddedToken(tok, special=True, normalized=False)
              for tok, kind_id in zip(tokens, types) if kind_id == _GGUF_CONTROL_TOKEN]
  bpe.add_special_tokens(specials)

  def token(key):
    idx = field(key, None)
    return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

  hf = PreTrainedTokenizerFast(
      tokenizer_object=bpe, bos_token=token("tokenizer.ggml.bos_token_id"),
      eos_token=token("tokenizer.ggml.eos_token_id"),
      pad_token=token("tokenizer.ggml.padding_token_id"),
      unk_token=token("tokenizer.ggml.unknown_token_id"),
      clean_up_tokenization_spaces=False)
  hf.chat_template = field("tokenizer.chat_template", None)
  return Tokenizer(hf)
