"""What every command (main, generate, play, ...) does around its `main`: a quiet start and
one-line errors.

  from seed_jax import cli

  if __name__ == "__main__":  # first thing: before jax / transformers are imported
    cli.quiet_startup()
  ...
  if __name__ == "__main__":
    cli.run(main)

`quiet_startup` keeps library start-up chatter (XLA's C++ logs, transformers' advisories)
off the terminal; `run` is `absl.app.run` that also keeps absl's INFO logs (jax probing its
backends: "Unable to initialize backend 'tpu'") off unless `--verbosity` is given, and
turns a bad command line into one line on stderr and exit status 2: an unknown flag, a
misspelt config key (with the nearest known key), a value of the wrong type, an unknown
config preset, or an `app.UsageError` raised by `main` (e.g. a config value the run spec
rejects). `--verbosity=N` (or `-v N`) on the command line keeps every log.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Any, Callable, NoReturn, Sequence

from absl import app, flags, logging

USAGE_EXIT_CODE = 2  # as argparse and most Unix tools: the command line was wrong

# Set (unless already set) before the libraries read them, i.e. before their import.
_QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "1",  # XLA / TF C++ logs: warnings and errors, as Python's
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",  # "PyTorch was not found..." (tokenizers suffice)
    "TRANSFORMERS_VERBOSITY": "error",
}


# On a machine without TPU chips, libtpu (installed to compile for TPU slices: seed_jax.plan)
# would ask the Cloud metadata server about the TPU and its workers and print warnings when
# jax probes its backends; told it is alone, it stays quiet. Harmless where there is no TPU.
NO_TPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5p-8",  # any valid type: only compiling is ever done here
    "TPU_WORKER_HOSTNAMES": "localhost",
}


def verbosity_requested(argv: Sequence[str]) -> bool:
  """Whether `argv` sets absl's `--verbosity` (`-v`): the user asked for the logs."""
  return any(re.match(r"^--?(verbosity|v)(=|$)", arg) for arg in argv[1:])


def quiet_startup(argv: Sequence[str] | None = None) -> None:
  """Keeps library start-up chatter off the terminal, unless `--verbosity` is given.

  Call it before jax, transformers (or anything importing them) is imported: they read
  these environment variables once, at import. A variable the user set is left alone.
  """
  if verbosity_requested(sys.argv if argv is None else argv):
    return
  for key, value in _QUIET_ENV.items():
    os.environ.setdefault(key, value)
  if not _has_tpu_chips():
    for key, value in NO_TPU_ENV.items():
      os.environ.setdefault(key, value)


def _has_tpu_chips() -> bool:
  """TPU VMs expose their chips as /dev/accel* (v4, v5e) or VFIO groups (v5p, v6e)."""
  import glob  # pylint: disable=import-outside-toplevel
  return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def fail(message: str) -> NoReturn:
  """Prints `message` as one line on stderr and exits with status 2."""
  sys.stderr.write(" ".join(message.split("\n")).strip() + "\n")
  sys.stderr.flush()
  sys.exit(USAGE_EXIT_CODE)


def run(main: Callable[[list[str]], Any]) -> None:
  """`absl.app.run(main)` with a quiet log level and one-line command-line errors."""

  def quiet_main(argv):
    if not flags.FLAGS["verbosity"].present:  # library INFO chatter only on request
      logging.set_verbosity(logging.WARNING)
    try:
      return main(argv)
    except app.UsageError as e:  # absl would print the whole flag help before the message
      fail(str(e))

  app.run(quiet_main, flags_parser=parse_flags)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses `argv` into `absl.flags.FLAGS`; a bad flag or config key exits via `fail`.

  Returns the arguments left after the flags, as `absl.app.run` expects of its parser.
  """
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    fail(_flag_error_line(e))
  except (KeyError, AttributeError, OSError):
    # ml_collections raises these raw for an override of a key the config lacks, or of a
    # config file that does not load; anything else is a bug and keeps its traceback.
    message = unknown_config_key(argv)
    if message is None:
      raise
    fail(message)
  for name in _config_flag_names():
    try:  # a config file that failed to load only fails when its value is read
      getattr(flags.FLAGS[name].value, "keys", None)
    except OSError:
      fail(_config_file_error(name, _config_flag_value(argv, name)))
  return rest


def _innermost(error: BaseException) -> BaseException:
  """The first exception of the chain: what ml_collections and absl re-wrapped."""
  while (error.__cause__ or error.__context__) is not None:
    error = error.__cause__ or error.__context__
  return error


def _flag_error_line(error: flags.Error) -> str:
  """One line for absl's "flag --NAME=VALUE: REASON" (REASON may hold a traceback)."""
  match = re.match(r"^flag --([^=\s]+)=(.*?): ", str(error), re.S)
  if match is None:
    return str(error).strip().split("\n", 1)[0]
  name, value = match.groups()
  if value == "None" and "must have a value other than None" in str(error):
    return f"--{name} is required"  # flags.mark_flags_as_required
  cause = _innermost(error)  # ml_collections re-raises with the config's traceback in it
  reason = str(error)[match.end():] if cause is error else str(cause)
  reason = reason.strip().split("\n", 1)[0]
  if name in _config_flag_names():  # the config file itself: name the file
    return f"--{name}={value}: {reason}"
  if "." in name and name.split(".", 1)[0] in _config_flag_names():
    return f"{name}: {reason}"  # a config key, named as the config's errors name keys
  return f"--{name}={value}: {reason}"


def _config_flag_names() -> list[str]:
  # ml_collections only on an error path: generate has no config flag to pay for.
  from ml_collections.config_flags import config_flags  # pylint: disable=import-outside-toplevel
  return [name for name in flags.FLAGS if config_flags.is_config_flag(flags.FLAGS[name])]


def _config_flag_value(argv: Sequence[str], name: str) -> str | None:
  """The value given to `--name` in `argv` (`--name=V` or `--name V`; the last one counts,
  as for absl), else None."""
  value = None
  for i, arg in enumerate(argv):
    match = re.match(rf"^--?{re.escape(name)}(=(.*))?$", arg)
    if match:
      if match.group(1) is not None:
        value = match.group(2)
      elif i + 1 < len(argv):
        value = argv[i + 1]
  return value


def _config_file_error(name: str, value: str | None) -> str:
  path = (value or "").split(":", 1)[0]
  if not path:
    return f"--{name}: no config file given"
  if not os.path.isfile(path):
    return f"--{name}={value}: no such file {path!r}"
  return f"--{name}={value}: the config file does not load"


def _overrides(argv: Sequence[str], name: str) -> list[str]:
  """The config keys `argv` overrides, in order: `--config.rl.beta=1` gives `rl.beta`."""
  keys = []
  for arg in argv:
    match = re.match(rf"^--?(?:no)?{re.escape(name)}\.([^=]+)", arg)
    if match:
      keys.append(match.group(1))
  return keys


def _is_group(node: Any) -> bool:
  import ml_collections  # pylint: disable=import-outside-toplevel
  return isinstance(node, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict))


def _paths(node, prefix: str = "") -> list[str]:
  """Every dotted key of a ConfigDict, groups and leaves."""
  out = []
  for key in node.keys():
    out.append(prefix + key)
    if _is_group(node[key]):
      out.extend(_paths(node[key], f"{prefix}{key}."))
  return out


def unknown_config_key(argv: Sequence[str]) -> str | None:
  """"config.KEY: no such key; did you mean config.NEAREST?" for the first override in
  `argv` of a key its config file does not have; None when every key exists (or the
  config cannot be loaded: then the caller's own error stands)."""
  from ml_collections.config_flags import config_flags  # pylint: disable=import-outside-toplevel
  argv = flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False)
  for name in _config_flag_names():
    keys = _overrides(argv, name)
    if not keys:
      continue
    value = _config_flag_value(argv, name)
    path = (value or "").split(":", 1)[0]
    if not path or not os.path.isfile(path):
      return _config_file_error(name, value)
    try:
      config = config_flags.ConfigFileFlagParser(name, lock_config=False).parse(value)
    except Exception:  # pylint: disable=broad-except
      return None  # the config itself is broken: absl's error names it
    if not _is_group(config):
      return None
    for key in keys:
      node, parts = config, key.split(".")
      for depth, part in enumerate(parts):
        if _is_group(node) and part in node:
          node = node[part]
          continue
        full, known = f"{name}.{key}", ".".join([name] + parts[:depth])
        if not _is_group(node):
          return f"{full}: no such key ({known} is a value, not a group)"
        # The whole path against every key: "rl.lamda_opd", "rll.lambda_opd" and
        # "lambda_opd" all find "rl.lambda_opd".
        guess = difflib.get_close_matches(key, _paths(config), n=1, cutoff=0.75)
        return f"{full}: no such key" + (f"; did you mean {name}.{guess[0]}?" if guess else "")
  return None


def mesh_error(mesh: Any, num_devices: int) -> str | None:
  """Why the mesh `config.mesh` asks for cannot be laid over `num_devices` devices, as one
  line naming the `config.mesh.*` keys to change; None when it fits.

  `mesh` has sizes `data`, `fsdp`, `tensor` (a `MeshConfig` or the config's group); one of
  them may be -1 for "the remaining devices". The rule is `MeshConfig.resolved_shape`'s,
  checked here before the model is loaded so that the error is the user's, not a traceback.
  """
  sizes = {axis: getattr(mesh, axis) for axis in ("data", "fsdp", "tensor")}
  for axis, size in sizes.items():
    if isinstance(size, bool) or not isinstance(size, int) or size == 0 or size < -1:
      return f"config.mesh.{axis}: a positive size or -1, got {size!r}"
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    return (f"{', '.join(f'config.mesh.{a}' for a in free)}: at most one mesh axis may be "
            f"-1 (the remaining devices)")
  fixed = {axis: size for axis, size in sizes.items() if size != -1}
  product = 1
  for size in fixed.values():
    product *= size
  blamed = [axis for axis, size in fixed.items() if size != 1] or list(fixed)
  keys = ", ".join(f"config.mesh.{axis}" for axis in blamed)
  shape = " x ".join(f"{axis}={size}" for axis, size in fixed.items() if axis in blamed)
  if free:
    if num_devices % product:
      return (f"{keys}: {shape} does not divide the {_devices(num_devices)} "
              f"(config.mesh.{free[0]}=-1 takes the rest)")
    return None
  if product != num_devices:
    return (f"{keys}: {shape} needs {_devices(product)}, but {_devices(num_devices)} "
            f"{'are' if num_devices != 1 else 'is'} available (-1 on one axis takes the rest)")
  return None


def batch_error(spec: Any, num_devices: int) -> str | None:
  """Why the RL micro-batch cannot be split over the mesh's batch shards (every device
  needs whole rows), as one line naming `config.rl.micro_batch_size`; None when it can.
  Call it after `mesh_error` found the mesh valid."""
  from seed_jax.parallel.rules import logical_to_spec  # pylint: disable=import-outside-toplevel
  sizes = dict(zip(("data", "fsdp", "tensor"), spec.mesh.resolved_shape(num_devices)))
  axes = logical_to_spec(("batch",), spec.mesh.rules)[0] or ()
  axes = axes if isinstance(axes, tuple) else (axes,)
  shards = 1
  for axis in axes:
    shards *= sizes[axis]
  if spec.rl.micro_batch_size % shards:
    return (f"config.rl.micro_batch_size: {spec.rl.micro_batch_size} rows do not split over "
            f"the {shards} batch shards of mesh {sizes} (use a multiple of {shards})")
  return None


def _devices(n: int) -> str:
  return f"{n} device{'s' if n != 1 else ''}"
