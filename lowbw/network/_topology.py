"""Links and topologies: what one collective costs in seconds and wire bytes.

The alpha-beta model: a message hop costs the link's latency (alpha) plus its
bytes over the link's bandwidth (beta). A collective's algorithm says how many
hops are sequential and how many bytes each worker sends; the bytes are the
same ones the engine counts (a strategy's ``Channel``), so time and
``wire_bytes`` always agree. Links are full duplex and every worker has its own.

A fleet's links may differ: a topology's link is one ``Link`` for every worker
or a tuple of one per worker (hierarchical: per worker on the WAN, per region
inside regions). In a ring every step is synchronous, so each step takes as
long as its slowest hop; a parameter server waits for the slowest worker's
upload and download. A collective over fewer members than all (FedAvg's
islands, drawn at random during the run) is priced at the slowest link of
the fleet, since its members are not known when the run is priced.

A ``Channel``'s ``collective`` names the kind of combination its payloads need:
``"ring_allreduce"`` (summable payloads, reduced) or ``"all_gather"`` (every
payload delivered to every worker), or a point-to-point pattern that is no
collective: ``"exchange"`` with a server, ``"pairwise"`` with one peer. The
topology picks the algorithm.
"""

import math
from typing import NamedTuple

from lowbw import _validate
from lowbw.network import _units
from lowbw.network._collectives import (Channel, all_gather_wire,
                                        ring_allreduce_wire,
                                        tree_allreduce_wire)

ALGORITHMS = ("ring", "parameter_server")
_GATHER = "all_gather"
_EXCHANGE = "exchange"
_PAIRWISE = "pairwise"


class Link(NamedTuple):
  """A point-to-point link: bandwidth in bit/s, one-way latency per message,
  and an upload rate when it differs (an asymmetric link: ``bandwidth_bps``
  is then what it downloads at)."""

  bandwidth_bps: float
  latency_s: float
  upload_bps: float | None = None

  @property
  def up_bps(self) -> float:
    return self.bandwidth_bps if self.upload_bps is None else self.upload_bps

  def hop(self, nbytes: float) -> float:
    """Seconds for one message of ``nbytes`` sent while as many arrive (a
    ring's or a tree's step): the slower direction's."""
    return self.latency_s + 8.0 * nbytes / min(self.bandwidth_bps,
                                               self.up_bps)

  def send(self, nbytes: float) -> float:
    """Seconds to upload ``nbytes``."""
    return self.latency_s + 8.0 * nbytes / self.up_bps

  def receive(self, nbytes: float) -> float:
    """Seconds to download ``nbytes``."""
    return self.latency_s + 8.0 * nbytes / self.bandwidth_bps


# One link for every worker, or one per worker (or per region).
Links = Link | tuple[Link, ...]


def hop(links: Links, nbytes: float) -> float:
  """Seconds for one step in which every member sends ``nbytes`` over its
  own link at once: the slowest link's hop."""
  if isinstance(links, Link):
    return links.hop(nbytes)
  return max(one.hop(nbytes) for one in links)


def link(bandwidth="1Gbps", latency="50ms", field: str = "",
         upload=None) -> Links:
  """A ``Link`` from ``"100Mbps"``/``"1Gbps"``/bit/s and ``"50ms"``/seconds;
  a tuple of them, one per worker, from lists (``"1Gbps,100Mbps"`` or
  ``["1Gbps", "100Mbps"]``; a single value beside a list is every
  worker's). ``upload``: the links' upload rates where they differ from
  ``bandwidth`` (then their download rates), or None."""
  prefix = field + "_" if field else ""
  lists = {prefix + "bandwidth": _units.link_values(bandwidth),
           prefix + "latency": _units.link_values(latency),
           prefix + "upload_bandwidth": _units.link_values(upload)}
  # A list of bandwidths says how many links; else the longest list does.
  by = prefix + "bandwidth"
  if len(lists[by]) == 1:
    by = max(lists, key=lambda name: len(lists[name]))
  n = len(lists[by])
  for name, values in lists.items():
    if len(values) not in (1, n):
      raise _validate.fail(name, ",".join(map(str, values)), f"expected one "
                           f"value or {n}, one per link of {by}")
  bws, lats, ups = (v * n if len(v) == 1 else v for v in lists.values())
  made = tuple(Link(_units.bandwidth(b, prefix + "bandwidth"),
                    _units.duration(t, prefix + "latency"),
                    None if u is None else _units.bandwidth(
                        u, prefix + "upload_bandwidth"))
               for b, t, u in zip(bws, lats, ups))
  return made[0] if n == 1 else made


def relinked(links: Links, bandwidth=None, latency=None,
             field: str = "") -> Links:
  """``links`` with their bandwidth and/or latency replaced (a traced value
  of a sweep): one value sets every link's, a list one per link; their
  upload rates stay."""
  now = [links] if isinstance(links, Link) else list(links)
  bws = ([one.bandwidth_bps for one in now] if bandwidth is None
         else _units.link_values(bandwidth))
  lats = ([one.latency_s for one in now] if latency is None
          else _units.link_values(latency))
  ups = [one.upload_bps for one in now]
  return link(bws if len(bws) > 1 else bws[0],
              lats if len(lats) > 1 else lats[0], field,
              ups if len(set(ups)) > 1 else ups[0])


def count_links(links: Links) -> int:
  return 1 if isinstance(links, Link) else len(links)


def _describe(links: Links, prefix: str = "") -> dict:
  each = (links,) if isinstance(links, Link) else links

  def of(values):
    return values[0] if isinstance(links, Link) else list(values)
  out = {prefix + "bandwidth_bps": of([one.bandwidth_bps for one in each]),
         prefix + "latency_s": of([one.latency_s for one in each])}
  if any(one.upload_bps is not None for one in each):  # an asymmetric link
    out[prefix + "upload_bandwidth_bps"] = of([one.up_bps for one in each])
  return out


class Cost(NamedTuple):
  """One event of a channel: seconds on the clock and bytes each worker sends
  (mean over workers), under ``algorithm``; ``received_bytes``: what each
  receives, None when it equals what it sends; ``seconds_W``: an exchange's
  seconds for each worker on its own link (``seconds`` is the slowest)."""

  seconds: float
  wire_bytes: float
  algorithm: str
  received_bytes: float | None = None
  seconds_W: tuple[float, ...] | None = None


class Flat(NamedTuple):
  """Every worker on the same kind of link.

  Attributes:
    link: each worker's link: one ``Link`` for all, or a tuple of W.
    algorithm: "ring" (ring all-reduce / ring all-gather, bandwidth-optimal)
      or "parameter_server" (each worker uploads its payload and downloads the
      result; the server is assumed to have the bandwidth to serve all workers
      at once, as a sharded server does).
  """

  link: Links
  algorithm: str = "ring"

  def cost(self, channel: Channel, num_workers: int) -> Cost:
    if channel.collective == _EXCHANGE:
      return exchange(self.link, channel, num_workers)
    if channel.collective == _PAIRWISE:
      return pairwise(self.link, channel)
    if self.algorithm == "ring":
      return ring(self.link, channel)
    return parameter_server(self.link, channel)

  def describe(self) -> dict:
    return {"topology": "flat", "algorithm": self.algorithm,
            **_describe(self.link)}


class Hierarchical(NamedTuple):
  """Regions of ``group_size`` workers on fast regional links, regions joined
  over a wide-area network.

  Workers ``[g*s, (g+1)*s)`` form region g. A collective over all workers runs
  in two tiers (the 2-D algorithm of hierarchical all-reduce): a reduce-scatter
  inside each region, a ring all-reduce of each worker's 1/s shard across
  regions (every worker uses its own WAN link), an all-gather inside each
  region. All-gathers do the same with whole payloads. A channel of tier
  "regional" whose groups fit in a region (hierarchical DiLoCo's regional
  sync) runs as a ring on the regional links; one of tier "global" (one
  member per region) as a ring over the WAN. Other collectives over fewer
  workers than all (FedAvg islands, drawn at random) are timed as a ring over
  the WAN, since their members are in any region.
  """

  group_size: int
  regional: Links
  wan: Links

  def cost(self, channel: Channel, num_workers: int) -> Cost:
    n = channel.group_size
    if channel.collective == _EXCHANGE:  # each worker over its WAN link
      return exchange(self.wan, channel, num_workers)
    if channel.collective == _PAIRWISE:  # peers drawn from any region
      paired = pairwise(self.wan, channel)
      return paired._replace(algorithm="wan_pairwise")
    if channel.tier == "regional" and self.group_size % n == 0:
      inside = ring(self.regional, channel)
      return inside._replace(algorithm="regional_" + inside.algorithm)
    if channel.tier == "global" or n != num_workers or n % self.group_size:
      wan_ring = ring(self.wan, channel)
      return wan_ring._replace(algorithm="wan_" + wan_ring.algorithm)
    return two_tier(self.regional, self.wan, self.group_size, channel)

  def describe(self) -> dict:
    return {"topology": "hierarchical", "group_size": self.group_size,
            **_describe(self.regional, "regional_"), **_describe(self.wan)}


Topology = Flat | Hierarchical


def _sent(channel: Channel) -> tuple[int, float]:
  """Members, and the bytes each worker sends of a member's payload."""
  return channel.group_size, channel.payload_bytes / channel.shards


def ring(link_: Links, channel: Channel) -> Cost:
  """Ring all-reduce: 2(n-1) sequential hops of payload/n bytes; ring
  all-gather: n-1 hops of a whole payload (of 1/shards of it, per worker,
  when several workers send each member's payload)."""
  n, payload = _sent(channel)
  if n <= 1:
    return Cost(0.0, 0.0, "none")
  if channel.collective == _GATHER:
    return Cost((n - 1) * hop(link_, payload), all_gather_wire(payload, n),
                "ring_all_gather")
  return Cost(2 * (n - 1) * hop(link_, payload / n),
              ring_allreduce_wire(payload, n), "ring_allreduce")


def tree(link_: Links, channel: Channel) -> Cost:
  """A double binary tree all-reduce, pipelined: the busiest member's bytes
  (``tree_allreduce_wire``) at the link's rate, and a latency per level up
  and down the trees."""
  n, payload = _sent(channel)
  if n <= 1:
    return Cost(0.0, 0.0, "none")
  levels = 2 * math.ceil(math.log2(n))
  seconds = hop(link_, tree_allreduce_wire(payload, n)) + (
      levels - 1) * hop(link_, 0.0)
  return Cost(seconds, tree_allreduce_wire(payload, n), "tree_allreduce")


def parameter_server(link_: Links, channel: Channel) -> Cost:
  """Upload one payload, then download the result: the mean (one payload),
  for an all-gather the n-1 other payloads, or the channel's
  ``down_bytes``."""
  n, payload = _sent(channel)
  if n <= 1:
    return Cost(0.0, 0.0, "none")
  down = (n - 1) * payload if channel.collective == _GATHER else payload
  if channel.down_bytes is not None:
    down = channel.down_bytes
  # Each worker on its own link; the event ends with the slowest.
  seconds = max(one.send(payload) + one.receive(down) for one in (
      (link_,) if isinstance(link_, Link) else link_))
  return Cost(seconds, float(payload), "parameter_server", float(down))


def exchange(link_: Links, channel: Channel, num_workers: int) -> Cost:
  """Each worker uploads its payload and downloads ``down_bytes`` over its
  own link, on its own schedule (an asynchronous server): every worker's
  seconds, whatever the topology (a ring has no place in it)."""
  links = ((link_,) * num_workers if isinstance(link_, Link) else link_)
  seconds_W = tuple(one.send(channel.payload_bytes) +
                    one.receive(channel.down_bytes) for one in links)
  return Cost(max(seconds_W), float(channel.payload_bytes), "exchange",
              float(channel.down_bytes), seconds_W)


def pairwise(link_: Links, channel: Channel) -> Cost:
  """Every worker swaps its payload with one peer at once: one hop, priced
  at the slowest link of the fleet (the pairs are drawn during the run)."""
  return Cost(hop(link_, channel.payload_bytes), float(channel.payload_bytes),
              "pairwise")


def two_tier(regional: Links, wan: Links, s: int, channel: Channel) -> Cost:
  """The hierarchical collective over n workers in n/s regions of s."""
  n, payload = channel.group_size, channel.payload_bytes
  regions = n // s
  if channel.collective == _GATHER:
    # Gather the region's s payloads, exchange 1/s of the region's bundle (one
    # payload per worker) around the WAN ring, share what arrived regionally.
    t = (s - 1) * hop(regional, payload)
    if regions > 1:
      t += ((regions - 1) * hop(wan, payload) +
            (s - 1) * hop(regional, (regions - 1) * payload))
    return Cost(t, all_gather_wire(payload, n), "hierarchical_all_gather")
  inside = ring(regional, Channel(payload, 0.0, channel.collective, s))
  across = ring(wan, Channel(payload / s, 0.0, channel.collective, regions))
  return Cost(inside.seconds + across.seconds,
              inside.wire_bytes + across.wire_bytes, "hierarchical_allreduce")


def flat(bandwidth="1Gbps", latency="50ms", algorithm: str = "ring",
         upload_bandwidth=None) -> Flat:
  """A flat topology; ``algorithm`` is "ring" or "parameter_server";
  ``upload_bandwidth``: the links' upload rates, where they differ."""
  return Flat(link(bandwidth, latency, upload=upload_bandwidth),
              _validate.one_of("algorithm", algorithm, ALGORITHMS))


def hierarchical(group_size: int, regional_bandwidth="10Gbps",
                 regional_latency="5ms", bandwidth="100Mbps",
                 latency="100ms", upload_bandwidth=None) -> Hierarchical:
  """Regions of ``group_size`` workers (on ``regional_*`` links) joined by a
  WAN (``bandwidth``, ``latency``, ``upload_bandwidth``)."""
  return Hierarchical(_validate.positive_int("group_size", group_size),
                      link(regional_bandwidth, regional_latency, "regional"),
                      link(bandwidth, latency, upload=upload_bandwidth))
