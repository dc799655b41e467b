"""Claims on a study's points: whoever runs a point holds its claim, so that
processes sharing a study folder (an executor's workers, two studies started
on one folder) run each point once.

    OUT/claims/NNNN.json   {"host", "pid", "start", "token"} of the holder
    OUT/claims/.lock       taken (``flock``) while claims are read or made

A claim is made under the folder's lock, only for a point that has not
finished and that nobody holds; it is removed once the point's
``point.json`` is written. A claim is stale, and taken over, when its holder
is gone: a process of this host that no longer runs (its pid is free or
now another process's, told by its start time), or a process of another
host whose claim has not been refreshed for ``STALE_S`` seconds (holders
refresh theirs every ``HEARTBEAT_S``).
"""

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid

from lowbw.telemetry._writers import write_json

FOLDER = "claims"  # _files.CLAIMS
HEARTBEAT_S = 30.0
STALE_S = 300.0
# path -> token of the claims this process holds.
_HELD: dict[str, str] = {}
_HELD_LOCK = threading.Lock()
_beating: list[threading.Thread] = []


def path(out: str, index: int) -> str:
  return os.path.join(out, FOLDER, f"{index:04d}.json")


def start_time(pid: int) -> str | None:
  """When process ``pid`` started (clock ticks since boot, from
  ``/proc``), or None where that cannot be read."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rpartition(")")[2].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def stale(holder: dict, file: str) -> bool:
  """Whether the claim ``holder`` (read from ``file``) has no live holder."""
  if holder.get("host") != socket.gethostname():
    try:
      return time.time() - os.path.getmtime(file) > STALE_S
    except OSError:
      return True
  pid = holder.get("pid")
  if not isinstance(pid, int) or not _alive(pid):
    return True
  if pid == os.getpid():  # this process: held only if it says so
    with _HELD_LOCK:
      return _HELD.get(file) != holder.get("token")
  now, then = start_time(pid), holder.get("start")
  return now is not None and then is not None and now != then


@contextlib.contextmanager
def _locked(out: str):
  folder = os.path.join(out, FOLDER)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, ".lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _read(file: str) -> dict | None:
  try:
    with open(file) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}  # unreadable: no live holder can be told, so stale


def holder(out: str, index: int) -> dict | None:
  """The live holder of point ``index``'s claim, or None (no claim, or a
  stale one)."""
  file = path(out, index)
  claim = _read(file)
  return None if claim is None or stale(claim, file) else claim


def take(out: str, indices, finished) -> list[int]:
  """Claims those of ``indices`` that have not finished (``finished(i)``)
  and that no live process holds; returns them."""
  got = []
  with _locked(out):
    for i in indices:
      file = path(out, i)
      if finished(i) or holder(out, i) is not None:
        continue
      token = uuid.uuid4().hex
      write_json(file, {"host": socket.gethostname(), "pid": os.getpid(),
                        "start": start_time(os.getpid()), "token": token})
      with _HELD_LOCK:
        _HELD[file] = token
      got.append(i)
  if got:
    _heartbeat()
  return got


def release(out: str, indices) -> None:
  """Removes this process's claims on ``indices`` (a claim another process
  took over is left alone)."""
  with _locked(out):
    for i in indices:
      file = path(out, i)
      with _HELD_LOCK:
        token = _HELD.pop(file, None)
      claim = _read(file)
      if token is not None and claim and claim.get("token") == token:
        with contextlib.suppress(FileNotFoundError):
          os.remove(file)


def _heartbeat() -> None:
  """Refreshes the held claims' times every ``HEARTBEAT_S`` (a thread, one
  per process), so that hosts that cannot see this process know it runs."""
  if _beating and _beating[0].is_alive():
    return

  def beat():
    while True:
      time.sleep(HEARTBEAT_S)
      with _HELD_LOCK:
        files = list(_HELD)
      for file in files:
        with contextlib.suppress(OSError):
          os.utime(file)

  _beating[:] = [threading.Thread(target=beat, name="lowbw-claims",
                                  daemon=True)]
  _beating[0].start()
