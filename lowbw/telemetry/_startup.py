"""How long this process took to get where it is: the start-up figures
of a run's summary (``startup`` in summary.json).

``process_age_s`` is the seconds since the boot (``/proc/uptime``) less the
process's start in clock ticks after the boot (``/proc/<pid>/stat``), so
10 ms resolution on Linux; elsewhere it is None. ``import_s()`` is the
process's age when ``import lowbw`` finished: the interpreter's start plus
every import up to lowbw's own.
"""

import os

# The summary's start-up phases in the order they are spent, with the
# words ``lowbw train`` and benchmarks/startup.py print for them.
STARTUP_PHASES = (
    ("import_s", "import"), ("build_s", "build"),
    ("initial_state_s", "initial state"), ("trace_s", "trace"),
    ("compile_load_s", "compile/load"), ("first_row_s", "first chunk"))


def _started_after_boot_s() -> float | None:
  """Seconds after the boot this process started, or None off Linux."""
  try:
    with open(f"/proc/{os.getpid()}/stat") as f:
      # After the command name, which may hold spaces, in parentheses.
      fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
  except (OSError, ValueError, IndexError, AttributeError):
    return None


_STARTED_S = _started_after_boot_s()


def process_age_s() -> float | None:
  """Seconds since this process started, or None where that is unknown."""
  if _STARTED_S is None:
    return None
  try:
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None
  return max(uptime - _STARTED_S, 0.0)


_IMPORT_S = [process_age_s()]  # set again once ``import lowbw`` finished


def mark_imported() -> None:
  """Records the process's age now: lowbw's ``__init__`` calls it last."""
  _IMPORT_S[0] = process_age_s()


def import_s() -> float | None:
  """The process's age when ``import lowbw`` finished (None off Linux)."""
  return _IMPORT_S[0]
