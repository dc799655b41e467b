"""Network model: collectives and the bytes each worker sends."""

from lowbw.network._collectives import Channel, ring_allreduce

__all__ = ["Channel", "ring_allreduce"]
