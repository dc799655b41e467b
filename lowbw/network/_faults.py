"""Straggler and fault models: who is slow, who is down, whose message is lost.

Both are configurations only; the engine draws their seeded masks over the
worker axis inside the compiled round (``lowbw.network._clock``). Their numbers
(probabilities, jitter, fraction kept, backups) are traced values, so changing
them does not recompile.
"""

from typing import NamedTuple

from lowbw import _validate

MITIGATIONS = ("none", "threshold", "backup")
BYZANTINE_KINDS = ("sign_flip", "scale", "random")
LEAVE_SHARDS = ("drop", "redistribute")


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
    byzantine: workers that send corrupted pseudo-gradients at every sync
      (DiLoCo family): their own negated ("sign_flip"), times
      ``byzantine_scale`` ("scale"), or Gaussian noise with each tensor's
      own RMS ("random"), as ``byzantine_kind`` says. A robust aggregation
      (``robust="median"`` or ``"trimmed_mean"``) resists them.
    byzantine_kind: "sign_flip", "scale" or "random".
    byzantine_scale: the factor of "scale".
    joins: ``(worker, step)`` pairs: the worker is not in the fleet before
      ``step`` (down for every round starting earlier) and joins the first
      round starting at or after it, copying the global model and the outer
      optimizer state (counted in ``received_bytes`` and timed on its link,
      as every return from a down round is).
    leave_shards: what happens to the data of a worker that left for good
      (``failures``): "drop" (nobody trains on it again) or "redistribute"
      (from its failure on, each remaining worker draws each example from
      a departed worker's shard with probability departed / W, so the
      fleet keeps seeing all the data at the same rate).
  """

  drop_prob: float = 0.0
  windows: tuple = ()
  failures: tuple = ()
  message_loss: float = 0.0
  byzantine: tuple = ()
  byzantine_kind: str = "sign_flip"
  byzantine_scale: float = 10.0
  joins: tuple = ()
  leave_shards: str = "drop"


def check_stragglers(s: Stragglers, num_workers: int) -> Stragglers:
  if not isinstance(s, Stragglers):
    raise _validate.fail("stragglers", s, "expected lowbw.network.Stragglers")
  jitter = _validate.non_negative("jitter", s.jitter)
  mitigation = _validate.one_of("mitigation", s.mitigation, MITIGATIONS)
  fraction = _validate.fraction("stragglers.fraction", s.fraction)
  backups = _validate.non_negative_int("backups", s.backups)
  if mitigation == "backup" and backups >= num_workers:
    raise _validate.fail("backups", backups,
                         f"must be below workers={num_workers}")
  return Stragglers(jitter, mitigation, fraction, backups)


def check_faults(f: Faults, num_workers: int) -> Faults:
  if not isinstance(f, Faults):
    raise _validate.fail("faults", f, "expected lowbw.network.Faults")
  drop = _validate.fraction("drop_prob", f.drop_prob, low_open=False)
  loss = _validate.fraction("message_loss", f.message_loss, low_open=False)
  windows = tuple(_triple(w, num_workers) for w in f.windows)
  failures = tuple(_pair(p, num_workers) for p in f.failures)
  byzantine = tuple(sorted({_worker("byzantine", w, num_workers)
                            for w in _listed(f.byzantine)}))
  kind = _validate.one_of("byzantine_kind", f.byzantine_kind,
                          BYZANTINE_KINDS)
  scale = _validate.finite_float("byzantine_scale", f.byzantine_scale)
  joins = tuple(_pair(p, num_workers, "joins") for p in f.joins)
  for worker, step in joins:
    if step == 0:
      raise _validate.fail("joins", (worker, step), "a worker joining at "
                           "step 0 is in the fleet from the start; give a "
                           "later step")
  shards = _validate.one_of("leave_shards", f.leave_shards, LEAVE_SHARDS)
  return Faults(drop, windows, failures, loss, byzantine, kind, scale, joins,
                shards)


def _listed(workers) -> tuple:
  """Worker indices from a tuple or "0,3"."""
  if isinstance(workers, str):
    try:
      return tuple(int(w) for w in workers.split(",") if w.strip())
    except ValueError:
      raise _validate.fail("byzantine", workers, "expected worker indices, "
                           "comma-separated") from None
  if isinstance(workers, int):
    return (workers,)
  return tuple(workers)


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
                         f"a worker index below workers={num_workers}")
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


def _pair(failure, num_workers, field="failures"):
  if not isinstance(failure, (tuple, list)) or len(failure) != 2:
    raise _validate.fail(field, failure, "expected (worker, step) pairs")
  return (_worker(field, failure[0], num_workers), _step(field, failure[1]))


def check_windows(f: Faults, period: int) -> None:
  """Every down window must contain a round start (a multiple of H)."""
  for worker, start, end in f.windows:
    if -(-start // period) * period >= end:
      raise _validate.fail(
          "windows", (worker, start, end),
          f"no round starts in [{start}, {end}): masks are drawn per round "
          f"and rounds start every H={period} steps")
