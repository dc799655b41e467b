"""Writers for logged rows: CSV, TensorBoard, Weights & Biases and JSON
files.

Rows are written as they arrive, straight to the operating system, so a run
that fails keeps what it logged so far. A file that cannot be written (disk
full, no permission) raises a ``WriteError`` naming it and saying what to do;
the file keeps its whole rows (a row cut short is removed).
"""

import contextlib
import csv
import errno
import io
import json
import logging
import math
import os
import re
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

from lowbw.telemetry._checkpoint_folder import has_checkpoint
from lowbw.telemetry._killpoint import kill_point

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


class WriteError(OSError):
  """A log, table or checkpoint file could not be written.

  ``filename`` is the file, ``errno``/``strerror`` the cause (disk full, no
  permission), and the message says what to do: resume the run once the
  cause is fixed when its folder holds a checkpoint, else run it again.
  """

  def __init__(self, path: str, error: BaseException,
               run_dir: str | None = None):
    code = error_code(error)
    reason = (error.strerror if isinstance(error, _Gone) else
              os.strerror(code) if code else
              (str(error).splitlines() or [type(error).__name__])[0])
    super().__init__(code, reason, path)
    self.hint = _hint(code, run_dir or os.path.dirname(path) or ".")

  def __str__(self):
    code = f" (errno {self.errno})" if self.errno else ""
    return f"cannot write {self.filename}: {self.strerror}{code}; {self.hint}"

  def __reduce__(self):  # pickles (multiprocessing) as its message
    return OSError, (self.errno, str(self), self.filename)


class _Gone(FileNotFoundError):
  """A log file deleted or replaced while a run wrote it (its own words)."""


def error_code(error: BaseException) -> int | None:
  """The errno of a failed write: an ``OSError``'s own, or the one that
  tensorstore (orbax's array writer) names in its message."""
  if isinstance(error, OSError) and error.errno:
    return error.errno
  match = re.search(r"os_error_code='?(\d+)", str(error))
  return int(match.group(1)) if match else None


def _hint(code: int | None, run_dir: str) -> str:
  if code == errno.EFBIG:
    # Over the process's file-size limit (``ulimit -f``), or the largest
    # file of its file system: freeing space would not help.
    fix = ("raise the file-size limit (ulimit -f) or write to a file "
           "system that holds larger files")
  elif code in _NO_SPACE:
    fix = "free space"
  elif code in _NO_PERMISSION:
    fix = f"make {run_dir} writable"
  else:
    fix = "fix the cause"
  study = _study_of(run_dir)
  if study is not None:  # a point's logs or the study's tables
    return (f"{fix} and run the study again with the same out ({study}): "
            "its finished points resume")
  # In API words; the command line names these settings by their flags.
  if has_checkpoint(run_dir):
    return f"{fix} and resume with resume_from={run_dir!r}"
  if not os.path.exists(os.path.join(run_dir, "config.json")):
    return fix  # not a run's folder (a plot, a table, a bench's JSON)
  return (f"{fix} and run again with overwrite=True (it replaces what "
          f"{run_dir} holds)")


def _study_of(folder: str) -> str | None:
  """The study folder that ``folder`` is (its ``study.json``) or a point
  of (``points/NNNN``), else None."""
  parent = os.path.dirname(os.path.abspath(folder))
  for candidate in (folder, os.path.dirname(parent)):
    if os.path.exists(os.path.join(candidate, "study.json")) and (
        candidate == folder or os.path.basename(parent) == "points"):
      return candidate
  return None


def check_writable(folder: str, run_dir: str | None = None) -> None:
  """Creates ``folder`` and writes (then removes) a small file in it, so a
  full disk or a missing permission shows before a save rather than in the
  middle of one (``os.access`` says yes to root on any folder).

  Raises:
    WriteError: naming ``folder``.
  """
  probe = os.path.join(folder, f".lowbw-write-test-{os.getpid()}")
  try:
    os.makedirs(folder, exist_ok=True)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
      os.write(fd, b"lowbw\n")
    finally:
      os.close(fd)
      os.remove(probe)
  except OSError as e:
    if isinstance(e, FileExistsError) or (
        os.path.exists(folder) and not os.path.isdir(folder)):
      # A file where the folder should be (replaced while the run wrote):
      # "Not a directory" says so; makedirs' "File exists" reads as a clash.
      e = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                             folder)
    raise WriteError(folder, e, run_dir or folder) from e


# Loggers of libraries lowbw calls, and the level below which each is quiet
# during a run: orbax (through absl) logs every failed save as errors with
# tracebacks, which lowbw raises as one error of its own.
_QUIET = {"absl": logging.CRITICAL, "orbax": logging.CRITICAL,
          "tensorboardX": logging.CRITICAL, "jax": logging.ERROR}


@contextlib.contextmanager
def quiet_logs(*more: str):
  """Within the block, third-party loggers (absl and orbax, tensorboardX,
  jax, and the loggers named in ``more``) print nothing below their level in
  ``_QUIET`` (``more``: nothing below CRITICAL): what went wrong reaches the
  caller as an exception, once. Their levels are restored after."""
  quiet = {**_QUIET, **dict.fromkeys(more, logging.CRITICAL)}
  loggers = {name: logging.getLogger(name) for name in quiet}
  before = {name: lg.level for name, lg in loggers.items()}
  for name, lg in loggers.items():
    lg.setLevel(max(quiet[name], lg.getEffectiveLevel()))
  try:
    yield
  finally:
    for name, lg in loggers.items():
      lg.setLevel(before[name])


class _File:
  """A file written with ``os.write``, unbuffered: every ``write`` is on
  disk when it returns, or raises a ``WriteError`` and cuts the file back to
  its size before that write (whole records only). A file deleted or
  replaced while it is written (its path no longer names the file the
  writer holds) is a ``WriteError`` at the next write, not a silent loss."""

  def __init__(self, path: str, run_dir: str, name: str | None = None,
               exclusive: bool = False):
    self.name, self._run_dir, self._path = name or path, run_dir, path
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive
                                         else os.O_TRUNC)
    self._size, self._failed = 0, False
    try:
      self._fd = os.open(path, flags, 0o666)
      self._id = _identity(os.fstat(self._fd))
    except FileExistsError:  # exclusive: the caller picks another name
      raise
    except OSError as e:
      raise WriteError(self.name, e, run_dir) from e

  def _check_still_there(self) -> None:
    try:
      now = _identity(os.stat(self._path))
    except OSError:
      now = None
    if now != self._id:
      self._failed = True
      raise WriteError(self.name, _Gone(
          errno.ENOENT, "it was deleted or replaced while the run wrote "
          "it; what it held since is lost", self._path), self._run_dir)

  def write(self, data: bytes) -> None:
    self._check_still_there()
    view = memoryview(data)
    try:
      while view:
        view = view[os.write(self._fd, view):]
    except OSError as e:
      self._failed = True
      self._cut()
      raise WriteError(self.name, e, self._run_dir) from e
    self._size += len(data)

  def _cut(self) -> None:
    # Best effort: the write error that follows is what matters, and a
    # truncation frees space rather than needing it.
    with contextlib.suppress(OSError):
      os.ftruncate(self._fd, self._size)
      os.lseek(self._fd, self._size, os.SEEK_SET)

  def close(self) -> None:
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      os.close(fd)
    except OSError as e:
      if not self._failed:  # after a failed write, that error is raised
        raise WriteError(self.name, e, self._run_dir) from e


def _identity(stat) -> tuple:
  return stat.st_dev, stat.st_ino


@contextlib.contextmanager
def _closed_on_error(file: _File):
  """Closes ``file`` if the block raises (a writer that fails while it is
  made is never returned, so never closed)."""
  try:
    yield
  except BaseException:
    file.close()
    raise


class CSVWriter:
  """``metrics.csv``: one row per logged step; missing values are empty."""

  def __init__(self, path: str, columns: Sequence[str],
               run_dir: str | None = None):
    """``run_dir``: the folder a failed write tells to resume (default: the
    file's)."""
    self.columns = list(columns)
    self._file = _File(path, run_dir or os.path.dirname(path) or ".")
    with _closed_on_error(self._file):
      self._write(self.columns)

  def write(self, row: dict[str, Any]) -> None:
    self._write([_cell(row.get(c)) for c in self.columns])

  def _write(self, cells) -> None:
    line = io.StringIO()
    csv.writer(line, lineterminator="\n").writerow(cells)
    self._file.write(line.getvalue().encode("utf-8"))

  def close(self) -> None:
    self._file.close()


def _cell(value):
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return ""
  return repr(value) if isinstance(value, float) else value


class TensorBoardWriter:
  """TensorBoard event files: one scalar per metric and row.

  Written here, in the calling thread, rather than by tensorboardX's
  ``SummaryWriter``, whose background thread reports a full disk on stderr
  (and at exit) instead of to the run; tensorboardX still provides the
  event protocol buffers and the record checksum.
  """

  def __init__(self, log_dir: str, purge_step: int | None = None,
               run_dir: str | None = None):
    """``purge_step``: on resume, events at or after it from the interrupted
    run are discarded, so TensorBoard shows one curve (at 0, the resumed run
    writes every row again and the older event files are removed). ``run_dir``: the
    folder a failed write tells to resume (default: ``log_dir``'s parent)."""
    # imported lazily: slow to import
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.record_writer import masked_crc32c
    from tensorboardX.summary import scalar
    self._event, self._scalar, self._crc = Event, scalar, masked_crc32c
    run_dir = run_dir or os.path.dirname(os.path.normpath(log_dir)) or "."
    try:
      os.makedirs(log_dir, exist_ok=True)
    except OSError as e:
      raise WriteError(log_dir, e, run_dir) from e
    self._file = _event_file(log_dir, run_dir)
    first = [Event(wall_time=time.time(), file_version="brain.Event:2")]
    if purge_step is not None:  # as tensorboardX's purge_step writes it
      first += [Event(wall_time=time.time(), step=purge_step,
                      file_version="brain.Event:2"),
                Event(wall_time=time.time(), step=purge_step,
                      session_log=SessionLog(status=SessionLog.START))]
    with _closed_on_error(self._file):
      self._file.write(b"".join(map(self._record, first)))
    if purge_step == 0:
      _remove_other_events(log_dir, self._file.name)

  def write(self, row: dict[str, Any]) -> None:
    step, now = int(row["step"]), time.time()
    events = [self._event(wall_time=now, step=step,
                          summary=self._scalar(name, float(value)))
              for name, value in row.items()
              if name != "step" and value is not None and not _is_nan(value)]
    self._file.write(b"".join(map(self._record, events)))

  def _record(self, event) -> bytes:
    """One TFRecord: length, its checksum, the event, its checksum."""
    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", self._crc(header)) + data +
            struct.pack("<I", self._crc(data)))

  def close(self) -> None:
    self._file.close()


def _remove_other_events(log_dir: str, keep: str) -> None:
  """Removes the event files of interrupted runs: TensorBoard discards all
  their events once it reads this file's purge at step 0 (a resumed run
  writes every row again), so only the disk space and a second copy of
  each scalar for other readers would remain. Best effort: a file left
  behind is still purged."""
  for name in os.listdir(log_dir):
    path = os.path.join(log_dir, name)
    if name.startswith("events.out.tfevents.") and path != keep:
      with contextlib.suppress(OSError):
        os.remove(path)


def _event_file(log_dir: str, run_dir: str) -> _File:
  """A new event file, named as TensorBoard expects
  (``events.out.tfevents.<seconds>.<host>``), never one already there."""
  base = os.path.join(log_dir, f"events.out.tfevents.{int(time.time())}."
                      f"{socket.gethostname()}")
  for n in range(1000):
    try:
      return _File(base + (f".{n}" if n else ""), run_dir, exclusive=True)
    except FileExistsError:
      continue
  raise WriteError(base, FileExistsError(errno.EEXIST, "exists"), run_dir)


class WandbWriter:
  """Weights & Biases, opt-in (``pip install 'lowbw[wandb]'``): the same
  metrics as the CSV and TensorBoard, each row at its step, and the run's
  configuration. ``WANDB_MODE=offline`` logs to ``dir`` with no network
  (``wandb sync`` uploads it later)."""

  def __init__(self, project: str, config: dict, name: str | None = None,
               directory: str | None = None):
    wandb = import_wandb("wandb_project", project)
    self._run = wandb.init(project=project, name=name, dir=directory,
                           config=config)

  def write(self, row: dict[str, Any]) -> None:
    values = {name: float(value) for name, value in row.items()
              if name != "step" and value is not None and not _is_nan(value)}
    self._run.log(values, step=int(row["step"]))

  def close(self) -> None:
    self._run.finish()


def import_wandb(field: str, value):
  """The ``wandb`` module, or a ValueError naming ``field`` that says how to
  install it (checked before a run compiles)."""
  try:
    import wandb
  except ImportError:
    from lowbw import _validate
    raise _validate.fail(field, value, "needs the wandb package: pip "
                         "install 'lowbw[wandb]' (or pip install wandb)"
                         ) from None
  return wandb


def _is_nan(value):
  return isinstance(value, float) and math.isnan(value)


def write_json(path: str, obj: Any, run_dir: str | None = None) -> None:
  """Writes ``obj`` as indented JSON, atomically (no half-written file).

  Raises:
    WriteError: naming ``path`` (``run_dir``: the folder to resume, default
      the file's).
  """
  write_text(path, json.dumps(obj, indent=2, sort_keys=True,
                              default=_jsonable) + "\n", run_dir)


def write_text(path: str, text: str, run_dir: str | None = None) -> None:
  """Writes ``text`` atomically; errors as ``write_json``'s."""
  write_bytes(path, text.encode("utf-8"), run_dir)


def write_csv(path: str, columns: Sequence[str],
              rows: Sequence[dict[str, Any]],
              run_dir: str | None = None) -> None:
  """Writes a whole table (cells as ``CSVWriter`` writes them) atomically:
  a process killed meanwhile leaves the previous table or none, never a
  table cut short. Errors as ``write_json``'s."""
  text = io.StringIO()
  writer = csv.writer(text, lineterminator="\n")
  writer.writerow(columns)
  for row in rows:
    writer.writerow([_cell(row.get(c)) for c in columns])
  write_text(path, text.getvalue(), run_dir)


def write_bytes(path: str, data: bytes, run_dir: str | None = None) -> None:
  """Writes ``data`` to a temporary file next to ``path`` and renames it
  over ``path``; errors as ``write_json``'s. The temporary file is this
  process's own: two processes writing one table (two ``lowbw sweep`` of
  one study) would otherwise write into one temporary file, and the
  second rename would find it gone."""
  run_dir = run_dir or os.path.dirname(path) or "."
  tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
  try:
    f = _File(tmp, run_dir, name=path)
    try:
      f.write(data)
    finally:
      f.close()
    kill_point("replace")
    os.replace(tmp, path)
  except OSError as e:
    with contextlib.suppress(OSError):  # the partial copy, not the file
      os.remove(tmp)
    if isinstance(e, WriteError):
      raise
    raise WriteError(path, e, run_dir) from e


def _jsonable(value):
  if hasattr(value, "tolist"):
    return value.tolist()
  return repr(value)
