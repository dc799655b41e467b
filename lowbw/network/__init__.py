"""Network model: collectives and their bytes, links and topologies, hardware,
stragglers and faults (the simulated clock), and the analytical planner."""

from lowbw.network._clock import (Clock, Network, NetParams, Pricing, at_time,
                                  round_end, price, network, participants)
from lowbw.network._collectives import (Channel, all_gather, exchange,
                                        channel, ring_allreduce)
from lowbw.network._faults import Faults, Stragglers
from lowbw.network._hardware import PRESETS, hardware
from lowbw.network._pipeline import SCHEDULES as PIPELINE_SCHEDULES
from lowbw.network._pipeline import Pipeline, Timeline, timeline
from lowbw.network._planner import plan
from lowbw.network._profile import NAMES as PROFILES
from lowbw.network._profile import Profile, profile
from lowbw.network._trace import Trace
from lowbw.network._topology import Cost, Link, flat, hierarchical, link
from lowbw.network._units import (bandwidth, count, duration, flops,
                                  format_bandwidth, format_bytes,
                                  format_duration, memory)

__all__ = [
    "Trace", "at_time", "round_end",
    "Channel", "Clock", "Cost", "exchange", "Faults",
    "Link", "NetParams", "Network", "PRESETS",
    "Pricing", "Stragglers", "all_gather", "price", "bandwidth", "channel",
    "duration", "flat", "flops", "hardware", "hierarchical", "link",
    "network", "plan", "ring_allreduce", "count",
    "format_bandwidth", "format_bytes", "format_duration",
    "memory", "participants", "Profile", "PROFILES", "profile",
    "Pipeline", "PIPELINE_SCHEDULES", "Timeline", "timeline",
]
