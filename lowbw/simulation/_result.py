"""What a run returns."""

import dataclasses
from typing import Any

import numpy as np

from lowbw.simulation._engine import SimState
from lowbw.telemetry import _metrics as names


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

  def evals(self) -> dict[str, np.ndarray]:
    """The rows with an evaluation, and only the columns that have one there:
    ``step``, ``examples``, the ``eval_*`` metrics, bytes and ``sim_time_s``.

    ``history["eval_loss"]`` is NaN between evaluations, so plotting it
    against ``history["step"]`` draws nothing; plot these instead.

    Example:
      >>> e = result.evals()                      # doctest: +SKIP
      >>> plt.plot(e["step"], e["eval_loss"])     # doctest: +SKIP
    """
    return _rows_with(self.history, names.EVAL_LOSS)

  def to_pandas(self):
    """``history`` as a ``pandas.DataFrame`` indexed by step (pandas is
    optional: ``pip install pandas``)."""
    try:
      import pandas as pd
    except ModuleNotFoundError:
      raise ModuleNotFoundError(
          "Result.to_pandas needs pandas (pip install pandas); "
          "Result.history is the same table as a dict of numpy arrays"
          ) from None
    return pd.DataFrame(self.history).set_index(names.STEP)

  def __repr__(self) -> str:
    """A short description: a notebook shows this, not every array."""
    s, c = self.summary, self.config

    def num(key, fmt="{:.4g}"):
      value = s.get(key)
      return "None" if value is None else fmt.format(value)

    return (f"Result(strategy={c.get('strategy', {}).get('name')!r}, "
            f"num_workers={s.get('num_workers')}, steps={s.get('steps')}, "
            f"final_train_loss={num('final_train_loss')}, "
            f"final_eval_loss={num('final_eval_loss')}, "
            f"wire_bytes={num('wire_bytes', '{:.4g}')}, "
            f"sim_time_s={num('sim_time_s')}, log_dir={self.log_dir!r}, "
            f"warnings={len(s.get('warnings', []))})")


def _rows_with(history: dict[str, np.ndarray], column: str
               ) -> dict[str, np.ndarray]:
  """The rows where ``column`` is measured, and the columns measured at
  every one of them."""
  if column not in history:
    return {}
  keep = ~np.isnan(np.asarray(history[column], np.float64))
  out = {}
  for name, values in history.items():
    values = np.asarray(values)[keep]
    if values.dtype.kind != "f" or not np.isnan(values).any():
      out[name] = values
  return out
