"""``lowbw plot``: one metric against another, for one or more logged runs."""

import argparse
import csv
import json
import math
import os
import sys

from lowbw import _validate
from lowbw.telemetry._axes import (Axis, axis, axis_unit, save_figure,
                                   spans_decades)


def is_staircase(column: str) -> bool:
  """Cumulative bytes grow only at syncs (DiLoCo every H steps), and so does
  simulated time when communication dwarfs compute: a curve against them is
  a vertical stack of points per sync."""
  return column.endswith("_bytes") or column == "sim_time_s"


def moving_average(ys: list[float], n: int) -> list[float]:
  """Each value replaced by the mean of itself and the ``n - 1`` before it
  (fewer at the start), so a curve keeps its length and its x values."""
  out, total = [], 0.0
  for i, y in enumerate(ys):
    total += y - (ys[i - n] if i >= n else 0.0)
    out.append(total / min(i + 1, n))
  return out


# Steps of x smaller than this share of its range are one stair.
_FLAT = 1e-3


def at_sync_points(xs: list[float], ys: list[float]):
  """The last point of each run of (nearly: within ``_FLAT`` of the range)
  equal ``xs``: where bytes or time step up, the loss reached just before
  the next communication."""
  span = (max(xs) - min(xs)) if xs else 0.0
  keep = [i for i in range(len(xs))
          if i + 1 == len(xs) or xs[i + 1] - xs[i] > _FLAT * span]
  return [xs[i] for i in keep], [ys[i] for i in keep]


def series(table: dict[str, list[float]], x: str, y: str,
           smooth: int = 1) -> tuple[list[float], list[float]]:
  """The points to draw for one run: rows with both values, ``y``
  smoothed over ``smooth`` rows, and against a bytes column only the last
  row of each constant-bytes run."""
  rows = [(a, b) for a, b in zip(table[x], table[y])
          if math.isfinite(a) and math.isfinite(b)]
  xs, ys = [a for a, _ in rows], [b for _, b in rows]
  ys = moving_average(ys, smooth)
  if is_staircase(x):
    xs, ys = at_sync_points(xs, ys)
  return xs, ys


def _title(paths: list[str]) -> str:
  """The runs' strategy and settings, from their config.json."""
  parts = []
  for path in paths:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
      continue
    try:
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    except ValueError:
      continue  # a title is not worth refusing the plot for
    if not isinstance(config, dict):
      continue
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
                 "and bytes in the unit that suits their size; against a "
                 "bytes column, which grows only at syncs, a point per sync: "
                 "the last row before the bytes grow; default step)")
  p.add_argument("--y", default="eval_loss", help="column for the y axis "
                 "(default eval_loss)")
  p.add_argument("--out", help="image file (default: plot.png in the "
                 "first run's folder)")
  p.add_argument("--log-x", action=argparse.BooleanOptionalAction,
                 help="logarithmic x axis (default: when the values are "
                 "positive and span a factor of 10 or more)")
  p.add_argument("--log-y", action=argparse.BooleanOptionalAction,
                 help="logarithmic y axis (default: as for x)")
  p.add_argument("--smooth", type=int, default=1, metavar="N",
                 help="plot the moving average of y over N logged rows (the "
                 "row and the N-1 before it; default 1: raw values)")
  p.set_defaults(run=run)


def read_metrics(path: str) -> dict[str, list[float]]:
  """Columns of a run's metrics.csv as floats (NaN where empty)."""
  csv_path = os.path.join(path, "metrics.csv") if os.path.isdir(path) else path
  if not os.path.isfile(csv_path):
    raise _validate.fail("runs", path, "no metrics.csv there (a lowbw train "
                         "--out folder or a metrics.csv file)")
  try:
    with open(csv_path, newline="", encoding="utf-8") as f:
      reader = csv.DictReader(f)
      rows = list(reader)
  except (UnicodeDecodeError, csv.Error) as e:  # name no file themselves
    raise _validate.fail("runs", path, f"{csv_path} is not a readable CSV "
                         f"file ({str(e).splitlines()[0]})") from None
  if not rows:  # a run before its first logged row, or an empty file
    raise _validate.fail("runs", path, f"{csv_path} has no rows yet (plot "
                         "the run once it has logged a step)")
  # The header's columns: a row with extra cells would add a None key.
  return {c: [_float(r.get(c)) for r in rows] for c in reader.fieldnames}


def _float(text):
  try:
    return float(text)
  except (TypeError, ValueError):
    return math.nan


# The formats matplotlib writes, where it is not installed (drawing then
# says it is needed); the common ones, listed first in errors.
_FORMATS = ("png", "pdf", "svg", "eps", "ps")


def image_formats() -> list[str]:
  """The file extensions matplotlib can write, without drawing anything."""
  try:
    from matplotlib.backend_bases import FigureCanvasBase
  except ModuleNotFoundError:
    return list(_FORMATS)
  found = FigureCanvasBase.get_supported_filetypes()
  return [f for f in _FORMATS if f in found] + sorted(set(found) -
                                                      set(_FORMATS))


def check_image_file(field: str, path: str) -> None:
  """Refuses a file whose extension matplotlib cannot write, before any
  work: its own error comes only when saving, and names no flag."""
  formats = image_formats()
  if os.path.splitext(path)[1][1:].lower() not in formats:
    raise _validate.fail(field, path, "expected an image file ending in " +
                         ", ".join("." + f for f in formats) +
                         " (the extension picks the format)")


def run(args: argparse.Namespace) -> int:
  if len(args.runs) == 1 and os.path.isfile(os.path.join(args.runs[0],
                                                         "study.json")):
    return _study(args.runs[0], args.out)
  smooth = _validate.positive_int("smooth", args.smooth)
  if args.out is not None:
    check_image_file("out", args.out)
  out, x_axis, y_axis = write(args.runs, args.x, args.y, smooth, args.log_x,
                              args.log_y, args.out)
  print(f"wrote {out}: {y_axis.label} against {x_axis.label}, "
        f"{len(args.runs)} run(s)")
  return 0


def _study(folder: str, out: str | None) -> int:
  """A study folder: its plots (final loss against bytes, simulated time and
  each swept setting) into ``out`` (default the folder)."""
  from lowbw import studies
  try:
    paths = studies.load(folder).plot(out)
  except ModuleNotFoundError:
    raise ModuleNotFoundError("lowbw plot needs matplotlib: pip install "
                              "'lowbw[plot]'") from None
  print(f"wrote {len(paths)} plots of study {folder}: " + ", ".join(paths))
  return 0


def write(runs: list[str], x: str, y: str, smooth: int = 1,
          log_x: bool | None = None, log_y: bool | None = None,
          out: str | None = None) -> tuple[str, Axis, Axis]:
  """Draws column ``y`` against ``x`` of each run (a log folder or a
  metrics.csv) into ``out`` (default: the first run's folder's plot.png).

  Returns:
    (the PNG's path, the x axis, the y axis).
  """
  series_ = []
  for path in runs:
    table = read_metrics(path)
    for field, column in (("x", x), ("y", y)):
      if column not in table:
        raise _validate.fail(field, column, f"run {path} has no such column; "
                             "it has " + ", ".join(table))
    xs, ys = series(table, x, y, smooth)
    if not xs:
      raise _validate.fail("y", y, f"run {path} has no rows with both "
                           f"{x} and {y} finite")
    for column in dict.fromkeys((x, y)):
      infinite = sum(math.isinf(v) for v in table[column])
      if infinite:  # drawn as nothing: say so rather than draw a gap
        print(f"lowbw: warning: run {path}: {infinite} row(s) of {column} "
              "are infinite and not drawn", file=sys.stderr)
    series_.append((os.path.basename(os.path.normpath(path)), xs, ys))
  x_axis = axis(x, [v for _, xs, _ in series_ for v in xs], log_x)
  y_axis = axis(y, [v for _, _, ys in series_ for v in ys], log_y)
  out = out or os.path.join(_folder(runs[0]), "plot.png")
  title = _title([p for p in runs if os.path.isdir(p)])
  draw(series_, x_axis, y_axis, out, title, smooth)
  return out, x_axis, y_axis


def draw(series_, x_axis: Axis, y_axis: Axis, out: str, title: str = "",
         smooth: int = 1) -> None:
  """Writes the figure of ``[(name, xs, ys), ...]`` to ``out``."""
  try:
    import matplotlib
  except ModuleNotFoundError:
    raise ModuleNotFoundError("lowbw plot needs matplotlib: pip install "
                              "'lowbw[plot]'") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, xs, ys in series_:
    ax.plot([x * x_axis.scale for x in xs], [y * y_axis.scale for y in ys],
            marker="o", markersize=3, label=name)
  if x_axis.log:
    ax.set_xscale("log")
  if y_axis.log:
    ax.set_yscale("log")
  ax.set_xlabel(x_axis.label)
  ylabel = y_axis.label + (f", mean of {smooth} rows" if smooth > 1 else "")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  ax.set_title(f"{ylabel} against {x_axis.label}" +
               (f"\n{title}" if title else ""), fontsize=9)
  fig.tight_layout()
  save(fig, out)


save = save_figure


def _folder(path: str) -> str:
  return path if os.path.isdir(path) else os.path.dirname(path) or "."


def learning_curves(run: str, smooth: int = 1, out: str | None = None
                    ) -> tuple[str, list[str]]:
  """A run's picture (``lowbw train``'s plot.png): train loss (a moving
  mean over ``smooth`` rows) and eval loss against steps, and beside it
  against simulated time when the run kept a clock.

  Returns:
    (the image's path, the x columns drawn).
  """
  table = read_metrics(run)
  xs = [c for c in ("step", "sim_time_s") if c in table and any(
      math.isfinite(v) for v in table[c])]
  ys = [c for c in ("train_loss", "eval_loss") if c in table and any(
      math.isfinite(v) for v in table[c])]
  panels = []
  for x in xs:
    lines = [(y if smooth == 1 or y != "train_loss" else
              f"{y}, mean of {smooth} rows", *series(
                  table, x, y, smooth if y == "train_loss" else 1))
             for y in ys]
    lines = [line for line in lines if line[1]]
    x_axis = axis(x, [v for _, a, _ in lines for v in a], False)
    y_axis = axis(ys[0], [v for _, _, b in lines for v in b], None)
    panels.append((lines, x_axis, y_axis))
  out = out or os.path.join(_folder(run), "plot.png")
  _draw_panels(panels, out, _title([run] if os.path.isdir(run) else []))
  return out, xs


def _draw_panels(panels, out: str, title: str) -> None:
  """One axes per ``(lines, x_axis, y_axis)``, side by side."""
  try:
    import matplotlib
  except ModuleNotFoundError:
    raise ModuleNotFoundError("lowbw plot needs matplotlib: pip install "
                              "'lowbw[plot]'") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2),
                           squeeze=False)
  for ax, (lines, x_axis, y_axis) in zip(axes[0], panels):
    for name, xs, ys in lines:
      eval_ = name.startswith("eval")
      ax.plot([x * x_axis.scale for x in xs], [y * y_axis.scale for y in ys],
              marker="o" if eval_ else None, markersize=4, label=name,
              linewidth=1.5 if eval_ else 1.0)
    if y_axis.log:
      ax.set_yscale("log")
    ax.set_xlabel(x_axis.label)
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"loss against {x_axis.label}", fontsize=9)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  save(fig, out)
