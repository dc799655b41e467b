"""How payloads from W workers combine, and what each worker puts on the wire.

Payload bytes are what one worker encodes for one communication event; wire
bytes are what that worker sends under the collective's algorithm. The
simulated clock (bandwidth, latency, topology) builds on these numbers.
"""

from typing import NamedTuple


class Channel(NamedTuple):
  """The static cost of one kind of message, per worker and per event.

  Attributes:
    payload_bytes: bytes one worker encodes for the event (exact, from shapes).
    wire_bytes: bytes one worker sends under ``collective``.
    collective: the algorithm, e.g. ``"ring_allreduce"``.
    group_size: how many workers take part in one collective.
  """

  payload_bytes: int
  wire_bytes: float
  collective: str
  group_size: int


def ring_allreduce(payload_bytes: int, group_size: int) -> Channel:
  """A ring all-reduce: reduce-scatter then all-gather, 2(n-1)/n x payload.

  Each of the n members sends n-1 chunks of payload/n bytes in each phase.
  A group of one sends nothing.
  """
  return Channel(int(payload_bytes),
                 ring_allreduce_wire(payload_bytes, group_size),
                 "ring_allreduce", group_size)


def ring_allreduce_wire(payload_bytes: float, group_size: int) -> float:
  """Bytes each member sends in a ring all-reduce (the one formula: the
  topologies' ring and two-tier algorithms use it too)."""
  return 2.0 * (group_size - 1) / group_size * payload_bytes


def all_gather_wire(payload_bytes: float, group_size: int) -> float:
  """Bytes each member sends in a ring all-gather."""
  return float((group_size - 1) * payload_bytes)


def all_gather(payload_bytes: int, group_size: int) -> Channel:
  """A ring all-gather of payloads that cannot be summed (own indices, own
  scales): every member forwards the n-1 other payloads once, so it sends
  (n-1) x payload, and every member ends with all n payloads to decode.
  """
  return Channel(int(payload_bytes), all_gather_wire(payload_bytes, group_size),
                 "all_gather", group_size)


COLLECTIVES = {"ring_allreduce": ring_allreduce, "all_gather": all_gather}


def channel(collective: str, payload_bytes: int, group_size: int) -> Channel:
  """The ``Channel`` of ``collective`` ("ring_allreduce" or "all_gather")."""
  return COLLECTIVES[collective](payload_bytes, group_size)
