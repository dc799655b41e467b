"""``lowbw sweep``: a grid of traced values and seeds as one compiled run."""

import argparse
import os
import sys

from lowbw import _validate
from lowbw.cli import _plot, _train
from lowbw.simulation import _logdir, sweep
from lowbw.simulation import _hparams


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "sweep", help="run a grid of learning rates, network numbers and seeds "
      "as one compiled program",
      description="Run every combination of the --grid values, with every "
      "seed, as one more vmapped axis of one compiled simulation (S points x "
      "W workers). The other options are lowbw train's and set what the "
      "points share. Writes a folder per point, sweep.csv (one row per point "
      "and logged step), sweep.json (mean and std over seeds) and sweep.png.")
  p.add_argument("--config", metavar="FILE", help="TOML or JSON file of "
                 "lowbw train's options; flags override it")
  g = p.add_argument_group("sweep")
  g.add_argument("--grid", action="append", metavar="NAME=V1,V2,...",
                 help="swept values of one traced setting; repeat for a "
                 "product of several. Names: " + ", ".join(_hparams.KNOBS))
  g.add_argument("--seeds", help="comma-separated seeds every combination "
                 "runs with (default: --seed)")
  g.add_argument("--points-per-batch", type=int, help="points computed at "
                 "once (default: every point on a GPU or TPU, as many as fit "
                 "the memory budget; 1 on a CPU, where batching points is no "
                 "faster)")
  _train.add_run_flags(p)
  p.set_defaults(run=run, resume=None)


def _value(text: str):
  try:
    return float(text)
  except ValueError:
    return text.strip()  # a quantity with units: 100Mbps, 50ms


def parse_grid(items) -> dict:
  """["inner_lr=1e-3,3e-3", ...] -> {"inner_lr": [0.001, 0.003]}."""
  grid = {}
  for item in items or []:
    name, sep, values = item.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name or not values.strip():
      raise _validate.fail("grid", item, "expected NAME=V1,V2,... e.g. "
                           "inner_lr=1e-3,3e-3")
    if name in grid:
      raise _validate.fail("grid", item, f"{name} is given twice")
    grid[name] = [_value(v) for v in values.split(",") if v.strip()]
  return grid


def parse_seeds(text, default: int) -> list[int]:
  if text is None:
    return [default]
  try:
    return [int(v) for v in str(text).split(",") if v.strip()]
  except ValueError:
    raise _validate.fail("seeds", text, "expected integers, comma-separated"
                         ) from None


def run(args: argparse.Namespace) -> int:
  grid = _hparams.check_names("grid", parse_grid(args.grid))
  config = _train.settings(args)
  s = _train.resolved(config)
  if s["checkpoint_every"] is not None:
    raise _validate.fail("checkpoint_every", s["checkpoint_every"],
                         "a sweep does not checkpoint; run a point with "
                         "lowbw train to checkpoint it")
  if s["wandb_project"] is not None:
    raise _validate.fail("wandb_project", s["wandb_project"],
                         "lowbw sweep logs each point to CSV and "
                         "TensorBoard only; log a point to W&B with lowbw "
                         "train")
  seeds = parse_seeds(args.seeds, s["seed"])
  out = _train.default_out(s, "sweep-")
  _logdir.prepare(out, overwrite=args.overwrite, create=False, field="out")
  result = sweep(config.build_args(), grid, seeds,
                 points_per_batch=args.points_per_batch, log_dir=out,
                 progress=s["progress"], overwrite=args.overwrite)
  print(format_table(result))
  for point in result.points:  # each point's warnings, e.g. a divergence
    where = ", ".join(f"{k}={_fmt(v)}" for k, v in point.values.items())
    for text in point.summary.get("warnings", ()):
      print(f"lowbw: warning: {where or 'the run'}, seed {point.seed}: "
            f"{text}", file=sys.stderr)
  plotted = plot(result, os.path.join(out, "sweep.png"))
  print(f"  logs              {out}" + ("" if plotted else
                                        " (no sweep.png: needs matplotlib)"))
  return 0


def format_table(result) -> str:
  names = result.names
  width = max([len(n) for n in names] + [8])
  head = "  ".join(f"{n:>{width}}" for n in names)
  lines = [f"{len(result.points)} points ({len(result.seeds)} seeds) in "
           f"{result.summary['wall_time_s']:.1f} s, compile "
           f"{result.summary['compile_s']:.1f} s",
           f"{head}  final eval loss (mean ± std over seeds)"]
  for row in result.aggregate("final_eval_loss"):
    cells = "  ".join(f"{_fmt(row[n]):>{width}}" for n in names)
    failed = f", {row['failed']} diverged" if row["failed"] else ""
    lines.append(f"{cells}  {row['mean']:.4f} ± {row['std']:.4f} "
                 f"(n={row['n']}{failed})")
  return "\n".join(lines)


def _fmt(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def plot(result, path: str) -> bool:
  """Final eval loss against each swept value (mean ± std over seeds), one
  line per combination of the other swept values; a log x axis where the
  values are positive and span a factor of 10 or more (learning rates).
  False without matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  names = result.names or ["seed"]
  fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.5),
                           squeeze=False)
  for ax, name in zip(axes[0], names):
    lines, log = _plot.sweep_lines(result, name)
    for label, xs, means, stds in lines:
      ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=label)
    if log:
      ax.set_xscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel("final eval loss")
    if any(label for label, *_ in lines):
      ax.legend(fontsize=7)
  seeds = len(result.seeds)
  fig.suptitle(f"final eval loss against {', '.join(names)} (mean ± std over "
               f"{seeds} seed{'s' if seeds != 1 else ''})", fontsize=10)
  fig.tight_layout()
  _plot.save(fig, path, dpi=110)
  return True
