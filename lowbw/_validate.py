"""Build-time checks: every bad value raises a ``ConfigError`` (a ValueError)
naming the field, the value and what is allowed, before anything is traced."""

import difflib
import os
from collections.abc import Iterable
from typing import Any

import numpy as np


class ConfigError(ValueError):
  """A setting's value is not allowed.

  A ``ValueError``, so ``except ValueError`` still catches it; its parts are
  attributes, so a caller (the command line) can name the setting its own way
  without re-reading the text.

  Attributes:
    field: the setting's name as the Python API spells it (``num_workers``).
    value: the value given.
    allowed: what is allowed instead (a sentence).
  """

  def __init__(self, field: str, value: Any, allowed: str):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f"{field}={value!r} is invalid: {allowed}")

  def __reduce__(self):  # picklable across processes (sweeps, bench)
    return type(self), (self.field, self.value, self.allowed)


def fail(field: str, value: Any, allowed: str) -> ConfigError:
  return ConfigError(field, value, allowed)


def existing_file(field: str, path: Any, what: str = "a file") -> str:
  """``path`` (as a str) when it is a regular file; otherwise an error that
  says what is there instead: nothing, a folder, or a device such as
  /dev/null (which reads as empty and would pass for an empty file)."""
  path = os.fspath(path)
  if os.path.isfile(path):
    return path
  if os.path.isdir(path):
    raise fail(field, path, f"is a folder; expected {what}")
  if os.path.exists(path):
    raise fail(field, path, "is not a regular file (a device, pipe or "
               f"socket); expected {what}")
  raise fail(field, path, f"no such file; expected {what}")


def renamed(error: ConfigError, names: dict[str, str]) -> ConfigError:
  """``error`` with its field renamed by ``names`` (a caller that knows the
  setting by another name: a flag, a factory's keyword)."""
  return fail(names.get(error.field, error.field), error.value, error.allowed)


def suggest(word: str, options: Iterable[str]) -> str:
  """" (did you mean 'x'?)" for the options closest to ``word`` (letter
  case aside: ``DiLoCo`` finds ``diloco``), or ""."""
  options = [str(o) for o in options]
  lowered = {}
  for o in options:
    lowered.setdefault(o.lower(), o)
  close = difflib.get_close_matches(str(word).lower(), list(lowered), n=3,
                                    cutoff=0.6)
  if not close:
    return ""
  return " (did you mean " + " or ".join(repr(lowered[c]) for c in close) + "?)"


INT_LIMIT = 2 ** 31  # counts and sizes are int32 on device


def positive_int(field: str, value: Any) -> int:
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or value < 1):
    raise fail(field, value, "expected an integer >= 1")
  if value >= INT_LIMIT:
    raise fail(field, value, "expected an integer below 2**31")
  return int(value)


def optional_positive_int(field: str, value: Any) -> int | None:
  return None if value is None else positive_int(field, value)


def fraction(field: str, value: Any, *, low_open: bool = True) -> float:
  """A float in (0, 1] (or [0, 1] with ``low_open=False``)."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if ok:
    ok = (0 < value <= 1) if low_open else (0 <= value <= 1)
  if not ok:
    raise fail(field, value, "expected a number in (0, 1]" if low_open else
               "expected a number in [0, 1]")
  return float(value)


def identifier(field: str, value: Any, what: str) -> str:
  """A name a user registers (``what``: "codec stage", "model"): letters,
  digits and ``_``, so that specs, flags and files can carry it."""
  if not (isinstance(value, str) and value.replace("_", "a").isalnum()):
    raise fail(field, value, f"expected a {what} name of letters, digits "
               "and _")
  return value


def boolean(field: str, value: Any) -> bool:
  """``True`` or ``False`` (numpy booleans accepted), not a truthy value."""
  if not isinstance(value, (bool, np.bool_)):
    raise fail(field, value, "expected True or False")
  return bool(value)


def positive_float(field: str, value: Any) -> float:
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not 0 < value < float("inf")):
    raise fail(field, value, "expected a finite number > 0")
  return float(value)


def finite_float(field: str, value: Any) -> float:
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not abs(value) < float("inf")):
    raise fail(field, value, "expected a finite number")
  return float(value)


def non_empty_str(field: str, value: Any) -> str:
  if not isinstance(value, str) or not value.strip():
    raise fail(field, value, "expected a non-empty name")
  return value


def one_of(field: str, value: Any, choices: Iterable[str]) -> str:
  choices = list(choices)
  if value not in choices:
    raise fail(field, value, "expected one of " + ", ".join(map(repr, choices))
               + suggest(value, choices))
  return value


def non_negative(field: str, value: Any) -> float:
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not 0 <= value < float("inf")):
    raise fail(field, value, "expected a finite number >= 0")
  return float(value)


def non_negative_int(field: str, value: Any) -> int:
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or value < 0):
    raise fail(field, value, "expected an integer >= 0")
  if value >= INT_LIMIT:
    raise fail(field, value, "expected an integer below 2**31")
  return int(value)


def momentum(field: str, value: Any) -> float:
  """A decay factor in [0, 1)."""
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not 0 <= value < 1):
    raise fail(field, value, "expected a number in [0, 1)")
  return float(value)
