"""Network model: collectives and their bytes, links and topologies, hardware,
stragglers and faults (the simulated clock), and the analytical planner."""

from lowbw.network._clock import Clock, Network, NetParams, network
from lowbw.network._collectives import (COLLECTIVES, Channel, all_gather,
                                        channel, ring_allreduce)
from lowbw.network._faults import MITIGATIONS, Faults, Stragglers
from lowbw.network._hardware import PRESETS, Hardware, hardware
from lowbw.network._planner import plan
from lowbw.network._topology import (Cost, Flat, Hierarchical, Link, flat,
                                     hierarchical, link)
from lowbw.network._units import bandwidth, duration, flops

__all__ = [
    "COLLECTIVES", "Channel", "Clock", "Cost", "Faults", "Flat", "Hardware",
    "Hierarchical", "Link", "MITIGATIONS", "NetParams", "Network", "PRESETS",
    "Stragglers", "all_gather", "bandwidth", "channel", "duration", "flat",
    "flops", "hardware", "hierarchical", "link", "network", "plan",
    "ring_allreduce",
]
