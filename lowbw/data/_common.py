"""Helpers shared by the dataset factories."""

import numpy as np

from lowbw import _validate


def eval_fraction(value) -> float:
  """A float in (0, 1): something must be left on each side of the split."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if not (ok and 0 < value < 1):
    raise _validate.fail("eval_fraction", value, "expected a number in (0, 1)")
  return float(value)


def held_out_count(total: int, fraction: float) -> int:
  """How many of ``total`` examples a fraction holds out: at least 1, not all."""
  return int(min(max(1, round(fraction * total)), total - 1))


def frozen(array: np.ndarray) -> np.ndarray:
  """A read-only view: cached arrays are shared by every source built from them."""
  view = array.view()
  view.flags.writeable = False
  return view
