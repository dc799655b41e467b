"""``lowbw.study``: a grid over any ``lowbw.Config`` field (the strategy, H,
W, p, a codec, learning rates, bandwidth) with seeds, one compiled program
per shape, resumable, with tidy tables and plots; ``lowbw.fit``: a law
fitted to a study's results."""

from lowbw.studies._advise import Advice, advise
from lowbw.studies._fit import Fit, fit, load_fit
from lowbw.studies._grid import expand
from lowbw.studies._result import Study, paired_interval
from lowbw.studies._run import load, study
from lowbw.studies._tune import Tuned, tune

__all__ = ["Advice", "Fit", "Study", "Tuned", "advise", "expand", "fit",
           "load", "load_fit", "paired_interval", "study", "tune"]
