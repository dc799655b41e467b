"""``lowbw retime``: a finished run's simulated time on another network."""

import argparse
import json

from lowbw.config import _fields
from lowbw.config._resolve import build_network

# The network settings a re-timing takes: those that change only the clock
# (stragglers, faults and traces would change the training; ``retime``
# refuses them).
SETTINGS = ("bandwidth", "latency", "topology", "group_size",
            "regional_bandwidth", "regional_latency", "hardware", "mfu",
            "speeds", "overlap", "clock_params", "network_profile")


def _fields_of() -> dict:
  return {f.name: f for f in _fields.RUN_FIELDS if f.name in SETTINGS or (
      f.group == _fields.NETWORK_GROUP and not f.python)}


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "retime", help="a finished run's simulated time on another network",
      description="Re-time a finished run (its log folder, with ledger.npz) "
      "on another network without running it again: the same steps and "
      "messages, priced by that network's links, topology, hardware and "
      "profile. Equal to a re-run's simulated time. Runs whose training "
      "followed their clock (asynchronous strategies, time budgets, "
      "straggler mitigation, faults) are refused. The network flags are "
      "lowbw train's, with its defaults.")
  p.add_argument("run_dir", metavar="RUN", help="a run's log folder "
                 "(lowbw train --out)")
  p.add_argument("--json", action="store_true", help="print the result as "
                 "JSON (with the per-row sim_time_s)")
  g = p.add_argument_group("network (the other network)")
  fields = _fields_of()
  for name in SETTINGS:
    g.add_argument(fields[name].flag, dest=name,
                   **_fields.flag_kwargs(fields[name]))
  p.set_defaults(run=run)


def settings_of(args: argparse.Namespace) -> dict:
  """The network settings the flags give, lowbw train's defaults for the
  rest (no stragglers, faults or traces)."""
  s = {name: f.default for name, f in _fields_of().items()}
  s.update({name: getattr(args, name) for name in SETTINGS
            if getattr(args, name) is not None})
  return s


def _time(label: str, seconds, r: dict | None = None) -> str:
  from lowbw.network import format_duration
  if seconds is None:
    return f"  {label:<17} none (the run had no simulated clock)"
  text = f"  {label:<17} {format_duration(seconds)}"
  if r is not None and r["compute_share"] is not None:
    text += (f"; compute {format_duration(r['compute_s'])}, communication "
             f"{format_duration(r['comm_s'])} (CU, the compute share: "
             f"{r['compute_share']:.1%})")
  return text


def run(args: argparse.Namespace) -> int:
  import lowbw
  s = settings_of(args)
  r = lowbw.retime(args.run_dir, build_network(s))
  if args.json:
    out = {k: v for k, v in r.items() if k != "history"}
    out["history"] = {"step": [int(x) for x in r["history"]["step"]],
                      "sim_time_s": [float(x) for x in
                                     r["history"]["sim_time_s"]]}
    print(json.dumps(out, indent=1, default=str))
    return 0
  topology = s["topology"] + (f" of {s['group_size']}" if s["group_size"]
                              else "")
  print(f"{r['run']}: {r['steps']} steps")
  print(_time("as it ran", r["original_sim_time_s"]))
  print(_time("on the network", r["sim_time_s"], r) +
        f"\n  {'':<17} {s['bandwidth']}, {s['latency']} ({topology}), "
        f"{s['hardware']} at MFU {s['mfu']}, profile {s['network_profile']}")
  return 0
