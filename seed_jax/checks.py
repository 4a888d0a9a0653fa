"""Field checks for the frozen specs that configure each component.

A spec validates itself in `__post_init__` with `require`; a bad value raises `SpecError`
naming the field. `seed_jax.train.spec` builds the specs from the run's ConfigDict and turns
a `SpecError` into a `ConfigError` naming the config key the field came from, so a run
fails before anything is loaded or compiled, whichever way the spec was made.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


class SpecError(ValueError):
  """A bad spec field: `field` is its name, `problem` what is wrong with its value."""

  def __init__(self, field: str, problem: str):
    super().__init__(f"{field}: {problem}")
    self.field, self.problem = field, problem


def require(spec: Any, fields: str | Iterable[str], ok: Callable[[Any], bool],
            want: str) -> None:
  """Raises `SpecError(field, "<want>, got <value>")` for the first field failing `ok`."""
  for field in [fields] if isinstance(fields, str) else fields:
    value = getattr(spec, field)
    if not ok(value):
      raise SpecError(field, f"{want}, got {value!r}")


def _number(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v > 0


def non_negative_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def positive(v: Any) -> bool:
  return _number(v) and v > 0


def non_negative(v: Any) -> bool:
  return _number(v) and v >= 0


def fraction(v: Any) -> bool:
  """In [0, 1)."""
  return _number(v) and 0 <= v < 1


def unit_interval(v: Any) -> bool:
  """In [0, 1]."""
  return _number(v) and 0 <= v <= 1


def one_of(choices: Iterable[Any]) -> Callable[[Any], bool]:
  choices = tuple(choices)
  return lambda v: v in choices
