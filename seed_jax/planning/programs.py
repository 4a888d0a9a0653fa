"""Every program a run compiles, lowered and compiled for a target's devices with abstract
parameters and batches (nothing allocated): per program, the compiler's bytes per device,
the run's other resident state, and the model FLOPs from the model's shape."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.embedded import EMBEDDED_MODELS
from seed_jax.models.flops import forward_flops, training_flops, vision_forward_flops
from seed_jax.envs.agent_format import shows_images
from seed_jax.envs.registry import get_env_module
from seed_jax.models.loader import resolve_model_path
from seed_jax.models.vision import ImageProcessorConfig
from seed_jax.models.vision.image_processor import smart_resize
from seed_jax.models.vision_language import build_model, encode_each
from seed_jax.parallel.mesh import LogicalMesh, in_mesh, param_shardings
from seed_jax.planning.targets import Target
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed import optim, packing
from seed_jax.seed.train_step import (TrainState, make_score_fn, make_train_step,
                                      new_train_state, train_state_shardings)
from seed_jax.train import sft
from seed_jax.train.spec import RunSpec


# ------------------------------------------------------------------ abstract inputs


def abstract_params(cfg: ModelConfig, mesh: LogicalMesh) -> tuple[nnx.GraphDef, nnx.State]:
  """The model's graphdef and its parameters as `ShapeDtypeStruct`s placed on `mesh` by
  their logical axes: nothing is allocated."""
  model = nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, _place(params, param_shardings(params, mesh))


def _place(shapes, shardings):
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)


def abstract_train_state(params, mesh: LogicalMesh, optim_cfg: optim.OptimConfig
                         ) -> tuple[TrainState, TrainState]:
  """(abstract state, its shardings) for `params` and the optimizer of `optim_cfg`."""
  shapes = jax.eval_shape(lambda p: new_train_state(p, optim_cfg), params)
  shardings = train_state_shardings(params, mesh, optim_cfg)
  return _place(shapes, shardings), shardings


def _rows(mesh: LogicalMesh, arrays: dict[str, tuple[tuple[int, ...], Any]]
          ) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract `[B, ...]` arrays with rows by the mesh's "batch" rule."""
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=mesh.batch_sharding(len(shape)))
          for k, (shape, dtype) in arrays.items()}


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def rl_batch_shapes(spec: RunSpec, mesh: LogicalMesh, cfg: ModelConfig | None = None
                    ) -> dict[str, jax.ShapeDtypeStruct]:
  """The largest mini-batch the RL step sees: `rl.mini_batch_size` rows, prompts at their
  longest buckets (`seed.batch.build_batch`), `batch.response_len` response tokens; in an
  env that shows images (with the model's `cfg`), each row's image patches and
  multimodal positions."""
  rows, resp = _round_up(spec.rl.mini_batch_size, mesh.batch_shards), spec.batch.response_len
  student, teacher = _prompt_widths(spec)
  f32 = jnp.float32
  arrays = {"student_tokens": ((rows, student + resp), jnp.int32),
            "student_mask": ((rows, student + resp), jnp.bool_),
            "response_mask": ((rows, resp), f32), "old_logprobs": ((rows, resp), f32),
            "advantages": ((rows,), f32), "opd_mask": ((rows,), f32)}
  if spec.rl.opd:
    if spec.train_step.teacher_mode == "precomputed":
      arrays["teacher_logprobs"] = ((rows, resp), f32)
    else:
      arrays["teacher_tokens"] = ((rows, teacher + resp), jnp.int32)
      arrays["teacher_mask"] = ((rows, teacher + resp), jnp.bool_)
  if spec.rl.kl:
    arrays["ref_logprobs"] = ((rows, resp), f32)
  if spec.rl.pack_rows:
    arrays = _packed_shapes(arrays, spec.rl.pack_rows, resp, mesh.batch_shards)
  grid = turn_image_grid(spec, cfg) if cfg is not None else None
  if grid is not None:
    arrays.update(_image_shapes(arrays, grid, cfg))
  return _rows(mesh, arrays)


def turn_image_grid(spec: RunSpec, cfg: ModelConfig) -> tuple[int, int] | None:
  """`(h, w)` in patches of the image the env shows each turn, as the model's processor
  sizes it (the folder's preprocessor_config.json; transformers' defaults for a shape);
  None for an env without images. Read from one reset of the env."""
  env = get_env_module(spec.env.name)
  settings = spec.env.with_settings()
  if not shows_images(env.make_agent_format(settings)):
    return None
  if cfg.vision is None:
    raise ValueError(f"env {spec.env.name!r} shows images; model {spec.model.name!r} has "
                     f"no vision tower")
  task = env.load_tasks(settings, "train")[0]
  _, info = env.make_env(settings).reset(task, 0)
  folder = (resolve_model_path(spec.model.name) if spec.model.name in EMBEDDED_MODELS
            else os.path.expanduser(spec.model.name))
  processor = ImageProcessorConfig()
  if os.path.exists(os.path.join(folder, "preprocessor_config.json")):
    processor = ImageProcessorConfig.from_file(folder)
  height, width = smart_resize(*info["image"].shape[:2], processor.factor,
                               processor.min_pixels, processor.max_pixels)
  return height // processor.patch_size, width // processor.patch_size


def _image_shapes(arrays: dict, grid: tuple[int, int], cfg: ModelConfig) -> dict:
  """The image rows' arrays (`seed.batch.build_batch`): patches `[B, h, w, D]`, one image
  a row, and `[B, 3, T]` positions for each side's tokens."""
  rows = arrays["response_mask"][0][0]
  out = {"image_patches": ((rows, *grid, cfg.vision.patch_dim), jnp.float32)}
  for side in ("student", "teacher"):
    if f"{side}_tokens" in arrays:
      out[f"{side}_positions"] = ((rows, 3, arrays[f"{side}_tokens"][0][1]), jnp.int32)
  return out


def _prompt_widths(spec: RunSpec) -> tuple[int, int]:
  """(P, P_teacher) of a row at their longest buckets (`seed.batch.build_batch`)."""
  b = spec.batch
  student = min(_round_up(spec.rollout.max_prompt_tokens, b.prompt_bucket), b.max_prompt_len)
  teacher = b.max_prompt_len
  if b.shared_prompt_len:
    student = teacher = max(student, teacher)
  return student, teacher


def _packed_shapes(arrays: dict, k: int, resp: int, shards: int) -> dict:
  """The row shapes as `rl.pack_rows = k` packs them (`seed_jax.seed.packing`), at their
  worst: k turns of the longest row in each of `rows / k` sequences, every response slot
  per token."""
  rows = arrays["response_mask"][0][0]
  sequences = _round_up(-(-rows // k), shards)
  slots = _round_up(k * resp, packing.RESPONSE_SLOT_BUCKET)
  out = {}
  for key, (shape, _) in arrays.items():
    if key.endswith("_tokens"):
      side, width = key.split("_")[0], k * shape[1]
      out[key] = ((sequences, width), jnp.int32)
      out[f"{side}_segments"] = out[f"{side}_positions"] = ((sequences, width), jnp.int32)
      out[f"{side}_predict"] = ((sequences, slots), jnp.int32)
    elif key not in ("student_mask", "teacher_mask"):  # the segments replace them
      out[key] = ((sequences, slots), jnp.float32)
  return out


def sft_batch_shapes(fine_tune: sft.FineTuneSpec, target_tokens: int, mesh: LogicalMesh
                     ) -> dict[str, jax.ShapeDtypeStruct]:
  """The SFT step's batch at its longest: targets of `target_tokens` (rounded up as
  `sft.padded_lengths` does, at most half the row), the prompt filling `max_tokens`; with
  `pack_rows` k, k such examples in each of batch_size / k packed sequences."""
  rows = _round_up(fine_tune.batch_size, mesh.batch_shards)
  resp = min(_round_up(target_tokens, 64), fine_tune.max_tokens // 2)
  length = fine_tune.max_tokens
  k = fine_tune.pack_rows
  if k:
    sequences = _round_up(fine_tune.batch_size // k, mesh.batch_shards)
    width, slots = _round_up(k * length, 64), _round_up(k * resp, 64)
    return _rows(mesh, {"tokens": ((sequences, width), jnp.int32),
                        "segments": ((sequences, width), jnp.int32),
                        "positions": ((sequences, width), jnp.int32),
                        "predict": ((sequences, slots), jnp.int32),
                        "target_mask": ((sequences, slots), jnp.float32)})
  return _rows(mesh, {"tokens": ((rows, length), jnp.int32),
                      "mask": ((rows, length), jnp.bool_),
                      "target_mask": ((rows, resp), jnp.float32)})


# ------------------------------------------------------------------ programs


@dataclasses.dataclass
class ProgramPlan:
  """One compiled program's figures, per device."""
  name: str
  shapes: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  held_bytes: int  # resident run state that is not among the program's arguments
  model_flops: float  # whole program, all devices
  hardware_flops: float
  xla_flops: float | None  # per device, as XLA counts (scanned layers once)
  tokens: int
  compile_s: float
  steps: int = 1  # decode: the loop's steps (the estimate is per program call)
  read_bytes_per_step: int = 0  # decode: weights and cache read every step
  compiler_error: str = ""  # the TPU compiler refused it: out of memory
  compiler_used_bytes: int = 0  # what it said the program would use, when it said so

  @property
  def total_bytes(self) -> int:
    if self.compiler_used_bytes:
      return self.compiler_used_bytes + self.held_bytes
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes + self.held_bytes)

  def seconds(self, target: Target) -> float | None:
    """Estimated time at the device's peak (and, for decoding, its HBM bandwidth)."""
    if not target.peak_per_device:
      return None
    per_device = self.hardware_flops / len(target.devices) / target.peak_per_device
    if self.read_bytes_per_step and target.bandwidth_per_device:
      per_device = max(per_device,
                       self.steps * self.read_bytes_per_step / target.bandwidth_per_device)
    return per_device


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
  """The TPU compiler's refusal of a program that cannot fit (RESOURCE_EXHAUSTED). Its
  message gives either the temporaries it needed ("required for HLO temporaries (X)") or
  the program's whole use ("Used X of Y hbm")."""
  message: str
  temp_bytes: int = 0
  used_bytes: int = 0


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _out_of_memory(error: Exception) -> OutOfMemory | None:
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text:
    return None
  line = next((l for l in text.splitlines() if "RESOURCE_EXHAUSTED" in l), text)
  message = line.split("RESOURCE_EXHAUSTED:", 1)[-1].strip()
  size = lambda match: int(float(match.group(1)) * _UNITS[match.group(2)])
  if found := re.search(r"temporaries \(([\d.]+)([KMGT])", line):
    return OutOfMemory(message, temp_bytes=size(found))
  if found := re.search(r"Used ([\d.]+)([KMGT])", line):
    return OutOfMemory(message, used_bytes=size(found))
  return OutOfMemory(message)


def _compile(lowered) -> tuple[Any, float]:
  """(the compiled program, or the compiler's OutOfMemory, and the seconds it took)."""
  started = time.perf_counter()
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    compiled = _out_of_memory(e)
    if compiled is None:
      raise
  return compiled, time.perf_counter() - started


def _program_plan(name: str, shapes: str, compiled, compile_s: float, *, inputs: Any,
                  held: int, model_flops: float, hardware_flops: float, tokens: int, **extra
                  ) -> ProgramPlan:
  """The figures of a compiled program; for one the compiler refused, its inputs' bytes and
  the temporaries the compiler asked for."""
  if isinstance(compiled, OutOfMemory):
    return ProgramPlan(
        name=name, shapes=shapes, argument_bytes=device_bytes(inputs), output_bytes=0,
        alias_bytes=0, temp_bytes=compiled.temp_bytes, code_bytes=0, held_bytes=held,
        model_flops=model_flops, hardware_flops=hardware_flops, xla_flops=None,
        tokens=tokens, compile_s=compile_s, compiler_error=compiled.message,
        compiler_used_bytes=compiled.used_bytes, **extra)
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return ProgramPlan(
      name=name, shapes=shapes, argument_bytes=memory.argument_size_in_bytes,
      output_bytes=memory.output_size_in_bytes, alias_bytes=memory.alias_size_in_bytes,
      temp_bytes=memory.temp_size_in_bytes,
      code_bytes=memory.generated_code_size_in_bytes, held_bytes=held,
      model_flops=model_flops, hardware_flops=hardware_flops,
      xla_flops=(cost or {}).get("flops"), tokens=tokens, compile_s=compile_s, **extra)


def device_bytes(tree) -> int:
  """Bytes of one device's shards of an abstract, sharded tree (the largest shard)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
  return total


def _batch_shape_text(batch: dict[str, jax.ShapeDtypeStruct], key: str) -> str:
  rows, length = batch[key].shape
  return f"{rows} x {length}"


def plan_programs(spec: RunSpec, cfg: ModelConfig, mesh: LogicalMesh,
                  only: Sequence[str] = (), on_program: Callable[[str], None] = lambda _: None,
                  on_plan: Callable[[ProgramPlan], None] = lambda _: None
                  ) -> list[ProgramPlan]:
  """Lowers and compiles every program the run uses (or those named in `only`) for the
  devices of `mesh`, with abstract parameters."""
  graphdef, params = abstract_params(cfg, mesh)
  state, state_shardings = abstract_train_state(params, mesh, spec.optim)
  param_bytes, state_bytes = device_bytes(params), device_bytes(state)
  ref_bytes = param_bytes if spec.rl.kl else 0
  wanted = lambda name: not only or name in only
  plans: list[ProgramPlan] = []

  def record(plan: ProgramPlan) -> None:
    plans.append(plan)
    on_plan(plan)

  def add(name: str, build: Callable[[], ProgramPlan]) -> None:
    if wanted(name):
      on_program(name)
      record(build())

  batch = rl_batch_shapes(spec, mesh, cfg)
  rows, student_len = batch["student_tokens"].shape
  resp = batch["response_mask"].shape[1]  # R, or the response slots of packed sequences

  images = batch.get("image_patches")
  tower = (vision_forward_flops(cfg.vision, rows, images.shape[1] * images.shape[2])
           if images is not None else 0.0)  # one pass over the mini-batch's images

  # Packed sequences of k turns, each at most a row of the row layout (k rows wide).
  window = (packing.max_segment_len(batch) // spec.rl.pack_rows
            if spec.rl.pack_rows else None)

  def train_step():
    step = make_train_step(graphdef, spec.optim, spec.train_step, mesh, state_shardings)
    model, hardware = training_flops(cfg, rows, student_len, resp)
    # The tower: forward and backward once a row (student and joint teacher share it).
    model, hardware = model + 3 * tower, hardware + 3 * tower
    if "teacher_tokens" in batch:  # joint / separate: a no-grad teacher forward
      teacher = forward_flops(cfg, rows, batch["teacher_tokens"].shape[1], resp)
      if spec.train_step.teacher_mode == "separate":
        teacher += tower  # its own no-grad tower pass
      model, hardware = model + teacher, hardware + teacher
    return _program_plan(
        f"train_step ({spec.train_step.teacher_mode})",
        _batch_shape_text(batch, "student_tokens"), *_compile(step.lower(state, batch, window)),
        inputs=(state, batch), held=ref_bytes, model_flops=model, hardware_flops=hardware,
        tokens=rows * student_len)

  add("train_step", train_step)

  if images is not None:
    micro = spec.rl.micro_batch_size

    def vision_tower():
      """The tower's forward and backward over a micro-batch's images, alone: what the
      images add to the train step's memory (it runs inside the step)."""
      _, h, w, dim = images.shape
      patches = _rows(mesh, {"patches": ((micro, h * w, dim), jnp.float32)})["patches"]
      tower_graphdef, tower_params = nnx.split(nnx.merge(graphdef, params).tower, nnx.Param)

      def image_sum(tower_params, patches):  # the tower's weights get their gradients
        rows = encode_each(nnx.merge(tower_graphdef, tower_params), patches, (1, h, w))
        return jnp.sum(rows.astype(jnp.float32))

      grad = in_mesh(jax.jit(jax.grad(image_sum)), mesh)
      flops = 3 * tower * micro / rows
      return _program_plan(
          "vision_tower", f"{micro} x {h} x {w} patches",
          *_compile(grad.lower(tower_params, patches)), inputs=(tower_params, patches),
          held=state_bytes - param_bytes + ref_bytes, model_flops=flops,
          hardware_flops=flops, tokens=micro * images.shape[1] * images.shape[2])

    add("vision_tower", vision_tower)

  score = make_score_fn(graphdef, spec.train_step.logprob_chunk, mesh)
  score_rows = spec.rl.micro_batch_size  # Trainer.score_rows: a micro-batch at a time
  # Scoring reads padded rows in either layout (packing is the step's).
  resp = spec.batch.response_len
  student_len, teacher_len = (width + resp for width in _prompt_widths(spec))
  for name, key, used in (("score_teacher", "teacher", spec.rl.opd and
                           spec.train_step.teacher_mode == "precomputed"),
                          ("score_reference", "student", spec.rl.kl)):
    if not used:
      continue
    length = teacher_len if key == "teacher" else student_len
    inputs = {"tokens": ((score_rows, length), jnp.int32),
              "mask": ((score_rows, length), jnp.bool_)}
    if "image_patches" in batch:  # the rows' images and multimodal positions
      inputs["positions"] = ((score_rows, 3, length), jnp.int32)
      inputs["image_patches"] = ((score_rows, *batch["image_patches"].shape[1:]), jnp.float32)
    tokens = _rows(mesh, inputs)

    def scoring(name=name, tokens=tokens, length=length):
      flops = forward_flops(cfg, score_rows, length, resp) + tower * score_rows / rows
      return _program_plan(
          name, f"{score_rows} x {length}",
          *_compile(score.lower(params, tokens, resp)),
          inputs=(params, tokens), held=state_bytes - param_bytes + ref_bytes,
          model_flops=flops, hardware_flops=flops, tokens=score_rows * length)

    add(name, scoring)

  fine_tunes = []
  if spec.algorithm.stage1_sft:
    fine_tunes.append(("sft_step", spec.stage1.fine_tune, spec.analyzer.max_tokens))
  if spec.bc is not None and spec.bc.episodes:
    fine_tunes.append(("bc_step", spec.bc.fine_tune, spec.rollout.max_new_tokens))
  for name, fine_tune, target_tokens in fine_tunes:

    def sft_step(fine_tune=fine_tune, target_tokens=target_tokens, name=name):
      optim_cfg = sft.fine_tune_optim(fine_tune, num_steps=2)
      sft_state, shardings = abstract_train_state(params, mesh, optim_cfg)
      step = sft.make_nll_step(graphdef, optim_cfg, mesh, shardings, fine_tune.chunk,
                               max_segment_len=(fine_tune.max_tokens if fine_tune.pack_rows
                                                else None))
      sft_batch = sft_batch_shapes(fine_tune, target_tokens, mesh)
      sft_rows, length = sft_batch["tokens"].shape
      model, hardware = training_flops(cfg, sft_rows, length,
                                        sft_batch["target_mask"].shape[1])
      # The RL weights wait in memory (the sampler's) while the fine-tuning phase trains
      # its own copy with its own optimizer; the RL moments are freed (Trainer._fine_tune).
      return _program_plan(name, _batch_shape_text(sft_batch, "tokens"),
                           *_compile(step.lower(sft_state, sft_batch)),
                           inputs=(sft_state, sft_batch), held=param_bytes,
                           model_flops=model, hardware_flops=hardware,
                           tokens=sft_rows * length)

    add(name, sft_step)

  sampler = Sampler(graphdef, params, cfg, mesh=mesh, max_cache_len=spec.max_cache_len)
  requests = [("acting", spec.rl.tasks_per_batch * spec.rl.group_size,
               spec.rollout.max_prompt_tokens, spec.rollout.max_new_tokens)]
  if spec.rl.opd and spec.analyzer.backend == "policy":
    transcripts = spec.rl.tasks_per_batch * spec.rl.group_size
    requests.append(("analysis", min(spec.analyzer.decode_batch or transcripts, transcripts),
                     spec.analyzer_max_prompt_tokens, spec.analyzer.max_tokens))
  for request, prompts, prompt_len, new_tokens in requests:
    if not (wanted(f"prefill_{request}") or wanted(f"decode_{request}")):
      continue
    on_program(f"prefill_{request} and decode_{request}")
    # Acting prompts show the turn's image (the analyzer reads text: transcript.py).
    grid = (1, *images.shape[1:3]) if images is not None and request == "acting" else None
    request_programs = sampler.lower(prompts, prompt_len,
                                     SamplingParams(max_new_tokens=new_tokens), grid)
    shapes = request_programs.shapes
    p_rows, p_len = shapes["batch"], shapes["prompt_len"]
    d_rows, steps, cache_len = (shapes["decode_rows"], shapes["max_new_bucket"],
                                shapes["cache_len"])
    prefill_flops = forward_flops(cfg, p_rows, p_len, 0) + forward_flops(cfg, d_rows, 0, 1)
    if grid is not None:  # the tower over every prompt's image
      prefill_flops += vision_forward_flops(cfg.vision, prompts, grid[1] * grid[2])
    decode_flops = steps * forward_flops(cfg, d_rows, 1, 1, context=cache_len)
    held = state_bytes - param_bytes + ref_bytes
    prefill, prefill_s = _compile(request_programs.prefill)
    # A prefill that does not fit is reported even when only its decode was asked for:
    # the decode program takes the prefill's output and cannot be planned without it.
    if wanted(f"prefill_{request}") or isinstance(prefill, OutOfMemory):
      record(_program_plan(
          f"prefill_{request}", f"{p_rows} x {p_len}", prefill, prefill_s, inputs=params,
          held=held, model_flops=prefill_flops, hardware_flops=prefill_flops,
          tokens=p_rows * p_len))
    if wanted(f"decode_{request}") and not isinstance(prefill, OutOfMemory):
      decode, decode_s = _compile(request_programs.lower_decode(prefill))
      record(_program_plan(
          f"decode_{request}", f"{d_rows} x {steps} (cache {cache_len})", decode, decode_s,
          inputs=params, held=held, model_flops=decode_flops, hardware_flops=decode_flops,
          tokens=d_rows * steps, steps=steps,
          read_bytes_per_step=(0 if isinstance(decode, OutOfMemory)
                               else decode.memory_analysis().argument_size_in_bytes)))
  return plans
