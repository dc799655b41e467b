"""``lowbw plot``: one metric against another, for one or more logged runs."""

import argparse
import csv
import math
import os

from lowbw import _validate

_UNITS = {"sim_time_s": ("simulated hours", 1 / 3600),
          "wall_time_s": ("wall-clock seconds", 1.0),
          "payload_bytes": ("payload MB per worker", 1e-6),
          "wire_bytes": ("wire MB per worker", 1e-6)}


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "plot", help="plot a metric of logged runs (e.g. loss vs simulated time)",
      description="Plot one column of each run's metrics.csv against another, "
      "e.g. eval loss against simulated time on the run's network. Needs "
      "matplotlib (pip install 'lowbw[plot]').")
  p.add_argument("runs", nargs="+", metavar="RUN",
                 help="log folders of lowbw train runs (or metrics.csv files)")
  p.add_argument("--x", default="step", help="column for the x axis: step, "
                 "tokens, sim_time_s (hours), wall_time_s, wire_bytes, ... "
                 "(default step)")
  p.add_argument("--y", default="eval_loss", help="column for the y axis "
                 "(default eval_loss)")
  p.add_argument("--out", default="plot.png", help="image file (default "
                 "plot.png)")
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
  label, scale = _UNITS.get(args.x, (args.x, 1.0))
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
  fig.tight_layout()
  fig.savefig(args.out, dpi=120)
  print(f"wrote {args.out}: {args.y} against {label}, {len(series)} run(s)")
  return 0
