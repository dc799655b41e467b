"""What the process is busy with now (compiling which programs, since
when), for a heartbeat that the command line prints while nothing else
shows. Set by the simulation around its long silent phases; read from
another thread. No printing here: only the command line prints."""

import contextlib
import threading
import time

_LOCK = threading.Lock()
_NOW: list = [None]  # (text, monotonic start) or None


@contextlib.contextmanager
def busy(text: str):
  """Marks ``text`` (e.g. "compiling the training chunk") as under way."""
  with _LOCK:
    before, _NOW[0] = _NOW[0], (text, time.monotonic())
  try:
    yield
  finally:
    with _LOCK:
      _NOW[0] = before


def current() -> tuple[str, float] | None:
  """``(text, seconds under way)`` of the innermost activity, or None."""
  with _LOCK:
    now = _NOW[0]
  if now is None:
    return None
  return now[0], time.monotonic() - now[1]
