"""``lowbw sweep``: a study over any setting (the strategy, H, W, p, a codec,
learning rates, bandwidth) with seeds; resumable; tables and plots."""

import argparse
import os
import sys

from lowbw import _validate
from lowbw.config import _config, _fields, _files, _strategy_fields
from lowbw.cli import _train
from lowbw.studies import study


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "sweep", help="run a study: a grid over any setting, with seeds",
      description="Run every combination of the --grid values (any setting "
      "of lowbw train, the strategy itself included), each with every seed. "
      "The other options are lowbw train's and set what the points share. "
      "Points that differ only in traced values (learning rates, momentum, "
      "bandwidth, latency) and seeds share one compiled program. Writes "
      "OUT/points/NNNN/ per point, study.csv (one row per point and logged "
      "step), final.csv (mean ± std over seeds), points.csv and plots of the "
      "final loss against bytes, simulated time and each swept setting. Run "
      "again with the same --out, a study skips the points that finished.")
  p.add_argument("--config", metavar="FILE", help="YAML, TOML or JSON file "
                 "of lowbw train's options: the base every point shares; "
                 "flags override it")
  g = p.add_argument_group("sweep")
  g.add_argument("--grid", action="append", metavar="NAME=V1,V2,...",
                 help="the values of one setting; repeat for a product of "
                 "several, e.g. --grid H=10,50,100 --grid codec=float32,quant:4")
  g.add_argument("--grid-file", metavar="FILE", help="YAML, TOML or JSON: a "
                 "grid (setting: [values]) or a list of grids run one after "
                 "another (an irregular grid; in TOML: grid = [...]); "
                 "--grid values multiply each of them")
  g.add_argument("--seeds", help="comma-separated seeds every combination "
                 "runs with (default: --seed)")
  g.add_argument("--points-per-batch", type=int, metavar="N",
                 help="points of one compiled shape computed at once, as one "
                 "vmapped program (memory grows with N). Default: all that "
                 "fit the memory budget on a GPU, 1 on a CPU (measured no "
                 "faster there)")
  g.add_argument("--executor", metavar="WHERE", help="where the points "
                 "run: local:N (N worker processes; local: one per GPU, or "
                 "per core on a CPU), ray (Ray tasks; pip install "
                 "'lowbw[ray]') or slurm (Slurm jobs through submitit; pip "
                 "install 'lowbw[slurm]'). Default: this process")
  g.add_argument("--executor-option", action="append", metavar="KEY=VALUE",
                 help="a submitit parameter for --executor slurm, e.g. "
                 "slurm_partition=gpu, timeout_min=60, gpus_per_node=1; "
                 "repeat for several")
  _train.add_run_flags(p)
  p.set_defaults(run=run, resume=None)


def parse_options(items) -> dict | None:
  """["timeout_min=60", ...] -> {"timeout_min": 60} (numbers as numbers,
  true/false as booleans)."""
  if not items:
    return None
  options = {}
  for item in items:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
      raise _validate.fail("executor_option", item, "expected KEY=VALUE, "
                           "e.g. slurm_partition=gpu")
    options[key.strip()] = _option_value(text.strip())
  return options


def _option_value(text: str):
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def _value(name: str, text: str):
  """A grid value typed as its setting."""
  return _fields.text_value(_config.FIELDS[name], text)


def parse_grid(items) -> dict:
  """["H=10,50", ...] -> {"H": [10, 50]}."""
  grid = {}
  for item in items or []:
    name, sep, values = item.partition("=")
    if not sep or not name.strip() or not values.strip():
      raise _validate.fail("grid", item, "expected NAME=V1,V2,... e.g. "
                           "H=10,50,100")
    try:
      name = _config.canonical(name.strip())
    except _validate.ConfigError as e:
      raise _validate.fail("grid", name.strip(), e.allowed) from None
    if name in grid:
      raise _validate.fail("grid", item, f"{name} is given twice")
    grid[name] = [_value(name, v) for v in values.split(",") if v.strip()]
  return grid


def read_grid_file(path: str) -> list[dict]:
  """The sub-grids of a grid file: a table, a list of tables, or a table
  whose only key is ``grid``."""
  values = _files.read_file(path, "grid_file")
  if isinstance(values, dict) and list(values) == ["grid"]:
    values = values["grid"]
  values = values if isinstance(values, list) else [values]
  if not values or not all(isinstance(v, dict) for v in values):
    raise _validate.fail("grid_file", path, "expected a table of setting: "
                         "[values] or a list of such tables")
  return values


def parse_seeds(text, default: int) -> list[int]:
  if text is None:
    return [default]
  try:
    return [int(v) for v in str(text).split(",") if v.strip()]
  except ValueError:
    raise _validate.fail("seeds", text, "expected integers, comma-separated"
                         ) from None


def _grid(args) -> list[dict]:
  flags = parse_grid(args.grid)
  if not args.grid_file:
    return [flags] if flags else [{}]
  return [{**sub, **flags} for sub in read_grid_file(args.grid_file)]


def run(args: argparse.Namespace) -> int:
  grid = _grid(args)
  # The base need only be a run with each point's values (--steps 20 with
  # --grid H=10,20 and H's default of 100).
  base, _ = _train.setting_values(args)
  for name in ("checkpoint_every", "wandb_project"):
    if base.get(name) is not None:
      raise _validate.fail(name, base[name], "a sweep logs each point to CSV "
                           "and TensorBoard only; run a point with lowbw "
                           "train for that")
  seeds = parse_seeds(args.seeds, base.get("seed", 0))
  out = base.pop("out", None) or _train.default_out(
      {"out": None, "strategy": str(base.get(
          "strategy", _strategy_fields.DEFAULT_STRATEGY))}, "sweep-")
  progress = base.get("progress")
  result = study(base, grid, seeds, out=out, progress=progress,
                 overwrite=args.overwrite, on_point=_printer(progress),
                 points_per_batch=args.points_per_batch,
                 executor=args.executor,
                 executor_options=parse_options(args.executor_option))
  print(format_table(result))
  for point in result.points:  # each point's warnings, e.g. a divergence
    where = ", ".join(f"{k}={_fmt(v)}" for k, v in point.values.items())
    for text in point.summary.get("warnings", ()):
      print(f"lowbw: warning: {where or 'the run'}, seed {point.seed}: "
            f"{text}", file=sys.stderr)
  plots = result.summary.get("plots", [])
  print(f"  logs              {out}" + (
      f" (plots: {', '.join(os.path.basename(p) for p in plots)})" if plots
      else " (no plots: needs matplotlib)"))
  return 0


def _printer(progress):
  """With ``--no-progress``, one line per finished point (with where a
  re-timed point's training came from); otherwise the study shows them
  itself: a bar on a terminal, a line per point elsewhere."""
  if progress is not False:
    return None

  def show(point) -> None:
    where = ", ".join(f"{k}={_fmt(v)}" for k, v in point.values.items())
    loss = point.summary.get("final_eval_loss")
    tail = (point.summary["error"] if point.summary.get("error") else
            f"eval loss {loss:.4f}" if loss is not None else "done")
    if point.summary.get("retimed_from"):  # trained once, timed again
      tail += f" (re-timed from {point.summary['retimed_from']})"
    print(f"point {point.index}: {where or 'base'}, seed {point.seed}: "
          f"{tail}", flush=True)

  return show


def format_table(result) -> str:
  names = result.names
  final = result.final(frame=False)
  width = {n: max([len(n)] + [len(_fmt(v)) for v in final.get(n, [])])
           for n in names}
  s = result.summary
  lines = [f"{s['points']} points ({len(result.seeds)} seeds, "
           f"{s['groups']} compiled shapes, {s['resumed']} resumed"
           + (f", {s['retimed']} re-timed" if s.get("retimed") else "")
           + ") in "
           f"{s['wall_time_s']:.1f} s",
           "  ".join(f"{n:>{width[n]}}" for n in names) +
           "  final eval loss (mean ± std over seeds)  wire bytes/worker"]
  rows = len(final.get("seeds", []))
  for i in range(rows):
    cells = "  ".join(f"{_fmt(final[n][i]):>{width[n]}}" for n in names)
    failed = f", {final['failed'][i]} failed" if final["failed"][i] else ""
    lines.append(f"{cells}  {final['final_eval_loss_mean'][i]:.4f} ± "
                 f"{final['final_eval_loss_std'][i]:.4f} "
                 f"(n={final['seeds'][i]}{failed})  "
                 f"{final['wire_bytes_mean'][i]:,.0f}")
  if s.get("shared_rates"):
    lines.append(f"note: {s['shared_rates']}")
  return "\n".join(lines)


def _fmt(v) -> str:
  return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
