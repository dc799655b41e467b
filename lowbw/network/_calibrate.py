"""Fitting the clock's network profile (``Profile``) to measured runs.

A measured run is one row of a CSV (``read_rows``) with the columns

  method, workers, bandwidth_bps, parameters, dtype_bytes, H,
  compute_s_per_step, sync_s

and optionally latency_s, first_sync_extra_s, host_s_per_step and
calls_per_sync (``REQUIRED``, ``OPTIONAL``; other columns are ignored).
``sync_s`` is the mean seconds of one sync with the run's first left out;
``bandwidth_bps`` is a number of bit/s, a rate with its unit ("50Mbps"),
the name of an ``iperf3 -J`` result (a .json file, beside the CSV) or a
``tc`` command with its rate ("tc qdisc add dev eth0 root tbf rate 50mbit
..."); left empty (an unshaped link), it is the mean rate of the iperf3
results given to ``read_rows``.

``fit`` reads the profile off the rows, each term in the open:

* per_call_s: the sync seconds no byte explains, per collective call. When
  the calls per byte-second differ between runs at one link rate, a least-
  squares fit of ``sync = bytes_time / efficiency + calls x per_call`` (one
  efficiency per rate, relative errors) separates the two. When they do not
  (the same model and trainer at every rate), the data cannot tell a
  per-call cost from a lower efficiency, and the fit takes the largest
  per-call cost that leaves every rate's efficiency at most 1.
* efficiency: per link rate (runs within ``LEVEL_SPAN`` of each other are
  one rate), the median over its runs of the fraction that makes the
  predicted sync equal the measured one once the calls are paid, clipped to
  (0, 1]. The points are left as measured, not smoothed: each is a median
  over runs, and a dip measured at one rate is what a run there meets.
* startup_s: the median of first_sync_extra_s (at least 0).
* host_s: the median of host_s_per_step.
* bucketed_allreduce: rows of method "ddp" are a bucketed gradient
  all-reduce (PyTorch DDP's reducer); the link's terms above come from the
  other rows, and of "ring" and "tree" the fit takes the algorithm whose
  syncs are nearer the DDP rows' (median relative error). With DDP rows
  only, the link's terms come from them, timed as ``base``'s algorithm
  (their syncs being what ``base.bucketed_overlap`` of the compute left).

A term no row measures keeps ``base``'s value.
"""

import csv
import json
import math
import os
import re
import statistics
from typing import NamedTuple

import numpy as np

from lowbw import _validate
from lowbw.network import _clock, _profile, _units
from lowbw.network._collectives import ring_allreduce
from lowbw.network._profile import CALIBRATED, Profile, check

REQUIRED = ("method", "workers", "bandwidth_bps", "parameters", "dtype_bytes",
            "H", "compute_s_per_step", "sync_s")
OPTIONAL = ("latency_s", "first_sync_extra_s", "host_s_per_step",
            "calls_per_sync")
TERMS = ("efficiency", "per_call_s", "startup_s", "host_s",
         "bucketed_allreduce")
# Runs whose rates are within 10 % of each other are one link rate (the
# measured runs' shaping gate: a verified rate within 10 % of the asked).
LEVEL_SPAN = 1.1
# tc(8)'s rate units: SI and IEC prefixes, bit or byte ("bps") per second.
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}
_TC_RATE = re.compile(r"\brate\s+([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
                      r"(k|m|g|t|ki|mi|gi|ti)?(bit|bps)?(%)?(?=\s|$)", re.I)


class Run(NamedTuple):
  """One measured run, checked (see the module for the columns)."""
  method: str
  workers: int
  bandwidth_bps: float
  parameters: int
  dtype_bytes: float
  H: int
  compute_s_per_step: float
  sync_s: float
  latency_s: float = 0.0
  first_sync_extra_s: float | None = None
  host_s_per_step: float | None = None
  calls_per_sync: int | None = None


def read_iperf3(path) -> float:
  """The bit/s an ``iperf3 -J`` result measured (received, for TCP)."""
  expected = "expected the JSON that iperf3 -J writes"
  path = _validate.existing_file("iperf3", path, "an iperf3 -J result")
  try:
    with open(path) as f:
      result = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise _validate.fail("iperf3", path, f"is not JSON ({e}); {expected}"
                         ) from None
  if isinstance(result, dict) and result.get("error"):
    raise _validate.fail("iperf3", path, f"records a failed test "
                         f"({result['error']}); measure again")
  end = result.get("end") if isinstance(result, dict) else None
  for key in ("sum_received", "sum"):  # TCP; UDP has only "sum"
    part = end.get(key) if isinstance(end, dict) else None
    bps = part.get("bits_per_second") if isinstance(part, dict) else None
    if isinstance(bps, (int, float)) and not isinstance(bps, bool) and (
        0 < bps < math.inf):
      return float(bps)
  raise _validate.fail("iperf3", path, "has no end.sum_received."
                       f"bits_per_second > 0 (nor end.sum's); {expected}")


def read_tc(line: str) -> float:
  """The bit/s of a ``tc`` line's ``rate`` (tbf, netem, htb; as typed or as
  ``tc qdisc show`` prints it): ``rate 50mbit`` is 50e6, ``rate 1gbit``
  1e9, ``rate 125mbps`` 1e9 (bytes per second), a bare number bit/s."""
  match = _TC_RATE.search(str(line))
  if not match:
    raise _validate.fail("tc", line, "has no 'rate <number><unit>' (such as "
                         "'tbf rate 50mbit ...' or 'netem rate 1gbit')")
  number, prefix, unit, percent = match.groups()
  if percent:
    raise _validate.fail("tc", line, "gives the rate as a share of the "
                         "device's speed; give it in bit/s (50mbit)")
  scale = _PREFIX[(prefix or "").lower()]
  bits = 8.0 if (unit or "bit").lower() == "bps" else 1.0
  rate = float(number) * scale * bits
  if not rate > 0:
    raise _validate.fail("tc", line, "has a rate of 0; expected a rate > 0")
  return rate


# column: (an integer, least value, the least value itself refused).
_CELLS = {"workers": (True, 2, False), "parameters": (True, 1, False),
          "dtype_bytes": (False, 0, True), "H": (True, 1, False),
          "compute_s_per_step": (False, 0, True), "sync_s": (False, 0, True),
          "latency_s": (False, 0, False), "host_s_per_step": (False, 0, False),
          "calls_per_sync": (True, 1, False),
          "first_sync_extra_s": (False, -math.inf, True)}


def _number(place: str, column: str, text):
  """A cell's number, within the column's bounds (``_CELLS``)."""
  integer, low, strict = _CELLS[column]
  try:
    value = float(text)
  except (TypeError, ValueError):
    value = math.nan
  ok = math.isfinite(value) and (value > low if strict else value >= low)
  if not ok or (integer and value != int(value)):
    kind = "an integer" if integer else "a number"
    bound = "" if low == -math.inf else f" {'>' if strict else '>='} {low:g}"
    raise _validate.fail(f"{column} ({place})", text, f"expected {kind}"
                         f"{bound}")
  return int(value) if integer else value


def _cell(place: str, column: str, text):
  if column == "method":
    if not isinstance(text, str) or not text.strip():
      raise _validate.fail(f"method ({place})", text, "expected the method's "
                           "name (ddp, diloco, ...)")
    return text.strip()
  if column == "bandwidth_bps":
    try:  # a CSV's cell is text: a plain number there is bit/s
      text = float(text)
    except (TypeError, ValueError):
      pass
    return _units.bandwidth(text, f"bandwidth_bps ({place})")
  return _number(place, column, text)


def run_of(row: dict, place: str) -> Run:
  """``row`` (a CSV row's strings, or numbers) as a checked ``Run``;
  ``place`` says where it came from in errors ("line 3 of runs.csv")."""
  if not isinstance(row, dict):
    raise _validate.fail(f"row ({place})", row, "expected a table of the "
                         "columns " + ", ".join(REQUIRED))
  for column in REQUIRED:
    if row.get(column) in (None, ""):
      raise _validate.fail(f"{column} ({place})", row.get(column), "is "
                           "required: " + ", ".join(REQUIRED))
  values = {c: _cell(place, c, row[c]) for c in REQUIRED + OPTIONAL
            if row.get(c) not in (None, "")}
  return Run(**values)


def _bandwidth_cell(text: str, folder: str, unshaped: float | None,
                    place: str):
  """A ``bandwidth_bps`` cell with files and tc lines read (the module)."""
  text = (text or "").strip()
  if not text:
    if unshaped is None:
      raise _validate.fail(f"bandwidth_bps ({place})", text, "is empty "
                           "(an unshaped link): give iperf3 -J results of "
                           "the cluster (--iperf3), or a rate")
    return unshaped
  if text.lower().endswith(".json"):
    return read_iperf3(os.path.join(folder, text))
  if re.search(r"\brate\b", text):
    return read_tc(text)
  return text


def read_rows(path, iperf3=()) -> list[Run]:
  """The measured runs of the CSV ``path`` (see the module); an empty
  ``bandwidth_bps`` is the mean rate of the ``iperf3`` -J results."""
  path = _validate.existing_file("measurements", path, "a CSV of measured "
                                 "runs")
  unshaped = (statistics.fmean(read_iperf3(f) for f in iperf3)
              if iperf3 else None)
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
    if missing:
      raise _validate.fail("measurements", path, f"has no column "
                           f"{missing[0]!r}; expected the columns "
                           + ", ".join(REQUIRED))
    rows = list(reader)
  if not rows:
    raise _validate.fail("measurements", path, "has no rows; expected one "
                         "row per measured run")
  runs, folder = [], os.path.dirname(os.path.abspath(path))
  for i, row in enumerate(rows):
    place = f"line {i + 2} of {path}"
    row = {**row, "bandwidth_bps": _bandwidth_cell(
        row["bandwidth_bps"], folder, unshaped, place)}
    runs.append(run_of(row, place))
  return runs


def bucketed(run: Run) -> bool:
  """Whether ``run``'s sync is a bucketed gradient all-reduce: a DDP run's
  (method "ddp")."""
  return run.method.lower() == "ddp"


def _channels(run: Run) -> dict:
  payload = run.parameters * run.dtype_bytes
  return {"sync": ring_allreduce(payload, run.workers)._replace(
      bucketed=bucketed(run))}


def _ideal_seconds(run: Run, algorithm: str = "ring"
                   ) -> tuple[float, float]:
  """The ideal clock's ``(bytes seconds, latency seconds)`` of ``run``'s
  sync: one all-reduce of its parameters, as lowbw prices it (a bucketed
  one under ``algorithm``)."""
  ideal = _profile.IDEAL._replace(bucketed_allreduce=algorithm)

  def seconds(latency):
    net = _clock.network(run.bandwidth_bps, latency, topology="ring",
                         profile=ideal)
    return _clock.channel_costs(net, _channels(run), run.workers)[
        "sync"].seconds
  x = seconds(0.0)
  return x, seconds(run.latency_s) - x


def predict(profile: Profile, run: Run) -> tuple[float, float]:
  """lowbw's ``(seconds of one sync, seconds of one step)`` for ``run``
  under ``profile``: the clock's price of a ring all-reduce of its
  parameters, with ``calls_per_sync`` calls when the run gives them."""
  if run.calls_per_sync is not None:
    profile = profile._replace(calls=run.calls_per_sync)
  net = _clock.network(run.bandwidth_bps, run.latency_s, topology="ring",
                       hardware=f"{run.compute_s_per_step!r}s",
                       profile=profile)
  pricing = _clock.price(net, _channels(run), run.workers, run.parameters,
                         flops_per_step=1.0)
  return pricing.clock_costs["sync"].seconds, pricing.step_s


class _Point(NamedTuple):
  """A run as the fit sees it: sync = x / efficiency + latency + calls x
  per_call."""
  bandwidth_bps: float
  x: float         # the sync's bytes seconds at the full link rate
  latency: float   # its latency seconds
  calls: int
  sync_s: float


def _levels(runs: list[Run], algorithm: str = "ring", overlap: float = 0.0
            ) -> list[list[_Point]]:
  """The runs' points grouped by link rate (ascending; ``LEVEL_SPAN``); a
  bucketed run's sync with what ``overlap`` of its compute hid added back
  (the whole all-reduce)."""
  levels = []
  for run in sorted(runs, key=lambda r: r.bandwidth_bps):
    x, latency = _ideal_seconds(run, algorithm)
    hidden = overlap * run.compute_s_per_step if bucketed(run) else 0.0
    point = _Point(run.bandwidth_bps, x, latency, run.calls_per_sync or 1,
                   run.sync_s + hidden)
    if levels and point.bandwidth_bps <= LEVEL_SPAN * levels[-1][0].bandwidth_bps:
      levels[-1].append(point)
    else:
      levels.append([point])
  return levels


def _separable(levels) -> bool:
  """Whether some rate holds runs whose calls per bytes-second differ (by
  more than ``LEVEL_SPAN``): only then can a fit tell a per-call cost from
  a lower efficiency."""
  for points in levels:
    ratios = [p.calls / p.x for p in points]
    if max(ratios) > LEVEL_SPAN * min(ratios):
      return True
  return False


def _per_call(levels) -> float:
  """per_call_s (see the module): least squares when separable, else the
  largest value that keeps every rate's efficiency at most 1."""
  points = [p for level in levels for p in level]
  if _separable(levels):
    # sync - latency = x * (1 / efficiency of the rate) + calls * per_call,
    # each row divided by its sync: relative errors weigh alike.
    design = np.zeros((len(points), len(levels) + 1))
    row = 0
    for j, level in enumerate(levels):
      for p in level:
        design[row, j], design[row, -1] = p.x / p.sync_s, p.calls / p.sync_s
        row += 1
    target = np.array([(p.sync_s - p.latency) / p.sync_s for p in points])
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    return max(float(solution[-1]), 0.0)
  # Per rate, the seconds no byte explains per call; a rate whose syncs beat
  # its link even at efficiency 1 (a link rate below what the collective
  # reached) bounds nothing.
  spare = [statistics.median((p.sync_s - p.latency - p.x) / p.calls
                             for p in level) for level in levels]
  return max(0.0, min((s for s in spare if s >= 0), default=0.0))


def _efficiency(levels, per_call_s: float) -> tuple:
  """Per rate, the median fraction that makes predicted = measured."""
  out = []
  for level in levels:
    shares = []
    for p in level:
      left = p.sync_s - p.latency - p.calls * per_call_s
      shares.append(p.x / left if left > 0 else 1.0)
    bandwidth = statistics.median(p.bandwidth_bps for p in level)
    out.append((bandwidth, min(1.0, statistics.median(shares))))
  return tuple(out)


def fit(rows, *, fit_terms=TERMS, base: Profile = CALIBRATED,
        calls="fused") -> Profile:
  """The ``Profile`` that fits measured runs (see the module).

  Args:
    rows: the runs: ``Run``s (``read_rows``) or tables of the columns (a
      CSV's rows, as text or numbers).
    fit_terms: the terms to fit; the others are ``base``'s.
    base: the profile whose terms are kept where not fitted or measured.
    calls: the fitted profile's calls per event ("fused", "per_tensor" or a
      number): a property of the trainer to be timed, not of the cluster.
  """
  unknown = [t for t in fit_terms if t not in TERMS]
  if unknown:
    raise _validate.fail("fit_terms", unknown[0], "expected some of "
                         + ", ".join(TERMS))
  runs = [r if isinstance(r, Run) else run_of(r, f"row {i}")
          for i, r in enumerate(rows)]
  if not runs:
    raise _validate.fail("rows", rows, "expected at least one measured run")
  terms = {"calls": calls}
  explicit = [r for r in runs if not bucketed(r)]
  # The link's terms come from the explicit all-reduces; from the bucketed
  # ones (timed as base's algorithm) only when there are no others.
  levels = _levels(explicit or runs,
                   "ring" if explicit else base.bucketed_allreduce,
                   base.bucketed_overlap)
  per_call = (_per_call(levels) if "per_call_s" in fit_terms
              else base.per_call_s)
  terms["per_call_s"] = per_call
  if "efficiency" in fit_terms:
    terms["efficiency"] = _efficiency(levels, per_call)
  extra = [r.first_sync_extra_s for r in runs
           if r.first_sync_extra_s is not None]
  if "startup_s" in fit_terms and extra:
    terms["startup_s"] = max(0.0, statistics.median(extra))
  host = [r.host_s_per_step for r in runs if r.host_s_per_step is not None]
  if "host_s" in fit_terms and host:
    terms["host_s"] = statistics.median(host)
  profile = check(base._replace(**terms), "calls")
  ddp = [r for r in runs if bucketed(r)]
  if "bucketed_allreduce" in fit_terms and ddp and explicit:
    profile = min((profile._replace(bucketed_allreduce=a)
                   for a in _profile.ALGORITHMS),
                  key=lambda p: _median_error(p, ddp))
  return profile


def _median_error(profile: Profile, runs: list[Run]) -> float:
  """The median |relative error| of ``profile``'s sync seconds on ``runs``."""
  return statistics.median(abs(predict(profile, r)[0] / r.sync_s - 1)
                           for r in runs)


def cu(run: Run, sync_s: float, step_s: float) -> float:
  """Compute utilisation of one round: the device's compute over the wall
  (H steps of ``step_s`` and one sync of ``sync_s``)."""
  work = run.H * run.compute_s_per_step
  return work / (run.H * step_s + sync_s)


def residuals(runs: list[Run], profile: Profile) -> dict:
  """Per method, the median and max |relative error| of the predicted sync
  seconds and compute utilisation of one round (first sync left out)."""
  by_method = {}
  for run in runs:
    sync_s, step_s = predict(profile, run)
    measured_cu = cu(run, run.sync_s, run.compute_s_per_step + (
        run.host_s_per_step or 0.0))
    by_method.setdefault(run.method, []).append(
        (abs(sync_s / run.sync_s - 1),
         abs(cu(run, sync_s, step_s) / measured_cu - 1)))
  return {m: {"runs": len(errs), **{
      key: {"median": statistics.median(e[k] for e in errs),
            "max": max(e[k] for e in errs)}
      for k, key in enumerate(("sync", "cu"))}}
      for m, errs in by_method.items()}
