"""Where seed_jax keeps what it generates or converts once (models, games, corpora), and
how a run writes into its workdir, which may be a local folder or a `gs://bucket/run` URI.

Every file of a run goes through `etils.epath` (as orbax's checkpoints do), so one code
path writes to a local disk and to an object store. The differences that matter are kept
here: an object store has no rename (a "rename" is a copy and a delete) but commits an
object whole when it is closed, and it cannot append to an object.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import tempfile
from typing import Iterator

from etils import epath

PathLike = str | os.PathLike

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def cache_root() -> pathlib.Path:
  """`$SEED_JAX_CACHE`, or `~/.cache/seed_jax`."""
  root = os.environ.get("SEED_JAX_CACHE")
  return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "seed_jax"


def is_remote(path: PathLike) -> bool:
  """True for a URI such as `gs://bucket/run` (an object store), False for a local path."""
  return bool(_URI.match(os.fspath(path)))


def run_path(path: PathLike) -> epath.Path:
  """`path` as an `epath.Path`: a local path made absolute (it then means the same after a
  chdir and in logs), a URI left exactly as given (`os.path.abspath` would turn
  `gs://b/run` into `/cwd/gs:/b/run`)."""
  if is_remote(path):
    return epath.Path(os.fspath(path))
  return epath.Path(os.path.abspath(os.fspath(path)))


def write_text(path: PathLike, text: str) -> epath.Path:
  """Writes `text` to `path` whole, making its folder; a reader never sees half a file.

  Locally through a temporary sibling and a rename (a killed run leaves the old file);
  on an object store directly, since an object appears only once it is closed whole.
  """
  path = run_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(path):
    path.write_text(text)
    return path
  tmp = path.parent / (path.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(path)
  return path


@contextlib.contextmanager
def local_folder(destination: PathLike) -> Iterator[str]:
  """A local folder path for code that writes only local files (safetensors, tokenizers):
  `destination` itself when it is local; else a path in a temporary folder, whose files
  are copied to `destination` (replacing it) on success, if the code wrote any there
  (a host other than the primary writes nothing and must not replace the primary's)."""
  destination = run_path(destination)
  if not is_remote(destination):
    yield os.fspath(destination)
    return
  with tempfile.TemporaryDirectory(prefix="seed_jax-") as tmp:
    local = os.path.join(tmp, destination.name)
    yield local
    if os.path.isdir(local):
      copy_tree(local, destination)


def copy_tree(source: PathLike, destination: PathLike) -> None:
  """Copies the local folder `source` to `destination` (any epath), replacing it."""
  destination = run_path(destination)
  if destination.exists():
    destination.rmtree()
  for root, _, files in os.walk(source):
    target = destination / os.path.relpath(root, source)
    target.mkdir(parents=True, exist_ok=True)
    for name in files:
      (target / name).write_bytes(pathlib.Path(root, name).read_bytes())
