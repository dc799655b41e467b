"""``lowbw retime``: a finished run's simulated time on another network."""

import argparse
import json
import os

from lowbw.config import _fields
from lowbw.config._resolve import build_network
from lowbw.network import _profile, _units

# The network settings a re-timing takes: those that change only the clock
# (the fields say which; stragglers, faults and traces would change the
# training, and ``retime`` refuses them), and the topology, whose time it
# prices (its bytes would differ: a re-timing reports none).
SETTINGS = tuple(f.name for f in _fields.RUN_FIELDS
                 if f.clock_only or f.name in ("topology", "group_size"))


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
      "lowbw train's; a setting not given is the network's the run ran on "
      "(a pipeline's stage links too: --stage-bandwidth and "
      "--stage-latency change only the hops' times).")
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
  """The network settings the flags give; for the rest the run's own (its
  config.json), else lowbw train's defaults (no stragglers, faults or
  traces)."""
  s = {name: f.default for name, f in _fields_of().items()}
  s.update(_run_settings(args.run_dir))
  s.update({name: getattr(args, name) for name in SETTINGS
            if getattr(args, name) is not None})
  return s


def _run_settings(run_dir: str) -> dict:
  """The re-timing settings of the network ``run_dir`` ran on, read back
  from its config.json (none for a run without a clock, or a folder
  ``retime`` refuses anyway)."""
  try:
    with open(os.path.join(run_dir, "config.json")) as f:
      net = json.load(f).get("network")
  except (OSError, ValueError, AttributeError):
    return {}
  if not isinstance(net, dict) or "bandwidth_bps" not in net:
    return {}
  s = {"bandwidth": _each(net["bandwidth_bps"], "bps"),
       "upload_bandwidth": None if "upload_bandwidth_bps" not in net
       else _each(net["upload_bandwidth_bps"], "bps"),
       "latency": _each(net["latency_s"], "s"),
       "overlap": net.get("overlap", False),
       "clock_params": net.get("clock_params")}
  if net.get("topology") == "hierarchical":
    s.update(topology="hierarchical", group_size=net["group_size"],
             regional_bandwidth=_each(net["regional_bandwidth_bps"], "bps"),
             regional_latency=_each(net["regional_latency_s"], "s"))
  else:
    s["topology"] = net.get("algorithm", "ring")
  hw = net.get("hardware")
  if isinstance(hw, dict):
    s.update(hardware=hw["name"], mfu=hw["mfu"], speeds=None if (
        hw.get("speeds") is None) else ",".join(map(repr, hw["speeds"])))
  if isinstance(net.get("profile"), dict):
    s["network_profile"] = _profile.from_description(net["profile"])
  else:  # written before network profiles: the ideal clock
    s["network_profile"] = "ideal"
  return s


def _each(value, unit: str) -> str:
  """A described link setting (one number, or one per worker) as a flag's
  text."""
  values = value if isinstance(value, list) else [value]
  return ",".join(f"{v!r}{unit}" for v in values)


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
  r = lowbw.retime(args.run_dir, build_network(s),
                   stage_bandwidth=s.get("stage_bandwidth"),
                   stage_latency=s.get("stage_latency"))
  if args.json:
    out = {k: v for k, v in r.items() if k != "history"}
    out["history"] = {"step": [int(x) for x in r["history"]["step"]],
                      "sim_time_s": [float(x) for x in
                                     r["history"]["sim_time_s"]]}
    print(json.dumps(out, indent=1, default=str))
    return 0
  print(f"{r['run']}: {r['steps']} steps")
  print(_time("as it ran", r["original_sim_time_s"]))
  print(_time("on the network", r["sim_time_s"], r) +
        f"\n  {'':<17} {_network_text(s)}")
  return 0


def _network_text(s: dict) -> str:
  """The settings timed, one line."""
  from lowbw.network import format_bandwidth, format_duration

  def each(text, unit):
    parse = _units.bandwidth if unit == "bw" else _units.duration
    shown = format_bandwidth if unit == "bw" else format_duration
    return ",".join(shown(parse(v)) for v in _units.link_values(text))
  topology = s["topology"] + (f" of {s['group_size']}" if s["group_size"]
                              else "")
  profile = s["network_profile"]
  if isinstance(profile, _profile.Profile):
    profile = next((name for name, p in _profile.NAMES.items()
                    if p == profile), "as the run's")
  return (f"{each(s['bandwidth'], 'bw')}, {each(s['latency'], 'lat')} "
          f"({topology}), {s['hardware']} at MFU {s['mfu']}, profile "
          f"{profile}")
