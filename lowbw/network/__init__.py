"""Network model: collectives and the bytes each worker sends."""

from lowbw.network._collectives import (COLLECTIVES, Channel, all_gather,
                                        channel, ring_allreduce)
from lowbw.network._planner import plan

__all__ = ["COLLECTIVES", "Channel", "all_gather", "channel", "plan", "ring_allreduce"]
