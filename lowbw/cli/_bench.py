"""``lowbw bench``: simulator throughput and memory against a single-replica
baseline, one configuration per worker count."""

import argparse
import json
import os
import subprocess
import sys

from lowbw import _validate
from lowbw.config import (_config, _fields, _lanes, _resolve,
                          _strategy_fields)
from lowbw.config._settings import check_settings
from lowbw.cli import _plot, _train

# The model and run settings the bench shares with lowbw train (text data
# for the language models, the digits for mlp and cnn).
_MODEL_FIELDS = ("model", "layers", "d_model", "heads", "seq_len",
                 *_resolve.GPT_BLOCK, "experts", "top_k", "expert_hidden",
                 "hidden", "channels", "batch_size", "seed")
# Bench settings besides the train settings it shares (model, strategy, ...).
BENCH_DEFAULTS = {"workers": "1,8,32", "rounds": 1, "repeats": 3, "warmup": 1}
NETWORK_GROUP = "network (with --lane)"


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "bench", help="throughput and memory vs a single-replica baseline",
      description="Simulator throughput and memory against a single-replica "
      "baseline (one model at batch W*b), one configuration per worker "
      "count. Each worker count runs in its own process (clean peak "
      "memory); figures are medians over --repeats timed calls after "
      "--warmup calls. See docs/performance.md.")
  add = p.add_argument
  for name in _MODEL_FIELDS:  # lowbw train's, from the Config's table
    field = _config.FIELDS[name]
    add(field.flag, **_fields.flag_kwargs(field))
  data = _config.FIELDS["data"]
  add(data.flag, help=data.help.split(";")[0] + " (default: text for the "
      "language models, digits for mlp and cnn; a dataset of your own "
      "where W*b outgrows the digits' 1,438 examples)")
  add("--workers", help="worker counts, comma-separated (default 1,8,32)")
  add("--rounds", type=int, help="rounds of H steps per timed call (default 1)")
  add("--repeats", type=int, help="timed calls per program (default 3)")
  add("--warmup", type=int, help="untimed calls first (default 1)")
  add("--json", nargs="?", const=True, metavar="",
      help="print every configuration's figures as JSON on stdout instead "
      "of the table (a flag, as in lowbw plan and lowbw eval)")
  add("--json-out", metavar="FILE", help="also write every configuration's "
      "figures to FILE as JSON")
  add("--plot", help="write tokens/s and memory vs W here (.png; needs "
      "matplotlib)")
  add("--child", help=argparse.SUPPRESS)
  g = p.add_argument_group("strategy", "as in lowbw train; the baseline "
                           "uses the same inner optimizer")
  for field in _config.FIELDS.values():
    if field.group in ("strategy", "compression", "optimizers") and \
        field.name != "workers":
      g.add_argument(field.flag, **_fields.flag_kwargs(field))
  _train.add_scale_flags(p)
  _add_lane_flags(p)
  # The other settings the bench passes to the build (``_compute``), such
  # as the paired DDP lane, whose cost it then measures.
  for name in _resolve.COMPUTE_SETTINGS:
    field = _config.FIELDS[name]
    if field.group not in _train.SCALE_GROUPS:
      p.add_argument(field.flag, **_fields.flag_kwargs(field))
  p.set_defaults(run=run)


def _add_lane_flags(p) -> None:
  """``--lane`` (``lowbw train``'s flag, from the same field) and the
  network settings whose causes the lanes remove."""
  g = p.add_argument_group(
      "lanes", "with --lane: the run with 0, 1, ... of its lanes (the "
      "first k), one device, their compiled chunk programs timed "
      "interleaved; wall time against the run without lanes, and the "
      "state's bytes with every lane's state (docs/lanes.md)")
  lanes = _config.FIELDS[_lanes.FIELD]
  g.add_argument(lanes.flag, **_fields.flag_kwargs(lanes))
  g = p.add_argument_group(NETWORK_GROUP, "with --lane only: the faults, "
                           "stragglers and clock of the run whose lanes "
                           "are measured (as in lowbw train)")
  for field in _network_fields():
    g.add_argument(field.flag, **_fields.flag_kwargs(field))


def _network_fields() -> list:
  return [f for f in _config.FIELDS.values()
          if f.group.startswith("network") and not f.python]


def _settings(args) -> dict:
  s = dict(_train.DEFAULTS)
  s.update({"data": "text"})
  s.update(BENCH_DEFAULTS)
  given = {k: v for k, v in vars(args).items()
           if v is not None and k in s}
  s = _strategy_fields.fill({**s, **given}, set(given))
  s["model"] = s["model"] or _strategy_fields.spec_of(s).model or "gpt"
  if s["model"] in ("mlp", "cnn") and "data" not in given:
    s["data"] = "digits"
  for name in ("rounds", "repeats", "warmup"):
    _validate.positive_int(name, s[name])
  s["given"] = sorted(given)
  if not s[_lanes.FIELD]:
    for field in _network_fields():
      if field.name in given:
        raise _validate.fail(field.name, given[field.name], "a network "
                             "setting is measured with --lane only (the "
                             "bench times the round program without the "
                             "clock otherwise)")
  return s


def _lane_config(s: dict, workers: int):
  """The run whose lanes ``lowbw bench --lane`` measures, as ``lowbw
  train`` would make it of the same flags (the lanes are checked here)."""
  from lowbw.config import Config
  given = {k: s[k] for k in s["given"] if k in _config.FIELDS}
  return Config(**{**given, "model": s["model"], "data": s["data"],
                   "strategy": s["strategy"],
                   "workers": workers, "seed": s["seed"]})


def _measure(s: dict, workers: int) -> dict:
  from lowbw import bench
  if s[_lanes.FIELD]:
    return bench.measure_lanes(_lane_config(s, workers), bench.Timing(
        rounds=s["rounds"], repeats=s["repeats"], warmup=s["warmup"],
        seed=s["seed"]))
  source = _resolve.build_data(s)
  model = _resolve.build_model(s, source)
  strategy = _strategy_fields.build(s)
  return bench.measure(
      model, source, strategy, _strategy_fields.build_inner(s), workers,
      s["batch_size"], bench.Timing(rounds=s["rounds"], repeats=s["repeats"],
                                    warmup=s["warmup"], seed=s["seed"]),
      **_compute(s))


def _compute(s: dict) -> dict:
  """How the workers compute (devices, precision, memory), from the
  settings."""
  return {k: s[k] for k in _resolve.COMPUTE_SETTINGS}


def run(args: argparse.Namespace) -> int:
  _train.join_processes(args)
  if args.child:  # one configuration, figures as JSON on stdout
    s = json.loads(args.child)
    print("BENCH " + json.dumps(_measure(s, s["workers"])))
    return 0
  s = _settings(args)
  _check_outputs(args)
  counts = _resolve.ints("workers", s["workers"])
  if s[_lanes.FIELD]:
    return _run_lanes(args, s, counts)
  # Validate everything once, here, before any child process starts.
  _resolve.build_model(s, _resolve.build_data(s))
  import jax
  strategy = _strategy_fields.build(s)
  for w in counts:  # the build's own checks, before any child starts
    try:
      check_settings(
          strategy, workers=w, batch_size=s["batch_size"],
          steps=s["rounds"] * strategy.period,
          **_compute(s))
    except _validate.ConfigError as e:
      raise _validate.fail(e.field, e.value, f"{e.allowed} (at --workers "
                           f"{w})") from None
  rows = []
  isolate = jax.process_count() == 1
  for i, w in enumerate(counts):
    print(f"[{i + 1}/{len(counts)}] W={w} ...", file=sys.stderr, flush=True)
    if isolate:
      rows.append(_child(s, w))
    else:
      rows.append(_measure(s, w))
    print(format_row(rows[-1]), file=sys.stderr, flush=True)
  add_marginal(rows)
  if jax.process_index() == 0:
    _report(args, s, rows, format_table(s, rows) + "\n" + legend(s, rows))
    if args.plot:
      try:
        plot(rows, args.plot, s)
      except OSError as e:
        raise _unwritable("plot", args.plot, e) from None
  return 0


def _run_lanes(args, s: dict, counts: list[int]) -> int:
  """``lowbw bench --lane``: each worker count's lanes measured in a
  process of its own (``bench.measure_lanes``), a table per count."""
  if args.plot:
    raise _validate.fail("plot", args.plot, "draws worker counts without "
                         "lanes; with --lane the table and --json hold the "
                         "figures")
  for w in counts:  # every lane checked before any child starts
    try:
      _lane_config(s, w)
    except _validate.ConfigError as e:
      if len(counts) == 1:
        raise
      raise _validate.fail(e.field, e.value, f"{e.allowed} (at --workers "
                           f"{w})") from None
  rows = []
  for i, w in enumerate(counts):
    print(f"[{i + 1}/{len(counts)}] W={w}, lanes {', '.join(s['lanes'])} "
          "...", file=sys.stderr, flush=True)
    rows.append(_child(s, w))
  _report(args, s, rows, "\n\n".join(format_lanes(s, r) for r in rows))
  return 0


def _report(args, s: dict, rows: list[dict], table: str) -> None:
  """The table on stdout (or, with --json, the figures as JSON), and the
  figures in the --json-out file."""
  figures = {"settings": s, "configurations": rows}
  print(json.dumps(figures, indent=2) if args.json else table)
  if args.json_out:
    try:
      with open(args.json_out, "w") as f:
        json.dump(figures, f, indent=2)
    except OSError as e:  # the table is printed: name the flag
      raise _unwritable("json_out", args.json_out, e) from None


def format_lanes(s: dict, r: dict) -> str:
  """A worker count's lane figures as a table (``bench.measure_lanes``)."""
  load = " to ".join("-" if x is None else f"{x:.2f}"
                     for x in r["load_average"])
  lines = [
      f"{s['strategy']} on {s['model']}, W={r['workers']}, "
      f"b={r['batch_size']}, H={r['H']}, {r['device']} "
      f"({r['devices']} used); "
      f"{r['rounds']} round(s) per timed call; the chunk programs of 0 to "
      f"{len(r['lanes'])} lane(s) timed interleaved, {r['repeats']} "
      f"repeat(s); load average {load}",
      " | ".join(["lanes", "s per call", "x no lanes (median)",
                  "x no lanes (range)", "state bytes",
                  "state of the added lane", "data bytes",
                  "lanes' bytes (plan)"])]
  for row in r["lane_rows"]:
    ratios = row["wall_ratios"]
    extra = row["lane_state_bytes"]
    lines.append(" | ".join([
        f"{len(row['lanes'])}" + (f" ({', '.join(row['lanes'])})"
                                  if row["lanes"] else ""),
        f"{row['median_s']:.4f}", f"{row['wall_ratio']:.2f}",
        f"{min(ratios):.2f}-{max(ratios):.2f}", f"{row['state_bytes']:,}",
        "-" if extra is None else f"{extra:,}",
        f"{row['data_bytes']:,}", f"{row['plan_lane_bytes']:,.0f}"]))
  return "\n".join(lines)


def _unwritable(field: str, path: str, error: OSError):
  reason = error.strerror or str(error) or type(error).__name__
  return _validate.fail(field, path, f"cannot be written ({reason})")


def _check_outputs(args) -> None:
  """Refuses, before anything is measured, a --json or --plot file that
  could not be written at the end (no such folder, no permission, a
  folder's name), so no benchmark runs for figures that would be lost."""
  if isinstance(args.json, str):  # the old form, --json FILE
    raise _validate.fail("json", args.json, "--json is a flag: it prints "
                         "the figures as JSON on stdout; write them to a "
                         f"file with --json-out {args.json}")
  if args.plot:
    _plot.check_image_file("plot", args.plot)
  for field in ("json_out", "plot"):
    path = getattr(args, field)
    if not path:
      continue
    existed = os.path.lexists(path)
    try:
      with open(path, "a"):  # appends nothing: an existing file is kept
        pass
    except OSError as e:
      raise _unwritable(field, path, e) from None
    if not existed:
      os.remove(path)


def _child(s: dict, workers: int) -> dict:
  child = json.dumps({**s, "workers": workers})
  proc = subprocess.run(
      [sys.executable, "-m", "lowbw", "bench", "--child", child],
      capture_output=True, text=True, env=dict(os.environ))
  for line in proc.stdout.splitlines():
    if line.startswith("BENCH "):
      return json.loads(line[len("BENCH "):])
  err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  if err.startswith("lowbw: error: "):  # the child's own one-line error
    raise ValueError(err[len("lowbw: error: "):])
  raise ValueError(f"workers={workers} is invalid: its benchmark failed: {err}")


def add_marginal(rows: list[dict]) -> None:
  """Memory per added worker between consecutive worker counts: the growth
  of the run's memory over the growth of W, free of fixed costs (runtime,
  compiled code, dataset). Against the state's own bytes per worker."""
  prev = None
  for r in sorted(rows, key=lambda r: r["workers"]):
    r["marginal_per_worker"] = r["marginal_ratio"] = None
    if prev is not None and r["workers"] > prev["workers"]:
      grow = ((r["run_bytes"] - prev["run_bytes"]) /
              (r["workers"] - prev["workers"]))
      r["marginal_per_worker"] = grow
      r["marginal_ratio"] = grow / r["theoretical_per_worker"]
    prev = r


def _mb(n):
  if n is None:
    return "-"
  return f"{n / 1e6:,.1f}" if abs(n) >= 1e6 else f"{n / 1e6:.3f}"


def format_row(r: dict) -> str:
  rate = (f"{r['tokens_per_s']:,.0f} tok/s" if r["tokens_per_s"] else
          f"{r['examples_per_s']:,.0f} ex/s")
  return (f"  W={r['workers']}: {rate}, efficiency {r['efficiency']:.3f}, "
          f"{_mb(r['memory_per_worker'])} MB/worker")


def format_table(s: dict, rows: list[dict]) -> str:
  lm = rows[0]["tokens_per_s"] is not None
  unit = "tokens/s" if lm else "examples/s"
  head = ["W", "worker-steps/s", unit, f"baseline {unit}", "efficiency",
          "sync % of round", "compile s", "peak MB", "MB/worker",
          "MB/added worker", "state MB/worker", "wire MB/round"]
  lines = [
      f"{s['strategy']} on {s['model']}, b={s['batch_size']}, H={s['H']}, "
      f"{rows[0]['device']}, devices={rows[0]['devices']}, "
      f"{rows[0]['worker_dtype']} workers, worker batch "
      f"{_groups(s, rows)}, micro-batch {rows[0]['minibatch_size'] or 'none'}"
      f", autocast {rows[0]['autocast']}"
      + ("; with a paired DDP lane (one more replica's compute at batch W*b"
         " each step)" if rows[0].get("shadow") else "")
      + "; baseline: one replica, batch W*b, "
      "same precision and micro-batches; "
      f"medians of {s['repeats']} timed calls; memory: "
      f"{rows[0]['memory_source']}",
  ]
  mfu = rows[0].get("mfu") is not None
  if mfu:  # a device with a known peak (bench.device_peak_flops)
    head[5:5] = ["MFU", "baseline MFU"]
  lines.append(" | ".join(head))
  for r in rows:
    rate = r["tokens_per_s"] if lm else r["examples_per_s"]
    base = r["baseline_tokens_per_s"] if lm else r["baseline_examples_per_s"]
    share = "-" if r["sync_share"] is None else f"{100 * r['sync_share']:.2f}"
    lines.append(" | ".join([
        str(r["workers"]), f"{r['worker_steps_per_s']:,.1f}", f"{rate:,.0f}",
        f"{base:,.0f}",
        f"{r['efficiency']:.3f}" + ("*" if noisy(s, r) else ""),
        *([f"{r['mfu']:.1%}", f"{r['baseline_mfu']:.1%}"] if mfu else []),
        share,
        f"{r['compile_s']:.1f}", _mb(r["peak_bytes"]),
        _mb(r["memory_per_worker"]), _mb(r["marginal_per_worker"]) + (
            "*" if (r["marginal_per_worker"] or 0) < 0 else ""),
        _mb(r["theoretical_per_worker"]),
        _mb(r["wire_bytes_per_round"])]))
  return "\n".join(lines)


# A figure whose timed calls spread more than this around their median, or
# with fewer repeats than NOISY_REPEATS, is marked as noise.
NOISY_SPREAD = 0.2
NOISY_REPEATS = 3


def noisy(s: dict, r: dict) -> bool:
  """Fewer than ``NOISY_REPEATS`` timed calls, or their efficiencies
  spread (max - min) over ``NOISY_SPREAD`` of their median."""
  ratios = r.get("efficiencies") or []
  if s["repeats"] < NOISY_REPEATS or len(ratios) < NOISY_REPEATS:
    return True
  return (max(ratios) - min(ratios)) > NOISY_SPREAD * r["efficiency"]


def legend(s: dict, rows: list[dict]) -> str:
  """What the table's figures mean, and which are noise."""
  lines = [
      "efficiency: the baseline's time over the simulator's for the same "
      "examples (1: the W workers cost no more than one model at batch W*b; "
      "at small W the simulator's fixed work per round, the sync and its "
      "state, weighs most, so well under 1 at W=1 is expected)",
      "MB/added worker: the growth of the run's memory from the previous "
      "worker count over the workers added (fixed costs cancel); "
      "state MB/worker: what each worker's parameters, optimizer state and "
      "residuals take"]
  lines.append(estimate_line(rows))
  if any(noisy(s, r) for r in rows):
    lines.append(
        f"* noise: fewer than {NOISY_REPEATS} timed calls, or their "
        f"efficiencies spread over {NOISY_SPREAD:.0%} of the median (a "
        "shared or busy CPU); rerun with --repeats 5 on an idle machine")
  if any((r["marginal_per_worker"] or 0) < 0 for r in rows):
    lines.append("* a negative MB/added worker is the allocator's and the "
                 "process's noise, not a saving: memory is read per process")
  return "\n".join(lines)


def estimate_line(rows: list[dict]) -> str:
  """The memory plan's estimate against the device allocator's measured
  peak, per worker count, or that the backend reports no such peak."""
  if all(r.get("device_peak_bytes") is None for r in rows):
    return ("memory estimate vs measured peak: none measured, this "
            f"backend ({rows[0]['device']}) reports no device peak "
            "(memory_stats has no peak_bytes_in_use); peak MB is the "
            "process's resident set")
  def one(r):
    ratio = r.get("estimate_over_device_peak")
    if r.get("device_peak_bytes") is None:
      return f"W={r['workers']} -"
    return (f"W={r['workers']} {_mb(r['memory_estimate_bytes'])} / "
            f"{_mb(r['device_peak_bytes'])} MB ("
            + ("-" if ratio is None else f"{ratio:.2f}") + ")")

  parts = [one(r) for r in rows]
  return ("memory estimate vs the device allocator's peak (the plan's "
          "bytes / the peak above what was in use before the build, and "
          "their ratio): " + ", ".join(parts))


def _groups(s: dict, rows: list[dict]) -> str:
  # None: all of a device's workers at once.
  chosen = sorted({r["worker_batch"] or r["workers"] // r["devices"]
                   for r in rows})
  given = s["worker_batch"]
  return (f"{given} ({', '.join(map(str, chosen))})" if given == "auto"
          else str(given or "all"))


def plot(rows: list[dict], path: str, s: dict) -> None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ModuleNotFoundError:
    raise ModuleNotFoundError(
        "plot=... needs matplotlib: pip install 'lowbw[plot]'") from None
  lm = rows[0]["tokens_per_s"] is not None
  key = "tokens_per_s" if lm else "examples_per_s"
  w = [r["workers"] for r in rows]
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  a.plot(w, [r[key] for r in rows], "o-", label="simulator")
  a.plot(w, [r["baseline_" + key] for r in rows], "s--",
         label="baseline (1 replica, batch W*b)")
  a.set_xscale("log", base=2)
  a.set_xlabel("workers W")
  a.set_ylabel(key.replace("_", " ").replace(" per s", "/s"))
  a.legend()
  a.set_title(f"{s['strategy']} on {s['model']}, b={s['batch_size']}")
  b.plot(w, [r["peak_bytes"] / 1e6 for r in rows], "o-", label="peak")
  b.plot(w, [r["run_bytes"] / 1e6 for r in rows], "^-",
         label="the run's own (state, data, activations)")
  b.plot(w, [r["theoretical_per_worker"] * r["workers"] / 1e6 for r in rows],
         "s--", label="W x (params + opt + residuals)")
  b.set_xscale("log", base=2)
  b.set_xlabel("workers W")
  b.set_ylabel(f"MB ({rows[0]['memory_source']})")
  b.legend()
  fig.tight_layout()
  _plot.save(fig, path)
