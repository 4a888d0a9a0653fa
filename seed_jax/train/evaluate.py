"""The evaluation of a saved checkpoint without training (verl's `val_only`;
`python -m seed_jax.evaluate`). Results per split: `seed_jax.train.results`.

A checkpoint is evaluated by the trainer's own code: `Trainer.restore(step)` (parameters and
the skill library, so Skill-GRPO acts with its library), `Trainer.evaluate(step)` (the eval
splits, at the seed the run used at that iteration) and `Trainer.finish` (the summary the run
writes). Its files go to `RUN/eval/step_N/`: config.json (the config evaluated with),
metrics.jsonl (the `eval` record), summary.json and summary.txt; the run's own files are
left alone.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import ml_collections


def checkpoint_eval_config(config: ml_collections.ConfigDict,
                           splits: Sequence[str] | None = None) -> ml_collections.ConfigDict:
  """A copy of a run's `config` for evaluating one of its checkpoints (on `splits`, default
  the run's `eval.splits`). The checkpoint's weights replace the model's and its skill
  library the library file's, so neither `init_from` nor `analyzer.static_library` is read
  (either may be gone), except a LoRA run's `init_from`: its checkpoints hold the adapters,
  and the frozen base comes from there. The evaluation writes its summary only: no export
  (`--export` says where), no curves, no TensorBoard."""
  config = ml_collections.ConfigDict(config.to_dict())
  lora = config.model.get("lora")  # absent from the configs of runs older than LoRA
  if not (lora and lora.rank):
    config.init_from = ""
  config.analyzer.static_library = ""
  config.checkpoint.export_hf = False
  config.log.plots = config.log.tensorboard = False
  if splits is not None:
    config.eval.splits = tuple(splits)
  return config


def eval_folder(workdir: str, step: int) -> str:
  """Where the evaluation of checkpoint `step` of the run in `workdir` writes its files."""
  return os.path.join(workdir, "eval", f"step_{step}")


def evaluate_checkpoint(spec, workdir: str, step: int, export: str | None = None
                        ) -> dict[str, Any]:
  """Evaluates checkpoint `step` of the run in `workdir` with `spec` (its config through
  `checkpoint_eval_config`); with `export`, also writes that step as an HF folder there.

  Returns:
    The summary the run writes at its end (algorithm, env, iterations, training success so
    far, the evaluation results), also printed and written to `eval_folder(workdir, step)`.
  """
  # Imported here: the trainer loads jax, the models and the envs; reading a run's config
  # (checkpoint_eval_config) needs none of them.
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  trainer = Trainer(spec, eval_folder(workdir, step),
                    checkpoint_dir=os.path.join(workdir, "checkpoints"))
  try:
    trainer.restore(step)
    results = trainer.evaluate(step)
    if export:
      trainer.export(export)
    return trainer.finish(results)
  finally:
    trainer.close()
