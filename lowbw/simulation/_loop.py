"""The flat host loop: dispatch chunk n+1, then read chunk n's outputs.

The host never waits on the device inside the loop: a chunk's metrics are
fetched after the next chunk has been dispatched, and the state buffers are
donated from chunk to chunk. The same loop drives a single run (one track)
and a sweep (one track per point, outputs with a leading point axis).
"""

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from lowbw.simulation import _periods
from lowbw.simulation._history import NonFiniteLossError


# A chunk runs this many wall seconds at most (after the first, one round,
# which measures the speed): Ctrl-C, which Python sees only between chunks,
# then stops a run within seconds, and the first row comes out at once.
CHUNK_SECONDS = 2.0


class Executables(NamedTuple):
  """Compiled programs of one argument signature."""

  chunk: Any           # (state, sampler, n, net) -> (state, RoundOut)
  tail: Any            # (state, sampler, net) -> (state, StepOut) or None
  evaluate: Any        # (state, eval_batches) -> dict
  global_params: Any   # state -> params


class Drive(NamedTuple):
  """How ``drive`` runs.

  Attributes:
    batched: the outputs have a leading axis of points, one per track.
    raise_errors: a ``NonFiniteLossError`` is raised after the rows before
      it are written (a single run); else it is kept in its track and the
      run goes on (sweep points).
    checkpoint_every: steps between checkpoints, or None.
    save: ``save(step, state, wall_s)`` with ``checkpoint_every``.
    bar: a progress bar over steps, or None.
    wall_offset: wall seconds of the run before this process (a resume).
  """

  batched: bool = False
  raise_errors: bool = True
  checkpoint_every: int | None = None
  save: Callable | None = None
  bar: Any = None
  wall_offset: float = 0.0


def drive(sim, exe: Executables, state, sampler, net, tracks: list,
          how: Drive = Drive()):
  """Runs from the tracks' step to the configured number of steps.

  Returns:
    (final state, wall seconds).
  """
  c = sim.config
  period, steps, eval_every = c.period, c.steps, c.eval_every
  start = time.perf_counter() - how.wall_offset
  step, pending = tracks[0].history.step, None
  pace = _Pace(c.rounds_per_chunk)
  finish = functools.partial(_finish, sim, tracks, how, pace, start)

  def rounds_to(every):
    return (every - step % every) // period

  while step + period <= steps:
    n = min(pace.rounds(), (steps - step) // period,
            *(rounds_to(every) for every in (eval_every, how.checkpoint_every)
              if every))
    state, out = exe.chunk(state, sampler, n, net)
    step += n * period
    due = bool(eval_every and step % eval_every == 0)
    ev = exe.evaluate(state, sim.eval_batches) if due else None
    if pending is not None:
      finish(pending)
    pending = ("rounds", n, out, ev, step)
    if how.checkpoint_every and step % how.checkpoint_every == 0:
      finish(pending)
      pending = None
      how.save(step, state, time.perf_counter() - start)
  if exe.tail is not None and c.tail_steps:
    state, out = exe.tail(state, sampler, net)
    step += c.tail_steps
    if pending is not None:
      finish(pending)
    pending = ("tail", c.tail_steps, out, None, step)
  if pending is not None:
    finish(pending)
  _finalize(sim, exe, state, tracks, how.batched,
            time.perf_counter() - start)
  return state, time.perf_counter() - start


def _finish(sim, tracks: list, how: Drive, pace, start: float,
            pending: tuple) -> None:
  """Reads a dispatched chunk's outputs into the tracks (one point's slice
  each when batched)."""
  kind, n, out, ev, end_step = pending
  out, ev = sim.fetch(out), None if ev is None else sim.fetch(ev)
  pace.done(n if kind == "rounds" else 0)
  wall = time.perf_counter() - start
  for i, track in enumerate(tracks):
    pick = (lambda t: jax.tree.map(lambda x: x[i], t)) if how.batched else (
        lambda t: t)
    mine = pick(out)
    if sim.config.traced_period:  # the run's own H of the rounds' slots
      mine = _periods.trimmed(kind, n, mine, sim.config.period)
    try:
      track.consume(kind, n, mine, None if ev is None else pick(ev),
                    end_step, wall, sim.config.steps)
    except NonFiniteLossError:
      if how.raise_errors:
        raise
  if how.bar is not None:
    rows = tracks[0].history.rows
    how.bar.update(end_step, rows[-1] if rows else {})


def _finalize(sim, exe: Executables, state, tracks: list, batched: bool,
              wall: float) -> None:
  """Every track's last row, with one final evaluation (shared by the
  points) for those whose last chunk had none."""
  final = None

  def final_eval(i):
    nonlocal final
    if final is None:
      final = sim.fetch(exe.evaluate(state, sim.eval_batches))
    return jax.tree.map(lambda x: x[i], final) if batched else final

  for i, track in enumerate(tracks):
    track.finalize(sim.config.steps, wall, lambda i=i: final_eval(i))


class _Pace:
  """How many rounds the next chunk runs: ``rounds_per_chunk`` at most, and
  no more than ``CHUNK_SECONDS`` at the speed measured so far (one round
  before anything is measured).

  Over several processes every chunk after the first runs
  ``rounds_per_chunk``: each process measures its own speed, and processes
  that chose different chunks would run different collectives."""

  def __init__(self, rounds_per_chunk: int):
    self.most = rounds_per_chunk
    self.start = time.perf_counter()
    self.finished = 0
    self.measured = jax.process_count() == 1

  def done(self, rounds: int) -> None:
    self.finished += rounds

  def rounds(self) -> int:
    if self.finished == 0:
      return 1
    if not self.measured:
      return self.most
    per_round = (time.perf_counter() - self.start) / self.finished
    return max(1, min(self.most, int(CHUNK_SECONDS / max(per_round, 1e-9))))
