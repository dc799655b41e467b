"""Checkpoints of the whole simulation state with orbax.

A checkpoint holds the device state (every worker's parameters and optimizer
state, the strategy's state, counters, keys) and a JSON blob of host-side
bookkeeping (logged rows, cumulative byte counters), so that resuming continues
bit-identically.

A save that cannot be written (disk full, no permission) raises a
``WriteError`` naming the checkpoint at once, keeps the checkpoints saved
before it and removes its partial copy.
"""

import asyncio
import contextlib
import gc
import glob
import os
import shutil
import sys
import threading
import time
from typing import Any

from lowbw.telemetry._checkpoint_folder import CHECKPOINTS
from lowbw.telemetry._killpoint import kill_point
from lowbw.telemetry._writers import (WriteError, check_writable, error_code,
                                      quiet_logs)

_JOIN_S = 10.0  # how long a failed save's own threads may take to stop


def _ocp():
  """orbax, imported on first use: it costs a third of a second, and most
  runs keep no checkpoint."""
  import orbax.checkpoint as ocp
  return ocp


def _manager(directory: str, max_to_keep: int | None = None):
  # Synchronous saves: a failed write raises here at once. Orbax's
  # asynchronous saver leaves its threads waiting for a step folder that was
  # never made, and the process stalls for orbax's 300 s coordination timeout
  # before it exits (each save is waited for anyway).
  ocp = _ocp()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(directory: str, step: int, state: Any, meta: dict,
         max_to_keep: int | None = None) -> None:
  """Saves ``state`` (a pytree of arrays) and ``meta`` (JSON) at ``step``.

  Raises:
    WriteError: the folder or the checkpoint cannot be written, naming it.
  """
  directory = os.path.abspath(directory)
  run_dir = _run_dir(directory)
  check_writable(directory, run_dir)
  kill_point("checkpoint")
  failed = _save(directory, step, state, meta, max_to_keep)
  kill_point("checkpoint_saved")
  if failed is not None:
    _remove_partial(directory, step)
    raise WriteError(os.path.join(directory, str(step)), failed, run_dir)


def _save(directory, step, state, meta, max_to_keep) -> OSError | None:
  """Orbax's save, with its logs quiet (it logs every failed write with a
  traceback). A failed write comes back as a plain ``OSError`` once the
  save's threads have stopped and what they left is collected; the orbax
  error itself is not kept, as its tasks would log again when freed."""
  before = set(threading.enumerate())
  with quiet_logs("asyncio"), _closed_loops_ignored():
    _late_callbacks_dropped(True)
    try:
      with _manager(directory, max_to_keep) as manager:
        manager.save(step, args=_ocp().args.Composite(
            state=_ocp().args.StandardSave(state),
            meta=_ocp().args.JsonSave(meta)))
        manager.wait_until_finished()
      _late_callbacks_dropped(False)
      return None
    except Exception as e:
      failed = _write_failure(e, directory)
      if failed is None:
        raise  # not a write that failed: a bug, with its traceback
    _join_new_threads(before)
    gc.collect()  # orbax's failed tasks log "never retrieved" when freed
  return failed


def _write_failure(error: Exception, directory: str) -> OSError | None:
  """The write failure behind a failed save, or None for a bug. Orbax
  reports a folder removed or replaced by a file mid-save in words that
  depend on which of its threads saw it first ("Event loop is closed", an
  error about its lock file, a tensorstore error), so when the error
  carries no errno the folder itself is asked: if it can no longer be
  written, that is the failure."""
  code = error_code(error)
  if isinstance(error, OSError) or code:
    return OSError(code, str(error).split("\n")[0][:200])
  try:
    check_writable(directory)
  except WriteError as e:
    return OSError(e.errno, e.strerror)
  return None


def _join_new_threads(before: set) -> None:
  """Waits (``_JOIN_S`` at most) for the threads a failed save started:
  when one write fails, orbax raises while its other writers are still
  stopping, and a writer left running keeps the process from exiting.
  Orbax's writers subclass ``Thread``; idle thread-pool workers, which never
  end, are plain ``Thread``s and are not waited for."""
  deadline = time.monotonic() + _JOIN_S
  for t in threading.enumerate():
    if t not in before and type(t) is not threading.Thread:
      # Thread.join itself: orbax's join re-raises the thread's error.
      threading.Thread.join(t, max(0.0, deadline - time.monotonic()))


_CALL_SOON_THREADSAFE = asyncio.BaseEventLoop.call_soon_threadsafe


def _dropped_when_closed(loop, callback, *args, **kwargs):
  """``call_soon_threadsafe`` that drops a callback for a closed loop
  instead of raising: such a callback would never run anyway."""
  if loop.is_closed():
    return None
  return _CALL_SOON_THREADSAFE(loop, callback, *args, **kwargs)


def _late_callbacks_dropped(on: bool) -> None:
  """While a save runs, and for good once one failed: when a write fails,
  orbax closes its event loop while tensorstore's other writes are still
  in flight; each of them ends later, in tensorstore's own threads, by
  calling ``call_soon_threadsafe`` on that closed loop, and tensorstore
  prints the resulting "Event loop is closed" with a traceback on stderr,
  dozens of them under the one error line (seen with a file-size limit,
  ``ulimit -f``). Those callbacks are dropped instead; a successful save
  puts the method back."""
  asyncio.BaseEventLoop.call_soon_threadsafe = (
      _dropped_when_closed if on else _CALL_SOON_THREADSAFE)


@contextlib.contextmanager
def _closed_loops_ignored():
  """Drops "Event loop is closed" from ``sys.unraisablehook`` for the block:
  the writes of a failed save that were still in flight report it when they
  end (the failure itself is raised); anything else goes to the hook."""
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError) and
            str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)

  sys.unraisablehook = hook
  try:
    yield
  finally:
    sys.unraisablehook = previous


def _run_dir(directory: str) -> str:
  """The folder a resumed run names: the log folder of ``log/checkpoints``
  (resuming accepts either)."""
  parent, name = os.path.split(directory)
  return parent if name == CHECKPOINTS else directory


def _remove_partial(directory: str, step: int) -> None:
  # Frees the space the failed save took; the checkpoints before it stay.
  for path in glob.glob(os.path.join(glob.escape(directory),
                                     f"{step}.orbax-checkpoint-tmp*")):
    shutil.rmtree(path, ignore_errors=True)


def latest_step(directory: str) -> int | None:
  """The step of the newest finished checkpoint in ``directory`` (a run's
  ``checkpoints`` folder), or None when there is none."""
  if not os.path.isdir(directory):
    return None
  with quiet_logs(), _manager(directory) as manager:
    return manager.latest_step()


def read_meta(directory: str, step: int | None = None) -> tuple[int, dict]:
  """The JSON part of a checkpoint alone (cheap; checks before a restore)."""
  with quiet_logs(), _manager(directory) as manager:
    step = manager.latest_step() if step is None else step
    ocp = _ocp()
    restored = manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))
  return step, restored["meta"]


def restore(directory: str, abstract_state: Any, step: int | None = None
            ) -> tuple[int, Any, dict]:
  """Restores (step, state, meta); ``abstract_state`` gives the structure."""
  with quiet_logs(), _manager(directory) as manager:
    step = manager.latest_step() if step is None else step
    ocp = _ocp()
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        meta=ocp.args.JsonRestore()))
  return step, restored["state"], restored["meta"]
