"""``lowbw train``: one simulated run from flags, a config file, or a resume.

Every flag is a ``lowbw.Config`` field (``lowbw.config._config.FIELDS``:
its help, default and type); a config file gives the same fields as keys.
"""

import math
import argparse
import datetime
import json
import os
import sys

import jax

from lowbw import _validate, telemetry
from lowbw.telemetry import _progress
from lowbw.config import _config, _fields
from lowbw import simulation
from lowbw import network as network_lib
from lowbw.cli import _heartbeat as _heartbeat_lib
from lowbw.cli import _plot
from lowbw.config import Config
from lowbw.config._config import FIELDS
from lowbw.simulation import initialize
from lowbw.simulation._api import run_config
from lowbw.simulation._logdir import prepare as prepare_log_dir
from lowbw.telemetry import _metrics as names

METADATA_KEY = "train_args"  # where config.json keeps these settings
DEFAULTS = {name: f.default for name, f in FIELDS.items()}
# API names of settings the flags name otherwise -> the setting.
API_NAMES = {"resume_from": "resume",
             "stragglers.fraction": "keep_fraction"}
# The groups add_scale_flags adds (train's and bench's).
SCALE_GROUPS = ("compute", "devices and hosts")


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "train", help="simulate a distributed training run",
      description="Simulate W workers training one model with a "
      "low-bandwidth strategy; log loss, bytes and time. With no arguments: "
      "DiLoCo, 8 workers, a small GPT on the Python standard library's source "
      "bytes (about a minute on a 2-core CPU).",
  )
  p.add_argument("--config", metavar="FILE", help="YAML, TOML or JSON file "
                 "of these options (keys as the long option names, '-' or "
                 "'_'; every run writes its own as OUT/config.yaml); flags "
                 "override it")
  p.add_argument("--print-config", action="store_true", help="print the "
                 "full resolved config (defaults filled in) as YAML and exit")
  p.add_argument("--resume", metavar="DIR", help="continue the run logged in "
                 "DIR from its latest checkpoint with its settings; only "
                 + _may_change() + " may change")
  p.add_argument("--no-plot", action="store_true",
                 help="do not draw OUT/plot.png (train and eval loss against "
                 "steps and against simulated time; drawn by default when "
                 "matplotlib is installed)")
  add_run_flags(p)
  p.set_defaults(run=run)


def add_fields(p, groups) -> None:
  """The flags of every ``lowbw.Config`` field in ``groups``."""
  for group in groups:
    g = p.add_argument_group(group, _config.GROUPS[group])
    for field in FIELDS.values():
      if field.group == group and not field.python:
        g.add_argument(field.flag, **_fields.flag_kwargs(field))
    if group == "run":
      g.add_argument("--overwrite", action="store_true", help="clear what "
                     "another run wrote in --out (nothing else) before this "
                     "one")


def add_run_flags(p) -> None:
  """Every setting of a run (train and sweep)."""
  add_fields(p, [g for g in _config.GROUPS if g not in SCALE_GROUPS])
  add_scale_flags(p)


def add_scale_flags(p) -> None:
  """Devices, worker precision and multi-process flags (train and bench)."""
  add_fields(p, SCALE_GROUPS)
  g = p.add_argument_group("processes")
  g.add_argument("--coordinator", help="multi-process: host:port of process "
                 "0 (or JAX_COORDINATOR_ADDRESS)")
  g.add_argument("--num-processes", type=int, help="multi-process: K "
                 "processes (or JAX_NUM_PROCESSES)")
  g.add_argument("--process-id", type=int, help="multi-process: this "
                 "process's index in [0, K) (or JAX_PROCESS_ID)")


def setting_names() -> set[str]:
  """Every setting of a run: config-file keys and resumable values."""
  return set(FIELDS)


def join_processes(args: argparse.Namespace) -> None:
  """``jax.distributed.initialize`` when flags or environment ask for it."""
  if (args.coordinator or args.num_processes is not None or
      args.process_id is not None or "JAX_COORDINATOR_ADDRESS" in os.environ):
    initialize(args.coordinator, args.num_processes, args.process_id)


def _saved(path: str) -> dict:
  """The settings a ``lowbw train`` run keeps in its config.json; an older
  run's full table is cut to the values that differ from the defaults."""
  saved = None
  if os.path.isfile(path):
    with open(path) as f:
      try:
        record = json.load(f)
      except ValueError as e:  # a damaged file, not a run's record
        raise _validate.fail("resume", os.path.dirname(path), "its "
                             f"config.json is not valid JSON ({e})") from None
    if isinstance(record, dict) and isinstance(record.get("metadata"), dict):
      saved = record["metadata"].get(METADATA_KEY)
  if not isinstance(saved, dict):
    raise _validate.fail("resume", os.path.dirname(path),
                         "not the log folder of a lowbw train run "
                         "(no config.json with its settings)")
  out = {k: v for k, v in saved.items() if k in FIELDS and
         v != FIELDS[k].default}
  if "profile" not in (record.get("network") or {"profile": None}):
    # Written before network profiles: it ran on the ideal clock.
    out.setdefault("network_profile", "ideal")
  return out


def setting_values(args: argparse.Namespace) -> tuple[dict, dict]:
  """The given settings, each checked alone: resumed run's < config file <
  flags. Returns (the merged values, those from the config file)."""
  merged, saved, from_file = {}, {}, {}
  if args.resume:
    saved = _saved(os.path.join(args.resume, "config.json"))
    merged.update(saved)
  if args.config:
    from_file = _config.read_settings(args.config)
    for key, value in from_file.items():  # a flag may override it
      try:
        _config.check_value(key, value)
      except _validate.ConfigError as e:
        raise _validate.fail(e.field, e.value, f"{e.allowed} (in config "
                             f"file {args.config})") from None
  flags = {k: v for k, v in vars(args).items()
           if k in FIELDS and v is not None}
  if args.resume:
    _check_resume_changes(saved, {**from_file, **flags})
    merged["out"] = args.resume
  merged.update(from_file)
  merged.update(flags)
  for key in ("data", "data_root"):  # the same files from any folder
    if isinstance(merged.get(key), str) and os.path.exists(merged[key]):
      merged[key] = os.path.abspath(merged[key])
  return merged, {k: v for k, v in from_file.items() if k not in flags}


def settings(args: argparse.Namespace) -> Config:
  """The run's ``Config`` (``setting_values`` made into one)."""
  merged, from_file = setting_values(args)
  try:
    return Config(**merged)
  except _validate.ConfigError as e:
    if e.field in from_file:
      raise _validate.fail(e.field, e.value, f"{e.allowed} (in config file "
                           f"{args.config})") from None
    raise


# What ``--resume`` may change: how long the run goes on and how it is logged.
RESUME_MAY_CHANGE = ("steps", "eval_every", "log_every", "checkpoint_every",
                     "eval_examples", "progress", "out", "devices",
                     "worker_batch", "memory_budget")


def _may_change() -> str:
  return ", ".join("--" + n.replace("_", "-") for n in RESUME_MAY_CHANGE)


def _check_resume_changes(saved: dict, given: dict) -> None:
  def value(name):
    return saved.get(name, FIELDS[name].default)

  for name, given_value in sorted(given.items()):
    if name not in RESUME_MAY_CHANGE and given_value != value(name):
      raise _validate.fail(
          name, given_value, f"the resumed run has {name}={value(name)!r}; "
          "on --resume only " + _may_change() + " may change")
  if ("steps" in given and given["steps"] != value("steps") and
      saved.get("schedule") == "cosine"):
    raise _validate.fail("steps", given["steps"],
                         "a cosine schedule decays over the first run's "
                         f"{value('steps')} steps; it cannot be extended")


def resolved(config: Config) -> dict:
  """Every field's resolved value (a dict, for printing)."""
  return {name: getattr(config, name) for name in FIELDS}


def default_out(s: dict, kind: str = "") -> str:
  """``--out``, or a new folder under runs/ when it is not given (an empty
  ``--out ''`` is given: the log folder's check refuses it)."""
  if s["out"] is not None:
    return s["out"]
  return os.path.join(
      "runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + kind +
      s["strategy"])


def run(args: argparse.Namespace) -> int:
  join_processes(args)
  config = settings(args)
  if args.print_config:
    print(config.to_yaml(), end="")
    return 0
  s = resolved(config)
  out = default_out(s)
  config = config.replace(out=out)
  prepare_log_dir(out, resuming=bool(args.resume), overwrite=args.overwrite,
                  create=False, field="out")
  say = _status(s)
  say(f"loading data ({s['data']}) and building the {s['strategy']} run")
  sim = simulation.build(config, compile=False)
  saved = {k: v for k, v in config.to_dict().items()
           if k not in ("progress", "out")}
  say(f"compiling {s['workers']} workers' program (kept in the compilation "
      f"cache for later runs), then {s['steps']} steps; logs in {out}")
  beat = _heartbeat(s)
  try:
    result = run_config(
        sim, config, resume_from=args.resume, metadata={METADATA_KEY: saved},
        overwrite=args.overwrite,
        callback=_callback(_row_printer(s), beat and beat.row))
  finally:
    if beat is not None:
      beat.stop()
  if result.config["processes"] == 1 or jax.process_index() == 0:
    print(format_summary(result.summary, s))
    if not args.no_plot:
      print(_default_plot(out, result))
    for text in result.summary["warnings"]:
      print(f"lowbw: warning: {text}", file=sys.stderr)
  return 0


def _default_plot(out: str, result) -> str:
  """Draws the run's learning curves (train and eval loss against steps,
  and against simulated time with a clock) into ``out/plot.png``; the
  summary's line about it."""
  try:
    # Smoothed: each point is a window's mean loss, not one noisy step's.
    smooth = max(1, len(result.history[names.STEP]) // 20)
    path, xs = _plot.learning_curves(out, smooth)
  except ModuleNotFoundError:
    return "  plot              none (needs matplotlib: pip install 'lowbw[plot]')"
  against = " and against ".join(
      {"step": "steps", "sim_time_s": "simulated time"}[x] for x in xs)
  return (f"  plot              {path} (train and eval loss against "
          f"{against}; lowbw plot {out} --x ... --y ... for others)")


def _status(s: dict):
  """A line on stdout at once, saying what the run is doing before its first
  row (loading, compiling): off a terminal nothing else shows for a while."""

  def say(text: str) -> None:
    if s["progress"] is not False and jax.process_index() == 0:
      print(f"lowbw: {text}", flush=True)

  return say


def _heartbeat(s: dict):
  """A started heartbeat on stderr (compiling what, for how long), or None
  with --no-progress or off process 0."""
  if s["progress"] is False or jax.process_index() != 0:
    return None
  return _heartbeat_lib.Heartbeat().start()


def _callback(*parts):
  """One row callback calling each of ``parts`` that is not None."""
  parts = [p for p in parts if p is not None]
  if not parts:
    return None
  if len(parts) == 1:
    return parts[0]
  return lambda row: [p(row) for p in parts] and None


# Off a terminal with the default rows, about this many lines show a run.
PRINTED_ROWS = 20


def printed_every(s: dict) -> int:
  """Steps between the rows printed off a terminal: every logged row when
  --log-every is given, else about ``PRINTED_ROWS`` lines a run (rows with
  an evaluation and the last row always show)."""
  if s["log_every"]:
    return 1
  return max(1, s["steps"] // PRINTED_ROWS)


def _row_printer(s: dict):
  """Off a terminal (a log file, a batch job) with no progress setting: a
  line per logged row (every ``printed_every`` steps, and every evaluation)
  on stdout instead of a bar; else None."""
  if s["progress"] is not None or _progress.is_terminal():
    return None
  steps, every = s["steps"], printed_every(s)

  def show(row: dict) -> None:
    if jax.process_index() != 0:
      return
    evaluated = row.get(names.EVAL_LOSS) is not None and (
        row[names.EVAL_LOSS] == row[names.EVAL_LOSS])
    if row[names.STEP] % every and not evaluated and row[names.STEP] != steps:
      return
    parts = [f"step {row[names.STEP]}/{steps}"]
    for key in (names.TRAIN_LOSS, names.EVAL_LOSS):
      if row.get(key) is not None and row[key] == row[key]:
        parts.append(f"{key} {row[key]:.4f}")
    if row.get(names.SIM_TIME_S) is not None:
      parts.append(f"sim {_duration(row[names.SIM_TIME_S])}")
    parts.append(f"sent {_bytes(row[names.WIRE_BYTES])}")
    print("  ".join(parts), flush=True)

  return show


def _bytes(n: float) -> str:
  for unit in ("B", "KB", "MB", "GB", "TB"):
    if abs(n) < 1000 or unit == "TB":
      return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
    n /= 1000
  return str(n)


def _duration(seconds: float) -> str:
  if seconds >= 3600:
    return f"{seconds / 3600:,.2f} h"
  if seconds >= 60:
    return f"{seconds / 60:.1f} min"
  return network_lib.format_duration(seconds)


def _lane_lines(summary: dict) -> list[str]:
  """A line per counterfactual lane: what its cause cost the run."""
  lines = []
  for key in summary:
    if not (key.startswith("lane/") and key.endswith("/loss_cost")):
      continue
    name = key[len("lane/"):-len("/loss_cost")]
    time_cost = summary.get(f"lane/{name}/time_cost_s")
    lines.append(f"  lane {name:<12} eval loss "
                 f"{summary[f'lane/{name}/final_eval_loss']:.4f} (the cause "
                 f"costs {summary[key]:+.4f}" + (
                     "" if time_cost is None else
                     f", {_duration(abs(time_cost))} "
                     f"{'slower' if time_cost >= 0 else 'faster'}") + ")")
  return lines


def _topology_text(summary: dict, s: dict) -> str:
  """How the run's messages travel: the topology of its collectives, or,
  when every one is an exchange with a server (asynchronous strategies),
  that."""
  kinds = set(summary.get("collectives", {}).values())
  if kinds and kinds <= {"exchange"}:
    return "each worker with the server"
  return s["topology"] + (f" of {s['group_size']}" if s["group_size"]
                          else "")


def _pipeline_lines(summary: dict, s: dict) -> list[str]:
  """A pipeline run's line: its stages, micro-batches and schedule, the
  bytes its stages sent each other and its bubble."""
  if summary.get("stage_bytes") is None:
    return []
  bubble = summary.get("pipeline_bubble")
  return [f"  pipeline          {s.get('stages')} stages, "
          f"{s.get('micro_batches')} micro-batches "
          f"({s.get('pipeline_schedule') or '1f1b'}): "
          f"{_bytes(summary['stage_bytes'])} between stages per worker"
          + ("" if bubble is None else f", bubble {bubble:.1%} of a step")]


def format_summary(summary: dict, s: dict) -> str:
  lines = [f"{s['strategy']}: {summary['num_workers']} workers x "
           f"{summary['steps']} steps, {summary['num_params']:,} parameters"]
  if summary.get("final_eval_loss") is not None:
    extra = ""
    if summary.get("final_eval_perplexity") is not None:
      extra = f", perplexity {summary['final_eval_perplexity']:.3f}"
    elif summary.get("final_eval_accuracy") is not None:
      extra = f", accuracy {summary['final_eval_accuracy']:.3f}"
    lines.append(f"  final eval loss   {summary['final_eval_loss']:.4f}{extra}")
  if summary.get("final_shadow_eval_loss") is not None:
    lines.append(f"  DDP lane          eval loss "
                 f"{summary['final_shadow_eval_loss']:.4f} (gap "
                 f"{summary['final_shadow_gap']:+.2%})")
  lines += _lane_lines(summary)
  collectives = ", ".join(sorted(set(summary.get("collectives", {}).values())))
  lines.append(f"  sent per worker   {_bytes(summary['payload_bytes'])} payload, "
               f"{_bytes(summary['wire_bytes'])} on the wire ({collectives})")
  lines += _pipeline_lines(summary, s)
  rate = f"{summary['steps_per_s']:.2f} steps/s"
  if summary.get("tokens_per_s"):
    rate += f", {summary['tokens_per_s']:,.0f} tokens/s"
  if summary.get("sim_time_s") is not None:
    topology = _topology_text(summary, s)
    lines.append(f"  simulated time    {_duration(summary['sim_time_s'])} on "
                 f"{s['bandwidth']}, {s['latency']} ({topology}), "
                 f"{_hardware_text(s)}")
  if summary.get("comm_share") is not None:
    lines += _time_lines(summary, s)
  if summary.get("goodput") is not None:
    lines.append(f"  goodput           {share(summary['goodput'])} (steps merged "
                 "into the model / steps the fleet could have taken)")
  if summary.get("cost_usd") is not None:
    lines.append(f"  cost              {cost_line(summary, s)}")
  lines.append(f"  throughput        {rate} (compile {summary['compile_s']:.1f} s)")
  if summary.get("startup"):
    lines.append(f"  start-up          {startup_line(summary['startup'])}")
  lines.append(f"  logs              {summary['log_dir']}")
  lines += [f"  WARNING           {w}" for w in summary.get("warnings", ())]
  return "\n".join(lines)


def share(x: float) -> str:
  """A fraction as a percentage that never reads 0.0 % or 100.0 % unless it
  is: one decimal, or two significant digits of what sets it apart from
  0 or 1 (``0.0083%``, ``99.9917%``)."""
  if x <= 0 or x >= 1 or 0.001 <= x <= 0.999:
    return f"{x:.1%}"
  if x < 0.001:
    return f"{100 * x:.2g}%"
  digits = 2 - math.floor(math.log10(100 * (1 - x)))  # 1 - x's 2 digits
  return f"{100 * x:.{digits - 1}f}%"


def _hardware_text(s: dict) -> str:
  """'h100 at MFU 0.4', or '0.01s per step' when the hardware is given as
  seconds per step (no utilisation applies then)."""
  hardware = network_lib.hardware(s["hardware"], mfu=s["mfu"])
  if hardware.step_time_s is not None:
    return f"{s['hardware']} per step (given; no MFU applies)"
  return f"{s['hardware']} at MFU {s['mfu']}"


def _time_lines(summary: dict, s: dict) -> list[str]:
  """Where a step's simulated time goes: compute and communication at
  nominal speed, and the waiting for the slowest workers beyond them."""
  steps = max(1, summary["steps"])
  fmt = network_lib.format_duration
  lines = [
      f"  time per step     compute {fmt(summary['compute_s'] / steps)}, "
      f"communication {fmt(summary['comm_s'] / steps)} "
      f"({share(summary['comm_share'])} of the nominal time: compute and "
      "communication at the nominal speed, without waiting"
      + (f"; clock as if {s['clock_params']} parameters"
         if s.get("clock_params") else "") + ")"]
  if summary.get("wait_s"):
    lines.append(
        f"  waiting           {fmt(summary['wait_s'] / steps)} per step for "
        f"the slowest workers ({share(summary['wait_share'])} of the simulated "
        "time: slow speeds, stragglers, faults)")
  return lines


def money(dollars: float) -> str:
  """Dollars to the cent, or to three digits below a cent."""
  return f"${dollars:,.2f}" if dollars >= 0.01 else f"${dollars:.3g}"


def cost_line(figures: dict, prices: dict) -> str:
  """The total and the parts priced: "$1.23: 0.5 GPU-hours at $2/GPU-hour
  = $1.00, 2.5 GB sent at $0.09/GB = $0.23" (``figures`` as
  ``_cost.figures`` makes them, ``prices`` with gpu_price and
  egress_price)."""
  parts = []
  if figures.get("compute_cost_usd") is not None:
    parts.append(f"{figures['gpu_hours']:.4g} GPU-hours at "
                 f"{money(prices['gpu_price'])}/GPU-hour = "
                 f"{money(figures['compute_cost_usd'])}")
  if figures.get("traffic_cost_usd") is not None:
    parts.append(f"{figures['traffic_gb']:.4g} GB sent at "
                 f"{money(prices['egress_price'])}/GB = "
                 f"{money(figures['traffic_cost_usd'])}")
  return f"{money(figures['cost_usd'])}: " + ", ".join(parts)


def startup_line(st: dict) -> str:
  """The summary's start-up breakdown in one line: where the seconds
  before the first logged row went."""
  parts = [(name, st.get(key)) for key, name in telemetry.STARTUP_PHASES]
  text = ", ".join(f"{name} {value:.1f} s" for name, value in parts
                   if value is not None)
  after = st.get("first_row_after_start_s")
  if after is not None:
    rest = after - sum(value for _, value in parts if value is not None)
    if rest >= 0.05:  # arguments, the dataset's files, the writers
      text += f", other {rest:.1f} s"
    step = st.get("first_step_after_start_s")
    first_step = "" if step is None else f"first step {step:.1f} s, "
    text += (f"; {first_step}first row {after:.1f} s after the process "
             "started")
  return text
