"""The schedule of an asynchronous fleet: who computes, who has arrived.

An asynchronous strategy (``Strategy.asynchronous``: H, each worker's inner
steps between its pulls of the global model) runs in *ticks*: one engine
step is the time the fastest worker takes for one inner step, tau. In each
tick a worker that is computing advances by tau over its own step time (1
for the fastest, 1/4 for one 4x slower, varied by jitter) and takes an inner
step when that progress reaches a whole step; the other workers' steps are
masked (their parameters and optimizer state stay). After its H-th step
(under a time budget, DyLU: floor(H x its speed / the fastest's), at least
1) a worker sends its pseudo-gradient to the server and waits for its own
exchange (upload and download over its own link, ``exchange_s_W``). At the
end of each tick the strategy's sync runs for the workers whose exchange
has ended (``transforms.participants()``): one outer step for all the
arrivals of a tick, and they restart from the model it produced. When no
worker is computing, the clock jumps to the next arrival instead of
counting idle ticks, so a fleet of equal workers has exactly one tick per
inner step and its arrivals all land together: synchronous DiLoCo.

Without a network every worker is equally fast and exchanges take no time.
The state of the schedule (``Fleet``) is the engine's, in ``SimState``.
"""

from typing import NamedTuple

import jax.numpy as jnp

from lowbw.network import _clock
from lowbw._types import Array
from lowbw.simulation._clock_parts import (WHOLE, Carry, RoundClock,
                                           StepClock, dylu_steps,
                                           speed_ratios, unless_nobody)
from lowbw.transforms import all_workers, local_workers, where_workers


class Fleet(NamedTuple):
  """Each worker's place in the asynchronous schedule (this device's
  workers).

  Attributes:
    progress_W: float32, the fraction of its next inner step done.
    steps_W: int32, inner steps since it last pulled the global model.
    waiting_W: bool, its pseudo-gradient is on its way (it computes nothing).
    remaining_W: float32, seconds until its exchange ends (while waiting).
  """

  progress_W: Array
  steps_W: Array
  waiting_W: Array
  remaining_W: Array


def start(num_workers: int) -> Fleet:
  """Every worker computing, at the start of its first round."""
  return Fleet(jnp.zeros(num_workers, jnp.float32),
               jnp.zeros(num_workers, jnp.int32),
               jnp.zeros(num_workers, bool),
               jnp.zeros(num_workers, jnp.float32))


class Paced:
  """The tick's steps and arrivals (``net`` None: no clock, equal workers).

  A variant of its own rather than a ``_timing.Clocked``: it shares no step
  of the synchronous clock, and ``_timing.timing`` chooses it, so it cannot
  depend on that module."""

  def __init__(self, net, num_workers: int, channels, H: int,
               budgeted: bool):
    self.net, self.num_workers, self.channels = net, num_workers, channels
    self.period = H
    self.budget = H if budgeted else 0  # DyLU's H, 0: none
    # The strategy's exchange channel's per-worker seconds (with a net).
    self.exchange = None if net is None else next(
        (v for k, v in net.exchange_s_W.items() if k in channels), None)

  def begin(self, step, fleet=None):
    del step
    return Carry(jnp.ones(self.num_workers, bool),
                 jnp.zeros(self.num_workers, jnp.float32), fleet,
                 jnp.zeros(self.num_workers, bool))

  def pace(self, step) -> tuple[Array, Array, Array]:
    """(this tick's progress (W,), the speed ratios (W,) without jitter,
    each worker's exchange seconds (W,)), for all W workers."""
    ones = jnp.ones(self.num_workers, jnp.float32)
    if self.net is None:
      return ones, ones, 0.0 * ones
    net = self.net
    exchange = 0.0 * ones if self.exchange is None else self.exchange
    return (self.tick() / _clock.step_seconds(net, step), speed_ratios(net),
            exchange)

  def rounds_W(self, ratio_W: Array) -> Array:
    """Inner steps each worker takes between pulls (DyLU: scaled by its
    speed, at least 1)."""
    if not self.budget:
      return jnp.full(ratio_W.shape, self.period, jnp.int32)
    return dylu_steps(self.budget, ratio_W)

  def local(self, st, step_fn, carry, active):
    f, tau = carry.fleet, self.tick()
    rate_W, ratio_W, exchange_W = map(local_workers, self.pace(st.step))
    computing = ~f.waiting_W
    progress = f.progress_W + jnp.where(computing, rate_W, 0.0)
    stepping = computing & (progress >= 1.0 - WHOLE)
    new, report = step_fn(st)
    st = new._replace(params_W=where_workers(stepping, new.params_W,
                                             st.params_W),
                      inner_W=where_workers(stepping, new.inner_W,
                                            st.inner_W))
    steps = f.steps_W + stepping.astype(jnp.int32)
    finished = stepping & (steps >= self.rounds_W(ratio_W))
    # Exchanges in flight advance by this tick; new ones start at its end.
    remaining = jnp.where(f.waiting_W, f.remaining_W - tau, f.remaining_W)
    fleet = Fleet(jnp.where(stepping, progress - 1.0, progress), steps,
                  f.waiting_W | finished,
                  jnp.where(finished, exchange_W, remaining))
    nobody = jnp.zeros(self.num_workers, bool)
    clock = None if self.net is None else StepClock(
        tau, jnp.int32(-1), nobody, nobody, jnp.int32(self.num_workers))
    return st, report, carry._replace(fleet=fleet), clock, active

  def sync(self, st, sync_fn, carry, steps_clock, active):
    """The arrivals of the tick (or, when nobody computes, of the next
    exchange to end) as one outer step; they restart computing."""
    del steps_clock
    f = carry.fleet
    waiting_all, remaining_all = all_workers((f.waiting_W, f.remaining_W))
    idle = ~jnp.any(~waiting_all)
    jump = jnp.where(idle, jnp.maximum(jnp.min(jnp.where(
        waiting_all, remaining_all, jnp.inf)), 0.0), 0.0)
    # Exchanges end at the nearest tick's end (exactly at a jump).
    arrived_all = waiting_all & (remaining_all <= jump + 0.5 * self.tick())
    arrived = local_workers(arrived_all)
    st, report = unless_nobody(sync_fn, arrived_all, arrived, 0)(st)
    # An exchange that ended inside the tick leaves the rest of the tick to
    # compute in (at its speed without jitter): credited to the worker's next step.
    ratio_W = 1.0 if self.net is None else local_workers(
        speed_ratios(self.net))
    credit = jnp.clip((jump - f.remaining_W) / self.tick(), 0.0, 1.0) * (
        ratio_W)
    fleet = Fleet(jnp.where(arrived, credit, f.progress_W),
                  jnp.where(arrived, 0, f.steps_W), f.waiting_W & ~arrived,
                  jnp.where(f.waiting_W & ~arrived, f.remaining_W - jump, 0.0))
    n = jnp.sum(arrived_all.astype(jnp.int32))
    clock = None if self.net is None else RoundClock(
        self.tick(), jump, jnp.where(n > 0, n, -1), arrived_all)
    return st, report, clock, active, carry._replace(fleet=fleet)

  def tick(self) -> Array:
    return jnp.float32(1.0) if self.net is None else jnp.min(
        self.net.step_s_W)

  def rejoin(self, st, carry, active, global_params):
    del carry, global_params
    return st, active

