"""Metric names, log writers, progress bar and checkpoints: the I/O layer."""

from lowbw.telemetry import _metrics as names
from lowbw.telemetry._checkpoint import latest_step, read_meta, restore, save
from lowbw.telemetry._progress import ProgressBar, is_terminal
from lowbw.telemetry._writers import (CSVWriter, TensorBoardWriter,
                                     WandbWriter, import_wandb, write_json)

__all__ = [
    "CSVWriter", "ProgressBar", "TensorBoardWriter", "WandbWriter",
    "import_wandb", "is_terminal",
    "latest_step", "names", "read_meta", "restore", "save", "write_json",
]
