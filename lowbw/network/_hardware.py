"""Compute time per inner step: a hardware profile for every worker.

Time per step = 6 * P * tokens / (peak FLOP/s * MFU): the 6P FLOPs per token of
the forward and backward matrix products (Kaplan et al., 2020), at a model-FLOP
utilisation (default 0.4, what large models reach; a small model reaches
less: a 30.8M-parameter model in fp32 reached 0.16 of an L40S's fp32 peak in
the measured runs of ``benchmarks/calibration``). Or a fixed number of
seconds per step. Per-worker speed multipliers describe a heterogeneous fleet.
"""

import os
import re
from typing import NamedTuple

from lowbw import _validate
from lowbw.network import _units

# Dense BF16/FP16 peak FLOP/s (no sparsity), from the vendors' data sheets.
PRESETS = {
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
    "b200": 2.25e15,
    "mi300x": 1.307e15,
    "l4": 121e12,
    "l40s": 362e12,
    "rtx4090": 165e12,
    "v100": 125e12,
}


class Hardware(NamedTuple):
  """What one worker computes per second.

  Attributes:
    name: a preset name or a description.
    flops: peak FLOP/s of one worker (None with ``step_time_s``).
    mfu: the fraction of peak actually achieved, in (0, 1].
    step_time_s: fixed seconds per inner step (replaces the FLOP model).
    speeds: per-worker speed multipliers (2.0 = twice as fast), one per
      worker; None for a homogeneous fleet.
  """

  name: str
  flops: float | None
  mfu: float = 0.4
  step_time_s: float | None = None
  speeds: tuple[float, ...] | None = None

  def step_seconds(self, flops_per_step: float) -> float:
    """Seconds of one inner step at speed 1."""
    if self.step_time_s is not None:
      return self.step_time_s
    return flops_per_step / (self.flops * self.mfu)

  def describe(self) -> dict:
    return self._asdict() | {"speeds": None if self.speeds is None
                             else list(self.speeds)}


def hardware(spec="h100", mfu: float = 0.4, speeds=None) -> Hardware:
  """A ``Hardware`` from a preset name (``"h100"``, ``"a100"``, ...), a peak
  (``"312TFLOPS"`` or FLOP/s) or a fixed time per step (``"0.5s"``, ``"20ms"``).

  Args:
    spec: preset, peak throughput, or seconds per step.
    mfu: model-FLOP utilisation in (0, 1] (ignored for a time per step).
    speeds: per-worker speed multipliers (> 0), or None.
  """
  mfu = _validate.fraction("mfu", mfu)
  speeds = check_speeds(speeds)
  if isinstance(spec, str) and spec.lower() in PRESETS:
    return Hardware(spec.lower(), PRESETS[spec.lower()], mfu, None, speeds)
  if isinstance(spec, str) and re.fullmatch(r"\s*[0-9.]+.*s\s*", spec) and (
      not spec.strip().lower().endswith("flops")):
    seconds = _units.duration(spec, "hardware")
    if seconds <= 0:
      raise _validate.fail("hardware", spec, "a time per step must be > 0")
    return Hardware(spec, None, mfu, seconds, speeds)
  if isinstance(spec, (int, float)) and not isinstance(spec, bool) and (
      0 < spec < 1e9):
    raise _validate.fail("hardware", spec, "a number is a peak in FLOP/s; "
                         f"for seconds per step write '{spec}s'")
  try:
    peak = _units.flops(spec, "hardware")
  except ValueError:
    raise _validate.fail(
        "hardware", spec, "expected a preset (" + ", ".join(sorted(PRESETS)) +
        "), a peak such as '312TFLOPS', or seconds per step such as "
        "'0.5s'") from None
  return Hardware(str(spec), peak, mfu, None, speeds)


def _what_is_there(text: str) -> str:
  """Says what a path given where speeds were expected names (a folder,
  /dev/null): a trace is read only from a .csv file."""
  path = text.strip()
  if os.path.isdir(path):
    return "is a folder; "
  if os.path.exists(path):
    return ("is a file without the .csv suffix a trace needs; "
            if os.path.isfile(path) else "is not a regular file; ")
  return ""


def check_speeds(speeds) -> tuple[float, ...] | None:
  if speeds is None:
    return None
  if isinstance(speeds, str):
    try:
      speeds = [float(s) for s in speeds.split(",")]
    except ValueError:
      raise _validate.fail("speeds", speeds, _what_is_there(speeds) +
                           "expected comma-separated numbers > 0, one per "
                           "worker, or a .csv trace file") from None
  try:
    values = tuple(float(s) for s in speeds)
  except (TypeError, ValueError):
    raise _validate.fail("speeds", speeds, "expected numbers > 0, one per "
                         "worker") from None
  if not values or not all(v > 0 and v < float("inf") for v in values):
    raise _validate.fail("speeds", speeds, "expected numbers > 0, one per "
                         "worker")
  return values
