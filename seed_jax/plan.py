"""Plan a run for a TPU slice (or the local devices) before spending pod hours on it.

  python -m seed_jax.plan --config=configs/alfworld.py --topology=v5p:2x2x2 \
      [--config.model.name=qwen2.5-7b-instruct] [--config.mesh.fsdp=8] ...

For the configured model, mesh and batch, every program a run compiles is lowered and
compiled for the topology's devices with abstract parameters (nothing is allocated, no
weights are read; a model may be a shape only, `seed_jax.models.shapes`): the RL train step
in its teacher mode, the teacher / reference scoring, the stage-1 SFT and behaviour-cloning
steps, and the sampler's prefill and decode at their largest requests (acting, and the
policy analyzer's). One table gives, per program and per device, the compiler's argument /
output / temporary / code bytes, the run's other resident state, their sum against the
chip's HBM, the model FLOPs and an estimated time at the chip's peak; then one line: fits,
or which program does not (exit status 1).

Topologies are `jax.experimental.topologies` names (`v5e:2x2`, `v5p:2x2x2`, `v4:2x2x1`,
`v6e:4x4`) or Cloud accelerator types (`v5e-16`, `v5p-8`, `v4-8`); compiling for them needs
libtpu (`bash launch/install.sh --tpu`, or `--test`), which works on a machine without a
TPU. `--topology=local` plans for the devices this process sees (CPU, GPU or a TPU VM);
`python -m seed_jax.main --dry_run` runs that plan and stops.

FLOPs come from the model's shape (XLA's `cost_analysis` counts a scanned layer once, so
its figure is shown only as a cross-check). "Model" FLOPs are forward + backward (2 + 4
per parameter and token, plus attention); the time estimate adds the rematerialised forward
of the layers and, for decoding, takes the larger of the FLOP time and the time to read the
program's arguments (weights and KV cache) from HBM once per step.
"""

from __future__ import annotations

if __name__ == "__main__":  # a command, not an import: before jax and transformers load
  import os as _os
  import sys as _sys
  from seed_jax import cli
  cli.quiet_startup()
  if not any(a in ("--topology=local", "--topology") for a in _sys.argv) and any(
      a.startswith("--topology=") for a in _sys.argv):
    # Planning for a described slice, not running on one: arrays stay on the CPU.
    _os.environ.setdefault("JAX_PLATFORMS", "cpu")

# pylint: disable=wrong-import-position
import contextlib
import dataclasses
import math
import os
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.flops import forward_flops, training_flops
from seed_jax.models.lora import LoraParam
from seed_jax.models.transformer import Transformer
from seed_jax.parallel.mesh import LogicalMesh, MeshConfig, make_mesh, param_shardings
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed import optim
from seed_jax.seed.train_step import (TrainState, make_score_fn, make_train_step,
                                      new_train_state, train_state_shardings)
from seed_jax.train import sft
from seed_jax.train.spec import RunSpec

GiB = 1 << 30


class PlanError(ValueError):
  """A topology, model or configuration that cannot be planned."""


# ------------------------------------------------------------------ chips and topologies


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures from the vendor's pages: HBM, bf16 peak, HBM bandwidth."""
  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bytes_per_s: float


CHIPS = {  # keyed by jax's device_kind
    "TPU v4": Chip("v4", 32 * GiB, 275e12, 1.2e12),
    "TPU v5 lite": Chip("v5e", 16 * GiB, 197e12, 0.82e12),
    "TPU v5": Chip("v5p", 95 * GiB, 459e12, 2.76e12),
    "TPU v6 lite": Chip("v6e", 32 * GiB, 918e12, 1.64e12),
    "NVIDIA H100 80GB HBM3": Chip("H100", 80 * GiB, 989e12, 3.35e12),
    "NVIDIA H200": Chip("H200", 141 * 10**9, 989e12, 4.8e12),
}

# Cloud accelerator types -> topology names. v4 and v5p count TensorCores (2 a chip):
# v5p-8 is 4 chips.
ACCELERATOR_TYPES = {
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-64": "v4:2x4x4",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4",
    "v5p-64": "v5p:2x4x4", "v5p-128": "v5p:4x4x4",
    **{f"{gen}-{n}": f"{gen}:{shape}" for gen in ("v5e", "v6e") for n, shape in
       ((4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"),
        (256, "16x16"))},
}
_TOPOLOGY_NAME = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


@dataclasses.dataclass(frozen=True)
class Target:
  """The devices to plan for, and each device's share of its chip."""
  name: str
  devices: Sequence[Any]
  chip: Chip | None  # None: unknown peak (a CPU); memory from the runtime if it says
  hbm_per_device: int | None
  peak_per_device: float | None
  bandwidth_per_device: float | None


def topology_target(name: str) -> Target:
  """The target for a topology name, an accelerator type, or "local"."""
  if name == "local":
    return _local_target()
  topology = ACCELERATOR_TYPES.get(name, name)
  match = _TOPOLOGY_NAME.match(topology)
  if not match:
    raise PlanError(
        f"--topology={name!r}: not a TPU topology (e.g. v5e:2x2, v5p:2x2x2, v4:2x2x1, "
        f"v6e:4x4), an accelerator type ({', '.join(sorted(ACCELERATOR_TYPES)[:6])}, ...) "
        "or 'local'")
  if not _libtpu_installed():
    raise PlanError(f"--topology={name!r}: compiling for a TPU needs libtpu; install it "
                    "with `bash launch/install.sh --tpu` (or --test)")
  # Describing a slice uses no TPU, so a second process (a test beside a plan, a plan on a
  # TPU VM that is training) may load libtpu too.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
  except Exception as e:  # pylint: disable=broad-except
    raise PlanError(f"--topology={name!r}: {str(e).splitlines()[0]}") from None
  chips = math.prod(int(n) for n in match.group(2).split("x"))
  chip = CHIPS[devices[0].device_kind]
  share = chips / len(devices)  # v4 shows each TensorCore as a device
  return Target(topology, devices, chip, int(chip.hbm_bytes * share),
                chip.peak_flops * share, chip.hbm_bytes_per_s * share)


def _libtpu_installed() -> bool:
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
    return True
  except ImportError:
    return False


def _local_target() -> Target:
  devices = jax.devices()
  chip = CHIPS.get(devices[0].device_kind)
  stats = getattr(devices[0], "memory_stats", lambda: None)() or {}
  hbm = stats.get("bytes_limit") or (chip.hbm_bytes if chip else None)
  if hbm is None and devices[0].platform == "cpu":  # CPU devices share the host's memory
    hbm = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(devices)
  return Target(f"local ({len(devices)} x {devices[0].device_kind})", devices, chip, hbm,
                chip.peak_flops if chip else None, chip.hbm_bytes_per_s if chip else None)


# ------------------------------------------------------------------ abstract inputs


def abstract_params(cfg: ModelConfig, mesh: LogicalMesh) -> tuple[nnx.GraphDef, nnx.State]:
  """The model's graphdef and its parameters as `ShapeDtypeStruct`s placed on `mesh` by
  their logical axes: nothing is allocated."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
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


def rl_batch_shapes(spec: RunSpec, mesh: LogicalMesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The largest mini-batch the RL step sees: `rl.mini_batch_size` rows, prompts at their
  longest buckets (`seed.batch.build_batch`), `batch.response_len` response tokens."""
  b = spec.batch
  rows, resp = _round_up(spec.rl.mini_batch_size, mesh.batch_shards), b.response_len
  student = min(_round_up(spec.rollout.max_prompt_tokens, b.prompt_bucket), b.max_prompt_len)
  teacher = b.max_prompt_len
  if b.shared_prompt_len:
    student = teacher = max(student, teacher)
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
  return _rows(mesh, arrays)


def sft_batch_shapes(fine_tune: sft.FineTuneSpec, target_tokens: int, mesh: LogicalMesh
                     ) -> dict[str, jax.ShapeDtypeStruct]:
  """The SFT step's batch at its longest: targets of `target_tokens` (rounded up as
  `sft.padded_lengths` does, at most half the row), the prompt filling `max_tokens`."""
  rows = _round_up(fine_tune.batch_size, mesh.batch_shards)
  resp = min(_round_up(target_tokens, 64), fine_tune.max_tokens // 2)
  length = fine_tune.max_tokens
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

  batch = rl_batch_shapes(spec, mesh)
  rows, student_len = batch["student_tokens"].shape
  resp = spec.batch.response_len

  def train_step():
    step = make_train_step(graphdef, spec.optim, spec.train_step, mesh, state_shardings)
    model, hardware = training_flops(cfg, rows, student_len, resp)
    if "teacher_tokens" in batch:  # joint / separate: a no-grad teacher forward
      teacher = forward_flops(cfg, rows, batch["teacher_tokens"].shape[1], resp)
      model, hardware = model + teacher, hardware + teacher
    return _program_plan(
        f"train_step ({spec.train_step.teacher_mode})",
        _batch_shape_text(batch, "student_tokens"), *_compile(step.lower(state, batch)),
        inputs=(state, batch), held=ref_bytes, model_flops=model, hardware_flops=hardware,
        tokens=rows * student_len)

  add("train_step", train_step)

  score = make_score_fn(graphdef, spec.train_step.logprob_chunk, mesh)
  score_rows = spec.rl.micro_batch_size  # Trainer.score_rows: a micro-batch at a time
  for name, key, used in (("score_teacher", "teacher", spec.rl.opd and
                           spec.train_step.teacher_mode == "precomputed"),
                          ("score_reference", "student", spec.rl.kl)):
    if not used:
      continue
    length = (spec.batch.max_prompt_len + resp if key == "teacher" else student_len)
    tokens = _rows(mesh, {"tokens": ((score_rows, length), jnp.int32),
                          "mask": ((score_rows, length), jnp.bool_)})

    def scoring(name=name, tokens=tokens, length=length):
      flops = forward_flops(cfg, score_rows, length, resp)
      return _program_plan(
          name, f"{score_rows} x {length}",
          *_compile(score.lower(params, tokens["tokens"], tokens["mask"], resp)),
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
      step = sft.make_nll_step(graphdef, optim_cfg, mesh, shardings, fine_tune.chunk)
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
    request_programs = sampler.lower(prompts, prompt_len,
                                     SamplingParams(max_new_tokens=new_tokens))
    shapes = request_programs.shapes
    p_rows, p_len = shapes["batch"], shapes["prompt_len"]
    d_rows, steps, cache_len = (shapes["decode_rows"], shapes["max_new_bucket"],
                                shapes["cache_len"])
    prefill_flops = forward_flops(cfg, p_rows, p_len, 0) + forward_flops(cfg, d_rows, 0, 1)
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


# ------------------------------------------------------------------ the report


def _gib(n: int) -> str:
  return f"{n / GiB:.2f}"


def format_plan(plans: Sequence[ProgramPlan], target: Target, header: str) -> str:
  """The table (per device) and one verdict line."""
  cols = ("program", "rows x tokens", "args", "out", "temp", "code", "other", "total",
          "HBM %", "TFLOP", "XLA TFLOP", "est. s", "tokens/s", "compile s")
  lines = []
  for p in plans:
    seconds = p.seconds(target)
    lines.append((
        p.name, p.shapes, _gib(p.argument_bytes), _gib(p.output_bytes - p.alias_bytes),
        _gib(p.temp_bytes), _gib(p.code_bytes), _gib(p.held_bytes), _gib(p.total_bytes),
        f"{100 * p.total_bytes / target.hbm_per_device:.0f}" if target.hbm_per_device else "-",
        f"{p.model_flops / 1e12:.2f}",
        f"{p.xla_flops / 1e12:.2f}" if p.xla_flops is not None else "-",
        f"{seconds:.3g}" if seconds else "-",
        f"{p.tokens / seconds:,.0f}" if seconds else "-", f"{p.compile_s:.0f}"))
  widths = [max(len(str(row[i])) for row in [cols, *lines]) for i in range(len(cols))]
  fmt = lambda row: "  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w)
                              for i, (v, w) in enumerate(zip(row, widths)))
  hbm = (f"{_gib(target.hbm_per_device)} GiB HBM per device" if target.hbm_per_device
         else "device memory unknown")
  out = [header, f"target: {target.name}, {len(target.devices)} devices, {hbm}; "
         "bytes in GiB per device, TFLOP for the whole program", fmt(cols),
         *map(fmt, lines)]
  out.append(verdict(plans, target))
  return "\n".join(out)


def oversized(plans: Sequence[ProgramPlan], target: Target) -> list[ProgramPlan]:
  if not target.hbm_per_device:
    return [p for p in plans if p.compiler_error]
  return [p for p in plans if p.compiler_error or p.total_bytes > target.hbm_per_device]


def verdict(plans: Sequence[ProgramPlan], target: Target) -> str:
  """One line: fits (and the largest program), or each program that does not."""
  hbm = target.hbm_per_device
  too_big = oversized(plans, target)
  if too_big:
    capacity = f", the device has {_gib(hbm)} GiB" if hbm else ""
    return "does not fit: " + "; ".join(
        f"{p.name} needs {_gib(p.total_bytes)} GiB per device{capacity}"
        + (f" (compiler: {p.compiler_error})" if p.compiler_error else "") for p in too_big)
  if not hbm:
    return "fits: unknown (the runtime reports no device memory)"
  largest = max(plans, key=lambda p: p.total_bytes)
  return (f"fits: every program fits; the largest, {largest.name}, needs "
          f"{_gib(largest.total_bytes)} of {_gib(hbm)} GiB per device")


def mesh_for(spec: RunSpec, target: Target) -> LogicalMesh:
  """The configured mesh over the target's devices (errors name `mesh.*`)."""
  from seed_jax import cli  # pylint: disable=import-outside-toplevel
  problem = (cli.mesh_error(spec.mesh, len(target.devices))
             or cli.batch_error(spec, len(target.devices)))
  if problem:
    raise PlanError(f"{problem} (target {target.name})")
  return make_mesh(spec.mesh, devices=list(target.devices))


def run_plan(spec: RunSpec, target: Target, only: Sequence[str] = (),
             log: Callable[[str], None] = print,
             on_plans: Callable[[list[ProgramPlan]], None] = lambda plans: None
             ) -> tuple[list[ProgramPlan], str]:
  """Plans `spec` for `target`; returns the plans and the printed report. `on_plans`
  receives the plans so far after each program (a long plan stopped midway keeps them)."""
  from seed_jax.models.shapes import model_config  # pylint: disable=import-outside-toplevel
  cfg = model_config(spec.model.name, **spec.model.load_kwargs)
  mesh = mesh_for(spec, target)
  started = time.perf_counter()
  done: list[ProgramPlan] = []

  def planned(p: ProgramPlan) -> None:
    log(f"  {p.name}: {_gib(p.total_bytes)} GiB per device, compiled in {p.compile_s:.0f} s"
        + (" (compiler: out of memory)" if p.compiler_error else ""))
    done.append(p)
    on_plans(list(done))

  with _no_persistent_cache_unless_local(target):
    plans = plan_programs(spec, cfg, mesh, only,
                          on_program=lambda name: log(f"compiling {name} ..."),
                          on_plan=planned)
  base, adapters = _param_counts(cfg)
  count = _count_text(base) + (f" + {_count_text(adapters)} LoRA (rank {cfg.lora_rank}, "
                               f"{'/'.join(cfg.lora_targets)}; the base frozen)"
                               if adapters else "")
  header = (f"plan: {spec.model.name} ({count} parameters, "
            f"{spec.model.param_dtype} weights, {spec.model.dtype} compute), mesh "
            f"{dict(mesh.shape)}, compiled in {time.perf_counter() - started:.0f} s")
  return plans, format_plan(plans, target, header)


@contextlib.contextmanager
def _no_persistent_cache_unless_local(target: Target):
  """Executables for a described topology cannot be loaded here; keep them out of (and
  away from) jax's persistent compilation cache."""
  local = target.devices[0].platform == jax.default_backend()
  enabled = jax.config.jax_enable_compilation_cache
  if not local:
    jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)


def _param_counts(cfg: ModelConfig) -> tuple[int, int]:
  """(base parameters, adapter parameters)."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  count = lambda state: sum(math.prod(x.shape) for x in jax.tree.leaves(state))
  return count(nnx.state(model, nnx.Not(LoraParam))), count(nnx.state(model, LoraParam))


def _count_text(n: int) -> str:
  return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def plan_json(plans: Sequence[ProgramPlan], target: Target, spec: RunSpec | None = None,
              complete: bool = True) -> dict[str, Any]:
  """The plan as plain data (`--json`): one record per program, bytes per device;
  `complete` is False while programs are still being compiled."""
  run = {} if spec is None else {"model": spec.model.name, "mesh": dataclasses.asdict(
      spec.mesh) | {"rules": None}, "micro_batch_size": spec.rl.micro_batch_size}
  return {**run, "complete": complete, "target": target.name, "devices": len(target.devices),
          "hbm_per_device": target.hbm_per_device,
          "fits": not oversized(plans, target) if target.hbm_per_device else None,
          "programs": [dict(dataclasses.asdict(p), total_bytes=p.total_bytes,
                            est_seconds=p.seconds(target)) for p in plans]}


def main(argv: Sequence[str]) -> None:
  # pylint: disable=import-outside-toplevel
  import json
  import sys
  from absl import app
  from etils import epath
  from seed_jax.train.spec import ConfigError, build_run_spec
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  def save(plans, complete=False):
    if _JSON.value:
      epath.Path(_JSON.value).write_text(
          json.dumps(plan_json(plans, target, spec, complete), indent=1))

  try:
    spec = build_run_spec(_CONFIG.value)
    target = topology_target(_TOPOLOGY.value)
    plans, report = run_plan(spec, target, only=_PROGRAMS.value or (), on_plans=save)
  except (ConfigError, PlanError) as e:
    raise app.UsageError(str(e)) from None
  print(report)
  save(plans, complete=True)
  if oversized(plans, target):
    sys.exit(1)


if __name__ == "__main__":
  from absl import flags
  from ml_collections import config_flags
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "config file, optionally with a preset: configs/alfworld.py:cpu",
      lock_config=True)
  _TOPOLOGY = flags.DEFINE_string(
      "topology", "local", "a TPU topology (v5e:2x2, v5p:2x2x2), an accelerator type "
      "(v5p-8, v5e-16) or 'local' (this process's devices)")
  _PROGRAMS = flags.DEFINE_list("programs", [], "plan only these programs (e.g. train_step,"
                                "score_teacher, sft_step, prefill_acting, decode_analysis)")
  _JSON = flags.DEFINE_string("json", "", "also write the plan as JSON to this path")
  flags.mark_flags_as_required(["config"])
  cli.run(main)
