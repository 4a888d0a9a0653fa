"""Turn rows that show an image: the batch carries each row's patches and multimodal
positions, the train step encodes each image once for the student and teacher rows, and
scores the response tokens as the model reads the whole prompt with its image."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig
from seed_jax.models.config import VisionConfig
from seed_jax.models.vision import ImageProcessorConfig, preprocess_images
from seed_jax.models.vision_language import ImageInputs, VisionLanguageModel
from seed_jax.seed import batch as batch_lib
from seed_jax.seed import losses
from seed_jax.seed import train_step as ts
from tests.seed.steps import assert_sharded_step_equals_single_device

RESP = 6
IMAGE = 250  # the tiny model's image placeholder id
LOSS = losses.LossConfig(lambda_opd=0.5, kl_coef=0.1)
PROCESSOR = ImageProcessorConfig.from_dict({"min_pixels": 28 * 28 * 4,
                                            "max_pixels": 28 * 28 * 16})
IMAGE_TOKENS = 4  # a 56 x 56 image: 4 x 4 patches, 2 x 2 merged tokens


@pytest.fixture(scope="module")
def model():
  cfg = ModelConfig.tiny(model_type="qwen2_5_vl", vision=VisionConfig.tiny(out_hidden_size=64),
                         image_token_id=IMAGE, mrope_section=(2, 3, 3))
  return VisionLanguageModel(cfg, rngs=nnx.Rngs(0))


def _image(rng) -> ImageInputs:
  return ImageInputs(*preprocess_images(
      [rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)], PROCESSOR))


def _trajectories(seed=0, num=4):
  """Two steps each; a prompt is `text, image tokens, text`; the teacher prompt adds a
  skill before the image, as H does in the text part."""
  rng = np.random.default_rng(seed)
  text = lambda n: rng.integers(3, 240, size=n).tolist()
  trajs = []
  for n in range(num):
    steps = []
    for _ in range(2):
      prompt = text(rng.integers(1, 4)) + [IMAGE] * IMAGE_TOKENS + text(rng.integers(1, 5))
      response = text(rng.integers(1, RESP + 1))
      skill = n != 3
      steps.append(batch_lib.StepRecord(
          prompt_ids=prompt, response_ids=response,
          sampler_logprobs=rng.normal(-5.5, 0.3, size=len(response)).tolist(),
          action_valid=True, image=_image(rng),
          teacher_prompt_ids=text(3) + prompt if skill else None))
    trajs.append(batch_lib.Trajectory(task_id=f"t{n % 2}", group_id=f"t{n % 2}",
                                      traj_id=str(n), won=n % 2 == 0,
                                      episode_reward=10.0 * (n % 2 == 0), steps=steps))
  return trajs


def _batch(shared=True, rows_multiple=12):
  config = batch_lib.BatchConfig(response_len=RESP, prompt_bucket=4, rows_multiple=rows_multiple,
                                 shared_prompt_len=shared, image_token_id=IMAGE)
  batch, _ = batch_lib.build_batch(_trajectories(), config)
  rng = np.random.default_rng(1)
  for key in ("teacher_logprobs", "ref_logprobs"):
    batch[key] = rng.normal(-5.0, 0.5, size=batch["old_logprobs"].shape).astype(np.float32)
  return batch


def _expected_positions(tokens, mask, grid_hw):
  """`[3, T]` positions of one left-padded row, written out from the M-RoPE rule: text
  counts up on all three axes; an image's tokens sit at (t, row, col) of its merged grid
  after the text before it; text after the image resumes at the image's start + its
  larger side."""
  rows, cols = grid_hw[0] // 2, grid_hw[1] // 2
  out = np.zeros((3, len(tokens)), np.int64)
  position, seen = 0, 0
  for i, (token, real) in enumerate(zip(tokens, mask)):
    if not real:
      continue
    if token == IMAGE:
      out[:, i] = (position, position + seen // cols, position + seen % cols)
      seen += 1
      if seen == rows * cols:
        position += max(rows, cols)
      continue
    out[:, i] = position
    position += 1
  return out


def test_each_row_holds_its_image_patches_and_multimodal_positions():
  trajs = _trajectories()
  batch = _batch(shared=False)
  steps = [s for t in trajs for s in t.steps]
  assert batch["image_patches"].shape == (12, 4, 4, steps[0].image.pixel_values.shape[1])
  for row, step in enumerate(steps):
    np.testing.assert_array_equal(batch["image_patches"][row].reshape(16, -1),
                                  step.image.pixel_values)
    for side in ("student", "teacher"):
      tokens, mask = batch[f"{side}_tokens"][row], batch[f"{side}_mask"][row]
      np.testing.assert_array_equal(batch[f"{side}_positions"][row],
                                    _expected_positions(tokens, mask, (4, 4)))
  assert not batch["image_patches"][len(steps):].any()  # padding rows: no image


def test_steps_with_images_of_different_sizes_are_refused():
  trajs = _trajectories()
  trajs[1].steps[0].image = ImageInputs(*preprocess_images(
      [np.zeros((56, 84, 3), np.uint8)], PROCESSOR))
  with pytest.raises(ValueError, match="one image of one size"):
    batch_lib.build_batch(trajs, batch_lib.BatchConfig(response_len=RESP, image_token_id=IMAGE))


def test_a_prompt_cut_into_its_image_is_refused():
  with pytest.raises(ValueError, match="batch.max_prompt_len"):
    batch_lib.build_batch(_trajectories(), batch_lib.BatchConfig(
        response_len=RESP, prompt_bucket=4, max_prompt_len=4, image_token_id=IMAGE))


def test_a_response_that_holds_the_image_token_is_named_as_such():
  trajs = _trajectories()
  step = trajs[2].steps[1]
  step.response_ids = step.response_ids[:-1] + [IMAGE]
  with pytest.raises(ValueError, match=r"row 5's response holds the image token \(id 250\)"):
    batch_lib.build_batch(trajs, batch_lib.BatchConfig(response_len=RESP, prompt_bucket=4,
                                                       image_token_id=IMAGE))


def _reference_logprobs(model, tokens, mask, patches, resp_len, rows):
  """Each of the first `rows` rows alone through the model's general image path
  (`ImageInputs`: the sampler's), positions from `_expected_positions`, log-softmax in
  numpy."""
  graphdef, params = nnx.split(model)

  @jax.jit
  def logits(params, t, positions, m, pixels):
    one = nnx.merge(graphdef, params)
    return one.unembed(one(t, positions, m, images=ImageInputs(pixels, ((1, 4, 4),))))

  out = []
  for row in range(rows):
    t, m = tokens[row:row + 1], mask[row:row + 1]
    positions = _expected_positions(t[0], m[0], (4, 4))[:, None]
    z = np.asarray(logits(params, t, positions, m, patches[row].reshape(16, -1)),
                   np.float64)[0]
    top = z.max(-1, keepdims=True)
    logp = z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))
    prompt_len = t.shape[1] - resp_len
    out.append(logp[np.arange(prompt_len - 1, t.shape[1] - 1), t[0, prompt_len:]])
  return np.stack(out)


@pytest.mark.parametrize("side", ["student", "teacher"])
def test_scoring_rows_with_images_equals_each_row_read_whole(model, side):
  graphdef, params = nnx.split(model, nnx.Param)
  batch = _batch(shared=False)
  inputs = {**ts.side_inputs(batch, side), "image_patches": batch["image_patches"]}
  got = np.asarray(ts.make_score_fn(graphdef, chunk=4)(params, inputs, RESP))
  rows = 8  # the real rows (4 episodes x 2 steps); the rest pad
  want = _reference_logprobs(model, batch[f"{side}_tokens"], batch[f"{side}_mask"],
                             batch["image_patches"], RESP, rows)
  active = batch["response_mask"][:rows] > 0
  np.testing.assert_allclose(got[:rows][active], want[active], atol=2e-4)


def _loss_and_grads(model, mode, micro_batches=1):
  graphdef, params = nnx.split(model, nnx.Param)
  batch = {k: jnp.asarray(v) for k, v in _batch(shared=mode == "joint").items()}
  cfg = ts.TrainStepConfig(teacher_mode=mode, micro_batches=micro_batches, logprob_chunk=4,
                           loss=LOSS)
  return jax.jit(ts.make_loss_and_grad_fn(graphdef, cfg))(params, batch)


def test_every_teacher_mode_gives_one_loss_and_the_images_get_gradients(model):
  """The teacher at theta scored three ways (in the student's pass, in its own pass, and
  precomputed with the same parameters) is the same teacher; the student's image path is
  differentiated (the tower's weights get a gradient)."""
  graphdef, params = nnx.split(model, nnx.Param)
  batch = _batch()
  inputs = {**ts.side_inputs(batch, "teacher"), "image_patches": batch["image_patches"]}
  precomputed = np.asarray(ts.make_score_fn(graphdef, chunk=4)(params, inputs, RESP))
  want_loss, want_grads, want_sums = _loss_and_grads(model, "joint")
  assert float(want_sums["opd_tokens"]) > 0
  tower = jax.tree.leaves(want_grads["tower"])
  assert any(float(jnp.abs(g).max()) > 0 for g in tower)
  loss, grads, _ = _loss_and_grads(model, "separate", micro_batches=2)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, rtol=1e-4, atol=1e-5)
  cfg = ts.TrainStepConfig(teacher_mode="precomputed", logprob_chunk=4, loss=LOSS)
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  batch["teacher_logprobs"] = jnp.asarray(precomputed)
  loss, grads, _ = jax.jit(ts.make_loss_and_grad_fn(graphdef, cfg))(params, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, rtol=1e-4, atol=1e-5)


def test_a_sharded_step_with_images_equals_the_single_device_one(model, mesh):
  graphdef, params = nnx.split(model, nnx.Param)
  batch = {k: jnp.asarray(v) for k, v in _batch(rows_multiple=8).items()}
  cfg = ts.TrainStepConfig(teacher_mode="separate", micro_batches=2, logprob_chunk=4,
                           loss=LOSS)
  assert_sharded_step_equals_single_device(graphdef, params, batch, cfg, mesh, atol=1e-6)


def test_a_batch_of_images_of_mixed_sizes_is_encoded_image_by_image_in_order(model):
  """The sampler's path: the tower sees each image alone (never a batch's patches as one
  sequence), and the rows come back in the images' order."""
  rng = np.random.default_rng(3)
  shapes = [(56, 56, 3), (56, 84, 3), (56, 56, 3)]
  each = [ImageInputs(*preprocess_images([rng.integers(0, 256, s, dtype=np.uint8)],
                                         PROCESSOR)) for s in shapes]
  batch = ImageInputs(np.concatenate([i.pixel_values for i in each]),
                      tuple(i.grids[0] for i in each))
  want = np.concatenate([np.asarray(model.tower(jnp.asarray(i.pixel_values), i.grids))
                         for i in each])
  np.testing.assert_allclose(np.asarray(model.encode_images(batch)), want, atol=1e-5)


def _all_shapes(jaxpr):
  """Every intermediate's shape in a jaxpr and the jaxprs nested in it (scan, vmap, remat)."""
  for eqn in jaxpr.eqns:
    yield from (tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    for param in eqn.params.values():
      for inner in param if isinstance(param, (list, tuple)) else (param,):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          yield from _all_shapes(inner)


def test_no_image_attends_over_another_images_patches(model):
  """The tower's attention is dense over what it is given: a batch's images encoded as one
  sequence would hold `[H, N, N]` scores over all N patches of the batch (at 128 prompts
  of 324 patches, 41,472 squared). Encoded each alone, no array is N x N."""
  rng = np.random.default_rng(4)
  each = [_image(rng) for _ in range(3)]  # 16 patches each
  batch = ImageInputs(np.concatenate([i.pixel_values for i in each]),
                      tuple(i.grids[0] for i in each))
  total = batch.pixel_values.shape[0]
  tokens = jnp.asarray([[7] + [IMAGE] * IMAGE_TOKENS + [8]] * 3)
  jaxpr = jax.make_jaxpr(lambda t: model.embed(t, batch))(tokens)
  assert not [s for s in _all_shapes(jaxpr.jaxpr) if list(s).count(total) >= 2]
