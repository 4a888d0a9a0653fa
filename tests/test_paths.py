"""A run's files under a local or a `gs://` workdir (seed_jax/paths.py and its writers).

`gs://` goes to an in-memory fake of GCS: etils.epath's fsspec backend gets an fsspec
memory filesystem registered for the "gs"/"gcs" protocols that, like GCS, cannot append
to an object. The tests run from an empty current folder and check it stays empty: the
old `os.path.abspath("gs://b/run")` wrote to `./gs:/b/run`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os

import pytest
from etils import epath
from fsspec.implementations.memory import MemoryFileSystem

from seed_jax import metrics, paths
from seed_jax.seed.analysis_file import write_analysis_file
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.train import stage1


class FakeGCS(MemoryFileSystem):
  """GCS as far as the writers can tell: gs:// URIs, objects written whole, no append."""
  protocol = ("gs", "gcs")
  store: dict = {}
  pseudo_dirs = [""]

  @classmethod
  def _strip_protocol(cls, path):
    return super()._strip_protocol(str(path).removeprefix("gs://"))

  def _open(self, path, mode="rb", **kwargs):
    if "a" in mode:
      raise NotImplementedError("GCS objects cannot be appended to")
    return super()._open(path, mode, **kwargs)


@pytest.fixture
def gcs(monkeypatch, tmp_path):
  """The fake GCS, and an empty current folder that must stay empty."""
  from etils.epath import backend, gpath  # pylint: disable=import-outside-toplevel
  FakeGCS.store.clear()
  FakeGCS.pseudo_dirs[:] = [""]
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # epath's fsspec backend
  registry = importlib.import_module("fsspec.registry")  # (`fsspec.registry` is a view)
  for protocol in FakeGCS.protocol:
    monkeypatch.setitem(registry._registry, protocol, FakeGCS)  # pylint: disable=protected-access
  get_filesystem = backend._FileSystemSpecBackend._get_filesystem  # pylint: disable=protected-access
  get_filesystem.cache_clear()
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  yield FakeGCS.store
  get_filesystem.cache_clear()
  assert not os.listdir(cwd), "a gs:// path was written as a local folder"


def test_local_paths_become_absolute_and_uris_stay_as_given(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(paths.run_path("runs/x")) == str(tmp_path / "runs" / "x")
  assert os.fspath(paths.run_path("gs://bucket/run")) == "gs://bucket/run"
  assert os.fspath(paths.run_path(epath.Path("gs://bucket/run")) / "a.json") == (
      "gs://bucket/run/a.json")
  assert paths.is_remote("gs://bucket/run") and paths.is_remote(epath.Path("s3://b/r"))
  assert not paths.is_remote("runs/gs:/x") and not paths.is_remote(tmp_path)


def test_write_text_replaces_a_local_file_whole(tmp_path):
  path = paths.write_text(tmp_path / "a" / "b.json", "new")
  assert path.read_text() == "new" and os.listdir(tmp_path / "a") == ["b.json"]


def test_metrics_summary_and_plots_go_to_a_gs_workdir(gcs):
  workdir = "gs://bucket/run"  # (the writers take a str or an epath.Path)
  writer = metrics.MetricsWriter(epath.Path(workdir), tensorboard=False, flush_every_s=3600)
  for step in (1, 2, 3):
    writer.write(step, "train", {"loss": 1.0 / step, "success": 0.5})
  assert not epath.Path(workdir, "metrics.jsonl").exists()  # buffered: no append on GCS
  writer.flush()
  assert [r["step"] for r in metrics.read_metrics(f"{workdir}/metrics.jsonl")] == [1, 2, 3]
  assert "/bucket/run/metrics.jsonl" in gcs  # the object, in the fake GCS
  writer.close()

  resumed = metrics.MetricsWriter(workdir, tensorboard=False)  # a resumed run
  resumed.truncate_after(2)
  resumed.write(3, "train", {"loss": 0.25})
  resumed.close()
  records = metrics.read_metrics(epath.Path(workdir) / "metrics.jsonl")
  assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 0.25)]

  table = metrics.write_summary(workdir, {"success": 0.25})
  assert "0.25" in table
  assert json.loads(epath.Path(workdir, "summary.json").read_text()) == {"success": 0.25}
  [png] = metrics.plot_curves(workdir, {"train": ["loss"]})
  assert png == "gs://bucket/run/curves_train.png"
  assert epath.Path(png).read_bytes()[:4] == b"\x89PNG"


def test_tensorboard_is_skipped_with_a_warning_where_it_cannot_write(gcs, monkeypatch, caplog):
  from tensorboardX import record_writer  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(record_writer, "GCS_ENABLED", False)  # google-cloud-storage missing
  with caplog.at_level(logging.WARNING):
    writer = metrics.MetricsWriter("gs://bucket/run", tensorboard=True)
  assert writer._tb is None and "TensorBoard is off" in caplog.text  # pylint: disable=protected-access
  writer.write(1, "train", {"loss": 1.0})
  writer.close()
  assert len(metrics.read_metrics("gs://bucket/run/metrics.jsonl")) == 1


def test_stage1_files_and_analysis_files_go_to_a_gs_workdir(gcs):
  folder = epath.Path("gs://bucket/run/stage1")
  record = {"task_id": "t", "task_type": "pick", "won": True, "transcript": {},
            "answer": "{}"}
  stage1.save_stage1(folder, [record], {"pick": "open it first"})
  assert stage1.load_stage1(folder) == ([record], {"pick": "open it first"})
  assert stage1.load_library_file(f"{folder}/library.json") == {"pick": "open it first"}

  traj = Trajectory(task_id="t", group_id="g", traj_id="0", won=True, episode_reward=1.0,
                    steps=[StepRecord(prompt_ids=[1], response_ids=[2], sampler_logprobs=[0.0])],
                    skill="open it first", info={"task_type": "pick"})
  path = write_analysis_file(epath.Path("gs://bucket/run"), 2, [traj])
  assert path == "gs://bucket/run/analysis/iter_2.jsonl"
  [line] = epath.Path(path).read_text().splitlines()
  assert json.loads(line)["skill"] == "open it first"


def test_a_local_only_writer_fills_a_gs_folder_through_a_local_one(gcs):
  epath.Path("gs://bucket/run/export/stale.bin").parent.mkdir(parents=True, exist_ok=True)
  epath.Path("gs://bucket/run/export/stale.bin").write_bytes(b"old")
  with paths.local_folder("gs://bucket/run/export") as local:
    assert not paths.is_remote(local)
    os.makedirs(os.path.join(local, "tokenizer"))
    with open(os.path.join(local, "model.bin"), "wb") as f:
      f.write(b"weights")
    with open(os.path.join(local, "tokenizer", "vocab.json"), "w") as f:
      f.write("{}")
  export = epath.Path("gs://bucket/run/export")
  assert sorted(p.name for p in export.iterdir()) == ["model.bin", "tokenizer"]
  assert (export / "model.bin").read_bytes() == b"weights"
  assert (export / "tokenizer" / "vocab.json").read_text() == "{}"
  with paths.local_folder("gs://bucket/run/export"):
    pass  # a host that writes nothing (not the primary) leaves the folder alone
  assert (export / "model.bin").exists()


def test_a_local_destination_is_written_in_place(tmp_path):
  with paths.local_folder(tmp_path / "export") as local:
    assert local == str(tmp_path / "export")
