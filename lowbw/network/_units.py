"""Parsing of human-written quantities: "100Mbps", "1Gbps", "50ms", "312TFLOPS".

Every parser accepts a Python number in the base unit too (bits/s, seconds,
FLOP/s, bytes); a string needs its unit ("50" could be seconds or
milliseconds), except a zero time. Anything else is a ValueError naming the
field and the accepted forms.
"""

import math
import re

from lowbw import _validate

_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"

# Bandwidth is in bits per second (network convention: 1 Mbit/s = 1e6 bit/s).
_BANDWIDTH = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12,
              "bit/s": 1.0, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9,
              "tbit/s": 1e12}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
         "min": 60.0, "h": 3600.0}
_FLOPS = {"flops": 1.0, "gflops": 1e9, "tflops": 1e12, "pflops": 1e15}
_BYTES = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30,
          "tib": 2.0 ** 40}


def _parse(field, value, units, what, examples, base, *, allow_zero):
  """``what``: "a time >= 0"; ``examples``: "'50ms' or '1.5s'"; ``base``:
  the unit of a Python number ("seconds")."""
  allowed = f"expected {what} such as {examples}, or a Python number of {base}"
  if isinstance(value, bool):
    raise _validate.fail(field, value, allowed)
  if isinstance(value, (int, float)):
    number = float(value)
  elif isinstance(value, str):
    match = re.fullmatch(_NUMBER + r"([A-Za-zµ/]*)\s*", value)
    unit = match.group(2).lower() if match else None
    if match is None or (unit and unit not in units):
      raise _validate.fail(field, value, allowed)
    number = float(match.group(1)) * (units[unit] if unit else 1.0)
    if not unit and not (allow_zero and number == 0):
      raise _validate.fail(field, value,
                           f"a number needs its unit, such as {examples}")
  else:
    raise _validate.fail(field, value, allowed)
  if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
    raise _validate.fail(field, value, allowed)
  return number


def link_values(value) -> list:
  """One link's value for every worker, or one per worker (or node, or
  region): ``"1Gbps,100Mbps"`` or a list; a single value as a list of
  one."""
  if isinstance(value, str):
    return [v.strip() for v in value.split(",")]
  return list(value) if isinstance(value, (list, tuple)) else [value]


def bandwidth(value, field: str = "bandwidth") -> float:
  """Bits per second from ``"100Mbps"``, ``"1Gbps"``, ``"10Gbit/s"``, bytes
  per second with a capital B (``"125MB/s"``, ``"1GBps"``), or a Python
  number of bit/s (> 0)."""
  if isinstance(value, str):
    match = re.fullmatch(_NUMBER + r"([kMGT]?)B(?:ps|/s)\s*", value)
    if match:  # bytes per second
      scale = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
      value = 8.0 * float(match.group(1)) * scale[match.group(2)]
  return _parse(field, value, _BANDWIDTH, "a bandwidth > 0",
                "'100Mbps', '1Gbps' or '125MB/s'", "bit/s", allow_zero=False)


def duration(value, field: str = "latency") -> float:
  """Seconds from ``"50ms"``, ``"2s"``, ``"100us"``, ``"0"`` or a Python
  number of seconds (>= 0)."""
  return _parse(field, value, _TIME, "a time >= 0", "'50ms' or '1.5s'",
                "seconds", allow_zero=True)


def flops(value, field: str = "flops") -> float:
  """FLOP/s from ``"312TFLOPS"``, ``"1.2PFLOPS"`` or a Python number (> 0)."""
  return _parse(field, value, _FLOPS, "a peak throughput > 0",
                "'989TFLOPS' or '1.2PFLOPS'", "FLOP/s", allow_zero=False)


def memory(value, field: str = "memory_budget") -> float:
  """Bytes from ``"8GB"``, ``"512MiB"``, ``"2.5GiB"`` or a Python number of
  bytes (> 0)."""
  return _parse(field, value, _BYTES, "a memory size > 0",
                "'8GB' or '512MiB'", "bytes", allow_zero=False)


_COUNT = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def count(value, field: str) -> float:
  """A count such as a number of parameters: ``"1B"``, ``"350M"``, ``"7e9"``
  or a number (> 0); the suffixes k, M, B (or G) and T are powers of 1000."""
  allowed = "expected a count > 0 such as '1B', '350M', '125k' or 7e9"
  number = None
  if isinstance(value, str):
    match = re.fullmatch(_NUMBER + r"([kKmMbBgGtT]?)\s*", value)
    if match:
      number = float(match.group(1)) * _COUNT[match.group(2).lower()]
  elif isinstance(value, (int, float)) and not isinstance(value, bool):
    number = float(value)
  if number is None or not math.isfinite(number) or number <= 0:
    raise _validate.fail(field, value, allowed)
  return number


def format_bytes(n: float) -> str:
  """Bytes in decimal units to 3 significant digits: "1.5 MB", "12 B"."""
  for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if abs(n) >= scale:
      return f"{n / scale:.3g} {unit}"
  return f"{n:.0f} B"


def format_bandwidth(bps: float) -> str:
  """Bit/s in the largest decimal unit that keeps the number >= 1, as the
  flags take it: "100Mbps", "2.5Gbps"."""
  for unit, scale in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6),
                      ("kbps", 1e3)):
    if bps >= scale:
      return f"{bps / scale:g}{unit}"
  return f"{bps:g}bps"


# (unit, seconds per unit), largest first, down to nanoseconds.
_DURATIONS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def format_duration(seconds: float) -> str:
  """Seconds in the largest unit that keeps the number >= 1, to 4
  significant digits: "1.5s", "7.268ms", "37ns"; "0s" for zero."""
  if seconds == 0 or not math.isfinite(seconds):
    return f"{seconds:g}s"
  unit, scale = next(((u, f) for u, f in _DURATIONS if abs(seconds) >= f),
                     _DURATIONS[-1])
  return f"{seconds / scale:.4g}{unit}"
