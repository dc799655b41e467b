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

A strategy with a syncer rule (``Strategy.syncer``, Decoupled DiLoCo's
quorum and grace window) holds the arrivals at the syncer until the rule
says to merge them; with ``overlap`` its workers do not wait for the merge:
they send (``Strategy.send`` keeps what they sent) and go on computing, and
only a worker that finishes another round before its last message was
merged waits, and sends again at that merge.

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
from lowbw.transforms._robust import weighting


class Fleet(NamedTuple):
  """Each worker's place in the asynchronous schedule (this device's
  workers), and the syncer's grace window.

  Attributes:
    progress_W: float32, the fraction of its next inner step done.
    steps_W: int32, inner steps of its current round.
    waiting_W: bool, it computes nothing: its round is done and its
      message is on its way or at the syncer (with ``overlap``: a message
      sent before is not merged yet).
    remaining_W: float32, seconds until its exchange ends (while sent).
    held_W: bool, its message has reached a syncer with a rule
      (``Strategy.syncer``) and waits there for the next merge.
    sent_W: bool, it has a message on its way or at the syncer.
    tokens_W: int32, the inner steps behind that message (its weight).
    since: float32, seconds since the syncer's last merge.
    window: float32, seconds left in the open grace window; inf: closed.
  """

  progress_W: Array
  steps_W: Array
  waiting_W: Array
  remaining_W: Array
  held_W: Array
  sent_W: Array
  tokens_W: Array
  since: Array
  window: Array


def start(num_workers: int) -> Fleet:
  """Every worker computing, at the start of its first round."""
  zeros = lambda dtype: jnp.zeros(num_workers, dtype)  # noqa: E731
  return Fleet(zeros(jnp.float32), zeros(jnp.int32), zeros(bool),
               zeros(jnp.float32), zeros(bool), zeros(bool),
               zeros(jnp.int32), jnp.zeros((), jnp.float32),
               jnp.full((), jnp.inf, jnp.float32))


class Paced:
  """The tick's steps and arrivals (``net`` None: no clock, equal workers).

  A variant of its own rather than a ``_timing.Clocked``: it shares no step
  of the synchronous clock, and ``_timing.timing`` chooses it, so it cannot
  depend on that module.

  ``strategy``: its ``syncer`` (the merge rule: a quorum, a grace window,
  token weights, overlap; None: every tick's arrivals merge at once),
  ``pull`` (its restart of returning workers from the server's model) and
  ``send`` (what it keeps of a worker's message when it is sent).
  ``masks``: the network has a fault model, whose windows take workers down
  and bring them back.
  """

  def __init__(self, net, num_workers: int, channels, strategy,
               masks=False):
    self.net, self.num_workers, self.channels = net, num_workers, channels
    self.period = strategy.asynchronous
    budgeted = strategy.time_budget
    self.budget = self.period if budgeted else 0  # DyLU's H, 0: none
    self.syncer, self.pull = strategy.syncer, strategy.pull
    self.send = strategy.send
    self.overlap = bool(getattr(self.syncer, "overlap", False))
    self.faults = masks and net is not None
    # The strategy's exchange channel's per-worker seconds (with a net).
    self.exchange = None if net is None else next(
        (v for k, v in net.exchange_s_W.items() if k in channels), None)

  def up(self, step) -> Array:
    """(W,) who is up at tick ``step`` (all without a fault model)."""
    if not self.faults:
      return jnp.ones(self.num_workers, bool)
    return _clock.up_mask(self.net, step)

  def begin(self, step, fleet=None):
    """Who is up this tick, and who is back from a fault window."""
    up = self.up(step)
    before = jnp.where(step >= 1, self.up(step - 1), True)
    return Carry(up, jnp.zeros(self.num_workers, jnp.float32), fleet,
                 up & ~before)

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
    f, tau = self.returning(carry), self.tick()
    rate_W, ratio_W, exchange_W = map(local_workers, self.pace(st.step))
    back = local_workers(carry.rejoined_W)
    computing = ~f.waiting_W & local_workers(carry.up_W) & ~back
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
    remaining = jnp.where(f.sent_W, f.remaining_W - tau, f.remaining_W)
    # A finished round is sent unless a message is still out (with
    # overlap the worker then goes on with a new round).
    sends = finished & ~f.sent_W
    # Without overlap a worker that sends waits for its merge.
    waits = finished & f.sent_W if self.overlap else finished
    fleet = f._replace(
        progress_W=jnp.where(stepping, progress - 1.0, progress),
        steps_W=jnp.where(sends, 0, steps) if self.overlap else steps,
        waiting_W=f.waiting_W | waits,
        remaining_W=jnp.where(sends, exchange_W, remaining),
        sent_W=f.sent_W | sends, tokens_W=jnp.where(sends, steps, f.tokens_W))
    if self.send is not None:
      st = self.send(st, sends)
    nobody = jnp.zeros(self.num_workers, bool)
    clock = None if self.net is None else StepClock(
        tau, jnp.int32(-1), nobody, carry.rejoined_W,
        jnp.sum(carry.up_W.astype(jnp.int32)), jnp.int32(0))
    return st, report, carry._replace(fleet=fleet), clock, active

  def sync(self, st, sync_fn, carry, steps_clock, active):
    """The merge of the tick's arrivals (or, when nobody computes, of the
    next event: an exchange ending, the grace window closing) as one outer
    step; its workers restart computing (with overlap, those that had
    finished another round send it)."""
    del steps_clock
    f, tau = self.dropped(carry.fleet, carry.up_W), self.tick()
    sent_all, remaining_all, held_all = all_workers(
        (f.sent_W, f.remaining_W, f.held_W))
    in_flight = sent_all & ~held_all
    idle = ~jnp.any(carry.up_W & ~all_workers(f.waiting_W))
    window = f.window if self.syncer is not None else jnp.inf
    next_event = jnp.minimum(jnp.min(jnp.where(in_flight, remaining_all,
                                               jnp.inf)), window)
    jump = jnp.where(idle & jnp.isfinite(next_event),
                     jnp.maximum(next_event, 0.0), 0.0)
    # Exchanges end at the nearest tick's end (exactly at a jump).
    arrived_all = in_flight & (remaining_all <= jump + 0.5 * tau)
    merged_all, since, window = self.merging(f, carry, held_all | arrived_all,
                                             tau + jump)
    merged = local_workers(merged_all)
    st, report = unless_nobody(self.weighed(sync_fn, f), merged_all, merged,
                               0)(st)
    fleet = self.restarted(f, merged, local_workers(arrived_all), jump)
    fleet = fleet._replace(held_W=local_workers(held_all | arrived_all)
                           & ~merged, since=since, window=window)
    if self.overlap and self.send is not None:
      st = self.send(st, merged & f.waiting_W)
    n = jnp.sum(merged_all.astype(jnp.int32))
    useful = jnp.sum(jnp.where(merged_all, all_workers(f.tokens_W), 0))
    clock = None if self.net is None else RoundClock(
        tau, jump, jnp.where(n > 0, n, -1), merged_all,
        useful.astype(jnp.int32))
    return st, report, clock, active, carry._replace(fleet=fleet)

  def restarted(self, f: Fleet, merged, arrived, jump) -> Fleet:
    """The fleet after a merge of ``merged``: they restart computing; with
    overlap only those waiting with a finished round, which they send."""
    out = jnp.where(f.sent_W & ~merged, f.remaining_W - jump, 0.0)
    if self.overlap:
      resend = merged & f.waiting_W
      exchange_W = 0.0 if self.exchange is None else local_workers(
          self.exchange)
      return f._replace(
          steps_W=jnp.where(resend, 0, f.steps_W),
          waiting_W=f.waiting_W & ~merged,
          remaining_W=jnp.where(resend, exchange_W, out),
          sent_W=(f.sent_W & ~merged) | resend,
          tokens_W=jnp.where(resend, f.steps_W, f.tokens_W))
    # An exchange that ended inside the tick leaves the rest of the tick to
    # compute in (at its speed without jitter): credited to the worker's
    # next step.
    ratio_W = 1.0 if self.net is None else local_workers(
        speed_ratios(self.net))
    credit = jnp.clip((jump - f.remaining_W) / self.tick(), 0.0, 1.0) * (
        ratio_W)
    return f._replace(
        progress_W=jnp.where(merged, jnp.where(arrived, credit, 0.0),
                             f.progress_W),
        steps_W=jnp.where(merged, 0, f.steps_W),
        waiting_W=f.waiting_W & ~merged, remaining_W=out,
        sent_W=f.sent_W & ~merged)

  def merging(self, f: Fleet, carry, held_all, elapsed):
    """(who the syncer merges now (W,), seconds since the last merge, the
    grace window left): without a syncer rule, whoever arrived."""
    if self.syncer is None:
      return held_all, f.since, f.window
    up_all = carry.up_W
    tokens_all = all_workers(f.tokens_W)
    q = self.syncer
    up = jnp.sum(up_all.astype(jnp.int32))
    # A quorum counts the learners that are up: the syncer never waits for
    # more than there are.
    count = jnp.sum(held_all.astype(jnp.int32))
    tokens = jnp.sum(jnp.where(held_all, tokens_all, 0).astype(jnp.float32))
    met = (count >= jnp.clip(q.count, 1, jnp.maximum(up, 1))) & (
        tokens >= q.tokens * self.period * up.astype(jnp.float32) - WHOLE)
    since = f.since + elapsed
    opened = jnp.isfinite(f.window)
    grace = q.grace * since if q.adaptive else q.grace
    window = jnp.where(opened, f.window - elapsed,
                       jnp.where(met, jnp.float32(grace), jnp.inf))
    everyone = jnp.all(held_all | ~up_all)
    merge = met & ((window <= 0.5 * self.tick()) | everyone)
    return (held_all & merge, jnp.where(merge, 0.0, since),
            jnp.where(merge, jnp.inf, window).astype(jnp.float32))

  def weighed(self, sync_fn, f: Fleet):
    """``sync_fn`` traced with each worker's tokens (the inner steps behind
    its message) as its weight, when the syncer weighs by tokens."""
    if self.syncer is None or not self.syncer.token_weighted:
      return sync_fn

    def weighted(state):
      with weighting(f.tokens_W.astype(jnp.float32)):
        return sync_fn(state)

    return weighted

  def returning(self, carry) -> Fleet:
    """The fleet with the workers back this tick owing their download of
    the model (``network._clock.CATCH_UP``, on their own links): it takes
    the rest of the tick (they pull at its end) and, as a deficit of
    progress, the seconds of the download."""
    f = carry.fleet
    if not self.faults:
      return f
    download_W = self.net.exchange_s_W.get(_clock.CATCH_UP)
    if download_W is None:
      return f
    owed = local_workers(download_W / self.net.step_s_W)
    return f._replace(progress_W=jnp.where(local_workers(carry.rejoined_W),
                                           -owed, f.progress_W))

  def dropped(self, f: Fleet, up_all) -> Fleet:
    """A worker that is down loses what it has not had merged: the steps
    of its round and its message, on its way or held by the syncer (which
    merges only the learners that are up); back, it pulls the model."""
    if not self.faults:
      return f
    up = local_workers(up_all)
    return f._replace(progress_W=jnp.where(up, f.progress_W, 0.0),
                      steps_W=jnp.where(up, f.steps_W, 0),
                      waiting_W=f.waiting_W & up, sent_W=f.sent_W & up,
                      held_W=f.held_W & up)

  def tick(self) -> Array:
    return jnp.float32(1.0) if self.net is None else jnp.min(
        self.net.step_s_W)

  def rejoin(self, st, carry, active, global_params):
    """Workers back from a fault window restart from the server's model
    (``Strategy.pull``)."""
    del global_params
    if not self.faults:
      return st, active
    return self.pull(st, local_workers(carry.rejoined_W)), active
