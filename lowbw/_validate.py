"""Build-time checks: every bad value raises a ValueError naming the field, the
value and what is allowed, before anything is traced."""

from collections.abc import Iterable
from typing import Any

import numpy as np


def fail(field: str, value: Any, allowed: str) -> ValueError:
  return ValueError(f"{field}={value!r} is invalid: {allowed}")


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


def positive_float(field: str, value: Any) -> float:
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not 0 < value < float("inf")):
    raise fail(field, value, "expected a finite number > 0")
  return float(value)


def non_empty_str(field: str, value: Any) -> str:
  if not isinstance(value, str) or not value.strip():
    raise fail(field, value, "expected a non-empty name")
  return value


def one_of(field: str, value: Any, choices: Iterable[str]) -> str:
  choices = list(choices)
  if value not in choices:
    raise fail(field, value, "expected one of " + ", ".join(map(repr, choices)))
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
