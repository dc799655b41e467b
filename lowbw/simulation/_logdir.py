"""The log folder of a run or a sweep, checked before anything compiles.

A folder that holds another run is refused: its TensorBoard events would
mix with the new run's (CSV and JSON files are rewritten, event files are
not). ``overwrite=True`` clears what a run writes there (and nothing else);
resuming continues the run it holds.
"""

import glob
import json
import os
import shutil
import socket
import time
import unicodedata

from lowbw import _validate, telemetry
from lowbw.telemetry import _params, _writers

# What runs and sweeps write in their folder (wandb: W&B's local, offline,
# files).
RUN_FILES = (telemetry.CHECKPOINTS, "config.json", "metrics.csv",
             "summary.json", "tensorboard", "sweep.csv", "sweep.json",
             "sweep.png", "plot.png", "wandb", "config.yaml",
             _params.PARAMS, "tokenizer.json")
_POINTS = "point_[0-9][0-9][0-9]*"


LOCK = ".lowbw.lock"


class FolderLock:
  """One writer per folder: ``OUT/.lowbw.lock``, created atomically
  (``O_EXCL``) with the owner's pid, host, start time and command, removed
  by ``release``. A lock of a process of this host that is no longer
  alive is stale: it is taken over (and said so). A live owner, or one on
  another host, is refused with a line naming it."""

  def __init__(self, log_dir: str, field: str = "out"):
    self.path = os.path.join(log_dir, LOCK)
    self.field, self.log_dir = field, log_dir
    self.held = False

  def acquire(self) -> "FolderLock":
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": " ".join(_command())}
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        owner = _owner(self.path)
        if owner is not None and not _stale(owner):
          raise _validate.fail(self.field, self.log_dir, _held_by(owner))
        if owner is None and _age_s(self.path) < 10.0:
          raise _validate.fail(self.field, self.log_dir, "is being taken by "
                               "another process just now (its lock file "
                               f"{LOCK} is being written)")
        _warn_stale(self.path, owner)
        _remove(self.path)
        continue
      except OSError as e:
        raise _validate.fail(self.field, self.log_dir, "cannot hold its "
                             f"lock file {self.path} ({e.strerror})") from None
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
      self.held = True
      return self
    raise _validate.fail(self.field, self.log_dir, "another process took "
                         "its lock file while this one removed a stale one")

  def release(self) -> None:
    if self.held:
      self.held = False
      _remove(self.path)


def _command() -> list[str]:
  import sys
  return [os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]][:8]


def _owner(path: str) -> dict | None:
  """The lock's owner, or None when its file is unreadable or empty (a
  writer that died between creating and filling it)."""
  try:
    with open(path) as f:
      owner = json.load(f)
    return owner if isinstance(owner, dict) and "pid" in owner else None
  except (OSError, ValueError):
    return None


def _stale(owner: dict) -> bool:
  """The owner is a process of this host that is gone."""
  if owner.get("host") != socket.gethostname():
    return False
  try:
    os.kill(int(owner["pid"]), 0)
  except ProcessLookupError:
    return True
  except (PermissionError, OSError, ValueError, TypeError):
    return False
  return False


def _held_by(owner: dict) -> str:
  return (f"is being written by process {owner.get('pid')} on "
          f"{owner.get('host')} (started {owner.get('started')}: "
          f"{owner.get('command')}); wait for it to end, or choose another "
          "folder (if that process is gone, delete the folder's "
          f"{LOCK})")


def _warn_stale(path: str, owner: dict | None) -> None:
  import warnings
  who = ("an unreadable lock" if owner is None else
         f"the lock of process {owner.get('pid')}, which is no longer "
         "running")
  warnings.warn(f"{path}: took over {who}", stacklevel=4)


def _age_s(path: str) -> float:
  try:
    return time.time() - os.path.getmtime(path)
  except OSError:
    return float("inf")


def _remove(path: str) -> None:
  """Removes a lock file; one already gone (or its folder replaced or
  unwritable) is nothing to release, and must not hide the error that
  ended the run."""
  try:
    os.remove(path)
  except OSError:
    pass


def held(log_dir: str) -> list[str]:
  """The names in ``log_dir`` that a run or a sweep wrote."""
  if not os.path.isdir(log_dir):
    return []
  names = [n for n in RUN_FILES if os.path.exists(os.path.join(log_dir, n))]
  return names + sorted(os.path.basename(p) for p in
                        glob.glob(os.path.join(log_dir, _POINTS)))


def prepare(log_dir: str | None, *, resuming: bool = False,
            overwrite: bool = False, create: bool = True,
            field: str = "out", lock: bool = False) -> FolderLock | None:
  """Checks ``log_dir`` (None: no logs) and creates it (``create``: the
  process that writes). ``lock``: take its ``FolderLock`` first (returned;
  the caller releases it when it stops writing), so that a second writer
  is refused before either clears or writes anything.

  Raises:
    ValueError: naming ``field``: not a folder, not writable (no
      permission, a full disk), or holding
      another run while neither resuming nor overwriting.
  """
  if log_dir is None:
    return None
  if not isinstance(log_dir, (str, os.PathLike)):
    raise _validate.fail(field, log_dir, "expected a folder path")
  text = os.fspath(log_dir)
  if not text.strip():
    raise _validate.fail(field, log_dir, "expected a folder path")
  control = [c for c in text if unicodedata.category(c) == "Cc"]
  if control:
    # A newline or tab in a folder name is almost always a pasting
    # mistake, and breaks every tool that lists the folder.
    raise _validate.fail(field, log_dir, "contains the control character "
                         f"{control[0]!r}; expected a folder path of "
                         "printable characters")
  if not isinstance(overwrite, bool):
    raise _validate.fail("overwrite", overwrite, "expected True or False")
  if os.path.exists(log_dir) and not os.path.isdir(log_dir):
    raise _validate.fail(field, log_dir, "exists and is not a folder")
  held_lock = None
  if lock and create:
    _made(log_dir, field)
    held_lock = FolderLock(log_dir, field).acquire()
  try:
    _checked(log_dir, resuming, overwrite, create, field)
  except BaseException:
    if held_lock is not None:
      held_lock.release()
    raise
  return held_lock


def _made(log_dir: str, field: str) -> None:
  try:
    os.makedirs(log_dir, exist_ok=True)
  except OSError as e:
    raise _validate.fail(field, log_dir,
                         f"cannot be created ({e.strerror})") from None


def _checked(log_dir, resuming, overwrite, create, field) -> None:
  """Refuses a folder holding another run (unless resuming or
  overwriting); clears and checks it (``create``)."""
  found = [] if resuming else held(log_dir)
  if found and not overwrite:
    raise _validate.fail(
        field, log_dir, f"holds another run ({', '.join(found[:4])}"
        f"{', ...' if len(found) > 4 else ''}); resume it, clear it "
        "(overwrite=True) or choose another folder")
  if not create:
    return
  for name in found:
    path = os.path.join(log_dir, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  _made(log_dir, field)
  try:  # a file written, not os.access: it says nothing of a full disk
    _writers.check_writable(log_dir)
  except OSError as e:
    raise _validate.fail(field, log_dir,
                         f"is not writable ({e.strerror})") from None
