"""Metric names, log writers, progress bar and checkpoints: the I/O layer."""

from lowbw.telemetry._checkpoint import latest_step
from lowbw.telemetry._checkpoint_folder import CHECKPOINTS, has_checkpoint
from lowbw.telemetry._killpoint import kill_point
from lowbw.telemetry._params import load_params
from lowbw.telemetry._startup import STARTUP_PHASES
from lowbw.telemetry._writers import WriteError, quiet_logs

__all__ = [
    "STARTUP_PHASES", "CHECKPOINTS", "load_params", "WriteError",
    "has_checkpoint", "kill_point", "latest_step",
    "quiet_logs",
]
