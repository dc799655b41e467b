"""Exact sums of per-step floats.

A row's mean training loss is an exact sum rounded once, so it does not depend
on how the steps were split into chunks, checkpoints or (on a resume that
re-spaces the rows) windows: an interrupted run logs bit for bit what an
uninterrupted one does. Sums are ``Fraction``s (JSON: their text), or floats
once a value was NaN or infinite.
"""

from fractions import Fraction

import numpy as np

Sum = Fraction | float
ZERO = Fraction(0)


class ExactCumsum:
  """Cumulative sums of an (n,) float array; ``span(prev, j)`` is the exact
  sum of ``values[prev + 1 : j + 1]``.

  Vectorized: each value is an integer times a power of two; they are shifted
  to the smallest power present and summed as int64 (Python integers when
  that could overflow), so the cost is numpy's, not a loop over steps.
  """

  def __init__(self, values):
    v = np.asarray(values, np.float64)
    self.exact = bool(np.isfinite(v).all())
    if not self.exact:
      self.cum, self.scale = np.cumsum(v), None
      return
    mantissa, exponent = np.frexp(v)
    # Device values are float32: 24 significant bits leave int64 room.
    bits = 24 if np.array_equal(v.astype(np.float32), v) else 53
    ints = (mantissa * float(2 ** bits)).astype(np.int64)
    nonzero = ints != 0
    low = int(exponent[nonzero].min()) if nonzero.any() else 0
    shift = np.where(nonzero, exponent - low, 0)
    self.scale = Fraction(2) ** (low - bits)
    if shift.size and bits + int(shift.max()) + v.size.bit_length() > 62:
      ints, shift = ints.astype(object), shift.astype(object)
    self.cum = np.cumsum(ints << shift)

  def span(self, prev: int, j: int) -> Sum:
    total = self.cum[j] - (self.cum[prev] if prev >= 0 else 0)
    if not self.exact:
      return float(total)
    return Fraction(int(total)) * self.scale


def mean(total: Sum, n: int) -> float:
  """``total / n`` rounded once."""
  return float(total / n)


def to_json(total: Sum):
  return str(total) if isinstance(total, Fraction) else float(total)


def from_json(value) -> Sum:
  return Fraction(value) if isinstance(value, str) else float(value)
