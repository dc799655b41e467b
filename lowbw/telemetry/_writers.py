"""Writers for logged rows: CSV, TensorBoard, Weights & Biases and JSON
files.

Rows are written as they arrive and flushed, so a run that fails keeps what it
logged so far.
"""

import csv
import json
import math
import os
from collections.abc import Sequence
from typing import Any


class CSVWriter:
  """``metrics.csv``: one row per logged step; missing values are empty."""

  def __init__(self, path: str, columns: Sequence[str]):
    self.columns = list(columns)
    self._file = open(path, "w", newline="")
    self._csv = csv.writer(self._file, lineterminator="\n")
    self._csv.writerow(self.columns)
    self._file.flush()

  def write(self, row: dict[str, Any]) -> None:
    self._csv.writerow([_cell(row.get(c)) for c in self.columns])
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def _cell(value):
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return ""
  return repr(value) if isinstance(value, float) else value


class TensorBoardWriter:
  """TensorBoard event files (tensorboardX): one scalar per metric and row."""

  def __init__(self, log_dir: str, purge_step: int | None = None):
    """``purge_step``: on resume, events at or after it from the interrupted
    run are discarded, so TensorBoard shows one curve."""
    from tensorboardX import SummaryWriter  # imported lazily: slow to import
    self._writer = SummaryWriter(log_dir, purge_step=purge_step)

  def write(self, row: dict[str, Any]) -> None:
    step = int(row["step"])
    for name, value in row.items():
      if name != "step" and value is not None and not _is_nan(value):
        self._writer.add_scalar(name, float(value), step)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


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


def write_json(path: str, obj: Any) -> None:
  """Writes ``obj`` as indented JSON, atomically (no half-written file)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=_jsonable)
    f.write("\n")
  os.replace(tmp, path)


def _jsonable(value):
  if hasattr(value, "tolist"):
    return value.tolist()
  return repr(value)
