"""``lowbw.study``: a grid over any ``lowbw.Config`` field (the strategy, H,
W, p, a codec, learning rates, bandwidth) with seeds, one compiled program
per shape, resumable, with tidy tables and plots."""

from lowbw.studies._files import read_history
from lowbw.studies._grid import Point, expand, groups
from lowbw.studies._plots import pareto
from lowbw.studies._result import FINAL, PointResult, Study, paired_interval
from lowbw.studies._run import load, study

__all__ = ["FINAL", "Point", "PointResult", "Study", "expand", "groups", "load",
           "paired_interval", "pareto", "read_history", "study"]
