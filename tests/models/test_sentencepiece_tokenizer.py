"""A checkpoint folder whose only tokenizer file is `tokenizer.model` (SentencePiece, as
Llama-2 and Mistral ship it) loads through `load_tokenizer`: transformers converts it with
the `sentencepiece` package, offline, and encodes as SentencePiece itself does."""

from __future__ import annotations

import io
import json

import pytest

spm = pytest.importorskip("sentencepiece")

from seed_jax.models.tokenizer import load_tokenizer  # pylint: disable=wrong-import-position

TEXT = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1.",
    "Your task is to: put a clean mug in the coffee machine.",
    "go to countertop 2\ntake apple 1 from countertop 2\nopen fridge 1",
    "Nothing happens. The quick brown fox jumps over the lazy dog.",
] * 4
UNK, BOS, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def sentencepiece_folder(tmp_path_factory):
  """A folder with a tiny SentencePiece BPE model trained as Llama-2's was (byte fallback,
  no normalisation, digits split) and the tokenizer_config.json such a checkpoint carries."""
  folder = tmp_path_factory.mktemp("sentencepiece")
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXT), model_writer=model, model_type="bpe", vocab_size=320,
      byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
      remove_extra_whitespaces=False, split_digits=True, unk_id=UNK, bos_id=BOS,
      eos_id=EOS, pad_id=-1, minloglevel=2)
  (folder / "tokenizer.model").write_bytes(model.getvalue())
  (folder / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
      "unk_token": "<unk>"}))
  return folder


@pytest.fixture(scope="module")
def tokenizer(sentencepiece_folder):
  assert sorted(p.name for p in sentencepiece_folder.iterdir()) == [
      "tokenizer.model", "tokenizer_config.json"]  # no tokenizer.json to fall back on
  return load_tokenizer(sentencepiece_folder)


@pytest.mark.parametrize("text", [
    "Take the apple to the kitchen.",
    "go to shelf 3\nthen look at the mug",
    "Zebra 42 ü!",  # 'Z' and 'ü' were never seen: byte fallback
])
def test_text_round_trips_with_the_ids_sentencepiece_gives(sentencepiece_folder, tokenizer,
                                                           text):
  reference = spm.SentencePieceProcessor(model_file=str(sentencepiece_folder / "tokenizer.model"))
  ids = tokenizer.encode(text)
  assert ids == reference.encode(text)
  assert tokenizer.decode(ids) == text


def test_end_of_sequence_is_the_models_and_pads_when_there_is_no_pad_piece(tokenizer):
  assert tokenizer.eos_ids == (EOS,)
  assert tokenizer.pad_id == EOS
  assert tokenizer.vocab_size == 320
  assert tokenizer.decode(tokenizer.encode("open fridge 1") + [EOS],
                          skip_special_tokens=True) == "open fridge 1"

