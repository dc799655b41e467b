"""Network model: collectives and their bytes, links and topologies, hardware,
stragglers and faults (the simulated clock), and the analytical planner."""

from lowbw.network._clock import (CATCH_UP, Clock, Network, NetParams, Pricing,
                                  at_time, round_end, price, check_network,
                                  comm_seconds, flops_per_step, net_params,
                                  network, participants, step_seconds,
                                  up_mask, waited_for)
from lowbw.network._collectives import (Channel, all_gather, exchange,
                                        channel, received_wire,
                                        ring_allreduce, tiers_of)
from lowbw.network._faults import Faults, Stragglers, check_windows
from lowbw.network._hardware import PRESETS, hardware
from lowbw.network._planner import plan
from lowbw.network._trace import Trace
from lowbw.network._topology import (Cost, Flat, Link, flat, hierarchical,
                                     link, relinked)
from lowbw.network._units import (bandwidth, count, duration, flops,
                                  format_bandwidth, format_bytes,
                                  format_duration, link_values, memory)

__all__ = [
    "Trace", "at_time", "round_end",
    "CATCH_UP", "Channel", "Clock", "Cost", "exchange", "Faults", "Flat",
    "Link", "relinked", "NetParams", "Network", "PRESETS",
    "Pricing", "Stragglers", "all_gather", "price", "bandwidth", "channel",
    "duration", "flat", "flops", "hardware", "hierarchical", "link",
    "network", "plan", "ring_allreduce", "link_values",
    "check_network", "check_windows", "comm_seconds", "count",
    "flops_per_step", "format_bandwidth", "format_bytes", "format_duration",
    "memory", "net_params", "participants", "received_wire",
    "step_seconds", "tiers_of", "up_mask", "waited_for",
]
