"""What every timing variant is built from: the records a round's clock
reports (``StepClock``, ``RoundClock``), what it carries through the round
(``Carry``), the workers' speed ratios and DyLU's step counts, and a
communication run only when somebody takes part.

Both the synchronous variants (``_timing``) and the asynchronous schedule
(``_pace``) use these; ``_timing`` chooses among all of them, so they live
apart from both.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowbw._types import Array
from lowbw.strategies._base import nothing_reported
from lowbw.transforms import call_participating


class StepClock(NamedTuple):
  time_s: Array            # float32: the workers waited for done (from round start)
  participants: Array      # int32: workers averaged at this step, or -1
  active_W: Array          # bool (W,): who took part in its communication
  rejoined_W: Array = None  # bool (W,): who came back (the round's first step)
  members: Array = None    # int32: the workers up this round
  useful: Array = None     # int32: worker-steps whose work this step's
  #                          communication took in (a strategy without a sync)


class RoundClock(NamedTuple):
  compute_s: Array         # float32: when the sync starts, from round start
  sync_s: Array            # float32: seconds of the sync's communication
  participants: Array      # int32: workers averaged by the sync, or -1
  active_W: Array          # bool (W,): who took part in it
  useful: Array = None     # int32: worker-steps whose work the sync took in


class Carry(NamedTuple):
  """What the clock carries through a round's steps."""

  up_W: Array              # bool (W,): up this round
  ready_W: Array           # float32 (W,): when each worker is done, from round start
  fleet: Any = None        # an asynchronous schedule's ``_pace.Fleet``
  rejoined_W: Any = None   # bool (W,): back this round, not yet reported
  steps_W: Any = None      # int32 (W,): inner steps each took this round


# A step is taken when a worker's progress is within this of a whole step
# (float32 sums of ratios such as 1/3 must not lose a step).
WHOLE = 1e-5


def speed_ratios(net) -> Array:
  """(W,) each worker's speed over the fastest's (1 for the fastest), from
  its step time without jitter."""
  return jnp.min(net.step_s_W) / net.step_s_W


def dylu_steps(H: int, ratio_W: Array) -> Array:
  """DyLU's inner steps per round (arXiv 2401.09135): floor(H x the speed
  ratio), at least 1, int32 (W,)."""
  return jnp.maximum(1, jnp.floor(H * ratio_W + WHOLE)).astype(jnp.int32)


def unless_nobody(fn, active_W: Array, active: Array, steps: int):
  """``fn(state)`` traced inside ``participating(active)`` (this device's
  slice of ``active_W``), skipped when no worker takes part (the counter
  still advances by ``steps``; no events): the global model is never lost.
  The mask is an operand of the ``cond``, set inside the branch."""

  def run(state):
    def take(state, active):
      return call_participating(active, fn, state)

    report_shape = jax.eval_shape(take, state, active)[1]

    def skip(state, active):
      del active
      return state._replace(step=state.step + steps), jax.tree.map(
          nothing_reported, report_shape)

    return jax.lax.cond(jnp.any(active_W), take, skip, state, active)

  return run
