"""A learning-rate schedule whose peak is a state leaf, so that a compiled run
can change it (``Simulator.run(hparams=...)``, ``lowbw.sweep``)."""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
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


# The outer schedule's traced parameters and their defaults (all off), in
# outer steps: warm-up from (t + 1) / warmup of the peak, then from outer
# step decay_start a linear move to the final value over decay_steps;
# momentum_restart R > 0 zeroes the momentum buffer before outer steps R,
# 2R, ... (0: never).
OUTER_SCHEDULE = {
    "lr_warmup": 0.0, "lr_decay_start": 0.0, "lr_decay_steps": 0.0,
    "lr_final_ratio": 0.0,
    "momentum_warmup": 0.0, "momentum_decay_start": 0.0,
    "momentum_decay_steps": 0.0, "momentum_final": 0.0,
    "momentum_restart": 0.0,
}
# The parameters a build keeps as state leaves only when they are on, and
# what to build instead to sweep them (``Simulator.run(hparams=...)``).
OPTIONAL_LEAVES = {
    "momentum_restart": "it was built without outer momentum restarts, so "
                        "its state keeps no restart period; build it with "
                        "outer_momentum_restart > 0 to sweep the period",
}


class OuterScheduleState(NamedTuple):
  """State of ``outer_schedule``: outer steps taken, the peaks
  (``learning_rate``, and ``momentum`` when the optimizer has one), the
  schedule's parameters (``OUTER_SCHEDULE``) and the optimizer's state. All
  are state leaves: a compiled run can change any of them."""

  count: Array
  peaks: dict
  shape: dict
  inner_state: Any


def scheduled(t, peak, warmup, decay_start, decay_steps, final):
  """The value at outer step ``t`` (0-based): ``peak`` moving linearly to
  ``final`` from ``decay_start`` over ``decay_steps`` steps (none when 0),
  times min(1, (t + 1) / warmup) (1 when warmup is 0)."""
  t = jnp.asarray(t, jnp.float32)
  frac = jnp.where(decay_steps > 0, jnp.clip(
      (t - decay_start) / jnp.maximum(decay_steps, 1.0), 0.0, 1.0), 0.0)
  up = jnp.where(warmup > 0, jnp.minimum(1.0, (t + 1) / jnp.maximum(
      warmup, 1.0)), 1.0)
  return (peak + (final - peak) * frac) * up


def check_outer_schedule(values: dict) -> dict:
  """The schedule's parameters, validated by name (errors name
  ``outer_<name>``); missing ones off."""
  from lowbw import _validate
  unknown = set(values) - set(OUTER_SCHEDULE)
  if unknown:
    name = sorted(unknown)[0]
    raise _validate.fail("outer_" + name, values[name], "not an outer "
                         "schedule parameter; expected one of " +
                         ", ".join("outer_" + k for k in OUTER_SCHEDULE))
  out = dict(OUTER_SCHEDULE)
  for name, value in values.items():
    field = "outer_" + name
    if name in ("lr_final_ratio",):
      out[name] = _validate.fraction(field, value, low_open=False)
    elif name == "momentum_final":
      out[name] = _validate.momentum(field, value)
    elif name == "momentum_restart":
      out[name] = _validate.non_negative(field, value)
      if out[name] != int(out[name]) or out[name] >= 2 ** 24:
        raise _validate.fail(field, value, "expected a whole number of "
                             "outer steps >= 0, below 2**24 (0: never "
                             "restart)")
    else:
      out[name] = float(_validate.non_negative(field, value))
  return out


def restarted(inner_state, now):
  """``inner_state`` with its momentum buffers (optax's ``TraceState``,
  SGD's momentum) zeroed where ``now`` (a traced bool) holds, else kept as
  they are, bit for bit."""
  is_trace = lambda x: isinstance(x, optax.TraceState)  # noqa: E731

  def zero(node):
    if not is_trace(node):
      return node
    return node._replace(trace=jax.tree.map(
        lambda m: jnp.where(now, jnp.zeros_like(m), m), node.trace))

  return jax.tree.map(zero, inner_state, is_leaf=is_trace)


def _has_trace(inner_state) -> bool:
  is_trace = lambda x: isinstance(x, optax.TraceState)  # noqa: E731
  return any(map(is_trace, jax.tree.leaves(inner_state, is_leaf=is_trace)))


def outer_schedule(tx: optax.GradientTransformation, **schedule
                   ) -> optax.GradientTransformation:
  """``tx`` (an outer SGD built with ``optax.inject_hyperparams``) with its
  learning rate and momentum scheduled over outer steps.

  Pier (Fan and Zhang 2025, "Pier: Efficient Large Language Model
  pretraining with Relaxed Global Communication", arXiv 2511.17849) warms
  the outer momentum up and decays it; the same shapes serve the outer
  learning rate. Outer-momentum restarts (Topollai, Ma, Dimlioglu, Tay and
  Choromanska 2026, "Outer-Momentum Restarting in High-Dimensional
  Two-Phase Optimization", arXiv 2605.28585) zero the momentum buffer every
  R outer steps, discarding stale momentum while the model keeps what the
  inner loops made. Every parameter is a state leaf, so a study sweeps the
  warm-up length or the final momentum without recompiling; with every
  parameter off (the default) the optimizer is unchanged, bit for bit.

  Args:
    tx: the outer optimizer; its injected ``learning_rate`` (and
      ``momentum``, if it has one) become the peaks.
    **schedule: ``OUTER_SCHEDULE``'s names, in outer steps:
      ``lr_warmup``, ``lr_decay_start``, ``lr_decay_steps``,
      ``lr_final_ratio`` (the final rate as a fraction of the peak), and
      ``momentum_warmup``, ``momentum_decay_start``,
      ``momentum_decay_steps``, ``momentum_final`` (the final momentum),
      ``momentum_restart`` (R: the momentum buffer is zeroed before outer
      steps R, 2R, ...; 0, the default: never; only a build with R > 0
      has this state leaf, so a sweep of R starts from such a build).

  Example:
    >>> outer = outer_schedule(
    ...     optax.inject_hyperparams(optax.sgd)(0.7, momentum=0.9,
    ...                                         nesterov=True),
    ...     momentum_warmup=10, momentum_decay_start=40,
    ...     momentum_decay_steps=20, momentum_final=0.5)
  """
  shape = check_outer_schedule(schedule)

  def init(params):
    inner = tx.init(params)
    hyper = optax.tree_utils.tree_get(inner, "hyperparams")
    # copies (jnp.array): a donated state holds each buffer once
    peaks = {k: jnp.array(hyper[k], jnp.float32)
             for k in ("learning_rate", "momentum") if k in hyper}
    if shape["momentum_restart"] and not _has_trace(inner):
      from lowbw import _validate
      raise _validate.fail("outer_momentum_restart",
                           shape["momentum_restart"], "restarts the outer "
                           "momentum; this outer optimizer keeps none (give "
                           "it a momentum > 0)")
    # No restart leaf unless restarts are asked for: the state (and what a
    # worker returning to the fleet downloads) stays as it was without.
    return OuterScheduleState(jnp.zeros((), jnp.int32), peaks,
                              {k: jnp.array(v, jnp.float32)
                               for k, v in shape.items()
                               if v or k != "momentum_restart"}, inner)

  def update(updates, state, params=None, **extra):
    s, t = state.shape, state.count
    values = {"learning_rate": scheduled(
        t, state.peaks["learning_rate"], s["lr_warmup"], s["lr_decay_start"],
        s["lr_decay_steps"], s["lr_final_ratio"] * state.peaks[
            "learning_rate"])}
    if "momentum" in state.peaks:
      values["momentum"] = scheduled(
          t, state.peaks["momentum"], s["momentum_warmup"],
          s["momentum_decay_start"], s["momentum_decay_steps"],
          s["momentum_final"])
    inner = optax.tree_utils.tree_set(state.inner_state, **values)
    if "momentum_restart" in s:
      every = s["momentum_restart"]
      inner = restarted(inner, (every > 0) & (jnp.mod(
          t.astype(jnp.float32), jnp.maximum(every, 1.0)) == 0))
    updates, inner = optax.with_extra_args_support(tx).update(
        updates, inner, params, **extra)
    return updates, state._replace(count=state.count + 1, inner_state=inner)

  return optax.GradientTransformationExtraArgs(init, update)
