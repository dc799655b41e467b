"""A finished run's simulated time on another network, from its ledger.

A network without stragglers or faults changes only the clock, never the
training (docs/network.md), so a run's steps and messages are the same on
any such network and its simulated time there follows from its ledger
(``_ledger``): each step's and each sync's events, priced by the network
(``network.price``) and added up as the engine and the host clock do
(``Clocked``'s float32 round, then ``network.Clock``). The result equals a
re-run's ``sim_time_s`` without running anything.
"""

import csv
import json
import math
import os

import numpy as np

from lowbw import _validate
from lowbw import network as net_lib
from lowbw.network import _clock, _units
from lowbw.network._collectives import Channel
from lowbw.simulation import _ledger


def retime(run_dir, network, *, stage_bandwidth=None, stage_latency=None):
  """The simulated time of the finished run in ``run_dir`` on ``network``.

  The run's training stays as it ran (the steps it took, the messages it
  sent, read from its ``ledger.npz``); only the clock changes, so the
  answer equals a re-run's ``summary["sim_time_s"]`` on that network.

  Args:
    run_dir: a run's log folder (``out=`` / ``--out``).
    network: a ``lowbw.network.Network`` (no stragglers, faults or traces:
      those would change the training or need the run's draws), or a list
      of them (a study over networks: the ledger is read once).
    stage_bandwidth, stage_latency: for a pipeline run, its stage links
      on the other network, as the settings take them (one value for every
      hop or one per hop; ``math.inf``: a free link); None: the run's own.
      The boundary bytes per micro-batch stay the run's (its model and
      codecs set them); only the hops' times change.

  Returns:
    A dict (a list of them for a list of networks): ``sim_time_s``;
    ``compute_s`` and ``comm_s``, the nominal seconds of computing and
    communicating (as a run's summary has them) and ``compute_share``
    (CU: compute over their sum); ``history``: ``step`` and ``sim_time_s``
    at the rows of the run's metrics.csv; ``original_sim_time_s`` (from its
    summary.json, None without one); ``steps``; ``network`` (described).

  Raises:
    ValueError: (a ``ConfigError``) a folder without a ledger, a run whose
      training depended on its clock (asynchronous strategies, time
      budgets, straggler mitigation, faults), or a network that does not
      fit the run (its worker count) or would change its training.

  Example:
    >>> nets = [lowbw.network.network(bw, "50ms", hardware="h100")
    ...         for bw in ("10Mbps", "100Mbps", "1Gbps")]
    >>> [r["sim_time_s"] for r in lowbw.retime("runs/diloco", nets)]
  """
  ledger = _load(run_dir)
  rows = _logged_steps(run_dir)
  original = _original_time(run_dir)
  # A Network is itself a tuple (a NamedTuple).
  pipeline = _restaged(run_dir, _pipeline(ledger["meta"]), stage_bandwidth,
                       stage_latency)
  if isinstance(network, (list, tuple)) and not isinstance(
      network, net_lib.Network):
    return [_one(run_dir, ledger, n, rows, original, pipeline)
            for n in network]
  return _one(run_dir, ledger, network, rows, original, pipeline)


def _load(run_dir) -> dict:
  """The run's ledger, refused when it cannot re-time the run."""
  path = os.path.join(os.fspath(run_dir), _ledger.FILE)
  if not os.path.isdir(run_dir):
    raise _validate.fail("run_dir", run_dir, "no such folder; expected a "
                         "run's log folder (out=)")
  if not os.path.isfile(path):
    raise _validate.fail(
        "run_dir", run_dir, f"holds no {_ledger.FILE}: not a run's log "
        "folder, or a run written before lowbw kept ledgers; re-run it with "
        "out= to re-time it")
  ledger = _ledger.read(path)
  meta = ledger["meta"]
  if meta.get("version") != _ledger.VERSION:
    raise _validate.fail("run_dir", run_dir, f"its ledger has version "
                         f"{meta.get('version')}; this lowbw reads version "
                         f"{_ledger.VERSION}")
  if meta["timing_dependence"]:
    raise _validate.fail(
        "run_dir", run_dir, "cannot be re-timed: its training depended on "
        f"its simulated clock ({'; '.join(meta['timing_dependence'])}), so "
        "another network would have trained it differently; re-run it there")
  if meta["first_step"] != 0:
    raise _validate.fail(
        "run_dir", run_dir, f"its ledger starts at step "
        f"{meta['first_step']}: the run resumed from another folder's "
        "checkpoint, whose steps before are not in it")
  path = os.path.join(os.fspath(run_dir), "summary.json")
  ended = _ended(path)
  if ended not in _FINISHED:
    raise _validate.fail(
        "run_dir", run_dir, "the run did not finish (" + (
            "no summary.json: it was killed or is still running" if ended
            is None else f"it ended {ended}") + "); its ledger may hold "
        "steps it never logged")
  return ledger


# How a run that took all its steps ends (summary.json's ``ended``; a
# summary written before runs said so has none).
_FINISHED = ("completed", "diverged", "non_finite_model", "")


def _ended(path: str) -> str | None:
  """summary.json's ``ended`` ("" when it does not say), None without a
  readable summary."""
  try:
    with open(path) as f:
      return str(json.load(f).get("ended", ""))
  except (OSError, ValueError, AttributeError):
    return None


def _check_target(run_dir, network, workers: int) -> net_lib.Network:
  """``network`` validated for the run; one that would change the training
  (or whose clock needs the run's random draws) refused."""
  try:
    net = _clock.check_network(network, workers)
  except _validate.ConfigError as e:
    raise _validate.fail(e.field, e.value, f"{e.allowed} (re-timing "
                         f"{run_dir}, a run of {workers} workers)") from e
  why = {"stragglers": "its jitter is drawn per run and a mitigation "
                       "changes who trains",
         "faults": "they change who trains",
         "speed_trace": "a trace's segments are not re-timed",
         "bandwidth_trace": "a trace's segments are not re-timed"}
  for field, reason in why.items():
    if getattr(net, field) is not None:
      raise _validate.fail(
          "network", f"{field}={getattr(net, field)!r}"[:80],
          f"cannot re-time {run_dir} on a network with {field} ({reason}); "
          "re-run it on that network instead")
  return net


def _pipeline(meta: dict) -> "net_lib.Pipeline | None":
  """The run's pipeline as its ledger kept it (None: not a pipeline)."""
  kept = meta.get("pipeline")
  if not kept:
    return None
  kept = {k: tuple(v) if isinstance(v, list) else v for k, v in kept.items()}
  # A trace of the stage links, kept as [times, values, source] per hop.
  kept["bandwidth_trace"] = tuple(
      net_lib.Trace(tuple(t[0]), tuple(map(tuple, t[1])), t[2])
      for t in kept.get("bandwidth_trace", ()))
  return net_lib.Pipeline(**kept)


def _restaged(run_dir, pipeline, bandwidth, latency):
  """The run's pipeline on other stage links (``bandwidth``, ``latency``:
  None keeps the run's); refused for a run without stages, and for stage
  links that followed a trace unless ``bandwidth`` replaces it."""
  given = {"stage_bandwidth": bandwidth, "stage_latency": latency}
  if pipeline is None:
    for field, value in given.items():
      if value is not None:
        raise _validate.fail(field, value, f"cannot re-time {run_dir} on "
                             "other stage links: it ran without stages")
    return None
  if pipeline.bandwidth_trace and bandwidth is None:
    raise _validate.fail(
        "run_dir", run_dir, "cannot be re-timed: its stage links followed "
        "a trace (stage_bandwidth_trace), whose segments are not re-timed; "
        "give stage_bandwidth, or re-run it on the other network")
  hops = pipeline.stages - 1
  if bandwidth is not None:
    pipeline = pipeline._replace(bandwidth=_hop_values(
        "stage_bandwidth", bandwidth, hops, _units.bandwidth),
        bandwidth_trace=())
  if latency is not None:
    pipeline = pipeline._replace(latency=_hop_values(
        "stage_latency", latency, hops, _units.duration))
  return pipeline


def _hop_values(field: str, value, hops: int, parse) -> tuple:
  """One value for every hop, or one per hop; ``math.inf`` (a free link)
  passes as it is."""
  values = [v if isinstance(v, (int, float)) and math.isinf(v)
            else parse(v, field) for v in _units.link_values(value)]
  if len(values) not in (1, hops):
    raise _validate.fail(field, value, f"expected one value for every hop "
                         f"or one per hop, {hops} (the run's stages: "
                         f"{hops + 1})")
  return tuple(float(v) for v in values) * (hops if len(values) == 1 else 1)


def _one(run_dir, ledger: dict, network, rows, original, pipeline) -> dict:
  meta = ledger["meta"]
  workers = meta["workers"]
  net = _check_target(run_dir, network, workers)
  channels = {k: Channel(**v) for k, v in meta["channels"].items()}
  pricing = net_lib.price(net, channels, workers, meta["num_params"],
                          meta["flops_per_step"], steps=meta["steps"],
                          num_tensors=meta["num_tensors"],
                          pipeline=pipeline)
  times, elapsed = _times(ledger, net, pricing)
  events = ledger["step_counts"].sum(axis=0) + ledger["sync_counts"].sum(
      axis=0)
  steps = ledger["step_counts"].shape[0]
  compute = steps * (pricing.step_s or 0.0)
  comm = float(sum(int(n) * pricing.clock_costs[name].seconds
                   for name, n in zip(meta["names"], events)))
  total = compute + comm
  logged = rows if rows is not None else np.arange(1, steps + 1)
  logged = logged[(logged >= 1) & (logged <= steps)]
  at = times[logged - 1]
  at[logged == steps] = elapsed  # the last row waits for the last message
  return {"run": os.fspath(run_dir), "sim_time_s": elapsed,
          "compute_s": compute, "comm_s": comm,
          "compute_share": compute / total if total > 0 else None,
          "history": {"step": logged, "sim_time_s": at},
          "original_sim_time_s": original, "steps": steps,
          # As a run's config.json describes its network.
          "network": {**net.describe(), **_stage_links(pipeline),
                      "compute_s_per_step": pricing.step_s,
                      "comm_s_per_event": {
                          name: cost.seconds
                          for name, cost in pricing.clock_costs.items()}}}


def _stage_links(pipeline) -> dict:
  """A pipeline's stage links as the result describes them."""
  if pipeline is None:
    return {}
  return {"stage_bandwidth_bps": list(pipeline.bandwidth),
          "stage_latency_s": list(pipeline.latency)}


def _times(ledger: dict, net, pricing) -> tuple[np.ndarray, float]:
  """(the absolute simulated time after every step, the run's end): the
  rounds' relative times as the engine computes them, added up by the host
  clock."""
  meta = ledger["meta"]
  period, workers = meta["period"], meta["workers"]
  speeds = _clock._start_speeds(net, workers)
  step_s_W = np.asarray(pricing.step_s_of_workers(workers) / speeds,
                        np.float32)
  comm_s = np.asarray([pricing.clock_costs[n].seconds for n in meta["names"]],
                      np.float32)
  overlap = (meta["overlap_steps"] if meta["overlap_steps"] is not None
             else net.overlap)
  clock = net_lib.Clock(overlap, net.profile.startup_s)
  step_counts, sync_counts = ledger["step_counts"], ledger["sync_counts"]
  rounds = sync_counts.shape[0]
  full = rounds * period
  out = []
  if rounds:
    counts = step_counts[:full].reshape(rounds, period, -1)
    rel, ready = _round_steps(counts, step_s_W, comm_s)
    out.append(clock.rounds(rel, ready, _seconds(sync_counts, comm_s),
                            counts.sum(axis=-1) > 0))
  if step_counts.shape[0] > full:
    rel, _ = _round_steps(step_counts[None, full:], step_s_W, comm_s)
    out.append(clock.steps(rel[0], step_counts[full:].sum(axis=-1) > 0))
  times = np.concatenate(out) if out else np.zeros(0)
  return times, clock.elapsed


def _seconds(counts: np.ndarray, comm_s: np.ndarray) -> np.ndarray:
  """(..., C) events -> (...) float32 seconds, summed channel by channel in
  float32 as ``network._clock.comm_seconds`` sums them on the device."""
  total = np.zeros(counts.shape[:-1], np.float32)
  for i in range(counts.shape[-1]):
    total = total + counts[..., i].astype(np.float32) * comm_s[i]
  return total


def _round_steps(counts: np.ndarray, step_s_W: np.ndarray,
                 comm_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(n, H) float32 time after each step from its round's start, and (n,)
  when the round's sync starts, for ``counts`` (n, H, C) of each step's own
  events: ``_timing.Clocked.local`` for every round at once (every worker
  up, the slowest waited for, a barrier at each step that communicates)."""
  n, h = counts.shape[:2]
  ready_nW = np.zeros((n, step_s_W.shape[0]), np.float32)
  rel = np.zeros((n, h), np.float32)
  for j in range(h):
    ready_nW = ready_nW + step_s_W
    sent = counts[:, j].sum(axis=-1) > 0
    done = ready_nW.max(axis=1) + _seconds(counts[:, j], comm_s)
    ready_nW = np.where(sent[:, None], done[:, None], ready_nW)
    rel[:, j] = ready_nW.max(axis=1)
  return rel, ready_nW.max(axis=1)


def _logged_steps(run_dir) -> np.ndarray | None:
  """The steps of the rows of the run's metrics.csv (None without one)."""
  path = os.path.join(os.fspath(run_dir), "metrics.csv")
  if not os.path.isfile(path):
    return None
  with open(path, newline="") as f:
    steps = {int(float(r["step"])) for r in csv.DictReader(f) if r.get("step")}
  return np.asarray(sorted(steps), np.int64)


def _original_time(run_dir) -> float | None:
  path = os.path.join(os.fspath(run_dir), "summary.json")
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f).get("sim_time_s")


__all__ = ["retime"]
