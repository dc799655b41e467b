"""What real links and collectives cost beyond latency + bytes / bandwidth.

A ``Profile`` holds the terms the clock adds to its ideal link model, each
measured on real runs (DDP, LocalSGD and DiLoCo on 4 NVIDIA L40S nodes over
``tc``-shaped TCP links, 50 Mbit/s to 5 Gbit/s; the data and its source are
in ``benchmarks/calibration/``):

* ``efficiency``: the fraction of a link's rate a collective reaches, by the
  link's bandwidth. NCCL's ring over a shaped TCP link reached 0.79 of the
  link at 50 Mbit/s, 0.907 at 200 Mbit/s, all of it at 1 Gbit/s and 0.989
  at 5 Gbit/s (once the per-call cost below is counted). Between the
  measured rates it is interpolated in log-bandwidth; outside them it is
  the nearest one's.
* ``per_call_s`` and ``calls``: every collective call costs a fixed time on
  top of its bytes (0.30 ms fitted), and an event of a channel makes
  ``calls`` of them: 1 when the payload is fused into one buffer (lowbw's
  engine sends each channel as one), or ``"per_tensor"`` for trainers that
  issue one all-reduce per parameter tensor (57 calls a sync in the
  measured runs, about 17 ms a sync).
* ``startup_s``: a one-off cost of the run's first communication (setting up
  the communicator: the first sync took 0.24 to 0.98 s longer, median
  0.37 s).
* ``host_s``: host time per inner step beside the device's compute (the
  optimizer step and the data loader: 0.1 ms per step measured for DiLoCo,
  4.7 ms for DDP's trainer); 0 by default, since it belongs to a trainer.
* ``bucketed_allreduce``: the algorithm of a bucketed gradient all-reduce
  (PyTorch DDP's reducer, which lowbw's ``ddp`` stands for): ``"tree"``
  (NCCL's double binary tree: the busiest member sends twice the payload,
  4/3 of the ring's bytes at 4 workers) or ``"ring"``. DDP's measured syncs
  took 1.32x the ring's time at 1 and 5 Gbit/s, where the explicit
  all-reduces of LocalSGD and DiLoCo took 1.00-1.01x: the tree's wire. The
  source recorded neither NCCL's algorithm nor DDP's buckets, so "tree" is
  the model that fits, not an observation.
* ``bucketed_overlap``: such an all-reduce runs while the backward pass
  computes, so a step waits only for what is left of it after
  ``bucketed_overlap`` of the step's device compute (2/3 by default: the
  backward pass's 4 of the 6 FLOPs per parameter and token).

The defaults (``CALIBRATED``) are ``lowbw calibrate``'s fit of those runs
(``benchmarks/calibration/profile.yaml``), rounded; ``IDEAL`` is the clock
without these terms (what lowbw computed before them).
A profile is saved as YAML (``save``, ``load``); ``lowbw calibrate`` fits one
to a user's own measurements.
"""

import math
import os
from typing import NamedTuple

import yaml

from lowbw import _validate

CALLS = ("fused", "per_tensor")
ALGORITHMS = ("ring", "tree")


class Profile(NamedTuple):
  """The clock's terms beyond the ideal link model (see the module).

  Attributes:
    efficiency: ``((bandwidth bit/s, fraction), ...)``, ascending.
    per_call_s: seconds of every collective call beside its bytes.
    calls: collective calls per event of a channel: "fused" (one),
      "per_tensor" (one per parameter tensor) or a number.
    startup_s: seconds added to the run's first communication.
    host_s: host seconds per inner step beside the device's compute.
    bucketed_allreduce: the algorithm of a bucketed gradient all-reduce
      (DDP's): "tree" or "ring".
    bucketed_overlap: the share of a step's device compute a bucketed
      all-reduce runs behind (the backward pass), in [0, 1].
  """

  efficiency: tuple[tuple[float, float], ...] = (
      (50e6, 0.79), (200e6, 0.907), (1e9, 1.0), (5e9, 0.989))
  per_call_s: float = 0.30e-3
  calls: str | int = "fused"
  startup_s: float = 0.37
  host_s: float = 0.0
  bucketed_allreduce: str = "tree"
  bucketed_overlap: float = 2.0 / 3.0

  def efficiency_at(self, bandwidth_bps: float) -> float:
    """The fraction of a ``bandwidth_bps`` link a collective reaches."""
    points = self.efficiency
    if bandwidth_bps <= points[0][0]:
      return points[0][1]
    for (b0, e0), (b1, e1) in zip(points, points[1:]):
      if bandwidth_bps <= b1:
        t = math.log(bandwidth_bps / b0) / math.log(b1 / b0)
        return e0 + t * (e1 - e0)
    return points[-1][1]

  def calls_per_event(self, num_tensors: int) -> int:
    """Collective calls one event of a channel makes."""
    if self.calls == "fused":
      return 1
    if self.calls == "per_tensor":
      return max(1, int(num_tensors))
    return int(self.calls)

  def describe(self) -> dict:
    return {"efficiency": [list(p) for p in self.efficiency],
            "per_call_s": self.per_call_s, "calls": self.calls,
            "startup_s": self.startup_s, "host_s": self.host_s,
            "bucketed_allreduce": self.bucketed_allreduce,
            "bucketed_overlap": self.bucketed_overlap}


CALIBRATED = Profile()
IDEAL = Profile(efficiency=((1.0, 1.0),), per_call_s=0.0, calls="fused",
                startup_s=0.0, host_s=0.0, bucketed_allreduce="ring",
                bucketed_overlap=0.0)
NAMES = {"calibrated": CALIBRATED, "ideal": IDEAL}


def check(p: Profile, field: str = "network_profile") -> Profile:
  """``p`` if every term is sound; else a ConfigError naming the term."""
  if not isinstance(p, Profile):
    raise _validate.fail(field, p, "expected a lowbw.network.Profile, "
                         + ", ".join(repr(n) for n in NAMES)
                         + " or a YAML file of one")
  points = tuple((float(b), float(e)) for b, e in p.efficiency)
  if not points or any(not (b > 0 and 0 < e <= 1) for b, e in points) or any(
      b1 <= b0 for (b0, _), (b1, _) in zip(points, points[1:])):
    raise _validate.fail("efficiency", p.efficiency, "expected (bandwidth "
                         "bit/s, fraction in (0, 1]) pairs, bandwidths "
                         "ascending")
  for name in ("per_call_s", "startup_s", "host_s"):
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        0 <= value < math.inf):
      raise _validate.fail(name, value, "expected seconds >= 0")
  calls = p.calls
  if not (calls in CALLS or (isinstance(calls, int) and not isinstance(
      calls, bool) and calls >= 1)):
    raise _validate.fail("calls", calls, "expected 'fused', 'per_tensor' or "
                         "a number of calls >= 1")
  overlap = p.bucketed_overlap
  if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or (
      not 0 <= overlap <= 1):
    raise _validate.fail("bucketed_overlap", overlap, "expected a share of "
                         "the step's compute in [0, 1]")
  if p.bucketed_allreduce not in ALGORITHMS:
    raise _validate.fail("bucketed_allreduce", p.bucketed_allreduce,
                         "expected " + " or ".join(map(repr, ALGORITHMS)))
  return p._replace(efficiency=points, per_call_s=float(p.per_call_s),
                    startup_s=float(p.startup_s), host_s=float(p.host_s),
                    bucketed_overlap=float(overlap))


def profile(spec=None) -> Profile:
  """A ``Profile`` from a name ("calibrated", the default; "ideal"), a YAML
  file written by ``save`` or ``lowbw calibrate``, a table of its terms (a
  term left out is the calibrated default's) or a ``Profile``."""
  if spec is None:
    return CALIBRATED
  if isinstance(spec, Profile):
    return check(spec)
  if isinstance(spec, dict):  # its terms, as a config file gives them
    return from_description(spec, "network_profile", CALIBRATED)
  if isinstance(spec, str) and spec in NAMES:
    return NAMES[spec]
  if isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec):
    return load(spec)
  if isinstance(spec, os.PathLike) or (isinstance(spec, str) and (
      spec.endswith((".yaml", ".yml")) or os.sep in spec)):
    raise _validate.fail("network_profile", str(spec), "no such file (a "
                         "profile's YAML file, as lowbw calibrate writes)")
  raise _validate.fail("network_profile", spec, "expected " + " or ".join(
      repr(n) for n in NAMES) + ", a YAML file of a profile (lowbw "
      "calibrate writes one) or a lowbw.network.Profile")


def from_description(values: dict, source: str = "network_profile",
                     base: Profile = IDEAL) -> Profile:
  """The profile ``describe()`` wrote as ``values`` (a table of terms); a
  term missing is ``base``'s: the ideal clock's for a run's record written
  before the term existed."""
  unknown = sorted(set(values) - set(Profile._fields))
  if unknown:
    raise _validate.fail("network_profile", source, f"{unknown[0]!r} is "
                         "not a term; expected " + ", ".join(Profile._fields))
  values = dict(values)
  if "efficiency" in values:
    try:
      values["efficiency"] = tuple(tuple(p) for p in values["efficiency"])
    except TypeError:
      raise _validate.fail("efficiency", values["efficiency"], "expected "
                           "(bandwidth bit/s, fraction) pairs") from None
  return check(base._replace(**values))


def load(path) -> Profile:
  """The profile saved in the YAML file ``path`` (a term it leaves out is
  the calibrated default's)."""
  try:
    with open(path) as f:
      values = yaml.safe_load(f)
  except (OSError, yaml.YAMLError) as e:
    raise _validate.fail("network_profile", str(path),
                         f"cannot be read: {e}") from None
  if not isinstance(values, dict):
    raise _validate.fail("network_profile", str(path), "expected a YAML "
                         "table of the profile's terms")
  return from_description(values, str(path), CALIBRATED)


def save(p: Profile, path) -> str:
  """Writes ``p`` to ``path`` as YAML; returns the path."""
  with open(path, "w") as f:
    yaml.safe_dump(check(p).describe(), f, sort_keys=False)
  return str(path)
