"""The analytical planner: how long a decentralized pre-training run takes on
given hardware and network, and in which mode it must run.

Its model is the one of "Decentralized Training Simulator: Technical
Documentation" (no arXiv number; section numbers (§) below refer to it);
docs/planner.md states every formula and every reading of it taken here.

Pure Python arithmetic, no JAX: the planner answers a what-if in microseconds,
so sweeps are plain loops.

Example:
  >>> from lowbw.network import plan
  >>> out = plan(parameters=300)  # 300B dense at FP16 on 2,304 GB nodes
  >>> out["mode"], out["pipeline_stages"], out["groups"]
  ('pp_group_diloco', 3, 24)
"""

import math

from lowbw import _validate
from lowbw.network import _clock
from lowbw.network._collectives import Channel
from lowbw.network._hardware import check_speeds
from lowbw.network._profile import profile as make_profile
from lowbw.network import _units
from lowbw.telemetry import _cost

# The seed's §9 table, §7.2 growth rates, and the switches it leaves implicit.
PLAN_DEFAULTS = {
    "parameters": 144.0,            # billions; all experts for MoE
    "active_params": 24.0,          # billions; used only when moe=True
    "tokens": 12.0,                 # trillions
    "num_nodes": 72,
    "pflops_per_node": 32.0,        # peak PFLOP/s per node
    "vram_per_node": 2304.0,        # GB (1e9 B) per node
    "bandwidth": "100Mbps",         # WAN, per node, symmetric
    "latency": "50ms",              # WAN, one-way (a 100 ms round trip)
    "mfu": 0.4,
    "inner_steps": 128,             # H
    "compression": 16.0,            # pseudo-gradient ratio vs FP16
    "local_batch": 131072,          # tokens per node and inner step
    "micro_batches": 8,             # M (pipeline parallelism)
    "precision": "FP16",
    "streaming": True,
    "nodes_per_group": 8,
    "regional_bandwidth": "1Gbps",
    "regional_latency": "10ms",     # one-way (a 20 ms round trip)
    "regional_steps": 16,           # regional syncs per global sync
    "moe": False,
    "moe_layers": 32,
    "expert_parallelism": "none",
    "hierarchical": False,
    "straggler_mitigation": "none",
    "speeds": None,                 # per-node speed multipliers (a fleet)
    "dylu": False,                  # time-budgeted rounds (DyLU)
    "activation_compression": None,  # None: 1, 2, 4 for FP16, FP8, FP4
    "hw_growth": 0.137,             # OOM/year (§7.2)
    "sw_growth": 0.477,
    "invest_growth": 0.544,
    "gpu_price": None,              # $ per node-hour (None: not priced)
    "egress_price": None,           # $ per GB sent (None: not priced)
    # The links as the clock prices them: "ideal" is the document's model
    # (latency + bytes / bandwidth); "calibrated" or a profile file adds
    # what measured runs cost (lowbw.network.Profile).
    "network_profile": "ideal",
    # The token efficiency: None for the heuristic of §4, a number, or a
    # law fitted to a probe study's measured efficiency (lowbw.fit of
    # token_efficiency in H, params and workers).
    "efficiency": None,
}

# The unit of each input and output that is a number, for help and printing;
# outputs not listed take theirs from their name's suffix (``t_sync_s``).
UNITS = {
    "parameters": "billion", "active_params": "billion",
    "tokens": "trillion", "num_nodes": "nodes", "pflops_per_node": "PFLOP/s",
    "vram_per_node": "GB", "bandwidth": "bit/s", "latency": "s, one-way",
    "mfu": "of peak FLOP/s", "inner_steps": "steps",
    "compression": "x smaller than FP16", "local_batch": "tokens",
    "micro_batches": "micro-batches", "nodes_per_group": "nodes",
    "regional_bandwidth": "bit/s", "regional_latency": "s, one-way",
    "regional_steps": "regional syncs per global sync", "moe_layers": "layers",
    "activation_compression": "x smaller than FP16",
    "hw_growth": "orders of magnitude per year",
    "sw_growth": "orders of magnitude per year",
    "invest_growth": "orders of magnitude per year",
    "gpu_price": "$ per node-hour", "egress_price": "$ per GB sent",
    "gpu_hours": "node-hours", "traffic_gb": "GB sent",
    "bytes_per_param": "bytes", "expert_parallel_degree": "nodes",
    "largest_model_on_one_node_b": "billion parameters",
    "pipeline_stages": "stages", "groups": "pipeline groups",
    "n_eff": "nodes", "replicas": "model replicas", "compute_flops": "FLOP",
    "hidden_size": "(model width)", "total_steps": "inner steps",
    "outer_steps": "syncs", "alpha": "(efficiency lost per decade of H)",
    "h_eff": "inner steps", "efficiency": "(fraction of ideal)",
    "global_mfu": "(fraction of peak FLOP/s)",
    "hfu": "(fraction of peak FLOP/s)",
}
_SUFFIX_UNITS = {"_usd": "$", "_s": "s", "_gb": "GB", "_days": "days", "_years": "years",
                 "_bits": "bits", "_factor_sync": "x", "_factor_regional": "x",
                 "_factor_pipeline": "x"}


def unit(name: str) -> str:
  """The unit an input or output is in ("" for names, switches and modes)."""
  if name in UNITS:
    return UNITS[name]
  return next((u for suffix, u in _SUFFIX_UNITS.items()
               if name.endswith(suffix)), "")


BYTES_PER_PARAM = {"FP16": 16, "FP8": 14, "FP4": 13}  # β of §2.1
ACTIVATION_COMPRESSION = {"FP16": 1.0, "FP8": 2.0, "FP4": 4.0}  # §8.1
EXPERT_PARALLELISMS = ("none", "global", "regional")
MITIGATIONS = ("none", "threshold", "backup")
MODES = ("diloco", "hierarchical_diloco", "pp_group_diloco", "pp_over_wan")

# The seed's uncalibrated constants, named so docs and tests can cite them.
STRAGGLER_COEFFICIENT = 0.05  # §5.1
ALPHA_BASE = 0.08             # §4.3
THRESHOLD_PENALTY = 1.15      # §4.5
BACKUP_NODES = 1.1            # §5.2: 10% of the nodes are backups
BACKUP_DELAY_KEPT = 0.3       # §5.2: backups remove 70% of the delay
EFFICIENCY_FLOOR = 0.4        # §4.1
MFU_PER_HFU = 0.8             # §6.2
MFU_WARNING = 0.6             # §1.3
HIDDEN_COEFFICIENT = 0.03     # §3.3: h = 0.03·√P
PAYLOAD_BITS_PER_PARAM = 16   # §3.1: one FP16 value per parameter

SECONDS_PER_DAY = 86400.0
DAYS_PER_YEAR = 365.25

# Below 1e4 parameters §4.3's alpha divides by zero or flips sign.
_MIN_PARAMETERS_B = 1e-5


def straggler_factor(n: float) -> float:
  """Expected slowdown waiting for the slowest of ``n`` peers (§5.1).

  f(n) = 1 + 0.05·log2(n). Fewer than one peer (a fractional group count,
  possible with backup workers) waits for nobody: f = 1, never below.

  Example:
    >>> round(straggler_factor(72), 2)
    1.31
  """
  return 1.0 + STRAGGLER_COEFFICIENT * math.log2(max(float(n), 1.0))


def alpha(parameters_b: float) -> float:
  """Efficiency sensitivity to H for a model of ``parameters_b`` billion
  parameters (§4.3): larger models tolerate rarer syncs."""
  return ALPHA_BASE / (1.0 + math.log10(parameters_b) / 5.0)


def longest_run_years(hw_growth: float, sw_growth: float,
                      invest_growth: float) -> float:
  """Epoch AI's longest sensible run, L = 1 / ((g_H + g_S + g_I)·ln 10) (§7.1).

  Growth rates are in orders of magnitude per year; ln 10 turns them into
  natural-log rates.
  """
  return 1.0 / ((hw_growth + sw_growth + invest_growth) * math.log(10.0))


# ---------------------------------------------------------------- validation


def _finite(check):
  """A number check that also refuses inf (JSON cannot carry it)."""
  def checked(field, value):
    value = check(field, value)
    if not math.isfinite(value):
      raise _validate.fail(field, value, "expected a finite number")
    return value
  return checked


def _boolean(field, value):
  if not isinstance(value, bool):
    raise _validate.fail(field, value, "expected true or false")
  return value


def _model_size(field, value):
  value = _finite(_validate.positive_float)(field, value)
  if value <= _MIN_PARAMETERS_B:
    raise _validate.fail(field, value, "expected a number of billions > 1e-05 "
                         "(the efficiency model of §4.3 needs > 10,000 "
                         "parameters)")
  return value


def _precision(field, value):
  # Case-insensitive so "fp8" works on the command line.
  name = value.upper() if isinstance(value, str) else value
  return _validate.one_of(field, name, BYTES_PER_PARAM)


def _optional_ratio(field, value):
  return None if value is None else _finite(_validate.positive_float)(field,
                                                                      value)


def _bandwidth(field, value):
  # One per node: a ring exchange runs at its slowest link.
  return min(_units.bandwidth(v, field) for v in _units.link_values(value))


def _latency(field, value):
  return max(_units.duration(v, field) for v in _units.link_values(value))


_LINKS = ("bandwidth", "latency", "regional_bandwidth", "regional_latency")


def _check_link_counts(s: dict, given: dict) -> None:
  """A per-node list has one value per node (regional ones, per group)."""
  for name in _LINKS:
    n = len(_units.link_values(given[name]))
    regional = name.startswith("regional")
    want = (s["num_nodes"] // s["nodes_per_group"] if regional
            else s["num_nodes"])
    if n not in (1, want):
      raise _validate.fail(name, given[name], f"expected one value, or {want}"
                           f", one per {'group' if regional else 'node'} "
                           f"({n} given)")


_number = _finite(_validate.positive_float)
_delay = _finite(_validate.non_negative)
_CHECKS = {
    "parameters": _model_size, "active_params": _model_size,
    "tokens": _number, "num_nodes": _validate.positive_int,
    "pflops_per_node": _number, "vram_per_node": _number,
    "bandwidth": _bandwidth, "latency": _latency,
    "mfu": _validate.fraction, "inner_steps": _validate.positive_int,
    "compression": _number, "local_batch": _validate.positive_int,
    "micro_batches": _validate.positive_int, "precision": _precision,
    "streaming": _boolean, "nodes_per_group": _validate.positive_int,
    "regional_bandwidth": _bandwidth, "regional_latency": _latency,
    "regional_steps": _validate.positive_int, "moe": _boolean,
    "moe_layers": _validate.positive_int,
    "expert_parallelism": lambda f, v: _validate.one_of(f, v,
                                                        EXPERT_PARALLELISMS),
    "hierarchical": _boolean,
    "straggler_mitigation": lambda f, v: _validate.one_of(f, v, MITIGATIONS),
    "speeds": lambda f, v: check_speeds(v), "dylu": _boolean,
    "activation_compression": _optional_ratio,
    "hw_growth": _delay, "sw_growth": _delay, "invest_growth": _delay,
    "gpu_price": _cost.check_price, "egress_price": _cost.check_price,
    "network_profile": lambda f, v: (make_profile(v), v)[1],
    "efficiency": lambda f, v: _efficiency_input(f, v),
}

# What a fitted efficiency law may take, by the name its runs have it
# (``Fit.inputs``): -> the plan's figure.
_LAW_INPUTS = {"H": "h_eff", "num_params": "params", "workers": "replicas"}


def _efficiency_input(field: str, value):
  """None, a number > 0, or a fitted law (an object with ``x``,
  ``inputs``, ``y`` and ``predict``, as ``lowbw.fit`` returns) of inputs
  the plan knows."""
  if value is None:
    return None
  if all(hasattr(value, a) for a in ("x", "inputs", "y", "predict")):
    unknown = [n for n, i in zip(value.x, value.inputs)
               if i not in _LAW_INPUTS]
    if unknown:
      raise _validate.fail(field, f"a law of {', '.join(value.x)}",
                           f"{unknown[0]!r} is not an input the plan has; "
                           "expected a law of " + ", ".join(_LAW_INPUTS))
    return value
  return _number(field, value)


def _uses_groups(s: dict) -> bool:
  return s["hierarchical"] or (s["moe"] and
                               s["expert_parallelism"] == "regional")


def _check_together(s: dict) -> None:
  if s["moe"] and s["active_params"] > s["parameters"]:
    raise _validate.fail("active_params", s["active_params"],
                         f"expected at most parameters={s['parameters']:g} "
                         "(active parameters are part of the total)")
  if _uses_groups(s) and s["nodes_per_group"] > s["num_nodes"]:
    raise _validate.fail("nodes_per_group", s["nodes_per_group"],
                         f"expected at most num_nodes={s['num_nodes']}")
  growth = s["hw_growth"] + s["sw_growth"] + s["invest_growth"]
  if growth <= 0:
    raise ValueError("hw_growth + sw_growth + invest_growth = 0 is invalid: "
                     "expected a sum > 0 (the longest run would be infinite)")


# Earlier names, still accepted: (input it sets, its unit, to that unit).
# Their latency was a round trip; ``latency`` is one-way, as lowbw train's.
DEPRECATED = {
    "bandwidth_mbps": ("bandwidth", "Mbit/s", lambda v: v * 1e6),
    "latency_ms": ("latency", "ms round trip", lambda v: v / 2e3),
    "regional_bandwidth_mbps": ("regional_bandwidth", "Mbit/s",
                                lambda v: v * 1e6),
    "regional_latency_ms": ("regional_latency", "ms round trip",
                            lambda v: v / 2e3),
}


def _renamed(inputs: dict) -> dict:
  """``inputs`` with deprecated names turned into the inputs they set."""
  out = {k: v for k, v in inputs.items() if k not in DEPRECATED}
  for old, value in inputs.items():
    if old not in DEPRECATED:
      continue
    new, _, convert = DEPRECATED[old]
    if new in inputs:
      raise _validate.fail(old, value, f"give {new} only ({old} is its "
                           "deprecated name)")
    check = _number if new.endswith("bandwidth") else _delay
    out[new] = convert(check(old, value))
  return out


def resolve_inputs(**inputs) -> dict:
  """The planner's inputs, validated, with ``PLAN_DEFAULTS`` filled in.

  Bandwidths come back in bit/s and latencies in one-way seconds, whatever
  form they were given in.

  Raises:
    ValueError: naming the field, the value and what is allowed, for an
      unknown name or a bad value.
  """
  unknown = sorted(set(inputs) - set(PLAN_DEFAULTS) - set(DEPRECATED))
  if unknown:
    raise _validate.fail(unknown[0], inputs[unknown[0]],
                         "unknown input; allowed: " + ", ".join(PLAN_DEFAULTS))
  s = {**PLAN_DEFAULTS, **_renamed(inputs)}
  given = {name: s[name] for name in _LINKS}
  for name, check in _CHECKS.items():
    s[name] = check(name, s[name])
  _check_together(s)
  _check_link_counts(s, given)
  if s["speeds"] is not None and len(s["speeds"]) not in (1, s["num_nodes"]):
    raise _validate.fail("speeds", inputs.get("speeds"), f"expected one "
                         f"value, or {s['num_nodes']}, one per node "
                         f"({len(s['speeds'])} given)")
  return s


# ------------------------------------------------------ compute and memory


def _active_params(s: dict) -> float:
  """Parameters per token, in units: a dense model uses all of them."""
  return (s["active_params"] if s["moe"] else s["parameters"]) * 1e9


def _ep_degree(s: dict) -> int | None:
  """Nodes the experts are spread over (§2.4); None without EP."""
  if not s["moe"] or s["expert_parallelism"] == "none":
    return None
  return (s["num_nodes"] if s["expert_parallelism"] == "global"
          else s["nodes_per_group"])


def _node_memory_gb(s: dict) -> float:
  """Model state one node must hold (§2.1, §2.4)."""
  beta = BYTES_PER_PARAM[s["precision"]]
  total, shared = s["parameters"] * 1e9, _active_params(s)
  degree = _ep_degree(s)
  if degree is None:
    return total * beta / 1e9
  return (shared + (total - shared) / degree) * beta / 1e9


def _stages(memory_gb: float, vram_gb: float) -> int:
  # Rounded so that a model of exactly VRAM/β (144B at FP16) fits despite
  # float error; sharding starts only when memory strictly exceeds VRAM.
  return max(1, math.ceil(round(memory_gb / vram_gb, 9)))


def _t_ep(s: dict) -> float:
  """All-to-all latency per step (§1.5): two round trips per MoE layer.

  Regional EP pays the regional latency only in hierarchical mode; without a
  regional tier the seed gives it no cost.
  """
  if _ep_degree(s) is None:
    return 0.0
  if s["expert_parallelism"] == "global":
    one_way = s["latency"]
  elif s["hierarchical"]:
    one_way = s["regional_latency"]
  else:
    return 0.0
  return 2.0 * _round_trip(one_way) * s["moe_layers"]


def _round_trip(one_way_s: float) -> float:
  return 2.0 * one_way_s


def _t_comp(s: dict) -> float:
  """One inner step on one node (§1.2), expert all-to-all included; with
  per-node ``speeds``, the slowest node's (a synchronous round waits for
  it), or the fastest's under DyLU (each node takes the steps its speed
  allows in the fastest's time)."""
  flops = 6.0 * _active_params(s) * s["local_batch"]
  speeds = s["speeds"] or (1.0,)
  speed = max(speeds) if s["dylu"] else min(speeds)
  return flops / (s["pflops_per_node"] * speed * 1e15 * s["mfu"]) + _t_ep(s)


# ------------------------------------------------------------ communication


def _exchange_s(bits: float, bandwidth_bps: float, latency_s: float,
                profile) -> float:
  """Upload and download ``bits`` plus one round trip of the one-way
  ``latency_s`` (§3.1, before f): the clock's own parameter-server
  collective (``_clock.channel_costs``), so the planner and a simulated run
  price a sync alike, with the same network profile."""
  net = _clock.network(bandwidth_bps, latency_s, topology="parameter_server",
                       hardware=None, profile=make_profile(profile))
  sync = Channel(payload_bytes=bits / 8.0, wire_bytes=0.0,
                 collective="ring_allreduce", group_size=2)
  return _clock.channel_costs(net, {"sync": sync}, 2)["sync"].seconds


def _overlap(compute_s: float, comm_s: float, streaming: bool) -> float:
  """Streaming hides the shorter of compute and communication (§3.1)."""
  return max(compute_s, comm_s) if streaming else compute_s + comm_s


def _n_eff(s: dict) -> float:
  """Nodes that add throughput: backups only stand in (§5.2)."""
  if s["straggler_mitigation"] == "backup":
    return s["num_nodes"] / BACKUP_NODES
  return float(s["num_nodes"])


def _factor(s: dict, n: float) -> float:
  """The straggler factor for ``n`` peers after the mitigation (§5.2)."""
  mitigation = s["straggler_mitigation"]
  if mitigation == "threshold":
    return 1.0  # nobody waits for the slowest 10%
  f = straggler_factor(n)
  if mitigation == "backup":
    return 1.0 + BACKUP_DELAY_KEPT * (f - 1.0)
  return f


def _sync_bits(s: dict) -> float:
  """Pseudo-gradient payload per sync (§3.1); precision does not enter."""
  return s["parameters"] * 1e9 * PAYLOAD_BITS_PER_PARAM / s["compression"]


def _pipeline(s: dict, t_comp: float, stages: int) -> dict:
  """One GPipe step of an S-stage pipeline (§3.3, §3.4).

  Links are regional when hierarchical (a pipeline's nodes share a region),
  else the WAN; each of the M + S − 1 micro-batch slots pays the latency.
  """
  hidden = HIDDEN_COEFFICIENT * math.sqrt(s["parameters"] * 1e9)
  ratio = s["activation_compression"]
  if ratio is None:
    ratio = ACTIVATION_COMPRESSION[s["precision"]]
  activation_bits = 8.0 * s["local_batch"] * hidden * 2.0 / ratio
  if s["hierarchical"]:
    bandwidth, latency = s["regional_bandwidth"], s["regional_latency"]
  else:
    bandwidth, latency = s["bandwidth"], s["latency"]
  m = s["micro_batches"]
  t_micro_comm = 2.0 * activation_bits / m / bandwidth
  t_micro_comp = t_comp / m
  f = _factor(s, stages)
  slot = t_micro_comp + (t_micro_comm + _round_trip(latency)) * f
  return {"hidden_size": hidden, "activation_bits": activation_bits,
          "straggler_factor_pipeline": f, "t_micro_comp_s": t_micro_comp,
          "t_micro_comm_s": t_micro_comm,
          "t_pp_step_s": (m + stages - 1) * slot}


# -------------------------------------------------------------------- modes


def _diloco(s: dict, t_comp: float, n_eff: float) -> dict:
  """Mode A (§3.1): every node a replica, one WAN sync every H steps."""
  f = _factor(s, n_eff)
  t_sync = _exchange_s(_sync_bits(s), s["bandwidth"], s["latency"],
                       s["network_profile"]) * f
  h = s["inner_steps"]
  return {"replicas": n_eff, "straggler_factor_sync": f, "t_sync_s": t_sync,
          "t_outer_s": _overlap(h * t_comp, t_sync, s["streaming"]),
          "steps_per_outer": h}


def _hierarchical(s: dict, t_comp: float, n_eff: float) -> dict:
  """Mode A′ (§3.2): regional syncs every H steps, a WAN sync every H·R."""
  bits, size = _sync_bits(s), s["nodes_per_group"]
  groups = n_eff / size
  f_regional, f_global = _factor(s, size), _factor(s, groups)
  t_regional = _exchange_s(bits, s["regional_bandwidth"],
                           s["regional_latency"],
                           s["network_profile"]) * f_regional
  t_global = _exchange_s(bits, s["bandwidth"], s["latency"],
                         s["network_profile"]) * f_global
  regional_cycle = _overlap(s["inner_steps"] * t_comp, t_regional,
                            s["streaming"])
  global_cycle = _overlap(s["regional_steps"] * regional_cycle, t_global,
                          s["streaming"])
  return {"replicas": n_eff, "groups": groups,
          "straggler_factor_regional": f_regional,
          "straggler_factor_sync": f_global, "t_regional_s": t_regional,
          "t_regional_cycle_s": regional_cycle, "t_global_s": t_global,
          "t_sync_s": t_global, "t_outer_s": global_cycle,
          "steps_per_outer": s["inner_steps"] * s["regional_steps"]}


def _pp_groups(s: dict, t_comp: float, n_eff: float, stages: int) -> dict:
  """Mode C (§3.4), or the pure pipeline fallback when fewer than 2 groups."""
  pipeline = _pipeline(s, t_comp, stages)
  # Rounded before the floor so that 66/1.1/3 counts as 20 groups, not 19.
  groups = math.floor(round(n_eff / stages, 9))
  if groups < 2:  # one pipeline over the WAN, no DiLoCo (Appendix A)
    return {**pipeline, "mode": "pp_over_wan", "groups": groups,
            "replicas": max(1.0, n_eff / stages), "t_sync_s": 0.0,
            "t_outer_s": pipeline["t_pp_step_s"], "steps_per_outer": 1}
  f = _factor(s, groups)
  t_sync = _exchange_s(_sync_bits(s), s["bandwidth"], s["latency"],
                       s["network_profile"]) * f
  h = s["inner_steps"]
  return {**pipeline, "mode": "pp_group_diloco", "groups": groups,
          "replicas": float(groups), "straggler_factor_sync": f,
          "t_sync_s": t_sync,
          "t_outer_s": _overlap(h * pipeline["t_pp_step_s"], t_sync,
                                s["streaming"]),
          "steps_per_outer": h}


def _h_eff(s: dict, mode: str) -> float:
  """Inner steps between global syncs, as efficiency sees them (§4.4).

  A pure pipeline has no local steps: it is synchronous training.
  """
  if mode == "pp_over_wan":
    return 1.0
  h = float(s["inner_steps"])
  return h * math.sqrt(s["regional_steps"]) if s["hierarchical"] else h


def _efficiency(s: dict, h_eff: float, replicas: float
                ) -> tuple[float, float]:
  """η of §4.1 and α of §4.3; or η given (a number, or a fitted law read
  at the plan's H, parameters and replicas)."""
  a = alpha(s["parameters"])
  given = s["efficiency"]
  if given is None:
    penalty = (THRESHOLD_PENALTY if s["straggler_mitigation"] == "threshold"
               else 1)
    return max(EFFICIENCY_FLOOR, (1.0 - a * math.log10(h_eff)) / penalty), a
  if not hasattr(given, "predict"):
    return float(given), a
  at = {"h_eff": h_eff, "params": s["parameters"] * 1e9,
        "replicas": replicas}
  eta = given.predict({n: at[_LAW_INPUTS[i]] for n, i in
                       zip(given.x, given.inputs)})[0][given.y]
  if not eta > 0:
    raise _validate.fail("efficiency", f"a law of {', '.join(given.x)}",
                         f"it gives {eta:.3g} at H={h_eff:g}; expected a "
                         "token efficiency > 0 (outside what it was "
                         "fitted on?)")
  return float(eta), a


def efficiency_source(s: dict) -> str:
  """Where the plan's efficiency comes from."""
  given = s["efficiency"]
  if given is None:
    return "heuristic (§4: 1 - alpha log10 H)"
  if hasattr(given, "predict"):
    return f"fitted {given.y} in {', '.join(given.x)}"
  return "given"


# ------------------------------------------------------------------ warnings

# An input the chosen configuration does not use, and when it is unused.
_IGNORED_WHEN = {
    "active_params": (lambda s, o: not s["moe"], "the model is dense "
                      "(moe=False): every parameter is active"),
    "expert_parallelism": (lambda s, o: not s["moe"], "the model is dense "
                           "(moe=False)"),
    "moe_layers": (lambda s, o: o["t_ep_s"] == 0.0, "there is no expert "
                   "all-to-all latency (needs moe, expert_parallelism global, "
                   "or regional with hierarchical)"),
    "nodes_per_group": (lambda s, o: not _uses_groups(s), "needs hierarchical "
                        "or regional expert parallelism"),
    "regional_bandwidth": (lambda s, o: not s["hierarchical"],
                                "hierarchical=False"),
    "regional_latency": (lambda s, o: not s["hierarchical"],
                            "hierarchical=False"),
    "regional_steps": (lambda s, o: not s["hierarchical"],
                       "hierarchical=False"),
    "micro_batches": (lambda s, o: o["pipeline_stages"] == 1,
                      "the model fits on one node (no pipeline)"),
    "activation_compression": (lambda s, o: o["pipeline_stages"] == 1,
                               "the model fits on one node (no pipeline)"),
    "inner_steps": (lambda s, o: o["mode"] == "pp_over_wan",
                    "a pure pipeline has no DiLoCo sync"),
    "compression": (lambda s, o: o["mode"] == "pp_over_wan",
                    "a pure pipeline has no DiLoCo sync"),
}


def traffic_bytes(s: dict, out: dict) -> float:
  """Bytes all nodes send over the planned run, as the time model moves
  them, each message counted once by its sender: every model copy uploads
  the sync payload V at each sync (every node in DiLoCo; hierarchical: every
  node at each of the R regional syncs, one copy per region at the WAN
  sync; one copy per pipeline group, split over its stages), and each of a
  pipeline's S - 1 stage boundaries carries the activation bits every inner
  step. Stretched by 1 / efficiency, as the time is (more tokens)."""
  mode, v_bytes = out["mode"], out["sync_bits"] / 8
  copies = {"diloco": s["num_nodes"],
            "hierarchical_diloco": s["num_nodes"] * (
                s["regional_steps"] + 1 / s["nodes_per_group"]),
            "pp_group_diloco": out["groups"], "pp_over_wan": 0}[mode]
  sent = out["outer_steps"] * copies * v_bytes
  if out["pipeline_stages"] > 1:
    sent += (out["replicas"] * (out["pipeline_stages"] - 1) *
             out["total_steps"] * out["activation_bits"] / 8)
  return sent / out["efficiency"]


def _warnings(s: dict, given: dict, out: dict) -> list[str]:
  notes = []
  if s["mfu"] > MFU_WARNING:
    notes.append(f"mfu={s['mfu']:g} is above {MFU_WARNING:g}, which is rarely "
                 "achieved in practice (§1.3)")
  if "mfu" not in given and _active_params(s) < _clock.SMALL_MODEL:
    notes.append(f"mfu={s['mfu']:g} is the default, what models of billions "
                 f"of parameters reach; a model of {_active_params(s):,.0f} "
                 "parameters reaches less (a 30.8M-parameter one reached "
                 "0.16 of an L40S's peak): give the mfu you measured")
  if out["mode"] == "pp_over_wan":
    notes.append(
        f"pure pipeline parallelism over the network: {s['num_nodes']} nodes "
        f"make fewer than 2 groups of {out['pipeline_stages']} stages, so there "
        "is no DiLoCo and every micro-batch pays the link latency; extremely "
        "slow (Appendix A). Consider lower precision, a smaller model, MoE "
        "with expert parallelism, or more nodes")
    if out["n_eff"] < out["pipeline_stages"]:
      notes.append(
          f"{out['n_eff']:g} effective nodes cannot hold even one "
          f"{out['pipeline_stages']}-stage pipeline of "
          f"{out['memory_per_node_gb']:,.0f} GB; the plan assumes one anyway")
  if (out["mode"] == "pp_group_diloco" and s["hierarchical"]
      and out["pipeline_stages"] > s["nodes_per_group"]):
    notes.append(
        f"a pipeline of {out['pipeline_stages']} stages is larger than "
        f"nodes_per_group={s['nodes_per_group']}, yet its links are taken as "
        "regional")
  if out["efficiency"] == EFFICIENCY_FLOOR:
    notes.append(f"efficiency is at its floor of {EFFICIENCY_FLOOR:g} (§4.1): "
                 "the model's estimate is not meaningful this far out")
  if out["total_years"] > out["longest_run_years"]:
    notes.append(
        f"the run takes {out['total_years']:.3g} years, longer than the "
        f"longest sensible run of {out['longest_run_years']:.3f} years (§7): "
        "starting later on better hardware and software would finish sooner")
  renamed = _renamed(given)
  for name, (unused, why) in _IGNORED_WHEN.items():
    if name in renamed and _differs(name, renamed[name]) and unused(s, out):
      notes.append(f"{name} is ignored: {why}")
  return notes + _deprecation_notes(given, s)


def _differs(name: str, value) -> bool:
  check = _CHECKS[name]
  return check(name, value) != check(name, PLAN_DEFAULTS[name])


def _deprecation_notes(given: dict, s: dict) -> list[str]:
  notes = []
  for old, (new, unit, _) in DEPRECATED.items():
    if old in given:
      shown = (repr(_units.format_bandwidth(s[new]))
               if new.endswith("bandwidth")
               else repr(_units.format_duration(s[new])) + " (one-way)")
      notes.append(f"{old} ({unit}) is deprecated: give {new}, here "
                   f"{new}={shown}")
  return notes


# ---------------------------------------------------------------------- plan


def plan(**inputs) -> dict:
  """Plans a decentralized pre-training run with the model of the Decentralized Training Simulator: Technical Documentation.

  Picks the mode by Appendix A's decision tree: DiLoCo when one node holds
  the model (after expert parallelism for MoE), else DiLoCo across groups of
  pipeline-parallel nodes, else a single pipeline over the network.

  Args:
    **inputs: any of ``PLAN_DEFAULTS`` (snake_case of the seed's §9 table
      plus MoE, hierarchy, straggler and growth settings); the rest keep
      their defaults.

  Returns:
    A flat dict of outputs with units in the key names (``t_comp_s``,
    ``memory_per_node_gb``, ``total_days``...), the ``mode``, and
    ``warnings``, a list of strings. Values that a mode does not have (the
    pipeline step of DiLoCo) are None.

  Raises:
    ValueError: naming the field, the value and what is allowed.

  Example:
    >>> out = plan(num_nodes=72, bandwidth="1Gbps", latency="50ms")
    >>> out["mode"]
    'diloco'
  """
  s = resolve_inputs(**inputs)
  memory_gb = _node_memory_gb(s)
  stages = _stages(memory_gb, s["vram_per_node"])
  t_comp, n_eff = _t_comp(s), _n_eff(s)
  if stages > 1:
    timing = _pp_groups(s, t_comp, n_eff, stages)
  elif s["hierarchical"]:
    timing = {**_hierarchical(s, t_comp, n_eff), "mode": "hierarchical_diloco"}
  else:
    timing = {**_diloco(s, t_comp, n_eff), "mode": "diloco"}
  out = _outputs(s, timing, memory_gb, stages, t_comp, n_eff)
  _check_finite(s, out)
  # Every node, spares included, is held for the whole run.
  out.update(_cost.figures(s["num_nodes"], out["total_days"] * SECONDS_PER_DAY,
                           traffic_bytes(s, out), s["gpu_price"],
                           s["egress_price"]))
  out["warnings"] = _warnings(s, inputs, out)
  return out


# A plan longer than this is no plan (the universe is ~5e17 s old); beyond it
# the figures lose all meaning and, further out, overflow to inf.
MAX_PLAN_S = 1e30


def _check_finite(s: dict, out: dict) -> None:
  """Refuses inputs whose plan runs past ``MAX_PLAN_S`` (a link of 1e-300
  bit/s, a latency of 1e300 s), naming the link setting that makes the
  sync so long, or the compute when the sync is not to blame."""
  total_s = out["total_days"] * SECONDS_PER_DAY
  if math.isfinite(total_s) and total_s <= MAX_PLAN_S:
    return
  if math.isfinite(out["t_comp_s"]) and not (
      out["t_sync_s"] is None or out["t_sync_s"] < out["t_comp_s"]):
    wire_s = out["sync_bits"] / s["bandwidth"] if s["bandwidth"] else math.inf
    field = "latency" if s["latency"] >= wire_s else "bandwidth"
    value = (_units.format_duration(s["latency"]) if field == "latency"
             else _units.format_bandwidth(s["bandwidth"]))
  else:
    field, value = "pflops_per_node", f"{s['pflops_per_node']:g}"
  raise _validate.fail(field, value, f"the plan's run would take "
                       f"{total_s:.3g} s; expected a value that keeps it "
                       f"below {MAX_PLAN_S:g} s")


_OPTIONAL = ("straggler_factor_sync", "straggler_factor_regional",
             "straggler_factor_pipeline", "t_regional_s", "t_regional_cycle_s",
             "t_global_s", "hidden_size", "activation_bits", "t_micro_comp_s",
             "t_micro_comm_s", "t_pp_step_s")


def _outputs(s, timing, memory_gb, stages, t_comp, n_eff) -> dict:
  """Assembles the result in a stable key order."""
  tokens = s["tokens"] * 1e12
  mode = timing["mode"]
  total_steps = tokens / (s["local_batch"] * timing["replicas"])
  outer_steps = total_steps / timing["steps_per_outer"]
  raw_s = outer_steps * timing["t_outer_s"]
  h_eff = _h_eff(s, mode)
  efficiency, a = _efficiency(s, h_eff, timing["replicas"])
  total_s = raw_s / efficiency
  compute_flops = 6.0 * _active_params(s) * tokens
  mfu = compute_flops / (s["num_nodes"] * s["pflops_per_node"] * 1e15 *
                         total_s)
  beta = BYTES_PER_PARAM[s["precision"]]
  out = {
      "mode": mode,
      "bytes_per_param": beta,
      "memory_required_gb": s["parameters"] * beta,
      "expert_parallel_degree": _ep_degree(s),
      "memory_per_node_gb": memory_gb,
      "largest_model_on_one_node_b": s["vram_per_node"] / beta,
      "pipeline_stages": stages,
      "groups": timing.get("groups"),
      "n_eff": n_eff,
      "replicas": timing["replicas"],
      "compute_flops": compute_flops,
      "t_ep_s": _t_ep(s),
      "t_comp_s": t_comp,
      "sync_bits": _sync_bits(s) if mode != "pp_over_wan" else 0.0,
  }
  out.update({key: timing.get(key) for key in _OPTIONAL})
  out.update({
      "t_sync_s": timing["t_sync_s"],
      "t_outer_s": timing["t_outer_s"],
      "total_steps": total_steps,
      "outer_steps": outer_steps,
      "alpha": a,
      "h_eff": h_eff,
      "efficiency": efficiency,
      "efficiency_source": efficiency_source(s),
      "time_before_efficiency_days": raw_s / SECONDS_PER_DAY,
      "total_days": total_s / SECONDS_PER_DAY,
      "total_years": total_s / SECONDS_PER_DAY / DAYS_PER_YEAR,
      "global_mfu": mfu,
      "hfu": mfu / MFU_PER_HFU,
      "longest_run_years": longest_run_years(
          s["hw_growth"], s["sw_growth"], s["invest_growth"]),
  })
  return out
