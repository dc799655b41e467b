"""``lowbw plot``: one metric against another, for one or more logged runs."""

import argparse
import csv
import json
import math
import os

from lowbw import _validate

# Columns with units: (axis label, [(unit, scale)] from the largest unit).
_TIME = [("h", 1 / 3600), ("min", 1 / 60), ("s", 1.0), ("ms", 1e3)]
_BYTES = [("GB", 1e-9), ("MB", 1e-6), ("kB", 1e-3), ("B", 1.0)]
_UNITS = {"sim_time_s": ("simulated time", _TIME),
          "wall_time_s": ("wall-clock time", _TIME),
          "payload_bytes": ("payload per worker", _BYTES),
          "wire_bytes": ("wire bytes per worker", _BYTES)}


def axis_unit(column: str, largest: float) -> tuple[str, float]:
  """The label and scale of ``column``'s axis: the largest unit in which
  the largest value is at least 1 (seconds for a 40 s run, hours for a
  3-hour one)."""
  if column not in _UNITS:
    return column, 1.0
  name, units = _UNITS[column]
  unit, scale = next(((u, s) for u, s in units if largest * s >= 1),
                     units[-1])
  return f"{name} ({unit})", scale


def _title(paths: list[str]) -> str:
  """The runs' strategy and settings, from their config.json."""
  parts = []
  for path in paths:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
      continue
    with open(config_path) as f:
      config = json.load(f)
    strategy = config.get("strategy", {})
    name = strategy.get("name", "?") if isinstance(strategy, dict) else "?"
    extra = "".join(f", {k}={strategy[k]}" for k in ("H", "p")
                    if isinstance(strategy, dict) and k in strategy)
    parts.append(f"{name}, W={config.get('num_workers')}{extra}")
  return "; ".join(dict.fromkeys(parts))


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "plot", help="plot a metric of logged runs (e.g. loss vs simulated time)",
      description="Plot one column of each run's metrics.csv against another, "
      "e.g. eval loss against simulated time on the run's network. Needs "
      "matplotlib (pip install 'lowbw[plot]').")
  p.add_argument("runs", nargs="+", metavar="RUN",
                 help="log folders of lowbw train runs (or metrics.csv files)")
  p.add_argument("--x", default="step", help="column for the x axis: step, "
                 "tokens, sim_time_s, wall_time_s, wire_bytes, ... (times "
                 "and bytes in the unit that suits their size; default step)")
  p.add_argument("--y", default="eval_loss", help="column for the y axis "
                 "(default eval_loss)")
  p.add_argument("--out", help="image file (default: plot.png in the "
                 "first run's folder)")
  p.add_argument("--log-x", action="store_true", help="logarithmic x axis")
  p.set_defaults(run=run)


def read_metrics(path: str) -> dict[str, list[float]]:
  """Columns of a run's metrics.csv as floats (NaN where empty)."""
  csv_path = os.path.join(path, "metrics.csv") if os.path.isdir(path) else path
  if not os.path.isfile(csv_path):
    raise _validate.fail("runs", path, "no metrics.csv there (a lowbw train "
                         "--out folder or a metrics.csv file)")
  with open(csv_path, newline="") as f:
    rows = list(csv.DictReader(f))
  columns = list(rows[0]) if rows else []
  return {c: [_float(r.get(c)) for r in rows] for c in columns}


def _float(text):
  try:
    return float(text)
  except (TypeError, ValueError):
    return math.nan


def run(args: argparse.Namespace) -> int:
  series = []
  for path in args.runs:
    table = read_metrics(path)
    for field, column in (("x", args.x), ("y", args.y)):
      if column not in table:
        raise _validate.fail(field, column, f"run {path} has no such column; "
                             "it has " + ", ".join(table))
    points = [(x, y) for x, y in zip(table[args.x], table[args.y])
              if not (math.isnan(x) or math.isnan(y))]
    if not points:
      raise _validate.fail("y", args.y, f"run {path} has no rows with both "
                           f"{args.x} and {args.y}")
    series.append((os.path.basename(os.path.normpath(path)), points))
  try:
    import matplotlib
  except ModuleNotFoundError:
    raise ModuleNotFoundError("lowbw plot needs matplotlib: pip install "
                              "'lowbw[plot]'") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  label, scale = axis_unit(args.x, max(abs(x) for _, points in series
                                       for x, _ in points))
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, points in series:
    xs, ys = zip(*points)
    ax.plot([x * scale for x in xs], ys, marker="o", markersize=3, label=name)
  if args.log_x:
    ax.set_xscale("log")
  ax.set_xlabel(label)
  ax.set_ylabel(args.y)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  title = _title([p for p in args.runs if os.path.isdir(p)])
  ax.set_title(f"{args.y} against {label}" + (f"\n{title}" if title else ""),
               fontsize=9)
  fig.tight_layout()
  out = args.out or os.path.join(_folder(args.runs[0]), "plot.png")
  fig.savefig(out, dpi=120)
  print(f"wrote {out}: {args.y} against {label}, {len(series)} run(s)")
  return 0


def _folder(path: str) -> str:
  return path if os.path.isdir(path) else os.path.dirname(path) or "."
