"""Network model: collectives and the bytes each worker sends."""

from lowbw.network._collectives import (COLLECTIVES, Channel, all_gather,
                                        channel, ring_allreduce)

__all__ = ["COLLECTIVES", "Channel", "all_gather", "channel", "ring_allreduce"]
