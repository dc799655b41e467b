"""The simulation engine: compiled rounds of W workers and the host loop."""

from lowbw.simulation._backward import AUTOCAST, Backward
from lowbw.simulation._engine import MESH_AXIS, map_workers
from lowbw.simulation._mesh import is_spec, strategy_specs
from lowbw.simulation._precision import cast_workers
from lowbw.simulation._config import (RunConfig, check_seed, check_settings,
                                      configure, multiple_of_period)
from lowbw.simulation._defaults import BATCH_SIZE, NUM_WORKERS, STEPS
from lowbw.simulation._shadow import CHOICES as SHADOWS
from lowbw.simulation._logdir import prepare as prepare_log_dir
from lowbw.simulation._memory import CPU_ACTIVATION_CAP, check_budget
from lowbw.simulation._engine import RoundOut, SimState, StepOut
from lowbw.simulation._divergence import DivergenceError
from lowbw.simulation._history import NonFiniteLossError
from lowbw.simulation._mesh import initialize
from lowbw.simulation._result import Result
from lowbw.simulation._run import simulate
from lowbw.simulation._simulator import Simulator, build
from lowbw.simulation._build import build_checked
from lowbw.simulation._sweep import (SweepPoint, SweepResult,
                                     default_points_per_batch, run_batch,
                                     sweep)
from lowbw.simulation._track import RunWarning

__all__ = ["AUTOCAST", "Backward", "MESH_AXIS", "cast_workers", "is_spec",
           "map_workers",
           "strategy_specs", "BATCH_SIZE", "CPU_ACTIVATION_CAP", "NUM_WORKERS",
           "STEPS", "check_budget", "check_seed", "check_settings", "configure",
           "multiple_of_period", "prepare_log_dir", "DivergenceError", "NonFiniteLossError", "Result", "RoundOut", "RunConfig", "RunWarning",
           "SimState", "SHADOWS",
           "Simulator", "StepOut", "build_checked", "SweepPoint", "SweepResult", "build",
           "default_points_per_batch", "initialize", "run_batch", "simulate",
           "sweep"]
