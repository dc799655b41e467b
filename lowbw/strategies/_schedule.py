"""A learning-rate schedule whose peak is a state leaf, so that a compiled run
can change it (``Simulator.run(hparams=...)``, ``lowbw.sweep``)."""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax

from lowbw._types import Array


class PeakScheduleState(NamedTuple):
  """State of ``peak_schedule``: its own step count, the peak learning rate
  and the wrapped optimizer's state."""

  count: Array
  peak_lr: Array
  inner_state: Any


def peak_schedule(tx: optax.GradientTransformation,
                  schedule: Callable[[Array], Array],
                  peak_lr: float) -> optax.GradientTransformation:
  """``tx`` with learning rate ``peak_lr * schedule(step)``.

  optax schedules close over their peak, a constant of the compiled program;
  here the peak is a state leaf, so sweeping it does not recompile.

  Args:
    tx: an optimizer built with ``optax.inject_hyperparams`` whose
      ``learning_rate`` is a number (set at every step from the schedule).
    schedule: the schedule's shape with peak 1, e.g.
      ``optax.warmup_cosine_decay_schedule(0.0, 1.0, 100, 1000)``.
    peak_lr: the peak learning rate.

  Example:
    >>> inner = peak_schedule(
    ...     optax.inject_hyperparams(optax.adamw)(learning_rate=0.0),
    ...     optax.warmup_cosine_decay_schedule(0.0, 1.0, 100, 1000), 1e-3)
  """

  def init(params):
    return PeakScheduleState(jnp.zeros((), jnp.int32),
                             jnp.asarray(peak_lr, jnp.float32), tx.init(params))

  def update(updates, state, params=None):
    lr = state.peak_lr * schedule(state.count)
    inner = optax.tree_utils.tree_set(state.inner_state, learning_rate=lr)
    updates, inner = tx.update(updates, inner, params)
    return updates, PeakScheduleState(state.count + 1, state.peak_lr, inner)

  return optax.GradientTransformation(init, update)
