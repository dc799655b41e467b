"""Metric names, log writers, progress bar and checkpoints: the I/O layer."""

from lowbw.telemetry import _metrics as names
from lowbw.telemetry._checkpoint import latest_step, read_meta, restore, save
from lowbw.telemetry._checkpoint_folder import CHECKPOINTS, has_checkpoint
from lowbw.telemetry._killpoint import kill_point
from lowbw.telemetry._params import PARAMS, load_params, save_params
from lowbw.telemetry._progress import ProgressBar, is_terminal
from lowbw.telemetry._startup import (STARTUP_PHASES, import_s, mark_imported,
                                      process_age_s)
from lowbw.telemetry._writers import (CSVWriter, TensorBoardWriter,
                                     WandbWriter, WriteError, check_writable,
                                     import_wandb, quiet_logs, write_json,
                                     write_text)

__all__ = [
    "STARTUP_PHASES",
    "CHECKPOINTS", "CSVWriter", "PARAMS", "load_params", "save_params", "ProgressBar", "TensorBoardWriter",
    "WandbWriter", "WriteError", "check_writable", "has_checkpoint",
    "import_s", "import_wandb", "is_terminal", "kill_point", "latest_step",
    "mark_imported", "names", "process_age_s", "quiet_logs",
    "read_meta", "restore", "save", "write_json", "write_text",
]
