"""Did a run diverge? Read from its logged rows once it ends.

A loss that turns non-finite stops the run at once (``NonFiniteLossError``);
this is the slower failure: a loss that stays finite but ends far above where
it started (a learning rate too high: 1e14 after a few hundred steps), or an
accuracy that ends at or below chance. Such a run ends with numbers that look
like results, so it says so (a ``RunWarning``, the summary's ``warnings``) and,
when asked, fails (``DivergenceError``).
"""

from typing import NamedTuple

import jax
import numpy as np

from lowbw.telemetry import _metrics as names

# "Far above": the final loss exceeds the first by more than the first's
# magnitude (at least doubled) and by more than 1 nat, so a loss that drifts up
# a little at the end of training is not called diverged.
_MIN_RISE = 1.0


class Divergence(NamedTuple):
  """What diverged: one sentence, and the logged step where it turned (the
  lowest point of the metric before it rose, or fell for accuracy)."""
  text: str
  step: int


class DivergenceError(FloatingPointError):
  """A run's loss ended far above its start, or its accuracy at or below
  chance, and the run was asked to fail on it (``fail_on_divergence``).

  The run finished and its logs, summary and checkpoints are written.

  Attributes:
    step: the logged step where the metric turned.
    summary: the run's summary (as in ``summary.json``).
  """

  def __init__(self, text: str, step: int, summary: dict):
    super().__init__(f"the run diverged: {text}; its logs are kept")
    self.step, self.summary = step, summary


class NonFiniteModelError(DivergenceError):
  """A run ended with a non-finite final model, final evaluation or
  simulated time (training losses stayed finite: a last sync or a last
  step blew the model up), and the run was not asked to keep it
  (``allow_non_finite``). Its logs, summary and parameters are written."""

  def __init__(self, text: str, summary: dict):
    FloatingPointError.__init__(
        self, f"the run ended with {text}; its logs are kept (give "
        "allow_non_finite=True, --allow-non-finite, to keep such a run)")
    self.step, self.summary = None, summary


def non_finite_end(summary: dict, params, rows: list) -> str | None:
  """What of a finished run is not finite: its final model's parameters,
  its last evaluation's loss (the last of ``rows`` holding one) or its
  simulated time (None: all finite)."""
  leaves = [np.asarray(x) for x in jax.tree.leaves(params)]
  bad = sum(int(np.size(x) - np.count_nonzero(np.isfinite(x)))
            for x in leaves if np.issubdtype(x.dtype, np.inexact))
  if bad:
    total = sum(int(np.size(x)) for x in leaves)
    return (f"a non-finite final model ({bad:,} of its {total:,} parameters "
            "are NaN or infinite)")
  last_eval = next((r[names.EVAL_LOSS] for r in reversed(rows)
                    if names.EVAL_LOSS in r), None)
  for value, what in ((last_eval, "final evaluation loss"),
                      (summary.get("sim_time_s"), "simulated time")):
    if value is not None and not np.isfinite(value):
      return f"a non-finite {what} ({value})"
  return None


def _series(history: dict, name: str):
  if name not in history:
    return None, None
  values = np.asarray(history[name], np.float64)
  keep = np.isfinite(values)
  if keep.sum() < 2:
    return None, None
  return np.asarray(history[names.STEP])[keep], values[keep]


def _loss_rose(history: dict, name: str, label: str) -> Divergence | None:
  steps, values = _series(history, name)
  if steps is None:
    return None
  first, final = values[0], values[-1]
  if final - first <= max(abs(first), _MIN_RISE):
    return None
  turn = int(np.argmin(values))
  return Divergence(
      f"{label} rose from {first:.4g} at step {steps[0]} to {final:.4g} at "
      f"step {steps[-1]}; it turned at step {steps[turn]} (lowest "
      f"{values[turn]:.4g})", int(steps[turn]))


def _at_chance(history: dict, chance: float | None) -> Divergence | None:
  steps, values = _series(history, names.EVAL_ACCURACY)
  if steps is None or chance is None:
    return None
  best = int(np.argmax(values))
  # At or below chance at the end after having been clearly above it: it
  # learned, then lost what it learned (a model that never left chance in a
  # short run has not diverged).
  if values[-1] > chance or values[best] <= 1.5 * chance:
    return None
  return Divergence(
      f"eval_accuracy ended at {values[-1]:.3g}, at or below chance "
      f"({chance:.3g}), after {values[best]:.3g} at step {steps[best]}; it "
      f"turned at step {steps[best]}", int(steps[best]))


def check(history: dict, num_classes: int | None) -> Divergence | None:
  """The first sign of divergence in ``history`` (metric -> logged values):
  train loss, then eval loss, then eval accuracy against chance
  (1 / ``num_classes``); None for a run that did not diverge."""
  chance = 1.0 / num_classes if num_classes else None
  return (_loss_rose(history, names.TRAIN_LOSS, "train_loss")
          or _loss_rose(history, names.EVAL_LOSS, "eval_loss")
          or _at_chance(history, chance))
