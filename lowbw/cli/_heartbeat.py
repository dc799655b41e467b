"""A line on stderr every few seconds while the run is silent for long:
compiling (what and for how long), or computing its first steps. Without
it the default run shows nothing for the minute its first compile takes."""

import sys
import threading
import time

from lowbw.telemetry import _activity

AFTER_S = 2.0      # say nothing about a phase shorter than this
EVERY_S = 10.0     # then a line this often
POLL_S = 0.25


class Heartbeat:
  """Started before the run, told of each logged row, stopped after it.

  While an activity (``lowbw.telemetry._activity``) has been under way
  for ``after_s``, prints "lowbw: compiling ... (12 s)" to ``file`` every
  ``every_s``; before the first row with no activity, "running the first
  steps".
  """

  def __init__(self, after_s: float | None = None,
               every_s: float | None = None, file=None):
    self.after_s = AFTER_S if after_s is None else after_s
    self.every_s = EVERY_S if every_s is None else every_s
    self.file = file or sys.stderr
    self._rows = 0
    self._stop = threading.Event()
    self._quiet_since = time.monotonic()
    self._thread = threading.Thread(target=self._beat, daemon=True)

  def start(self) -> "Heartbeat":
    self._quiet_since = time.monotonic()
    self._thread.start()
    return self

  def row(self, row=None) -> None:
    self._rows += 1
    self._quiet_since = time.monotonic()

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()

  def _line(self) -> tuple[str, str] | None:
    """(phase, the line saying it) when something has run long unseen."""
    now = _activity.current()
    if now is not None:  # the first steps are counted from its end
      self._quiet_since = time.monotonic()
      if now[1] >= self.after_s:
        return now[0], f"{now[0]} ({now[1]:.0f} s)"
      return None
    quiet = time.monotonic() - self._quiet_since
    if self._rows == 0 and quiet >= self.after_s:
      return "first steps", (f"preparing and running the first steps "
                              f"({quiet:.0f} s)")
    return None

  def _beat(self) -> None:
    said, phase = None, None  # when the last line was printed, of what
    while not self._stop.wait(POLL_S):
      line = self._line()
      if line is None:
        said = phase = None
        continue
      if line[0] != phase or time.monotonic() - said >= self.every_s:
        _write(f"lowbw: {line[1]}", self.file)
        said, phase = time.monotonic(), line[0]

def _write(text: str, file) -> None:
  """Above a progress bar on the same stream, if one is drawn."""
  try:
    from tqdm.auto import tqdm
    tqdm.write(text, file=file)
    file.flush()
  except ImportError:
    print(text, file=file, flush=True)
