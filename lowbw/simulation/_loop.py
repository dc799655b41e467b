"""The flat host loop: dispatch chunk n+1, then read chunk n's outputs.

The host never waits on the device inside the loop: a chunk's metrics are
fetched after the next chunk has been dispatched, and the state buffers are
donated from chunk to chunk. The same loop drives a single run (one track)
and a sweep (one track per point, outputs with a leading point axis).
"""

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

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


def drive(sim, exe: Executables, state, sampler, net, tracks: list,
          start_step: int, fetch: Callable, *, batched: bool = False,
          raise_errors: bool = True,
          checkpoint_every: int | None = None, save: Callable | None = None,
          bar=None, wall_offset: float = 0.0):
  """Runs from ``start_step`` to the configured number of steps.

  ``batched``: the outputs have a leading axis of points, one per track.
  ``raise_errors``: a ``NonFiniteLossError`` is raised after the rows before
  it are written (a single run); else it is kept in its track and the run
  goes on (sweep points).

  Returns:
    (final state, wall seconds).
  """
  c = sim.config
  period, steps, eval_every = c.period, c.steps, c.eval_every
  start = time.perf_counter() - wall_offset
  step, pending = start_step, None
  pace = _Pace(c.rounds_per_chunk)

  def finish(p):
    kind, n, out, ev, end_step = p
    out, ev = fetch(out), None if ev is None else fetch(ev)
    pace.done(n if kind == "rounds" else 0)
    wall = time.perf_counter() - start
    for i, track in enumerate(tracks):
      pick = (lambda t: jax.tree.map(lambda x: x[i], t)) if batched else (
          lambda t: t)
      try:
        track.consume(kind, n, pick(out), None if ev is None else pick(ev),
                      end_step, wall, steps)
      except NonFiniteLossError:
        if raise_errors:
          raise
    if bar is not None:
      rows = tracks[0].history.rows
      bar.update(end_step, rows[-1] if rows else {})

  def rounds_to(every):
    return (every - step % every) // period

  while step + period <= steps:
    n = min(pace.rounds(), (steps - step) // period,
            *(rounds_to(every) for every in (eval_every, checkpoint_every)
              if every))
    state, out = exe.chunk(state, sampler, n, net)
    step += n * period
    due = bool(eval_every and step % eval_every == 0)
    ev = exe.evaluate(state, sim.eval_batches) if due else None
    if pending is not None:
      finish(pending)
    pending = ("rounds", n, out, ev, step)
    if checkpoint_every and step % checkpoint_every == 0:
      finish(pending)
      pending = None
      save(step, state, time.perf_counter() - start)
  if exe.tail is not None:
    state, out = exe.tail(state, sampler, net)
    step += c.tail_steps
    if pending is not None:
      finish(pending)
    pending = ("tail", c.tail_steps, out, None, step)
  if pending is not None:
    finish(pending)
  wall = time.perf_counter() - start
  final = None

  def final_eval(i):
    nonlocal final
    if final is None:
      final = fetch(exe.evaluate(state, sim.eval_batches))
    return jax.tree.map(lambda x: x[i], final) if batched else final

  for i, track in enumerate(tracks):
    track.finalize(steps, wall, lambda i=i: final_eval(i))
  return state, time.perf_counter() - start


class _Pace:
  """How many rounds the next chunk runs: ``rounds_per_chunk`` at most, and
  no more than ``CHUNK_SECONDS`` at the speed measured so far (one round
  before anything is measured)."""

  def __init__(self, rounds_per_chunk: int):
    self.most = rounds_per_chunk
    self.start = time.perf_counter()
    self.finished = 0

  def done(self, rounds: int) -> None:
    self.finished += rounds

  def rounds(self) -> int:
    if self.finished == 0:
      return 1
    per_round = (time.perf_counter() - self.start) / self.finished
    return max(1, min(self.most, int(CHUNK_SECONDS / max(per_round, 1e-9))))
