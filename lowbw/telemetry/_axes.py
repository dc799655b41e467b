"""Plot axes for metric columns: a label with the unit that suits the
values (seconds or hours, kB or GB), and whether a log scale suits them."""

import math
from typing import NamedTuple

from lowbw.telemetry._writers import WriteError

# Columns with units: (axis label, [(unit, scale)] from the largest unit).
_TIME = [("h", 1 / 3600), ("min", 1 / 60), ("s", 1.0), ("ms", 1e3)]
_BYTES = [("GB", 1e-9), ("MB", 1e-6), ("kB", 1e-3), ("B", 1.0)]
_UNITS = {"sim_time_s": ("simulated time", _TIME),
          "wall_time_s": ("wall-clock time", _TIME),
          "payload_bytes": ("payload bytes per worker", _BYTES),
          "wire_bytes": ("wire bytes per worker", _BYTES),
          "peak_step_bytes": ("peak wire bytes of one step per worker",
                              _BYTES)}
# Columns without a unit, in words.
_WORDS = {"lr": "learning rate", "eval_accuracy": "eval accuracy (fraction)",
          "worker_divergence": "worker divergence (param distance)"}


class Axis(NamedTuple):
  """How to draw one column: label with unit, scale to that unit, log."""
  label: str
  scale: float
  log: bool


def axis_unit(column: str, largest: float) -> tuple[str, float]:
  """The label and scale of ``column``'s axis: the largest unit in which
  the largest value is at least 1 (seconds for a 40 s run, hours for a
  3-hour one). Other bytes (``*_bytes``) and seconds (``*_s``) columns are
  read from their suffix; the rest are named in words."""
  if column in _UNITS:
    name, units = _UNITS[column]
  elif column.endswith("_bytes"):
    name, units = column[:-len("_bytes")].replace("_", " ") + " bytes", _BYTES
  elif column.endswith("_s"):
    name, units = column[:-len("_s")].replace("_", " "), _TIME
  else:
    return _WORDS.get(column, column.replace("_", " ")), 1.0
  unit, scale = next(((u, s) for u, s in units if largest * s >= 1),
                     units[-1])
  return f"{name} ({unit})", scale


def spans_decades(values) -> bool:
  """A log axis suits ``values``: all positive, the largest at least 10
  times the smallest."""
  values = [v for v in values if not math.isnan(v)]
  return bool(values) and min(values) > 0 and max(values) >= 10 * min(values)


def axis(column: str, values, log: bool | None = None) -> Axis:
  """The axis of ``column`` for ``values``; ``log`` None: log when the
  values span a decade or more."""
  label, scale = axis_unit(column, max((abs(v) for v in values), default=0))
  return Axis(label, scale, spans_decades(values) if log is None else log)


def short_ticks(axis, values=None, most: int = 6) -> None:
  """Tick labels that cannot run together on a linear matplotlib ``axis``
  (``ax.xaxis``): at most ``most`` ticks, each label the tick's own value
  (no hidden offset or factor) in the fewest significant digits that tell
  the ticks apart; with ``values`` (a swept field's), ticks at those
  values (thinned to ``most``) instead of a regular grid."""
  from matplotlib import ticker
  if values is not None:
    values = sorted(set(values))
    step = -(-len(values) // most)
    axis.set_major_locator(ticker.FixedLocator(values[::step]))
  else:
    axis.set_major_locator(ticker.MaxNLocator(nbins=most - 1))
  axis.set_major_formatter(_distinct_formatter())


def _distinct_formatter():
  """A matplotlib formatter writing each tick in ``%g`` with the fewest
  significant digits (at least 3) that keep every label distinct."""
  from matplotlib import ticker

  class Distinct(ticker.Formatter):
    digits = 2

    def set_locs(self, locs):
      super().set_locs(locs)
      locs = [float(v) for v in locs]
      for self.digits in range(3, 16):
        if len({self._text(v) for v in locs}) == len(set(locs)):
          break

    def _text(self, value: float) -> str:
      return f"{value:.{self.digits}g}"

    def __call__(self, value, pos=None):
      return self._text(0.0 if abs(value) < 1e-300 else value)

  return Distinct()


def save_figure(fig, path: str, dpi: int = 120) -> None:
  """Writes a matplotlib ``fig`` to ``path`` and closes it; a disk or
  permission fault is a ``WriteError`` naming the file."""
  import matplotlib.pyplot as plt
  try:
    fig.savefig(path, dpi=dpi)
  except OSError as e:
    raise WriteError(path, e) from e
  finally:
    plt.close(fig)
