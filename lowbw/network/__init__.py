"""Network model: collectives and their bytes, links and topologies, hardware,
stragglers and faults (the simulated clock), and the analytical planner."""

from lowbw.network._clock import (CATCH_UP, Clock, Network, NetParams, Pricing,
                                  Segments, at_time, round_end,
                                  channel_costs, price,
                                  check_network, comm_seconds, flops_per_step,
                                  net_params, network, participants,
                                  step_seconds, up_mask, waited_for)
from lowbw.network._collectives import (COLLECTIVES, Channel, all_gather,
                                        exchange,
                                        channel, received_wire,
                                        ring_allreduce, tiers_of)
from lowbw.network._faults import (MITIGATIONS, Faults, Stragglers,
                                   check_windows)
from lowbw.network._hardware import PRESETS, Hardware, hardware
from lowbw.network._planner import DEPRECATED as PLAN_DEPRECATED
from lowbw.network._planner import PLAN_DEFAULTS, plan
from lowbw.network._planner import resolve_inputs as resolve_plan_inputs
from lowbw.network._planner import unit as plan_unit
from lowbw.network._trace import Trace, is_trace
from lowbw.network._topology import (Cost, Flat, Hierarchical, Link, flat,
                                     hierarchical, hop, link, relinked)
from lowbw.network._units import (bandwidth, count, duration, flops,
                                  format_bandwidth, format_bytes,
                                  format_duration, link_values, memory)

__all__ = [
    "CATCH_UP", "Segments", "Trace", "at_time", "is_trace", "round_end",
    "COLLECTIVES", "Channel", "Clock", "Cost", "exchange", "Faults", "Flat", "Hardware",
    "Hierarchical", "Link", "hop", "relinked", "MITIGATIONS", "NetParams", "Network", "PRESETS",
    "Pricing", "Stragglers", "all_gather", "price", "bandwidth", "channel", "duration", "flat",
    "flops", "hardware", "hierarchical", "link", "network", "plan",
    "ring_allreduce", "PLAN_DEFAULTS", "link_values", "PLAN_DEPRECATED", "channel_costs",
    "check_network", "check_windows", "comm_seconds", "count",
    "flops_per_step", "format_bandwidth", "format_bytes", "format_duration",
    "memory", "net_params", "participants", "plan_unit", "received_wire",
    "resolve_plan_inputs", "step_seconds", "tiers_of", "up_mask",
    "waited_for",
]
