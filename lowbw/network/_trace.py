"""Fleet traces: per-worker speeds or bandwidths that change over simulated
time, read from a CSV file.

A trace file has a header and one row per change::

    time,w0,w1,w2,w3
    0,1,1,1,1
    30min,1,1,1,0.25
    2h,1,1,1,1

The first column is the simulated time the row takes effect (seconds, or a
duration such as ``30min``); the others hold one value per worker, in
worker order (a speed multiplier, or a bandwidth such as ``100Mbps``). A
row's values hold until the next row's time; the last row's hold to the end
of the run (piecewise constant). The first row must be at time 0, so the
trace covers the run from its start.
"""

import bisect
import csv
import os
from typing import NamedTuple

from lowbw import _validate
from lowbw.network import _units


class Trace(NamedTuple):
  """Values per worker over simulated time.

  Attributes:
    times: the seconds each row takes effect, increasing, the first 0.
    values: one tuple of per-worker values per row.
    source: the file it was read from ("" when made in Python).
  """

  times: tuple[float, ...]
  values: tuple[tuple[float, ...], ...]
  source: str = ""

  @property
  def columns(self) -> int:
    return len(self.values[0])

  def at(self, t: float) -> tuple[float, ...]:
    """The values in force at time ``t`` (a binary search: pricing asks
    this at every change time, so a linear scan made long traces
    quadratic)."""
    return self.values[max(bisect.bisect_right(self.times, t) - 1, 0)]

  def describe(self) -> dict:
    return {"trace": self.source or "python", "times_s": list(self.times),
            "values": [list(v) for v in self.values]}


def is_trace(value) -> bool:
  """Whether a setting's value names a trace (a ``Trace`` or a .csv
  path)."""
  return isinstance(value, Trace) or (
      isinstance(value, (str, os.PathLike)) and
      str(value).strip().lower().endswith(".csv"))


def trace(value, field: str, parse) -> Trace:
  """A ``Trace`` from a .csv path (or a ``Trace``), each value read by
  ``parse(text, field)``; errors name ``field`` and the file's row."""
  if isinstance(value, Trace):
    return _check(value, field)
  path = str(value).strip()
  try:
    # utf-8-sig: a spreadsheet's byte-order mark is not part of the header.
    with open(path, newline="", encoding="utf-8-sig") as f:
      reader = csv.reader(f)
      rows = [(reader.line_num, r) for r in reader
              if any(c.strip() for c in r)]
  except OSError as e:
    raise _validate.fail(field, path, f"cannot read the trace file "
                         f"({e.strerror or e})") from None
  except UnicodeDecodeError as e:
    raise _validate.fail(field, path, f"the trace file is not UTF-8 text "
                         f"(byte {e.start}); save it as UTF-8 CSV") from None
  if len(rows) < 2:
    raise _validate.fail(field, path, "a trace needs a header row and at "
                         "least one row of values (time, one per worker)")
  header, body = rows[0][1], rows[1:]
  times, values = [], []
  for n, row in body:
    if len(row) != len(header):
      raise _validate.fail(field, path, f"line {n} has {len(row)} columns, "
                           f"the header {len(header)}")
    where = f"{field} (line {n} of {path})"
    times.append(_time(row[0].strip(), where))
    values.append(tuple(parse(c.strip(), where) for c in row[1:]))
  return _check(Trace(tuple(times), tuple(values), path), field)


def _time(text: str, field: str) -> float:
  """Seconds from a bare number or a duration ("30min")."""
  try:
    seconds = float(text)
  except ValueError:
    return _units.duration(text, field)
  if not 0 <= seconds < float("inf"):
    raise _validate.fail(field, text, "expected a time >= 0")
  return seconds


def _check(t: Trace, field: str) -> Trace:
  shown = t.source or "trace"
  if not t.values or not t.values[0]:
    raise _validate.fail(field, shown, "a trace needs at least one row with "
                         "a value per worker")
  if t.times[0] != 0:
    raise _validate.fail(field, shown, f"the trace starts at "
                         f"{t.times[0]:g} s, so it does not cover the run's "
                         "start: its first row must be at time 0")
  if any(b <= a for a, b in zip(t.times, t.times[1:])):
    raise _validate.fail(field, shown, "the trace's times must increase "
                         "from row to row")
  if any(len(v) != len(t.values[0]) for v in t.values):
    raise _validate.fail(field, shown, "every row needs the same number of "
                         "values")
  return t


def speed(text: str, field: str) -> float:
  """A speed multiplier > 0 (0 would never finish a step)."""
  try:
    v = float(text)
  except ValueError:
    raise _validate.fail(field, text, "expected a speed > 0") from None
  if not 0 < v < float("inf"):
    raise _validate.fail(field, text, "expected a speed > 0 (a worker of "
                         "speed 0 never finishes a step)")
  return v


def bandwidth(text: str, field: str) -> float:
  return _units.bandwidth(text, field)


def change_times(*traces: "Trace | None") -> list[float]:
  """Every time any of ``traces`` changes, from 0, sorted."""
  return sorted({0.0}.union(*(t.times for t in traces if t is not None)))
