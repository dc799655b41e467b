"""Straggler and fault models: who is slow, who is down, whose message is lost.

Both are configurations only; the engine draws their seeded masks over the
worker axis inside the compiled round (``lowbw.network._clock``). Their numbers
(probabilities, jitter, fraction kept, backups) are traced values, so changing
them does not recompile.
"""

from typing import NamedTuple

from lowbw import _validate

MITIGATIONS = ("none", "threshold", "backup")


class Stragglers(NamedTuple):
  """Per-worker step-time jitter and how the synchronous step copes with it.

  Attributes:
    jitter: sigma of a lognormal multiplier of every worker's step time, drawn
      per worker and step with mean 1 (exp(sigma z - sigma^2 / 2)).
    mitigation: "none" (every communication waits for the slowest worker),
      "threshold" (aggregate the first ``fraction`` of the up workers to
      finish; the others' updates are dropped that round) or "backup"
      (``backups`` of the workers are spares: the first (up workers -
      backups) to finish are aggregated). Dropped workers still receive
      what is broadcast.
    fraction: threshold's fraction of the up workers aggregated, in (0, 1];
      the count kept is ceil(fraction x up workers).
    backups: backup's number of spare workers (>= 0, fewer than W).
  """

  jitter: float = 0.0
  mitigation: str = "none"
  fraction: float = 0.9
  backups: int = 1


class Faults(NamedTuple):
  """Workers that go down and messages that get lost.

  A down worker sends nothing for the round: it is left out of every average,
  it does not hold up the clock, and when the round ends it pulls the global
  parameters. Under strategies that communicate only at the sync (DiLoCo,
  FedAvg, MuLoCo) its local steps are discarded too; under those that
  communicate every step (DDP, SPARTA, DeMo) it still applies what the others
  broadcast. The global model itself is never lost: a communication nobody
  takes part in is skipped (for per-step strategies, the whole step).

  Masks are drawn per round (H inner steps; one step for DDP, SPARTA and
  DeMo), so a window or failure takes effect at the first round starting in
  it; a window with no round start in it is rejected at build time.

  Attributes:
    drop_prob: probability that a worker is down for a round (independent per
      worker and round).
    windows: ``(worker, start, end)`` triples: the worker is down for every
      round that starts at a step in [start, end) (steps counted from 0).
    failures: ``(worker, step)`` pairs: the worker is down for every round
      that starts at or after ``step``, for good.
    message_loss: probability that a worker's message is lost at a
      communication (it is then left out of that average, like a straggler).
  """

  drop_prob: float = 0.0
  windows: tuple = ()
  failures: tuple = ()
  message_loss: float = 0.0


def check_stragglers(s: Stragglers, num_workers: int) -> Stragglers:
  if not isinstance(s, Stragglers):
    raise _validate.fail("stragglers", s, "expected lowbw.network.Stragglers")
  jitter = _validate.non_negative("jitter", s.jitter)
  mitigation = _validate.one_of("mitigation", s.mitigation, MITIGATIONS)
  fraction = _validate.fraction("stragglers.fraction", s.fraction)
  backups = _validate.non_negative_int("backups", s.backups)
  if mitigation == "backup" and backups >= num_workers:
    raise _validate.fail("backups", backups,
                         f"must be below num_workers={num_workers}")
  return Stragglers(jitter, mitigation, fraction, backups)


def check_faults(f: Faults, num_workers: int) -> Faults:
  if not isinstance(f, Faults):
    raise _validate.fail("faults", f, "expected lowbw.network.Faults")
  drop = _validate.fraction("drop_prob", f.drop_prob, low_open=False)
  loss = _validate.fraction("message_loss", f.message_loss, low_open=False)
  windows = tuple(_triple(w, num_workers) for w in f.windows)
  failures = tuple(_pair(p, num_workers) for p in f.failures)
  return Faults(drop, windows, failures, loss)


_MAX_STEP = 2**31 - 2  # steps are int32 in the compiled round


def _step(field, value):
  step = _validate.non_negative_int(field, value)
  if step > _MAX_STEP:
    raise _validate.fail(field, value, f"steps must be at most {_MAX_STEP}")
  return step


def _worker(field, value, num_workers):
  w = _validate.non_negative_int(field, value)
  if w >= num_workers:
    raise _validate.fail(field, value,
                         f"a worker index below num_workers={num_workers}")
  return w


def _triple(window, num_workers):
  if not isinstance(window, (tuple, list)) or len(window) != 3:
    raise _validate.fail("windows", window,
                         "expected (worker, start_step, end_step) triples")
  worker, start, end = window
  worker = _worker("windows", worker, num_workers)
  start, end = _step("windows", start), _step("windows", end)
  if end <= start:
    raise _validate.fail("windows", window, "end_step must exceed start_step")
  return (worker, start, end)


def _pair(failure, num_workers):
  if not isinstance(failure, (tuple, list)) or len(failure) != 2:
    raise _validate.fail("failures", failure, "expected (worker, step) pairs")
  return (_worker("failures", failure[0], num_workers),
          _step("failures", failure[1]))


def check_windows(f: Faults, period: int) -> None:
  """Every down window must contain a round start (a multiple of H)."""
  for worker, start, end in f.windows:
    if -(-start // period) * period >= end:
      raise _validate.fail(
          "windows", (worker, start, end),
          f"no round starts in [{start}, {end}): masks are drawn per round "
          f"and rounds start every H={period} steps")
