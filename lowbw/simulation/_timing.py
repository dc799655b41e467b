"""The round's simulated clock and participation masks, as three variants the
engine composes with the strategy's steps:

* ``Untimed`` (no network): the steps and the sync as they are.
* ``Clocked`` (a network): every worker's compute seconds per step, barriers
  at each communication, the seconds of the messages sent.
* ``Masked`` (a fault or straggler model): also who is up this round and who
  takes part in each communication. Down workers' steps never happen; the
  communication is traced inside ``transforms.participating`` so the worker
  reductions count only its participants (skipped when there are none); at
  the end of the round down workers pull the global parameters.

Each step function takes and returns ``active``: the engine-owned mask (bool,
this device's workers) of the workers the last communication counted, kept in
``SimState.active``; None when there are no masks. The semantics are in
docs/network.md; the pure clock functions in ``network/_clock.py``. The
records and helpers the variants share are in ``_clock_parts``; an
asynchronous strategy's variant, ``Paced``, in ``_pace``; ``timing`` picks
the variant of a run.
"""

from typing import Any

import jax
import jax.numpy as jnp

from lowbw._types import Array
from lowbw import network as net_lib
from lowbw.network import _clock
from lowbw.simulation._clock_parts import (WHOLE, Carry, RoundClock,
                                           StepClock, dylu_steps,
                                           speed_ratios, unless_nobody)
from lowbw.simulation._pace import Paced
from lowbw.transforms import (adversaries, broadcast_to_workers,
                              local_workers, participating, where_workers)
from lowbw.transforms._reductions import any_worker
from lowbw.transforms._robust import Adversaries, weighting


def split_report(report: dict, channels) -> tuple[dict, dict]:
  """(event counts, the strategy's own metrics) of a report: entries named
  after the strategy's ``channels`` count events."""
  counts = {k: v for k, v in report.items() if k in channels}
  return counts, {k: v for k, v in report.items() if k not in counts}


class Untimed:
  """No network: nothing is timed or masked."""

  def begin(self, step, fleet=None):
    del step, fleet
    return None

  def local(self, st, step_fn, carry, active):
    st, report = step_fn(st)
    return st, report, carry, None, active

  def sync(self, st, sync_fn, carry, steps_clock, active):
    """(state, report, RoundClock or None, active, carry) after the sync."""
    del steps_clock
    if sync_fn is None:
      return st, {}, None, active, carry
    st, report = sync_fn(st)
    return st, report, None, active, carry

  def rejoin(self, st, carry, active, global_params):
    del carry, global_params
    return st, active


class Clocked(Untimed):
  """The clock without masks: every worker is up and takes part."""

  def __init__(self, net, num_workers: int, channels, period: int = 1,
               budgeted: bool | str = False, synced: bool = True):
    self.net, self.num_workers, self.channels = net, num_workers, channels
    self.period = period
    self.budget = period if budgeted else 0  # DyLU's H, 0: none
    # DyLU's mean weighted by the steps each worker took in the round.
    self.weighted = budgeted == "weighted"
    # Whose work counts (goodput): a strategy with a sync takes in a
    # round's steps there, one without at each step's communication.
    self.synced = synced

  def begin(self, step, fleet=None):
    del fleet
    nobody = jnp.zeros(self.num_workers, bool)
    return Carry(self.up(step), jnp.zeros(self.num_workers, jnp.float32),
                 None, nobody, jnp.zeros(self.num_workers, jnp.int32))

  def up(self, step):
    del step
    return jnp.ones(self.num_workers, bool)

  def take_part(self, fn, carry, step, salt, active):
    """(``fn`` as it runs, its start time, who takes part (bool (W,), all
    workers), the new ``active``) for a communication once ``carry``'s
    workers are ready. ``salt``: 0 for a step's communication, 1 for the
    sync's."""
    del step, salt
    return fn, jnp.max(carry.ready_W), jnp.ones(self.num_workers, bool), active

  def communicates(self, report_shape) -> bool:
    return bool(split_report(report_shape, self.channels)[0])

  def local(self, st, step_fn, carry, active):
    net = self.net
    up_W, ready_W = carry.up_W, carry.ready_W
    computes_W = up_W & self.budgeted(st.step)
    ready_W = ready_W + jnp.where(computes_W,
                                  _clock.step_seconds(net, st.step), 0)
    if self.communicates(jax.eval_shape(step_fn, st)[1]):
      # Communication every step: a barrier of the workers waited for.
      fn, start, took_W, active = self.take_part(
          step_fn, carry._replace(ready_W=ready_W), st.step, 0, active)
      st, report = fn(st)
      counts = split_report(report, self.channels)[0]
      # A step may skip its communication (SPARTA's sparta_interval): then
      # it is no barrier and nobody is counted.
      sent = sum(jnp.sum(c) for c in counts.values()) > 0
      ready_W = jnp.where(sent, jnp.full_like(
          ready_W, start + _clock.comm_seconds(net, counts)), ready_W)
      took_W = took_W & sent
      n = jnp.where(sent, jnp.sum(took_W.astype(jnp.int32)), -1)
      counted_W = computes_W & jnp.where(sent, took_W, True)
    else:
      st, report = self.freeze_down(step_fn, st, computes_W)
      n, took_W = jnp.int32(-1), jnp.zeros(self.num_workers, bool)
      counted_W = computes_W
    useful = jnp.int32(0) if self.synced else jnp.sum(
        counted_W.astype(jnp.int32))
    clock = StepClock(_clock.waited_for(net, ready_W, up_W), n, took_W,
                      carry.rejoined_W, jnp.sum(up_W.astype(jnp.int32)),
                      useful)
    return st, report, carry._replace(
        ready_W=ready_W, rejoined_W=jnp.zeros_like(carry.rejoined_W),
        steps_W=carry.steps_W + computes_W.astype(jnp.int32)
    ), clock, active

  def weigh(self, sync_fn, carry):
    """``sync_fn`` traced with DyLU's weights (the steps each worker took
    this round), when the strategy asks for a weighted mean."""
    if not self.weighted:
      return sync_fn

    def weighted(state):
      with weighting(local_workers(carry.steps_W)):
        return sync_fn(state)

    return weighted

  def budgeted(self, step) -> Array:
    """(W,) bool: whose inner step ``step`` is inside its time budget
    (DyLU): a worker of speed ratio r to the fastest takes floor(H x r)
    (at least 1) of a round's H steps, spread evenly; all without one."""
    if not self.budget:
      return jnp.ones(self.num_workers, bool)
    H = self.budget
    r = dylu_steps(H, speed_ratios(self.net)) / H
    j = (step % H).astype(jnp.float32)
    return jnp.floor((j + 1) * r + WHOLE) > jnp.floor(j * r + WHOLE)

  def freeze_down(self, step_fn, st, computes_W):
    """Steps outside a worker's time budget never happened."""
    if not self.budget:
      return step_fn(st)
    return Masked.freeze_down(self, step_fn, st, computes_W)

  def sync(self, st, sync_fn, carry, steps_clock, active):
    net = self.net
    start = _clock.waited_for(net, carry.ready_W, carry.up_W)
    sync_s, report = jnp.float32(0), {}
    n, took_W = steps_clock.participants[-1], steps_clock.active_W[-1]
    if sync_fn is not None:
      fn, start, took_W, active = self.take_part(
          self.weigh(sync_fn, carry), carry, st.step, 1, active)
      n = jnp.sum(took_W.astype(jnp.int32))
      st, report = fn(st)
      sync_s = _clock.comm_seconds(net, split_report(report,
                                                     self.channels)[0])
    useful = jnp.sum(jnp.where(took_W, carry.steps_W, 0)) if (
        sync_fn is not None) else jnp.int32(0)
    return st, report, RoundClock(start, sync_s, n, took_W,
                                  useful.astype(jnp.int32)), active, carry


class Masked(Clocked):
  """The clock with faults and stragglers."""

  def up(self, step):
    return _clock.up_mask(self.net, step)

  def begin(self, step, fleet=None):
    """Who is up this round; those that were down the round before first
    download the global state (``network._clock.CATCH_UP``), on their own
    links."""
    carry = super().begin(step, fleet)
    download_W = self.net.exchange_s_W.get(_clock.CATCH_UP)
    if download_W is None:  # stragglers only: nobody goes down
      return carry
    before = jnp.where(step >= self.period, self.up(step - self.period), True)
    back = carry.up_W & ~before
    return carry._replace(ready_W=jnp.where(back, download_W, 0.0),
                          rejoined_W=back)

  def take_part(self, fn, carry, step, salt, active):
    active_W, start = net_lib.participants(self.net, carry.ready_W, carry.up_W,
                                          step, salt)
    active = local_workers(active_W)

    # A skipped step still counts as a step; a skipped sync does not.
    run = unless_nobody(self.byzantine(fn, step) if salt else fn, active_W,
                         active, 1 if salt == 0 else 0)
    return run, start, active_W, active

  def byzantine(self, fn, step):
    """``fn`` traced with the network's Byzantine workers (if any)."""
    byz = self.net.byzantine
    if byz is None:
      return fn

    def corrupted(state):
      with adversaries(Adversaries(
          local_workers(byz.mask_W), byz.factor, byz.noise,
          jax.random.fold_in(jax.random.fold_in(self.net.key, 5), step))):
        return fn(state)

    return corrupted

  def freeze_down(self, step_fn, st, up_W):
    """A down worker's steps (and those outside its time budget) never
    happened."""
    new, report = step_fn(st)
    up = local_workers(up_W)
    return new._replace(params_W=where_workers(up, new.params_W, st.params_W),
                        inner_W=where_workers(up, new.inner_W,
                                              st.inner_W)), report

  def rejoin(self, st, carry, active, global_params):
    """Down workers pull the global parameters; the up ones are active again.

    Strategies without a server model define the global parameters as the
    mean of the participants; when the last communication had nobody, the
    mean of the up workers stands in, and with nobody up, of all of them (a
    mean over nobody would be zeros).
    """
    up_W = carry.up_W
    fallback = local_workers(jnp.where(jnp.any(up_W), up_W, True))
    counted = jnp.where(any_worker(active), active, fallback)
    with participating(counted):
      global_W = broadcast_to_workers(global_params(st), fallback.shape[0])
    return st._replace(params_W=where_workers(local_workers(up_W),
                                              st.params_W, global_W)), fallback


def timing(net, masks: bool, num_workers: int, channels,
           strategy=None) -> Any:
  """The variant for a run: ``net`` (NetParams or None, known when the
  programs are traced), ``masks`` (a fault or straggler model, static);
  an asynchronous ``strategy`` runs on its schedule (``_pace``)."""
  if strategy is not None and strategy.asynchronous:
    return Paced(net, num_workers, channels, strategy, masks)
  if net is None:
    return Untimed()
  period = 1 if strategy is None else strategy.period
  budgeted = strategy is not None and strategy.time_budget
  return (Masked if masks else Clocked)(
      net, num_workers, channels, period, budgeted,
      strategy is None or strategy.sync is not None)
