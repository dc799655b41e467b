"""The simulation engine: compiled rounds of W workers and the host loop."""

from lowbw.simulation._engine import RoundOut, SimState, StepOut
from lowbw.simulation._history import NonFiniteLossError
from lowbw.simulation._mesh import initialize
from lowbw.simulation._run import Result, simulate

__all__ = ["NonFiniteLossError", "Result", "RoundOut", "SimState", "StepOut",
           "initialize", "simulate"]
