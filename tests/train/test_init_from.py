"""Starting a new run from other weights (`config.init_from`): a checkpoint, named by its run
folder, its checkpoints/ or one step's folder, or a Hugging Face folder. The parameters
only (the optimizer starts afresh), and a workdir's own checkpoints still take precedence."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from seed_jax.models import export_hf, load_model, random_model
from seed_jax.models.lora import LoraParam, split_trainable
from seed_jax.train.init_from import CHECKPOINT, HF, Weights, find_weights
from seed_jax.train.spec import ConfigError, build_run_spec
from seed_jax.train import trainer as trainer_lib
from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_config, tiny_spec

BARE = {"log.tensorboard": False, "rl.kl_coef": 0.0}  # no TensorBoard, no reference model


def saved_params(workdir: str, step: int) -> list[np.ndarray]:
  """The policy parameters of checkpoint `step` of the run in `workdir`, read raw from
  disk (their leaves come in the order of a model's `nnx.Param` state)."""
  state = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step),
                                                        "state"))
  return [np.asarray(x) for x in jax.tree.leaves(state["train"]["params"])]


def folder_params(folder: str) -> list[np.ndarray]:
  """The parameters of a Hugging Face folder, loaded as a model."""
  model, _ = load_model(folder)
  return [np.asarray(x) for x in jax.tree.leaves(nnx.split(model, nnx.Param)[1])]


def trainer_params(trainer: Trainer) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]


def same_params(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
  return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y)
                                  for x, y in zip(a, b))


LORA = {"model.lora.rank": 4, "model.lora.targets": ("q", "v")}


def adapters_of(params) -> dict[tuple, np.ndarray]:
  return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(params)
          if path[-1] in ("lora_a", "lora_b")}


def base_of(params) -> list[np.ndarray]:
  """Every parameter but the adapters (with LoRA: the frozen base)."""
  return [np.asarray(x) for x in jax.tree.leaves(nnx.split_state(params, LoraParam, ...)[1])]


# ------------------------------------------------------------------ where the weights are


def make_folders(root, *relative: str) -> None:
  for path in relative:
    os.makedirs(os.path.join(root, path))


@pytest.mark.parametrize("given,found", [
    ("run", "run/checkpoints/7"),              # a run folder: its latest checkpoint
    ("run/checkpoints", "run/checkpoints/7"),  # its checkpoints/: the latest
    ("run/checkpoints/3", "run/checkpoints/3"),  # one step's folder: that step
])
def test_a_checkpoint_is_named_by_its_run_its_checkpoints_or_one_step(tmp_path, given, found):
  make_folders(tmp_path, "run/checkpoints/3/state", "run/checkpoints/7/state",
               "run/checkpoints/9.orbax-checkpoint-tmp-1/state")  # a save never committed
  assert find_weights(str(tmp_path / given)) == Weights(CHECKPOINT, str(tmp_path / found))


@pytest.mark.parametrize("weights_file", ["model.safetensors", "model.safetensors.index.json"])
def test_a_hugging_face_folder_is_named_by_its_folder(tmp_path, weights_file):
  (tmp_path / weights_file).write_text("")
  assert find_weights(str(tmp_path)) == Weights(HF, str(tmp_path))


@pytest.mark.parametrize("folders,problem", [
    (None, "no such path"),
    ([], "holds no weights"),
    (["checkpoints/5.orbax-checkpoint-tmp-1/state"], "holds no weights"),  # never committed
])
def test_a_path_without_weights_fails_at_spec_time_naming_the_key(tmp_path, folders, problem):
  path = tmp_path / "weights"
  if folders is not None:
    path.mkdir()
    make_folders(path, *folders)
  config = tiny_config("smollm2-135m-instruct", "grpo")
  with config.unlocked():
    config.init_from = str(path)
  with pytest.raises(ConfigError, match=f"^config.init_from: .*{problem}"):
    build_run_spec(config)


# ------------------------------------------------------------------ the run starts from them


@pytest.fixture(scope="module")
def other_weights(tiny_model, tmp_path_factory) -> tuple[str, str]:
  """Weights unlike `tiny_model`'s (another random initialisation) as an HF folder, and as
  checkpoint 0 of a run whose optimizer has taken 5 steps."""
  root = tmp_path_factory.mktemp("other_weights")
  model, tokenizer = load_model(tiny_model)
  hf = export_hf(random_model(model.cfg, seed=1), root / "hf", tokenizer)
  source = Trainer(tiny_spec(hf, "grpo", **BARE), str(root / "run"))
  source.state = source.state.replace(step=jnp.asarray(5, jnp.int32))
  source.save()
  source.close()
  assert not same_params(folder_params(hf), folder_params(tiny_model))  # tellable apart
  return hf, str(root / "run")


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("kind", [CHECKPOINT, HF])
def test_a_new_run_starts_from_the_given_weights_with_a_fresh_optimizer(
    tiny_model, other_weights, tmp_path, kind, lora):
  """With LoRA the weights are the frozen base, and the adapters start fresh (a no-op)."""
  hf, run = other_weights
  trainer = Trainer(tiny_spec(tiny_model, "grpo", init_from=run if kind == CHECKPOINT else hf,
                              **BARE, **(LORA if lora else {})), str(tmp_path))
  expected = saved_params(run, 0) if kind == CHECKPOINT else folder_params(hf)
  assert same_params(base_of(trainer.state.params), expected)
  assert int(trainer.state.step) == 0  # the source's optimizer (5 steps) is not taken
  adapters = adapters_of(trainer.state.params)
  assert len(adapters) == (4 if lora else 0)  # A and B on q and v
  assert all(not v.any() for p, v in adapters.items() if p[-1] == "lora_b")
  trainer.close()


def test_a_run_named_relative_to_the_working_directory_is_found_and_read(
    tiny_model, other_weights, tmp_path, monkeypatch):
  """`--init=runs/quickstart`, as the README writes it (orbax read no metadata from a
  relative step folder: AttributeError before the run began)."""
  _, run = other_weights
  monkeypatch.chdir(os.path.dirname(run))
  relative = os.path.basename(run)
  assert find_weights(relative) == Weights(CHECKPOINT, os.path.join(run, "checkpoints", "0"))
  trainer = Trainer(tiny_spec(tiny_model, "grpo", init_from=relative, **BARE),
                    str(tmp_path / "new"))
  assert same_params(trainer_params(trainer), saved_params(run, 0))
  trainer.close()


def test_a_workdir_with_checkpoints_resumes_from_them_not_from_init_from(
    tiny_model, other_weights, tmp_path):
  hf, _ = other_weights
  own = Trainer(tiny_spec(tiny_model, "grpo", **BARE), str(tmp_path))
  own.save()  # checkpoint 0 holds tiny_model's weights
  own.close()
  resumed = Trainer(tiny_spec(tiny_model, "grpo", init_from=hf, **BARE), str(tmp_path))
  assert resumed.maybe_resume()
  assert same_params(trainer_params(resumed), folder_params(tiny_model))
  resumed.close()


def test_a_resumed_run_does_not_read_the_init_from_weights(
    tiny_model, other_weights, tmp_path, monkeypatch):
  hf, _ = other_weights
  own = Trainer(tiny_spec(tiny_model, "grpo", **BARE), str(tmp_path))
  own.save()
  own.close()

  def no_read(*args, **kwargs):
    raise AssertionError("init_from weights read by a run that resumes")
  monkeypatch.setattr(trainer_lib, "initial_params", no_read)  # 16 GB for a 7B model
  resumed = Trainer(tiny_spec(tiny_model, "grpo", init_from=hf, **BARE), str(tmp_path))
  assert resumed.maybe_resume()
  resumed.close()


# ------------------------------------------------------------------ LoRA: base and adapters

def _trained_lora_run(model: str, workdir: str, **overrides) -> Trainer:
  """A LoRA run with a KL reference whose adapters look trained, checkpointed at 0."""
  trainer = Trainer(tiny_spec(model, "grpo", **{"log.tensorboard": False}, **LORA,
                              **overrides), workdir)
  flat = dict(nnx.to_flat_state(trainer.state.params))
  for i, path in enumerate(sorted(adapters_of(trainer.state.params))):
    value = flat[path].get_value()
    flat[path] = flat[path].replace(value + 0.1 * jax.random.normal(jax.random.key(i),
                                                                     value.shape))
  trainer.state = trainer.state.replace(params=nnx.from_flat_state(flat))
  trainer.ref_trainable = jax.tree.map(jnp.copy, split_trainable(trainer.state.params)[0])
  trainer.save()
  trainer.checkpointer.wait()
  return trainer


def test_a_lora_checkpoint_holds_the_adapters_and_resumes_on_its_base(
    tiny_model, other_weights, tmp_path):
  hf, _ = other_weights
  run = _trained_lora_run(tiny_model, str(tmp_path), init_from=hf)
  want = trainer_params(run)
  run.close()
  assert len(saved_params(str(tmp_path), 0)) == 4  # the adapters, not the base
  resumed = Trainer(tiny_spec(tiny_model, "grpo", init_from=hf, **{"log.tensorboard": False},
                              **LORA), str(tmp_path))
  assert resumed.maybe_resume()
  assert same_params(trainer_params(resumed), want)  # the base re-read from init_from
  assert same_params(jax.tree.leaves(resumed._reference_params()), want)
  resumed.close()
  elsewhere = Trainer(tiny_spec(tiny_model, "grpo", **{"log.tensorboard": False}, **LORA),
                      str(tmp_path))
  with pytest.raises(ValueError, match="trained on the base"):
    elsewhere.maybe_resume()  # another base: the adapters would not fit it
  elsewhere.close()


def test_a_lora_checkpoint_starts_a_lora_run_and_is_refused_without_adapters(
    tiny_model, tmp_path):
  source = _trained_lora_run(tiny_model, str(tmp_path / "source"))
  adapters = adapters_of(source.state.params)
  source.close()
  trainer = Trainer(tiny_spec(tiny_model, "grpo", init_from=str(tmp_path / "source"),
                              **BARE, **LORA), str(tmp_path / "lora"))
  got = adapters_of(trainer.state.params)
  assert got.keys() == adapters.keys()
  assert all(np.array_equal(got[p], adapters[p]) for p in adapters)
  assert same_params(base_of(trainer.state.params), folder_params(tiny_model))
  trainer.close()
  with pytest.raises(ValueError, match="holds LoRA adapters.*config.model.lora"):
    Trainer(tiny_spec(tiny_model, "grpo", init_from=str(tmp_path / "source"), **BARE),
            str(tmp_path / "plain"))
