"""What a run returns."""

import dataclasses
from typing import Any

import numpy as np

from lowbw.simulation._engine import SimState


@dataclasses.dataclass
class Result:
  """What a run returns.

  Attributes:
    history: metric name -> numpy array over logged rows (see DESIGN.md names);
      NaN where a metric was not measured at that row (e.g. eval_loss between
      evaluations).
    params: the global parameters (what evaluation uses).
    state: the final simulation state (every worker's parameters, optimizer
      states, strategy state, counters).
    summary: final figures (eval loss, bytes, throughput, compile time).
    config: the run's configuration as written to config.json.
    log_dir: where logs were written, or None.
  """

  history: dict[str, np.ndarray]
  params: Any
  state: SimState
  summary: dict[str, Any]
  config: dict[str, Any]
  log_dir: str | None
