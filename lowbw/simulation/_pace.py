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
merged waits, and sends again at that merge. A rule with P ``fragments``
gives every message a fragment: a worker sends fragment p when its round
reaches step (p+1) x H / P, and each fragment is held, windowed and merged
on its own, at most one fragment's merge per tick (the lowest ready; the
others merge in the ticks after), traced with ``fragment(p)`` set.

Without a network every worker is equally fast and exchanges take no time.
The state of the schedule (``Fleet``) is the engine's, in ``SimState``.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lowbw.network import _clock
from lowbw._types import Array
from lowbw.simulation._clock_parts import (WHOLE, Carry, RoundClock,
                                           StepClock, dylu_steps,
                                           speed_ratios, unless_nobody)
from lowbw.transforms import all_workers, local_workers, where_workers
from lowbw.transforms._reductions import fragment
from lowbw.transforms._robust import weighting


class Fleet(NamedTuple):
  """Each worker's place in the asynchronous schedule (this device's
  workers), and the syncer's grace windows. A message is one of the
  syncer rule's P fragments (1 without fragments): the (W, P) fields.

  Attributes:
    progress_W: float32 (W,), the fraction of its next inner step done.
    steps_W: int32 (W, P), inner steps since it last sent fragment p (the
      last fragment's: steps into its current round).
    waiting_W: bool (W, P), its round reached fragment p's send while the
      fragment's last message is not merged yet (with ``overlap``), or
      its round is done and its message is on its way or at the syncer
      (without): it computes nothing while any is set.
    remaining_W: float32 (W, P), seconds until its exchange ends (while
      sent).
    held_W: bool (W, P), its message has reached a syncer with a rule
      (``Strategy.syncer``) and waits there for the next merge.
    sent_W: bool (W, P), it has a message on its way or at the syncer.
    tokens_W: int32 (W, P), the inner steps behind that message (its
      weight).
    since: float32 (P,), seconds since the syncer's last merge.
    window: float32 (P,), seconds left in the open grace window; inf:
      closed.
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


def fragments_of(strategy) -> int:
  """The messages' fragments: its syncer rule's, else 1."""
  return int(getattr(strategy.syncer, "fragments", 1))


def start(num_workers: int, fragments: int = 1) -> Fleet:
  """Every worker computing, at the start of its first round."""
  zeros = lambda dtype: jnp.zeros((num_workers, fragments),  # noqa: E731
                                  dtype)
  return Fleet(jnp.zeros(num_workers, jnp.float32), zeros(jnp.int32),
               zeros(bool), zeros(jnp.float32), zeros(bool), zeros(bool),
               zeros(jnp.int32), jnp.zeros(fragments, jnp.float32),
               jnp.full(fragments, jnp.inf, jnp.float32))


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
    self.P = fragments_of(strategy)
    self.faults = masks and net is not None
    # Each worker's seconds per exchange of each fragment's channel (W, P)
    # (with a net; in the strategy's channels' order).
    seconds = [] if net is None else [net.exchange_s_W[k] for k in channels
                                      if k in net.exchange_s_W]
    self.exchange = jnp.stack(seconds, axis=1) if seconds else None

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
    each worker's exchange seconds (W, P)), for all W workers."""
    ones = jnp.ones(self.num_workers, jnp.float32)
    none = jnp.zeros((self.num_workers, self.P), jnp.float32)
    if self.net is None:
      return ones, ones, none
    net = self.net
    exchange = none if self.exchange is None else self.exchange
    return (self.tick() / _clock.step_seconds(net, step), speed_ratios(net),
            exchange)

  def rounds_W(self, ratio_W: Array) -> Array:
    """Inner steps each worker takes between pulls (DyLU: scaled by its
    speed, at least 1)."""
    if not self.budget:
      return jnp.full(ratio_W.shape, self.period, jnp.int32)
    return dylu_steps(self.budget, ratio_W)

  def due(self, position_W, ratio_W) -> Array:
    """(W, P) whose round, ``position_W`` steps in, reaches the send of
    fragment p: at step max(1, floor((p+1) x H_w / P)) of its H_w; the
    last fragment's send ends the round (also past it, when a speed trace
    shortened a DyLU round)."""
    rounds = self.rounds_W(ratio_W)[:, None]
    p = jnp.arange(1, self.P + 1)[None, :]
    at = jnp.maximum((p * rounds) // self.P, 1)
    return (position_W[:, None] == at) | ((p == self.P) &
                                          (position_W[:, None] >= rounds))

  def local(self, st, step_fn, carry, active):
    f, tau = self.returning(carry), self.tick()
    rate_W, ratio_W, exchange_W = map(local_workers, self.pace(st.step))
    back = local_workers(carry.rejoined_W)
    computing = (~jnp.any(f.waiting_W, axis=1) & local_workers(carry.up_W)
                 & ~back)
    progress = f.progress_W + jnp.where(computing, rate_W, 0.0)
    stepping = computing & (progress >= 1.0 - WHOLE)
    new, report = step_fn(st)
    st = new._replace(params_W=where_workers(stepping, new.params_W,
                                             st.params_W),
                      inner_W=where_workers(stepping, new.inner_W,
                                            st.inner_W))
    steps = f.steps_W + stepping[:, None].astype(jnp.int32)
    finished = stepping[:, None] & self.due(steps[:, -1], ratio_W)
    # Exchanges in flight advance by this tick; new ones start at its end.
    remaining = jnp.where(f.sent_W, f.remaining_W - tau, f.remaining_W)
    # A finished round (fragment) is sent unless its last message is still
    # out (with overlap the worker then goes on with a new round).
    sends = finished & ~f.sent_W
    # Without overlap a worker that sends waits for its merge.
    waits = finished & f.sent_W if self.overlap else finished
    fleet = f._replace(
        progress_W=jnp.where(stepping, progress - 1.0, progress),
        steps_W=jnp.where(sends, 0, steps) if self.overlap else steps,
        waiting_W=f.waiting_W | waits,
        remaining_W=jnp.where(sends, exchange_W, remaining),
        sent_W=f.sent_W | sends, tokens_W=jnp.where(sends, steps, f.tokens_W))
    st = self.sent(st, sends)
    nobody = jnp.zeros(self.num_workers, bool)
    clock = None if self.net is None else StepClock(
        tau, jnp.int32(-1), nobody, carry.rejoined_W,
        jnp.sum(carry.up_W.astype(jnp.int32)), jnp.int32(0))
    return st, report, carry._replace(fleet=fleet), clock, active

  def sent(self, st, sends):
    """``Strategy.send`` for the (W, P) messages sent: per fragment."""
    if self.send is None:
      return st
    if self.P == 1:
      return self.send(st, sends[:, 0])
    for p in range(self.P):
      with fragment(p):
        st = self.send(st, sends[:, p])
    return st

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
    waiting = jnp.any(all_workers(f.waiting_W), axis=1)
    idle = ~jnp.any(carry.up_W & ~waiting)
    window = f.window if self.syncer is not None else jnp.inf
    next_event = jnp.minimum(jnp.min(jnp.where(in_flight, remaining_all,
                                               jnp.inf)), jnp.min(window))
    jump = jnp.where(idle & jnp.isfinite(next_event),
                     jnp.maximum(next_event, 0.0), 0.0)
    # Exchanges end at the nearest tick's end (exactly at a jump).
    arrived_all = in_flight & (remaining_all <= jump + 0.5 * tau)
    merged_all, since, window, p = self.merging(
        f, carry, held_all | arrived_all, tau + jump)
    merged = local_workers(merged_all)
    st, report = unless_nobody(self.weighed(sync_fn, f, p), merged_all[:, p],
                               merged[:, p], 0)(st)
    fleet = self.restarted(f, merged, local_workers(arrived_all), jump)
    fleet = fleet._replace(held_W=local_workers(held_all | arrived_all)
                           & ~merged, since=since, window=window)
    if self.overlap:
      st = self.sent(st, merged & f.waiting_W)
    n = jnp.sum(merged_all[:, p].astype(jnp.int32))
    # Each fragment's merge takes in 1/P of its learners' steps' work.
    useful = jnp.sum(jnp.where(merged_all, all_workers(f.tokens_W), 0))
    clock = None if self.net is None else RoundClock(
        tau, jump, jnp.where(n > 0, n, -1), merged_all[:, p],
        useful.astype(jnp.int32) if self.P == 1 else
        useful.astype(jnp.float32) / self.P)
    return st, report, clock, active, carry._replace(fleet=fleet)

  def restarted(self, f: Fleet, merged, arrived, jump) -> Fleet:
    """The fleet after a merge of ``merged`` (W, P): they restart
    computing; with overlap only those waiting with a finished round
    (fragment), which they send."""
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
    # next step. (Without overlap there is one fragment.)
    ratio_W = 1.0 if self.net is None else local_workers(
        speed_ratios(self.net))
    credit = jnp.clip((jump - f.remaining_W[:, 0]) / self.tick(), 0.0,
                      1.0) * ratio_W
    m = merged[:, 0]
    return f._replace(
        progress_W=jnp.where(m, jnp.where(arrived[:, 0], credit, 0.0),
                             f.progress_W),
        steps_W=jnp.where(merged, 0, f.steps_W),
        waiting_W=f.waiting_W & ~merged, remaining_W=out,
        sent_W=f.sent_W & ~merged)

  def merging(self, f: Fleet, carry, held_all, elapsed):
    """(who the syncer merges now (W, P), seconds since each fragment's
    last merge, the grace windows left, the fragment merged): without a
    syncer rule, whoever arrived. Of the fragments ready, the lowest is
    merged; the others wait for the next tick."""
    if self.syncer is None:
      return held_all, f.since, f.window, 0
    up_all = carry.up_W
    q = self.syncer
    up = jnp.sum(up_all.astype(jnp.int32))
    # A quorum counts the learners that are up: the syncer never waits for
    # more than there are.
    count = jnp.sum(held_all.astype(jnp.int32), axis=0)
    tokens = jnp.sum(jnp.where(held_all, all_workers(f.tokens_W), 0).astype(
        jnp.float32), axis=0)
    met = (count >= jnp.clip(q.count, 1, jnp.maximum(up, 1))) & (
        tokens >= q.tokens * self.period * up.astype(jnp.float32) - WHOLE)
    since = f.since + elapsed
    opened = jnp.isfinite(f.window)
    grace = q.grace * since if q.adaptive else jnp.full_like(since, q.grace)
    window = jnp.where(opened, f.window - elapsed,
                       jnp.where(met, grace, jnp.inf))
    everyone = jnp.all(held_all | ~up_all[:, None], axis=0)
    merge = met & ((window <= 0.5 * self.tick()) | everyone)
    if self.P > 1:
      p = jnp.argmax(merge)
      merge = merge & (jnp.arange(self.P) == p)
    else:
      p = 0
    return (held_all & merge[None, :], jnp.where(merge, 0.0, since),
            jnp.where(merge, jnp.inf, window).astype(jnp.float32), p)

  def weighed(self, sync_fn, f: Fleet, p):
    """``sync_fn`` traced for fragment ``p`` (with several), with each
    worker's tokens (the inner steps behind its message) as its weight
    when the syncer weighs by tokens."""
    weigh = self.syncer is not None and self.syncer.token_weighted

    def on(q, state):
      with weighting(f.tokens_W[:, q].astype(jnp.float32) if weigh else None):
        if self.P == 1:
          return sync_fn(state)
        with fragment(q):
          return sync_fn(state)

    if self.P == 1:
      return lambda state: on(0, state) if weigh else sync_fn(state)
    return lambda state: jax.lax.switch(
        p, [lambda s, q=q: on(q, s) for q in range(self.P)], state)

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
    of its round and its messages, on their way or held by the syncer
    (which merges only the learners that are up); back, it pulls the
    model."""
    if not self.faults:
      return f
    up = local_workers(up_all)
    up_P = up[:, None]
    return f._replace(progress_W=jnp.where(up, f.progress_W, 0.0),
                      steps_W=jnp.where(up_P, f.steps_W, 0),
                      waiting_W=f.waiting_W & up_P, sent_W=f.sent_W & up_P,
                      held_W=f.held_W & up_P)

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
