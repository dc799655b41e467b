"""How long this process took to get where it is: the start-up figures
of a run's summary (``startup`` in summary.json).

``process_age_s`` reads the process's start time from Linux's ``/proc``
(clock ticks after boot, so 10 ms resolution); elsewhere it is None.
``import_s()`` is the process's age when ``import lowbw`` finished: the
interpreter's start plus every import up to lowbw's own.
"""

import os
import time


def _boot_time_s() -> float | None:
  try:
    with open("/proc/stat") as f:
      for line in f:
        if line.startswith("btime "):
          return float(line.split()[1])
  except OSError:
    pass
  return None


def _started_at_s() -> float | None:
  """The epoch second this process started, or None off Linux."""
  boot = _boot_time_s()
  if boot is None:
    return None
  try:
    with open(f"/proc/{os.getpid()}/stat") as f:
      # After the command name, which may hold spaces, in parentheses.
      fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return boot + int(fields[19]) / ticks  # field 22: starttime
  except (OSError, ValueError, IndexError):
    return None


_STARTED_AT_S = _started_at_s()


def process_age_s() -> float | None:
  """Seconds since this process started, or None where that is unknown."""
  if _STARTED_AT_S is None:
    return None
  return max(time.time() - _STARTED_AT_S, 0.0)


_IMPORT_S = [process_age_s()]  # set again once ``import lowbw`` finished


def mark_imported() -> None:
  """Records the process's age now: lowbw's ``__init__`` calls it last."""
  _IMPORT_S[0] = process_age_s()


def import_s() -> float | None:
  """The process's age when ``import lowbw`` finished (None off Linux)."""
  return _IMPORT_S[0]
