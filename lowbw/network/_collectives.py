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
  wire = 2.0 * (group_size - 1) / group_size * payload_bytes
  return Channel(int(payload_bytes), wire, "ring_allreduce", group_size)


def all_gather(payload_bytes: int, group_size: int) -> Channel:
  """A ring all-gather of payloads that cannot be summed (own indices, own
  scales): every member forwards the n-1 other payloads once, so it sends
  (n-1) x payload, and every member ends with all n payloads to decode.
  """
  wire = float((group_size - 1) * payload_bytes)
  return Channel(int(payload_bytes), wire, "all_gather", group_size)


COLLECTIVES = {"ring_allreduce": ring_allreduce, "all_gather": all_gather}


def channel(collective: str, payload_bytes: int, group_size: int) -> Channel:
  """The ``Channel`` of ``collective`` ("ring_allreduce" or "all_gather")."""
  return COLLECTIVES[collective](payload_bytes, group_size)
