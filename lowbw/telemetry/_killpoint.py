"""Named points in a run's writes where a durability test may kill the
process; inert unless ``LOWBW_KILL_AT`` is set.

``LOWBW_KILL_AT=NAME:N[:DELAY]``: the N-th time the process reaches the
point NAME it SIGKILLs itself, at once or DELAY seconds later from a timer
thread (so that the kill lands inside what follows, such as orbax's commit
of a checkpoint). ``LOWBW_KILL_COUNTS=FILE`` appends the name of every point
reached to FILE, so a campaign knows which kills a run offers.

The points: ``checkpoint`` (a save begins), ``checkpoint_saved`` (a save
returned), ``row`` (a row is in metrics.csv, not yet in TensorBoard),
``replace`` (a JSON or parameter file's temporary copy is written, not yet
renamed over the file), ``table`` (a study is about to write one of its
tables: study.csv, final.csv, points.csv, a Parquet copy).
``benchmarks/kill_campaign.py`` and ``tests/test_kill_anywhere.py`` use
them.
"""

import os
import signal
import threading

from lowbw import _validate

POINTS = ("checkpoint", "checkpoint_saved", "row", "replace", "table")


def _plan(text: str | None):
  if not text:
    return None
  name, _, rest = text.partition(":")
  count, _, delay = rest.partition(":")
  try:
    seconds = float(delay) if delay else 0.0
  except ValueError:
    seconds = -1.0
  if (name not in POINTS or not count.isdigit() or int(count) < 1
      or not 0.0 <= seconds < float("inf")):
    # A test's own variable: a typo must not pass as "never killed".
    raise _validate.fail("LOWBW_KILL_AT", text, "expected NAME:N[:DELAY] "
                         f"with NAME one of {', '.join(POINTS)}, N >= 1 and "
                         "DELAY seconds >= 0")
  return name, int(count), seconds


_PLAN = _plan(os.environ.get("LOWBW_KILL_AT"))
_COUNTS = os.environ.get("LOWBW_KILL_COUNTS") or None
_reached: dict[str, int] = {}


def kill_point(name: str) -> None:
  """Marks point ``name`` as reached; kills the process there when
  ``LOWBW_KILL_AT`` says so. Does nothing when neither variable is set."""
  if _PLAN is None and _COUNTS is None:
    return
  if _COUNTS is not None:
    with open(_COUNTS, "a") as f:
      f.write(name + "\n")
  _reached[name] = _reached.get(name, 0) + 1
  if _PLAN is None or (name, _reached[name]) != _PLAN[:2]:
    return
  if _PLAN[2] > 0:
    timer = threading.Timer(_PLAN[2], _die)
    timer.daemon = True
    timer.start()
  else:
    _die()


def _die() -> None:
  os.kill(os.getpid(), signal.SIGKILL)
