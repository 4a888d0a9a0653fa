"""NLL fine-tuning (stage 1 and BC): row layout, golden loss, learning, stage-1 helpers."""

from __future__ import annotations

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seed_jax.models import ModelConfig, random_model
from seed_jax.seed.optim import OptimConfig
from seed_jax.seed.train_step import init_train_state
from seed_jax.train import stage1
from seed_jax.train.sft import (SFTExample, make_nll_eval, make_nll_step, pack_examples,
                                padded_lengths)


def test_rows_are_left_padded_prompts_then_right_padded_targets():
  batch = pack_examples([SFTExample([5, 6, 7], [8, 9]), SFTExample([4], [3, 2, 1])],
                        pad_id=0, max_len=64, bucket=4, rows_multiple=4)
  chex.assert_shape([batch["tokens"], batch["mask"], batch["target_mask"]],
                    [(4, 8), (4, 8), (4, 4)])
  np.testing.assert_array_equal(batch["tokens"][0], [0, 5, 6, 7, 8, 9, 0, 0])
  np.testing.assert_array_equal(batch["mask"][1], [0, 0, 0, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(batch["target_mask"][:2], [[1, 1, 0, 0], [1, 1, 1, 0]])
  assert batch["target_mask"][2:].sum() == 0 and batch["mask"][2:].sum(1).tolist() == [1, 1]


def test_every_batch_of_a_run_can_share_one_shape():
  examples = [SFTExample([5] * 3, [8] * 2), SFTExample([4] * 9, [3] * 5)]
  lengths = padded_lengths(examples, max_len=64, bucket=4)
  assert lengths == (12, 8)
  small = pack_examples(examples[:1], pad_id=0, max_len=64, bucket=4, lengths=lengths)
  chex.assert_shape([small["tokens"], small["mask"], small["target_mask"]],
                    [(1, 20), (1, 20), (1, 8)])
  assert small["mask"][0].tolist() == [0] * 9 + [1] * 5 + [0] * 6


def test_nll_equals_numpy_log_softmax():
  model = random_model(ModelConfig.tiny())
  graphdef, params = nnx.split(model, nnx.Param)
  batch = pack_examples([SFTExample([5, 6, 7], [8, 9]), SFTExample([4, 10], [3, 2, 1])],
                        pad_id=0, max_len=64, bucket=4)
  total, count = make_nll_eval(graphdef)(params, batch)
  chex.assert_shape([total, count], ())  # sums over the batch, not per row
  tokens, mask = batch["tokens"], batch["mask"]
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  logits = np.asarray(model.unembed(model(jnp.asarray(tokens), jnp.asarray(positions),
                                          jnp.asarray(mask))), np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  p = tokens.shape[1] - batch["target_mask"].shape[1]
  expected = 0.0
  for b in range(2):
    for r in range(batch["target_mask"].shape[1]):
      if batch["target_mask"][b, r]:
        expected -= logp[b, p + r - 1, tokens[b, p + r]]
  assert count == 5
  np.testing.assert_allclose(float(total), expected, rtol=1e-5)


def test_fine_tuning_lowers_the_nll_of_its_data():
  model = random_model(ModelConfig.tiny())
  graphdef, params = nnx.split(model, nnx.Param)
  optim_cfg = OptimConfig(learning_rate=3e-3, weight_decay=0.0)
  state = init_train_state(params, optim_cfg)
  step = make_nll_step(graphdef, optim_cfg)
  batch = pack_examples([SFTExample([5, 6, 7], [8, 9, 10, 11])], pad_id=0, max_len=32, bucket=4)
  first = None
  for _ in range(20):
    state, metrics = step(state, batch)
    first = float(metrics["nll"]) if first is None else first
  assert float(metrics["nll"]) < 0.5 * first and int(state.step) == 20


def test_stage1_library_prefers_successful_episodes_and_holdout_is_seeded():
  records = [{"task_type": "pick", "won": False, "answer": json.dumps(
                  {"episode_summary": "s", "episode_skill": "avoid doing the wrong thing"})},
             {"task_type": "pick", "won": True, "answer": json.dumps(
                  {"episode_summary": "s", "episode_skill": "take the object then place it"})}]
  assert stage1.skill_library(records) == {"pick": "take the object then place it"}
  train, held = stage1.split_holdout(list(range(20)), 0.1, seed=3)
  assert len(held) == 2 and sorted(train + held) == list(range(20))
  assert stage1.split_holdout(list(range(20)), 0.1, seed=3) == (train, held)


def test_batches_chain_the_epochs_so_only_the_last_is_short():
  from seed_jax.train.sft import iterate_batches
  examples = [SFTExample([i], [i]) for i in range(5)]
  batches = iterate_batches(examples, 4, epochs=2, seed=0)
  assert [len(b) for b in batches] == [4, 4, 2]
  seen = [e.prompt_ids[0] for b in batches for e in b]
  assert sorted(seen[:5]) == sorted(seen[5:]) == list(range(5))  # each epoch sees all
  assert batches == iterate_batches(examples, 4, epochs=2, seed=0)
