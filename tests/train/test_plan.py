"""`seed_jax.plan`: every program of a run compiles for a TPU slice from this CPU machine
(libtpu's compiler, abstract parameters), with memory that follows the batch and a verdict
that names the program that does not fit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from seed_jax import plan as plan_lib
from seed_jax.models import flops
from seed_jax.models.config import ModelConfig
from seed_jax.models.shapes import model_config
from seed_jax.parallel.mesh import MeshConfig, make_mesh
from seed_jax.planning import programs, targets
from tests.train.conftest import tiny_spec

EVERY_PROGRAM = {"train_step", "score_teacher", "score_reference", "sft_step", "bc_step",
                 "prefill_acting", "decode_acting", "prefill_analysis", "decode_analysis"}


V5E_4 = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 1}  # tiny_config's mesh has 8


def _names(plans):
  return {p.name.split(" ")[0] for p in plans}


@pytest.mark.slow
@pytest.mark.parametrize("topology,mesh", [("v5e:2x2", (1, 4, 1)), ("v5p:2x2x2", (2, 2, 2))])
def test_every_program_compiles_for_a_tpu_slice(tiny_model, topology, mesh):
  spec = tiny_spec(tiny_model, "seed", **{"mesh.data": mesh[0], "mesh.fsdp": mesh[1],
                                         "mesh.tensor": mesh[2]})
  target = targets.topology_target(topology)
  assert target.devices[0].platform == "tpu"
  so_far = []  # what a stopped plan keeps: the programs done, one more at a time
  plans, report = plan_lib.run_plan(spec, target, log=lambda _: None,
                                    on_plans=lambda done: so_far.append(len(done)))
  assert _names(plans) == EVERY_PROGRAM
  assert so_far == list(range(1, len(plans) + 1))
  for p in plans:
    assert p.argument_bytes > 0 and p.temp_bytes >= 0 and p.model_flops > 0, p
    assert p.seconds(target) > 0
  assert report.splitlines()[-1].startswith("fits: every program fits")
  assert "train_step (precomputed)" in report


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["joint", "separate"])
def test_train_step_compiles_in_every_teacher_mode(tiny_model, mode):
  spec = tiny_spec(tiny_model, "seed", **{"rl.teacher_mode": mode}, **V5E_4)
  plans, _ = plan_lib.run_plan(spec, targets.topology_target("v5e:2x2"),
                               only=("train_step",), log=lambda _: None)
  [step] = plans
  assert step.name == f"train_step ({mode})"
  # The teacher rows go through the model inside the step: one more forward's FLOPs.
  precomputed = plan_lib.run_plan(tiny_spec(tiny_model, "seed", **V5E_4),
                                  targets.topology_target("v5e:2x2"), only=("train_step",),
                                  log=lambda _: None)[0][0]
  assert step.model_flops > precomputed.model_flops


@pytest.mark.slow
def test_a_packed_train_step_compiles_for_a_tpu_slice(tiny_model):
  """`rl.pack_rows=2`: the 16 turns of a mini-batch as 8 sequences twice as long, the
  teacher's too (joint mode runs them in the step), scoring still on rows."""
  target = targets.topology_target("v5e:2x2")
  spec, row_spec = (tiny_spec(tiny_model, "seed", **{"rl.teacher_mode": "joint",
                                                     "rl.pack_rows": k}, **V5E_4)
                    for k in (2, 0))
  mesh = make_mesh(spec.mesh, devices=list(target.devices))
  shapes, rows = (programs.rl_batch_shapes(s, mesh) for s in (spec, row_spec))
  assert shapes["student_tokens"].shape == (8, 2 * rows["student_tokens"].shape[1])
  assert shapes["teacher_segments"].shape == shapes["teacher_tokens"].shape
  assert shapes["advantages"].shape == shapes["response_mask"].shape
  plans, _ = plan_lib.run_plan(spec, target, only=("train_step",), log=lambda _: None)
  assert plans[0].name == "train_step (joint)" and plans[0].model_flops > 0


@pytest.mark.slow
def test_a_packed_fine_tuning_step_compiles_for_a_tpu_slice(tiny_model):
  """`bc.pack_rows` (and `sft.pack_rows`, the same step): a step's examples as
  batch_size / k sequences, each k rows wide at the planned worst case."""
  target = targets.topology_target("v5e:2x2")
  spec = tiny_spec(tiny_model, "seed", **{"bc.pack_rows": 4}, **V5E_4)
  mesh = make_mesh(spec.mesh, devices=list(target.devices))
  shapes = programs.sft_batch_shapes(spec.bc.fine_tune, 64, mesh)
  sequences = -(-(spec.bc.fine_tune.batch_size // 4) // 4) * 4  # rounded to the 4 shards
  assert shapes["tokens"].shape == (sequences, 4 * spec.bc.fine_tune.max_tokens)
  assert shapes["predict"].shape == shapes["target_mask"].shape
  [plan], _ = plan_lib.run_plan(spec, target, only=("bc_step",), log=lambda _: None)
  assert plan.name == "bc_step" and plan.model_flops > 0


@pytest.mark.slow
def test_a_lora_train_step_compiles_for_a_tpu_slice_holding_moments_for_the_adapters(
    tiny_model):
  lora = {"model.lora.rank": 4, "model.lora.targets": ("q", "v", "down")}
  topology = targets.topology_target("v5e:2x2")
  plans = {}
  for name, overrides in (("full", {}), ("lora", lora)):
    spec = tiny_spec(tiny_model, "seed", **overrides, **V5E_4)
    [plans[name]], report = plan_lib.run_plan(spec, topology, only=("train_step",),
                                              log=lambda _: None)
  assert "LoRA (rank 4, q/v/down; the base frozen)" in report
  # The state: weights, plus AdamW's two moments of the adapters only (not of the base).
  assert plans["lora"].argument_bytes < 0.5 * plans["full"].argument_bytes
  assert plans["lora"].model_flops < plans["full"].model_flops  # no weight gradients


def test_a_frozen_base_saves_its_weight_gradients_flops():
  """A frozen base's backward computes the activations' gradients only: one forward of
  the weight matmuls fewer (the embedding lookup has none to save)."""
  cfg = ModelConfig.tiny(vocab_size=1000, remat="none")
  d, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  weights = L * (2 * d * cfg.num_heads * cfg.head_dim + 2 * d * cfg.num_kv_heads * cfg.head_dim
                 + 3 * d * i) + d * 1000  # the layers' and the LM head's (tied: the embed)
  rows, length, unembedded = 3, 10, 10
  full, _ = flops.training_flops(cfg, rows, length, unembedded)
  lora, _ = flops.training_flops(cfg.replace(lora_rank=2), rows, length, unembedded)
  assert full - lora == pytest.approx(2 * weights * rows * length)


@pytest.mark.slow
def test_memory_grows_with_the_batch(tiny_model):
  target = targets.topology_target("v5e:2x2")
  small, large = (plan_lib.run_plan(
      tiny_spec(tiny_model, "grpo", **{"rl.mini_batch_size": rows, "rl.micro_batch_size": rows},
                **V5E_4),
      target, only=("train_step",), log=lambda _: None)[0][0] for rows in (8, 64))
  assert large.argument_bytes > small.argument_bytes  # the batch is an argument
  assert large.temp_bytes > small.temp_bytes
  assert large.model_flops == pytest.approx(8 * small.model_flops)


@pytest.mark.slow
def test_a_batch_that_cannot_fit_names_the_program_and_exits_1(tiny_model, tmp_path):
  """256 rows x 16k tokens on v5e:2x2 (16 GiB a chip)."""
  out = tmp_path / "plan.json"
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.plan", "--config=configs/sokoban.py:cpu",
       f"--config.model.name={tiny_model}", "--topology=v5e-4", "--programs=train_step",
       "--config.mesh.fsdp=4", "--config.rl.mini_batch_size=256",
       "--config.rl.micro_batch_size=256", "--config.rollout.max_prompt_tokens=12288",
       "--config.rollout.max_new_tokens=4096", f"--json={out}"],
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 1, result.stderr[-2000:]
  verdict = result.stdout.strip().splitlines()[-1]
  assert verdict.startswith("does not fit: train_step (precomputed) needs")
  assert "the device has 16.00 GiB" in verdict
  saved = json.loads(out.read_text())
  assert saved["fits"] is False and saved["programs"][0]["total_bytes"] > 16 * 2**30
  assert saved["complete"] is True


@pytest.mark.parametrize("name,problem", [
    ("v9z:2x2", "not a TPU topology"),
    ("v5p-7", "not a TPU topology"),
    ("v5p:9x9x9", "not divisible"),
])
def test_unknown_topologies_are_named(name, problem):
  with pytest.raises(targets.PlanError, match=rf"--topology='{name}'.*{problem}"):
    targets.topology_target(name)


def test_accelerator_types_count_chips_not_cores():
  v5p_8 = targets.topology_target("v5p-8")  # 8 TensorCores = 4 megacore chips
  assert len(v5p_8.devices) == 4 and v5p_8.hbm_per_device == 95 * 2**30
  v4_8 = targets.topology_target("v4-8")  # libtpu lists v4's cores: 2 devices a chip
  assert v4_8.hbm_per_device * len(v4_8.devices) == 4 * 32 * 2**30
  assert len(targets.topology_target("v5e-16").devices) == 16


def test_model_flops_follow_six_n_d():
  """A long way from the code's own count: 6 x parameters x tokens for the layers."""
  cfg = ModelConfig.tiny(vocab_size=1000)
  d, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  q_and_o = 2 * d * cfg.num_heads * cfg.head_dim
  k_and_v = 2 * d * cfg.num_kv_heads * cfg.head_dim
  layer_weights = L * (q_and_o + k_and_v + 3 * d * i)
  rows, length, unembedded = 3, 10, 4
  attention = 2 * 2 * L * cfg.num_heads * cfg.head_dim * length * length / 2
  expected = rows * (2 * layer_weights * length + attention + 2 * d * 1000 * unembedded)
  assert flops.forward_flops(cfg, rows, length, unembedded) == pytest.approx(expected)


def test_vision_tower_flops_are_two_per_weight_per_patch_plus_attention():
  """Counted from the tower's own weights: 2 FLOPs per weight of every matmul per patch (the
  merger's per merged token, a quarter of the patches), and attention's QK^T and PV over a
  window of patches, or the whole image in the full-attention blocks."""
  from flax import nnx

  from seed_jax.models.config import VisionConfig
  from seed_jax.models.vision.tower import VisionTower
  vision = VisionConfig.tiny()  # 4 blocks, blocks 1 and 3 full attention, windows of 4x4
  tower = VisionTower(vision, rngs=nnx.Rngs(0))
  kernels = lambda module: sum(
      x.size for path, x in nnx.to_flat_state(nnx.state(module, nnx.Param))
      if path[-1] == "kernel")
  images, patches = 3, 64  # 8 x 8 patches each
  window = (vision.window_size // vision.patch_size) ** 2
  full, windowed = len(vision.fullatt_block_indexes), vision.depth - len(
      vision.fullatt_block_indexes)
  attention = 2 * 2 * vision.hidden_size * (windowed * window + full * patches)
  expected = images * (patches * (2 * (kernels(tower.patch_embed) + kernels(tower.blocks))
                                  + attention)
                       + patches // vision.merge_unit * 2 * kernels(tower.merger))
  assert flops.vision_forward_flops(vision, images, patches) == pytest.approx(expected)


def test_a_visual_train_step_and_the_tower_compile_for_a_tpu_slice():
  """The visual preset's rows carry each turn's image patches and multimodal positions
  (the step and the teacher's scoring); the tower's forward and backward is planned on its
  own too. (Every teacher mode's step with images runs in tests/seed/test_image_rows.py.)"""
  from configs import sokoban_visual
  from seed_jax.train.spec import build_run_spec
  config = sokoban_visual.get_config("cpu")
  with config.unlocked():
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 4, 1
  spec = build_run_spec(config)
  plans, _ = plan_lib.run_plan(spec, targets.topology_target("v5e:2x2"),
                               only=("train_step", "vision_tower", "score_teacher"),
                               log=lambda _: None)
  assert _names(plans) == {"train_step", "vision_tower", "score_teacher"}
  mesh = plan_lib.mesh_for(spec, targets.topology_target("v5e:2x2"))
  shapes = programs.rl_batch_shapes(spec, mesh, model_config(spec.model.name))
  assert shapes["image_patches"].shape == (16, 6, 6, 1176)  # 96 px boards: 84 px, 6 x 6
  assert shapes["student_positions"].shape[:2] == (16, 3)


def test_every_pod_preset_builds_a_run_spec_whose_mesh_fits_its_slice():
  from configs import alfworld, pods
  from seed_jax.train.spec import build_run_spec
  for model, slice_ in pods.LAYOUTS:
    spec = build_run_spec(alfworld.get_config(f"{model}@{slice_}"))
    assert spec.model.name == model and spec.model.dtype == "bfloat16"
    mesh = plan_lib.mesh_for(spec, targets.topology_target(slice_))
    assert spec.rl.micro_batch_size % mesh.batch_shards == 0, (model, slice_)


def test_an_unknown_pod_preset_lists_the_known_ones():
  from configs import alfworld
  with pytest.raises(ValueError, match=r"unknown pod preset 'gpt-5@v5p-8'; known: .*"
                                       r"qwen2.5-7b-instruct@v5p-8"):
    alfworld.get_config("gpt-5@v5p-8")
  with pytest.raises(ValueError, match=r"'qwen2.5-7b-instruct@v4-8': the model does not fit "
                                       r"the devices of v4-8"):
    alfworld.get_config("qwen2.5-7b-instruct@v4-8")


def test_a_micro_batch_smaller_than_the_batch_shards_names_its_key(tiny_model):
  spec = tiny_spec(tiny_model, "grpo", **{"rl.micro_batch_size": 8, "rl.mini_batch_size": 16,
                                         "mesh.data": 1, "mesh.fsdp": -1, "mesh.tensor": 1})
  with pytest.raises(targets.PlanError, match=r"config.rl.micro_batch_size: 8 rows do not "
                                               r"split over the 16 batch shards"):
    plan_lib.mesh_for(spec, targets.topology_target("v5e-16"))


@pytest.mark.slow
def test_main_dry_run_plans_for_the_local_devices_and_stops(tiny_model, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.main", "--config=configs/sokoban.py:cpu",
       f"--config.model.name={tiny_model}", f"--workdir={tmp_path / 'run'}", "--dry_run",
       "--config.algorithm=grpo", "--config.bc.episodes=0"],  # 3 programs are enough here
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert "target: local (8 x cpu)" in result.stdout
  assert any(line.startswith("train_step (precomputed)") for line in lines)
  assert lines[-1].startswith("fits: every program fits")
  assert not (tmp_path / "run").exists()  # nothing ran


@pytest.mark.slow
def test_pod_presets_leave_out_the_slices_the_state_alone_would_half_fill():
  """Weights + AdamW moments + reference weights over more than half a device's HBM leave
  too little for activations: exactly those pairs are screened out without compiling."""
  from configs import alfworld, pods
  from seed_jax.models.shapes import model_config
  from seed_jax.train.spec import build_run_spec
  optim_spec = build_run_spec(alfworld.get_config()).optim
  for model in pods.MODELS:
    cfg = model_config(model, dtype="bfloat16", param_dtype="float32")
    for slice_ in pods.SLICES:
      target = targets.topology_target(slice_)
      mesh = make_mesh(MeshConfig(fsdp=-1), devices=list(target.devices))
      _, params = programs.abstract_params(cfg, mesh)
      state, _ = programs.abstract_train_state(params, mesh, optim_spec)
      resident = programs.device_bytes(state) + programs.device_bytes(params)
      assert ((model, slice_) in pods.STATE_TOO_BIG) == (
          resident > target.hbm_per_device / 2), (model, slice_, resident / 2**30)


@pytest.mark.parametrize("message,temp,used", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
     "temporaries (139.34G) exceeds available HBM (15.75G).", 139.34 * 2**30, 0),
    ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out "
     "of memory in memory space hbm. Used 15.77G of 15.75G hbm. Exceeded hbm capacity by "
     "21.27M.", 0, 15.77 * 2**30),
])
def test_the_compilers_out_of_memory_figures_are_read_as_what_they_count(message, temp, used):
  """'temporaries (X)' counts temporaries alone; 'Used X of Y' the whole program."""
  oom = programs._out_of_memory(RuntimeError(message))  # pylint: disable=protected-access
  assert oom.temp_bytes == int(temp) and oom.used_bytes == int(used)
  assert oom.message.startswith(("Ran out", "E1000"))
  assert programs._out_of_memory(RuntimeError("INVALID_ARGUMENT: bad")) is None
