"""The simulated clock of a run: a ``Network`` and what the engine needs of it.

Three parts:

* ``Network`` / ``network(...)``: the user's description (topology, hardware,
  stragglers, faults, overlap), validated at build time.
* ``NetParams``: its numbers as arrays, an argument of the compiled round, so
  changing a bandwidth, a probability or a jitter does not recompile; and the
  pure functions the round calls on it (step times, who is up, who takes part
  in a communication).
* ``Clock``: the host-side accumulation, in float64, of the per-round times
  the device reports (relative to the round's start, in float32).

Per round (H inner steps and a sync), every up worker w is ready after its own
compute, ``ready_w = sum_t step_s_w * jitter_wt``. A communication is a
barrier: it starts when the workers it waits for are ready (all up workers,
or the fastest ones under a straggler mitigation) and lasts the topology's
time for its channel. Steps without communication do not wait for anyone.
With ``overlap`` the sync's communication runs during the next round's compute
(Streaming DiLoCo's schedule), so a round costs max(compute, communication)
once the pipeline is full; a strategy whose result is needed after k steps
(Streaming DiLoCo's delay tau) overlaps only those k steps, and the workers
wait there for what did not fit.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._types import Array, PRNGKey
from lowbw.network._collectives import Channel
from lowbw.network import _pipeline, _topology, _trace, _units
from lowbw.network._trace import Trace
from lowbw.network._faults import (Faults, Stragglers, check_faults,
                                   check_stragglers)
from lowbw.network._hardware import Hardware, check_speeds
from lowbw.network._hardware import hardware as make_hardware
from lowbw.network._profile import CALIBRATED, Profile
from lowbw.network._profile import profile as make_profile
from lowbw.network._topology import (Flat, Hierarchical, Link, count_links,
                                     flat, relinked,
                                     hierarchical)

TOPOLOGIES = ("ring", "parameter_server", "hierarchical")


class Network(NamedTuple):
  """Where and on what a run would execute.

  Attributes:
    topology: ``Flat`` or ``Hierarchical`` links (see ``lowbw.network.flat``).
    hardware: every worker's ``Hardware``; None counts communication only.
    stragglers: ``Stragglers`` (jitter and mitigation), or None.
    faults: ``Faults`` (dropouts, windows, failures, lost messages), or None.
      Giving one compiles the fault masks in; its numbers can then change
      without recompiling.
    overlap: overlap the sync's communication with the next round's compute
      (Streaming DiLoCo's schedule). Per-step communication never overlaps.
    clock_params: price compute and communication as if the model had this
      many parameters (FLOPs and message bytes scaled by clock_params / the
      model's parameters), so a small model's learning can be timed in a
      large one's regime; the bytes logged stay the real model's. None: the
      model's own size.
    profile: what real links and collectives cost beyond latency + bytes /
      bandwidth (``lowbw.network.Profile``: link efficiency, a cost per
      collective call, a first-contact start-up, host time per step);
      ``IDEAL`` leaves them out.
  """

  topology: Flat | Hierarchical
  hardware: Hardware | None = None
  stragglers: Stragglers | None = None
  faults: Faults | None = None
  overlap: bool = False
  clock_params: float | None = None
  speed_trace: Trace | None = None
  bandwidth_trace: Trace | None = None
  profile: Profile = CALIBRATED

  def describe(self) -> dict:
    return {**self.topology.describe(),
            "hardware": None if self.hardware is None
            else self.hardware.describe(),
            "stragglers": None if self.stragglers is None
            else self.stragglers._asdict(),
            "faults": None if self.faults is None else {
                k: [list(x) if isinstance(x, tuple) else x for x in v]
                if isinstance(v, tuple) else v
                for k, v in self.faults._asdict().items()},
            "overlap": self.overlap, "clock_params": self.clock_params,
            "profile": self.profile.describe(),
            **{name: t.describe() for name, t in (
                ("speed_trace", self.speed_trace),
                ("bandwidth_trace", self.bandwidth_trace)) if t is not None}}


def network(bandwidth="1Gbps", latency="50ms", *, topology: str = "ring",
            group_size: int | None = None, regional_bandwidth="10Gbps",
            regional_latency="5ms", hardware="h100", mfu: float = 0.4,
            speeds=None, stragglers: Stragglers | None = None,
            faults: Faults | None = None, overlap: bool = False,
            clock_params=None, bandwidth_trace=None, profile=None,
            upload_bandwidth=None) -> Network:
  """A ``Network`` from plain values.

  Args:
    bandwidth: each worker's (WAN) bandwidth: "100Mbps", "1Gbps" or bit/s;
      or one per worker, "1Gbps,100Mbps,..." or a list (a ring step is as
      slow as its slowest hop, a parameter server waits for the slowest
      worker).
    latency: one-way latency per message hop: "50ms" or seconds; or one per
      worker, as ``bandwidth``.
    topology: "ring" | "parameter_server" | "hierarchical".
    group_size: workers per region (hierarchical only).
    regional_bandwidth, regional_latency: links inside a region (or one per
      region, as ``bandwidth``).
    hardware: a preset ("h100", "a100", ...), a peak ("312TFLOPS"), a time
      per step ("0.5s"), or None for communication time only.
    mfu: model-FLOP utilisation for the FLOP model.
    speeds: per-worker speed multipliers, or None.
    stragglers, faults: see ``Stragglers`` and ``Faults``.
    overlap: overlap sync communication with the next round's compute.
    clock_params: time the run as if the model had this many parameters
      ("1B", "350M" or a number; see ``Network``).
    profile: "calibrated" (default: the terms measured on real runs, see
      ``lowbw.network.Profile``), "ideal" (latency + bytes / bandwidth
      only), a YAML file of a profile (``lowbw calibrate`` writes one) or a
      ``Profile``.
    upload_bandwidth: each worker's (WAN) upload rate where it differs
      from ``bandwidth``, which is then its download rate (an asymmetric
      link, such as a home connection of 1 Gbit/s down and 50 Mbit/s up);
      one value or one per worker. A ring or tree step sends and receives
      at once, so it goes at the slower of the two; a parameter server's
      upload goes at this rate, its download at ``bandwidth``.

  ``speeds`` may also be a trace, a .csv path (or a ``lowbw.network.Trace``)
  of per-worker values over simulated time (``_trace``), and
  ``bandwidth_trace`` one of each worker's bandwidth (it replaces
  ``bandwidth``; the latencies stay); a round (an asynchronous strategy's
  tick) uses the values in force when it starts.

  Example:
    >>> net = lowbw.network.network("100Mbps", "100ms", hardware="a100")
  """
  topology = _validate.one_of("topology", topology, TOPOLOGIES)
  speed_trace = None
  if _trace.is_trace(speeds):
    speed_trace, speeds = _trace.trace(speeds, "speeds", _trace.speed), None
  if bandwidth_trace is not None:
    bandwidth_trace = _trace.trace(bandwidth_trace, "bandwidth_trace",
                                   _trace.bandwidth)
    bandwidth = list(bandwidth_trace.values[0])
  if topology == "hierarchical":
    if group_size is None:
      raise _validate.fail("group_size", group_size,
                           "topology='hierarchical' needs workers per region")
    topo = hierarchical(group_size, regional_bandwidth, regional_latency,
                        bandwidth, latency, upload_bandwidth)
  else:
    if group_size is not None:
      raise _validate.fail("group_size", group_size,
                           "only used by topology='hierarchical'")
    topo = flat(bandwidth, latency, topology, upload_bandwidth)
  hw = None if hardware is None else make_hardware(hardware, mfu, speeds)
  if clock_params is not None:
    clock_params = _units.count(clock_params, "clock_params")
  return Network(topo, hw, stragglers, faults, overlap, clock_params,
                 speed_trace, bandwidth_trace, make_profile(profile))


def check_network(net: Network, num_workers: int) -> Network:
  """Validates ``net`` for a run of ``num_workers`` workers."""
  if not isinstance(net, Network):
    raise _validate.fail("network", net, "expected a lowbw.network.Network "
                         "(see lowbw.network.network)")
  if not isinstance(net.topology, (Flat, Hierarchical)):
    raise _validate.fail("topology", net.topology,
                         "expected lowbw.network.flat(...) or hierarchical(...)")
  _check_traces(net, num_workers)
  topo = net.topology
  if isinstance(topo, Hierarchical) and num_workers % topo.group_size:
    raise _validate.fail("group_size", topo.group_size,
                         f"must divide workers={num_workers}")
  if isinstance(topo, Flat):
    _check_links("", topo.link, num_workers, "worker")
  else:
    _check_links("", topo.wan, num_workers, "worker")
    _check_links("regional_", topo.regional, num_workers // topo.group_size,
                 "region")
  hw = net.hardware
  if hw is not None:
    if not isinstance(hw, Hardware):
      raise _validate.fail("hardware", hw, "expected lowbw.network.hardware(...)")
    speeds = check_speeds(hw.speeds)
    if speeds is not None and len(speeds) != num_workers:
      raise _validate.fail("speeds", hw.speeds,
                           f"expected {num_workers} values, one per worker")
  _validate.boolean("overlap", net.overlap)
  return net._replace(
      clock_params=None if net.clock_params is None
      else _units.count(net.clock_params, "clock_params"),
      stragglers=None if net.stragglers is None
      else check_stragglers(net.stragglers, num_workers),
      faults=None if net.faults is None
      else check_faults(net.faults, num_workers))


def _check_traces(net: Network, num_workers: int) -> None:
  for field, t in (("speeds", net.speed_trace),
                   ("bandwidth_trace", net.bandwidth_trace)):
    if t is None:
      continue
    _trace.trace(t, field, None)
    if t.columns != num_workers:
      raise _validate.fail(field, t.source or "trace", f"the trace has "
                           f"{t.columns} values per row; expected "
                           f"{num_workers}, one per worker")
  if net.speed_trace is not None and net.hardware is None:
    raise _validate.fail("speeds", net.speed_trace.source or "trace",
                         "a speed trace needs hardware (a time per step)")
  if net.speed_trace is not None and net.hardware.speeds is not None:
    raise _validate.fail("speeds", net.hardware.speeds, "give the speeds "
                         "as numbers or as a trace, not both")


def _check_links(prefix: str, links, expected: int, each: str) -> None:
  """One link for all, or one per worker (per region); the error names the
  input given as a list (the bandwidth, unless only latencies differ)."""
  n = count_links(links)
  if n in (1, expected):
    return
  bandwidths = [one.bandwidth_bps for one in links]
  if len(set(bandwidths)) == 1 and len({one.latency_s for one in links}) > 1:
    field, shown = "latency", ",".join(
        _units.format_duration(one.latency_s) for one in links)
  else:
    field, shown = "bandwidth", ",".join(map(_units.format_bandwidth,
                                             bandwidths))
  raise _validate.fail(prefix + field, shown, f"expected {expected} values, "
                       f"one per {each}, or one for every {each} ({n} given)")


# The engine's channel of a worker's return to the fleet (a join, the end of
# a down window or round): it downloads the global model and outer state.
CATCH_UP = "catch_up"


class NetParams(NamedTuple):
  """The traced numbers of a network, for one run (W workers)."""

  key: PRNGKey
  step_s_W: Array        # float32 (W,): seconds per step at jitter 1
  jitter: Array          # float32: lognormal sigma
  keep_fraction: Array   # float32: threshold's fraction (1 otherwise)
  backups: Array         # int32: backup workers (0 otherwise)
  drop_prob: Array       # float32
  loss_prob: Array       # float32
  fail_step_W: Array     # int32 (W,): first step of a permanent failure
  window_W: Array        # int32 (n,): workers of the down windows
  window_start: Array    # int32 (n,)
  window_end: Array      # int32 (n,)
  comm_s: dict           # channel name -> float32 seconds per event
  exchange_s_W: dict     # channel -> float32 (W,): each worker's own
                         # exchange with a server, for every channel priced
                         # per worker (an asynchronous strategy's messages,
                         # the catch-up download of CATCH_UP)
  segments: "Segments | None" = None  # under a trace: every segment's
  byzantine: "Byzantine | None" = None  # with Byzantine workers


class Byzantine(NamedTuple):
  """The Byzantine workers' corruption of their messages: factor x own +
  noise x (Gaussian with the tensor's RMS); traced."""

  mask_W: Array          # bool (W,)
  factor: Array          # float32: -1 (sign_flip), the scale, or 0 (random)
  noise: Array           # float32: 1 for random, else 0


class Segments(NamedTuple):
  """A trace's stretches of simulated time, as arrays (T segments): the
  values of ``NetParams``' step_s_W, comm_s and exchange_s_W in each;
  ``at_time`` picks the one in force."""

  start_s: Array         # float32 (T,): when each takes effect, the first 0
  step_s_W: Array        # float32 (T, W)
  comm_s: dict           # channel name -> float32 (T,)
  exchange_s_W: dict     # channel -> float32 (T, W)


def channel_costs(net: Network, channels: dict[str, Channel],
                  num_workers: int, num_tensors: int = 1) -> dict:
  """The ``Cost`` of one event of every channel: the topology's, on links
  at the rate a collective reaches (the profile's efficiency), plus the
  profile's cost per collective call (``num_tensors``: the model's
  parameter tensors, for a profile of one call per tensor) and, for a
  worker's return to the fleet (``CATCH_UP``), the profile's start-up."""
  topo, p = effective_topology(net), net.profile
  extra = p.per_call_s * p.calls_per_event(num_tensors)
  out = {}
  for name, c in channels.items():
    cost = topo.cost(c, num_workers)
    if _tree_timed(topo, p, c, num_workers):
      # Timed as the real reducer runs it; the bytes logged stay those of
      # lowbw's own ring.
      cost = cost._replace(seconds=_topology.tree(topo.link, c).seconds)
    # A worker's return to the fleet opens its connections again: the
    # profile's start-up on top of its calls.
    paid = extra + (p.startup_s if name == CATCH_UP else 0.0)
    if paid and cost.seconds > 0:
      cost = cost._replace(seconds=cost.seconds + paid, seconds_W=None if (
          cost.seconds_W is None) else tuple(s + paid for s in cost.seconds_W))
    out[name] = cost
  return out


def _tree_timed(topo, p: Profile, c: Channel, num_workers: int) -> bool:
  """Whether ``c`` is a bucketed all-reduce the profile times as a tree (on
  a flat ring of all the workers; other topologies time their own
  algorithms)."""
  return (c.bucketed and p.bucketed_allreduce == "tree"
          and c.collective == "ring_allreduce" and isinstance(topo, Flat)
          and topo.algorithm == "ring" and c.group_size == num_workers)


def _effective(links, p: Profile):
  """``links`` at the rate a collective reaches on each."""
  if isinstance(links, Link):
    up = links.upload_bps
    return links._replace(
        bandwidth_bps=links.bandwidth_bps * p.efficiency_at(
            links.bandwidth_bps),
        upload_bps=None if up is None else up * p.efficiency_at(up))
  return tuple(_effective(one, p) for one in links)


def effective_topology(net: Network):
  """``net``'s topology with every link's bandwidth as the profile says a
  collective reaches it."""
  topo, p = net.topology, net.profile
  if isinstance(topo, Flat):
    return topo._replace(link=_effective(topo.link, p))
  return topo._replace(regional=_effective(topo.regional, p),
                       wan=_effective(topo.wan, p))


def _overlapped(costs: dict, channels: dict, p: Profile,
                device_s: float | None) -> dict:
  """``costs`` with a bucketed all-reduce's seconds less what it hides
  behind the backward pass (``p.bucketed_overlap`` of the device's step,
  ``device_s``): the seconds a step waits for it."""
  if not p.bucketed_overlap or not device_s:
    return costs
  hidden = p.bucketed_overlap * device_s
  out = dict(costs)
  for name, c in channels.items():
    cost = costs[name]
    if c.bucketed and cost.seconds > 0:
      out[name] = cost._replace(seconds=max(cost.seconds - hidden, 0.0))
  return out


class Pricing(NamedTuple):
  """A network's prices for one run, made in one call (``price``).

  Attributes:
    costs: channel -> ``Cost`` of one event for the model as it is: the
      wire bytes a run logs.
    clock_costs: the same as the clock times them: the bytes scaled to
      ``clock_params`` when given (else ``costs`` itself).
    flops_per_step: one worker's FLOPs per inner step as the clock prices
      them (scaled likewise).
    step_s: seconds of one inner step at speed 1 (None without hardware).
    segments: under a trace, one ``(start_s, speeds, clock_costs)`` per
      stretch of simulated time with the same speeds and links (speeds
      None: the hardware's); without one, a single segment from 0.
    timeline: for a worker that is a pipeline, its step played out
      (``_pipeline.Timeline``: the makespan that ``step_s`` holds, and
      the bubble); else None.
    worker_step_s: in a mixed fleet (``Pipeline.workers``), per worker
      its seconds of one step at speed 1: the pipeline's makespan
      (``step_s``) for its workers, the whole model's compute on one
      machine for the others; else None (every worker takes ``step_s``).
    segment_step_s: under a trace of the stage links
      (``Pipeline.bandwidth_trace``), per segment each worker's seconds of
      one step at speed 1 then (as ``worker_step_s``, for every worker);
      empty: every segment steps as ``step_s_of_workers`` says.
  """

  costs: dict
  clock_costs: dict
  flops_per_step: float
  step_s: float | None
  segments: tuple = ()
  timeline: Any = None
  worker_step_s: tuple | None = None
  segment_step_s: tuple = ()

  def step_s_of_workers(self, num_workers: int):
    """Each worker's seconds of one step at speed 1 (float64 array), 0
    without a hardware."""
    if self.worker_step_s is not None:
      return np.asarray(self.worker_step_s, np.float64)
    return np.full(num_workers, self.step_s or 0.0)


def _pipeline_step(pipeline: _pipeline.Pipeline, device_s: float,
                   net: Network, num_workers: int, every: bool = False):
  """(the pipeline's step timeline, each worker's step at speed 1: the
  makespan for its workers, ``device_s`` for a mixed fleet's others; None
  when every worker is the pipeline, unless ``every``)."""
  timeline = _pipeline.step_timeline(pipeline, device_s)
  if pipeline.workers is None and not every:
    return timeline, None
  ours = range(num_workers) if pipeline.workers is None else pipeline.workers
  return timeline, tuple((timeline.makespan_s if w in ours else device_s)
                         + net.profile.host_s for w in range(num_workers))


def price(net: Network, channels: dict[str, Channel], num_workers: int,
          num_params: int, flops_per_step: float,
          steps: int | None = None, num_tensors: int = 1,
          pipeline: _pipeline.Pipeline | None = None) -> Pricing:
  """Everything ``net`` charges for a run whose messages are ``channels``
  and whose model has ``num_params`` parameters, ``flops_per_step`` FLOPs
  per worker step. ``net.clock_params`` prices a larger model than the one
  trained: the clock's bytes and FLOPs scale by ``clock_params /
  num_params``, the logged bytes do not. With ``steps``, refuses a network
  whose run of that many steps the clock could not count
  (``check_clock_range``). ``num_tensors``: the model's parameter tensors
  (the profile's calls per event). ``pipeline``: each worker is that
  pipeline, its step the makespan of its schedule (``_pipeline``) instead
  of the whole model's compute on one machine."""
  costs = channel_costs(net, channels, num_workers, num_tensors)
  scale = 1.0 if net.clock_params is None else net.clock_params / num_params
  scaled = channels if scale == 1.0 else {name: ch._replace(
      payload_bytes=ch.payload_bytes * scale,
      down_bytes=None if ch.down_bytes is None else ch.down_bytes * scale)
      for name, ch in channels.items()}
  clock = costs if scale == 1.0 else channel_costs(net, scaled, num_workers,
                                                   num_tensors)
  flops = flops_per_step * scale
  hw = net.hardware
  device_s = None if hw is None else hw.step_seconds(flops)
  # A pipeline's all-reduce hides behind as much compute as the unsplit
  # model's would (docs/pipelines.md), not behind its bubble.
  clock = _overlapped(clock, scaled, net.profile, device_s)
  hop_traces = () if pipeline is None else pipeline.bandwidth_trace
  segments = []
  for start in _trace.change_times(net.speed_trace, net.bandwidth_trace,
                                   *hop_traces):
    speeds = None if net.speed_trace is None else net.speed_trace.at(start)
    at = net if net.bandwidth_trace is None else _relink(
        net, net.bandwidth_trace.at(start))
    segments.append((start, speeds, clock if at is net else _overlapped(
        channel_costs(at, scaled, num_workers, num_tensors), scaled,
        net.profile, device_s)))
  timeline, each, by_segment = None, None, ()
  if pipeline is not None and device_s is not None:
    timeline, each = _pipeline_step(pipeline.at(0.0), device_s, net,
                                    num_workers)
    if hop_traces:  # the stage links change: so does the pipeline's step
      by_segment = tuple(_pipeline_step(pipeline.at(start), device_s, net,
                                        num_workers, True)[1]
                         for start, _, _ in segments)
    device_s = timeline.makespan_s
  pricing = Pricing(costs, clock, flops, None if hw is None else (
      device_s + net.profile.host_s), tuple(segments), timeline, each,
      by_segment)
  if steps is not None:
    check_clock_range(net, pricing, steps)
  return pricing


# The engine keeps simulated seconds in float32 (at most 3.4e38) and the host
# sums them in float64; a run whose nominal time passes this bound leaves no
# room for jitter and sums before the clock turns infinite.
MAX_RUN_S = 1e30


def check_clock_range(net: Network, pricing: Pricing, steps: int) -> None:
  """Refuses a network whose nominal time for ``steps`` steps (each at the
  slowest worker's speed, plus one event of every channel) passes
  ``MAX_RUN_S``, naming the input that makes it so."""
  compute = 0.0 if pricing.step_s is None else (
      max((pricing.step_s, *(pricing.worker_step_s or ()),
           *(s for each in pricing.segment_step_s for s in each)))
      / min(_all_speeds(net)))
  comm = sum(max(max(c.seconds, *(c.seconds_W or (0.0,)))
                 for c in _segment_costs(pricing, name))
             for name in pricing.clock_costs)
  total = steps * (compute + comm)
  if math.isfinite(total) and total <= MAX_RUN_S:
    return
  by_compute = compute >= comm
  field, value = (_compute_culprit(net, pricing, steps) if by_compute
                  else _link_culprit(net, pricing))
  reached = (f"{total:.3g} s" if math.isfinite(total)
             else "more than the largest float")
  # The message size too: a link is only slow for the bytes it is given,
  # and an absurd model size (a clock-only parameter count) shows here.
  sent = (f" at {compute:.3g} s per step" if by_compute else
          f" sending {_wire_bytes(pricing):.3g} bytes per worker per exchange")
  raise _validate.fail(field, value, f"the run's simulated time would reach "
                       f"{reached} over {steps} steps{sent}, beyond what the "
                       f"simulated clock (float32) can count; expected a value that keeps it below "
                       f"{MAX_RUN_S:g} s")


def capacity_steps(net: Network, num_workers: int, step_s,
                   elapsed: float) -> float:
  """The inner steps every worker could take in ``elapsed`` simulated
  seconds at its own speed (a speed trace's rows for the time each holds),
  one step at speed 1 taking ``step_s`` seconds (one for all, or one per
  worker in a mixed fleet): a goodput's denominator."""
  trace = net.speed_trace if net.hardware is not None else None
  per = np.broadcast_to(np.asarray(step_s, np.float64), (num_workers,))
  if trace is None:
    return float(np.sum(_start_speeds(net, num_workers) / per)) * elapsed
  ends = list(trace.times[1:]) + [math.inf]
  held = [max(0.0, min(end, elapsed) - start)
          for start, end in zip(trace.times, ends)]
  return sum(h * float(np.sum(np.asarray(row, np.float64) / per))
             for h, row in zip(held, trace.values))


def segment_capacity(net: Network, pricing: Pricing, num_workers: int,
                     elapsed: float) -> float:
  """``capacity_steps`` when the step itself changes over time (a trace of
  the stage links, ``Pricing.segment_step_s``): every segment's held
  seconds at its speeds and its steps."""
  starts = [start for start, _, _ in pricing.segments]
  start_speeds = _start_speeds(net, num_workers)
  total = 0.0
  for (start, speeds, _), end, step in zip(
      pricing.segments, starts[1:] + [math.inf], pricing.segment_step_s):
    held = max(0.0, min(end, elapsed) - start)
    each = start_speeds if speeds is None else np.asarray(speeds, np.float64)
    total += held * float(np.sum(each / np.asarray(step, np.float64)))
  return total


def _all_speeds(net: Network) -> list[float]:
  hw, trace = net.hardware, net.speed_trace
  if trace is not None:
    return [v for row in trace.values for v in row]
  return [1.0] if hw is None or hw.speeds is None else list(hw.speeds)


def _segment_costs(pricing: Pricing, name: str) -> list:
  return [pricing.clock_costs[name]] + [
      costs[name] for _, _, costs in pricing.segments if name in costs]


# Below this a model-FLOP utilisation is a typo, not a measurement.
_LEAST_SENSIBLE_MFU = 1e-3


def _compute_culprit(net: Network, pricing: Pricing, steps: int) -> tuple:
  """The setting that makes the compute too slow, with the value the user
  gave: a slow worker's speed, an MFU of no sense, else the hardware."""
  slowest = min(_all_speeds(net))
  if slowest < 1 and steps * pricing.step_s <= MAX_RUN_S:
    return "speeds", f"{slowest:g}"
  hw = net.hardware
  if hw.step_time_s is None and hw.mfu < _LEAST_SENSIBLE_MFU:
    return "mfu", f"{hw.mfu:g}"
  return "hardware", hw.name


def _wire_bytes(pricing: Pricing) -> float:
  return max(max(c.wire_bytes, c.received_bytes or 0.0)
             for c in pricing.clock_costs.values())


def _link_culprit(net: Network, pricing: Pricing) -> tuple:
  """The slowest link's latency when it outweighs moving the largest
  message over the narrowest link, else that bandwidth."""
  topo = net.topology
  links = ([("", topo.link)] if isinstance(topo, Flat)
           else [("", topo.wan), ("regional_", topo.regional)])
  each = [(prefix, one) for prefix, group in links for one in
          ([group] if isinstance(group, Link) else group)]
  wire = _wire_bytes(pricing)
  prefix, slow = max(each, key=lambda pl: pl[1].latency_s)
  narrow = min(min(one.bandwidth_bps, one.up_bps) for _, one in each)
  if net.bandwidth_trace is not None:
    narrow = min(narrow, *(v for row in net.bandwidth_trace.values
                           for v in row))
  if slow.latency_s >= 8.0 * wire / narrow:
    return prefix + "latency", _units.format_duration(slow.latency_s)
  field = ("bandwidth_trace" if net.bandwidth_trace is not None
           and narrow in {v for row in net.bandwidth_trace.values
                          for v in row} else "bandwidth")
  bw_prefix = next((p for p, one in each if one.bandwidth_bps == narrow), "")
  return (bw_prefix if field == "bandwidth" else "") + field, (
      _units.format_bandwidth(narrow))


def _relink(net: Network, bandwidths) -> Network:
  """``net`` with each worker's (WAN) bandwidth replaced."""
  topo = net.topology
  if isinstance(topo, Flat):
    return net._replace(topology=topo._replace(
        link=relinked(topo.link, bandwidth=list(bandwidths))))
  return net._replace(topology=topo._replace(
      wan=relinked(topo.wan, bandwidth=list(bandwidths))))


def net_params(net: Network, num_workers: int, pricing: Pricing,
               seed: int) -> NetParams:
  """The arrays of ``net`` for a run priced by ``pricing`` (``price``:
  the clock's seconds per message and per step, and a trace's
  segments)."""
  base = pricing.step_s_of_workers(num_workers)
  costs = pricing.clock_costs
  speeds = _start_speeds(net, num_workers)
  s = net.stragglers or Stragglers()
  f = net.faults or Faults()
  never = np.iinfo(np.int32).max
  fail = np.full(num_workers, never, np.int64)
  for worker, step in f.failures:
    fail[worker] = min(fail[worker], step)
  # A worker joining at step s is down for the rounds before it.
  windows = np.asarray(list(f.windows) + [(w, 0, step) for w, step in f.joins],
                       np.int64).reshape(-1, 3)
  f32, i32 = jnp.float32, jnp.int32
  return NetParams(
      key=jax.random.fold_in(jax.random.PRNGKey(seed), 0x7E7),
      step_s_W=jnp.asarray(base / speeds, f32),
      jitter=f32(s.jitter),
      keep_fraction=f32(s.fraction if s.mitigation == "threshold" else 1.0),
      backups=i32(s.backups if s.mitigation == "backup" else 0),
      drop_prob=f32(f.drop_prob),
      loss_prob=f32(f.message_loss),
      fail_step_W=jnp.asarray(fail, i32),
      window_W=jnp.asarray(windows[:, 0], i32),
      window_start=jnp.asarray(windows[:, 1], i32),
      window_end=jnp.asarray(windows[:, 2], i32),
      comm_s={name: f32(c.seconds) for name, c in costs.items()},
      exchange_s_W=_exchange_seconds(costs),
      segments=None if len(pricing.segments) < 2 else _segments(
          pricing.segments, base, speeds, pricing.segment_step_s),
      byzantine=_byzantine(f, num_workers),
  )


def _start_speeds(net: Network, num_workers: int) -> np.ndarray:
  """The speeds at time 0: the trace's first row under a speed trace (which
  a one-row trace, a constant fleet, holds for the whole run), else the
  hardware's."""
  hw = net.hardware
  if hw is not None and net.speed_trace is not None:
    return np.asarray(net.speed_trace.values[0], np.float64)
  if hw is None or hw.speeds is None:
    return np.ones(num_workers)
  return np.asarray(hw.speeds, np.float64)


def _byzantine(f: Faults, num_workers: int) -> "Byzantine | None":
  if not f.byzantine:
    return None
  mask = np.zeros(num_workers, bool)
  mask[list(f.byzantine)] = True
  factor = {"sign_flip": -1.0, "scale": f.byzantine_scale, "random": 0.0}
  return Byzantine(jnp.asarray(mask), jnp.float32(factor[f.byzantine_kind]),
                   jnp.float32(f.byzantine_kind == "random"))


def _segments(segments, base, speeds, steps: tuple = ()) -> Segments:
  """``steps``: per segment, each worker's step at speed 1 (a stage-link
  trace's); empty: ``base`` in every segment."""
  f32 = jnp.float32
  bases = [np.asarray(b, np.float64) for b in steps] or [base] * len(segments)
  return Segments(
      start_s=jnp.asarray([start for start, _, _ in segments], f32),
      step_s_W=jnp.asarray([at / (speeds if each is None else
                                  np.asarray(each, np.float64))
                            for at, (_, each, _) in zip(bases, segments)],
                           f32),
      comm_s={name: jnp.asarray([costs[name].seconds
                                 for _, _, costs in segments], f32)
              for name in segments[0][2]},
      exchange_s_W={name: jnp.stack([_exchange_seconds(costs)[name]
                                     for _, _, costs in segments])
                    for name in _exchange_seconds(segments[0][2])})


def at_time(p: NetParams | None, time_s) -> NetParams | None:
  """``p`` with the values of the trace segment in force at ``time_s``
  (itself without a trace)."""
  if p is None or p.segments is None:
    return p
  seg = p.segments
  i = jnp.clip(jnp.searchsorted(seg.start_s, time_s, side="right") - 1, 0,
               seg.start_s.shape[0] - 1)
  return p._replace(step_s_W=seg.step_s_W[i],
                    comm_s={k: v[i] for k, v in seg.comm_s.items()},
                    exchange_s_W={k: v[i] for k, v in
                                  seg.exchange_s_W.items()})


def round_end(ready, comm_end, sync_s, overlap: bool) -> tuple:
  """(when the workers start the next round, when this round's sync ends),
  for a round whose compute ends at ``ready``: at once after the sync, or,
  with ``overlap``, when the previous sync has ended (the host clock and
  the engine's trace lookup share it; numpy or jax values)."""
  if not overlap:
    end = ready + sync_s
    return end, end
  start = (max(ready, comm_end) if isinstance(ready, float)
           else jnp.maximum(ready, comm_end))
  return start, start + sync_s


def _exchange_seconds(costs: dict) -> dict:
  """channel -> float32 (W,): each worker's seconds for the channels
  priced per worker (exchanges with a server)."""
  return {name: jnp.asarray(c.seconds_W, jnp.float32)
          for name, c in costs.items() if c.seconds_W is not None}


# ---------------------------------------------------------------- in the round
def step_seconds(p: NetParams, step: Array) -> Array:
  """(W,) compute seconds of inner step ``step`` (0-based) on every worker."""
  z = jax.random.normal(jax.random.fold_in(jax.random.fold_in(p.key, 1), step),
                        p.step_s_W.shape)
  return p.step_s_W * jnp.exp(p.jitter * z - 0.5 * jnp.square(p.jitter))


def up_mask(p: NetParams, step: Array) -> Array:
  """(W,) bool: which workers are up for the round starting at ``step``."""
  w = p.step_s_W.shape[0]
  u = jax.random.uniform(jax.random.fold_in(jax.random.fold_in(p.key, 2), step),
                         (w,))
  down = (u < p.drop_prob) | (step >= p.fail_step_W)
  in_window = ((p.window_start <= step) & (step < p.window_end))[:, None] & (
      p.window_W[:, None] == jnp.arange(w)[None, :])
  return ~(down | jnp.any(in_window, axis=0))


def _waited_count(p: NetParams, up_W: Array) -> Array:
  """k: how many of the up workers a barrier waits for (0 if none is up)."""
  n_up = jnp.sum(up_W.astype(jnp.int32))
  # The epsilon keeps float32 rounding from turning an exact q x n (0.6 x 25)
  # into one worker more.
  k = jnp.minimum(jnp.ceil(p.keep_fraction * n_up - 1e-4).astype(jnp.int32),
                  n_up - p.backups)
  return jnp.clip(k, jnp.minimum(n_up, 1), n_up)


def waited_for(p: NetParams, ready_W: Array, up_W: Array) -> Array:
  """When the workers a barrier waits for are all ready: the slowest up worker
  without a mitigation, the k-th fastest with one (0 if none is up)."""
  k = _waited_count(p, up_W)
  ordered = jnp.sort(jnp.where(up_W, ready_W, jnp.inf))
  return jnp.where(k > 0, ordered[jnp.maximum(k - 1, 0)], 0.0)


def participants(p: NetParams, ready_W: Array, up_W: Array, step: Array,
                 salt: int) -> tuple[Array, Array]:
  """Who takes part in a communication, and when it starts.

  The fastest k up workers are waited for: k = all of them without a
  mitigation, ceil(fraction x up) under threshold, up - backups under backup
  workers (at least one); workers ready at the same time are ranked in a
  seeded random order. Their messages then get lost with the fault model's
  probability.

  Returns:
    active_W: bool (W,), the workers whose messages are averaged.
    start: float32, the time (relative to the round) the communication starts.
  """
  w = ready_W.shape[0]
  key = jax.random.fold_in(jax.random.fold_in(p.key, 3 + salt), step)
  lose_key, tie_key = jax.random.split(key)
  order = jnp.lexsort((jax.random.uniform(tie_key, (w,)),
                       jnp.where(up_W, ready_W, jnp.inf)))
  rank = jnp.zeros(w, jnp.int32).at[order].set(jnp.arange(w, dtype=jnp.int32))
  kept = up_W & (rank < _waited_count(p, up_W))
  lost = jax.random.uniform(lose_key, (w,)) < p.loss_prob
  return kept & ~lost, waited_for(p, ready_W, up_W)


def comm_seconds(p: NetParams, counts: dict) -> Array:
  """Seconds of the communication events in ``counts`` (channel -> int)."""
  total = jnp.float32(0.0)
  for name, c in counts.items():
    total = total + c.astype(jnp.float32) * p.comm_s[name]
  return total


# ------------------------------------------------------------------ on the host
class Clock:
  """Simulated seconds since the run started, accumulated in float64.

  ``now`` is when the workers start their next step; ``comm_end`` is when the
  last sync's communication finishes (later than ``now`` only with overlap).

  ``overlap`` says how long a sync's result may take to arrive: ``False`` (or
  0): the workers wait for it at the sync; ``k`` steps: they go on computing
  and need it after the k-th step of the next round (Streaming DiLoCo's
  delayed merge, tau = k), waiting there only for what did not fit; ``True``:
  they need it at the next sync (the whole next round overlaps).

  ``startup_s`` (the profile's first-contact cost) is added to the run's
  first communication, a step's (``comm_steps``: DDP's all-reduce, SPARTA's
  exchange) or a round's sync: setting up the communicator before its first
  collective.
  """

  def __init__(self, overlap: bool | int, startup_s: float = 0.0):
    self.overlap = (math.inf if overlap is True else
                    0 if overlap is False else int(overlap))
    self.now = 0.0
    self.comm_end = 0.0
    self.startup_s = float(startup_s)
    self.contacted = False

  def state_dict(self) -> dict:
    return {"now": self.now, "comm_end": self.comm_end,
            "contacted": self.contacted}

  def load_state_dict(self, d: dict) -> None:
    self.now, self.comm_end = float(d["now"]), float(d["comm_end"])
    # A checkpoint from before the start-up term: contact was made if any
    # time had passed.
    self.contacted = bool(d.get("contacted", self.now > 0))

  def _step_contact(self, rel: np.ndarray, comm_steps) -> float:
    """Adds the start-up to the steps from the first communicating one of
    ``comm_steps`` (bool per step of ``rel``) when none came before;
    returns the seconds added."""
    if self.contacted or comm_steps is None or not np.any(comm_steps):
      return 0.0
    self.contacted = True
    rel[int(np.argmax(comm_steps)):] += self.startup_s
    return self.startup_s

  def _first_contact(self, sync_s: float) -> float:
    """``sync_s`` with the start-up added when it is the run's first."""
    if self.contacted or sync_s <= 0:
      return sync_s
    self.contacted = True
    return sync_s + self.startup_s

  @property
  def elapsed(self) -> float:
    """The run's simulated time: every step done, every message arrived."""
    return max(self.now, self.comm_end)

  def _wait_at(self, start: float, rel: np.ndarray) -> float:
    """Seconds the workers wait, after ``self.overlap`` steps of a span
    starting at ``start`` (``rel``: relative times after its steps), for a
    communication still in flight; 0 when it arrives in time or is needed
    only after the span."""
    k = self.overlap
    if not 0 < k <= rel.shape[0] or self.comm_end <= start:
      return 0.0
    return max(0.0, self.comm_end - (start + float(rel[k - 1])))

  def rounds(self, step_s, compute_s, sync_s, comm_steps=None) -> np.ndarray:
    """Absolute times after each step of ``n`` rounds.

    Args:
      step_s: (n, H) relative time after each step (workers waited for).
      compute_s: (n,) relative time the sync starts.
      sync_s: (n,) seconds of the sync's communication.
      comm_steps: (n, H) bool, the steps that communicate (for the
        start-up), or None.
    """
    step_s = np.array(step_s, np.float64)
    h = step_s.shape[1] if step_s.ndim == 2 else 0
    out = np.empty(step_s.shape, np.float64)
    for r in range(step_s.shape[0]):
      start, rel = self.now, step_s[r]
      ready = start + float(compute_s[r]) + self._step_contact(
          rel, None if comm_steps is None else comm_steps[r])
      if 0 < self.overlap < h:  # the last sync's result is needed inside this round
        wait = self._wait_at(start, rel)
        rel[self.overlap - 1:] += wait
        ready += wait
      out[r] = start + rel
      self.now, self.comm_end = round_end(
          ready, self.comm_end, self._first_contact(float(sync_s[r])),
          bool(self.overlap))
      out[r, -1] = self.now
    return out.reshape(-1)

  def steps(self, step_s, comm_steps=None) -> np.ndarray:
    """Absolute times after each of a tail's steps (no sync);
    ``comm_steps`` as for ``rounds``."""
    rel = np.array(step_s, np.float64).reshape(-1)
    self._step_contact(rel, comm_steps)
    wait = self._wait_at(self.now, rel)
    if wait:
      rel[self.overlap - 1:] += wait
    out = self.now + rel
    if out.size:
      self.now = float(out[-1])
    return out


# Models below this many parameters reach well under the default MFU (0.4,
# what models of billions of parameters reach): a 30.8M-parameter model in
# float32 reached 0.16 of an L40S's peak in the measured runs of
# benchmarks/calibration.
SMALL_MODEL = 100_000_000


def assumed_mfu(net: Network, num_params: int) -> int | None:
  """The parameters the clock prices (``clock_params`` or the model's) when
  it times their compute at the default MFU and they are far below the size
  that reaches it (``SMALL_MODEL``); None otherwise."""
  hw = net.hardware
  if hw is None or hw.step_time_s is not None or (
      hw.mfu != Hardware._field_defaults["mfu"]):
    return None
  priced = net.clock_params or num_params
  return int(priced) if priced < SMALL_MODEL else None


def flops_per_step(num_params: int, tokens_per_worker_step: int,
                   flops_per_token: float | None = None) -> float:
  """``flops_per_token`` (default 6 P: forward 2P, backward 4P) times the
  tokens of a worker's step."""
  per_token = 6.0 * num_params if flops_per_token is None else flops_per_token
  return per_token * tokens_per_worker_step
