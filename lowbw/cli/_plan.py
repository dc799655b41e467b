"""``lowbw plan``: the analytical planner from flags, a config file, or a
sweep over one input."""

import argparse
import json
import math

from lowbw import _validate
from lowbw.config._files import read_config
from lowbw import network as net_lib
from lowbw.network import plan
from lowbw.network._units import link_values
from lowbw.telemetry import _cost
from lowbw.telemetry._metrics import COST_USD
from lowbw.cli._train import money
from lowbw.network._planner import (DEPRECATED, PLAN_DEFAULTS,
                                    resolve_inputs, unit)

# What each input means, for --help; the unit comes from the planner's table.
_HELP = {
    "parameters": "total parameters (MoE: all experts)",
    "active_params": "active parameters per token (MoE only)",
    "tokens": "training tokens",
    "num_nodes": "nodes, backups included",
    "pflops_per_node": "peak throughput per node",
    "vram_per_node": "memory per node (1 GB = 1e9 bytes)",
    "bandwidth": "WAN bandwidth per node and direction, as lowbw train's "
                 "--bandwidth: 100Mbps, 1Gbps, 125MB/s",
    "latency": "WAN latency, one-way as lowbw train's --latency (a sync "
               "pays a round trip, twice it): 50ms, 0.1s",
    "mfu": "per-node model FLOP utilization, (0, 1]",
    "inner_steps": "inner steps H between syncs",
    "compression": "pseudo-gradient compression ratio vs FP16",
    "local_batch": "tokens per node and inner step",
    "micro_batches": "pipeline micro-batches M",
    "precision": "FP16 | FP8 | FP4",
    "streaming": "overlap the sync with the next H inner steps",
    "nodes_per_group": "nodes per region (hierarchical, regional EP)",
    "regional_bandwidth": "bandwidth inside a region, e.g. 1Gbps",
    "regional_latency": "latency inside a region, one-way, e.g. 10ms",
    "regional_steps": "how often the WAN syncs",
    "moe": "mixture of experts: compute with --active-params",
    "moe_layers": "MoE layers (expert all-to-all latency)",
    "expert_parallelism": "none | global | regional",
    "hierarchical": "regions sync often, the WAN every H x regional steps",
    "straggler_mitigation": "none | threshold | backup",
    "speeds": "per-node speed multipliers, comma-separated (a step is "
              "timed at the slowest node's speed, or the fastest's with "
              "--dylu)",
    "dylu": "time-budgeted rounds: each node takes the inner steps its "
            "speed allows in the fastest node's time",
    "activation_compression": "pipeline activation compression (auto: "
                              "1, 2, 4 for FP16, FP8, FP4)",
    "hw_growth": "hardware growth",
    "sw_growth": "software growth",
    "invest_growth": "investment growth",
    "network_profile": "what links and collectives cost beyond latency + "
    "bytes / bandwidth, as lowbw train's --network-profile: 'ideal' (the "
    "planner document's model), 'calibrated' (measured on real runs) or a "
    "YAML file of a profile",
    "gpu_price": "price of one node for an hour, as lowbw train's "
                 "--gpu-price (a node is the plan's device): outputs "
                 "compute_cost_usd = gpu_hours x this and cost_usd",
    "egress_price": "price of one GB sent, as lowbw train's --egress-price: "
                    "outputs traffic_cost_usd = traffic_gb x this and "
                    "cost_usd",
    "efficiency": "token efficiency in place of the heuristic 1 - alpha "
                  "log10 H: a number, or FIT.json, a law of "
                  "token_efficiency fitted by lowbw fit to a probe study "
                  "with the paired DDP lane (read at the plan's H, "
                  "parameters and replicas; docs/fits.md)",
}
# Inputs that are unset unless given (the help says "none", not "auto").
_PRICES = ("gpu_price", "egress_price")

# Field names whose errors the CLI renames to flags (see cli._one_line).
FLAG_NAMES = frozenset(PLAN_DEFAULTS) | frozenset(DEPRECATED) | {"sweep"}
# Inputs given with units, checked by lowbw train's parsers.
_QUANTITIES = {"bandwidth": net_lib.bandwidth, "latency": net_lib.duration,
               "regional_bandwidth": net_lib.bandwidth,
               "regional_latency": net_lib.duration}

# The columns of a sweep table, after the swept input.
SWEEP_COLUMNS = ("mode", "pipeline_stages", "groups", "memory_per_node_gb",
                 "t_comp_s", "t_sync_s", "t_outer_s", "total_days",
                 "efficiency", "global_mfu", "hfu")


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def efficiency(text):
  """``--efficiency``: a number, or a fitted law's JSON file (lowbw fit
  --out)."""
  if not isinstance(text, str):
    return text
  try:
    return float(text)
  except ValueError:
    pass
  from lowbw.studies import load_fit
  path = _validate.existing_file("efficiency", text, "a number or a fit's "
                                 "JSON file (lowbw fit --out)")
  try:
    return load_fit(path)
  except (OSError, ValueError, KeyError) as e:
    raise _validate.fail("efficiency", text, f"is not a fit lowbw fit wrote "
                         f"({e})") from None


def _kind(name: str):
  """The Python type of an input, from its default."""
  if name == "efficiency":
    return efficiency
  if name == "activation_compression" or name in _PRICES:
    return float
  if name == "speeds":
    return str
  return type(PLAN_DEFAULTS[name])


def _quantity(name: str):
  """An argparse type: the text, once its units parse (the error names
  the input, the value and the accepted forms)."""
  def check(text):
    parse_each(name, text)
    return text
  return check


def parse_each(name: str, text) -> list:
  """A quantity's one value, or its per-node list (``1Gbps,100Mbps``),
  each with its units."""
  return [_QUANTITIES[name](part, name) for part in link_values(text)]


def _help(name: str, default) -> str:
  shown = ("none" if name in _PRICES else "auto") if default is None \
      else default
  units = "" if name in _QUANTITIES or not unit(name) else f"{unit(name)}; "
  return f"{_HELP[name]} ({units}default {shown})"


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "plan", help="estimate a decentralized pre-training run analytically",
      description="How long a pre-training run takes across nodes joined by "
      "a slow network, and in which mode (DiLoCo, hierarchical DiLoCo, "
      "pipeline groups with DiLoCo, or a pure pipeline), from closed-form "
      "estimates of compute, memory, sync time and convergence efficiency "
      "(docs/planner.md). With no arguments: a 144B-parameter dense model, "
      "12T tokens, 72 nodes on 100 Mbit/s with 50 ms one-way latency. "
      "Bandwidth and latency take the units of lowbw train.")
  p.add_argument("--config", metavar="FILE", help="TOML or JSON file of these "
                 "inputs (keys as the long option names, '-' or '_'); flags "
                 "override it")
  # Appended, so that a second --sweep is refused rather than silently
  # replacing the first.
  p.add_argument("--sweep", metavar="NAME=V1,V2,...", action="append",
                 help="one row per value of one input, e.g. "
                 "num_nodes=8,72,512 (one --sweep at a time)")
  p.add_argument("--json", action="store_true", help="print JSON (a list "
                 "with --sweep) instead of a table")
  g = p.add_argument_group("inputs")
  for name, default in PLAN_DEFAULTS.items():
    text = _help(name, default)
    if isinstance(default, bool):
      g.add_argument(_flag(name), action=argparse.BooleanOptionalAction,
                     help=text)
    elif name in _QUANTITIES:
      g.add_argument(_flag(name), type=_quantity(name), metavar="X",
                     help=text)
    elif name in _PRICES:  # its error names the input and what it takes
      g.add_argument(_flag(name), type=_cost.price_type(name), metavar="X",
                     help=text)
    else:
      g.add_argument(_flag(name), type=_kind(name), metavar="X"
                     if _kind(name) is not str else "NAME", help=text)
  for old in DEPRECATED:  # earlier spellings, hidden; plan() warns
    g.add_argument(_flag(old), type=float, help=argparse.SUPPRESS)
  p.set_defaults(run=run)


def _file_quantity(name: str, value, path: str) -> None:
  """A quantity from the config file, checked as its flag would be: a bare
  number there is text on the command line ("50" could be seconds or
  milliseconds), so it needs its unit too, as in lowbw train's files."""
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  try:
    parse_each(name, str(value) if number else value)
  except _validate.ConfigError as e:
    raise _validate.fail(e.field, e.value, f"{e.allowed} (in config file "
                         f"{path})") from None


def given_inputs(args: argparse.Namespace) -> dict:
  """Config file < flags; only what was given, so plan() knows the rest are
  defaults."""
  names = [*PLAN_DEFAULTS, *DEPRECATED]
  given = read_config(args.config, names) if args.config else {}
  for name, value in given.items():
    if name in _QUANTITIES:
      _file_quantity(name, value, args.config)
  flags = {k: v for k, v in vars(args).items() if k in names and v is not None}
  for old, (new, _, _) in DEPRECATED.items():  # a flag beats the file's
    if old in flags and new in given:        # other spelling
      del given[new]
    if new in flags and old in given:
      del given[old]
  given.update(flags)
  if "efficiency" in given:  # a file's number, or its fit's path
    given["efficiency"] = efficiency(given["efficiency"])
  return given


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _sweep_value(name: str, text: str, spec: str):
  kind, word = _kind(name), text.strip()
  if name == "activation_compression" and word.lower() in ("auto", "none"):
    return None
  try:
    if kind is bool:
      if word.lower() not in _TRUE + _FALSE:
        raise ValueError(word)
      return word.lower() in _TRUE
    return kind(word)
  except ValueError:
    raise _validate.fail("sweep", spec, f"{word!r} is not a valid "
                         f"{kind.__name__} for {name}") from None


def parse_sweep(spec: str, given: dict) -> tuple[str, list]:
  """``NAME=V1,V2,...`` into the input's name and its typed values."""
  name, sep, values = spec.partition("=")
  name = name.strip().replace("-", "_")
  if not sep or name not in PLAN_DEFAULTS:
    raise _validate.fail("sweep", spec, "expected NAME=V1,V2,... with NAME "
                         "one of " + ", ".join(PLAN_DEFAULTS))
  if name in given:
    raise _validate.fail("sweep", spec, f"{name} is also given as "
                         f"{_flag(name)} or in --config; give it once")
  words = [w for w in values.split(",") if w.strip()]
  if not words:
    raise _validate.fail("sweep", spec, "expected at least one value")
  return name, [_sweep_value(name, w, spec) for w in words]


def one_sweep(specs: list[str] | None) -> str | None:
  """The one ``--sweep`` given (a table has one swept column), or None."""
  if specs and len(specs) > 1:
    raise _validate.fail("sweep", specs[1], f"one --sweep at a time (the "
                         f"first is {specs[0]!r}); run lowbw plan once per "
                         "value of the other input")
  return specs[0] if specs else None


def run(args: argparse.Namespace) -> int:
  sweep = one_sweep(args.sweep)
  given = given_inputs(args)
  if sweep:
    name, values = parse_sweep(sweep, given)
    rows = [(value, plan(**given, **{name: value})) for value in values]
    if args.json:
      print(json.dumps([{"inputs": resolve_inputs(**given, **{name: value}),
                         "outputs": out} for value, out in rows], indent=2,
                       default=str))
    else:
      print(format_sweep(name, rows))
    return 0
  out = plan(**given)
  if args.json:
    print(json.dumps({"inputs": resolve_inputs(**given), "outputs": out},
                     indent=2, default=str))
  else:
    print(format_plan(given, out))
  return 0


# ------------------------------------------------------------------ printing


def _fmt(value) -> str:
  """Readable numbers: thousands separators, four significant digits."""
  if value is None:
    return "-"
  if isinstance(value, bool):
    return "yes" if value else "no"
  if isinstance(value, int):
    return f"{value:,}"
  if isinstance(value, float):
    if value == 0 or not math.isfinite(value):
      return f"{value:g}"
    if abs(value) >= 1e15 or abs(value) < 1e-3:
      return f"{value:.3e}"
    if abs(value) >= 1e4:
      return f"{value:,.0f}"
    return f"{value:.4g}"
  return str(value)


def _with_unit(name: str, value) -> str:
  """``value`` and its unit: "144 billion", "100Mbps", "50ms one-way"."""
  if value is None or isinstance(value, (str, bool)):
    return _fmt(value)
  if name.endswith("_usd"):
    return money(value)
  if name.endswith("bandwidth"):
    return net_lib.format_bandwidth(value)
  if name.endswith("latency"):
    return net_lib.format_duration(value) + " one-way"
  return f"{_fmt(value)} {unit(name)}".rstrip()


def _block(title: str, pairs: list[tuple[str, str]]) -> list[str]:
  width = max(len(k) for k, _ in pairs)
  return [title] + [f"  {k:<{width}}  {v}" for k, v in pairs]


def format_plan(given: dict, out: dict) -> str:
  """Inputs (``*`` marks those given) and the outputs that apply."""
  resolved = resolve_inputs(**given)
  named = {DEPRECATED[k][0] if k in DEPRECATED else k for k in given}
  inputs = [(name + (" *" if name in named else ""), _with_unit(name, value))
            for name, value in resolved.items()]
  outputs = [(k, _with_unit(k, v)) for k, v in out.items()
             if k != "warnings" and v is not None]
  cost = ("" if out.get("cost_usd") is None else
          f", {money(out['cost_usd'])}")
  lines = [f"lowbw plan: {out['mode']}, {out['total_days']:,.1f} days, "
           f"efficiency {out['efficiency']:.3f}, global MFU "
           f"{out['global_mfu']:.2%}{cost}", ""]
  lines += _block("inputs (* given)", inputs) + [""]
  lines += _block("outputs", outputs)
  if out["warnings"]:
    lines += ["", "warnings"] + [f"  - {w}" for w in out["warnings"]]
  return "\n".join(lines)


def format_sweep(name: str, rows: list) -> str:
  """One row per swept value; warnings below, prefixed by the value."""
  # Priced rows add what they cost.
  columns = SWEEP_COLUMNS + tuple(
      c for c in (COST_USD,) if any(c in out for _, out in rows))
  header = (f"{name} ({unit(name)})" if unit(name) and name not in
            _QUANTITIES else name,) + columns
  table = [header] + [
      (_fmt(value),) + tuple(_fmt(out.get(c)) for c in columns)
      for value, out in rows]
  widths = [max(len(r[i]) for r in table) for i in range(len(header))]
  lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w)
                     for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
           for r in table]
  notes = [f"  {name}={_fmt(value)}: {w}" for value, out in rows
           for w in out["warnings"]]
  if notes:
    lines += ["", "warnings"] + notes
  return "\n".join(lines)
