"""The simulation engine: compiled rounds of W workers and the host loop.

It sits above ``lowbw.config``: a ``lowbw.Config`` (checked once, when it is
made) is what ``build`` and ``simulate`` take. Its names are ``lowbw``'s own
(``lowbw.simulate``, ``lowbw.build``, ``lowbw.sweep``, ``lowbw.load``, ...);
the engine's pieces stay in its modules.
"""

from lowbw.simulation._api import build, simulate
from lowbw.simulation._divergence import DivergenceError, NonFiniteModelError
from lowbw.simulation._history import NonFiniteLossError
from lowbw.simulation._load import SavedRun, load
from lowbw.simulation._mesh import initialize
from lowbw.simulation._result import Result
from lowbw.simulation._retime import retime
from lowbw.simulation._simulator import Simulator
from lowbw.simulation._sweep import SweepResult, sweep
from lowbw.simulation._track import RunWarning

__all__ = ["DivergenceError", "NonFiniteLossError", "NonFiniteModelError", "Result", "RunWarning",
           "SavedRun", "Simulator", "SweepResult", "build", "initialize",
           "load", "retime", "simulate", "sweep"]
