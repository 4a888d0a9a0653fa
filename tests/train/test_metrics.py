"""metrics.jsonl, TensorBoard events, PNG curves and resume truncation."""

from __future__ import annotations

import os

from seed_jax.metrics import MetricsWriter, format_table, plot_curves, read_metrics


def test_records_plots_and_truncation(tmp_path):
  writer = MetricsWriter(str(tmp_path), tensorboard=True)
  for step in range(1, 5):
    writer.write(step, "train", {"loss": 1.0 / step, "gate_hist": [1, 2, 3], "nan": float("nan")})
  writer.write(4, "eval", {"success": 0.5})
  writer.close()
  records = read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2, 3, 4, 4]
  assert records[0]["nan"] is None and records[0]["gate_hist"] == [1, 2, 3]
  assert os.listdir(tmp_path / "tensorboard")
  paths = plot_curves(str(tmp_path), {"train": ["loss"], "eval": ["success"]})
  assert [os.path.basename(p) for p in paths] == ["curves_train.png", "curves_eval.png"]
  assert all(open(p, "rb").read(4) == b"\x89PNG" for p in paths)
  writer = MetricsWriter(str(tmp_path), tensorboard=False)
  writer.truncate_after(2)
  assert [r["step"] for r in read_metrics(writer.path)] == [1, 2]


def test_a_torn_last_line_is_ignored(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "phase": "train"}\n{"step": 2, "pha')
  assert read_metrics(str(path)) == [{"step": 1, "phase": "train"}]


def test_summary_table():
  table = format_table([("success", 0.25), ("iterations", 3)], "summary")
  assert table.splitlines()[0] == "summary" and "0.25" in table and "iterations" in table
