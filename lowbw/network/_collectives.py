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
    group_size: how many members take part in one collective.
    tier: where the members are, for a topology with regions: "regional"
      (one region, its fast links), "global" (one member per region, across
      the wide-area network), or None (the topology decides from the group).
    shards: how many workers send each member's payload together, each a
      1/shards part over its own link (1: the member sends it alone). The
      workers of a region all hold the region's model, so hierarchical
      DiLoCo's global tier splits each region's message over its workers.
    down_bytes: what one worker downloads from a parameter server for the
      event, when it is not the collective's usual result (one payload for
      a reduction, the n-1 others for an all-gather): SPES's workers upload
      their own experts and download every expert. None: the usual.
    received_bytes: bytes one worker receives under ``collective`` when it
      differs from what it sends (a parameter server's download); None: as
      many as it sends (every ring algorithm: each member forwards what it
      receives, and the chunks it sends are the chunks another receives).
    bucketed: a gradient all-reduce issued in buckets during the backward
      pass, as PyTorch DDP's reducer does (lowbw's ``ddp``): the network
      profile says which algorithm times it on a real cluster
      (``Profile.bucketed_allreduce``).
  """

  payload_bytes: int
  wire_bytes: float
  collective: str
  group_size: int
  tier: str | None = None
  shards: int = 1
  down_bytes: int | None = None
  received_bytes: float | None = None
  bucketed: bool = False


def received_wire(channel: Channel) -> float:
  """Bytes one worker receives for one event of ``channel``."""
  if channel.received_bytes is None:
    return channel.wire_bytes
  return channel.received_bytes


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


def tree_allreduce_wire(payload_bytes: float, group_size: int) -> float:
  """Bytes the busiest member sends in a double binary tree all-reduce
  (NCCL's tree): each half of the payload is reduced up one tree and
  broadcast down it; a member is a leaf of one tree (it sends its half up)
  and, from 4 members on, has two children in the other (it sends that half
  up and to each child): 2 x payload; 1.5 x with 3 members, 1 x with 2."""
  n = group_size
  if n <= 1:
    return 0.0
  return payload_bytes * (1.0 if n == 2 else 1.5 if n == 3 else 2.0)


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


def exchange(payload_bytes: int, down_bytes: int, num_workers: int
             ) -> Channel:
  """One worker's exchange with a parameter server, on its own time: it
  uploads ``payload_bytes`` and downloads ``down_bytes`` (the current global
  model), whatever the other workers do (asynchronous DiLoCo). Its seconds
  are each worker's own (``Cost.seconds_W``)."""
  return Channel(int(payload_bytes), float(payload_bytes), "exchange",
                 num_workers, down_bytes=int(down_bytes),
                 received_bytes=float(down_bytes))


def pairwise(payload_bytes: int, group_size: int = 2) -> Channel:
  """An exchange between two peers (gossip): each sends its payload to the
  other and receives the other's, one hop, with no collective over the
  fleet (NoLoCo's pair averaging)."""
  if group_size != 2:
    raise ValueError(f"a pairwise exchange has 2 members, not {group_size}")
  return Channel(int(payload_bytes), float(payload_bytes), "pairwise", 2)


COLLECTIVES = {"ring_allreduce": ring_allreduce, "all_gather": all_gather,
               "pairwise": pairwise}


TIERS = ("regional", "global")


def channel(collective: str, payload_bytes: int, group_size: int,
            tier: str | None = None, shards: int = 1) -> Channel:
  """The ``Channel`` of ``collective`` ("ring_allreduce" or "all_gather");
  with ``shards``, each worker sends 1/shards of what a member sends."""
  c = COLLECTIVES[collective](payload_bytes, group_size)
  return c._replace(wire_bytes=c.wire_bytes / shards, tier=tier,
                    shards=shards)


def tiers_of(channels: dict[str, Channel]) -> list[str]:
  """The tiers ``channels`` use, in ``TIERS`` order (none for a strategy
  without tiers)."""
  used = {c.tier for c in channels.values()}
  return [t for t in TIERS if t in used]
