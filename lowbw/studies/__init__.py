"""``lowbw.study``: a grid over any ``lowbw.Config`` field (the strategy, H,
W, p, a codec, learning rates, bandwidth) with seeds, one compiled program
per shape, resumable, with tidy tables and plots."""

from lowbw.studies._grid import expand
from lowbw.studies._result import Study, paired_interval
from lowbw.studies._run import load, study

__all__ = ["Study", "expand", "load", "paired_interval", "study"]
