"""The simulation engine: compiled rounds of W workers and the host loop.

It sits above ``lowbw.config``: a ``lowbw.Config`` (checked once, when it is
made) is what ``build`` and ``simulate`` take, and ``RunConfig`` (the build
settings a compiled simulator is specialised to) comes from there.
"""

from lowbw.config._settings import (RunConfig, check_settings, configure,
                                    multiple_of_period)
from lowbw.simulation._api import (build, build_config, run_config, simulate,
                                   yaml_or_none)
from lowbw.simulation._backward import Backward
from lowbw.simulation._backward import of as backward_of
from lowbw.simulation._divergence import DivergenceError
from lowbw.simulation._engine import (MESH_AXIS, RoundOut, SimState, StepOut,
                                      map_workers)
from lowbw.simulation._history import NonFiniteLossError
from lowbw.simulation._load import SavedRun, load
from lowbw.simulation._logdir import prepare as prepare_log_dir
from lowbw.simulation._mesh import initialize, is_spec, strategy_specs
from lowbw.simulation._precision import cast_workers
from lowbw.simulation._result import Result
from lowbw.simulation._simulator import Simulator
from lowbw.simulation._sweep import (SweepPoint, SweepResult,
                                     default_points_per_batch, run_batch,
                                     sweep)
from lowbw.simulation._track import RunWarning

__all__ = ["Backward", "MESH_AXIS", "backward_of", "cast_workers", "is_spec",
           "map_workers", "strategy_specs", "check_settings", "configure",
           "multiple_of_period", "prepare_log_dir", "DivergenceError",
           "NonFiniteLossError", "Result", "RoundOut", "RunConfig",
           "RunWarning", "SavedRun", "SimState", "Simulator", "StepOut",
           "SweepPoint", "SweepResult", "build", "build_config",
           "default_points_per_batch", "initialize", "load", "run_batch",
           "run_config", "simulate", "sweep", "yaml_or_none"]
