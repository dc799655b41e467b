"""``lowbw.study``: a grid over any ``lowbw.Config`` field (the strategy, H,
W, p, a codec, learning rates, bandwidth) with seeds, one compiled program
per shape, resumable, with tidy tables and plots."""

from lowbw.study._files import read_history
from lowbw.study._grid import Point, expand, groups
from lowbw.study._plots import pareto
from lowbw.study._result import FINAL, PointResult, Study
from lowbw.study._run import study

__all__ = ["FINAL", "Point", "PointResult", "Study", "expand", "groups",
           "pareto", "read_history", "study"]
