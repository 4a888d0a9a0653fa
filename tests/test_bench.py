"""bench/run_all.py writes the benchmarks page (and reports a failing bench on it rather than
stopping); bench/device_check.py's `--tiny` path runs on a CPU and prints its one line."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from bench import run_all

REPO = pathlib.Path(__file__).resolve().parents[1]
HEADINGS = ("# Benchmarks", "## Forward", "## Train step", "## Sampler", "## Environments",
            "## One training iteration", "## TPU plans for the paper's models",
            "## Device check: NVIDIA H200", "## Raw results")


def _run_all(tmp_path, *args) -> str:
  out = tmp_path / "benchmarks.md"
  subprocess.run([sys.executable, "bench/run_all.py", "--quick", f"--out={out}",
                  f"--device_check={tmp_path / 'none.json'}", *args],
                 cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
  return out.read_text()


def test_quick_forward_writes_the_page(tmp_path):
  page = _run_all(tmp_path, "--only=forward")
  for heading in HEADINGS:
    assert f"\n{heading}\n" in f"\n{page}", heading
  forward = page.split("## Forward", 1)[1].split("\n## ", 1)[0]
  assert "matmul peak, measured in the same run" in forward
  assert "| 1 x 16 |" in forward
  command = page.split("```bash\n", 1)[1].split("\n", 1)[0]  # the regenerating command
  assert "bench/run_all.py --quick" in command and "--only=forward" in command
  assert "Quick mode" in page
  assert "Not measured: no accelerator was lent" in page
  assert '{"bench": "forward"' in page.split("## Raw results", 1)[1]


def test_a_failing_bench_is_reported_not_raised(tmp_path):
  page = _run_all(tmp_path, "--only=forward", "--extra=forward:--no_such_flag")
  forward = page.split("## Forward", 1)[1].split("\n## ", 1)[0]
  assert "**Failed**" in forward
  assert "no_such_flag" in forward  # the error line, not absl's generic hint
  assert "| forward | **failed** |" in page


def test_plans_render_as_a_table(tmp_path):
  plan = {"target": "v5p:2x2x1", "devices": 4, "hbm_per_device": 95 * run_all.GiB,
          "fits": True, "programs": [
              {"name": "train_step", "shapes": "16 x 2560", "total_bytes": 19 * run_all.GiB,
               "tokens": 40960, "est_seconds": 0.5},
              {"name": "decode_acting", "shapes": "64 x 512", "total_bytes": run_all.GiB,
               "tokens": 32768, "est_seconds": None}]}
  (tmp_path / "qwen2.5-7b-instruct.json").write_text(json.dumps(plan))
  text = "\n".join(run_all.render_plans(str(tmp_path)))
  assert "### qwen2.5-7b-instruct" in text
  assert "| train_step | 16 x 2560 | 19.00 | 20 | 0.5 | 81,920 |" in text
  assert "| decode_acting | 64 x 512 | 1.00 | 1 | - | - |" in text


def test_plans_of_one_model_are_told_apart_by_slice_and_file(tmp_path):
  program = {"name": "train_step", "shapes": "16 x 2560", "total_bytes": run_all.GiB,
             "tokens": 40960, "est_seconds": 0.5}
  for name, target, complete in (("q7_v5p8", "v5p:2x2x1", True),
                                 ("q7_v5p64", "v5p:2x4x4", False)):
    plan = {"model": "qwen2.5-7b-instruct", "target": target, "devices": 4,
            "hbm_per_device": 95 * run_all.GiB, "fits": True, "complete": complete,
            "programs": [program]}
    (tmp_path / f"{name}.json").write_text(json.dumps(plan))
  text = "\n".join(run_all.render_plans(str(tmp_path)))
  assert "### qwen2.5-7b-instruct @ v5p:2x2x1 (`q7_v5p8.json`)" in text
  assert "### qwen2.5-7b-instruct @ v5p:2x4x4 (`q7_v5p64.json`)" in text
  partial = text.split("q7_v5p64.json", 1)[1]
  assert "partial: 1 program planned" in partial
  assert "partial" not in text.split("q7_v5p64.json", 1)[0]


@pytest.mark.slow
def test_device_check_tiny_runs_on_cpu_and_renders(tmp_path):
  done = subprocess.run([sys.executable, "bench/device_check.py", "--tiny"], cwd=REPO,
                        check=True, capture_output=True, text=True, timeout=300)
  lines = [l for l in done.stdout.splitlines() if l.strip()]
  assert len(lines) == 1
  record = json.loads(lines[0])
  assert {"date", "device", "jax", "model", "matmul", "train", "sampler",
          "peak_memory_gib", "reference_peak_tflops"} <= set(record)
  assert record["model"] == "qwen2.5-1.5b-instruct" and record["tiny"]
  assert record["matmul"]["tflops"] > 0 and record["matmul"]["stream_gbps"] > 0
  for name, remat in (("train", "full"), ("train_projections", "projections")):
    train = record[name]
    assert {"tokens_per_s", "mfu", "fraction_of_measured_matmul", "step_s"} <= set(train)
    assert train["loss_finite"] and train["remat"] == remat
  assert set(record["sampler"]["batches"]) == {"2", "4"}
  for batch in record["sampler"]["batches"].values():
    assert batch["tok_s"] > 0 and 0 < batch["roofline_fraction"]
    assert batch["roofline_tok_s"] <= batch["weight_limit_tok_s"]
  # The page shows it once it sits where run_all looks.
  path = tmp_path / "device_check.json"
  path.write_text(lines[0])
  text = "\n".join(run_all.render_device_check(str(path)))
  assert "train step, remat projections: MFU" in text
  assert "sampler decoding alone, batch 4" in text and "of its roofline" in text


def test_the_decode_roofline_is_the_lower_of_the_bandwidth_and_compute_limits():
  from bench.common import decode_roofline
  # 4 rows; a step reads 100 bytes (60 of weights) and does 40 FLOPs. At 1,000 B/s the
  # bandwidth allows 10 steps/s = 40 tokens/s; at 200 FLOP/s compute allows 5 steps/s = 20.
  cost = {"weight_bytes": 60, "kv_bytes": 40, "step_bytes": 100, "step_flops": 40}
  r = decode_roofline(4, decode_tok_s=10.0, cost=cost, bandwidth=1000.0, peak_flops=200.0)
  assert r["bandwidth_limit_tok_s"] == 40.0 and r["compute_limit_tok_s"] == 20.0
  assert r["roofline_tok_s"] == 20.0 and r["roofline_fraction"] == 0.5
  assert r["weight_limit_tok_s"] == pytest.approx(4 * 1000 / 60, abs=0.05)
  assert r["weight_fraction"] == pytest.approx(10 / (4000 / 60), abs=1e-3)
  # 10 tokens/s of 4 rows = 2.5 steps/s, each reading 100 bytes.
  assert r["achieved_gbps"] == pytest.approx(250e-9, abs=0.01)


def test_the_device_check_carries_the_last_checks_headline():
  from bench import device_check
  last = {"date": "2026-11-30 18:23 UTC", "tiny": False, "matmul": {"tflops": 768.0},
          "train": {"tokens_per_s": 34587.0, "mfu": 0.3854},
          "sampler": {"batches": {"64": {"tok_s": 8738.1, "decode_tok_s": 14359.3}}}}
  assert device_check.headline(last) == {
      "date": "2026-11-30 18:23 UTC", "matmul_tflops": 768.0, "train_tokens_per_s": 34587.0,
      "train_mfu": 0.3854, "sampler_tok_s": {"64": 8738.1},
      "sampler_decode_tok_s": {"64": 14359.3}}


def test_the_turn_barrier_utilisation_counts_live_rows_times_the_longest():
  from bench.common import barrier_utilisation  # bench/rollout.py's figure
  # Turn 0: rows of 4, 2, 2 decode 3 x 4 = 12 slots for 8 tokens; turn 1: the first two
  # episodes are live, 1 and 3 tokens: 2 x 3 = 6 slots for 4 tokens; turn 2: one row, full.
  lengths = [[4, 1, 5], [2, 3], [2]]
  assert barrier_utilisation(lengths) == pytest.approx((8 + 4 + 5) / (12 + 6 + 5))
  assert barrier_utilisation([[7, 7], [7]]) == 1.0


def test_decode_steps_with_and_without_the_barrier():
  from bench.common import decode_steps  # bench/rollout.py's bound
  # With the barrier: turns of 4, 3 and 5 steps. Without: episode 0's 4 + 1 + 5 = 10 steps.
  assert decode_steps([[4, 1, 5], [2, 3], [2]]) == dict(barrier=12, critical_path=10)
  # One episode long at every turn: no loop is faster than it.
  assert decode_steps([[9, 9], [1, 1], [1, 1]]) == dict(barrier=18, critical_path=18)
