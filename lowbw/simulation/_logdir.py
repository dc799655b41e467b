"""The log folder of a run or a sweep, checked before anything compiles.

A folder that holds another run is refused: its TensorBoard events would
mix with the new run's (CSV and JSON files are rewritten, event files are
not). ``overwrite=True`` clears what a run writes there (and nothing else);
resuming continues the run it holds.
"""

import glob
import os
import shutil
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


def held(log_dir: str) -> list[str]:
  """The names in ``log_dir`` that a run or a sweep wrote."""
  if not os.path.isdir(log_dir):
    return []
  names = [n for n in RUN_FILES if os.path.exists(os.path.join(log_dir, n))]
  return names + sorted(os.path.basename(p) for p in
                        glob.glob(os.path.join(log_dir, _POINTS)))


def prepare(log_dir: str | None, *, resuming: bool = False,
            overwrite: bool = False, create: bool = True,
            field: str = "out") -> None:
  """Checks ``log_dir`` (None: no logs) and creates it (``create``: the
  process that writes).

  Raises:
    ValueError: naming ``field``: not a folder, not writable (no
      permission, a full disk), or holding
      another run while neither resuming nor overwriting.
  """
  if log_dir is None:
    return
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
  try:
    os.makedirs(log_dir, exist_ok=True)
  except OSError as e:
    raise _validate.fail(field, log_dir,
                         f"cannot be created ({e.strerror})") from None
  try:  # a file written, not os.access: it says nothing of a full disk
    _writers.check_writable(log_dir)
  except OSError as e:
    raise _validate.fail(field, log_dir,
                         f"is not writable ({e.strerror})") from None
